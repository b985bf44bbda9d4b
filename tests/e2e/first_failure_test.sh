#!/usr/bin/env bash
# The first failure is the one that happened first. kill -9 of rank 1 of a
# real DDP job (1 node x 2 workers, no restart budget) makes its peer rank 0
# fail a moment later (its collective breaks); both exits can reach the
# coordinator in one heartbeat. Over the backend given (gloo or shm), TRIALS
# times (default 10): the job FAILED, `status` names rank 1 killed by
# signal 9 as the failure, and rank 0, if it failed on its own, is listed
# only as a consequence ("after rank 1 failed"); neither is a startup
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
  echo "$text" | grep -q "^failure: .* rank 1 on node coord killed by signal 9" ||
    fail "trial $trial: status does not name rank 1, signal 9: $text"
  # Rank 0 may have failed on its own (a consequence) or been stopped.
  if echo "$text" | grep -q "^then: .*rank 0 .*after rank 1 failed"; then consequences=$((consequences + 1)); fi
  if echo "$text" | grep -q "^then: *rank 1 on "; then fail "trial $trial: rank 1 listed as a consequence: $text"; fi
  if echo "$text" | grep -q "startup failure"; then fail "trial $trial: a rank that trained was called a startup failure: $text"; fi
  wait_for 15 no_workers || fail "trial $trial: workers left: $(describe_workers)
$text"
  log "trial $trial: rank 1, signal 9"
done
job=$(ls_cli submit --detach --json --nodes 1 --nproc-per-node 2 --max-restarts 0 --env LOCKSTEP_BACKEND=bogus -- \
  "$TRAIN" --model mlp_small --steps 10 |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$job" FAILED 60
text=$(ls_cli status "$job")
grep -qF "(startup failure: died in the engine's bootstrap)" <<<"$text" ||
  fail "a worker that died in the engine's bootstrap is not a startup failure: $text"
log "PASS: $TRIALS of $TRIALS trials named rank 1, signal 9 ($consequences listed rank 0 as a consequence)"
