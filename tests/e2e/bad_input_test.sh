#!/usr/bin/env bash
# Bad input gets a clear error, a non-zero exit, and changes nothing; the
# daemon logs each refusal (bad request, token or role) as one warning.
source tests/e2e/lib.sh "$@"

start_coordinator

# expect_error PATTERN CMD...: CMD must fail and print PATTERN on stderr.
expect_error() {
  local pattern=$1; shift
  if "$@" >"$T/out.txt" 2>"$T/err.txt"; then fail "should have failed: $*"; fi
  grep -q -- "$pattern" "$T/err.txt" || fail "error for '$*' lacks '$pattern': $(cat "$T/err.txt")"
  log "ok: $* -> $(head -n1 "$T/err.txt")"
}

# No command: the CLI says so before any RPC (the coordinator refuses such a
# spec too: daemon:coordinator_test).
expect_error "no command to run: expected -- CMD ARGS" ls_cli submit --name no-command --nodes 1 --
expect_error "spec.nproc_per_node" ls_cli submit --name bad-one --nproc-per-node 0 -- /bin/true
# A spec the coordinator refuses is a usage error, as the client's own checks are.
rc=0; ls_cli submit --nproc-per-node 0 -- /bin/true 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "a refused spec exited $rc, want 2 (usage)"
expect_error "spec.nodes: min 3 > max 2" ls_cli submit --nodes 3:2 -- /bin/true
expect_error "spec.max_restarts" ls_cli submit --max-restarts -1 -- /bin/true
expect_error "\-\-nodes: expected N or MIN:MAX" ls_cli submit --nodes x -- /bin/true
expect_error "spec.run_as: workers never run as root" ls_cli submit --run-as root -- /bin/true
rc=0; ls_cli submit --run-as 00 -- /bin/true 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "a spec refused with PERMISSION_DENIED (run_as uid 0) exited $rc, want 2 (usage)"
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

# A role that may not call an RPC: refused, naming the job.
expect_error "PERMISSION_DENIED: .*CancelJob" \
  "$LOCKSTEP" --coordinator "$COORD" --token-file "$(dirname "$TOKEN")/viewer.token" cancel j-abc

# expect_logged DAEMON REGEX: the daemon's log has a line matching REGEX.
expect_logged() {
  grep -Eq -- "$2" "$T/$1.log" || fail "$1's log lacks /$2/: $(grep refused "$T/$1.log")"
}
# Each refusal above is one warning in the coordinator's log naming the RPC,
# the caller's address, the job when there is one, and the reason.
peer='from ipv4:127\.0\.0\.1:[0-9]+'
# A refused submit has no job id: its line names the job's name and the
# submission's request id instead.
expect_logged coord "W \[coordinator\] job=- rank=- refused CoordinatorService/SubmitJob of job name \"bad-one\" \(request \"req-[0-9a-f]+\"\) $peer: INVALID_ARGUMENT: spec\.nproc_per_node"
expect_logged coord "W \[coordinator\] job=- rank=- refused CoordinatorService/ListJobs $peer: UNAUTHENTICATED: .*wrong bearer token"
expect_logged coord "W \[coordinator\] job=j-abc rank=- refused CoordinatorService/CancelJob $peer: PERMISSION_DENIED: .*viewer"
if grep -q "no-command" "$T/coord.log"; then fail "a submit without a command reached the coordinator"; fi
if grep -q "refused CoordinatorService/GetJob" "$T/coord.log"; then
  fail "a job that is not found is an answer, not a refusal: $(grep "refused CoordinatorService/GetJob" "$T/coord.log")"
