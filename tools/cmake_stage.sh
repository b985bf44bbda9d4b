#!/usr/bin/env bash
# The CMake package of the worker library (Lockstep::ddp: liblockstep.so,
# the headers, lib/<multiarch>/cmake/Lockstep), configured for /usr, built
# with CMake + Ninja from this tree and installed into a staging root
# (DESTDIR), packed as a tarball of that root (./usr/...). tools/package.sh
# puts it in the Debian package; //examples:cmake_package_test unpacks it
# elsewhere (the package must not care where its prefix lies).
#
#   tools/cmake_stage.sh OUT.tar        (about 1.5 min on 2 cores)
#
# Bazel builds it once as //deploy:cmake_stage (a build action, shared by
# the package, container and CMake package tests). Env: JOBS (compile jobs,
# default 2). Fails, naming the file, if anything installed names the build
# tree.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:?usage: tools/cmake_stage.sh OUT.tar}")"
JOBS="${JOBS:-2}"
die() { echo "cmake_stage: error: $*" >&2; exit 1; }
for tool in cmake ninja; do
  command -v "$tool" >/dev/null || die "$tool is not installed (tools/setup.sh installs it)"
done
multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)"

work="$(mktemp -d "${TMPDIR:-/tmp}/lockstep-cmake.XXXXXX")"
trap 'rm -rf "$work"' EXIT
build="$work/build" stage="$work/stage"
# run NAME CMD...: CMD's output goes to $work/NAME.log, its tail shown on failure.
run() {
  local name=$1; shift
  "$@" >"$work/$name.log" 2>&1 || { tail -n 40 "$work/$name.log" >&2; die "$name failed: $*"; }
}
# A unity build (CMake batches 8 sources into one translation unit) parses
# LibTorch's headers once per batch instead of once per file: 86 s and 145 s
# of CPU here against 158 s and 320 s one file at a time. The library is the
# same code; a plain `cmake` build of ddp/ (the README's, the GPU check's)
# still compiles file by file, so each file must also build on its own.
run configure cmake -S "$root" -B "$build" -G Ninja -DCMAKE_INSTALL_PREFIX=/usr \
  -DLOCKSTEP_BUILD_TESTS=OFF -DLOCKSTEP_RUNTIME=ON \
  -DLOCKSTEP_GLOO=ON -DLOCKSTEP_NCCL=OFF -DCMAKE_UNITY_BUILD=ON
run build ninja -C "$build" -j "$JOBS"
DESTDIR="$stage" run install cmake --install "$build"
# install(FILES) keeps symlinks as symlinks: from a tree of links (Bazel's
# sandbox and runfiles) the headers would point back into it. Each link that
# leaves the stage becomes a copy of what it names (the library's own
# liblockstep.so -> liblockstep.so.N links stay).
while IFS= read -r -d '' link; do
  target="$(readlink -f "$link")"
  [[ "$target" == "$stage"/* ]] && continue
  [ -f "$target" ] || die "$link names $target, which is not a file"
  cp --remove-destination "$target" "$link"
done < <(find "$stage" -type l -print0)
[ -e "$stage/usr/lib/$multiarch/liblockstep.so" ] ||
  die "the CMake install did not put liblockstep.so in /usr/lib/$multiarch: $(cd "$stage" && find . -type f | sort)"
# Nothing installed names the build tree.
if leak="$(grep -rlF "$work" "$stage")"; then
  die "installed files name the build tree: $leak"
fi
tar --numeric-owner --owner=0 --group=0 --sort=name --mtime=@0 -C "$stage" -cf "$out" .
echo "cmake_stage: $(tar -tf "$out" | grep -c '[^/]$') files in $out" >&2
