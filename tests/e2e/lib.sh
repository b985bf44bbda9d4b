#!/usr/bin/env bash
# Shared helpers for the end-to-end tests: real lockstepd and lockstep
# binaries as processes on loopback, ports picked by the kernel (port 0,
# read back from --address-file), everything under $TEST_TMPDIR.
#
# Usage in a test:  source tests/e2e/lib.sh "$@"   (args: lockstepd lockstep test_trainer)
# Waits poll a condition with a deadline (wait_for); nothing sleeps blindly.
set -euo pipefail

LOCKSTEPD="$PWD/$1"
LOCKSTEP="$PWD/$2"
TRAINER="$PWD/$3"
shift 3
T="${TEST_TMPDIR:-$(mktemp -d)}/e2e"
rm -rf "$T"
mkdir -p "$T/out"
# Every worker of this test gets this in its argv, so orphans are found by
# it (the trainer ignores its arguments).
MARKER="--e2e-marker=$T"
DAEMON_PIDS=()
# Command prefixes, e.g. (ip netns exec NS), for the next daemon and the CLI.
DAEMON_PREFIX=()
CLI_PREFIX=()
LEASE_S="${LEASE_S:-6}"
HB_S="${HB_S:-0.3}"
# The job environment daemons permit beyond the engine's own (the test
# trainer's knobs); empty: the engine's only.
ALLOWED_ENV='TRAINER_*'

LOG_TAG=e2e
source "$(dirname "${BASH_SOURCE[0]}")/waits.sh"

# expect_usage WANT CMD...: CMD exits 2 (bad usage) and its stderr says WANT.
expect_usage() {
  local want=$1; shift
  local rc=0 err
  err=$("$@" 2>&1 >/dev/null) || rc=$?
  [ "$rc" = 2 ] || fail "$* exited $rc, not 2: $err"
  grep -qF -- "$want" <<<"$err" || fail "$*: error does not say '$want': $err"
}

# no_job_uids [flags]: prints --job-uids=off for a root daemon given neither
# --job-uids nor --run-as. A root lockstepd gives each job a uid of its own
# by default, and that uid cannot reach Bazel's runfiles (under /root, 0700)
# nor the test's files. DEFAULT_JOB_UIDS=1 keeps the default:
# job_isolation_test, with the trainer copied where every uid may run it.
no_job_uids() {
  [ "$(id -u)" = 0 ] && [ -z "${DEFAULT_JOB_UIDS:-}" ] || return 0
  local a
  for a in "$@"; do case "$a" in --job-uids*|--run-as*) return 0 ;; esac; done
  echo --job-uids=off
}

# start_daemon NAME [lockstepd flags...]: starts a daemon with state dir
# $T/NAME, waits until it is SERVING (address file written), sets
# ADDR_<NAME> and PID_<NAME>.
start_daemon() {
  local name=$1; shift
  rm -f "$T/$name.addr"
  ${DAEMON_PREFIX[@]+"${DAEMON_PREFIX[@]}"} "$LOCKSTEPD" --state-dir "$T/$name" --address-file "$T/$name.addr" --node-id "$name" \
    --lease-s "$LEASE_S" --heartbeat-interval-s "$HB_S" --restart-backoff-s 0.2 \
    --max-restart-backoff-s 1 --shutdown-grace-s 2 ${ALLOWED_ENV:+--allowed-env "$ALLOWED_ENV"} \
    $(no_job_uids "$@") "$@" >>"$T/$name.log" 2>&1 &
  local pid=$!
  DAEMON_PIDS+=("$pid")
  eval "PID_$name=$pid"
  wait_for 30 test -s "$T/$name.addr" || fail "daemon $name did not become ready"
  eval "ADDR_$name=$(cat "$T/$name.addr")"
  log "daemon $name pid $pid at $(cat "$T/$name.addr")"
}

