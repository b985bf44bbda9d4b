#!/usr/bin/env bash
# An agent cut off from its coordinator (the coordinator stopped with
# SIGSTOP) for longer than a lease stops its own workers a lease after its
# last accepted heartbeat (SIGTERM, SIGKILL within lease/4): before the
# coordinator could hand their ranks out (receipt + 1.25 lease + 1 s). When
# the coordinator comes back the job recovers within its restart budget.
LEASE_S=4
source tests/e2e/lib.sh "$@"

start_daemon coord --coordinator --no-agent --listen 127.0.0.1:0
COORD="$ADDR_coord"
TOKEN="$T/coord/token"
start_agent nodea
job=$(submit --nodes 1 --nproc-per-node 2 --max-restarts 3 --stop-grace-s 5 \
  --env TRAINER_STEPS=300 --env TRAINER_STEPS_LATER=10 --env TRAINER_STEP_MS=100)
wait_state "$job" RUNNING 30
wait_for 30 grep -q "^rank 0 step 2 " "$T/nodea/jobs/$job/rank-0.stdout" || fail "rank 0 never stepped"
[ "$(worker_pids | wc -l)" = 2 ] || fail "expected 2 workers"
log "SIGSTOP coordinator (pid $PID_coord)"
cut=$(date +%s%N)
kill -STOP "$PID_coord"
# Self-fence after a lease (4 s) + grace capped at lease/4 (1 s), counted
# from the last accepted heartbeat (at most one interval before the cut).
wait_for $((LEASE_S + 2)) no_workers || fail "the cut-off agent kept its workers: $(describe_workers)"
log "workers stopped by their agent $(( ($(date +%s%N) - cut) / 1000000 )) ms after the cut"
grep -q "stopped this node's workers" "$T/nodea.log" || fail "agent did not log the self-fence"
kill -CONT "$PID_coord"
wait_state "$job" SUCCEEDED 60
check_invariants "$job" 3
log "PASS"
