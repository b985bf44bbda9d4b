#!/usr/bin/env bash
# kill -9 of one worker mid-run: the job restarts once (a new round on the
# same nodes) and succeeds; the agent's log says the kill was not its own;
# then the fault-test invariants hold.
source tests/e2e/lib.sh "$@"

start_coordinator
start_agent nodeb
job=$(submit --nodes 2 --nproc-per-node 2 --max-restarts 2 --env TRAINER_STEPS=300 --env TRAINER_STEPS_LATER=10 --env TRAINER_STEP_MS=100)
log "submitted $job"
wait_state "$job" RUNNING 30
# Wait until rank 2 (on nodeb) trains, then kill it.
wait_for 30 grep -q "^rank 2 step 2 " "$T/nodeb/jobs/$job/rank-2.stdout" || fail "rank 2 never stepped"
victim=$(cat "$T/out/pid-rank-2")
log "kill -9 rank 2 (pid $victim)"
kill -9 "$victim"
wait_for 30 field_is "$job" 'j.get("restart_count",0)' 1 || fail "no restart recorded"
wait_state "$job" SUCCEEDED 60
[ "$(job_field "$job" 'j["round"]')" = 2 ] || fail "expected the job to finish in round 2"
[ "$(job_field "$job" 'j["first_failure"]["rank"]')" = 2 ] || fail "first failure should be rank 2"
[ "$(job_field "$job" 'j["first_failure"]["exit"]["signal"]')" = 9 ] || fail "first failure should be signal 9"
# nodeb's agent did not send that SIGKILL, and its log line says so.
grep -Eq "job=$job rank=2 worker pid [0-9]+ killed by signal 9, not by the agent \(by the worker itself or from outside\)" \
  "$T/nodeb.log" || fail "nodeb's log does not say rank 2 was killed from outside: $(grep "rank=2 worker" "$T/nodeb.log")"
# The coordinator's line for the restart rank 2 caused is about rank 2 (or,
# had another rank's exit been reported first, the line settling on rank 2).
grep -Eq "\[coordinator\] job=$job rank=2 (RESTARTING round=1 restarts=1|first failure is rank 2)" \
  "$T/coord.log" ||
  fail "the coordinator's restart line lacks rank=2: $(grep RESTARTING "$T/coord.log")"
for r in 0 1 2 3; do
  [ -f "$T/out/done-round-2-rank-$r" ] || fail "rank $r did not finish round 2"
done
ls_cli status "$job"
check_invariants "$job" 2
log "PASS"
