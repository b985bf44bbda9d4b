#!/usr/bin/env bash
# The rank that froze is blamed, not the one that gave up on it, when the
# job runs shm inside each node and Gloo between them (LOCKSTEP_BACKEND=shm
# on two nodes: ddp/hierarchical_communicator.h). A real DDP job
# (//examples:train, 2 nodes x 2 workers, a 6 s collective timeout, no
# restart budget) has one rank stopped with SIGSTOP mid-training. Every
# other rank gives up, each in a different step of the collective: the
# frozen rank's host peer in the shared-memory step (waiting for it), the
# other node's leader between hosts (waiting for the frozen node's leader),
# its host peer in the result's broadcast (waiting for its own leader). The
# failure is the frozen rank, which "did not arrive", whichever of the three
# reported first, and each of them that exited before the job's stop reached
# it is a consequence. Three cases: rank 3
# (not a leader), rank 2 (nodeb's leader), rank 1 (on nodea, the other
# node). After each: no worker left, no process holding a segment.
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"
backend_args shm

start_daemon coord --coordinator --no-agent --listen 127.0.0.1:0
COORD="$ADDR_coord"
TOKEN="$T/coord/token"
start_agent nodea
start_agent nodeb

for frozen in 3 2 1; do
  job=$(ls_cli submit --detach --json --nodes 2 --nproc-per-node 2 --max-restarts 0 --stop-grace-s 1 \
    "${env_args[@]}" -- "$TRAIN" --model mlp_small --steps 100000 --step-delay-ms 20 --timeout-s 6 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
  wait_state "$job" RUNNING 60
  node=$(job_field "$job" "[w['node_id'] for w in j['workers'] if w.get('rank', 0) == $frozen][0]")
  wait_for 60 grep -q "\"rank\":$frozen,\"step\":5," "$T/$node/jobs/$job/rank-$frozen.stdout" ||
    fail "rank $frozen of $job never reached step 5"
  victim=$(job_field "$job" "[w['pid'] for w in j['workers'] if w.get('rank', 0) == $frozen][0]")
  log "SIGSTOP rank $frozen (pid $victim on $node)"
  kill -STOP "$victim"
  wait_state "$job" FAILED 90
  text=$(ls_cli status "$job")
  grep -q "^failure: *round 1: rank $frozen on node $node did not arrive: ranks\? [0-9, ]* gave up waiting for it" <<<"$text" ||
    fail "rank $frozen froze, and the failure is not rank $frozen not arriving: $text"
  # The ranks that gave up before the job's stop reached them: each a
  # consequence of the frozen rank, having lost a peer.
  then=$(grep "^then:" <<<"$text") || fail "no rank gave up on rank $frozen: $text"
  if grep -v "(its collective lost a peer), after rank $frozen failed$" <<<"$then"; then
    fail "a rank above is not a consequence of rank $frozen: $text"
  fi
  if grep -q "startup failure" <<<"$text"; then fail "a startup failure named: $text"; fi
  kill -CONT "$victim" 2>/dev/null || true
  wait_for 30 no_workers || fail "workers left: $(describe_workers)"
  wait_for 15 no_shm_holders || fail "shm segments still held: $(shm_holders)"
  log "rank $frozen frozen: $(grep '^failure:' <<<"$text")"
done
log "PASS: the frozen rank is the failure (ranks 3, 2 and 1 in turn), every other rank a consequence"
