#!/usr/bin/env bash
# An agent is killed with -9: its workers die with it (PDEATHSIG), its node
# is declared dead within the lease, and with --nodes 1:2 the job goes on on
# the survivor in a new round and succeeds.
source tests/e2e/lib.sh "$@"

start_daemon coord --coordinator --no-agent --listen 127.0.0.1:0
COORD="$ADDR_coord"
TOKEN="$T/coord/token"
start_agent nodea
start_agent nodeb
job=$(submit --nodes 1:2 --nproc-per-node 1 --max-restarts 2 --last-call-s 0.5 \
  --env TRAINER_STEPS=300 --env TRAINER_STEPS_LATER=10 --env TRAINER_STEP_MS=100)
wait_state "$job" RUNNING 30
[ "$(job_field "$job" 'len(j["node_ids"])')" = 2 ] || fail "expected both nodes in round 1"
wait_for 30 grep -q "^rank 1 step 2 " "$T/nodeb/jobs/$job/rank-1.stdout" || fail "rank 1 never stepped"
victim=$(cat "$T/out/pid-rank-1")
kill -0 "$victim" || fail "rank 1 (pid $victim) is not running before the kill"
killed_at=$(date +%s%N)
log "kill -9 agent nodeb (pid $PID_nodeb)"
kill -9 "$PID_nodeb"
# Its worker dies with it, long before its 300 steps (30 s) would end it.
wait_for 10 exited "$victim" ||
  fail "rank 1 (pid $victim) outlived its agent nodeb by 10 s (no PDEATHSIG?)"
log "rank 1 (pid $victim) died with its agent"
node_dead() {
  ls_cli nodes --json | python3 -c '
import json,sys
n=[n for n in json.load(sys.stdin)["nodes"] if n["node_id"]=="nodeb"][0]
sys.exit(0 if not n.get("alive", False) else 1)'
}
wait_for $((LEASE_S + 10)) node_dead || fail "nodeb not declared dead"
# Judged on the coordinator's clock: the silence it saw when it declared
# the node dead is the lease plus at most one tick (0.1 s) and scheduling.
silence=$(sed -n 's/.*node nodeb declared dead: no heartbeat for \([0-9.]*\)s.*/\1/p' "$T/coord.log" | head -n1)
[ -n "$silence" ] || fail "coordinator log lacks the declaration"
python3 -c "import sys; sys.exit(0 if $silence < $LEASE_S + 1.5 else 1)" ||
  fail "nodeb declared dead after ${silence}s of silence (lease ${LEASE_S}s)"
log "nodeb declared dead after ${silence}s without heartbeat (lease ${LEASE_S}s)"
wait_state "$job" SUCCEEDED 60
[ "$(job_field "$job" 'j["node_ids"]')" = "['nodea']" ] || fail "the last round should run on nodea alone"
grep -q "node nodeb lost" <<<"$(job_field "$job" 'j["first_failure"]["reason"]')" || fail "failure should name the lost node"
check_invariants "$job" 2
log "PASS"
