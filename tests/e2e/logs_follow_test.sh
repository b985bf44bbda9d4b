#!/usr/bin/env bash
# `lockstep logs --follow` started before any worker runs waits for them,
# follows rank 1 through a restart (both rounds' output), and ends with the
# job's final state (exit 0 for SUCCEEDED); `--all-ranks` prefixes every
# rank's lines with "[R] "; `--tail N` starts with the last N lines, whole
# ones only where lines are longer than the KiB per line it reads.
source tests/e2e/lib.sh "$@"

start_coordinator --no-agent
job=$(submit --nproc-per-node 2 --max-restarts 1 --env TRAINER_STEPS=6 --env TRAINER_STEP_MS=100 \
  --env TRAINER_FAIL_RANK=1 --env TRAINER_FAIL_AFTER=3 --env TRAINER_FAIL_UNTIL_RESTART=1)
ls_cli logs "$job" --rank 1 --follow >"$T/follow.out" 2>"$T/follow.err" &
follow=$!
ls_cli logs "$job" -a -f >"$T/all.out" 2>"$T/all.err" &
all=$!
wait_for 10 grep -q "waiting for its workers to start" "$T/follow.err" ||
  fail "logs --follow did not wait for the workers: $(cat "$T/follow.err")"
start_agent nodeb
# The job takes a few seconds (two rounds of 6 x 100 ms steps); both
# followers end once they see its final state.
wait_for 60 exited "$follow" ||
  fail "logs --follow (pid $follow) still runs 60 s after the agent started; job $job is" \
    "$(job_state "$job"): $(tail -n 3 "$T/follow.err")"
wait_for 20 exited "$all" ||
  fail "logs --all-ranks --follow (pid $all) still runs 20 s after logs --follow ended; job $job is" \
    "$(job_state "$job"): $(tail -n 3 "$T/all.err")"
rc=0; wait "$follow" || rc=$?
[ "$rc" = 0 ] || fail "logs --follow exited $rc: $(cat "$T/follow.err")"
rc=0; wait "$all" || rc=$?
[ "$rc" = 0 ] || fail "logs --all-ranks --follow exited $rc: $(cat "$T/all.err")"
state_is "$job" SUCCEEDED || fail "job $job is $(job_state "$job")"
[ "$(job_field "$job" 'j["restart_count"]')" = 1 ] || fail "expected one restart"

grep -q "round 1 rank 1 " "$T/follow.out" || fail "round 1 of rank 1 missing: $(cat "$T/follow.out")"
grep -q "^rank 1 step 3 " "$T/follow.out" || fail "rank 1's round-1 steps missing: $(cat "$T/follow.out")"
grep -q "round 2 rank 1 " "$T/follow.out" || fail "round 2 of rank 1 missing: $(cat "$T/follow.out")"
grep -q "^rank 1 step 6 " "$T/follow.out" || fail "rank 1's round-2 steps missing: $(cat "$T/follow.out")"
if grep -q "^rank 0 " "$T/follow.out"; then fail "logs --rank 1 printed rank 0's lines"; fi
tail -n 1 "$T/follow.err" | grep -q "job $job SUCCEEDED" ||
  fail "logs --follow did not end with the job's state: $(cat "$T/follow.err")"

for r in 0 1; do
  grep -q "^\[$r\] rank $r step 6 " "$T/all.out" || fail "--all-ranks lacks rank $r's last step: $(cat "$T/all.out")"
done
if [ -n "$(grep -v '^\[[01]\] ' "$T/all.out" || true)" ]; then
  fail "--all-ranks printed unprefixed lines: $(grep -v '^\[[01]\] ' "$T/all.out" | head -n 3)"
fi

ls_cli logs "$job" -r 0 --tail 2 >"$T/tail.out"
[ "$(wc -l <"$T/tail.out")" = 2 ] || fail "--tail 2 printed $(wc -l <"$T/tail.out") lines: $(cat "$T/tail.out")"
diff <(tail -n 2 "$T/nodeb/jobs/$job/rank-0.stdout") "$T/tail.out" >/dev/null ||
  fail "--tail 2 is not the file's last two lines: $(cat "$T/tail.out")"
# --tail-bytes given with --tail bounds what is read, as given (it was
# widened to N KiB): the last 5 bytes, whatever the lines.
ls_cli logs "$job" -r 0 --tail 2 --tail-bytes 5 >"$T/tail5.out"
cmp -s <(tail -c 5 "$T/nodeb/jobs/$job/rank-0.stdout") "$T/tail5.out" ||
  fail "--tail 2 --tail-bytes 5 is not the file's last 5 bytes: $(od -c "$T/tail5.out" | head -3)"
check_invariants "$job" 1

# Lines longer than the KiB per line --tail N reads: fewer than N, each one
# whole (the line cut at the window's start is left out); with --tail-bytes
# large enough, all N.
long=$(ls_cli submit --detach --json -- /bin/sh -c \
  'for i in 1 2 3; do printf "line$i "; head -c 2000 /dev/zero | tr "\\0" x; echo; done' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$long" SUCCEEDED 30
ls_cli logs "$long" --tail 3 >"$T/long3.out"
[ "$(wc -l <"$T/long3.out")" = 1 ] && grep -qx "line3 x\{2000\}" "$T/long3.out" ||
  fail "--tail 3 over 2 KiB lines is not the last line whole: $(cut -c1-60 "$T/long3.out")"
ls_cli logs "$long" --tail 3 --tail-bytes 100000 >"$T/long3b.out"
[ "$(cut -c1-5 "$T/long3b.out" | tr '\n' ' ')" = "line1 line2 line3 " ] ||
  fail "--tail 3 --tail-bytes 100000 is not the three lines: $(cut -c1-60 "$T/long3b.out")"
log "PASS"
