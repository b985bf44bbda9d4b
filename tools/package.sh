#!/usr/bin/env bash
# Builds the lockstep Debian package with dpkg-deb:
#   /usr/bin/lockstepd, /usr/bin/lockstep
#   /usr/lib/lockstep/examples/train              (//examples:train)
#   /usr/lib/<multiarch>/liblockstep.so*, /usr/include/lockstep/,
#   /usr/lib/<multiarch>/cmake/Lockstep/          (the CMake package)
#   /lib/systemd/system/lockstepd-{coordinator,agent}.service
#   /etc/default/lockstep (conffile), /usr/share/doc/lockstep/
# and maintainer scripts that make the system user `lockstep` (workers run
# as it where LOCKSTEP_RUN_AS=lockstep says so; by default each job has a
# uid of its own) and /var/lib/lockstep. Depends: is computed from the binaries'
# shared libraries (dpkg -S). Prints the .deb's path last.
#
#   tools/package.sh [OUT_DIR]        (default build/deb; about 6 min on 2 cores)
#
# Bazel builds it of its own binaries as //deploy:deb.
#
# Env: LOCKSTEPD, LOCKSTEP, TRAIN: prebuilt binaries to package instead of
# building them with `bazel build --config=opt` (the tests pass theirs);
# STAGE: tools/cmake_stage.sh's tarball of the CMake package, instead of
# building it here (//deploy:deb passes //deploy:cmake_stage); JOBS (CMake
# compile jobs, default 2).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-$root/build/deb}")"
JOBS="${JOBS:-2}"
say() { echo "package: $*" >&2; }
die() { echo "package: error: $*" >&2; exit 1; }
for tool in dpkg-deb dpkg-shlibdeps file; do
  command -v "$tool" >/dev/null || die "$tool is not installed (tools/setup.sh installs it)"
done

version="$(sed -n 's/^project(lockstep VERSION \([0-9.]*\).*/\1/p' "$root/ddp/CMakeLists.txt")"
[ -n "$version" ] || die "no version in ddp/CMakeLists.txt's project()"
arch="$(dpkg --print-architecture)"
multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)"

# ---- Binaries ----
if [ -z "${LOCKSTEPD:-}${LOCKSTEP:-}${TRAIN:-}" ]; then
  say "bazel build --config=opt //daemon:lockstepd //client:lockstep //examples:train"
  (cd "$root" && bazel build --config=opt //daemon:lockstepd //client:lockstep //examples:train >&2)
  bin="$(cd "$root" && bazel info --config=opt bazel-bin 2>/dev/null)"
  LOCKSTEPD="$bin/daemon/lockstepd" LOCKSTEP="$bin/client/lockstep" TRAIN="$bin/examples/train"
fi
for f in "$LOCKSTEPD" "$LOCKSTEP" "$TRAIN"; do [ -x "$f" ] || die "not an executable: $f"; done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
stage="$work/stage"

# ---- The CMake package, into /usr (tools/cmake_stage.sh's tarball) ----
if [ -z "${STAGE:-}" ]; then
  say "CMake build of the worker library (Lockstep::ddp)"
  STAGE="$work/cmake_stage.tar"
  JOBS="$JOBS" "$root/tools/cmake_stage.sh" "$STAGE"
fi
[ -f "$STAGE" ] || die "no CMake stage tarball at '$STAGE'"
mkdir -p "$stage"
tar -C "$stage" -xf "$STAGE"
[ -e "$stage/usr/lib/$multiarch/liblockstep.so" ] ||
  die "the CMake stage $STAGE has no /usr/lib/$multiarch/liblockstep.so"

# ---- Everything else ----
install -D -m 0755 "$LOCKSTEPD" "$stage/usr/bin/lockstepd"
install -D -m 0755 "$LOCKSTEP" "$stage/usr/bin/lockstep"
install -D -m 0755 "$TRAIN" "$stage/usr/lib/lockstep/examples/train"
strip --strip-unneeded "$stage/usr/bin/lockstepd" "$stage/usr/bin/lockstep" \
  "$stage/usr/lib/lockstep/examples/train" "$stage/usr/lib/$multiarch/liblockstep.so.$version"
for unit in lockstepd-coordinator.service lockstepd-agent.service; do
  install -D -m 0644 "$root/deploy/systemd/$unit" "$stage/lib/systemd/system/$unit"
done
install -D -m 0644 "$root/deploy/debian/default" "$stage/etc/default/lockstep"
doc="$stage/usr/share/doc/lockstep"
install -D -m 0644 "$root/README.md" "$doc/README.md"
for d in daemon ddp deploy examples; do
  [ -f "$root/$d/README.md" ] && install -D -m 0644 "$root/$d/README.md" "$doc/$d/README.md"
done
printf 'Lockstep\nCopyright: the Lockstep developers.\n' >"$doc/copyright"

# ---- Depends: dpkg-shlibdeps over every ELF file (versions from the
# libraries' symbols files; liblockstep is the package's own) ----
mapfile -t elves < <(find "$stage" -type f \( -perm -u+x -o -name '*.so*' \) \
  -exec sh -c 'file -b "$1" | grep -q ELF' _ {} \; -print)
mkdir -p "$work/shlibs/debian"
printf 'Source: lockstep\n\nPackage: lockstep\nArchitecture: any\n' >"$work/shlibs/debian/control"
shlibs="$(cd "$work/shlibs" && dpkg-shlibdeps -O --ignore-missing-info \
  -l"$stage/usr/lib/$multiarch" "${elves[@]/#/-e}" 2>"$work/shlibdeps.log")" ||
  { cat "$work/shlibdeps.log" >&2; die "dpkg-shlibdeps failed"; }
depends="${shlibs#shlibs:Depends=}"
[ -n "$depends" ] && [ "$depends" != "$shlibs" ] || die "dpkg-shlibdeps printed no dependencies: $shlibs"

# ---- Control files ----
mkdir -p "$stage/DEBIAN"
size="$(du -sk --exclude=DEBIAN "$stage" | cut -f1)"
sed -e "s/@VERSION@/$version/" -e "s/@DEPENDS@/$depends/" -e "s/@SIZE@/$size/" \
  -e "s/^Architecture: .*/Architecture: $arch/" "$root/deploy/debian/control.in" >"$stage/DEBIAN/control"
echo /etc/default/lockstep >"$stage/DEBIAN/conffiles"
for script in postinst prerm postrm; do
  install -m 0755 "$root/deploy/debian/$script" "$stage/DEBIAN/$script"
done

mkdir -p "$out"
deb="$out/lockstep_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$stage" "$deb" >&2
say "$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | wc -l) dependencies; $(du -h "$deb" | cut -f1)"
echo "$deb"