fi
log "ok: refusals are logged by the coordinator"

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
# A job's store token: HMAC-SHA256 of its id keyed by the coordinator's store.key.
store_key=$(cat "$(dirname "$TOKEN")/store.key")
other_job_token=$(/usr/bin/python3 -c 'import hmac,hashlib,sys; print(hmac.new(sys.argv[1].encode(), b"j-other", hashlib.sha256).hexdigest())' "$store_key")
own_job_token=$(/usr/bin/python3 -c 'import hmac,hashlib,sys; print(hmac.new(sys.argv[1].encode(), b"j-mine", hashlib.sha256).hexdigest())' "$store_key")
expect_error "PERMISSION_DENIED.*j-mine/0" raw_call /lockstep.v1.StoreService/Set "$store_key" j-mine/0
expect_error "UNAUTHENTICATED.*store" raw_call /lockstep.v1.StoreService/Set "" j-mine/0
expect_error "PERMISSION_DENIED.*j-mine/0" raw_call /lockstep.v1.StoreService/Set "$other_job_token" j-mine/0
expect_error "PERMISSION_DENIED.*j-mine/0" raw_call /lockstep.v1.StoreService/Set "$(cat "$T/wrong-token")" j-mine/0
# A well-made token of a job that is not running (here: none by that id)
# opens nothing either (every job that runs shows its own token works).
expect_error "FAILED_PRECONDITION.*no running job .j-mine" raw_call /lockstep.v1.StoreService/Set "$own_job_token" j-mine/0
raw_call /lockstep.v1.StoreService/Set "$(cat "$TOKEN")" j-mine/0 || fail "the admin token was refused by the store"
expect_logged coord "W \[store\] job=j-mine rank=- refused StoreService/Set on namespace \"j-mine/0\" $peer: PERMISSION_DENIED"
expect_logged coord "W \[store\] job=j-mine rank=- refused StoreService/Set on namespace \"j-mine/0\" $peer: UNAUTHENTICATED"
log "ok: the store refuses calls without the right token"

# Nothing above created a job.
[ "$(ls_cli list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("jobs", [])))')" = 0 ] ||
  fail "a rejected request created a job"

# Logs: a rank that does not exist, a job id that is a path.
job=$(submit --nodes 1 --nproc-per-node 2 --env TRAINER_STEPS=2)
wait_state "$job" SUCCEEDED 30
expect_error "job $job has no rank 7 .*world size 2" ls_cli logs "$job" --rank 7
expect_error "\-\-rank: expected 0 or more, got -1" ls_cli logs "$job" --rank -1
expect_error "job $job has no rank 99 and never will: at most 2 ranks" ls_cli logs "$job" --rank 99 -f
expect_error "\-\-tail: expected 1 or more lines, got -3" ls_cli logs "$job" --tail -3
expect_error "\-\-tail-bytes: expected 1 or more bytes, got 0" ls_cli logs "$job" --tail-bytes 0
expect_error "\-\-nodes: the node count must be 1 or more, got \"1:0\"" ls_cli submit --nodes 1:0 -- /bin/true
expect_error "job_id: \"../../etc\" is not a job id" ls_cli logs ../../etc --rank 0
# Straight to the agent: it takes log tickets only (daemon/log_ticket.h), so
# the admin token is refused; a ticket made from store.key by the documented
# format gets past that check, and the agent itself refuses the path.
cat > "$T/readlogs.py" <<'PY'
import hashlib, hmac, sys, time, grpc
addr, store_key, node, auth = sys.argv[1:5]
# ReadLogsRequest{job_id="../../etc", rank=0}: field 1 (string), hand-encoded.
jid = b"../../etc"
req = b"\x0a" + bytes([len(jid)]) + jid
if auth == "ticket":
    key = hmac.new(store_key.encode(), b"lockstep log key v1\n" + node.encode(), hashlib.sha256).hexdigest()
    expires = str(int(time.time()) + 60)
    mac = hmac.new(key.encode(), b"lockstep log ticket v1\n" + jid + b"\n" + node.encode() + b"\n" + expires.encode(),
                   hashlib.sha256).hexdigest()
    header = "Ticket " + expires + ":" + mac
else:
    header = "Bearer " + auth
ch = grpc.insecure_channel(addr)
call = ch.unary_unary("/lockstep.v1.AgentService/ReadLogs",
                      request_serializer=lambda b: b, response_deserializer=lambda b: b)
try:
    call(req, timeout=5, metadata=[("authorization", header)])
    sys.exit(0)
