#!/usr/bin/env bash
# lockstepd's /metrics scraped by a real Prometheus (Debian's `prometheus`,
# run by this test with its config and data under $TEST_TMPDIR, scraping
# every second; the system service is never touched).
# A coordinator+agent daemon with --metrics-listen 127.0.0.1:0 runs a
# 2-rank job of the real DDP trainer (a second daemon on its metrics port
# exits 1 naming it); through Prometheus's HTTP API:
#   - lockstep_rank_step_seconds{job_id=JOB} has both ranks, every value > 0;
#   - lockstep_job_state{job_id=JOB,state="RUNNING"} is 1 and
#     lockstep_jobs{state="RUNNING"} >= 1; lockstep_agent_workers_running 2;
#   - the RPC histogram answers the dashboard's p99 query;
#   - after `lockstep cancel`, lockstep_job_state shows CANCELLED, the
#     agent counted two stopped workers and no OOM kill, and its cleaner's
#     three lanes are idle with no uid left unclean.
#   - its fence guard is up; killed, it is started again and counted.
# A second daemon with mutual TLS serves /metrics over HTTPS: Prometheus
# scrapes it with client.pem from `lockstep certs`; curl without a client
# certificate, with the workers' certificate (403), or in plain HTTP, gets
# no metrics.
# Logs Prometheus's scrape_duration_seconds for the daemon (a figure).
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"
PROMETHEUS="${PROMETHEUS:-/usr/bin/prometheus}"
[ -x "$PROMETHEUS" ] || fail "$PROMETHEUS not found: install Debian's prometheus (tools/setup.sh)"

start_coordinator --metrics-listen 127.0.0.1:0
mport=$(sed -n 's|.*metrics: serving http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$T/coord.log" | head -n 1)
[ -n "$mport" ] || fail "the daemon did not log its metrics port"
log "daemon metrics on 127.0.0.1:$mport"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$mport/nope")" = 404 ] ||
  fail "a path other than /metrics is not 404"

# A busy metrics port stops a second daemon at once, naming it.
rc=0
timeout 20 "$LOCKSTEPD" --coordinator --state-dir "$T/second" --listen 127.0.0.1:0 \
  --metrics-listen "127.0.0.1:$mport" >"$T/second.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "second daemon on metrics port $mport: exit $rc, want 1"
grep -q "lockstepd metrics cannot listen on 127.0.0.1:$mport: Address already in use" "$T/second.out" ||
  fail "the error does not name the metrics port: $(tail -n 2 "$T/second.out")"

# With mutual TLS the endpoint is HTTPS and wants a client certificate.
cluster_tls 127.0.0.1
start_daemon secure --coordinator --no-agent --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  $(node_tls 127.0.0.1)
sport=$(sed -n 's|.*metrics: serving https://127.0.0.1:\([0-9]*\)/metrics (mutual TLS.*|\1|p' "$T/secure.log" | head -n 1)
[ -n "$sport" ] || fail "the TLS daemon did not log an https metrics port: $(grep metrics "$T/secure.log")"
# Each answer is read whole before it is searched: `curl | grep -q` under
# pipefail fails when grep exits before curl's last write (SIGPIPE), and the
# answer (4.3 KB) takes curl two writes.
got=$(curl -sf --max-time 5 --cacert "$CERTS/ca.pem" --cert "$CERTS/client.pem" \
  --key "$CERTS/client.key" "https://127.0.0.1:$sport/metrics") ||
  fail "curl with client.pem got no metrics over https"
grep -q "^lockstep_nodes_known " <<<"$got" || fail "no lockstep_nodes_known over https: $got"
# The workers' certificate (--tls-worker-cert) is the CA's too, but every
# job holds it: 403 saying why, no metrics, the refusal logged.
got=$(curl -s --max-time 5 --cacert "$CERTS/ca.pem" --cert "$CERTS/worker.pem" \
  --key "$CERTS/worker.key" -w '%{http_code}' "https://127.0.0.1:$sport/metrics" || true)
[[ "$got" == *"the workers' certificate"*403 ]] || fail "worker.pem was not refused 403: $got"
if grep -q lockstep_ <<<"$got"; then fail "metrics served to worker.pem: $got"; fi
grep -q "refused a request from 127\.0\.0\.1:[0-9]*: it presented $CERTS/worker.pem" "$T/secure.log" ||
  fail "the worker certificate's refusal was not logged: $(grep refused "$T/secure.log")"
got=$(curl -s --max-time 5 --cacert "$CERTS/ca.pem" "https://127.0.0.1:$sport/metrics" || true)
if grep -q lockstep_ <<<"$got"; then
  fail "metrics served over https to a client without a certificate"
fi
got=$(curl -s --max-time 5 "http://127.0.0.1:$sport/metrics" || true)
if grep -q lockstep_ <<<"$got"; then
  fail "metrics served in plain HTTP on the TLS daemon's port"
fi
# Each refusal names the client (curl's loopback address and port).
grep -Eq "refused a TLS connection from 127\.0\.0\.1:[0-9]+: " "$T/secure.log" ||
  fail "the refusals were not logged with the client's address: $(grep refused "$T/secure.log")"

# A free loopback port for Prometheus (bound and released by the kernel).
pport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$T/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: lockstepd
    static_configs:
      - targets: ['127.0.0.1:$mport']
  - job_name: lockstepd_tls
    scheme: https
    tls_config:
      ca_file: $CERTS/ca.pem
      cert_file: $CERTS/client.pem
      key_file: $CERTS/client.key
    static_configs:
      - targets: ['127.0.0.1:$sport']
YML
"$PROMETHEUS" --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/tsdb" \
  --web.listen-address="127.0.0.1:$pport" >>"$T/prometheus.log" 2>&1 &
