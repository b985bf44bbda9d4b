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
gpu_tests=0
for src in ddp/*.cc; do
  base=$(basename "$src")
  case "$base" in
    *_test.cc)
      # GPU tests must be in the CMake build; CPU-only Bazel tests need not.
      # A GPU test skips without one through nccl_test_util.h.
      if grep -Eq 'LOCKSTEP_SKIP_WITHOUT_GPU|NcclUnavailableReason|"ddp/nccl_test_util\.h"' "$src"; then
        gpu_tests=$((gpu_tests + 1))
        grep -q "NAME ${base%.cc}" "$cmake_file" || { echo "FAIL: GPU test $src is not built by $cmake_file"; fail=1; }
      fi
      continue ;;
  esac
  [[ "$bazel_only" == *" $base "* ]] && continue
  grep -q "/ddp/$base\"" "$cmake_file" || { echo "FAIL: $src is not in $cmake_file (add it, or to bazel_only here with the reason)"; fail=1; }
done
# The check above must see the GPU tests it guards (it once looked for a
# marker no test had any more, and passed whatever CMake built).
if ((gpu_tests < 2)); then
  echo "FAIL: found $gpu_tests GPU tests in ddp/ (ddp_cuda_test and nccl_communicator_test at least): how a GPU test is recognised here is out of date"
  fail=1
fi
[ "$fail" = 0 ] && echo "PASS: $cmake_file matches the ddp/ sources ($gpu_tests GPU tests among them)"
exit "$fail"
