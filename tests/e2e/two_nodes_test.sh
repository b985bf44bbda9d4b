#!/usr/bin/env bash
# A 2-node x 2-worker job runs to SUCCEEDED; `logs --rank 3` returns that
# rank's output; status, list, nodes and watch work, in text and JSON.
source tests/e2e/lib.sh "$@"

start_coordinator
start_agent nodeb
ls_cli nodes
[ "$(ls_cli nodes --json | python3 -c 'import json,sys; print(sum(n.get("alive",False) for n in json.load(sys.stdin)["nodes"]))')" = 2 ] ||
  fail "expected 2 live nodes"

rc=0
out=$(CLI_PREFIX=(timeout 120); ls_cli submit --nodes 2 --nproc-per-node 2 --max-restarts 0 \
  --name two-by-two --max-open-files 512 --env TRAINER_STEPS=15 --env TRAINER_STEP_MS=100 \
  --env TRAINER_OUT_DIR="$T/out" --wait -- "$TRAINER" "$MARKER") || rc=$?
echo "$out"
job=$(echo "$out" | sed -n 's/^submitted job //p')
[ "$rc" = 0 ] || fail "submit --wait exited $rc, not 0 for SUCCEEDED (124: still waiting after 120 s;" \
  "job ${job:-not submitted}${job:+ is $(job_state "$job")}): $out"
[ -n "$job" ] || fail "no job id in: $out"
state_is "$job" SUCCEEDED || fail "job $job is $(job_state "$job")"

ls_cli status "$job" | tee "$T/status.txt"
grep -q "SUCCEEDED" "$T/status.txt" || fail "status text lacks the state"
[ "$(job_field "$job" 'len(j["workers"])')" = 4 ] || fail "expected 4 workers"
[ "$(job_field "$job" 'j["workers"][3]["node_id"]')" = nodeb ] || fail "rank 3 should run on nodeb"
[ "$(job_field "$job" 'j["workers"][3]["progress"]["step"]')" = 15 ] || fail "rank 3's last progress is not step 15"

ls_cli logs "$job" --rank 3 > "$T/rank3.txt"
grep -q "^rank 3 step 15 loss" "$T/rank3.txt" || fail "logs --rank 3 lacks rank 3's output: $(cat "$T/rank3.txt")"
grep -q "rank 3 of 4 (local 1 of 2, node 1 of 2)" "$T/rank3.txt" || fail "rank 3 saw the wrong environment"
if grep -q "^rank [012] " "$T/rank3.txt"; then fail "logs --rank 3 contains other ranks' lines"; fi
grep -q "rank 0 done" <<<"$(ls_cli logs "$job" --rank 0 --follow)" || fail "logs --follow of rank 0"
grep -q "^test_trainer: rank 3 max open files 512" "$T/rank3.txt" || fail "rank 3 did not get RLIMIT_NOFILE 512"
[ -f "$T/nodeb/jobs/$job/rank-3.stdout" ] || fail "rank 3's log file is not under nodeb's state dir"

grep "$job" <<<"$(ls_cli list)" | grep -q SUCCEEDED || fail "list does not show the job"
# A finished job: watch prints one block (piped: no escape sequences), exit 0.
ls_cli watch "$job" >"$T/watch.out" || fail "watch of a SUCCEEDED job did not exit 0"
grep -Eq '^3 +nodeb +[A-Z]+ +15 ' "$T/watch.out" || fail "watch lacks rank 3 at step 15: $(cat "$T/watch.out")"
if grep -q $'\x1b' "$T/watch.out"; then fail "watch wrote escape sequences into a pipe"; fi
check_invariants "$job" 0
log "PASS"
