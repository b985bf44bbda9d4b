#!/usr/bin/env bash
# Packs what the GPU machine lacks for the CMake build of ddp/ (see
# ddp/README.md "CMake build and the Lockstep package"): Debian bookworm's abseil and
# GoogleTest/gMock, headers and static libraries, into .gpudeps/ at the repo
# root (git-ignored), where ddp/CMakeLists.txt looks when no installed
# abseil/GoogleTest is found.
#
#   tools/gpu/pack_deps.sh [DEST]      # DEST defaults to <repo>/.gpudeps
#
# Every abseil archive is copied (about 2 MB): the linker takes only the
# members a binary needs, and new ddp code that uses another abseil library
# must not fail to link on a machine where nothing can be added.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dest="${1:-${root}/.gpudeps}"
inc=/usr/include
lib=/usr/lib/x86_64-linux-gnu

missing=()
for path in "${inc}/absl/status/status.h" "${inc}/gtest/gtest.h" "${inc}/gmock/gmock.h" \
            "${lib}/libabsl_status.a" "${lib}/libgtest.a" "${lib}/libgtest_main.a" \
            "${lib}/libgmock.a"; do
  [[ -e "${path}" ]] || missing+=("${path}")
done
if ((${#missing[@]})); then
  echo "pack_deps: missing ${missing[*]}" >&2
  echo "pack_deps: install Debian's libabsl-dev, libgtest-dev and libgmock-dev" >&2
  exit 1
fi

tmp="${dest}.tmp.$$"
trap 'rm -rf "${tmp}"' EXIT
mkdir -p "${tmp}/include" "${tmp}/lib"
cp -a "${inc}/absl" "${inc}/gtest" "${inc}/gmock" "${tmp}/include/"
cp -a "${lib}"/libabsl_*.a "${lib}/libgtest.a" "${lib}/libgtest_main.a" "${lib}/libgmock.a" \
      "${tmp}/lib/"
# The peer benchmark's models (../shared is not on the GPU machine):
# bench/torch_ddp_cuda_bench.py imports them from here.
peer="${root}/../shared/bench/torch_ddp_bench.py"
if [[ -f "${peer}" ]]; then
  mkdir -p "${tmp}/peer"
  cp "${peer}" "${tmp}/peer/"
else
  echo "pack_deps: note: ${peer} not found: device_check.sh will skip the DDP peer benchmark"
fi
{
  echo "# Packed by tools/gpu/pack_deps.sh from this machine's Debian packages."
  dpkg-query -W -f '${Package} ${Version}\n' libabsl-dev libgtest-dev libgmock-dev 2>/dev/null || true
  echo "packing machine compiler: $("${CXX:-c++}" --version 2>/dev/null | head -n 1)"
} > "${tmp}/MANIFEST"

rm -rf "${dest}"
mv "${tmp}" "${dest}"
trap - EXIT
echo "pack_deps: wrote ${dest} ($(du -sh "${dest}" | cut -f1), $(ls "${dest}/lib" | wc -l) archives)"
