#!/usr/bin/env bash
# The Debian package on a fresh Debian: takes the package given (//deploy:deb,
# built by tools/package.sh from the binaries, the units and
# //deploy:cmake_stage), makes a fresh bookworm root with debootstrap,
# installs the package there with apt (which pulls its Depends from Debian), then checks:
#   - the maintainer scripts made the system user `lockstep` and
#     /var/lib/lockstep (0711, root); the headers are files, no link dangles;
#   - `systemd-analyze verify` passes on the installed units exactly as
#     shipped, and `systemd-analyze security` rates both at most 4.0;
#   - the installed lockstepd, started with the coordinator unit's own
#     command line and environment (its ExecStart, its Environment= lines,
#     then a defaults file that moves it to port 0), runs a 2-worker job of
#     the installed example trainer to SUCCEEDED, its workers running as
#     the job's own uid from 70000-70999 (leased in /run/lockstep/job-uids)
#     in a job dir that uid owns (their checkpoints land there), with
#     identical parameters on both ranks, the dir root's once it is over;
#   - the unit's ExecReload makes that lockstepd re-read its tokens;
#   - purging the package removes /var/lib/lockstep.
#
#   deploy/package_install_test.sh DEB
#
# Needs root, debootstrap, and Debian's mirror (the one in the host's apt
# sources; packages the host already downloaded are taken from its apt
# cache). Skips, saying so, where it cannot have them.
set -euo pipefail
if [[ -n "${TEST_SRCDIR:-}" ]]; then
  ROOT="$PWD"
else
  ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fi
