#!/usr/bin/env bash
# The Debian package on a fresh Debian: takes the package given (//deploy:deb,
# built by tools/package.sh from the binaries, the units and
# //deploy:cmake_stage), makes a fresh bookworm root with debootstrap,
# installs the package there with apt (which pulls its Depends from Debian),
# then systemd, then checks (the root with the package alone is shared with
# //deploy:container_test through ROOTFS_CACHE, tools/rootfs.sh: whichever
# of the two runs first in a `bazel test` makes it, the other unpacks it):
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
#   - deploy/README.md's "A cluster", both units' command lines as shipped
#     with the README's TLS lines: two hosts as network + mount + UTS
#     namespaces over the root, certificates from the installed `lockstep
#     certs`, the agent with a copy of the coordinator's agent.token; a job
#     of one worker per host succeeds with identical parameters;
#   - the same two hosts under a real systemd (systemd-nspawn --boot over
#     the root), each unit as shipped started with `systemctl enable --now`:
#     both run with the sandbox they ask for (NoNewPrivs, a seccomp filter,
#     their CapabilityBoundingSet), a job over both hosts succeeds with
#     identical parameters as a uid of its own; both units serve /metrics on
#     127.0.0.1:9470 over HTTPS to the cluster's client.pem; a worker of the agent unit
#     has NoNewPrivs, a seccomp filter, no capabilities, no user namespace,
#     the unit's private /tmp (what it wrote there gone once its uid is
#     returned) and no /dev/net/tun; a stand-in GPU node
#     (/dev/nvidia0, no driver) is hidden as shipped and with DeviceAllow=
#     alone, and reached with deploy/README.md's PrivateDevices=false
#     drop-in; a job checkpointing to
#     /data fails (ProtectSystem=strict) until deploy/README.md's
#     ReadWritePaths=/data drop-in, then succeeds; the agent unit has
#     OOMPolicy=continue, the agent says it tells OOM kills by the memory
#     cgroups' counts (no /dev/kmsg in the sandbox), and a worker reads its
#     own cgroup's count; `systemctl reload`
#     re-reads the tokens and `systemctl stop` ends both with Result=success;
#   - purging the package removes /var/lib/lockstep.
#
#   deploy/package_install_test.sh DEB
#
# Needs root, debootstrap, and Debian's mirror (the one in the host's apt
# sources; packages the host already downloaded are taken from its apt
# cache), and systemd-nspawn for the systemd part. Skips, saying so, where
# it cannot have them.
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
CLUSTER=() NSC="" NSG=""
BOOTED=()  # PID 1 of each container booted below (host's view)
cleanup() {
  # Killing a container's PID 1 ends every process in it.
  for i in "${BOOTED[@]}"; do kill -9 "$i" 2>/dev/null || true; done
  if [ -n "$DAEMON" ]; then kill -TERM "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; fi
  for p in "${CLUSTER[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  # Anything still running inside the root (a worker the daemon left).
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$R" ] && kill -9 "${p#/proc/}" 2>/dev/null || true
  done
  rootfs_unmount
  for ns in $NSC $NSG; do ip netns del "$ns" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] || rm -rf "$R"
}
trap cleanup EXIT

[ -f "$DEB" ] || fail "no package at $DEB"
deb="$W/$(dpkg-deb -f "$DEB" Package)_$(dpkg-deb -f "$DEB" Version)_$(dpkg-deb -f "$DEB" Architecture).deb"
cp "$DEB" "$deb"
log "the package: $(basename "$deb"), $(du -h "$deb" | cut -f1)"

log "debootstrap bookworm from $(rootfs_mirror), then apt-get install ./$(basename "$deb"), then systemd"
rc=0
rootfs_prepare "$R" "$W/apt.log" "$deb" systemd || rc=$?
((rc != 2)) || skip "Debian's mirror cannot be reached (above)"
((rc == 0)) || fail "no fresh bookworm root with the package installed (above)"

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

# unit_cmdline UNIT DEFAULTS: two lines, the unit's ExecStart and its
# environment (Environment= lines, then the EnvironmentFile DEFAULTS), each
# word shell-quoted, ${VAR} and $VAR expanded as systemd does.
unit_cmdline() {
  python3 - "$1" "$2" <<'PY'
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
}

