#!/usr/bin/env bash
# No listening socket is shared: a second lockstepd on the coordinator's
# port fails at once with an error naming the address (gRPC would otherwise
# set SO_REUSEPORT and split the CLI's calls between the two), and a second
# lockstepd on the same state dir is refused. The first daemon keeps serving
# every call.
source tests/e2e/lib.sh "$@"

start_coordinator
log "second daemon on $COORD"
rc=0
timeout 20 "$LOCKSTEPD" --coordinator --state-dir "$T/second" --listen "$COORD" \
  >"$T/second.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "second daemon on $COORD: exit $rc, want 1: $(tail -n 3 "$T/second.out")"
grep -q "cannot listen on $COORD: Address already in use" "$T/second.out" ||
  fail "the error does not name $COORD: $(tail -n 3 "$T/second.out")"

log "second daemon on the state dir $T/coord"
rc=0
timeout 20 "$LOCKSTEPD" --coordinator --state-dir "$T/coord" --listen 127.0.0.1:0 \
  >"$T/third.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "second daemon on the state dir: exit $rc, want 1"
grep -q "state dir $T/coord is in use by another lockstepd (pid $PID_coord)" "$T/third.out" ||
  fail "the error does not name the state dir and its owner: $(tail -n 3 "$T/third.out")"

# Every call reaches the first daemon (with a shared port, about half were
# answered by the second one with "wrong bearer token").
for i in $(seq 10); do
  ls_cli nodes >/dev/null || fail "call $i to the first daemon failed"
done
kill -0 "$PID_coord" || fail "the first daemon died"
log "PASS"
