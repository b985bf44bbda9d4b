#!/usr/bin/env bash
# The single-host setup: one lockstepd is coordinator and agent. Killed
# with -9 mid-job, its workers die with it (no orphans); restarted on the
# same state dir and address, it reloads the job, sees its own node come
# back with a new incarnation, restarts the job once and finishes it.
source tests/e2e/lib.sh "$@"

start_coordinator
job=$(submit --nodes 1 --nproc-per-node 2 --max-restarts 1 --env TRAINER_STEPS=300 --env TRAINER_STEPS_LATER=10 --env TRAINER_STEP_MS=100)
wait_state "$job" RUNNING 30
wait_for 30 grep -q "^rank 1 step 2 " "$T/coord/jobs/$job/rank-1.stdout" || fail "rank 1 never stepped"
log "kill -9 lockstepd (pid $PID_coord)"
kill -9 "$PID_coord"
wait_for 5 no_workers || fail "workers outlived their agent: $(describe_workers)"
log "workers died with their agent"
start_daemon coord --coordinator --listen "$COORD"
wait_state "$job" SUCCEEDED 60
[ "$(job_field "$job" 'j["restart_count"]')" = 1 ] || fail "expected one restart"
grep -q "agent restarted" <<<"$(job_field "$job" 'j["first_failure"]["reason"]')" || fail "failure should say the agent restarted"
check_invariants "$job" 1
log "PASS"
