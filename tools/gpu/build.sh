#!/usr/bin/env bash
# Configures, builds and tests the CMake build of ddp/ (ddp/CMakeLists.txt):
# meant for the GPU machine, which has no Bazel. Run from anywhere; paths are
# relative to the repo root.
#
#   tools/gpu/build.sh [CMAKE_ARGS...]       e.g. -DLOCKSTEP_NCCL=OFF
#
# LibTorch and NCCL come from the pip packages of $PYTHON (torch,
# nvidia-nccl-cu13), else /usr/local/cuda and the system; abseil and
# GoogleTest from the system, else .gpudeps/ (tools/gpu/pack_deps.sh).
# Environment: BUILD_DIR (default build-gpu), JOBS (default: all cores),
# PYTHON (default python3), RUN_TESTS (default 1), CTEST_ARGS (e.g. "-L gpu").
# Exit status: non-zero when something is missing, the build fails, or a
# test fails.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "${root}"
build_dir="${BUILD_DIR:-build-gpu}"
jobs="${JOBS:-$(nproc)}"
python="${PYTHON:-python3}"

say() { echo "build.sh: $*"; }
die() { echo "build.sh: error: $*" >&2; exit 1; }

# ---- Tools ----
missing=()
for tool in cmake ninja; do
  command -v "${tool}" > /dev/null || missing+=("${tool}")
done
command -v "${CXX:-c++}" > /dev/null || missing+=("a C++ compiler (${CXX:-c++})")
((${#missing[@]} == 0)) || die "not installed: ${missing[*]}"

# ---- What python offers (CMake asks it again; this is for the log) ----
python_path="$(command -v "${python}" || true)"
if [[ -z "${python_path}" ]]; then
  say "note: ${python} not found: LibTorch and NCCL are looked for in system paths only"
elif info="$("${python_path}" -c '
import torch
cuda = torch.version.cuda or "none"
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(f"torch {torch.__version__} (CUDA {cuda}, {gpus} GPU(s) visible)")
' 2>&1)"; then
  say "${python_path}: ${info}"
  if [[ "${info}" == *", 0 GPU(s) visible"* ]]; then
    say "note: torch sees no GPU here: the tests labelled gpu will skip themselves"
  fi
else
  say "note: ${python_path} cannot import torch (${info##*$'\n'});" \
      "CMake looks for a system LibTorch (or pass -DTORCH_ROOT=<dir with include/ and lib/>)"
fi
if [[ ! -d .gpudeps ]]; then
  say "note: no .gpudeps/ here: abseil and GoogleTest must be installed" \
      "(else run tools/gpu/pack_deps.sh on a Debian bookworm machine and copy .gpudeps/ here)"
fi

# ---- Configure ----
# A build folder copied from another machine or checkout (it is git-ignored,
# but rsync takes it along) holds that machine's paths: start it afresh.
stamp="${build_dir}/lockstep_host.txt"
here="$(uname -n):${root}"
if [[ -f "${build_dir}/CMakeCache.txt" ]]; then
  cache_dir="$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "${build_dir}/CMakeCache.txt")"
  if [[ "${cache_dir}" != "$(cd "${build_dir}" && pwd)" ]] ||
     { [[ -f "${stamp}" ]] && [[ "$(cat "${stamp}")" != "${here}" ]]; }; then
    say "${build_dir}/ was configured on another machine or checkout: starting it afresh"
    rm -rf "${build_dir}"
  fi
fi
cmake_args=(-S ddp -B "${build_dir}" -G Ninja)
[[ -n "${python_path}" ]] && cmake_args+=("-DLOCKSTEP_PYTHON=${python_path}")
log="$(mktemp)"
trap 'rm -f "${log}"' EXIT
say "cmake ${cmake_args[*]} $*"
if ! cmake "${cmake_args[@]}" "$@" 2>&1 | tee "${log}"; then
  echo >&2
  awk '/^CMake Error/ {p = 1} p && /^(Call Stack|-- )/ {p = 0} p' "${log}" >&2
  die "configure failed: the CMake error above names what is missing"
fi
build_abs="$(cd "${build_dir}" && pwd)"
echo "${here}" > "${stamp}"
echo
sed 's/^/build.sh: found: /' "${build_abs}/lockstep_summary.txt"

# ---- Build ----
say "ninja -C ${build_dir} -j ${jobs}"
ninja -C "${build_dir}" -j "${jobs}" -k 0 || die "build failed (see the compiler output above)"

# ---- Test ----
test_rc=0
if [[ "${RUN_TESTS:-1}" == 1 ]]; then
  # GPU tests skip themselves (and say so) where no device is visible.
  (cd "${build_dir}" && ctest --output-on-failure ${CTEST_ARGS:-}) || test_rc=$?
fi

echo
say "binaries:"
while read -r name; do
  [[ -n "${name}" ]] && echo "  ${build_abs}/${name}"
done < "${build_abs}/lockstep_binaries.txt"
((test_rc == 0)) || die "ctest failed (exit ${test_rc})"
say "done"
