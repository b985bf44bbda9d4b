#!/usr/bin/env bash
# Mutual TLS with certificates from `lockstep certs`: a coordinator and a
# second agent serve TLS only, a 2-node job whose workers reach the store
# and their agent's progress service over mTLS (LOCKSTEP_TLS_*_PEM) runs to
# SUCCEEDED, logs are read from both agents over mTLS, and a certificate
# renewed on disk is picked up without a restart. Workers hold the
# clientAuth-only worker.pem (--tls-worker-cert), not their node's key: a
# job that serves what it was given is refused by the CLI, where one with
# the node's certificate would be trusted; a daemon given a server's
# certificate for its workers refuses to start, one given none warns. Refused, each with an
# error that says why: a CLI with another cluster's CA, with a certificate
# from another CA, without a client certificate, without TLS; a daemon
# whose certificate is from another CA (at start), a daemon of another
# cluster (when it registers); plaintext on a non-loopback address
# (daemon and CLI) without --insecure-plaintext. (Expired certificates:
# rendezvous/tls_test.cc, which can make one.)
source tests/e2e/lib.sh "$@"

C="$T/certs"
"$LOCKSTEP" certs --out "$C" --hosts 127.0.0.1,localhost --days 2 > "$T/certs.out"
for f in ca.pem ca.key 127.0.0.1.pem 127.0.0.1.key client.pem client.key worker.pem worker.key; do
  [ -s "$C/$f" ] || fail "lockstep certs did not write $f: $(cat "$T/certs.out")"
done
[ "$(stat -c %a "$C/127.0.0.1.key")" = 600 ] && [ "$(stat -c %a "$C/worker.key")" = 600 ] ||
  fail "keys must be 0600"
NODE_TLS=(--tls-ca "$C/ca.pem" --tls-cert "$C/127.0.0.1.pem" --tls-key "$C/127.0.0.1.key" --tls-refresh-s 1)
TLS_FLAGS=("${NODE_TLS[@]}" --tls-worker-cert "$C/worker.pem" --tls-worker-key "$C/worker.key")

# A server's certificate for the workers is refused at start, with why.
rc=0
"$LOCKSTEPD" --coordinator --listen 127.0.0.1:0 --state-dir "$T/serverworker" "${NODE_TLS[@]}" \
  --tls-worker-cert "$C/127.0.0.1.pem" --tls-worker-key "$C/127.0.0.1.key" > "$T/serverworker.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "tls-worker-cert $C/127.0.0.1.pem is good for a server" "$T/serverworker.log" ||
  fail "a daemon handed its workers a server certificate (exit $rc): $(cat "$T/serverworker.log")"

# Plaintext beyond loopback is refused at start, saying how to fix it.
rc=0
"$LOCKSTEPD" --coordinator --listen 0.0.0.0:0 --state-dir "$T/plain" > "$T/plain.log" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "lockstepd listened in plaintext on 0.0.0.0 (exit $rc): $(cat "$T/plain.log")"
grep -q "is not a loopback address and TLS is off.*--insecure-plaintext" "$T/plain.log" ||
  fail "no clear error for plaintext on 0.0.0.0: $(cat "$T/plain.log")"
# So is a loopback --listen advertised beyond loopback: the daemon's own
# agent and its workers would send their tokens to the advertised address.
rc=0
"$LOCKSTEPD" --coordinator --listen 127.0.0.1:0 --advertise-address 10.0.0.5:7070 \
  --state-dir "$T/plain-adv" > "$T/plain-adv.log" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "lockstepd advertised 10.0.0.5 in plaintext (exit $rc): $(cat "$T/plain-adv.log")"
grep -q -- "--advertise-address 10.0.0.5:7070 is not a loopback address and TLS is off" "$T/plain-adv.log" ||
  fail "no clear error for a plaintext advertised address: $(cat "$T/plain-adv.log")"
# Forced with --insecure-plaintext, an agent dialling a coordinator beyond
# loopback warns that its token crosses the network (0.0.0.0: this host,
# nothing listens there, nothing leaves the machine).
openssl rand -hex 32 > "$T/plain-agent.token" && chmod 600 "$T/plain-agent.token"
timeout 3 "$LOCKSTEPD" --listen 127.0.0.1:0 --state-dir "$T/plain-agent" --insecure-plaintext \
  --coordinator-address 0.0.0.0:1 --token-file "$T/plain-agent.token" > "$T/plain-agent.log" 2>&1 || true
grep -q "plaintext to the coordinator 0.0.0.0:1 (--insecure-plaintext)" "$T/plain-agent.log" ||
  fail "an agent dialling 0.0.0.0 in plaintext did not warn: $(head -n 20 "$T/plain-agent.log")"
