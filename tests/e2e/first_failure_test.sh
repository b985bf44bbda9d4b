#!/usr/bin/env bash
# The first failure is the one that happened first. kill -9 of rank 1 of a
# real DDP job (1 node x 2 workers, no restart budget) makes its peer rank 0
# fail a moment later (its collective breaks); both exits can reach the
# coordinator in one heartbeat. Over the backend given (gloo or shm), TRIALS
# times (default 10): the job FAILED, `status` names rank 1 killed by
# signal 9 as the failure, and rank 0, if it failed on its own, is listed
# only as a consequence ("after rank 1 failed"); neither is a startup
# failure (both finished the engine's bootstrap). No worker is left behind.
# Rank 0's agent usually stops it within its engine's grace (the 5 s it
# waits for the other ranks to say why), so then a second part makes rank 0
# fail on its own every time: 2 nodes x 1 rank, rank 0's agent frozen
# (SIGSTOP) from before the kill until rank 0 has exited. Its exit must be
# listed as a consequence of rank 1's, saying its collective lost a peer
# (the engine's mark on its status slot), 3 times out of 3.
# Last, a job whose engine bootstrap fails (an unknown backend) is FAILED as
# a startup failure.
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"
BACKEND="$5"
TRIALS="${6:-10}"
backend_args "$BACKEND"

# Agents only (the coordinator runs none), so that freezing rank 0's agent
# below leaves the coordinator and its store answering.
start_daemon coord --coordinator --no-agent --listen 127.0.0.1:0
COORD="$ADDR_coord"
TOKEN="$T/coord/token"
start_agent a
consequences=0
for trial in $(seq "$TRIALS"); do
  job=$(ls_cli submit --detach --json --nodes 1 --nproc-per-node 2 --max-restarts 0 "${env_args[@]}" -- \
    "$TRAIN" --model mlp_small --steps 100000 --step-delay-ms 20 --timeout-s 30 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
  wait_for 60 grep -q '"rank":1,"step":3,' "$T/a/jobs/$job/rank-1.stdout" ||
    fail "trial $trial: rank 1 of $job never reached step 3"
  victim=$(job_field "$job" '[w["pid"] for w in j["workers"] if w.get("rank", 0) == 1][0]')
  kill -9 "$victim" || fail "trial $trial: rank 1 (pid $victim) was gone before the kill: $(ls_cli status "$job")"
  wait_state "$job" FAILED 60
  first=$(job_field "$job" '"%s %s" % (j["first_failure"].get("rank", 0), j["first_failure"]["exit"].get("signal", 0))')
  [ "$first" = "1 9" ] || { ls_cli status "$job"; fail "trial $trial: first failure is '$first' (rank signal), not rank 1 signal 9"; }
  text=$(ls_cli status "$job")
  grep -q "^failure: .* rank 1 on node a killed by signal 9" <<<"$text" ||
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
# Two nodes, one rank each; rank 0's agent frozen from before the kill of
# rank 1 until rank 0 has exited, so that nothing but its own engine can end
# it. --timeout-s 10: the engine's grace is then 2 s (a fifth), well inside
# the node's lease (LEASE_S 6: the agent is frozen for about 3 s).
start_agent b
for trial in 1 2 3; do
  job=$(ls_cli submit --detach --json --nodes 2 --nproc-per-node 1 --max-restarts 0 "${env_args[@]}" -- \
    "$TRAIN" --model mlp_small --steps 100000 --step-delay-ms 20 --timeout-s 10 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
  reached() { grep -qs '"rank":1,"step":3,' "$T"/*/jobs/"$job"/rank-1.stdout; }
  wait_for 60 reached || fail "2 nodes, trial $trial: rank 1 of $job never reached step 3"
  # Rank 0's node and pid, rank 1's pid.
  read -r node0 pid0 victim < <(job_field "$job" \
    '(lambda r: "%s %s %s" % (r[0]["node_id"], r[0]["pid"], r[1]["pid"]))({w.get("rank", 0): w for w in j["workers"]})')
  [ -n "${victim:-}" ] || fail "2 nodes, trial $trial: no rank 0 and rank 1 in $(ls_cli status "$job")"
  agent0=$(eval echo "\$PID_$node0")
  kill -STOP "$agent0"
  kill -9 "$victim" || { kill -CONT "$agent0"; fail "2 nodes, trial $trial: rank 1 (pid $victim) was gone before the kill"; }
  frozen_at=$(date +%s%N)
  if ! wait_for 15 exited "$pid0"; then
    kill -CONT "$agent0"
    fail "2 nodes, trial $trial: rank 0 (pid $pid0, node $node0) did not give up on its own within 15 s of losing rank 1"
  fi
  gave_up_ms=$(( ($(date +%s%N) - frozen_at) / 1000000 ))
  kill -CONT "$agent0"
  wait_state "$job" FAILED 60
  text=$(ls_cli status "$job")
  grep -q "^failure: .* rank 1 on node .* killed by signal 9" <<<"$text" ||
    fail "2 nodes, trial $trial: status does not name rank 1, signal 9: $text"
  grep -q "^then: .*rank 0 .*(its collective lost a peer), after rank 1 failed" <<<"$text" ||
    fail "2 nodes, trial $trial: rank 0 gave up on its own but is not listed as a consequence that lost a peer: $text"
  if grep -q "startup failure" <<<"$text"; then fail "2 nodes, trial $trial: a rank that trained was called a startup failure: $text"; fi
  wait_for 15 no_workers || fail "2 nodes, trial $trial: workers left: $(describe_workers)"
  log "2 nodes, trial $trial: rank 1, signal 9; rank 0 (node $node0) gave up on its own ${gave_up_ms} ms later, a consequence"
done

job=$(ls_cli submit --detach --json --nodes 1 --nproc-per-node 2 --max-restarts 0 --env LOCKSTEP_BACKEND=bogus -- \
  "$TRAIN" --model mlp_small --steps 10 |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$job" FAILED 60
text=$(ls_cli status "$job")
grep -qF "(startup failure: died in the engine's bootstrap)" <<<"$text" ||
  fail "a worker that died in the engine's bootstrap is not a startup failure: $text"
log "PASS: $TRIALS of $TRIALS trials named rank 1, signal 9 ($consequences listed rank 0 as a consequence); 3 of 3 with rank 0 failing on its own listed it as a consequence that lost a peer"
