#!/usr/bin/env bash
# ddp/CMakeLists.txt (the CMake package and the GPU machine's build) lists
# its sources by hand. This keeps it in step with the tree: every file it
# names exists, and every ddp/ source is in it.
set -euo pipefail
cmake_file=ddp/CMakeLists.txt
[ -f "$cmake_file" ] || { echo "FAIL: $cmake_file missing"; exit 1; }
fail=0
# Files (and folders: -I${LOCKSTEP_ROOT}/proto) named as "${LOCKSTEP_ROOT}/path" must exist.
for path in $(grep -o '\${LOCKSTEP_ROOT}/[A-Za-z0-9_/.-]*' "$cmake_file" | sed 's|\${LOCKSTEP_ROOT}/||' | grep -v '/$' | sort -u); do
  [ -e "$path" ] || { echo "FAIL: $cmake_file names $path, which does not exist"; fail=1; }
done
# Tests are named without a path: lockstep_test(NAME x) builds ddp/x.cc.
for name in $(sed -n 's/^lockstep_test(NAME \([A-Za-z0-9_]*\).*/\1/p' "$cmake_file"); do
  [ -f "ddp/$name.cc" ] || { echo "FAIL: $cmake_file builds test ddp/$name.cc, which does not exist"; fail=1; }
done
# Bazel-only sources, with the reason (none today).
bazel_only=" "
for src in ddp/*.cc; do
  base=$(basename "$src")
  case "$base" in
    *_test.cc)
      # GPU tests must be in the CMake build; CPU-only Bazel tests need not.
      if grep -q 'NcclUnavailableReason' "$src" && ! grep -q "NAME ${base%.cc}" "$cmake_file"; then
        echo "FAIL: GPU test $src is not built by $cmake_file"; fail=1
      fi
      continue ;;
  esac
  [[ "$bazel_only" == *" $base "* ]] && continue
  grep -q "/ddp/$base\"" "$cmake_file" || { echo "FAIL: $src is not in $cmake_file (add it, or to bazel_only here with the reason)"; fail=1; }
done
[ "$fail" = 0 ] && echo "PASS: $cmake_file matches the ddp/ sources"
exit "$fail"
