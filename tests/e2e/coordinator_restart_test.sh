#!/usr/bin/env bash
# The coordinator is killed with -9 mid-job and restarted on the same
# address: the job is still there with its history, the agent (which kept
# its workers, or stopped them itself if the coordinator stayed away past
# half a lease) re-attaches, and the job reaches SUCCEEDED within budget.
LEASE_S=6
source tests/e2e/lib.sh "$@"

start_daemon coord --coordinator --no-agent --listen 127.0.0.1:0
COORD="$ADDR_coord"
TOKEN="$T/coord/token"
start_agent nodea
job=$(submit --nodes 1 --nproc-per-node 2 --max-restarts 2 --env TRAINER_STEPS=80 --env TRAINER_STEPS_LATER=10 --env TRAINER_STEP_MS=100)
wait_state "$job" RUNNING 30
wait_for 30 grep -q "^rank 1 step 3 " "$T/nodea/jobs/$job/rank-1.stdout" || fail "rank 1 never stepped"
history_before=$(job_field "$job" 'len(j["history"])')
log "kill -9 coordinator (pid $PID_coord)"
kill -9 "$PID_coord"
wait_for 10 bash -c "! kill -0 $PID_coord" || fail "coordinator did not die"
start_daemon coord --coordinator --no-agent --listen "$COORD"
[ "$ADDR_coord" = "$COORD" ] || fail "coordinator came back on $ADDR_coord, not $COORD"
# Still there, with its history, right after the restart.
[ "$(job_field "$job" 'len(j["history"])')" -ge "$history_before" ] || fail "history lost"
grep -q submitted <<<"$(job_field "$job" 'j["history"][0]["detail"]')" || fail "history lacks the submit event"
wait_state "$job" SUCCEEDED 60
ls_cli status "$job"
check_invariants "$job" 2
log "PASS"