except grpc.RpcError as e:
    print(e.code(), e.details(), file=sys.stderr)
    sys.exit(1)
PY
store_key=$(cat "$(dirname "$TOKEN")/store.key")
expect_error "UNAUTHENTICATED.*agents take log tickets, not bearer tokens" \
  /usr/bin/python3 "$T/readlogs.py" "$ADDR_coord" "$store_key" coord "$(cat "$TOKEN")"
expect_error "INVALID_ARGUMENT.*not a valid job id" \
  /usr/bin/python3 "$T/readlogs.py" "$ADDR_coord" "$store_key" coord ticket
[ "$(ls_cli list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["jobs"]))')" = 1 ] ||
  fail "expected exactly one job"

# Sizes and numbers. A 5 MiB spec (over one argv string's limit, so sent
# hand-encoded) fits gRPC's 64 MiB message limit but not the 262144-byte
# spec limit: it is refused at submit naming its size, in a short message.
# No job is made of it (the list below still holds one), so it never
# reaches a node's heartbeat.
expect_error "INVALID_ARGUMENT .*spec: 5242[0-9]* bytes serialized exceeds the limit of 262144 bytes" \
  /usr/bin/python3 - "$COORD" "$(cat "$TOKEN")" <<'PY'
import sys, grpc
def varint(n):
    out = b""
    while True:
        b = n & 0x7f; n >>= 7
        if n: out += bytes([b | 0x80])
        else: return out + bytes([b])
def ld(field, data): return varint(field << 3 | 2) + varint(len(data)) + data
def vi(field, value): return varint(field << 3) + varint(value)
env = ld(1, b"BIG") + ld(2, b"x" * (5 << 20))
spec = ld(2, b"/bin/true") + ld(3, env) + vi(4, 1) + vi(6, 1)
req = ld(1, spec)  # SubmitJobRequest{spec}
call = grpc.insecure_channel(sys.argv[1]).unary_unary(
    "/lockstep.v1.CoordinatorService/SubmitJob",
    request_serializer=lambda b: b, response_deserializer=lambda b: b)
try:
    call(req, timeout=20, metadata=[("authorization", "Bearer " + sys.argv[2])])
except grpc.RpcError as e:
    print(e.code(), e.details(), file=sys.stderr)
    if len(e.details()) > 300: print("error message too long:", len(e.details()), file=sys.stderr)
    sys.exit(1)
PY
grep -q "error message too long" "$T/err.txt" && fail "the size error echoes the input"
expect_error "spec.join_timeout_s: must be a finite number of seconds" \
  ls_cli submit --join-timeout-s inf -- /bin/true
expect_error "spec.stop_grace_s: must be a finite number of seconds" \
  ls_cli submit --stop-grace-s nan -- /bin/true
expect_error "spec.name: contains a control character" ls_cli submit --name "$(printf 'a\nb')" -- /bin/true
[ "$(ls_cli list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["jobs"]))')" = 1 ] ||
  fail "a refused spec left a job behind, or list broke"
job=$(submit --nodes 1 --nproc-per-node 1 --env TRAINER_STEPS=2)
wait_state "$job" SUCCEEDED 30
ls_cli list >/dev/null || fail "lockstep list broke after the oversized spec"
log "ok: oversized and non-finite specs refused; the node still runs jobs"

# A request id names one submission: again with the same spec, the same job;
# with another spec, refused (exit 2) naming the job, and nothing made.
nightly() { ls_cli submit --detach --request-id nightly-1 --env TRAINER_OUT_DIR="$T/out" "$@" -- "$TRAINER" "$MARKER"; }
first=$(nightly --env TRAINER_STEPS=2 | awk '{print $3}')
again=$(nightly --env TRAINER_STEPS=2 | awk '{print $3}')
[ -n "$first" ] && [ "$first" = "$again" ] || fail "a resubmitted request id gave $again, not $first"
expect_error "ALREADY_EXISTS: .*request_id \"nightly-1\" was already used by job $first with a different spec (spec.env differ)" \
  nightly --env TRAINER_STEPS=3
