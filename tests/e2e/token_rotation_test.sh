#!/usr/bin/env bash
# Tokens rotate without a restart (daemon/README.md, Rotating tokens), by
# the commands the README gives: a new token goes first in a token file,
# the old one stays after it until every holder has the new one, then goes.
# With a coordinator (+ its agent), an agent-only daemon holding its own
# copy of agent.token, and a 2-node job running all along:
#   - admin: the new token works at once after the daemon sees the file
#     change (no signal), the old one until it is dropped, then is refused;
#   - agent: rotated at the coordinator, copied to the agent, the old one
#     dropped: the agent stays alive past several leases;
#   - viewer, with SIGHUP: the new one gets log tickets for nodeb's logs
#     (agents never see a token), the old one none once dropped;
#   - a token file emptied by mistake keeps the tokens in use, logged;
#   - the job runs through all of it (it trains until the test creates its
#     stop file): still RUNNING with no restart after the last rotation, its
#     ranks' progress still reaching the coordinator, then SUCCEEDED (its
#     store token is keyed by store.key, not by the admin token:
#     daemon:roles_test).
LEASE_S=3
source tests/e2e/lib.sh "$@"

start_coordinator
cp "$T/coord/agent.token" "$T/nodeb.token" && chmod 600 "$T/nodeb.token"
start_daemon nodeb --listen 127.0.0.1:0 --coordinator-address "$COORD" --token-file "$T/nodeb.token"
job=$(submit --nodes 2 --nproc-per-node 1 --max-restarts 0 --env TRAINER_STEPS=100000 --env TRAINER_STEP_MS=100 \
  --env TRAINER_UNTIL_FILE="$T/stop-training")
wait_state "$job" RUNNING 30

# rotate FILE [NEW...]: writes the tokens given, one per line, as a new
# file renamed over FILE (umask 077: mode 0600 from the start), as
# daemon/README.md's commands do.
rotate() {
  local file=$1; shift
  (umask 077; printf '%s\n' "$@" > "$file.new") && mv "$file.new" "$file"
}
with_token() {  # TOKEN CLI-ARGS...: the CLI presenting TOKEN
  local f="$T/cli-$RANDOM.token"
  printf '%s\n' "$1" > "$f" && chmod 600 "$f"; shift
  "$LOCKSTEP" --coordinator "$COORD" --token-file "$f" "$@"
}
# answers WANT TOKEN CLI-ARGS...: the call fails saying WANT (polled: a
# daemon sees a changed file within kTokenCheckInterval, 5 s).
answers() { local want=$1; shift; ! with_token "$@" > "$T/answer" 2>&1 && grep -q "$want" "$T/answer"; }
works() { with_token "$@" > /dev/null; }
WRONG="wrong bearer token"

log "admin: the new token first, the old one kept; seen without a signal"
old_admin=$(head -n 1 "$T/coord/token")
new_admin=$(openssl rand -hex 32)
rotate "$T/coord/token" "$new_admin" "$old_admin"
wait_for 20 works "$new_admin" nodes || fail "the new admin token does not work: $(cat "$T/answer")"
grep -q "tokens re-read (a file changed)" "$T/coord.log" || fail "no re-read logged"
works "$old_admin" nodes || fail "the old admin token stopped working too early"

log "agent: new at the coordinator, copied to the agent, old dropped"
old_agent=$(head -n 1 "$T/coord/agent.token")
new_agent=$(openssl rand -hex 32)
rotate "$T/coord/agent.token" "$new_agent" "$old_agent"
# Known as an agent token (which may not list nodes) once re-read.
wait_for 20 answers "an agent token cannot ListNodes" "$new_agent" nodes ||
  fail "the new agent token is not admitted: $(cat "$T/answer")"
rotate "$T/nodeb.token" "$new_agent"
wait_for 20 grep -q "tokens re-read (a file changed)" "$T/nodeb.log" || fail "nodeb did not re-read its token"
rotate "$T/coord/agent.token" "$new_agent"
wait_for 20 answers "$WRONG" "$old_agent" nodes || fail "the dropped agent token still works"
# Alive two leases later on the new token alone (a refused heartbeat
# would have had it declared dead after one).
deadline=$((SECONDS + 2 * LEASE_S + 1))
while ((SECONDS < deadline)); do
  nodes=$(ls_cli nodes)
  grep -q "^nodeb .* yes " <<<"$nodes" || fail "nodeb is not alive: $nodes"
  sleep 0.5
done

log "viewer, with SIGHUP: the new one reads nodeb's logs (by ticket), then not the old"
old_viewer=$(head -n 1 "$T/coord/viewer.token")
new_viewer=$(openssl rand -hex 32)
rotate "$T/coord/viewer.token" "$new_viewer" "$old_viewer"
kill -HUP "$PID_coord"
wait_for 20 grep -q "tokens re-read (SIGHUP)" "$T/coord.log" || fail "SIGHUP did not re-read the tokens"
rank_on_b=$(job_field "$job" '[w["rank"] for w in j["workers"] if w["node_id"] == "nodeb"][0]')
wait_for 20 works "$new_viewer" logs "$job" --rank "$rank_on_b" ||
  fail "the new viewer token does not read nodeb's logs: $(cat "$T/answer")"
rotate "$T/coord/viewer.token" "$new_viewer"
kill -HUP "$PID_coord"
wait_for 20 answers "$WRONG" "$old_viewer" list || fail "the coordinator still admits the old viewer token"
wait_for 20 answers "PERMISSION_DENIED\|UNAUTHENTICATED" "$old_viewer" logs "$job" --rank "$rank_on_b" ||
  fail "the dropped viewer token still reads nodeb's logs: $(cat "$T/answer")"

log "admin: the old token dropped"
rotate "$T/coord/token" "$new_admin"
wait_for 20 answers "$WRONG" "$old_admin" nodes || fail "the dropped admin token still works"
ls_cli nodes > /dev/null || fail "the CLI's token file (new first) does not work"

log "a token file emptied by mistake: the tokens in use stay"
rotate "$T/coord/token" ""
wait_for 20 grep -q "tokens not re-read, the ones in use stay: .*token file $T/coord/token is empty" "$T/coord.log" ||
  fail "an empty token file was not reported"
works "$new_admin" nodes || fail "an empty token file took the admin token away"
rotate "$T/coord/token" "$new_admin"

state_is "$job" RUNNING || fail "the job did not run through the rotations: $(ls_cli status "$job")"
[ "$(job_field "$job" 'j["restart_count"]')" = 0 ] || fail "the job restarted during the rotations"
# Progress after the last rotation: both ranks' steps still reach the
# coordinator (agent -> coordinator on the rotated agent token).
steps_now() { job_field "$job" 'min(w["progress"]["step"] for w in j["workers"])'; }
before=$(steps_now)
moved() { (( $(steps_now) > before + 5 )); }
wait_for 20 moved || fail "no progress reported after the rotations (step $before, now $(steps_now))"
touch "$T/stop-training"
wait_state "$job" SUCCEEDED 60
[ "$(job_field "$job" 'j["restart_count"]')" = 0 ] || fail "the job restarted during the rotations"
check_invariants "$job" 0
log "PASS"
