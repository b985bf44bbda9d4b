#!/usr/bin/env bash
# Builds the Lockstep container image offline from Debian's packages: a
# bookworm root made with debootstrap, the lockstep Debian package installed
# in it with apt (the daemon, the CLI, the worker runtime liblockstep, the
# example trainer), packed as a root file system tarball and imported with
# `podman import` as lockstep:<version> and lockstep:latest. No registry is
# used: the only downloads are Debian packages from the host's Debian mirror.
#
#   tools/container.sh [--deb FILE] [--out DIR] [--no-import]
#
#   --deb FILE    the package to install (default: build it, tools/package.sh)
#   --out DIR     where the tarball goes (default build/container)
#   --no-import   stop after the tarball (no podman needed)
#
# The image runs lockstepd as root (it starts each job's workers as a uid of
# their own, 70000-70999, leased in the image's /run/lockstep/job-uids):
#   ENTRYPOINT ["/usr/bin/lockstepd"]
#   CMD ["--coordinator", "--state-dir=/var/lib/lockstep", "--listen=0.0.0.0:7070",
#        "--insecure-plaintext"]
# so `podman run IMAGE` is a coordinator with its own agent, in plaintext
# (asked for explicitly: a published port needs 0.0.0.0, and lockstepd
# refuses plaintext beyond loopback otherwise), and
# `podman run IMAGE --state-dir=/var/lib/lockstep --listen=0.0.0.0:7071
# --coordinator-address=H:7070 --token-file=/var/lib/lockstep/token
# --insecure-plaintext` an agent (across hosts each also needs
# --advertise-address=HOST:PORT, and agents --network=host: deploy/README.md).
# For mutual TLS, give a
# command line with --tls-ca/--tls-cert/--tls-key (files from `lockstep
# certs`, mounted) instead of --insecure-plaintext. Prints the tarball's path, then the image
# name. Needs root and debootstrap; podman (Debian's) for the import. Exit
# status 3 names what is missing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
deb="" out="$root/build/container" import=1
while (($#)); do
  case "$1" in
    --deb) deb="$(realpath "$2")"; shift 2 ;;
    --out) out="$(realpath -m "$2")"; shift 2 ;;
    --no-import) import=0; shift ;;
    *) echo "container: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
say() { echo "container: $*" >&2; }
missing() { echo "container: cannot build the image: $*" >&2; exit 3; }
[ "$(id -u)" = 0 ] || missing "needs root (debootstrap and chroot)"
command -v debootstrap >/dev/null || missing "debootstrap is not installed: apt-get install debootstrap"
if ((import)) && ! command -v podman >/dev/null; then
  missing "podman is not installed: apt-get install podman (or pass --no-import for the tarball alone)"
fi
# shellcheck source=tools/rootfs.sh
source "$root/tools/rootfs.sh"

mkdir -p "$out"
if [ -z "$deb" ]; then
  say "building the Debian package (tools/package.sh)"
  deb="$("$root/tools/package.sh" "$out/deb" | tail -n 1)"
fi
[ -f "$deb" ] || missing "no package at '$deb'"
version="$(dpkg-deb -f "$deb" Version)"

work="$(mktemp -d)"
trap 'rootfs_unmount; rm -rf "$work"' EXIT
rootfs="$work/rootfs"
say "debootstrap bookworm ($(rootfs_mirror)), then installing $(basename "$deb") in it"
rc=0
rootfs_prepare "$rootfs" "$work/apt.log" "$deb" || rc=$?
((rc != 2)) || missing "no bookworm root (above)"
((rc == 0)) || exit 1
rootfs_unmount
# Smaller and reproducible-ish: no package lists, caches or logs.
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/var/cache/debconf/*-old
: >"$rootfs/etc/resolv.conf"
tarball="$out/lockstep-rootfs_${version}.tar"
tar --numeric-owner -C "$rootfs" -cf "$tarball" .
say "root file system: $tarball ($(du -h "$tarball" | cut -f1))"
echo "$tarball"
((import)) || exit 0

image="lockstep:$version"
podman import \
  --change 'ENTRYPOINT ["/usr/bin/lockstepd"]' \
  --change 'CMD ["--coordinator", "--state-dir=/var/lib/lockstep", "--listen=0.0.0.0:7070", "--insecure-plaintext"]' \
  --change 'EXPOSE 7070' --change 'EXPOSE 7071' \
  --change 'WORKDIR /var/lib/lockstep' \
  --message "lockstep $version from Debian bookworm (tools/container.sh)" \
  "$tarball" "$image" >&2 || missing "podman import failed (above)"
podman tag "$image" lockstep:latest
say "image $image (also lockstep:latest)"
echo "$image"
