#!/usr/bin/env bash
# Roles (daemon/roles.h): separate admin, viewer and agent tokens, deny by
# default. The agent on nodeb registers with the agent token (start_agent);
# a viewer token reads status, lists, nodes and logs (from both agents) but
# its cancel is refused with a clear error and the job keeps running; the
# agent token cannot submit or read; a worker's store token opens no
# control RPC; the admin token does everything.
source tests/e2e/lib.sh "$@"

start_coordinator
start_agent nodeb
VIEWER="$T/coord/viewer.token"
AGENT="$T/coord/agent.token"
for f in "$TOKEN" "$VIEWER" "$AGENT"; do
  [ "$(stat -c %a "$f")" = 600 ] || fail "$f is mode $(stat -c %a "$f"), want 600"
done
[ "$(sort -u "$TOKEN" "$VIEWER" "$AGENT" | wc -l)" = 3 ] || fail "the three role tokens are not distinct"
grep -q "tokens: admin $TOKEN, viewer $VIEWER, agent $AGENT" "$T/coord.log" ||
  fail "the coordinator does not log where each role's token is: $(grep -m3 token "$T/coord.log")"
view() { "$LOCKSTEP" --coordinator "$COORD" --token-file "$VIEWER" "$@"; }
as_agent() { "$LOCKSTEP" --coordinator "$COORD" --token-file "$AGENT" "$@"; }

# expect_refused CODE WANT CMD...: CMD exits 1 and says CODE and WANT on
# stderr.
expect_refused() {
  local code=$1 want=$2; shift 2
  local rc=0 err
  err=$("$@" 2>&1 >/dev/null) || rc=$?
  [ "$rc" = 1 ] || fail "$* exited $rc, not 1: $err"
  grep -qF -- "$code: " <<<"$err" || fail "$*: error is not $code: $err"
  grep -qF -- "$want" <<<"$err" || fail "$*: error does not say '$want': $err"
  log "ok: refused: $* -> $err"
}

# Admin: submit a 2-node job; nodeb's agent (agent token) runs one rank.
job=$(submit --nodes 2 --nproc-per-node 1 --env TRAINER_STEPS=100000)
wait_state "$job" RUNNING 30
stepped() { grep -qs "^rank $1 step 1 " "$T"/*/jobs/"$job"/rank-"$1".stdout; }
wait_for 30 stepped 0 || fail "rank 0 never stepped"
wait_for 30 stepped 1 || fail "rank 1 never stepped"
[ "$(ls_cli nodes --json | python3 -c 'import json,sys; print(sorted(n["node_id"] for n in json.load(sys.stdin)["nodes"]))')" = "['coord', 'nodeb']" ] ||
  fail "nodeb did not register with the agent token: $(ls_cli nodes)"

# Viewer: reads.
grep -q "$job" <<<"$(view list --json)" || fail "viewer: list does not show $job"
[ "$(view status --json "$job" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')" = RUNNING ] ||
  fail "viewer: status of $job"
view nodes >/dev/null || fail "viewer: nodes"
for r in 0 1; do
  # Not piped into grep -q: 200 lines are more than one pipe write, and a
  # CLI still writing when grep has matched dies of SIGPIPE (pipefail).
  grep -q "^rank $r step " <<<"$(view logs "$job" --rank "$r" --tail 200)" || fail "viewer: logs of rank $r"
done
log "viewer: list, status, nodes and the logs of both ranks (both agents) work"

# Viewer: writes are refused, clearly, and change nothing.
expect_refused PERMISSION_DENIED "a viewer token cannot CancelJob (needs admin)" view cancel "$job"
expect_refused PERMISSION_DENIED "a viewer token cannot SubmitJob (needs admin)" view submit -- /bin/true
expect_refused PERMISSION_DENIED "a viewer token cannot DeleteJob (needs admin)" view delete "$job"
state_is "$job" RUNNING || fail "job $job is $(job_state "$job") after the viewer's refused cancel"
[ "$(worker_pids | wc -l)" = 2 ] || fail "workers changed after the refused cancel: $(describe_workers)"

# Agent token: registers and heartbeats only.
expect_refused PERMISSION_DENIED "an agent token cannot SubmitJob (needs admin)" as_agent submit -- /bin/true
expect_refused PERMISSION_DENIED "an agent token cannot ListJobs (needs admin or viewer)" as_agent list
expect_refused PERMISSION_DENIED "an agent token cannot CancelJob (needs admin)" as_agent cancel "$job"

# Worker: the job's store token opens no control RPC.
python3 -c 'import hmac,hashlib,sys; print(hmac.new(sys.argv[1].encode(), sys.argv[2].encode(), hashlib.sha256).hexdigest())' \
  "$(cat "$(dirname "$TOKEN")/store.key")" "$job" >"$T/store-token"
chmod 600 "$T/store-token"
expect_refused UNAUTHENTICATED "wrong bearer token" "$LOCKSTEP" --coordinator "$COORD" --token-file "$T/store-token" list
expect_refused UNAUTHENTICATED "wrong bearer token" "$LOCKSTEP" --coordinator "$COORD" --token-file "$T/store-token" cancel "$job"
[ "$(ls_cli list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("jobs", [])))')" = 1 ] ||
  fail "a refused submit created a job"

# Admin: cancel works.
ls_cli cancel "$job" >/dev/null || fail "admin cancel failed"
state_is "$job" CANCELLED || fail "job $job is $(job_state "$job") after the admin's cancel"
wait_for 15 no_workers || fail "workers left after cancel: $(describe_workers)"
log "PASS"
