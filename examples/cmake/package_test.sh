#!/usr/bin/env bash
# The Lockstep CMake package as a user gets it: the worker library built
# from this tree with CMake and installed for /usr (tools/cmake_stage.sh's
# tarball), unpacked under a temporary directory instead (the package must
# not care where its prefix lies), every installed header compiled on its
# own against the package,
# build examples/cmake/ (a standalone project: find_package(Lockstep)), run
# it as 2 ranks over the file store and check that both end with identical
# parameters; then, given lockstepd and the CLI, run the same binary as a
# 2-worker job under lockstepd: it succeeds and `status` shows each rank's
# last step and loss, reported by the engine with no code in the program.
#
#   examples/cmake/package_test.sh [STAGE.tar|build [LOCKSTEPD LOCKSTEP]]
#
# STAGE.tar: tools/cmake_stage.sh's tarball (Bazel's //deploy:cmake_stage);
# `build` (the default) runs tools/cmake_stage.sh first. Bazel runs it as
# //examples:cmake_package_test (exclusive: its compiles would otherwise load
# the 2-core machine under timing-sensitive tests).
# Env: JOBS (compile jobs, default 2), KEEP=1 keeps the work dir.
set -euo pipefail

# The tree: under Bazel the runfiles' workspace (the working directory),
# else this script's ../..
if [[ -n "${TEST_SRCDIR:-}" ]]; then
  ROOT="$PWD"