rc=0
err=$("$LOCKSTEP" --coordinator 192.0.2.1:7070 --token-file /dev/null nodes 2>&1) || rc=$?
[ "$rc" != 0 ] && grep -q "coordinator 192.0.2.1:7070 is not a loopback address and TLS is off" <<<"$err" ||
  fail "the CLI would send a token in plaintext to 192.0.2.1: $err"

start_coordinator "${TLS_FLAGS[@]}"
grep -q "mutual TLS: CA $C/ca.pem" "$T/coord.log" || fail "coordinator did not log its TLS settings"
start_agent nodeb "${TLS_FLAGS[@]}"

export LOCKSTEP_TLS_CA="$C/ca.pem" LOCKSTEP_TLS_CERT="$C/client.pem" LOCKSTEP_TLS_KEY="$C/client.key"
ls_cli nodes
rc=0
out=$(CLI_PREFIX=(timeout 120); ls_cli submit --nodes 2 --nproc-per-node 2 --max-restarts 0 \
  --env TRAINER_STEPS=10 --env TRAINER_STEP_MS=50 --env TRAINER_OUT_DIR="$T/out" --wait -- \
  "$TRAINER" "$MARKER") || rc=$?
job=$(echo "$out" | sed -n 's/^submitted job //p')
[ "$rc" = 0 ] || fail "a job over mTLS did not succeed: submit --wait exited $rc (124: still" \
  "waiting after 120 s; job ${job:-not submitted}${job:+ is $(job_state "$job")}): $out"
state_is "$job" SUCCEEDED || fail "job $job is $(job_state "$job")"
# The workers met through the store and reported progress to their agent:
# both are TLS-only, so both went over mTLS.
grep -q "met 4 peers through the store" "$T/nodeb/jobs/$job/rank-3.stdout" ||
  fail "rank 3 never reached the store: $(cat "$T/nodeb/jobs/$job/rank-3.stderr")"
[ "$(job_field "$job" 'j["workers"][3]["progress"]["step"]')" = 10 ] ||
  fail "rank 3's progress did not reach its agent over mTLS"
grep -q "^rank 3 step 10 " <<<"$(ls_cli logs "$job" --rank 3)" || fail "logs from nodeb over mTLS"
grep -q "workers present $C/worker.pem (--tls-worker-cert)" "$T/coord.log" ||
  fail "the coordinator's agent did not say what its workers present"