abs() { [[ "$1" == /* ]] && echo "$1" || echo "$PWD/$1"; }
DEB="$(abs "$1")"
W="${TEST_TMPDIR:-$(mktemp -d)}/package_install"
R="$W/root"

log() { echo "[package_install $(date +%H:%M:%S)] $*" >&2; }
fail() { log "FAIL: $*"; exit 1; }
skip() { log "SKIP: $*"; exit 0; }
in_root() { chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }

[ "$(id -u)" = 0 ] || skip "needs root (debootstrap, chroot, mounts)"
command -v debootstrap >/dev/null || skip "debootstrap is not installed (tools/setup.sh installs it)"
# shellcheck source=tools/rootfs.sh
source "$ROOT/tools/rootfs.sh"

rm -rf "$W"
mkdir -p "$W"
DAEMON=""
cleanup() {
  if [ -n "$DAEMON" ]; then kill -TERM "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; fi
  # Anything still running inside the root (a worker the daemon left).
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$R" ] && kill -9 "${p#/proc/}" 2>/dev/null || true
  done
  rootfs_unmount
  [ -n "${KEEP:-}" ] || rm -rf "$R"
}
trap cleanup EXIT

[ -f "$DEB" ] || fail "no package at $DEB"
deb="$W/$(dpkg-deb -f "$DEB" Package)_$(dpkg-deb -f "$DEB" Version)_$(dpkg-deb -f "$DEB" Architecture).deb"
cp "$DEB" "$deb"
log "the package: $(basename "$deb"), $(du -h "$deb" | cut -f1)"

log "debootstrap bookworm from $(rootfs_mirror)"
rc=0
rootfs_create "$R" "$W/debootstrap.log" || rc=$?
((rc != 2)) || skip "Debian's mirror cannot be reached (above)"
((rc == 0)) || fail "no fresh bookworm root (above)"
log "apt-get install ./$(basename "$deb") systemd"
rootfs_install "$R" "$W/apt.log" "$deb" systemd || fail "installing the package in a fresh bookworm"

# ---- What the maintainer scripts made ----
in_root getent passwd lockstep >/dev/null || fail "postinst did not make the user lockstep"
[ "$(stat -c '%a %U' "$R/var/lib/lockstep")" = "711 root" ] ||
  fail "/var/lib/lockstep is $(stat -c '%a %U' "$R/var/lib/lockstep"), want 711 root"

# ---- The worker library's files are files (a header shipped as a link into
# the build machine's tree dangles here) ----
dangling="$(in_root find /usr/include/lockstep /usr/lib -xtype l -path '*lockstep*')"
[ -z "$dangling" ] || fail "the package installed links to nowhere: $dangling"
headers="$(in_root find /usr/include/lockstep -type f -name '*.h' | wc -l)"
((headers >= 10)) || fail "only $headers headers under /usr/include/lockstep"

# ---- The units, exactly as shipped ----
units=(/lib/systemd/system/lockstepd-coordinator.service /lib/systemd/system/lockstepd-agent.service)
out="$(in_root systemd-analyze verify --man=no "${units[@]}" 2>&1)" || { echo "$out" >&2; fail "systemd-analyze verify"; }
if echo "$out" | grep -E "lockstepd-(agent|coordinator)\.service" | grep -v "Failed to connect to bus"; then
  fail "systemd-analyze verify warned about the units (above)"
fi
for unit in "${units[@]}"; do
  score="$(in_root systemd-analyze security --offline=true "$unit" 2>&1 | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p')"
  [ -n "$score" ] || fail "no security rating for $unit"
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 4.0 else 1)" "$score" ||
    fail "$unit is rated $score by systemd-analyze security, above 4.0"
  log "$(basename "$unit"): verify passes, security $score"
done

# ---- The coordinator unit's command line, run in the fresh root ----
unit="$R/lib/systemd/system/lockstepd-coordinator.service"
# Environment= lines, then EnvironmentFile= (here: port 0 and an address
# file, as an operator's /etc/default/lockstep would), then ExecStart with
# ${VAR} and $VAR expanded as systemd does.
cat >"$R/etc/default/lockstep" <<'EOF'
LOCKSTEP_LISTEN=127.0.0.1:0
LOCKSTEP_ARGS=--address-file=/var/lib/lockstep/address --lease-s=6 --heartbeat-interval-s=0.5
EOF
cmdline="$(python3 - "$unit" "$R/etc/default/lockstep" <<'PY'
import re, shlex, sys
env, exec_start = {}, None
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("Environment="):
        k, _, v = line[len("Environment="):].partition("=")
        env[k] = v
    elif line.startswith("ExecStart="):
        exec_start = line[len("ExecStart="):]
for line in open(sys.argv[2]):
    line = line.strip()
    if line and not line.startswith("#"):
        k, _, v = line.partition("=")
        env[k] = v
words = []
for word in exec_start.split():
    m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
    if m:  # $VAR: split into words, nothing when empty
        words += env.get(m.group(1), "").split()
    else:
        words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
print(" ".join(shlex.quote(w) for w in words))
print(" ".join(shlex.quote(f"{k}={v}") for k, v in env.items()))
PY
)"
exec_line="$(sed -n 1p <<<"$cmdline")"
env_line="$(sed -n 2p <<<"$cmdline")"
[[ "$exec_line" == "/usr/bin/lockstepd --coordinator --state-dir=/var/lib/lockstep"* ]] ||
  fail "unexpected ExecStart: $exec_line"
log "starting: $exec_line"
eval "chroot \"$R\" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin $env_line $exec_line" \
  >"$W/lockstepd.log" 2>&1 &
DAEMON=$!
for _ in $(seq 300); do [ -s "$R/var/lib/lockstep/address" ] && break; sleep 0.1; done
[ -s "$R/var/lib/lockstep/address" ] || { tail -n 20 "$W/lockstepd.log" >&2; fail "the installed lockstepd did not start serving within 30 s"; }
addr="$(cat "$R/var/lib/lockstep/address")"
cli() { in_root /usr/bin/lockstep --coordinator "$addr" --token-file /var/lib/lockstep/token "$@"; }

log "a 2-worker job of /usr/lib/lockstep/examples/train"
out="$(cli submit --nproc-per-node 2 --max-restarts 0 --wait -- /usr/lib/lockstep/examples/train \
  --model mlp_small --steps 10 --checkpoint-dir ckpt --checkpoint-every 5 2>&1)" ||
  { echo "$out" >&2; tail -n 20 "$W/lockstepd.log" >&2; fail "the job did not succeed"; }
job="$(sed -n 's/^submitted job //p' <<<"$out")"
grep -q SUCCEEDED <<<"$out" || fail "no SUCCEEDED in: $out"
# The unit leaves LOCKSTEP_RUN_AS empty: the job ran as a uid of its own
# from the default range, leased in the root's /run/lockstep/job-uids.
grep -q "job isolation: each job runs as its own uid from 70000-70999" "$W/lockstepd.log" ||
  fail "the unit's lockstepd did not isolate jobs: $(head -n 20 "$W/lockstepd.log")"
uid="$(sed -n "s/.*job=$job .*workers run as uid \([0-9]*\) (--job-uids).*/\1/p" "$W/lockstepd.log" | head -n 1)"
[[ "$uid" =~ ^70[0-9][0-9][0-9]$ ]] || fail "no uid from 70000-70999 for job $job: $(grep "$job" "$W/lockstepd.log" | head -n 5)"
[ -e "$R/run/lockstep/job-uids/$uid" ] || fail "no lease file /run/lockstep/job-uids/$uid in the root"
jobdir="/var/lib/lockstep/jobs/$job"
ls "$R$jobdir"/ckpt/* >/dev/null 2>&1 || fail "no checkpoint in the job dir: the workers could not write their cwd"
# Once the job is over the agent kills what is left of the uid and gives the
# dir back to root (logs readable to `lockstep logs`, not the next job).
for _ in $(seq 100); do grep -q "uid $uid returned" "$W/lockstepd.log" && break; sleep 0.1; done
grep -q "uid $uid returned" "$W/lockstepd.log" || fail "uid $uid was not returned within 10 s of SUCCEEDED"
others="$(in_root find "$jobdir" ! -user root)"
[ -z "$others" ] || fail "not given back to root: $others"
jobdir="$R$jobdir"
sums="$(for r in 0 1; do sed -n 's/.*"checksum":\([^,]*\),.*/\1/p' "$jobdir/rank-$r.stdout"; done)"
[ "$(wc -l <<<"$sums")" = 2 ] && [ "$(sort -u <<<"$sums" | wc -l)" = 1 ] ||
  fail "the ranks did not end with one checksum: $sums"
log "job $job SUCCEEDED as uid $uid; checksums $(head -n 1 <<<"$sums")"

# The unit's ExecReload, in the installed root, ${MAINPID} replaced as
# systemd does (by lockstepd's pid, from its lock file: $DAEMON is the
# shell that started it).
reload="$(sed -n 's/^ExecReload=//p' "$unit")"
[ "$reload" = '/bin/sh -c "kill -HUP ${MAINPID}"' ] || fail "unexpected ExecReload: $reload"
mainpid="$(cat "$R/var/lib/lockstep/lockstepd.lock")"
[[ "$mainpid" =~ ^[0-9]+$ ]] && grep -q lockstepd "/proc/$mainpid/comm" || fail "no lockstepd pid in its lock file: $mainpid"
eval "chroot \"$R\" ${reload//'${MAINPID}'/$mainpid}"
for _ in $(seq 100); do grep -q "tokens re-read (SIGHUP)" "$W/lockstepd.log" && break; sleep 0.1; done
grep -q "tokens re-read (SIGHUP)" "$W/lockstepd.log" || fail "ExecReload did not re-read the tokens"
cli nodes >/dev/null || fail "the CLI's token stopped working after a reload"
log "ExecReload re-read the tokens"

kill -TERM "$DAEMON"
wait "$DAEMON" || true
DAEMON=""

log "dpkg --purge lockstep"
in_root dpkg --purge lockstep >"$W/purge.log" 2>&1 || { cat "$W/purge.log" >&2; fail "purge"; }
[ ! -e "$R/var/lib/lockstep" ] || fail "purge left /var/lib/lockstep"
[ ! -e "$R/usr/bin/lockstepd" ] || fail "purge left /usr/bin/lockstepd"
log "PASS"
