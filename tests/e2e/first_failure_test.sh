#!/usr/bin/env bash
# The first failure is the one that happened first. kill -9 of rank 1 of a
# real DDP job (1 node x 2 workers, no restart budget) makes its peer rank 0
# fail a moment later (its collective breaks); both exits can reach the
# coordinator in one heartbeat. Over the backend given (gloo or shm), TRIALS
# times (default 10): the job FAILED, `status` names rank 1 killed by
# signal 9 as the failure, and rank 0, if it failed on its own, is listed
# only as a consequence ("after rank 1 failed"), its engine having said that
# its collective lost a peer; neither is a startup
# failure (both finished the engine's bootstrap). No worker is left behind.
# Last, a job whose engine bootstrap fails (an unknown backend) is FAILED as
# a startup failure.
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"
BACKEND="$5"
TRIALS="${6:-10}"
backend_args "$BACKEND"

start_coordinator
consequences=0
for trial in $(seq "$TRIALS"); do
  job=$(ls_cli submit --detach --json --nodes 1 --nproc-per-node 2 --max-restarts 0 "${env_args[@]}" -- \
    "$TRAIN" --model mlp_small --steps 100000 --step-delay-ms 20 --timeout-s 30 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
  wait_for 60 grep -q '"rank":1,"step":3,' "$T/coord/jobs/$job/rank-1.stdout" ||
    fail "trial $trial: rank 1 of $job never reached step 3"
  victim=$(job_field "$job" '[w["pid"] for w in j["workers"] if w.get("rank", 0) == 1][0]')
  kill -9 "$victim" || fail "trial $trial: rank 1 (pid $victim) was gone before the kill: $(ls_cli status "$job")"
  wait_state "$job" FAILED 60
  first=$(job_field "$job" '"%s %s" % (j["first_failure"].get("rank", 0), j["first_failure"]["exit"].get("signal", 0))')
  [ "$first" = "1 9" ] || { ls_cli status "$job"; fail "trial $trial: first failure is '$first' (rank signal), not rank 1 signal 9"; }
  text=$(ls_cli status "$job")
  grep -q "^failure: .* rank 1 on node coord killed by signal 9" <<<"$text" ||
    fail "trial $trial: status does not name rank 1, signal 9: $text"
  # Rank 0 may have failed on its own (a consequence) or been stopped.
  if grep -q "^then: .*rank 0 .*after rank 1 failed" <<<"$text"; then
    consequences=$((consequences + 1))
    # Rank 0 gave up on its own: its engine said why (the status slot), so
    # the coordinator knows it followed rank 1 whatever the clocks said.
    if grep -q "^then: .*rank 0 .* exit code" <<<"$text"; then
      grep -q "^then: .*rank 0 .*(its collective lost a peer)" <<<"$text" ||
        fail "trial $trial: rank 0 failed after rank 1 without saying it lost a peer: $text"
    fi
  fi
  if grep -q "^then: *rank 1 on " <<<"$text"; then fail "trial $trial: rank 1 listed as a consequence: $text"; fi
  if grep -q "startup failure" <<<"$text"; then fail "trial $trial: a rank that trained was called a startup failure: $text"; fi
  wait_for 15 no_workers || fail "trial $trial: workers left: $(describe_workers)
$text"
  log "trial $trial: rank 1, signal 9"
done
# Two nodes, one rank each: rank 0's agent learns of rank 1's death only
# from the coordinator, so rank 0's engine usually gives up first, on its
# own. Its exit must still be a consequence, and say its collective lost a
# peer (the engine's mark on its status slot, read by its agent).
start_agent b
lost=0
for trial in 1 2 3; do
  job=$(ls_cli submit --detach --json --nodes 2 --nproc-per-node 1 --max-restarts 0 "${env_args[@]}" -- \
    "$TRAIN" --model mlp_small --steps 100000 --step-delay-ms 20 --timeout-s 30 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
  reached() { grep -qs '"rank":1,"step":3,' "$T"/*/jobs/"$job"/rank-1.stdout; }
  wait_for 60 reached || fail "2 nodes, trial $trial: rank 1 of $job never reached step 3"
  victim=$(job_field "$job" '[w["pid"] for w in j["workers"] if w.get("rank", 0) == 1][0]')
  kill -9 "$victim" || fail "2 nodes, trial $trial: rank 1 (pid $victim) was gone before the kill"
  wait_state "$job" FAILED 60
  text=$(ls_cli status "$job")
  grep -q "^failure: .* rank 1 on node .* killed by signal 9" <<<"$text" ||
    fail "2 nodes, trial $trial: status does not name rank 1, signal 9: $text"
  if grep -q "^then: .*rank 0 .* exit code" <<<"$text"; then
    grep -q "^then: .*rank 0 .*(its collective lost a peer), after rank 1 failed" <<<"$text" ||
      fail "2 nodes, trial $trial: rank 0 failed after rank 1 without saying it lost a peer: $text"
    lost=$((lost + 1))
  fi
  wait_for 15 no_workers || fail "2 nodes, trial $trial: workers left: $(describe_workers)"
  log "2 nodes, trial $trial: rank 1, signal 9"
done
log "2 nodes: rank 0 gave up on its own, saying it lost a peer, in $lost of 3 trials"

job=$(ls_cli submit --detach --json --nodes 1 --nproc-per-node 2 --max-restarts 0 --env LOCKSTEP_BACKEND=bogus -- \
  "$TRAIN" --model mlp_small --steps 10 |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$job" FAILED 60
text=$(ls_cli status "$job")
grep -qF "(startup failure: died in the engine's bootstrap)" <<<"$text" ||
  fail "a worker that died in the engine's bootstrap is not a startup failure: $text"
log "PASS: $TRIALS of $TRIALS trials named rank 1, signal 9 ($consequences listed rank 0 as a consequence)"
