#!/usr/bin/env bash
# Real DDP (//examples:train) across two hosts: network namespaces joined by
# a veth pair, a coordinator+agent in one, an agent in the other, and no
# data-plane setting anywhere (no LOCKSTEP_GLOO_HOST): each worker binds its
# node's own address, handed over by its agent. Backend (5th argument):
#   gloo   Gloo between all four ranks;
#   shm    LOCKSTEP_BACKEND=shm: shared memory inside each host, Gloo
#          between the hosts' local rank 0s (shm+gloo).
#  1. 2 hosts x 2 ranks: SUCCEEDED, identical parameters on all 4 ranks.
#  2. --nodes 1:2: host b's link is cut mid-job; the job goes on on host a
#     alone; the link is restored and the job scales back to both hosts,
#     SUCCEEDED with identical parameters on the last round's 4 ranks.
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"
BACKEND="$5"
backend_args "$BACKEND"
unset LOCKSTEP_GLOO_HOST
NET="10.214.$(($$ % 250))"
two_hosts ld "$NET"

# Mutual TLS between the hosts (as netns_test): the workers' store and
# progress clients use it too; Gloo's data plane is not gRPC and stays plain.
cluster_tls "$NET.1" "$NET.2"

DAEMON_PREFIX=(ip netns exec "$NSA")
CLI_PREFIX=(ip netns exec "$NSA")
start_coordinator --listen "$NET.1:0" $(node_tls "$NET.1")
DAEMON_PREFIX=(ip netns exec "$NSB")
# The second host holds the coordinator's agent token (register and
# heartbeat only), as README.md tells a new host to.
start_daemon hostb --listen "$NET.2:0" --coordinator-address "$COORD" \
  --token-file "$(dirname "$TOKEN")/agent.token" $(node_tls "$NET.2")

# checksums JOB: the final checksum line of each rank's log, one per line.
checksums() {
  for r in 0 1 2 3; do
    ls_cli logs "$1" --rank "$r" | sed -n 's/.*"checksum":\([^,]*\),"abs_checksum":\([^,]*\),.*/\1 \2/p' | tail -n 1
  done
}
identical_on_four() {
  local sums; sums=$(checksums "$1")
  [ "$(echo "$sums" | grep -c .)" = 4 ] || fail "expected 4 checksum lines, got: $sums"
  [ "$(echo "$sums" | sort -u | wc -l)" = 1 ] || fail "ranks ended with different parameters: $sums"
}

log "1. two hosts x two ranks"
rc=0
out=$(CLI_PREFIX=(timeout 180 "${CLI_PREFIX[@]}"); ls_cli submit --nodes 2 --nproc-per-node 2 \
  --max-restarts 0 "${env_args[@]}" --wait -- "$TRAIN" --model mlp_small --steps 10 --timeout-s 30) ||
  rc=$?
job=$(echo "$out" | sed -n 's/^submitted job //p')
[ "$rc" = 0 ] || fail "job did not succeed: submit --wait exited $rc (124: still waiting after" \
  "180 s; job ${job:-not submitted}${job:+ is $(job_state "$job")}): $out"
for r in 2 3; do
  grep -q "connected $communicator communicator of 4 ranks.*data plane $NET.2 from LOCKSTEP_NODE_ADDR" \
    "$T/hostb/jobs/$job/rank-$r.stderr" ||
    fail "rank $r did not bind host b's address: $(grep connected "$T/hostb/jobs/$job/rank-$r.stderr")"
done
if [ "$BACKEND" = shm ]; then
  # Each rank's own share of every bucket (the half it reduces on its host)
  # was read from its gradients in place, not copied into bucket memory.
  for r in 0 1 2 3; do
    ls_cli logs "$job" --rank "$r" | grep '"step":' | tail -n 1 | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
share = s["bytes_read_in_place"] / s["bytes_reduced"]
sys.exit(0 if s["buckets_in_comm_memory"] == 1 and 0.45 < share < 0.55 else
         "rank %d read %d of %d bytes in place (buckets in comm memory: %d), want about half"
         % (s["rank"], s["bytes_read_in_place"], s["bytes_reduced"], s["buckets_in_comm_memory"]))
' || fail "rank $r's own share was not read in place across hosts"
  done
fi
grep -q "data plane $NET.1 from LOCKSTEP_NODE_ADDR" "$T/coord/jobs/$job/rank-0.stderr" ||
  fail "rank 0 did not bind host a's address"
identical_on_four "$job"
check_invariants "$job" 0

log "2. --nodes 1:2, host b cut off mid-job and restored"
job=$(ls_cli submit --detach --json --nodes 1:2 --nproc-per-node 2 --max-restarts 2 --last-call-s 0.5 \
  "${env_args[@]}" -- "$TRAIN" --model mlp_small --steps 150 --step-delay-ms 50 --timeout-s 8 |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$job" RUNNING 60
[ "$(job_field "$job" 'sorted(j["node_ids"])')" = "['coord', 'hostb']" ] || fail "expected both hosts"
wait_for 60 grep -q '"rank":3,"step":5,' "$T/hostb/jobs/$job/rank-3.stdout" || fail "rank 3 never stepped"
log "link down on $NSB"
ip -n "$NSB" link set "$VB" down
wait_for 60 field_is "$job" 'j["node_ids"]' "['coord']" ||
  fail "the job did not go on on host a alone: $(job_field "$job" 'j["node_ids"]')"
wait_state "$job" RUNNING 60
log "running on host a alone; link up on $NSB"
ip -n "$NSB" link set "$VB" up
wait_for 60 field_is "$job" 'sorted(j["node_ids"])' "['coord', 'hostb']" ||
  fail "the job did not scale back to both hosts: $(job_field "$job" 'j["node_ids"]')"
wait_state "$job" SUCCEEDED 120
grep -q "hostb lost" <<<"$(job_field "$job" 'j["history"]')" || fail "history should record that hostb was lost"
identical_on_four "$job"
check_invariants "$job" 2
log "PASS"
