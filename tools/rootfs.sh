# A fresh Debian bookworm root with the lockstep package installed, for the
# package install test and the container image. Source it, then:
#
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

ROOTFS_MOUNTS=()
ROOTFS_LOCK=/var/cache/apt/archives/lockstep-rootfs.lock

# rootfs_locked CMD...: CMD holding the apt cache's lock (see above).
rootfs_locked() {
  local rc=0
  flock -w "${ROOTFS_LOCK_WAIT:-900}" -E 75 "$ROOTFS_LOCK" "$@" || rc=$?
  if ((rc == 75)); then
    echo "rootfs: waited ${ROOTFS_LOCK_WAIT:-900} s for $ROOTFS_LOCK (the apt cache), held by another root being made" >&2
  fi
  return "$rc"
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

rootfs_install() {
  local dir=$1 log=$2 deb=$3
  shift 3
  rootfs_mount "$dir" /proc -t proc proc || return 1
  rootfs_mount "$dir" /dev --bind /dev || return 1
  rootfs_mount "$dir" /dev/shm --bind /dev/shm || return 1
  rootfs_mount "$dir" /var/cache/apt/archives --bind /var/cache/apt/archives || return 1
  cp "$deb" "$dir/tmp/"
  local env=(/usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
             DEBIAN_FRONTEND=noninteractive)
  chroot "$dir" "${env[@]}" apt-get update -q >"$log" 2>&1 ||
    { tail -n 20 "$log" >&2; echo "rootfs: apt-get update failed" >&2; return 1; }
  rootfs_locked chroot "$dir" "${env[@]}" apt-get install -y -q --no-install-recommends \
    "/tmp/$(basename "$deb")" "$@" >>"$log" 2>&1 ||
    { tail -n 30 "$log" >&2; echo "rootfs: installing $(basename "$deb") failed" >&2; return 1; }
  rm -f "$dir/tmp/$(basename "$deb")"
}

rootfs_unmount() {
  local i
  for ((i = ${#ROOTFS_MOUNTS[@]} - 1; i >= 0; i--)); do umount -l "${ROOTFS_MOUNTS[$i]}" 2>/dev/null || true; done
  ROOTFS_MOUNTS=()
}
