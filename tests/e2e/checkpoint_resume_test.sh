#!/usr/bin/env bash
# A restart resumes from the last checkpoint, and the result is the same as
# if nothing had failed. Under lockstepd, a 1-node x 2-worker real DDP job
# (gloo) of examples/train --steps 60 --checkpoint-every 10 (SGD with
# momentum, so optimizer state matters):
#   1. reference: the job runs uninterrupted (its own checkpoint dir);
#   2. the same job with kill -9 of rank 1 once it logged step 30: the job
#      SUCCEEDS with one restart, every rank of the restart round logs
#      "resumed from step S" with 20 <= S <= 30, trains steps S+1..60 only,
#      and ends with the reference's parameters, bit for bit (checksum lines
#      and --dump-params files; same data per step, same world size,
#      deterministic reduction).
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"

start_coordinator
train_args=(--model mlp_small --steps 60 --checkpoint-every 10 --step-delay-ms 100
  --momentum 0.9 --lr 0.05 --timeout-s 60)

# rank_section FILE: the lines a rank's log got in its last round (after the
# agent's last "=== lockstep: job ... round N ..." header).
rank_section() { awk '/^=== lockstep: job /{buf=""; next} {buf=buf $0 "\n"} END{printf "%s", buf}' "$1"; }
# checksums JOB: "checksum abs_checksum" of each rank's last round, one line per rank.
checksums() {
  for r in 0 1; do
    rank_section "$T/coord/jobs/$1/rank-$r.stdout" |
      sed -n 's/.*"checksum":\([^,]*\),"abs_checksum":\([^,]*\),.*/\1 \2/p'
  done
}

# 1. Reference, uninterrupted.
ref=$(ls_cli submit --detach --json --nodes 1 --nproc-per-node 2 --max-restarts 0 -- \
  "$TRAIN" "${train_args[@]}" --checkpoint-dir "$T/ckpt-ref" --dump-params "$T/ref-params" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$ref" SUCCEEDED 120
grep -q "no checkpoint in $T/ckpt-ref" "$T/coord/jobs/$ref/rank-1.stderr" ||
  fail "reference rank 1 did not start fresh: $(tail -n 5 "$T/coord/jobs/$ref/rank-1.stderr")"
ref_sums=$(checksums "$ref")
log "reference checksums: $(echo $ref_sums)"
[ "$(echo "$ref_sums" | wc -l)" = 2 ] || fail "reference: expected 2 checksum lines, got: $ref_sums"
[ "$(echo "$ref_sums" | sort -u | wc -l)" = 1 ] || fail "reference ranks differ: $ref_sums"
# Rank 0 saved every 10 steps and kept the newest two; the dir's round
# fence (ddp/checkpoint.h) is this job's round 1.
[ "$(ls "$T/ckpt-ref" | grep '^ckpt-')" = "$(printf 'ckpt-000000000050.pt\nckpt-000000000060.pt')" ] ||
  fail "reference checkpoint dir holds: $(ls -a "$T/ckpt-ref")"
[ "$(cat "$T/ckpt-ref/lockstep-round")" = "$ref 1" ] || fail "reference dir's round fence: $(cat "$T/ckpt-ref/lockstep-round")"

# 2. The same job, rank 1 killed at step 30.
job=$(ls_cli submit --detach --json --nodes 1 --nproc-per-node 2 --max-restarts 1 -- \
  "$TRAIN" "${train_args[@]}" --checkpoint-dir "$T/ckpt" --dump-params "$T/resumed-params" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$job" RUNNING 60
# The pid first, so the kill follows step 30 by one poll (0.1 s), well
# inside the 10 steps (about 1 s) before the next checkpoint.
victim=$(job_field "$job" '[w["pid"] for w in j["workers"] if w.get("rank", 0) == 1][0]')
wait_for 60 grep -q '"rank":1,"step":30,' "$T/coord/jobs/$job/rank-1.stdout" ||
  fail "rank 1 never reached step 30"
log "kill -9 DDP rank 1 (pid $victim) after its step 30"
kill -9 "$victim" || fail "rank 1 (pid $victim) was gone before the kill"
wait_state "$job" SUCCEEDED 120
[ "$(job_field "$job" 'j["restart_count"]')" = 1 ] || fail "expected restart_count 1"
[ "$(job_field "$job" 'j["first_failure"]["exit"]["signal"]')" = 9 ] || fail "first failure should be signal 9"

steps=()
for r in 0 1; do
  err=$(rank_section "$T/coord/jobs/$job/rank-$r.stderr")
  s=$(echo "$err" | sed -n 's/.*resumed from step \([0-9]*\) (round \([0-9]*\)).*/\1/p' | head -n 1)
  [ -n "$s" ] || fail "rank $r did not resume in the restart round: $(echo "$err" | tail -n 5)"
  (( s >= 20 && s <= 30 )) || fail "rank $r resumed from step $s, expected 20..30"
  log "rank $r: $(echo "$err" | grep -o 'resumed from step.*')"
  out=$(rank_section "$T/coord/jobs/$job/rank-$r.stdout")
  first=$(echo "$out" | sed -n 's/^{"rank":[0-9]*,"step":\([0-9]*\),.*/\1/p' | head -n 1)
  [ "$first" = $((s + 1)) ] || fail "rank $r's first step after resuming from $s is '$first'"
  grep -q "\"rank\":$r,\"step\":60," <<<"$out" || fail "rank $r did not reach step 60"
  steps+=("$s")
done
[ "${steps[0]}" = "${steps[1]}" ] || fail "ranks resumed from different steps: ${steps[*]}"
# The restarted round claimed the dir as it restored: round 1's saves are
# refused from then on.
[ "$(cat "$T/ckpt/lockstep-round")" = "$job 2" ] || fail "the resumed dir's round fence: $(cat "$T/ckpt/lockstep-round")"

sums=$(checksums "$job")
log "resumed run checksums: $(echo $sums)"
[ "$(echo "$sums" | wc -l)" = 2 ] || fail "expected 2 checksum lines, got: $sums"
[ "$sums" = "$ref_sums" ] || fail "resumed run ended with $(echo $sums), the uninterrupted one with $(echo $ref_sums)"
# And bit for bit (--dump-params: every parameter as float32).
for r in 0 1; do
  cmp -s "$T/ref-params.$r" "$T/resumed-params.$r" ||
    fail "rank $r's final parameters differ from the uninterrupted run's (cmp $T/ref-params.$r $T/resumed-params.$r)"
done
check_invariants "$job" 1
log "PASS: resumed from step ${steps[0]}; checksums equal the uninterrupted run's ($(echo "$ref_sums" | head -n 1))"
