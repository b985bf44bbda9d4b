#!/usr/bin/env bash
# `lockstep submit` (no --detach) streams every rank's stdout and stderr,
# prefixed "[R] ", and the job's state changes, across a restart, until the
# job ends: exit 0 for SUCCEEDED, 3 otherwise. --detach returns at once.
# Ctrl-C stops following, not the job. `lockstep delete` refuses a live job
# and removes a finished one: its record and its directory (logs) on the
# node. A coordinator with --retain-finished-s deletes finished jobs itself.
source tests/e2e/lib.sh "$@"

start_coordinator
# Streaming submits below end with their job; bounded by timeout (exit 124).

log "1. a job that fails once and then succeeds, streamed"
rc=0
(CLI_PREFIX=(timeout 120); ls_cli submit --nproc-per-node 2 --max-restarts 1 --env TRAINER_STEPS=5 \
  --env TRAINER_STEP_MS=50 --env TRAINER_FAIL_RANK=1 --env TRAINER_FAIL_AFTER=2 \
  --env TRAINER_FAIL_UNTIL_RESTART=1 --env TRAINER_OUT_DIR="$T/out" -- "$TRAINER" "$MARKER") \
  >"$T/sub.out" 2>"$T/sub.err" || rc=$?
[ "$rc" = 0 ] || fail "submit exited $rc (124: still streaming after 120 s): $(tail -n 5 "$T/sub.err")"
job=$(sed -n 's/^submitted job //p' "$T/sub.out")
[ -n "$job" ] || fail "no job id in: $(head -n 3 "$T/sub.out")"
for round in 1 2; do
  for r in 0 1; do
    grep -q "^\[$r\] === lockstep: job $job round $round rank $r " "$T/sub.out" ||
      fail "round $round of rank $r missing from submit's output: $(cat "$T/sub.out")"
    # The agent heads stdout and stderr alike; submit shows the header once.
    [ "$(cat "$T/sub.out" "$T/sub.err" | grep -c "^\[$r\] === lockstep: job $job round $round rank $r ")" = 1 ] ||
      fail "round $round of rank $r headed more than once: $(grep -h '=== lockstep' "$T/sub.out" "$T/sub.err")"
  done
done
for r in 0 1; do
  grep -q "^\[$r\] rank $r step 5 " "$T/sub.out" || fail "rank $r's last step missing: $(cat "$T/sub.out")"
done
grep -q "^\[1\] test_trainer: rank 1 failing on purpose" "$T/sub.err" ||
  fail "rank 1's stderr is not on submit's stderr, prefixed: $(cat "$T/sub.err")"
grep -q "^lockstep: RUNNING  round 2 " "$T/sub.out" || fail "no state line for round 2: $(cat "$T/sub.out")"
grep -q "^lockstep: SUCCEEDED  round 2  restarts 1/1" "$T/sub.out" ||
  fail "no final state line: $(grep '^lockstep:' "$T/sub.out")"
tail -n 1 "$T/sub.err" | grep -q "job $job SUCCEEDED" || fail "stderr does not end with the state: $(cat "$T/sub.err")"

log "2. a job that fails: exit 3"
rc=0
(CLI_PREFIX=(timeout 120); ls_cli submit --nproc-per-node 1 --env TRAINER_STEPS=3 --env TRAINER_STEP_MS=10 \
  --env TRAINER_FAIL_RANK=0 --env TRAINER_FAIL_AFTER=1 -- "$TRAINER" "$MARKER") \
  >"$T/fail.out" 2>"$T/fail.err" || rc=$?
[ "$rc" = 3 ] || fail "a failing job's submit exited $rc, not 3 (124: still streaming after 120 s):" \
  "$(tail -n 3 "$T/fail.err")"
grep -q "^lockstep: FAILED" "$T/fail.out" || fail "no FAILED line: $(cat "$T/fail.out")"