else
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fi
STAGE="${1:-build}"
LOCKSTEPD="${2:-}"
LOCKSTEP="${3:-}"
[[ "$STAGE" == build || "$STAGE" == /* ]] || STAGE="$PWD/$STAGE"
[[ -z "$LOCKSTEPD" || "$LOCKSTEPD" == /* ]] || LOCKSTEPD="$PWD/$LOCKSTEPD"
[[ -z "$LOCKSTEP" || "$LOCKSTEP" == /* ]] || LOCKSTEP="$PWD/$LOCKSTEP"
W="${TEST_TMPDIR:-$(mktemp -d)}/cmake_package"
rm -rf "$W"
mkdir -p "$W"
JOBS="${JOBS:-2}"

log() { echo "[package_test $(date +%H:%M:%S)] $*" >&2; }
fail() { log "FAIL: $*"; exit 1; }
# run NAME CMD...: runs CMD with its output in $W/NAME.log, shown on failure.
run() {
  local name=$1; shift
  if ! "$@" >"$W/$name.log" 2>&1; then
    tail -n 60 "$W/$name.log" >&2
    fail "$name failed: $*"
  fi
}

for tool in cmake ninja; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (tools/setup.sh installs it)"
done

# ---- The package ----
if [[ "$STAGE" == build ]]; then
  log "configure + build + install the worker library (tools/cmake_stage.sh)"
  JOBS="$JOBS" run cmake_stage "$ROOT/tools/cmake_stage.sh" "$W/stage.tar"
  STAGE="$W/stage.tar"
fi
mkdir -p "$W/root"
run unpack tar -C "$W/root" -xf "$STAGE"
PREFIX="$W/root/usr"
multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)"
LIBDIR="$PREFIX/lib/$multiarch"
log "the package, installed for /usr, unpacked at $PREFIX"
for f in "$LIBDIR/liblockstep.so" "$LIBDIR/cmake/Lockstep/LockstepConfig.cmake" \
         "$LIBDIR/cmake/Lockstep/LockstepConfigVersion.cmake" "$PREFIX/include/lockstep/ddp/ddp.h" \
         "$PREFIX/include/lockstep/ddp/init.h" "$PREFIX/include/lockstep/ddp/checkpoint.h"; do
  [ -e "$f" ] || fail "the installed package lacks $f: $(cd "$W/root" && find . -type f | sort)"
done

# ---- Every installed header compiles on its own ----
# A header that includes one the package does not install, or that needs
# gRPC, spdlog or Gloo (private to liblockstep.so), fails here.
mkdir -p "$W/headers"
{
  echo 'cmake_minimum_required(VERSION 3.18)'
  echo 'project(lockstep_headers LANGUAGES CXX)'
  echo 'set(CMAKE_CXX_STANDARD 17)'
  echo 'find_package(Lockstep CONFIG REQUIRED)'
  echo 'add_library(headers OBJECT)'
  echo 'target_link_libraries(headers PRIVATE Lockstep::ddp)'
} >"$W/headers/CMakeLists.txt"
count=0
while read -r header; do
  rel="${header#"$PREFIX/include/lockstep/"}"
  src="$W/headers/h$count.cc"
  echo "#include \"$rel\"" >"$src"
  echo "target_sources(headers PRIVATE \"$src\")" >>"$W/headers/CMakeLists.txt"
  count=$((count + 1))
done < <(find "$PREFIX/include/lockstep" -name '*.h' | sort)
((count >= 10)) || fail "only $count headers installed"
log "compile each of the $count installed headers alone"
run headers_configure cmake -S "$W/headers" -B "$W/headers/build" -G Ninja \
  -DCMAKE_PREFIX_PATH="$PREFIX"
run headers_build ninja -C "$W/headers/build" -j "$JOBS"

# ---- examples/cmake against the installed package ----
log "build examples/cmake against $PREFIX"
run example_configure cmake -S "$ROOT/examples/cmake" -B "$W/example" -G Ninja \
  -DCMAKE_PREFIX_PATH="$PREFIX"
run example_build ninja -C "$W/example"
TRAIN="$W/example/cmake_train"
grep -q "$LIBDIR/liblockstep.so" <<<"$(ldd "$TRAIN")" ||
  fail "cmake_train does not load the installed liblockstep.so: $(ldd "$TRAIN" | grep lockstep)"

# ---- 2 ranks, file store, identical parameters ----
log "2 ranks over the file store"
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCKSTEP_JOB_ID=cmake-example LOCKSTEP_STORE="file:$W/store" \
    timeout 120 "$TRAIN" --steps 12 --params-out "$W/rank$r.params" >"$W/rank$r.log" 2>&1 &
  pids+=($!)
done
for r in 0 1; do
  wait "${pids[$r]}" || { cat "$W/rank$r.log" >&2; fail "rank $r exited with an error"; }
  grep -q "rank $r done: 12 steps, world size 2, backend gloo" "$W/rank$r.log" ||
    fail "rank $r did not finish 12 steps over gloo: $(tail -n 3 "$W/rank$r.log")"
done
cmp -s "$W/rank0.params" "$W/rank1.params" || fail "the ranks ended with different parameters"
[ "$(stat -c %s "$W/rank0.params")" -gt 1000 ] || fail "parameter file too small"
# Training happened: a one-rank run from the same start ends elsewhere.
RANK=0 WORLD_SIZE=1 LOCKSTEP_JOB_ID=cmake-alone LOCKSTEP_STORE="file:$W/store1" \
  timeout 120 "$TRAIN" --steps 12 --params-out "$W/alone.params" >"$W/alone.log" 2>&1 ||
  { cat "$W/alone.log" >&2; fail "the one-rank run failed"; }
if cmp -s "$W/rank0.params" "$W/alone.params"; then
  fail "2-rank training ended where 1-rank training did: gradients were not averaged"
fi
log "identical parameters on both ranks ($(stat -c %s "$W/rank0.params") bytes)"

# ---- Under lockstepd ----
if [[ -n "$LOCKSTEPD" ]]; then
  log "the CMake-built program as a 2-worker job under lockstepd"
  cd "$ROOT"
  # lib.sh's trainer argument is unused here: the job runs $TRAIN.
  # lib.sh takes paths relative to the working directory.
  TEST_TMPDIR="$W" source "$ROOT/tests/e2e/lib.sh" "$(realpath --relative-to=. "$LOCKSTEPD")" \
    "$(realpath --relative-to=. "$LOCKSTEP")" "$(realpath --relative-to=. /bin/true)"
  start_coordinator
  out=$(ls_cli submit --nproc-per-node 2 --max-restarts 0 --wait -- "$TRAIN" --steps 15) ||
    fail "the job did not succeed: $out"
  job=$(echo "$out" | sed -n 's/^submitted job //p')
  for r in 0 1; do
    step=$(job_field "$job" "[w for w in j['workers'] if w.get('rank', 0) == $r][0]['progress'].get('step', 0)")
    [ "$step" = 15 ] || { ls_cli status "$job"; fail "rank $r's last progress is step $step, not 15"; }
    loss=$(job_field "$job" "[w for w in j['workers'] if w.get('rank', 0) == $r][0]['progress'].get('loss', 0)")
    python3 -c "import sys; l = float(sys.argv[1]); sys.exit(0 if 0 < l < 10 else 1)" "$loss" ||
      fail "rank $r's reported loss is $loss"
  done
  # The table's columns: RANK NODE PID STATE STEP ...
  rows=$(ls_cli status "$job" | awk '$1 ~ /^[01]$/ && $5 == 15' | wc -l)
  [ "$rows" = 2 ] || { ls_cli status "$job"; fail "status does not show step 15 for both ranks"; }
  log "job $job SUCCEEDED; status shows step 15 for both ranks"
fi

[[ "${KEEP:-0}" == 1 ]] || [[ -n "${TEST_TMPDIR:-}" ]] || rm -rf "$W"
log "PASS"
