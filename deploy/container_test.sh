#!/usr/bin/env bash
# The container image (tools/container.sh) built from Debian's packages and
# run as coordinator + agent, with a job submitted from outside it:
#   1. the image, from the Debian package given (//deploy:deb, built by
#      tools/package.sh): a debootstrap root with the package installed,
#      imported by podman as lockstep:<version>;
#   2. the image's own command line (its ENTRYPOINT and CMD, read back with
#      `podman image inspect`) run with the state dir as a volume: under
#      `podman run` where this machine can run containers; where it cannot
#      (crun refuses to start one here, see the log), the same command line
#      runs chrooted in the image's root file system inside a network
#      namespace of its own (10.231.7.2, veth to the host at 10.231.7.1,
#      /etc/hosts naming it as podman would), and the test says so;
#   3. from outside, the host's CLI submits a 2-worker job of the image's
#      trainer (/usr/lib/lockstep/examples/train) with the token from the
#      volume: SUCCEEDED, workers as the job's own uid (70000-70999, the
#      default), the job dir root's once it is over, identical parameters.
#
#   deploy/container_test.sh DEB LOCKSTEP      (LOCKSTEP: the host's CLI)
#
# Needs root, debootstrap, podman and Debian's mirror (skips without them).
set -euo pipefail
if [[ -n "${TEST_SRCDIR:-}" ]]; then
  ROOT="$PWD"
