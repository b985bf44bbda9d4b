#!/usr/bin/env bash
# A client we did not write, Debian's python3-grpcio, gets SERVING from the
# standard grpc.health.v1 service; reflection lists our services.
source tests/e2e/lib.sh "$@"

PY=/usr/bin/python3
if ! "$PY" -c 'import grpc' 2>/dev/null; then
  echo "SKIP: $PY has no grpc module (apt-get install python3-grpcio)"
  exit 0
fi
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
for svc in lockstep.v1.CoordinatorService lockstep.v1.AgentService lockstep.v1.StoreService lockstep.v1.RendezvousService grpc.health.v1.Health; do
  echo "$services" | grep -q "$svc" || fail "reflection does not list $svc"
done
log "PASS"
