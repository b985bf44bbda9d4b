# A fresh Debian bookworm root with the lockstep package installed, for the
# package install test and the container image. Source it, then:
#
#   rootfs_prepare DIR LOG DEB [PKG...] rootfs_create, then rootfs_install
#                                      (below), the root with DEB alone
#                                      shared through ROOTFS_CACHE if set
#   rootfs_create DIR LOG              debootstrap (minbase) from the host's mirror
#   rootfs_install DIR LOG DEB [PKG...] apt-get install the .deb (+ PKGs) in it
#   rootfs_mount DIR TARGET ARGS...    mount (ARGS: mount(8)'s) at DIR/TARGET, undone by:
#   rootfs_unmount                     undo every mount made here
#
# Needs root and debootstrap. Packages the host already downloaded come from
# its apt cache (bind-mounted), which debootstrap and apt write to: roots made
# at the same time (the package and container tests) take turns on it
# (flock on $ROOTFS_LOCK, at most ROOTFS_LOCK_WAIT seconds, default 900).
# rootfs_create returns 2 when Debian's mirror cannot be reached (callers
# may skip), 1 on other failures; both print why.
#
# ROOTFS_CACHE (a directory; the two tests set it, tools/container.sh run by
# hand does not): rootfs_prepare keeps the root with DEB installed there as
# bookworm-KEY.tar, KEY from DEB's sha256 and the host's apt sources, and
# unpacks it instead of making it again while it is less than a day old. The
# package and container tests of one `bazel test` install the same package:
# whichever comes first makes the root (debootstrap and apt, about 3 min on
# 2 cores), the other unpacks it. A new package is a new key (the older
# tarballs are removed).

ROOTFS_MOUNTS=()
ROOTFS_LOCK=/var/cache/apt/archives/lockstep-rootfs.lock

# rootfs_locked CMD...: CMD holding the apt cache's lock (see above); run
# as it is inside rootfs_prepare, which holds the lock throughout.
rootfs_locked() {
  local rc=0
  if [ -n "${ROOTFS_LOCK_FD:-}" ]; then "$@"; return; fi
  flock -w "${ROOTFS_LOCK_WAIT:-900}" -E 75 "$ROOTFS_LOCK" "$@" || rc=$?
  if ((rc == 75)); then rootfs_lock_timed_out; fi
  return "$rc"
}

rootfs_lock_timed_out() {
  echo "rootfs: waited ${ROOTFS_LOCK_WAIT:-900} s for $ROOTFS_LOCK (the apt cache), held by another root being made" >&2
}

# The host's Debian mirror (deb822 sources first, then sources.list).
rootfs_mirror() {
  local m
  m="$(sed -n 's|^URIs: *\(http[^ ]*/debian\)/*$|\1|p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)"
  [ -n "$m" ] || m="$(sed -n 's|^deb \(http[^ ]*/debian\)/* bookworm .*|\1|p' /etc/apt/sources.list 2>/dev/null | head -n 1)"
  echo "${m:-http://deb.debian.org/debian}"
}

rootfs_create() {
  local dir=$1 log=$2 mirror
  mirror="$(rootfs_mirror)"
  if ! command -v debootstrap >/dev/null; then
    echo "rootfs: debootstrap is not installed (apt-get install debootstrap)" >&2
    return 1
  fi
  if ! rootfs_locked debootstrap --variant=minbase --cache-dir=/var/cache/apt/archives bookworm "$dir" "$mirror" \
       >"$log" 2>&1; then
    if grep -qiE "Failed getting release file|Temporary failure|Could not resolve|Connection (refused|timed out)" "$log"; then
      echo "rootfs: Debian's mirror $mirror cannot be reached: $(grep -m1 -iE 'fail|could not' "$log")" >&2
      return 2
    fi
    tail -n 20 "$log" >&2
    echo "rootfs: debootstrap from $mirror failed" >&2
    return 1
  fi
  cp /etc/resolv.conf "$dir/etc/resolv.conf"
  # The host's Debian suites (updates, security): the root then offers the
  # versions the package was built against.
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    cp /etc/apt/sources.list.d/debian.sources "$dir/etc/apt/sources.list.d/"
    : >"$dir/etc/apt/sources.list"
  fi
}

rootfs_mount() {
  local dir=$1 target=$2
  shift 2
  mkdir -p "$dir$target"
  mount "$@" "$dir$target" && ROOTFS_MOUNTS+=("$dir$target")
}

# rootfs_chroot_mounts DIR: what apt and the workers need in the root: /proc,
# /dev, /dev/shm, and the host's apt cache.
rootfs_chroot_mounts() {
  local dir=$1
  rootfs_mount "$dir" /proc -t proc proc || return 1
  rootfs_mount "$dir" /dev --bind /dev || return 1
  rootfs_mount "$dir" /dev/shm --bind /dev/shm || return 1
  rootfs_mount "$dir" /var/cache/apt/archives --bind /var/cache/apt/archives || return 1
}

