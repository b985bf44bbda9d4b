#!/usr/bin/env bash
# The real DDP example trainer (//examples:train, bootstrapped through the
# coordinator's store) as a 2-node x 2-worker job under lockstepd, over the
# backend given as the 5th argument:
#   gloo  Gloo between all four ranks;
#   shm   `--env LOCKSTEP_BACKEND=shm`: each node's workers reduce through
#         their own shared-memory segment and the nodes' local rank 0s over
#         Gloo (shm+gloo): while it runs its four workers hold a segment
#         (lib.sh shm_holders), and after it no process of the test does.
# The job succeeds, `logs --rank 3` returns rank 3's own step lines, all
# ranks end with identical parameters; a worker killed mid-run costs one
# restart and the job still succeeds.
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"
BACKEND="$5"
backend_args "$BACKEND"

start_coordinator
start_agent nodeb
rc=0
out=$(timeout 180 "$LOCKSTEP" --coordinator "$COORD" --token-file "$TOKEN" submit --nodes 2 --nproc-per-node 2 \
  --max-restarts 1 "${env_args[@]}" --wait -- "$TRAIN" --model mlp_small --steps 10 --timeout-s 60) || rc=$?
[ "$rc" != 124 ] || fail "submit --wait of the DDP job did not return within 180 s: $out $(ls_cli list)"
[ "$rc" = 0 ] || fail "DDP job did not succeed (rc $rc): $out"
echo "$out"
job=$(echo "$out" | sed -n 's/^submitted job //p')
ls_cli status "$job"
grep -q "connected $communicator communicator of 4 ranks" "$T/coord/jobs/$job/rank-0.stderr" ||
  fail "rank 0 did not use $communicator: $(tail -n 5 "$T/coord/jobs/$job/rank-0.stderr")"
ls_cli logs "$job" --rank 3 >"$T/rank3.txt"
grep -q '"rank":3,"step":10' "$T/rank3.txt" || fail "rank 3's log lacks its step 10: $(tail -n 3 "$T/rank3.txt")"
if grep -q '"rank":[012],' "$T/rank3.txt"; then fail "rank 3's log has other ranks' lines"; fi
# Four processes averaged gradients every step: their final parameters are
# identical.
sums=$(for r in 0 1 2 3; do
  ls_cli logs "$job" --rank "$r" | sed -n 's/.*"checksum":\([^,]*\),"abs_checksum":\([^,]*\),.*/\1 \2/p'
done)
[ "$(echo "$sums" | wc -l)" = 4 ] || fail "expected 4 checksum lines, got: $sums"
[ "$(echo "$sums" | sort -u | wc -l)" = 1 ] || fail "ranks ended with different parameters: $sums"
check_invariants "$job" 1

# kill -9 of one DDP worker (rank 1: node a, local rank 1) mid-run: the
# surviving ranks (blocked in or about to enter a collective) are stopped by
# their agents, a new round rebuilds the communicator, and the job succeeds
# with one restart. The 50 ms pause per step keeps round 1 running for ~5 s
# after step 5, so the kill lands mid-run even on a fast machine (mlp_small
# steps take ~1 ms).
job=$(ls_cli submit --detach --json --nodes 2 --nproc-per-node 2 --max-restarts 1 "${env_args[@]}" -- \
  "$TRAIN" --model mlp_small --steps 100 --step-delay-ms 50 --timeout-s 60 |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$job" RUNNING 60
wait_for 60 grep -q '"rank":1,"step":5,' "$T/coord/jobs/$job/rank-1.stdout" || fail "rank 1 never reached step 5"
# Mid-run: over shm every worker holds its node's segment; over Gloo none.
expect_shm_holders "$BACKEND" 4
victim=$(job_field "$job" '[w["pid"] for w in j["workers"] if w.get("rank", 0)==1][0]')
log "kill -9 DDP rank 1 (pid $victim)"
kill -9 "$victim" || fail "rank 1 (pid $victim) was gone before the kill"
wait_state "$job" SUCCEEDED 120
[ "$(job_field "$job" 'j["restart_count"]')" = 1 ] || fail "expected one restart"
[ "$(job_field "$job" 'j["first_failure"]["exit"]["signal"]')" = 9 ] || { ls_cli status --json "$job"; fail "first failure should be signal 9"; }
grep -q '"rank":3,"step":100,' "$T/nodeb/jobs/$job/rank-3.stdout" || fail "rank 3 did not finish round 2"
check_invariants "$job" 1
wait_for 15 no_shm_holders || fail "shm segments still held after the job: $(shm_holders)"
log "PASS"