# cluster_tls HOST...: makes a cluster's certificates in $T/certs with
# `lockstep certs` (sets CERTS) and points the CLI at client.pem.
# node_tls HOST: lockstepd's mutual TLS flags for HOST, its workers given
# worker.pem (clientAuth only), as deploy/README.md recommends.
cluster_tls() {
  CERTS="$T/certs"
  "$LOCKSTEP" certs --out "$CERTS" --hosts "$(IFS=,; echo "$*")" > /dev/null || fail "lockstep certs failed"
  export LOCKSTEP_TLS_CA="$CERTS/ca.pem" LOCKSTEP_TLS_CERT="$CERTS/client.pem" \
    LOCKSTEP_TLS_KEY="$CERTS/client.key"
}
node_tls() {
  echo --tls-ca "$CERTS/ca.pem" --tls-cert "$CERTS/$1.pem" --tls-key "$CERTS/$1.key" \
    --tls-worker-cert "$CERTS/worker.pem" --tls-worker-key "$CERTS/worker.key"
}

# start_coordinator [flags]: a coordinator daemon named "coord"; sets
# COORD and TOKEN for the CLI.
start_coordinator() {
  start_daemon coord --coordinator --listen 127.0.0.1:0 "$@"
  COORD="$ADDR_coord"
  TOKEN="$T/coord/token"
}

# start_agent NAME [flags]: an agent-only daemon registering with $COORD
# with the coordinator's agent token (the agent role: register and
# heartbeat only; daemon/roles.h), not the admin token in $TOKEN.
start_agent() {
  local name=$1; shift
  start_daemon "$name" --listen 127.0.0.1:0 --coordinator-address "$COORD" \
    --token-file "$(dirname "$TOKEN")/agent.token" "$@"
}

ls_cli() { ${CLI_PREFIX[@]+"${CLI_PREFIX[@]}"} "$LOCKSTEP" --coordinator "$COORD" --token-file "$TOKEN" "$@"; }

# submit [lockstep submit flags]: submits the test trainer, prints the job id.
submit() {
  ls_cli submit --detach --json "$@" --env TRAINER_OUT_DIR="$T/out" -- "$TRAINER" "$MARKER" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])'
}

# job_field JOB EXPR: evaluates a Python expression over the job's JSON (j).
job_field() {
  ls_cli status --json "$1" | python3 -c "import json,sys; j=json.load(sys.stdin); print($2)"
}
# field_is JOB EXPR VALUE: the job's EXPR (see job_field) prints VALUE now.
# Use it inside wait_for (a $(...) argument would be evaluated only once).
field_is() { [ "$(job_field "$1" "$2")" = "$3" ]; }
job_state() { job_field "$1" 'j["state"]'; }
state_is() { [ "$(job_state "$1")" = "$2" ]; }

# wait_state JOB STATE SECONDS
wait_state() {
  wait_for "$3" state_is "$1" "$2" || fail "job $1 did not reach $2 within $3 s (now $(job_state "$1"))"
  log "job $1 is $2"
}

# Workers of this test: processes whose working dir is a job dir under $T
# (the agents' default working dir), plus any with $MARKER in their argv.
worker_pids() {
  {
    find /proc -mindepth 2 -maxdepth 2 -name cwd -lname "$T/*/jobs/*" 2>/dev/null | cut -d/ -f3
    pgrep -f -- "$MARKER" || true
  } | sort -u
}
no_workers() { [ -z "$(worker_pids)" ]; }
# exited PID: the process is gone or a zombie (exited, not yet reaped: a
# child of this shell until `wait`, or of a frozen agent). A thread group
# leader shows Z as soon as its own thread ends, while the process's other
# threads may still run (it is not reapable yet): a whole zombie has one
# task left.
exited() {
  [ ! -e "/proc/$1" ] && return 0
  [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ] &&
    [ "$(ls "/proc/$1/task" 2>/dev/null | wc -l)" -le 1 ]
}

