#!/usr/bin/env bash
# A client we did not write, Debian's python3-grpcio, gets SERVING from the
# standard grpc.health.v1 service; reflection lists our services.
source tests/e2e/lib.sh "$@"

PY=/usr/bin/python3
"$PY" -c 'import grpc' 2>/dev/null ||
  fail "$PY has no grpc module (tools/setup.sh installs python3-grpcio)"
start_coordinator
# Debian's python3-grpcio ships no grpc_health stubs: the request
# (HealthCheckRequest{service=""}) is empty and SERVING is field 1 = 1.
status=$("$PY" - "$COORD" <<'PY'
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
check = ch.unary_unary("/grpc.health.v1.Health/Check",
                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
resp = check(b"", timeout=5)
print({b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING"}.get(resp, repr(resp)))
PY
)
[ "$status" = SERVING ] || fail "health says $status"
log "python3-grpcio health check: $status"
# Reflection: ListServices over the v1alpha stream (field 7 = list_services).
services=$("$PY" - "$COORD" <<'PY'
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
rpc = ch.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
for resp in rpc(iter([b"\x3a\x01*"]), timeout=5):
    print(resp)
    break
PY
)
for svc in lockstep.v1.CoordinatorService lockstep.v1.AgentService lockstep.v1.StoreService grpc.health.v1.Health; do
  grep -q "$svc" <<<"$services" || fail "reflection does not list $svc"
done
# The node-side rendezvous service is gone: the coordinator drives rounds itself.
if grep -q "lockstep.v1.RendezvousService" <<<"$services"; then
  fail "reflection still lists lockstep.v1.RendezvousService"
fi

# Not ready, not SERVING: an agent whose coordinator never answers stays
# NOT_SERVING, and writes no address file (start_daemon's and the deploy
# scripts' signal of "ready").
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$LOCKSTEPD" --state-dir "$T/lonely" --listen "127.0.0.1:$port" --node-id lonely \
  --address-file "$T/lonely.addr" \
  --coordinator-address 127.0.0.1:1 --token-file "$TOKEN" >>"$T/lonely.log" 2>&1 &
DAEMON_PIDS+=("$!")
health_of() {
  "$PY" - "$1" <<'PY'
import sys, grpc
ch = grpc.insecure_channel(sys.argv[1])
check = ch.unary_unary("/grpc.health.v1.Health/Check",
                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
resp = check(b"", timeout=2)
print({b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING"}.get(resp, repr(resp)))
PY
}
answers_not_serving() { [ "$(health_of "127.0.0.1:$port")" = NOT_SERVING ]; }
wait_for 20 answers_not_serving || fail "an agent without its coordinator should be NOT_SERVING"
# It has tried its coordinator and been refused: a daemon that counted
# itself ready regardless would have written its address file by now.
wait_for 30 grep -q "cannot register with the coordinator" "$T/lonely.log" ||
  fail "the lonely agent logged no failed registration within 30 s"
answers_not_serving || fail "the lonely agent is SERVING after its registration failed"
[ ! -e "$T/lonely.addr" ] || fail "address file written before ready: $(cat "$T/lonely.addr")"
log "agent without a coordinator: NOT_SERVING"
log "PASS"