log "3. --detach returns while the job runs; Ctrl-C leaves the job running"
long=(--nproc-per-node 2 --env TRAINER_STEPS=1000 --env TRAINER_STEP_MS=50 -- "$TRAINER" "$MARKER")
detached=$(ls_cli submit --detach "${long[@]}" | sed -n 's/^submitted job //p')
[ -n "$detached" ] || fail "--detach printed no job id"
state=$(job_state "$detached")
case "$state" in PENDING|RENDEZVOUS|RUNNING) ;; *) fail "--detach returned with the job $state" ;; esac
ls_cli cancel "$detached" >/dev/null
# The CLI itself, not a shell function's subshell, gets the SIGINT.
"$LOCKSTEP" --coordinator "$COORD" --token-file "$TOKEN" submit "${long[@]}" >"$T/int.out" 2>"$T/int.err" &
cli=$!
wait_for 20 grep -q '^\[1\] rank 1 step 2 ' "$T/int.out" || fail "no streamed steps: $(cat "$T/int.out")"
streamed=$(sed -n 's/^submitted job //p' "$T/int.out")
kill -INT "$cli"
wait_for 20 exited "$cli" ||
  fail "submit (pid $cli) still runs 20 s after SIGINT: $(tail -n 3 "$T/int.err")"
rc=0; wait "$cli" || rc=$?
[ "$rc" = 130 ] || fail "SIGINT: submit exited $rc, not 130: $(cat "$T/int.err")"
grep -q "job $streamed keeps running" "$T/int.err" || fail "no hint that the job runs on: $(cat "$T/int.err")"
state_is "$streamed" RUNNING || fail "Ctrl-C of submit changed the job: $(job_state "$streamed")"

log "4. delete: refused while running, then the record and the logs go"
rc=0; err=$(ls_cli delete "$streamed" 2>&1) || rc=$?
[ "$rc" = 1 ] || fail "delete of a running job exited $rc: $err"
grep -q "FAILED_PRECONDITION: .*cancel it first" <<<"$err" || fail "delete of a running job: $err"
ls_cli cancel "$streamed" >/dev/null
wait_state "$streamed" CANCELLED 20
wait_for 20 no_workers || fail "workers of the cancelled job still run: $(describe_workers)"
[ -d "$T/coord/jobs/$job" ] || fail "job $job's directory is missing before the delete"
grep -q "rank 0 step 5 " <<<"$(ls_cli logs "$job" --rank 0)" || fail "a finished job's logs are not readable"
ls_cli delete "$job" "$streamed" "$detached" >"$T/delete.out" || fail "delete failed: $(cat "$T/delete.out")"
grep -q "deleted job $job (SUCCEEDED" "$T/delete.out" || fail "delete said: $(cat "$T/delete.out")"
rc=0; err=$(ls_cli status "$job" 2>&1) || rc=$?
[ "$rc" = 1 ] && grep -q "NOT_FOUND: .*job $job not found" <<<"$err" || fail "status after delete: rc $rc: $err"
if grep -q "$job" <<<"$(ls_cli list --json)"; then fail "a deleted job is still listed"; fi
for id in "$job" "$streamed" "$detached"; do
  wait_for 10 test ! -e "$T/coord/jobs/$id" || fail "job $id's directory was not removed"
done
grep -q "job=$job .*job deleted: removed $T/coord/jobs/$job" "$T/coord.log" ||
  fail "the agent did not log the removal: $(grep "$job" "$T/coord.log" | tail -n 3)"
rc=0; err=$(ls_cli delete "$job" 2>&1) || rc=$?
[ "$rc" = 1 ] && grep -q "NOT_FOUND" <<<"$err" || fail "a second delete: rc $rc: $err"


log "5. --retain-finished-s: finished jobs go by themselves"
start_daemon keep --coordinator --listen 127.0.0.1:0 --retain-finished-s 2
keep=("$LOCKSTEP" --coordinator "$ADDR_keep" --token-file "$T/keep/token")
rc=0
out=$(timeout 120 "${keep[@]}" submit --env TRAINER_STEPS=2 --env TRAINER_STEP_MS=10 -- "$TRAINER" "$MARKER") ||
  rc=$?
kept=$(sed -n 's/^submitted job //p' <<<"$out")
[ "$rc" = 0 ] && [ -n "$kept" ] ||
  fail "the job on the retaining coordinator did not run: rc $rc (124: still streaming after 120 s): $out"
"${keep[@]}" status "$kept" >/dev/null || fail "the job is gone at once"
gone() { ! "${keep[@]}" status "$kept" >/dev/null 2>&1 && [ ! -e "$T/keep/jobs/$kept" ]; }
wait_for 20 gone || fail "job $kept was not deleted 2 s after it ended"
grep -q "job=$kept .*job deleted by retention" "$T/keep.log" || fail "no retention line in keep.log"

check_invariants "$(sed -n 's/^submitted job //p' "$T/fail.out")" 0
log "PASS"