# The engine's shared memory (ddp/shm_communicator.cc) is a memfd named
# "lockstep-shm": never a name in /dev/shm, so a segment exists exactly as
# long as a process holds an fd or a mapping of it, and that is what these
# look for. test_pids: this test's processes (the descendants of its shell:
# daemons, CLIs, workers) plus workers that outlived their parent.
test_pids() {
  {
    ps -e -o pid=,ppid= | awk -v root=$$ '
      { parent[$1] = $2 }
      END { for (p in parent) { q = p; while (q > 1) { if (q == root) { print p; break } q = parent[q] } } }'
    worker_pids
  } | sort -un
}
# shm_holders: "pid (command)" of each process of this test holding a
# lockstep-shm segment, one per line.
shm_holders() {
  local pid
  for pid in $(test_pids); do
    if grep -q 'memfd:lockstep-shm' <<<"$(ls -l "/proc/$pid/fd" 2>/dev/null)" ||
      grep -qs 'memfd:lockstep-shm' "/proc/$pid/maps"; then
      echo "$pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-120))"
    fi
  done
}
no_shm_holders() { [ -z "$(shm_holders)" ]; }
# expect_shm_holders BACKEND N: while a job runs, over shm at least N of
# this test's processes (its workers) hold a segment; over Gloo none does.
# Shows that shm_holders sees segments before a test counts on its "none".
expect_shm_holders() {
  local holders
  holders=$(shm_holders)
  if [ "$1" = shm ]; then
    [ "$(grep -c . <<<"$holders")" -ge "$2" ] || fail "$2 workers should hold a shm segment, found: [$holders]"
  else
    [ -z "$holders" ] || fail "a $1 job holds shm segments: $holders"
  fi
}
# describe_workers: the workers left, one per line (pid, state, age, cwd,
# command), for a failure message.
describe_workers() {
  local pid
  for pid in $(worker_pids); do
    echo "pid $pid $(ps -o stat=,etime= -p "$pid" 2>/dev/null) cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null) $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)"
  done
}

# The invariants every fault test ends with.
check_invariants() {
  local job=$1 max_restarts=$2
  wait_for 15 no_workers || fail "orphan workers left: $(describe_workers)"
  if grep -rl DUPLICATE "$T"/*/jobs >/dev/null 2>&1; then fail "a rank ran twice in one round"; fi
  local restarts
  restarts=$(job_field "$job" 'j.get("restart_count", 0)')
  (( restarts <= max_restarts )) || fail "restart count $restarts exceeds the budget $max_restarts"
  grep -q "$job" <<<"$(ls_cli list --json)" || fail "job $job lost from the list"
}

# two_hosts TAG SUBNET: two network namespaces joined by a veth pair, host a
# at SUBNET.1 and host b at SUBNET.2 (SUBNET like 10.213.7); sets NSA, NSB,
# VA, VB and removes them at exit. Exits 0 with SKIP where namespaces are
# not permitted.
two_hosts() {
  local tag=$1 net=$2
  NSA="${tag}a$$"; NSB="${tag}b$$"; VA="${tag}va$$"; VB="${tag}vb$$"
  EXTRA_CLEANUP='ip netns del "$NSA" 2>/dev/null || true; ip netns del "$NSB" 2>/dev/null || true'
  if ! ip netns add "$NSA" 2>/dev/null; then
    echo "SKIP: cannot create network namespaces here (needs root and iproute2)"
    exit 0
  fi
  ip netns add "$NSB"
  ip link add "$VA" type veth peer name "$VB"
  ip link set "$VA" netns "$NSA"
  ip link set "$VB" netns "$NSB"
  ip -n "$NSA" addr add "$net.1/24" dev "$VA"
  ip -n "$NSB" addr add "$net.2/24" dev "$VB"
  for ns in "$NSA" "$NSB"; do ip -n "$ns" link set lo up; done
  ip -n "$NSA" link set "$VA" up
  ip -n "$NSB" link set "$VB" up
  log "hosts $NSA ($net.1) and $NSB ($net.2)"
}

# backend_args BACKEND: sets env_args (submit flags) and communicator (the
# name rank 0 logs) for the DDP backends the e2e tests run: gloo, or shm
# (shared memory inside each node, Gloo between nodes: shm+gloo).
backend_args() {
  case "$1" in
    gloo) env_args=(); communicator=gloo ;;
    shm) env_args=(--env LOCKSTEP_BACKEND=shm); communicator=shm+gloo ;;
    *) fail "unknown backend '$1' (gloo or shm)" ;;
  esac
}

cleanup() {
  local pid
  for pid in "${DAEMON_PIDS[@]}"; do kill -CONT "$pid" 2>/dev/null || true; kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${DAEMON_PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  # Workers of this test only, by pid (found through the marker).
  for pid in $(worker_pids); do kill -KILL "$pid" 2>/dev/null || true; done
}
EXTRA_CLEANUP=":"
trap 'cleanup; eval "$EXTRA_CLEANUP"' EXIT
