#!/usr/bin/env bash
# //deploy:k8s_netns_test: the rendered manifests' containers, run as a
# container runtime would run them, in network namespaces standing in for
# pods on a bridge (10.233.5.0/24 inside namespaces this test makes; nothing
# is sent anywhere else):
#   node       the bridge, 10.233.5.1: the nodes and their kubelets (probes)
#   coord      StatefulSet/lockstep-coordinator, 10.233.5.10
#   agent-a/b  DaemonSet/lockstep-agent on nodes node-a/node-b, .11/.12
#   cli        Pod/lockstep-cli (deploy/k8s/cli-pod.yaml), .13
#   outsider   a pod of no Lockstep label, .14
# Each container: its exact command and args ($(VAR) and downward-API values
# filled in), env, user, groups, capabilities, no_new_privs, read-only root
# and volumes (deploy/k8s/test/pods.py run); /etc/hosts names the Service
# as cluster DNS would; the NetworkPolicies as iptables rules in each pod.
# Programs under /usr are the Bazel-built ones, copied to an image dir.
# Checks: the init containers' work (0600 copies of the admin and agent
# tokens), separate credentials (the agent pods hold the agent token only,
# which is refused SubmitJob), the gRPC probes from the node (agents
# NOT_SERVING until their coordinator is up), a 2-node DDP job of the
# example trainer submitted with `kubectl exec`-style CLI calls: SUCCEEDED,
# identical parameters on both ranks, each rank on its own agent pod bound
# to its pod's address, as a uid of the manifest's --job-uids, no /dev/shm
# segment or worker left; the CLI pod reads logs; the outsider reaches
# neither port. Needs root (skips otherwise).
# Usage: netns_test.sh LOCKSTEPD LOCKSTEP TRAIN
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
BIN_LOCKSTEPD="$PWD/$1"
BIN_LOCKSTEP="$PWD/$2"
BIN_TRAIN="$PWD/$3"
KUBECTL="${KUBECTL:-kubectl}"
PY=/usr/bin/python3
PODS="$PWD/deploy/k8s/test/pods.py"
T="${TEST_TMPDIR:-$(mktemp -d)}/k8s_netns"
rm -rf "$T" && mkdir -p "$T"
NET=10.233.5

LOG_TAG=k8s_netns
source tests/e2e/waits.sh

if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root (network, mount and PID namespaces)"; exit 0; fi
command -v "$KUBECTL" >/dev/null || { echo "SKIP: no kubectl (tools/setup.sh installs kubernetes-client)"; exit 0; }
for tool in ip unshare nsenter setpriv iptables-restore; do
  command -v "$tool" >/dev/null || { echo "SKIP: no $tool"; exit 0; }
done
"$PY" -c 'import yaml, grpc' 2>/dev/null || fail "$PY lacks yaml or grpc: run tools/setup.sh"

TAG="k8$$"
NS_NODE="${TAG}n"
POD_NAMES=(coord agent-a agent-b cli outsider)
declare -A NETNS=([coord]="${TAG}c" [agent-a]="${TAG}a" [agent-b]="${TAG}b" [cli]="${TAG}l" [outsider]="${TAG}o")
declare -A IP=([coord]="$NET.10" [agent-a]="$NET.11" [agent-b]="$NET.12" [cli]="$NET.13" [outsider]="$NET.14")
declare -A WORKLOAD=([coord]=StatefulSet/lockstep-coordinator [agent-a]=DaemonSet/lockstep-agent
                     [agent-b]=DaemonSet/lockstep-agent [cli]=Pod/lockstep-cli)
declare -A NODE=([coord]=node-c [agent-a]=node-a [agent-b]=node-b [cli]=node-c)
declare -A POD_NAME=([coord]=lockstep-coordinator-0 [agent-a]=lockstep-agent-a1b2c
                     [agent-b]=lockstep-agent-d3e4f [cli]=lockstep-cli)
declare -A UNSHARE_PID=()
# The CLI pod's `sleep` ignores SIGTERM as PID 1: it is killed at once, as
# after its grace period.
declare -A GRACE=([cli]=0)
# Volumes and the image live under /tmp, reachable by the pods' non-root
# uids (the test's own tmp dir is under /root, 0700).
W=$(mktemp -d /tmp/lockstep-k8s.XXXXXX)
chmod 0755 "$W"