# What a job's code holds: worker.pem and its key, not the node's.
mkdir -p "$T/held"
held_material() {  # a job writes its LOCKSTEP_TLS_CERT_PEM and _KEY_PEM into $T/held
  rm -f "$T/held"/*
  local rc=0
  (CLI_PREFIX=(timeout 60); ls_cli submit --nodes 1 --nproc-per-node 1 --max-restarts 0 --wait -- /bin/sh -c \
    "printf '%s' \"\$LOCKSTEP_TLS_CERT_PEM\" > $T/held/cert.pem; printf '%s' \"\$LOCKSTEP_TLS_KEY_PEM\" > $T/held/key.pem") \
    > "$T/held.out" || rc=$?
  [ "$rc" = 0 ] || fail "the job that reads its TLS material failed: submit --wait exited $rc" \
    "(124: still waiting after 60 s): $(cat "$T/held.out")"
}
held_material
cmp -s "$T/held/key.pem" "$C/worker.key" || fail "a worker was not given worker.key"
if cmp -s "$T/held/key.pem" "$C/127.0.0.1.key"; then fail "a worker holds the node's key"; fi
# Served by a job as if it were a node: the CLI refuses that certificate.
# The node's certificate, served the same way, passes the CLI's check (it
# would have sent its token): what makes the difference is the certificate.
impostor() {  # CERT KEY: an openssl s_server with them; sets IMPOSTOR_PORT, IMPOSTOR_PID
  IMPOSTOR_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  openssl s_server -accept "127.0.0.1:$IMPOSTOR_PORT" -cert "$1" -key "$2" -alpn h2 -quiet \
    < /dev/null > "$T/impostor-$IMPOSTOR_PORT.log" 2>&1 &
  IMPOSTOR_PID=$!
  wait_for 10 bash -c "echo > /dev/tcp/127.0.0.1/$IMPOSTOR_PORT" 2>/dev/null ||
    fail "openssl s_server did not listen: $(cat "$T/impostor-$IMPOSTOR_PORT.log")"
}
dial_impostor() {
  "$LOCKSTEP" --coordinator "127.0.0.1:$IMPOSTOR_PORT" --token-file "$TOKEN" nodes 2>&1 || true
  kill "$IMPOSTOR_PID" 2>/dev/null || true
}
impostor "$T/held/cert.pem" "$T/held/key.pem"
err=$(dial_impostor)
grep -q "the server's certificate did not verify: unsuitable certificate purpose" <<<"$err" ||
  fail "the CLI did not refuse a server presenting a worker's certificate: $err"
impostor "$C/127.0.0.1.pem" "$C/127.0.0.1.key"
err=$(dial_impostor)
if grep -q "did not verify" <<<"$err"; then fail "control: the node's certificate did not verify: $err"; fi

# Refused, with the reason. Another cluster's CA and client certificate:
"$LOCKSTEP" certs --out "$T/other" --hosts 127.0.0.1 > /dev/null
expect_refused() {
  local want=$1; shift
  local rc=0 err
  err=$("$LOCKSTEP" --coordinator "$COORD" --token-file "$TOKEN" "$@" nodes 2>&1) || rc=$?
  [ "$rc" = 1 ] || fail "lockstep $* nodes exited $rc, not 1: $err"
  grep -qF -- "$want" <<<"$err" || fail "lockstep $* nodes: error does not say '$want': $err"
  log "refused as expected: $(grep '^lockstep:' <<<"$err")"
}
expect_refused "the server's certificate did not verify" \
  --tls-ca "$T/other/ca.pem" --tls-cert "$T/other/client.pem" --tls-key "$T/other/client.key"
expect_refused "(is --tls-ca the cluster's CA?)" \
  --tls-ca "$T/other/ca.pem" --tls-cert "$T/other/client.pem" --tls-key "$T/other/client.key"
expect_refused "not issued by --tls-ca" --tls-cert "$T/other/client.pem" --tls-key "$T/other/client.key"
LOCKSTEP_TLS_CERT= LOCKSTEP_TLS_KEY= expect_refused \
  "the server requires a client certificate and this side sent none"
LOCKSTEP_TLS_CA= LOCKSTEP_TLS_CERT= LOCKSTEP_TLS_KEY= expect_refused "speaks TLS and this side has no TLS settings"
# A daemon whose certificate is not from the cluster's CA cannot join.
rc=0
"$LOCKSTEPD" --listen 127.0.0.1:0 --state-dir "$T/stranger" --coordinator-address "$COORD" \
  --token-file "$TOKEN" --tls-ca "$C/ca.pem" --tls-cert "$T/other/127.0.0.1.pem" \
  --tls-key "$T/other/127.0.0.1.key" > "$T/stranger.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "not issued by --tls-ca" "$T/stranger.log" ||
  fail "a daemon with another CA's certificate started (exit $rc): $(cat "$T/stranger.log")"

# A daemon of another cluster (its own CA, certificate and key) cannot
# register, and its log says why.
start_stranger() {
  "$LOCKSTEPD" --listen 127.0.0.1:0 --state-dir "$T/other-d" --node-id other --coordinator-address "$COORD" \
    --token-file "$TOKEN" --tls-ca "$T/other/ca.pem" --tls-cert "$T/other/127.0.0.1.pem" \
    --tls-key "$T/other/127.0.0.1.key" >> "$T/other-d.log" 2>&1 &
  DAEMON_PIDS+=("$!")
}
start_stranger
wait_for 30 grep -q "cannot register with the coordinator:.*TLS handshake with $COORD failed: the server's certificate did not verify" "$T/other-d.log" ||
  fail "a daemon of another CA did not say why it cannot register: $(tail -n 5 "$T/other-d.log")"
kill -TERM "${DAEMON_PIDS[-1]}"
if grep -q "^other " <<<"$(ls_cli nodes)"; then fail "the stranger registered"; fi
# Started without --tls-worker-cert, it said its workers would get its key.
grep -q "workers get this daemon's own TLS certificate and key (--tls-key)" "$T/other-d.log" ||
  fail "a daemon handing its workers its own key did not warn: $(head -n 20 "$T/other-d.log")"

# Renewal: new certificates from the same CA, written over the old files,
# are served without a restart (the coordinator re-reads every second), and
# the workers launched next get the new worker.pem.
old_serial=$(openssl x509 -noout -serial -in "$C/127.0.0.1.pem")
"$LOCKSTEP" certs --out "$C" --hosts 127.0.0.1 > /dev/null
new_serial=$(openssl x509 -noout -serial -in "$C/127.0.0.1.pem")
[ "$old_serial" != "$new_serial" ] || fail "lockstep certs did not renew the certificate"
served_serial() {
  openssl s_client -connect "$COORD" -CAfile "$C/ca.pem" -cert "$C/client.pem" -key "$C/client.key" \
    </dev/null 2>/dev/null | openssl x509 -noout -serial
}
serial_is() { [ "$(served_serial)" = "$1" ]; }
wait_for 30 serial_is "$new_serial" || fail "the coordinator still serves the old certificate ($(served_serial))"
ls_cli nodes > /dev/null || fail "the CLI cannot talk to the coordinator after renewal"
# The next job's workers get the renewed worker.pem (read at each launch).
held_material
cmp -s "$T/held/cert.pem" "$C/worker.pem" && cmp -s "$T/held/key.pem" "$C/worker.key" ||
  fail "a job launched after renewal did not get the renewed worker.pem"
log "PASS"