else
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fi
abs() { [[ "$1" == /* ]] && echo "$1" || echo "$PWD/$1"; }
DEB="$(abs "$1")" LOCKSTEP="$(abs "$2")"
W="${TEST_TMPDIR:-$(mktemp -d)}/container"
NS="lsct$$"
HOST_IP=10.231.7.1
NS_IP=10.231.7.2

log() { echo "[container $(date +%H:%M:%S)] $*" >&2; }
fail() { log "FAIL: $*"; exit 1; }
skip() { log "SKIP: $*"; exit 0; }

[ "$(id -u)" = 0 ] || skip "needs root"
command -v debootstrap >/dev/null || skip "debootstrap is not installed (tools/setup.sh installs it)"
command -v podman >/dev/null || skip "podman is not installed (tools/setup.sh installs it)"
# shellcheck source=tools/rootfs.sh
source "$ROOT/tools/rootfs.sh"

rm -rf "$W"
mkdir -p "$W/state"
CONTAINER="" DAEMON="" RFS=""
cleanup() {
  [ -n "$CONTAINER" ] && podman rm -f "$CONTAINER" >/dev/null 2>&1 || true
  if [ -n "$DAEMON" ]; then kill -TERM "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; fi
  if [ -n "$RFS" ]; then
    for p in /proc/[0-9]*; do
      [ "$(readlink "$p/root" 2>/dev/null)" = "$RFS" ] && kill -9 "${p#/proc/}" 2>/dev/null || true
    done
  fi
  rootfs_unmount
  ip netns del "$NS" 2>/dev/null || true
  ip link del "${NS}h" 2>/dev/null || true
  [ -n "${IMAGE:-}" ] && podman rmi -f "$IMAGE" lockstep:latest >/dev/null 2>&1 || true
  [ -n "${KEEP:-}" ] || rm -rf "$W/rootfs" "$W"/*.tar
}
trap cleanup EXIT

[ -f "$DEB" ] || fail "no package at $DEB"
log "building the image from $(basename "$DEB") ($(dpkg-deb -f "$DEB" Version))"
rc=0
"$ROOT/tools/container.sh" --deb "$DEB" --out "$W" >"$W/container.out" 2>"$W/container.log" || rc=$?
if ((rc != 0)); then
  if grep -q "cannot be reached" "$W/container.log"; then skip "$(grep -m1 'cannot be reached' "$W/container.log")"; fi
  tail -n 30 "$W/container.log" >&2
  fail "tools/container.sh failed (exit $rc)"
fi
tarball="$(sed -n 1p "$W/container.out")"
IMAGE="$(sed -n 2p "$W/container.out")"
podman image exists "$IMAGE" || fail "podman has no image $IMAGE"
entrypoint="$(podman image inspect --format '{{json .Config.Entrypoint}}' "$IMAGE")"
cmd="$(podman image inspect --format '{{json .Config.Cmd}}' "$IMAGE")"
mapfile -t argv < <(python3 -c 'import json,sys; [print(a) for a in json.loads(sys.argv[1]) + json.loads(sys.argv[2])]' "$entrypoint" "$cmd")
log "image $IMAGE ($(du -h "$tarball" | cut -f1) root file system): ${argv[*]}"
[ "${argv[0]}" = /usr/bin/lockstepd ] || fail "the image's entrypoint is ${argv[0]}"
listen_port="$(printf '%s\n' "${argv[@]}" | sed -n 's/^--listen=.*:\([0-9]*\)$/\1/p')"
[ -n "$listen_port" ] || fail "the image's command line has no --listen=...:PORT"

# ---- Run it: podman where possible ----
addr=""
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
if podman run -d --name "lsct$$" -v "$W/state:/var/lib/lockstep" -p "127.0.0.1:$port:$listen_port" \
     "$IMAGE" >"$W/podman.out" 2>"$W/podman.err"; then
  CONTAINER="lsct$$"
  addr="127.0.0.1:$port"
  log "podman run: container $CONTAINER, coordinator at $addr"
else
  log "this machine cannot run containers: $(tail -n 1 "$W/podman.err")"
  log "running the image's command line in network namespace $NS instead"
  podman rm -f "lsct$$" >/dev/null 2>&1 || true
  RFS="$W/rootfs"
  mkdir -p "$RFS"
  tar -C "$RFS" -xf "$tarball"
  ip netns add "$NS"
  ip link add "${NS}h" type veth peer name "${NS}c"
  ip link set "${NS}c" netns "$NS"
  ip addr add "$HOST_IP/24" dev "${NS}h"
  ip link set "${NS}h" up
  ip netns exec "$NS" ip addr add "$NS_IP/24" dev "${NS}c"
  ip netns exec "$NS" ip link set "${NS}c" up
  ip netns exec "$NS" ip link set lo up
  # As podman does: the container's hostname names its own address.
  printf '127.0.0.1 localhost\n%s %s\n' "$NS_IP" "$(hostname)" >"$RFS/etc/hosts"
  rootfs_mount "$RFS" /proc -t proc proc
  rootfs_mount "$RFS" /dev --bind /dev
  rootfs_mount "$RFS" /dev/shm --bind /dev/shm
  rootfs_mount "$RFS" /var/lib/lockstep --bind "$W/state"
  (cd "$RFS" && exec ip netns exec "$NS" chroot "$RFS" /usr/bin/env -i \
     PATH=/usr/sbin:/usr/bin:/sbin:/bin "${argv[@]}") >"$W/lockstepd.log" 2>&1 &
  DAEMON=$!
  addr="$NS_IP:$listen_port"
fi

# ---- A job from outside ----
for _ in $(seq 300); do [ -s "$W/state/token" ] && break; sleep 0.1; done
[ -s "$W/state/token" ] || { cat "$W/lockstepd.log" 2>/dev/null | tail -n 20 >&2; fail "no token in the state volume within 30 s"; }
# The image serves plaintext (its CMD says --insecure-plaintext); the CLI
# must be told so for a non-loopback address.
cli() { "$LOCKSTEP" --coordinator "$addr" --token-file "$W/state/token" --insecure-plaintext "$@"; }
for _ in $(seq 300); do cli nodes >/dev/null 2>&1 && break; sleep 0.1; done
cli nodes >"$W/nodes.txt" 2>&1 || { cat "$W/nodes.txt" >&2; fail "the CLI outside cannot reach the coordinator at $addr"; }
log "a 2-worker job from outside, to $addr"
out="$(cli submit --nproc-per-node 2 --max-restarts 0 --wait -- /usr/lib/lockstep/examples/train \
  --model mlp_small --steps 10 --checkpoint-dir ckpt --checkpoint-every 5 2>&1)" ||
  { echo "$out" >&2; tail -n 20 "$W/lockstepd.log" 2>/dev/null >&2; fail "the job did not succeed"; }
grep -q SUCCEEDED <<<"$out" || fail "no SUCCEEDED in: $out"
job="$(sed -n 's/^submitted job //p' <<<"$out")"
jobdir="$W/state/jobs/$job"
sums="$(for r in 0 1; do sed -n 's/.*"checksum":\([^,]*\),.*/\1/p' "$jobdir/rank-$r.stdout"; done)"
[ "$(wc -l <<<"$sums")" = 2 ] && [ "$(sort -u <<<"$sums" | wc -l)" = 1 ] ||
  fail "the ranks did not end with one checksum: $sums"
# The image's CMD has no --run-as: the job ran as a uid of its own from
# 70000-70999 (leased in the image's /run/lockstep/job-uids), which wrote
# the checkpoints; the agent gives the dir back to root once the job is over.
daemon_log() { if [ -n "${CONTAINER:-}" ]; then podman logs "$CONTAINER" 2>&1; else cat "$W/lockstepd.log"; fi; }
uid="$(daemon_log | sed -n "s/.*job=$job .*workers run as uid \([0-9]*\) (--job-uids).*/\1/p" | head -n 1)"
[[ "$uid" =~ ^70[0-9][0-9][0-9]$ ]] || fail "no uid from 70000-70999 for job $job: $(daemon_log | grep "$job" | head -n 5)"
ls "$jobdir"/ckpt/* >/dev/null 2>&1 || fail "no checkpoint in the job dir: uid $uid could not write its cwd"
# The log is read whole before it is searched: `daemon_log | grep -q` under
# pipefail fails when grep exits before the log's last write (SIGPIPE).
returned() { grep -q "uid $uid returned" <<<"$(daemon_log)"; }
for _ in $(seq 100); do returned && break; sleep 0.1; done
returned || fail "uid $uid was not returned within 10 s of SUCCEEDED"
others="$(find "$jobdir" ! -uid 0)"
[ -z "$others" ] || fail "not given back to root: $others"
log "job $job SUCCEEDED; workers ran as uid $uid; checksums $(head -n 1 <<<"$sums")"
log "PASS"