pid1() { pgrep -P "${UNSHARE_PID[$1]}" | head -n 1; }
# stop_pod POD [GRACE_S]: SIGTERM to its PID 1, SIGKILL after the grace
# period (default 15 s), as the kubelet stops a container. The kernel kills
# the rest of the pod's PID namespace with its PID 1.
stop_pod() {
  local upid=${UNSHARE_PID[$1]:-} grace=${2:-${GRACE[$1]:-15}} p
  [ -n "$upid" ] || return 0
  p=$(pgrep -P "$upid" | head -n 1 || true)
  if [ -n "$p" ]; then kill -TERM "$p" 2>/dev/null || true; fi
  for _ in $(seq $((grace * 10))); do kill -0 "$upid" 2>/dev/null || break; sleep 0.1; done
  if [ -n "$p" ]; then kill -KILL "$p" 2>/dev/null || true; fi
  kill -KILL "$upid" 2>/dev/null || true
  wait "$upid" 2>/dev/null || true
  unset "UNSHARE_PID[$1]"
}
cleanup() {
  local p
  for p in "${!UNSHARE_PID[@]}"; do stop_pod "$p"; done
  for p in "${POD_NAMES[@]}"; do
    ip netns del "${NETNS[$p]}" 2>/dev/null || true
    rm -rf "/etc/netns/${NETNS[$p]}"
  done
  ip netns del "$NS_NODE" 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT

# The rendered manifests: the base and the CLI pod.
# (A copy: kustomize does not take a symlinked kustomization.yaml.)
cp -rL deploy/k8s "$T/k8s"
"$KUBECTL" kustomize "$T/k8s" >"$T/rendered.yaml" 2>"$T/kustomize.err" ||
  { cat "$T/kustomize.err"; fail "kubectl kustomize deploy/k8s"; }
{ echo "---"; cat deploy/k8s/cli-pod.yaml; } >>"$T/rendered.yaml"
R="$T/rendered.yaml"

# The image: what tools/container.sh puts at these paths, Bazel-built.
install -D -m 0755 "$BIN_LOCKSTEPD" "$W/image/usr/bin/lockstepd"
install -D -m 0755 "$BIN_LOCKSTEP" "$W/image/usr/bin/lockstep"
install -D -m 0755 "$BIN_TRAIN" "$W/image/usr/lib/lockstep/examples/train"
IMG="$W/image"
# The Secret lockstep-token: key token (admin) in token-data, key
# agent-token in token-data.agent-token (pods.py volumes).
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/token-data"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/token-data.agent-token"

# Network: a bridge in the node namespace, a veth into each pod.
if ! ip netns add "$NS_NODE" 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here"; exit 0
fi
ip -n "$NS_NODE" link add br0 type bridge
ip -n "$NS_NODE" addr add "$NET.1/24" dev br0
ip -n "$NS_NODE" link set br0 up
ip -n "$NS_NODE" link set lo up
for p in "${POD_NAMES[@]}"; do
  ns=${NETNS[$p]}
  ip netns add "$ns"
  ip -n "$NS_NODE" link add "v$ns" type veth peer name eth0 netns "$ns"
  ip -n "$NS_NODE" link set "v$ns" master br0 up
  ip -n "$ns" addr add "${IP[$p]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  # What cluster DNS answers for the headless Service (ip netns exec binds
  # this over /etc/hosts).
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n%s %s\n%s lockstep-coordinator lockstep-coordinator.lockstep.svc.cluster.local lockstep-coordinator-0.lockstep-coordinator.lockstep.svc.cluster.local\n' \
    "${IP[$p]}" "${POD_NAME[$p]:-outsider}" "${IP[coord]}" >"/etc/netns/$ns/hosts"
done
log "pods on $NET.0/24: coord ${IP[coord]}, agent-a ${IP[agent-a]}, agent-b ${IP[agent-b]}, cli ${IP[cli]}, outsider ${IP[outsider]}"
netpol_args=()
for p in coord agent-a agent-b cli; do netpol_args+=("${NETNS[$p]},${IP[$p]},$NET.1,${WORKLOAD[$p]}"); done
"$PY" "$PODS" netpol "$R" "${netpol_args[@]}" >&2 || fail "applying the NetworkPolicies"

# run_container POD CONTAINER: runs it to completion (an init container).
run_container() {
  local cmd=()
  mapfile -d '' cmd < <("$PY" "$PODS" run "$R" "${WORKLOAD[$1]}" "$2" "$W/$1" "${NETNS[$1]}" \
    "${IP[$1]}" "${NODE[$1]}" "${POD_NAME[$1]}" "$IMG")
  [ ${#cmd[@]} -gt 0 ] || fail "no command line for $1/$2"
  "${cmd[@]}" >>"$T/$1-$2.log" 2>&1 || fail "init container $2 of $1 failed"
  log "$1: init container $2 done"
}
# start_pod POD: its volumes, its init containers in order, its container.
start_pod() {
  local p=$1 c cmd=()
  mkdir -p "$W/$p"
  chmod 0755 "$W/$p"
  "$PY" "$PODS" volumes "$R" "${WORKLOAD[$p]}" "$W/$p" "$W/token-data" || fail "volumes of $p"
  for c in $(init_containers "$p"); do run_container "$p" "$c"; done
  c=$(main_container "$p")
  mapfile -d '' cmd < <("$PY" "$PODS" run "$R" "${WORKLOAD[$p]}" "$c" "$W/$p" "${NETNS[$p]}" \
    "${IP[$p]}" "${NODE[$p]}" "${POD_NAME[$p]}" "$IMG")
  printf '%q ' "${cmd[@]}" >"$T/$p.cmdline"
  "${cmd[@]}" >>"$T/$p.log" 2>&1 &
  UNSHARE_PID[$p]=$!
  wait_for 10 pid1 "$p" || fail "pod $p did not start"
  log "pod $p: container $c is pid $(pid1 "$p") (host), log $T/$p.log"
  # The pod's other containers (sidecars), each with its own PID 1, as
  # containers of a pod are by default; tracked as POD:CONTAINER.
  for c in $(containers_of "$p" containers | cut -s -d' ' -f2-); do
    mapfile -d '' cmd < <("$PY" "$PODS" run "$R" "${WORKLOAD[$p]}" "$c" "$W/$p" "${NETNS[$p]}" \
      "${IP[$p]}" "${NODE[$p]}" "${POD_NAME[$p]}" "$IMG")
    "${cmd[@]}" >>"$T/$p-$c.log" 2>&1 &
    UNSHARE_PID[$p:$c]=$!
    wait_for 10 pid1 "$p:$c" || fail "container $c of pod $p did not start"
    log "pod $p: container $c is pid $(pid1 "$p:$c") (host), log $T/$p-$c.log"
  done
}
containers_of() {  # containers_of POD initContainers|containers
  "$PY" - "$R" "${WORKLOAD[$1]}" "$2" <<'PY'
import sys, yaml
kind, name = sys.argv[2].split("/")
for o in yaml.safe_load_all(open(sys.argv[1])):
    if o and o["kind"] == kind and o["metadata"]["name"] == name:
        spec = o["spec"] if kind == "Pod" else o["spec"]["template"]["spec"]
        print(" ".join(c["name"] for c in spec.get(sys.argv[3], [])))
PY
}
init_containers() { containers_of "$1" initContainers; }
main_container() { containers_of "$1" containers | cut -d' ' -f1; }
# kexec POD ARGV...: `kubectl exec` into the pod's container.
kexec() {
  local p=$1 cmd=(); shift
  mapfile -d '' cmd < <("$PY" "$PODS" exec "$R" "${WORKLOAD[$p]}" "$(main_container "$p")" "$W/$p" \
    "${IP[$p]}" "${NODE[$p]}" "${POD_NAME[$p]}" "$IMG" "$(pid1 "$p")" -- "$@")
  "${cmd[@]}"
}
# probe POD: the container's gRPC probes, as the kubelet makes them from the
# node; prints the answer (all probes of the container agree or it fails).
probe() {
  local p=$1 kind port service answer out=""
  while read -r kind port service; do
    answer=$(ip netns exec "$NS_NODE" "$PY" "$PODS" health "${IP[$p]}:$port" $service)
    out="$out $kind=$answer"
  done < <("$PY" "$PODS" probes "$R" "${WORKLOAD[$p]}" "$(main_container "$p")")
  echo "$out"
}
probes_say() { [ "$(probe "$1")" = " startupProbe=$2 readinessProbe=$2 livenessProbe=$2" ]; }

# 1. Agents first: their probes answer NOT_SERVING until they have
#    registered with a coordinator.
start_pod agent-a
start_pod agent-b
[ "$(stat -c %a "$W/agent-a/vol/state")" = 711 ] || fail "the state-dir init container did not chmod 0711"
for p in agent-a agent-b; do
  wait_for 30 probes_say "$p" NOT_SERVING || fail "$p's probes: $(probe "$p") (want NOT_SERVING before the coordinator)"
done
log "agents up, probes NOT_SERVING (no coordinator yet)"

# 2. The coordinator: the Secret's file as the kubelet makes it with fsGroup
#    (group-readable) is what its init container copies 0600.
start_pod coord
tok="$W/coord/vol/token/token"
[ "$(stat -c '%a %u' "$tok")" = "600 10001" ] || fail "token copy is $(stat -c '%a %u' "$tok"), want 600 10001"
[ "$(stat -L -c '%a %g' "$W/coord/vol/token-secret/token")" = "440 10001" ] ||
  fail "the emulated Secret file should be 0440 group 10001 (fsGroup)"
atok="$W/coord/vol/token/agent-token"
[ "$(stat -c '%a %u' "$atok")" = "600 10001" ] || fail "agent token copy is $(stat -c '%a %u' "$atok"), want 600 10001"
cmp -s "$atok" "$W/token-data.agent-token" || fail "the coordinator's agent token is not the Secret's agent-token"
# Each agent holds the agent token alone: not the admin token.
for p in agent-a agent-b; do
  cmp -s "$W/$p/vol/token/token" "$W/token-data.agent-token" || fail "$p does not hold the Secret's agent-token"
done
for p in coord agent-a agent-b; do
  wait_for 30 probes_say "$p" SERVING || fail "$p's probes: $(probe "$p") (want SERVING)"
done
log "probes SERVING: coord $(probe coord); agent-a $(probe agent-a)"
# Why the copy: the Secret's file itself, read as the pod's uid and
# fsGroup, is refused (LoadToken, which the daemon and the CLI share).
if out=$(ip netns exec "${NETNS[coord]}" setpriv --reuid=10001 --regid=10001 --groups=10001 -- \
    "$IMG/usr/bin/lockstep" --token-file "$W/coord/vol/token-secret/token" nodes 2>&1); then
  fail "the CLI accepted a group-readable token file"
fi
grep -q "readable by group or others" <<<"$out" || fail "unexpected refusal: $out"
# What an agent node's credential can do: register and heartbeat (the agents
# are up, above), not submit.
cp "$atok" "$T/agent-token-copy"
if out=$(ip netns exec "${NETNS[coord]}" "$IMG/usr/bin/lockstep" --coordinator 127.0.0.1:7070 \
    --token-file "$T/agent-token-copy" submit --detach -- /bin/true 2>&1); then
  fail "the agent token submitted a job: $out"
fi
grep -q "PERMISSION_DENIED: .*an agent token cannot SubmitJob (needs admin)" <<<"$out" ||
  fail "the agent token's submit was not refused by role: $out"
# Not root: no capabilities.
coord_pid=$(pid1 coord)
grep -q '^Uid:[[:space:]]*10001' "/proc/$coord_pid/status" || fail "the coordinator does not run as 10001"
grep -q '^CapEff:[[:space:]]*0000000000000000' "/proc/$coord_pid/status" || fail "the coordinator has capabilities"
grep -q '^NoNewPrivs:[[:space:]]*1' "/proc/$coord_pid/status" || fail "no no_new_privs"

# The agents: root with the manifest's capabilities and no more.
want_caps=$("$PY" "$PODS" caps "$R" DaemonSet/lockstep-agent lockstepd)
for p in agent-a agent-b; do
  st="/proc/$(pid1 "$p")/status"
  grep -q "^CapEff:[[:space:]]*$want_caps" "$st" && grep -q "^CapBnd:[[:space:]]*$want_caps" "$st" ||
    fail "$p: capabilities $(grep -E '^Cap(Eff|Bnd)' "$st" | tr '\n' ' ') are not the manifest's $want_caps"
  grep -q '^NoNewPrivs:[[:space:]]*1' "$st" || fail "$p: no no_new_privs"
done
log "coordinator: uid 10001, no capability; agents: root with capabilities $want_caps only"

# 3. Nodes, as `kubectl exec lockstep-coordinator-0 -- lockstep nodes` shows them.
nodes_ok() {
  kexec coord "$IMG/usr/bin/lockstep" nodes >"$T/nodes.txt" 2>&1 &&
    grep -q "^node-a .*${IP[agent-a]}:7071" "$T/nodes.txt" && grep -q "^node-b .*${IP[agent-b]}:7071" "$T/nodes.txt"
}
wait_for 30 nodes_ok || fail "lockstep nodes: $(cat "$T/nodes.txt")"
log "nodes: $(tr '\n' '|' <"$T/nodes.txt")"

# 4. A DDP job over both agent pods.
out=$(kexec coord "$IMG/usr/bin/lockstep" submit --nodes 2 --nproc-per-node 1 --max-restarts 0 --wait -- \
  "$IMG/usr/lib/lockstep/examples/train" --model mlp_small --steps 20 --timeout-s 30 2>&1) ||
  fail "the job did not succeed: $out"
job=$(echo "$out" | sed -n 's/^submitted job //p')
[ -n "$job" ] || fail "no job id in: $out"
log "job $job succeeded"
kexec coord "$IMG/usr/bin/lockstep" status --json "$job" >"$T/status.json"
"$PY" - "$T/status.json" <<'PY' || fail "job status: $(cat "$T/status.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["state"].replace("JOB_STATE_", "") == "SUCCEEDED", j["state"]
assert sorted(j["node_ids"]) == ["node-a", "node-b"], j["node_ids"]
PY
# Each rank on its own agent pod, bound to that pod's address.
for p in agent-a agent-b; do
  f=$(ls "$W/$p/vol/state/jobs/$job"/rank-*.stderr 2>/dev/null) || fail "no rank ran on $p"
  [ "$(echo "$f" | wc -l)" = 1 ] || fail "$p ran $(echo "$f" | wc -l) ranks"
  grep -q "data plane ${IP[$p]} from LOCKSTEP_NODE_ADDR" "$f" ||
    fail "the worker on $p did not bind its pod's address: $(grep -h 'data plane' "$f")"
done
log "workers bound ${IP[agent-a]} and ${IP[agent-b]}"
# Identical parameters, read as `kubectl exec lockstep-cli -- lockstep logs`
# (the CLI pod reaches the coordinator and both agents).
start_pod cli
[ "$(stat -c '%a %u' "$W/cli/vol/token/token")" = "600 10001" ] || fail "the CLI pod's token copy"
sums=$(for r in 0 1; do
  kexec cli "$IMG/usr/bin/lockstep" logs "$job" --rank "$r" | sed -n 's/.*"checksum":\([^,]*\),"abs_checksum":\([^,]*\),.*/\1 \2/p'
done)
[ "$(echo "$sums" | grep -c .)" = 2 ] || fail "expected 2 checksum lines, got: $sums"
[ "$(echo "$sums" | sort -u | wc -l)" = 1 ] || fail "ranks ended with different parameters: $sums"
log "both ranks: checksum $(echo "$sums" | head -n 1)"
# The workers' uid: from the manifest's --job-uids range.
range=$(grep -o -- '--job-uids=[0-9]*-[0-9]*' "$R" | head -n 1 | cut -d= -f2)
for p in agent-a agent-b; do
  uid=$(sed -n "s/.*job=$job .*workers run as uid \([0-9]*\) (--job-uids).*/\1/p" "$T/$p.log" | head -n 1)
  [ -n "$uid" ] && (( uid >= ${range%-*} && uid <= ${range#*-} )) ||
    fail "$p: workers' uid '$uid' is not from --job-uids $range"
done
log "workers ran as uid $uid (--job-uids $range)"
# Nothing left: no worker in either agent pod (its PID 1 alone, with the
# fence guard it forked: daemon/fence_guard.h), no segment in its /dev/shm.
pod_alone() {
  local ns; ns=$(readlink "/proc/$(pid1 "$1")/ns/pid")
  for d in /proc/[0-9]*; do
    [ "${d#/proc/}" = "$(pid1 "$1")" ] && continue
    [ "$(cat "$d/comm" 2>/dev/null)" = lockstepd-fence ] &&
      [ "$(awk '{print $4}' "$d/stat" 2>/dev/null)" = "$(pid1 "$1")" ] && continue
    [ "$(readlink "$d/ns/pid" 2>/dev/null)" = "$ns" ] && return 1
  done
  return 0
}
for p in agent-a agent-b; do
  wait_for 15 pod_alone "$p" || fail "processes left in $p"
  left=$(nsenter -t "$(pid1 "$p")" -m ls -A /dev/shm)
  [ -z "$left" ] || fail "$p: left in /dev/shm: $left"
done
log "no worker and no /dev/shm segment left in the agent pods"

# A job's workers (other uids) cannot read the agents' token Secret.
out=$(kexec coord "$IMG/usr/bin/lockstep" submit --nodes 2 --nproc-per-node 1 --max-restarts 0 --wait -- \
  /bin/sh -c "cat $W/agent-*/vol/token/token; exit 0" 2>&1) || fail "the token-reading job: $out"
job2=$(echo "$out" | sed -n 's/^submitted job //p')
for r in 0 1; do
  kexec cli "$IMG/usr/bin/lockstep" logs "$job2" --rank "$r" --stderr >"$T/job2-$r.err"
  kexec cli "$IMG/usr/bin/lockstep" logs "$job2" --rank "$r" >"$T/job2-$r.out"
  grep -q "Permission denied" "$T/job2-$r.err" || fail "rank $r was not denied the token: $(cat "$T/job2-$r.err")"
  if grep -qF "$(cat "$W/token-data.agent-token")" "$T/job2-$r.out"; then fail "rank $r read the token"; fi
done
log "job $job2's workers were denied the token file"

# 5. Rotating both tokens by editing the Secret, no pod restarted (README.md,
#    Rotating the tokens): the kubelet updates each pod's Secret volume,
#    the coordinator's token-sync container renews its 0600 copies, and
#    every lockstepd re-reads a changed token file. Three edits: (1) the new
#    admin token first, the old one after it; the agent token gets the new
#    one admitted after the old; (2) the admin token alone; the new agent
#    token first (the agents present it); (3) the new agent token alone.
old_admin=$(cat "$W/token-data") old_agent=$(cat "$W/token-data.agent-token")
new_admin=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
new_agent=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
rotated_at=$(date +%s)
declare -A agent_lines=()
for p in agent-a agent-b; do agent_lines[$p]=$(wc -l <"$T/$p.log"); done
# edit_secret ADMIN AGENT: the Secret's two keys (\n between lines), every
# pod mounting it updated as the kubelet does; waits for the coordinator's
# sidecar to renew its copies and, when the agent key changed, for both
# agents to re-read their token.
edit_secret() {
  local p before=()
  for p in agent-a agent-b; do before+=("$(grep -c "tokens re-read" "$T/$p.log" || true)"); done
  local agent_changed=0
  [ "$(printf "$2")" = "$(cat "$W/token-data.agent-token")" ] || agent_changed=1
  printf "$1" >"$W/token-data"
  printf "$2" >"$W/token-data.agent-token"
  for p in coord agent-a agent-b; do
    "$PY" "$PODS" update-secrets "$R" "${WORKLOAD[$p]}" "$W/$p" "$W/token-data" || fail "updating $p's Secret volume"
  done
  copies_follow() {
    cmp -s "$W/coord/vol/token/token" "$W/token-data" &&
      cmp -s "$W/coord/vol/token/agent-token" "$W/token-data.agent-token"
  }
  wait_for 15 copies_follow || fail "token-sync did not renew the coordinator's copies: $(tail -n 3 "$T/coord-token-sync.log")"
  [ "$(stat -c '%a %u' "$W/coord/vol/token/token") $(stat -c '%a %u' "$W/coord/vol/token/agent-token")" = "600 10001 600 10001" ] ||
    fail "token-sync's copies are not 0600 and the coordinator's"
  if ((agent_changed)); then
    local i=0
    for p in agent-a agent-b; do
      wait_for 15 bash -c "(( \$(grep -c 'tokens re-read' '$T/$p.log') > ${before[$i]} ))" ||
        fail "$p did not re-read its token: $(tail -n 3 "$T/$p.log")"
      i=$((i + 1))
    done
  fi
}
# as_token TOKEN ARGV...: the CLI in the coordinator's pod with that token.
as_token() {
  local f="$T/cli-token"
  (umask 077; echo "$1" >"$f")
  shift
  ip netns exec "${NETNS[coord]}" "$IMG/usr/bin/lockstep" --coordinator 127.0.0.1:7070 --token-file "$f" "$@" 2>&1
}
admitted() { as_token "$1" nodes >/dev/null; }
refused() { grep -q UNAUTHENTICATED <<<"$(as_token "$1" nodes)"; }
# An agent token is admitted as an agent's: refused SubmitJob by role.
admitted_agent() { grep -q "an agent token cannot SubmitJob" <<<"$(as_token "$1" submit --detach -- /bin/true)"; }
refused_agent() { grep -q UNAUTHENTICATED <<<"$(as_token "$1" submit --detach -- /bin/true)"; }
# lockstepd re-reads a changed file within 5 s.
edit_secret "$new_admin\n$old_admin" "$old_agent\n$new_agent"
wait_for 10 admitted "$new_admin" || fail "the new admin token is not admitted after edit 1"
wait_for 10 admitted_agent "$new_agent" || fail "the new agent token is not admitted after edit 1"
admitted "$old_admin" || fail "the old admin token was dropped at edit 1"
edit_secret "$new_admin" "$new_agent\n$old_agent"
wait_for 10 refused "$old_admin" || fail "the old admin token is still admitted after edit 2"
admitted "$new_admin" || fail "the new admin token was refused after edit 2"
edit_secret "$new_admin" "$new_agent"
wait_for 10 refused_agent "$old_agent" || fail "the old agent token is still admitted after edit 3"
# The container's own CLI (LOCKSTEP_TOKEN_FILE, the synced copy) follows.
kexec coord "$IMG/usr/bin/lockstep" nodes >"$T/nodes.txt" 2>&1 || fail "kubectl exec'd CLI after the rotation: $(cat "$T/nodes.txt")"
# The agents, on the new token alone, stayed registered throughout: no
# refused heartbeat, no new registration, both listed.
for p in agent-a agent-b; do
  cmp -s "$W/$p/vol/token/token" "$W/token-data.agent-token" || fail "$p's Secret volume was not updated"
  since=$(tail -n +$((agent_lines[$p] + 1)) "$T/$p.log")
  if grep -E "heartbeat failed|registering again|fenced|registered as node" <<<"$since"; then
    fail "$p lost its registration during the rotation (above)"
  fi
done
wait_for 10 nodes_ok || fail "lockstep nodes after the rotation: $(cat "$T/nodes.txt")"
grep -q "copied from the Secret" "$T/coord-token-sync.log" || fail "token-sync logged no copy"
log "tokens rotated through the Secret in $(( $(date +%s) - rotated_at )) s: old admin and agent tokens refused, agents registered throughout, no pod restarted"

# 6. NetworkPolicy: a pod without the labels reaches neither port; the node
#    (probes) and the CLI pod do (above).
reach() {  # reach POD ADDR PORT: connects within 1 s
  ip netns exec "${NETNS[$1]}" "$PY" -c 'import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1).close()' "$2" "$3"
}
for target in "coord 7070" "agent-a 7071" "agent-b 7071"; do
  set -- $target
  if reach outsider "${IP[$1]}" "$2" 2>/dev/null; then fail "the outsider pod reached $1:$2"; fi
  reach cli "${IP[$1]}" "$2" || fail "the CLI pod cannot reach $1:$2"
done
log "outsider refused at coord:7070 and agents:7071; cli admitted"

# 7. Shutdown as the kubelet does it: SIGTERM to each container's PID 1.
for p in cli agent-a agent-b coord coord:token-sync; do stop_pod "$p"; done
for p in agent-a agent-b coord; do
  grep -q "I \[lockstepd\] .* stopped$" "$T/$p.log" || fail "$p did not stop cleanly on SIGTERM"
done
log "PASS"
