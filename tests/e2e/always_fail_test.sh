#!/usr/bin/env bash
# A worker that always fails: FAILED after max restarts, with the rank, its
# exit code and last log lines in status. The test trainer does not use the
# engine, so however early it dies it is not called a startup failure (that
# is a death inside the engine's bootstrap: first_failure_test).
source tests/e2e/lib.sh "$@"

start_coordinator
job=$(submit --nodes 1 --nproc-per-node 2 --max-restarts 2 --env TRAINER_STEPS=50 \
  --env TRAINER_FAIL_RANK=1 --env TRAINER_FAIL_CODE=3)
log "submitted $job"
wait_state "$job" FAILED 60
ls_cli status "$job" | tee "$T/status.txt"
[ "$(job_field "$job" 'j["restart_count"]')" = 2 ] || fail "expected exactly 2 restarts"
[ "$(job_field "$job" 'j["first_failure"]["rank"]')" = 1 ] || fail "failure should name rank 1"
[ "$(job_field "$job" 'j["first_failure"]["exit"]["exit_code"]')" = 3 ] || fail "failure should carry exit code 3"
grep -q "rank 1 on node coord exit code 3" "$T/status.txt" || fail "status text lacks rank and code"
if grep -q "startup failure" "$T/status.txt"; then fail "a program without the engine was called a startup failure"; fi
grep -q "failing on purpose with code 3" "$T/status.txt" || fail "status text lacks the last log lines"
# Piped, watch prints the job's message whole (the terminal's width cuts
# lines only on a terminal; 80 columns used to cut this one).
rc=0
ls_cli watch "$job" >"$T/watch.out" || rc=$?
[ "$rc" = 3 ] || fail "watch of a FAILED job exited $rc, want 3"
msg=$(job_field "$job" 'j["message"]')
(( ${#msg} > 80 )) || fail "the job's message is too short to show this: $msg"
grep -qF "  $msg" "$T/watch.out" || fail "piped watch cut the message: $(cat "$T/watch.out")"
check_invariants "$job" 2
log "PASS"