# ---- The coordinator unit's command line, run in the fresh root ----
unit="$R/lib/systemd/system/lockstepd-coordinator.service"
# Environment= lines, then EnvironmentFile= (here: port 0 and an address
# file, as an operator's /etc/default/lockstep would), then ExecStart with
# ${VAR} and $VAR expanded as systemd does.
cat >"$R/etc/default/lockstep" <<'EOF'
LOCKSTEP_LISTEN=127.0.0.1:0
LOCKSTEP_ARGS=--address-file=/var/lib/lockstep/address --lease-s=6 --heartbeat-interval-s=0.5
EOF
cmdline="$(unit_cmdline "$unit" "$R/etc/default/lockstep")"
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

# Stopped as systemd would: SIGTERM to the main pid ($DAEMON is the shell).
kill -TERM "$mainpid"
wait "$DAEMON" || true
DAEMON=""
for _ in $(seq 100); do kill -0 "$mainpid" 2>/dev/null || break; sleep 0.1; done
! kill -0 "$mainpid" 2>/dev/null || fail "lockstepd (pid $mainpid) still runs 10 s after SIGTERM"

# ---- A cluster from the units, as deploy/README.md's "A cluster" says ----
# Two hosts, each a network, mount and UTS namespace of its own over the
# installed root: its own hostname, an /etc/hosts naming both, its own
# /etc/default/lockstep; the agent's host its own /var/lib/lockstep and
# /run/lockstep. lsp-coord runs the coordinator unit's ExecStart with
# LOCKSTEP_LISTEN=0.0.0.0:7070, lsp-agent the agent unit's with
# LOCKSTEP_COORDINATOR=lsp-coord:7070 and a 0600 copy of the coordinator's
# agent.token as its token; both with the README's TLS lines and
# certificates from the installed `lockstep certs`. Nothing else is set.
NSC="lspc$$" NSG="lspg$$"
ip netns add "$NSC" && ip netns add "$NSG" || skip "network namespaces are not permitted here"
ip link add "${NSC}v" type veth peer name "${NSG}v"
ip link set "${NSC}v" netns "$NSC"
ip link set "${NSG}v" netns "$NSG"
ip -n "$NSC" addr add 10.231.8.1/24 dev "${NSC}v"
ip -n "$NSG" addr add 10.231.8.2/24 dev "${NSG}v"
for ns in "$NSC" "$NSG"; do ip -n "$ns" link set "${ns}v" up; ip -n "$ns" link set lo up; done
printf '127.0.0.1 localhost\n10.231.8.1 lsp-coord\n10.231.8.2 lsp-agent\n' >"$W/hosts"
touch "$R/etc/hosts"  # a minbase root has none to mount over
in_root lockstep certs --out /etc/lockstep/tls --hosts lsp-coord,lsp-agent >"$W/certs.log" 2>&1 ||
  { cat "$W/certs.log" >&2; fail "lockstep certs in the installed root"; }
tls_args() {
  echo "--tls-ca=/etc/lockstep/tls/ca.pem --tls-cert=/etc/lockstep/tls/$1.pem" \
    "--tls-key=/etc/lockstep/tls/$1.key --tls-worker-cert=/etc/lockstep/tls/worker.pem" \
    "--tls-worker-key=/etc/lockstep/tls/worker.key"
}
printf 'LOCKSTEP_LISTEN=0.0.0.0:7070\nLOCKSTEP_ARGS=%s\n' "$(tls_args lsp-coord)" >"$W/coord.default"
printf 'LOCKSTEP_LISTEN=0.0.0.0:7071\nLOCKSTEP_COORDINATOR=lsp-coord:7070\nLOCKSTEP_ARGS=%s\n' \
  "$(tls_args lsp-agent)" >"$W/agent.default"