DAEMON_PIDS+=("$!")  # cleanup stops it with the daemons
PROM="http://127.0.0.1:$pport"
wait_for 60 curl -sf "$PROM/-/ready" || fail "Prometheus did not become ready on $PROM"
log "Prometheus pid $! on $PROM"

# query PROMQL PYEXPR: runs an instant query; PYEXPR over `r` (the result
# list: [{"metric": {...}, "value": [t, "v"]}]) must be true.
query() {
  curl -sfG --max-time 5 "$PROM/api/v1/query" --data-urlencode "query=$1" | python3 -c "
import json, sys
d = json.load(sys.stdin)
assert d['status'] == 'success', d
r = d['data']['result']
ok = $2
print(json.dumps(r))
sys.exit(0 if ok else 1)"
}
expect_query() {  # SECONDS PROMQL PYEXPR
  wait_for "$1" query "$2" "$3" || fail "query $2: never $3; last answer: $(query "$2" True)"
  log "query $2: $(query "$2" True | cut -c1-300)"
}

expect_query 30 'lockstep_nodes_known{job="lockstepd_tls"}' "len(r) == 1"
# The rest is the plaintext daemon's: the TLS one goes (its series go
# stale at the next failed scrape), and the CLI talks without TLS.
kill -TERM "$PID_secure"
expect_query 30 'lockstep_nodes_known' "len(r) == 1 and r[0]['metric']['job'] == 'lockstepd'"
unset LOCKSTEP_TLS_CA LOCKSTEP_TLS_CERT LOCKSTEP_TLS_KEY

job=$(ls_cli submit --json --detach --nodes 1 --nproc-per-node 2 -- \
  "$TRAIN" --model mlp_small --steps 100000 --step-delay-ms 20 --timeout-s 60 |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$job" RUNNING 60

expect_query 60 "lockstep_rank_step_seconds{job_id=\"$job\"}" \
  "len(r) == 2 and sorted(x['metric']['rank'] for x in r) == ['0', '1'] and all(float(x['value'][1]) > 0 for x in r)"
expect_query 30 "lockstep_job_state{job_id=\"$job\",state=\"RUNNING\"}" "len(r) == 1 and r[0]['value'][1] == '1'"
expect_query 30 'lockstep_jobs{state="RUNNING"}' "len(r) == 1 and float(r[0]['value'][1]) >= 1"
expect_query 30 "lockstep_rank_samples_per_second{job_id=\"$job\"}" "len(r) == 2 and all(float(x['value'][1]) > 0 for x in r)"
expect_query 30 "lockstep_rank_bytes_reduced{job_id=\"$job\"}" "len(r) == 2 and all(float(x['value'][1]) > 0 for x in r)"
expect_query 30 'lockstep_agent_workers_running' "len(r) == 1 and r[0]['value'][1] == '2'"
expect_query 30 'lockstep_nodes_alive' "len(r) == 1 and r[0]['value'][1] == '1'"
expect_query 30 'histogram_quantile(0.99, sum by (le, method) (rate(lockstep_rpc_duration_seconds_bucket{method=~".*/Heartbeat"}[10s])))' \
  "len(r) == 1 and float(r[0]['value'][1]) > 0"
expect_query 30 'lockstep_rpcs_total{method="/lockstep.v1.CoordinatorService/Heartbeat",code="OK"}' \
  "len(r) == 1 and float(r[0]['value'][1]) > 0"

ls_cli cancel "$job" >/dev/null
wait_state "$job" CANCELLED 30
expect_query 30 "lockstep_job_state{job_id=\"$job\",state=\"CANCELLED\"}" "len(r) == 1"
expect_query 30 'lockstep_agent_worker_exits_total{outcome="stopped"}' "len(r) == 1 and r[0]['value'][1] == '2'"
expect_query 30 'lockstep_agent_worker_exits_total{outcome="oom_killed"}' "len(r) == 1 and r[0]['value'][1] == '0'"
# Once the cancelled job's uid (if it had one) is clean, the cleaner is idle.
expect_query 30 'lockstep_agent_cleaner_backlog' "len(r) == 3 and all(x['value'][1] == '0' for x in r)"
expect_query 30 'lockstep_agent_job_uids_unclean' "len(r) == 1 and r[0]['value'][1] == '0'"
expect_query 30 "lockstep_rank_step_seconds{job_id=\"$job\"}" "len(r) == 0"
# The fence guard (daemon/fence_guard.h): up; killed, it is started again
# and counted.
expect_query 30 'lockstep_agent_fence_guard_up' "len(r) == 1 and r[0]['value'][1] == '1'"
expect_query 30 'lockstep_agent_fence_guard_restarts_total' "len(r) == 1 and r[0]['value'][1] == '0'"
guard=$(pgrep -P "$PID_coord" -x lockstepd-fence) || fail "no fence guard under lockstepd (pid $PID_coord)"
kill -KILL "$guard"
expect_query 30 'lockstep_agent_fence_guard_restarts_total' "len(r) == 1 and r[0]['value'][1] == '1'"
expect_query 30 'lockstep_agent_fence_guard_up' "len(r) == 1 and r[0]['value'][1] == '1'"
[ -n "$(pgrep -P "$PID_coord" -x lockstepd-fence)" ] && [ "$(pgrep -P "$PID_coord" -x lockstepd-fence)" != "$guard" ] ||
  fail "no new fence guard under lockstepd"
log "scrape: $(query 'scrape_duration_seconds{job="lockstepd"}' True | python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.2f ms" % (1000*float(r[0]["value"][1])))'), samples $(query 'scrape_samples_scraped{job="lockstepd"}' True | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["value"][1])')"
check_invariants "$job" 0
log "PASS"