ROOTFS_CHROOT_ENV=(/usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
                   DEBIAN_FRONTEND=noninteractive)

# rootfs_apt_install DIR LOG PKG...: apt-get install in the root (its package
# lists already fetched), holding the apt cache's lock.
rootfs_apt_install() {
  local dir=$1 log=$2
  shift 2
  rootfs_locked chroot "$dir" "${ROOTFS_CHROOT_ENV[@]}" apt-get install -y -q --no-install-recommends \
    "$@" >>"$log" 2>&1 ||
    { tail -n 30 "$log" >&2; echo "rootfs: installing $* failed" >&2; return 1; }
}

rootfs_install() {
  local dir=$1 log=$2 deb=$3
  shift 3
  rootfs_chroot_mounts "$dir" || return 1
  cp "$deb" "$dir/tmp/"
  chroot "$dir" "${ROOTFS_CHROOT_ENV[@]}" apt-get update -q >"$log" 2>&1 ||
    { tail -n 20 "$log" >&2; echo "rootfs: apt-get update failed" >&2; return 1; }
  rootfs_apt_install "$dir" "$log" "/tmp/$(basename "$deb")" "$@" || return 1
  rm -f "$dir/tmp/$(basename "$deb")"
}

rootfs_prepare() {
  local dir=$1 log=$2 deb=$3
  shift 3
  if [ -z "${ROOTFS_CACHE:-}" ]; then
    rootfs_create "$dir" "$log.debootstrap" || return
    rootfs_install "$dir" "$log" "$deb" "$@"
    return
  fi
  mkdir -p "$ROOTFS_CACHE" || return 1
  local key tarball rc=0 mounted
  key="$({ sha256sum <"$deb"; cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null; } |
         sha256sum | cut -c1-16)"
  tarball="$ROOTFS_CACHE/bookworm-$key.tar"
  exec {ROOTFS_LOCK_FD}>>"$ROOTFS_LOCK"
  if ! flock -w "${ROOTFS_LOCK_WAIT:-900}" "$ROOTFS_LOCK_FD"; then
    rootfs_lock_timed_out
    exec {ROOTFS_LOCK_FD}>&-
    unset ROOTFS_LOCK_FD
    return 1
  fi
  if [ -n "$(find "$tarball" -maxdepth 0 -mmin -1440 2>/dev/null)" ]; then
    echo "rootfs: the root with $(basename "$deb") unpacked from $tarball, made $(date -r "$tarball" '+%F %T')" |
      tee "$log" >&2
    { mkdir -p "$dir" && tar -C "$dir" --numeric-owner --xattrs --xattrs-include='*' -xpf "$tarball" &&
      rootfs_chroot_mounts "$dir"; } || rc=1
  else
    rootfs_create "$dir" "$log.debootstrap" || rc=$?
    if ((rc == 0)); then
      mounted=${#ROOTFS_MOUNTS[@]}
      rootfs_install "$dir" "$log" "$deb" || rc=1
    fi
    if ((rc == 0)); then
      # The root as rootfs_install leaves it, its mounts undone (their
      # contents are the host's), packed beside any older key's, which go.
      rootfs_unmount_from "$mounted"
      if tar -C "$dir" --numeric-owner --xattrs --xattrs-include='*' -cpf "$tarball.part" . &&
         mv "$tarball.part" "$tarball"; then
        find "$ROOTFS_CACHE" -maxdepth 1 -name 'bookworm-*.tar' ! -name "$(basename "$tarball")" -delete
        echo "rootfs: the root with $(basename "$deb") kept as $tarball ($(du -h "$tarball" | cut -f1))" >&2
      else
        rm -f "$tarball.part"
        echo "rootfs: could not keep the root in $ROOTFS_CACHE (made again next time)" >&2
      fi
      rootfs_chroot_mounts "$dir" || rc=1
    fi
  fi
  exec {ROOTFS_LOCK_FD}>&-
  unset ROOTFS_LOCK_FD
  ((rc == 0)) || return "$rc"
  (($# == 0)) || rootfs_apt_install "$dir" "$log" "$@"
}

# rootfs_unmount_from N: undo the mounts made after the first N.
rootfs_unmount_from() {
  local i
  for ((i = ${#ROOTFS_MOUNTS[@]} - 1; i >= $1; i--)); do umount -l "${ROOTFS_MOUNTS[$i]}" 2>/dev/null || true; done
  ROOTFS_MOUNTS=("${ROOTFS_MOUNTS[@]:0:$1}")
}

rootfs_unmount() { rootfs_unmount_from 0; }