mkdir -m 0711 "$W/agent-state"
mkdir -m 0755 "$W/agent-run"
# on_host NS HOSTNAME DEFAULTS "SRC:TARGET ..." CMD: CMD (one shell line)
# on that host, chrooted in the root (with ON_HOST_EXEC=exec in place of
# the calling shell: a background one's $! is then the daemon itself).
on_host() {
  local binds="" b
  for b in "$W/hosts:/etc/hosts" "$3:/etc/default/lockstep" $4; do
    binds+="mount --bind ${b%%:*} $R${b#*:} && "
  done
  ${ON_HOST_EXEC:-} ip netns exec "$1" unshare -m -u --propagation private sh -c \
    "hostname $2 && $binds exec chroot $R /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 $5"
}
AGENT_BINDS="$W/agent-state:/var/lib/lockstep $W/agent-run:/run/lockstep"
CLUSTER=()
start_unit() {  # start_unit NS HOSTNAME DEFAULTS BINDS UNIT LOG
  local lines
  lines="$(unit_cmdline "$R/lib/systemd/system/$5" "$3")"
  log "$2: $(sed -n 1p <<<"$lines")"
  ON_HOST_EXEC=exec on_host "$1" "$2" "$3" "$4" "$(sed -n 2p <<<"$lines") $(sed -n 1p <<<"$lines")" \
    >"$6" 2>&1 &
  CLUSTER+=($!)
}
ccli() {
  on_host "$NSC" lsp-coord "$W/coord.default" "" \
    "/usr/bin/lockstep --coordinator lsp-coord:7070 --token-file /var/lib/lockstep/token --tls-ca /etc/lockstep/tls/ca.pem --tls-cert /etc/lockstep/tls/client.pem --tls-key /etc/lockstep/tls/client.key $*"
}
# agent_incarnation CLI: the incarnation the coordinator lists for lsp-agent
# while it is alive (empty otherwise).
agent_incarnation() { "$1" nodes 2>/dev/null | awk '$1 == "lsp-agent" && $3 == "yes" { print $5 }'; }
# agent_listed CLI [OLD]: within 30 s, the coordinator lists lsp-agent alive
# with an incarnation other than OLD (after a restart: a job submitted
# before the new agent registered could be placed on the old one and fail
# as "node lost"). `CLI nodes` is left in $W/nodes.txt.
agent_listed() {
  local now
  for _ in $(seq 300); do
    now="$(agent_incarnation "$1")"
    [ -n "$now" ] && [ "$now" != "${2:-}" ] && break
    sleep 0.1
  done
  "$1" nodes >"$W/nodes.txt" 2>&1 || true
  [ -n "$now" ] && [ "$now" != "${2:-}" ]
}
# one_checksum JOB STATE_DIR...: each host's state dir holds one rank's
# output of JOB, and all end with the same checksum (printed).
one_checksum() {
  local job=$1 dir sums="" ranks
  shift
  for dir in "$@"; do
    mapfile -t ranks < <(compgen -G "$dir/jobs/$job/rank-*.stdout" || true)
    ((${#ranks[@]} == 1)) || fail "want one rank's output in $dir/jobs/$job, found: ${ranks[*]:-none}"
    sums+="$(sed -n 's/.*"checksum":\([^,]*\),.*/\1/p' "${ranks[0]}")"$'\n'
  done
  [ "$(grep -c . <<<"$sums")" = "$#" ] && [ "$(grep . <<<"$sums" | sort -u | wc -l)" = 1 ] ||
    fail "the hosts did not end $job with one checksum: $sums"
  head -n 1 <<<"$sums"
}
start_unit "$NSC" lsp-coord "$W/coord.default" "" lockstepd-coordinator.service "$W/coord.log"
for _ in $(seq 300); do
  ccli nodes >"$W/nodes.txt" 2>&1 && break
  kill -0 "${CLUSTER[0]}" 2>/dev/null || break
  sleep 0.1
done
ccli nodes >"$W/nodes.txt" 2>&1 || { cat "$W/nodes.txt" "$W/coord.log" >&2; fail "the coordinator unit on 0.0.0.0:7070 with TLS did not serve within 30 s"; }
grep -q "mutual TLS: CA /etc/lockstep/tls/ca.pem" "$W/coord.log" || fail "the coordinator unit does not serve TLS: $(head -n 5 "$W/coord.log")"
[ -s "$R/var/lib/lockstep/agent.token" ] || fail "the coordinator made no agent.token"
install -m 0600 "$R/var/lib/lockstep/agent.token" "$W/agent-state/token"
start_unit "$NSG" lsp-agent "$W/agent.default" "$AGENT_BINDS" lockstepd-agent.service "$W/agent.log"
agent_listed ccli || { cat "$W/nodes.txt" >&2; tail -n 20 "$W/agent.log" >&2; fail "the agent unit's node never joined"; }
grep -q lsp-coord "$W/nodes.txt" || fail "the coordinator's own node is not listed: $(cat "$W/nodes.txt")"
log "a job over both hosts (one worker each, Gloo between them)"
out="$(ccli submit --nodes 2 --nproc-per-node 1 --max-restarts 0 --wait -- /usr/lib/lockstep/examples/train \
  --model mlp_small --steps 10 2>&1)" ||
  { echo "$out" >&2; tail -n 20 "$W/coord.log" "$W/agent.log" >&2; fail "the job over both hosts did not succeed"; }
grep -q SUCCEEDED <<<"$out" || fail "no SUCCEEDED in: $out"
job="$(sed -n 's/^submitted job //p' <<<"$out")"
# One rank on each host (which gets rank 0 is the coordinator's choice).
sum="$(one_checksum "$job" "$R/var/lib/lockstep" "$W/agent-state")"
grep -q "job=$job .*workers run as uid 70[0-9][0-9][0-9] (--job-uids)" "$W/agent.log" ||
  fail "the agent unit did not run the job as a uid of its own: $(grep "$job" "$W/agent.log" | head -n 5)"
log "job $job SUCCEEDED on lsp-coord and lsp-agent over mutual TLS; checksums $sum"
for p in "${CLUSTER[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${CLUSTER[@]}"; do wait "$p" 2>/dev/null || true; done
CLUSTER=()

# ---- The same cluster under a real systemd ----
# The parts above run the units' command lines by hand, so none of their
# sandboxing ([Service]: capabilities, seccomp, ProtectSystem, ...) applied.
# Here each host is a container booted with systemd (systemd-nspawn --boot)
# over the installed root (a volatile overlay: the root itself is not
# written, both containers share it), in the network namespaces above, with
# its own /etc/hostname, /etc/hosts, /etc/default/lockstep and an empty
# /var/lib/lockstep.
# As an operator would: `systemctl enable --now` each unit, the agent.token
# copied to the agent's host, a job over both hosts, `systemctl reload`,
# `systemctl stop`.
# boot_host NS HOSTNAME DEFAULTS LOG: boots that host; BOOT_INIT is its PID 1.
boot_host() {
  echo "$2" >"$W/$2.hostname"  # systemd sets the hostname from /etc/hostname
  systemd-nspawn --boot --volatile=overlay -D "$R" --register=no --keep-unit -M "$2" \
    --network-namespace-path="/run/netns/$1" --bind-ro="$W/$2.hostname:/etc/hostname" \
    --bind-ro="$W/hosts:/etc/hosts" --bind-ro="$3:/etc/default/lockstep" \
    --tmpfs=/var/lib/lockstep:mode=0711 >"$4" 2>&1 </dev/null &
  local nspawn=$!
  BOOT_INIT=""
  for _ in $(seq 300); do
    BOOT_INIT="$(pgrep -P "$nspawn" -x systemd || true)"
    [ -n "$BOOT_INIT" ] && break
    kill -0 "$nspawn" 2>/dev/null || break
    sleep 0.1
  done
  # No systemd at all in the container is this machine's doing (the units
  # are enabled only later): the caller skips the part, saying why.
  [ -n "$BOOT_INIT" ] || { tail -n 20 "$4" >&2; log "$2: systemd-nspawn --boot did not start systemd (above)"; return 1; }
  BOOTED+=("$BOOT_INIT")
}
# in_host INIT CMD...: CMD in that container (its namespaces, root and cgroup).
in_host() { local i=$1; shift; nsenter -t "$i" -a /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }
booted() {  # booted INIT NAME: systemd there has finished starting up
  local state=""
  for _ in $(seq 600); do
    state="$(in_host "$1" systemctl is-system-running 2>/dev/null || true)"
    case "$state" in running|degraded) return 0 ;; esac
    sleep 0.1
  done
  fail "$2: systemd did not finish booting within 60 s (is-system-running: $state)"
}
# unit_sandboxed INIT UNIT: the unit's main process runs with the sandbox
# the unit asks for: no new privileges, a seccomp filter, and only the
# capabilities of its CapabilityBoundingSet.
unit_sandboxed() {
  local pid status want
  pid="$(in_host "$1" systemctl show -p MainPID --value "$2")"
  [[ "$pid" =~ ^[1-9][0-9]*$ ]] || fail "$2 has no main process: $pid"
  status="$(in_host "$1" cat "/proc/$pid/status")"
  grep -Eq "^NoNewPrivs:[[:space:]]+1$" <<<"$status" || fail "$2 (pid $pid) runs without NoNewPrivs"
  grep -Eq "^Seccomp:[[:space:]]+2$" <<<"$status" || fail "$2 (pid $pid) runs without a seccomp filter"
  # CAP_CHOWN 0, DAC_OVERRIDE 1, DAC_READ_SEARCH 2, FOWNER 3, KILL 5,
  # SETGID 6, SETUID 7, SYS_NICE 23.
  want="$(printf '%016x' $(( (1<<0)|(1<<1)|(1<<2)|(1<<3)|(1<<5)|(1<<6)|(1<<7)|(1<<23) )))"
  grep -Eq "^CapBnd:[[:space:]]+$want$" <<<"$status" ||
    fail "$2 (pid $pid) has capability bounding set $(sed -n 's/^CapBnd:[[:space:]]*//p' <<<"$status"), want $want"
}
under_systemd() {
  log "booting lsp-coord and lsp-agent with systemd (systemd-nspawn --boot)"
  if ! boot_host "$NSC" lsp-coord "$W/coord.default" "$W/nspawn-coord.log" ||
    ! { init_c=$BOOT_INIT && boot_host "$NSG" lsp-agent "$W/agent.default" "$W/nspawn-agent.log"; }; then
    for i in "${BOOTED[@]}"; do kill -9 "$i" 2>/dev/null || true; done
    BOOTED=()
    log "SKIP the part under systemd: systemd-nspawn cannot boot a container on this machine"
    return 0
  fi
  init_g=$BOOT_INIT
  booted "$init_c" lsp-coord
  booted "$init_g" lsp-agent
  in_host "$init_c" systemctl enable --now lockstepd-coordinator.service >"$W/enable.log" 2>&1 ||
    { cat "$W/enable.log" >&2; fail "lsp-coord: systemctl enable --now lockstepd-coordinator"; }
  sdcli() {
    in_host "$init_c" /usr/bin/lockstep --coordinator lsp-coord:7070 --token-file /var/lib/lockstep/token \
      --tls-ca /etc/lockstep/tls/ca.pem --tls-cert /etc/lockstep/tls/client.pem \
      --tls-key /etc/lockstep/tls/client.key "$@"
  }
  for _ in $(seq 300); do sdcli nodes >"$W/nodes.txt" 2>&1 && break; sleep 0.1; done
  sdcli nodes >"$W/nodes.txt" 2>&1 ||
    { cat "$W/nodes.txt" >&2; in_host "$init_c" journalctl -u lockstepd-coordinator --no-pager | tail -n 20 >&2
      fail "the coordinator unit under systemd did not serve within 30 s"; }
  in_host "$init_c" cat /var/lib/lockstep/agent.token | in_host "$init_g" sh -c 'umask 077 && cat >/var/lib/lockstep/token'
  in_host "$init_g" systemctl enable --now lockstepd-agent.service >"$W/enable.log" 2>&1 ||
    { cat "$W/enable.log" >&2; fail "lsp-agent: systemctl enable --now lockstepd-agent"; }
  agent_listed sdcli ||
    { cat "$W/nodes.txt" >&2; in_host "$init_g" journalctl -u lockstepd-agent --no-pager | tail -n 20 >&2
      fail "the agent unit's node never joined under systemd"; }
  unit_sandboxed "$init_c" lockstepd-coordinator.service
  unit_sandboxed "$init_g" lockstepd-agent.service
  log "both units active under systemd, each with NoNewPrivs, a seccomp filter and its 8 capabilities"
  out="$(sdcli submit --nodes 2 --nproc-per-node 1 --max-restarts 0 --wait -- /usr/lib/lockstep/examples/train \
    --model mlp_small --steps 10 2>&1)" ||
    { echo "$out" >&2; in_host "$init_g" journalctl -u lockstepd-agent --no-pager | tail -n 20 >&2
      fail "the job over both hosts under systemd did not succeed"; }
  grep -q SUCCEEDED <<<"$out" || fail "no SUCCEEDED in: $out"
  job="$(sed -n 's/^submitted job //p' <<<"$out")"
  sum="$(one_checksum "$job" "/proc/$init_c/root/var/lib/lockstep" "/proc/$init_g/root/var/lib/lockstep")"
  # (grep -q reads a captured journal: on a pipe it may quit before
  # journalctl has written all, which pipefail takes for a failure.)
  journal="$(in_host "$init_g" journalctl -u lockstepd-agent --no-pager)"
  grep -q "job=$job .*workers run as uid 70[0-9][0-9][0-9] (--job-uids)" <<<"$journal" ||
    fail "the agent unit under systemd did not run the job as a uid of its own"
  log "job $job SUCCEEDED under systemd on both hosts; checksums $sum"
  # Both units serve /metrics on 127.0.0.1:9470 as shipped, over HTTPS with
  # the cluster's client certificate (the daemons have TLS), scraped from
  # the host inside each one's network namespace.
  for pair in "$NSC lsp-coord lockstep_nodes_alive 2" "$NSG lsp-agent lockstep_agent_workers_running 0"; do
    read -r ns host metric value <<<"$pair"
    scraped="$(ip netns exec "$ns" curl -sf --max-time 5 --resolve "$host:9470:127.0.0.1" \
      --cacert "$R/etc/lockstep/tls/ca.pem" --cert "$R/etc/lockstep/tls/client.pem" \
      --key "$R/etc/lockstep/tls/client.key" "https://$host:9470/metrics")" ||
      fail "$host: no metrics from its unit at https://127.0.0.1:9470/metrics with client.pem"
    grep -q "^$metric $value\$" <<<"$scraped" ||
      fail "$host: its unit's metrics lack '$metric $value': $(grep "^$metric" <<<"$scraped")"
  done
  log "both units serve /metrics on 127.0.0.1:9470 over HTTPS (client certificate) as shipped"
  # What a worker inherits from the unit, seen from inside a job (the
  # agent's host): no new privileges, a seccomp filter, no effective
  # capabilities, no new namespaces (RestrictNamespaces=), the unit's own
  # /tmp (PrivateTmp=) and no physical devices (PrivateDevices=). The same
  # uid outside the unit is the control: it may create a user namespace,
  # and the host it runs on has /dev/net/tun.
  probe='grep -E "^(NoNewPrivs|Seccomp|CapEff):" /proc/self/status
    echo "uid $(id -u)"
    if unshare --user --map-root-user true 2>/dev/null; then echo "userns allowed"; else echo "userns refused"; fi
    echo "$LOCKSTEP_JOB_ID" >/tmp/lockstep-probe && echo "tmp written"
    echo "tmp from $(awk '\''$5 == "/tmp" { print $4 }'\'' /proc/self/mountinfo | tail -n 1)"
    if [ -e /dev/net/tun ]; then echo "tun seen"; else echo "tun absent"; fi
    cg=$(sed -n "s|^[0-9]*:[^:]*memory[^:]*:\(.*\)$|memory\1/memory.oom_control|p" /proc/self/cgroup | head -n 1)
    [ -n "$cg" ] || cg=$(sed -n "s|^0::\(.*\)$|\1/memory.events|p" /proc/self/cgroup)
    if grep -q "^oom_kill " "/sys/fs/cgroup/$cg"; then echo "oom count readable"; else echo "oom count unreadable: /sys/fs/cgroup/$cg"; fi'
  out="$(sdcli submit --nodes 2 --nproc-per-node 1 --max-restarts 0 --wait -- /bin/sh -c "$probe" 2>&1)" ||
    fail "the probe job under systemd did not succeed: $out"
  job="$(sed -n 's/^submitted job //p' <<<"$out")"
  seen="$(cat "/proc/$init_g/root/var/lib/lockstep/jobs/$job/"rank-*.stdout)"
  grep -Eq "^NoNewPrivs:[[:space:]]+1$" <<<"$seen" || fail "a worker of the agent unit runs without NoNewPrivs: $seen"
  grep -Eq "^Seccomp:[[:space:]]+2$" <<<"$seen" || fail "a worker of the agent unit runs without a seccomp filter: $seen"
  grep -Eq "^CapEff:[[:space:]]+0+$" <<<"$seen" || fail "a worker of the agent unit has capabilities: $seen"
  juid="$(sed -n 's/^uid //p' <<<"$seen")"
  [[ "$juid" =~ ^70[0-9]{3}$ ]] || fail "the probe did not run as a job uid: $seen"
  in_host "$init_g" setpriv --reuid "$juid" --regid "$juid" --clear-groups unshare --user --map-root-user true ||
    fail "control: uid $juid cannot create a user namespace outside the unit either, so the probe shows nothing"
  grep -qx "userns refused" <<<"$seen" || fail "a worker of the agent unit created a user namespace (RestrictNamespaces=): $seen"
  grep -qx "tmp written" <<<"$seen" || fail "the worker could not write /tmp (PrivateTmp= gives it a writable one under ProtectSystem=strict): $seen"
  [ ! -e "/proc/$init_g/root/tmp/lockstep-probe" ] || fail "the worker's /tmp is the host's (PrivateTmp=)"
  grep -Eqx "tmp from (/tmp)?/systemd-private-[^/]*-lockstepd-agent.service-[^/]*/tmp" <<<"$seen" ||
    fail "the worker's /tmp is not the agent unit's private /tmp: $seen"
  # Once the job's uid is returned, what it left there is gone (the agent
  # removes a returned uid's entries of /tmp, seen through the unit's own).
  for _ in $(seq 100); do
    compgen -G "/proc/$init_g/root/tmp/systemd-private-*-lockstepd-agent.service-*/tmp/lockstep-probe" >/dev/null || break
    sleep 0.1
  done
  if compgen -G "/proc/$init_g/root/tmp/systemd-private-*-lockstepd-agent.service-*/tmp/lockstep-probe" >/dev/null; then
    fail "the probe's /tmp file outlived its job's uid under the agent unit"
  fi
  [ -e "/proc/$init_g/root/dev/net/tun" ] || fail "control: lsp-agent has no /dev/net/tun, so the probe shows nothing"
  grep -qx "tun absent" <<<"$seen" || fail "a worker of the agent unit sees /dev/net/tun (PrivateDevices=): $seen"
  grep -qx "oom count readable" <<<"$seen" ||
    fail "a worker of the agent unit cannot read its memory cgroup's OOM kill count (MemoryAccounting=): $seen"
  log "a worker under the agent unit: NoNewPrivs, seccomp, no capabilities, no user namespace, the unit's private /tmp, no /dev/net/tun"
  # deploy/README.md's drop-in for data outside the job dir: under
  # ProtectSystem=strict a job cannot write /data (a checkpoint there fails
  # the job, naming the read-only file system) until both units get
  # ReadWritePaths=/data, as `systemctl edit` would write it.
  for init in "$init_c" "$init_g"; do in_host "$init" mkdir -m 1777 /data; done
  data_job() {
    sdcli submit --nodes 2 --nproc-per-node 1 --max-restarts 0 --wait -- /usr/lib/lockstep/examples/train \
      --model mlp_small --steps 4 --checkpoint-dir /data/ckpt --checkpoint-every 2 2>&1
  }
  out="$(data_job)" && fail "a checkpoint in /data succeeded without ReadWritePaths: $out"
  grep -q "FAILED" <<<"$out" || fail "the job writing /data did not fail: $out"
  grep -q "Read-only file system" <<<"$out" || fail "the failed job does not name the read-only /data: $out"
  inc="$(agent_incarnation sdcli)"
  for pair in "$init_c lockstepd-coordinator" "$init_g lockstepd-agent"; do
    read -r init unit <<<"$pair"
    in_host "$init" sh -c "mkdir -p /etc/systemd/system/$unit.service.d &&
      printf '[Service]\nReadWritePaths=/data\n' >/etc/systemd/system/$unit.service.d/data.conf &&
      systemctl daemon-reload && systemctl restart $unit.service" || fail "a ReadWritePaths drop-in for $unit"
  done
  agent_listed sdcli "$inc" || fail "the agent's node did not rejoin after both units restarted: $(cat "$W/nodes.txt")"
  out="$(data_job)" || fail "the job writing /data failed with ReadWritePaths=/data: $out"
  ckpts=""
  for init in "$init_c" "$init_g"; do ckpts+="$(compgen -G "/proc/$init/root/data/ckpt/ckpt-*.pt" || true)"; done
  [ -n "$ckpts" ] || fail "no checkpoint in /data on either host: $out"
  log "a job writing /data: refused by ProtectSystem=strict, then SUCCEEDED with a ReadWritePaths=/data drop-in"
  # deploy/README.md's GPU drop-in, on a stand-in for a GPU's device node:
  # a character node with NVIDIA's major number (195) and no driver behind
  # it, so a worker that reaches it gets ENXIO from the kernel. As shipped
  # (PrivateDevices=) a worker does not see it; DeviceAllow= alone does not
  # bring it into the unit's private /dev; PrivateDevices=false does.
  mknod -m 0666 "/proc/$init_g/root/dev/nvidia0" c 195 0
  gpu_seen() {  # into $seen: what a worker of the agent unit sees of /dev/nvidia0
    local out job
    out="$(sdcli submit --nodes 2 --nproc-per-node 1 --max-restarts 0 --wait -- /bin/sh -c \
      'if [ -c /dev/nvidia0 ]; then (exec 3</dev/nvidia0) 2>&1 | sed "s/^/nvidia0 seen: /"; else echo "nvidia0 absent"; fi' 2>&1)" ||
      fail "the job probing /dev/nvidia0 did not succeed: $out"
    job="$(sed -n 's/^submitted job //p' <<<"$out")"
    seen="$(grep -h "^nvidia0 " "/proc/$init_g/root/var/lib/lockstep/jobs/$job/"rank-*.stdout || true)"
  }
  agent_dropin() {  # agent_dropin CONTENT: the agent unit restarted with drop-in gpu.conf
    local inc
    inc="$(agent_incarnation sdcli)"
    in_host "$init_g" sh -c "printf '$1' >/etc/systemd/system/lockstepd-agent.service.d/gpu.conf &&
      systemctl daemon-reload && systemctl restart lockstepd-agent.service" || fail "the GPU drop-in: $1"
    agent_listed sdcli "$inc" || fail "the agent's node did not rejoin after its restart: $(cat "$W/nodes.txt")"
  }
  gpu_seen
  [ "$seen" = "nvidia0 absent" ] || fail "a worker of the agent unit as shipped sees /dev/nvidia0: $seen"
  agent_dropin '[Service]\nDeviceAllow=/dev/nvidia0 rw\n'
  gpu_seen
  [ "$seen" = "nvidia0 absent" ] || fail "DeviceAllow= alone brought /dev/nvidia0 into the private /dev: $seen"
  agent_dropin '[Service]\nPrivateDevices=false\n'
  gpu_seen
  grep -q "^nvidia0 seen: .*No such device or address" <<<"$seen" ||
    fail "with PrivateDevices=false a worker does not reach /dev/nvidia0 (want ENXIO, no driver): $seen"
  agent_dropin ''
  log "GPU drop-in: /dev/nvidia0 hidden as shipped and with DeviceAllow= alone, reached with PrivateDevices=false"
  # OOM kills under the agent unit: this systemd keeps the unit running
  # when the OOM killer ends one of its workers (OOMPolicy=continue; its
  # default, stop, would end every job on the host), and with the kernel
  # log out of the sandbox's reach the agent says it reads the workers'
  # memory cgroups' counts instead (the probe above read its own).
  [ "$(in_host "$init_g" systemctl show -p OOMPolicy --value lockstepd-agent.service)" = continue ] ||
    fail "the agent unit's OOMPolicy is not continue under systemd"
  journal="$(in_host "$init_g" journalctl -u lockstepd-agent --no-pager)"
  grep -q "OOM kills of workers: told by their memory cgroups' OOM kill counts (/dev/kmsg cannot be read" <<<"$journal" ||
    fail "the agent under its unit does not say it tells OOM kills by the cgroups' counts"
  log "the agent unit: OOMPolicy=continue; OOM kills told by memory cgroups' counts (no /dev/kmsg in the sandbox)"
  in_host "$init_c" systemctl reload lockstepd-coordinator.service || fail "systemctl reload lockstepd-coordinator"
  for _ in $(seq 100); do
    journal="$(in_host "$init_c" journalctl -u lockstepd-coordinator --no-pager)"
    grep -q "tokens re-read (SIGHUP)" <<<"$journal" && break
    sleep 0.1
  done
  grep -q "tokens re-read (SIGHUP)" <<<"$journal" ||
    fail "systemctl reload did not make the coordinator re-read its tokens"
  for pair in "$init_g lockstepd-agent" "$init_c lockstepd-coordinator"; do
    read -r init unit <<<"$pair"
    in_host "$init" systemctl stop "$unit.service" || fail "systemctl stop $unit"
    result="$(in_host "$init" systemctl show -p Result --value "$unit.service")"
    [ "$result" = success ] || fail "$unit stopped with result '$result'"
    ! in_host "$init" systemctl is-active --quiet "$unit.service" || fail "$unit still active after systemctl stop"
  done
  log "systemctl reload re-read the tokens; both units stopped cleanly (Result=success)"
  for i in "${BOOTED[@]}"; do in_host "$i" systemctl poweroff >/dev/null 2>&1 || true; done
  for i in "${BOOTED[@]}"; do
    for _ in $(seq 300); do kill -0 "$i" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$i" 2>/dev/null || true
  done
  wait  # the systemd-nspawn processes
  BOOTED=()
}
if command -v systemd-nspawn >/dev/null; then
  under_systemd
else
  log "SKIP the part under systemd: systemd-nspawn is not installed (tools/setup.sh installs systemd-container)"
fi

log "dpkg --purge lockstep"
in_root dpkg --purge lockstep >"$W/purge.log" 2>&1 || { cat "$W/purge.log" >&2; fail "purge"; }
[ ! -e "$R/var/lib/lockstep" ] || fail "purge left /var/lib/lockstep"
[ ! -e "$R/usr/bin/lockstepd" ] || fail "purge left /usr/bin/lockstepd"
log "PASS"
