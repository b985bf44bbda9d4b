#!/usr/bin/env bash
# Node ids bound to certificates (lockstepd --tls-bind-node-ids): over
# mutual TLS, a coordinator admits RegisterNode and Heartbeat only for a
# node id the caller's certificate names. An agent holding the agent token
# and a good certificate of the cluster, but registering under a node id its
# certificate does not name, is refused, both sides saying why, and never
# appears among the nodes; the same agent under its certificate's name
# registers and runs a job's rank. Without the flag the impostor registers
# (the default, documented in daemon/README.md, Security).
source tests/e2e/lib.sh "$@"

C="$T/certs"
"$LOCKSTEP" certs --out "$C" --hosts 127.0.0.1,localhost --days 2 > /dev/null
tls() {  # CERT-NAME: a daemon's TLS flags with that certificate
  echo --tls-ca "$C/ca.pem" --tls-cert "$C/$1.pem" --tls-key "$C/$1.key" \
    --tls-worker-cert "$C/worker.pem" --tls-worker-key "$C/worker.key"
}
export LOCKSTEP_TLS_CA="$C/ca.pem" LOCKSTEP_TLS_CERT="$C/client.pem" LOCKSTEP_TLS_KEY="$C/client.key"

# Misuse is refused at start: the flag needs a coordinator with TLS.
rc=0
"$LOCKSTEPD" --coordinator --listen 127.0.0.1:0 --state-dir "$T/plain" --tls-bind-node-ids \
  > "$T/plain.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q -- "--tls-bind-node-ids needs --coordinator and mutual TLS" "$T/plain.log" ||
  fail "--tls-bind-node-ids without TLS was not refused (exit $rc): $(cat "$T/plain.log")"

# The coordinator's own agent registers under its certificate's name.
start_daemon coord --coordinator --listen 127.0.0.1:0 --node-id 127.0.0.1 --tls-bind-node-ids $(tls 127.0.0.1)
COORD="$ADDR_coord"
TOKEN="$T/coord/token"
grep -q "node ids are bound to certificates (--tls-bind-node-ids)" "$T/coord.log" ||
  fail "the coordinator did not say node ids are bound"
cp "$T/coord/agent.token" "$T/agent.token" && chmod 600 "$T/agent.token"
node_listed() { grep -q "^$1 " <<<"$(ls_cli nodes)"; }
wait_for 30 node_listed 127.0.0.1 || fail "the coordinator's own agent did not register: $(ls_cli nodes)"

# An impostor: the agent token and the cluster's localhost certificate,
# registering as node "gpu-7". Refused: its log says why, the
# coordinator's logs the refusal, and it is never listed.
# (Started by hand: start_daemon waits for the address file, which a daemon
# writes once its agent has registered.)
"$LOCKSTEPD" --listen 127.0.0.1:0 --state-dir "$T/impostor" --coordinator-address "$COORD" \
  --token-file "$T/agent.token" --node-id gpu-7 $(no_job_uids) $(tls localhost) >> "$T/impostor.log" 2>&1 &
PID_impostor=$!
DAEMON_PIDS+=("$PID_impostor")
want='node id "gpu-7" is not a name in the caller.s certificate (subjectAltName "localhost")'
wait_for 30 grep -q "cannot register with the coordinator: PERMISSION_DENIED: .*$want" "$T/impostor.log" ||
  fail "the impostor's log does not say why it cannot register: $(grep -m3 register "$T/impostor.log")"
grep -q "refused CoordinatorService/RegisterNode .*PERMISSION_DENIED: $want" "$T/coord.log" ||
  fail "the coordinator did not log the refusal: $(grep refused "$T/coord.log" | tail -n 3)"
if node_listed gpu-7; then fail "the impostor registered: $(ls_cli nodes)"; fi
kill -TERM "$PID_impostor"

# The same certificate under its own name registers and runs a rank.
start_daemon nodeb --listen 127.0.0.1:0 --coordinator-address "$COORD" --token-file "$T/agent.token" \
  --node-id localhost $(tls localhost)
wait_for 30 node_listed localhost || fail "localhost did not register: $(ls_cli nodes)"
rc=0
out=$(CLI_PREFIX=(timeout 120); ls_cli submit --nodes 2 --nproc-per-node 1 --max-restarts 0 \
  --env TRAINER_STEPS=5 --wait -- "$TRAINER" "$MARKER") || rc=$?
job=$(sed -n 's/^submitted job //p' <<<"$out")
[ "$rc" = 0 ] || fail "a job across both bound nodes did not succeed (exit $rc): $out"
[ "$(job_field "$job" 'sorted(w["node_id"] for w in j["workers"])')" = "['127.0.0.1', 'localhost']" ] ||
  fail "the job did not run on both nodes: $(job_field "$job" 'j["workers"]')"

# Without the flag (the default) the impostor's registration is admitted.
start_daemon open --coordinator --no-agent --listen 127.0.0.1:0 $(tls 127.0.0.1)
cp "$T/open/agent.token" "$T/open-agent.token" && chmod 600 "$T/open-agent.token"
start_daemon impostor2 --listen 127.0.0.1:0 --coordinator-address "$ADDR_open" \
  --token-file "$T/open-agent.token" --node-id gpu-7 $(tls localhost)  # registers: ready
open_listed() { grep -q "^gpu-7 " <<<"$("$LOCKSTEP" --coordinator "$ADDR_open" --token-file "$T/open/token" nodes)"; }
wait_for 30 open_listed || fail "control: without the flag the node did not register"
log "PASS"
