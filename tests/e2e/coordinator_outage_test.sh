#!/usr/bin/env bash
# A dedicated coordinator (--no-agent) that is down for 20 s costs no
# training restart: a real DDP job (2 nodes x 1 worker, //examples:train)
# keeps its round and restart count 0 and succeeds, once with the
# coordinator killed (-9) and restarted on the same address after 20 s, once
# with it stopped (SIGSTOP) for 20 s. The agents hold their workers for a
# whole lease without renewal (45 s by default: daemon/README.md, "Leases
# and fencing"); the restarted coordinator gives every node a full lease
# from its reload, the resumed one does not count the time it was stopped.
LEASE_S=45
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"
OUTAGE_S="${5:-20}"

start_daemon coord --coordinator --no-agent --listen 127.0.0.1:0
COORD="$ADDR_coord"
TOKEN="$T/coord/token"
start_agent nodea
start_agent nodeb

job_id_of() { python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])'; }

# run_through OUTAGE: submits a job long enough to outlast the outage,
# applies OUTAGE ("kill" or "stop") once it trains, checks the outcome.
run_through() {
  local outage=$1 steps=$(( (OUTAGE_S + 12) * 20 ))
  job=$(ls_cli submit --detach --json --nodes 2 --nproc-per-node 1 --max-restarts 2 -- \
    "$TRAIN" --model mlp_small --steps "$steps" --step-delay-ms 50 --timeout-s 60 |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
  wait_state "$job" RUNNING 60
  wait_for 60 grep -q '"rank":1,"step":5,' "$T/nodeb/jobs/$job/rank-1.stdout" || fail "rank 1 never reached step 5"
  if [ "$outage" = kill ]; then
    log "kill -9 the coordinator (pid $PID_coord) for ${OUTAGE_S}s"
    kill -9 "$PID_coord"
    sleep "$OUTAGE_S"
    start_daemon coord --coordinator --no-agent --listen "$COORD"
  else
    log "SIGSTOP the coordinator (pid $PID_coord) for ${OUTAGE_S}s"
    kill -STOP "$PID_coord"
    local stopped_at rc=0 err rest
    stopped_at=$(date +%s)
    # A submit meanwhile times out (10 s) saying how to retry it safely.
    err=$(ls_cli submit --detach --json --nodes 1 -- /bin/true 2>&1 >/dev/null) || rc=$?
    [ "$rc" = 1 ] && grep -q "DEADLINE_EXCEEDED.*may or may not have been accepted" <<<"$err" ||
      { kill -CONT "$PID_coord"; fail "a submit to the stopped coordinator: rc $rc: $err"; }
    retry_id=$(sed -n 's/.*--request-id \([^ ]*\) submits it at most once.*/\1/p' <<<"$err")
    [ -n "$retry_id" ] || { kill -CONT "$PID_coord"; fail "no request id to retry with: $err"; }
    # The rest of the outage; none left when the submit's timeout used it up.
    rest=$(( OUTAGE_S - ($(date +%s) - stopped_at) ))
    if (( rest > 0 )); then sleep "$rest"; fi
    kill -CONT "$PID_coord"
  fi
  # Training went on through the outage.
  last=$(grep -c '"rank":1,"step":' "$T/nodeb/jobs/$job/rank-1.stdout")
  (( last > OUTAGE_S * 10 )) || fail "rank 1 made only $last steps through the outage"
  wait_state "$job" SUCCEEDED 120
  [ "$(job_field "$job" '(j["round"], j.get("restart_count", 0))')" = "(1, 0)" ] ||
    fail "after the $outage outage: (round, restarts) = $(job_field "$job" '(j["round"], j.get("restart_count", 0))'), not (1, 0)"
  grep -q "stopped this node's workers" "$T/nodea.log" "$T/nodeb.log" && fail "an agent fenced during the outage"
  check_invariants "$job" 0
  if [ "$outage" = stop ]; then
    # Retried twice with the printed request id: one job, whether or not the
    # timed-out request had reached the coordinator.
    local a b
    a=$(ls_cli submit --detach --json --request-id "$retry_id" --nodes 1 -- /bin/true | job_id_of)
    b=$(ls_cli submit --detach --json --request-id "$retry_id" --nodes 1 -- /bin/true | job_id_of)
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "the retried submit made jobs '$a' and '$b'"
    [ "$(ls_cli list --json | python3 -c 'import json,sys; print(sum(1 for j in json.load(sys.stdin).get("jobs", []) if j.get("request_id") == sys.argv[1]))' "$retry_id")" = 1 ] ||
      fail "more than one job for request $retry_id: $(ls_cli list)"
    log "stop: a submit that timed out, retried with $retry_id, made one job ($a)"
  fi
  log "$outage: round 1, 0 restarts, SUCCEEDED"
}
run_through kill
run_through stop
log "PASS"
