#!/usr/bin/env bash
# Bad input gets a clear error, a non-zero exit, and changes nothing.
source tests/e2e/lib.sh "$@"

start_coordinator

# expect_error PATTERN CMD...: CMD must fail and print PATTERN on stderr.
expect_error() {
  local pattern=$1; shift
  if "$@" >"$T/out.txt" 2>"$T/err.txt"; then fail "should have failed: $*"; fi
  grep -q -- "$pattern" "$T/err.txt" || fail "error for '$*' lacks '$pattern': $(cat "$T/err.txt")"
  log "ok: $* -> $(head -n1 "$T/err.txt")"
}

expect_error "spec.command: empty" ls_cli submit --nodes 1 --
expect_error "spec.nproc_per_node" ls_cli submit --nproc-per-node 0 -- /bin/true
expect_error "spec.nodes: min 3 > max 2" ls_cli submit --nodes 3:2 -- /bin/true
expect_error "spec.max_restarts" ls_cli submit --max-restarts -1 -- /bin/true
expect_error "\-\-nodes: expected N or MIN:MAX" ls_cli submit --nodes x -- /bin/true
expect_error "spec.run_as: workers never run as root" ls_cli submit --run-as root -- /bin/true
expect_error "NOT_FOUND: .*job j-nope not found" ls_cli status j-nope
expect_error "NOT_FOUND: .*job j-nope not found" ls_cli cancel j-nope
expect_error "NOT_FOUND: .*job j-nope not found" ls_cli logs j-nope --rank 0
expect_error "unknown command" ls_cli frobnicate

# Tokens: wrong, missing, too open.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$T/wrong-token"
chmod 600 "$T/wrong-token"
expect_error "UNAUTHENTICATED: .*wrong bearer token" "$LOCKSTEP" --coordinator "$COORD" --token-file "$T/wrong-token" list
expect_error "UNAUTHENTICATED: .*wrong bearer token" "$LOCKSTEP" --coordinator "$COORD" --token-file "$T/wrong-token" submit -- /bin/true
expect_error "token file .*missing" "$LOCKSTEP" --coordinator "$COORD" --token-file "$T/missing" list
cp "$T/wrong-token" "$T/open-token"; chmod 644 "$T/open-token"
expect_error "readable by group or others" "$LOCKSTEP" --coordinator "$COORD" --token-file "$T/open-token" list
expect_error "UNAVAILABLE" "$LOCKSTEP" --coordinator 127.0.0.1:1 --token-file "$TOKEN" list

# The store service on the same port wants a token too: a raw
# StoreService/Set without one, or with another job's store token, is
# refused; the admin token is accepted. Requests are hand-encoded (Debian's
# python3-grpcio ships no stubs).
raw_call() {  # raw_call METHOD TOKEN NAMESPACE
  /usr/bin/python3 - "$COORD" "$@" <<'PY'
import sys, grpc
addr, method, token, name = sys.argv[1:5]
n = name.encode()
# StoreSetRequest{namespace=1, key=2 "k", value=3 "v"}.
req = b"\x0a" + bytes([len(n)]) + n + b"\x12\x01k\x1a\x01v"
ch = grpc.insecure_channel(addr)
call = ch.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
md = [("authorization", "Bearer " + token)] if token else []
try:
    call(req, timeout=5, metadata=md)
except grpc.RpcError as e:
    print(e.code(), e.details(), file=sys.stderr)
    sys.exit(1)
PY
}
other_job_token=$(/usr/bin/python3 -c 'import hmac,hashlib,sys; print(hmac.new(sys.argv[1].encode(), b"j-other", hashlib.sha256).hexdigest())' "$(cat "$TOKEN")")
own_job_token=$(/usr/bin/python3 -c 'import hmac,hashlib,sys; print(hmac.new(sys.argv[1].encode(), b"j-mine", hashlib.sha256).hexdigest())' "$(cat "$TOKEN")")
expect_error "UNAUTHENTICATED.*store" raw_call /lockstep.v1.StoreService/Set "" j-mine/0
expect_error "PERMISSION_DENIED.*j-mine/0" raw_call /lockstep.v1.StoreService/Set "$other_job_token" j-mine/0
expect_error "PERMISSION_DENIED.*j-mine/0" raw_call /lockstep.v1.StoreService/Set "$(cat "$T/wrong-token")" j-mine/0
raw_call /lockstep.v1.StoreService/Set "$own_job_token" j-mine/0 || fail "the job's own store token was refused"
raw_call /lockstep.v1.StoreService/Set "$(cat "$TOKEN")" j-mine/0 || fail "the admin token was refused by the store"
log "ok: the store refuses calls without the right token"

# Nothing above created a job.
[ "$(ls_cli list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("jobs", [])))')" = 0 ] ||
  fail "a rejected request created a job"

# Logs: a rank that does not exist, a job id that is a path.
job=$(submit --nodes 1 --nproc-per-node 2 --env TRAINER_STEPS=2)
wait_state "$job" SUCCEEDED 30
expect_error "job $job has no rank 7 .*world size 2" ls_cli logs "$job" --rank 7
expect_error "job $job has no rank -1" ls_cli logs "$job" --rank -1
expect_error "job ../../etc not found" ls_cli logs ../../etc --rank 0
expect_error "not a valid job id" /usr/bin/python3 - "$ADDR_coord" "$(cat "$TOKEN")" <<'PY'
import sys, grpc
# ReadLogsRequest{job_id="../../etc", rank=0}: field 1 (string), hand-encoded.
jid = b"../../etc"
req = b"\x0a" + bytes([len(jid)]) + jid
ch = grpc.insecure_channel(sys.argv[1])
call = ch.unary_unary("/lockstep.v1.AgentService/ReadLogs",
                      request_serializer=lambda b: b, response_deserializer=lambda b: b)
try:
    call(req, timeout=5, metadata=[("authorization", "Bearer " + sys.argv[2])])
    sys.exit(0)
except grpc.RpcError as e:
    print(e.code(), e.details(), file=sys.stderr)
    sys.exit(1)
PY
[ "$(ls_cli list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["jobs"]))')" = 1 ] ||
  fail "expected exactly one job"

# A coordinator with an allowed-command list rejects anything else.
start_daemon strict --coordinator --no-agent --listen 127.0.0.1:0 --allowed-command "$TRAINER"
expect_error "PERMISSION_DENIED: .*not in the allowed list" \
  "$LOCKSTEP" --coordinator "$ADDR_strict" --token-file "$T/strict/token" submit -- /bin/sh -c true
"$LOCKSTEP" --coordinator "$ADDR_strict" --token-file "$T/strict/token" submit -- "$TRAINER" "$MARKER" >/dev/null ||
  fail "the allowed command was rejected"
log "PASS"