rc=0; nightly 2>/dev/null || rc=$?
[ "$rc" = 2 ] || fail "a request id reused with another spec exited $rc, want 2 (usage)"
expect_error "INVALID_ARGUMENT: .*request_id \"a b\": must be" ls_cli submit --request-id "a b" -- /bin/true
wait_state "$first" SUCCEEDED 30

# --json watch keeps stdout for JSON, and says on stderr that (and why) the
# coordinator does not answer while it keeps trying.
rc=0
timeout 4 "$LOCKSTEP" --coordinator 127.0.0.1:1 --token-file "$TOKEN" --json watch j-abc \
  >"$T/jw.out" 2>"$T/jw.err" || rc=$?
[ "$rc" = 124 ] || fail "--json watch of an unreachable coordinator exited $rc: $(cat "$T/jw.err")"
[ ! -s "$T/jw.out" ] || fail "--json watch wrote non-JSON to stdout: $(cat "$T/jw.out")"
grep -q "UNAVAILABLE: watch job j-abc (coordinator 127.0.0.1:1).*still trying" "$T/jw.err" ||
  fail "--json watch did not say the coordinator is unreachable: $(cat "$T/jw.err")"
log "ok: request ids, and --json watch of an unreachable coordinator"

# A worker's terminal escapes reach `status` escaped, never raw.
esc_job=$(ls_cli submit --detach --json --max-restarts 0 -- /bin/sh -c 'printf "\033[31mred\033[0m\n" >&2; exit 3' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$esc_job" FAILED 30
ls_cli status "$esc_job" >"$T/esc.txt"
if grep -q $'\033' "$T/esc.txt"; then fail "status printed a raw ESC from the worker's stderr"; fi
grep -qF '| \x1b[31mred\x1b[0m' "$T/esc.txt" || fail "status lacks the escaped line: $(cat "$T/esc.txt")"
log "ok: a worker's escape sequences are printed escaped"

# A coordinator with an allowed-command list rejects anything else.
ALLOWED_ENV="" start_daemon strict --coordinator --no-agent --listen 127.0.0.1:0 --allowed-command "$TRAINER"
expect_error "PERMISSION_DENIED: .*not in the allowed list" \
  "$LOCKSTEP" --coordinator "$ADDR_strict" --token-file "$T/strict/token" submit -- /bin/sh -c true
expect_logged strict "refused CoordinatorService/SubmitJob \(request \"req-[0-9a-f]+\"\) $peer: PERMISSION_DENIED: .*not in the allowed list"
"$LOCKSTEP" --coordinator "$ADDR_strict" --token-file "$T/strict/token" submit --detach -- "$TRAINER" "$MARKER" >/dev/null ||
  fail "the allowed command was rejected"
# ... and the allowed command cannot be made to run other code through the
# job environment (the loader, PATH), nor can a job set the agent's names.
strict() { "$LOCKSTEP" --coordinator "$ADDR_strict" --token-file "$T/strict/token" "$@"; }
expect_error "PERMISSION_DENIED: .*spec.env: LD_PRELOAD is refused: it makes the dynamic loader" \
  strict submit --env LD_PRELOAD=/tmp/evil.so -- "$TRAINER"
expect_error "PERMISSION_DENIED: .*spec.env: PATH is refused on a node with --allowed-command" \
  strict submit --env PATH=/tmp/evil -- "$TRAINER"
expect_error "PERMISSION_DENIED: .*spec.env: RANK is refused: the agent sets it" \
  strict submit --env RANK=0 -- "$TRAINER"
# The job environment is an allow-list: TRAINER_* is permitted on the other
# daemons of this test (lib.sh), not here.
expect_error "PERMISSION_DENIED: .*spec.env: TRAINER_STEPS is not in the job environment allow-list" \
  strict submit --env TRAINER_STEPS=2 -- "$TRAINER"
[ "$(strict list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("jobs", [])))')" = 1 ] ||
  fail "a refused submit left a job behind"
log "PASS"
