#!/usr/bin/env bash
# Two hosts as network namespaces joined by a veth pair: a coordinator+agent
# in one, an agent in the other. A 1:2 job runs on both; then the link goes
# down: the cut-off agent stops its worker by itself a lease after its last
# accepted heartbeat (SIGKILL within lease/4 more), the coordinator declares
# that node dead a lease after it last heard from it and opens the next
# round past the node's fence deadline (after the cut-off worker is gone),
# within two leases of the cut, and the job finishes on the survivor. Every connection between the hosts
# (agent -> coordinator, CLI, the workers' store and progress clients) is
# mutual TLS. Skips (with a message) where network namespaces are not
# permitted; the loopback variants are agent_cutoff_test and agent_kill_test.
source tests/e2e/lib.sh "$@"

NET="10.213.$(($$ % 250))"
two_hosts ls "$NET"

# Mutual TLS between the hosts, with certificates from `lockstep certs`:
# each daemon's names its own address, the CLI presents client.pem, the
# workers worker.pem (clientAuth only).
cluster_tls "$NET.1" "$NET.2"

DAEMON_PREFIX=(ip netns exec "$NSA")
CLI_PREFIX=(ip netns exec "$NSA")
start_coordinator --listen "$NET.1:0" $(node_tls "$NET.1")
grep -q "mutual TLS: CA $CERTS/ca.pem" "$T/coord.log" || fail "the coordinator does not serve TLS"
DAEMON_PREFIX=(ip netns exec "$NSB")
start_daemon hostb --listen "$NET.2:0" --coordinator-address "$COORD" --token-file "$TOKEN" $(node_tls "$NET.2")
job=$(submit --nodes 1:2 --nproc-per-node 1 --max-restarts 2 --last-call-s 0.5 \
  --env TRAINER_STEPS=300 --env TRAINER_STEPS_LATER=10 --env TRAINER_STEP_MS=100)
wait_state "$job" RUNNING 30
[ "$(job_field "$job" 'sorted(j["node_ids"])')" = "['coord', 'hostb']" ] || fail "expected both hosts"
wait_for 30 grep -q "^rank 1 step 2 " "$T/hostb/jobs/$job/rank-1.stdout" || fail "rank 1 never stepped"
victim=$(cat "$T/out/pid-rank-1")
grep -q "master $NET.1:" "$T/hostb/jobs/$job/rank-1.stdout" || fail "MASTER_ADDR is not host A's address"

log "link down on $NSB"
cut_at=$(date +%s%N)
ip -n "$NSB" link set "$VB" down
# Polled every 50 ms: the last instant host b's worker was seen alive.
last_alive_ms=$((cut_at / 1000000))
give_up=$(( $(date +%s) + LEASE_S + LEASE_S / 4 + 2 ))
while kill -0 "$victim" 2>/dev/null; do
  last_alive_ms=$(( $(date +%s%N) / 1000000 ))
  (( $(date +%s) < give_up )) || fail "cut-off host kept its worker $victim"
  sleep 0.05
done
log "host b stopped its worker by itself $(( last_alive_ms - cut_at / 1000000 )) ms after the cut"
# Replaced within two leases: the new round (host a alone) runs past host
# b's fence deadline, last heartbeat + 1.25 lease + 1 s, and before 2 leases.
wait_for 60 field_is "$job" '(j["node_ids"], j["state"] in ("RUNNING", "SUCCEEDED"))' \
  "(['coord'], True)" || fail "host b was never replaced: $(ls_cli status "$job")"
replaced_ms=$(( ($(date +%s%N) - cut_at) / 1000000 ))
log "host b replaced ${replaced_ms} ms after the cut (lease ${LEASE_S}s)"
(( replaced_ms < 2 * LEASE_S * 1000 )) || fail "host b was replaced only after ${replaced_ms} ms: more than two leases"
# ... and not before its fence deadline: the next round opened (its first
# history event, on the coordinator's clock, this host's) after host b's
# worker was last seen alive.
round2_ms=$(job_field "$job" 'min(e["unix_ms"] for e in j["history"] if e.get("round", 0) >= 2)')
(( round2_ms > last_alive_ms )) ||
  fail "round 2 opened at $round2_ms, while host b's worker $victim was still alive at $last_alive_ms: $(job_field "$job" 'j["history"]')"
log "round 2 opened $(( round2_ms - last_alive_ms )) ms after host b's worker was last seen alive"
wait_state "$job" SUCCEEDED 60
[ "$(job_field "$job" 'j["node_ids"]')" = "['coord']" ] || fail "the last round should run on host a alone"
grep -q "hostb lost" <<<"$(job_field "$job" 'j["history"]')" || fail "history should record that hostb was lost"
check_invariants "$job" 2
log "PASS"
