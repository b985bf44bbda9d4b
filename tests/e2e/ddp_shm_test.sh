#!/usr/bin/env bash
# The DDP example trainer under lockstepd with `--env LOCKSTEP_BACKEND=shm`
# on 2 nodes x 2 workers: each node's workers reduce through their own
# shared-memory segment and the two nodes' local rank 0s over Gloo
# (shm+gloo). The job succeeds with identical parameters on all 4 ranks; a
# worker killed mid-run is noticed by its node peers through its pid, the
# job restarts once and succeeds; nothing is left in /dev/shm.
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"

shm_before=$(ls /dev/shm | grep -c '^lockstep-' || true)
start_coordinator
start_agent nodeb
out=$(ls_cli submit --nodes 2 --nproc-per-node 2 --max-restarts 1 --env LOCKSTEP_BACKEND=shm \
  --wait -- "$TRAIN" --model mlp_small --steps 10 --timeout-s 60) ||
  fail "shm DDP job did not succeed: $out"
echo "$out"
job=$(echo "$out" | sed -n 's/^submitted job //p')
grep -q "connected shm+gloo communicator of 4 ranks" "$T/coord/jobs/$job/rank-0.stderr" ||
  fail "rank 0 did not use shm+gloo: $(tail -n 5 "$T/coord/jobs/$job/rank-0.stderr")"
sums=$(for r in 0 1 2 3; do
  ls_cli logs "$job" --rank "$r" | sed -n 's/.*"checksum":\([^,]*\),"abs_checksum":\([^,]*\),.*/\1 \2/p'
done)
[ "$(echo "$sums" | wc -l)" = 4 ] || fail "expected 4 checksum lines, got: $sums"
[ "$(echo "$sums" | sort -u | wc -l)" = 1 ] || fail "ranks ended with different parameters: $sums"
check_invariants "$job" 1

# kill -9 of rank 1 (node a, local rank 1) mid-run.
job=$(ls_cli submit --json --nodes 2 --nproc-per-node 2 --max-restarts 1 \
  --env LOCKSTEP_BACKEND=shm -- \
  "$TRAIN" --model mlp_small --steps 100 --step-delay-ms 50 --timeout-s 60 |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$job" RUNNING 60
wait_for 60 grep -q '"rank":1,"step":5,' "$T/coord/jobs/$job/rank-1.stdout" || fail "rank 1 never reached step 5"
victim=$(job_field "$job" '[w["pid"] for w in j["workers"] if w.get("rank", 0)==1][0]')
log "kill -9 DDP rank 1 (pid $victim)"
kill -9 "$victim" || fail "rank 1 (pid $victim) was gone before the kill"
wait_state "$job" SUCCEEDED 120
[ "$(job_field "$job" 'j["restart_count"]')" = 1 ] || fail "expected one restart"
grep -q '"rank":3,"step":100,' "$T/nodeb/jobs/$job/rank-3.stdout" || fail "rank 3 did not finish round 2"
check_invariants "$job" 1
shm_after=$(ls /dev/shm | grep -c '^lockstep-' || true)
[ "$shm_after" -le "$shm_before" ] || fail "segments left in /dev/shm: $(ls /dev/shm | grep '^lockstep-')"
log "PASS"
