#!/usr/bin/env bash
# deploy/grafana/lockstep-dashboard.json against what lockstepd exports: a
# coordinator+agent daemon with --metrics-listen 127.0.0.1:0 is scraped once
# (its /metrics names every family, with HELP and TYPE, even before any job
# runs); every metric name in every PromQL expression of the dashboard (its
# panels and its variable) must be one of them (for a histogram: the name
# plus _bucket, _sum or _count); no expression may match on `job` (ours is
# job_id); the required panels exist; and promtool parses every expression
# (as recording rules, Grafana's $variables substituted).
# Usage: dashboard_test.sh LOCKSTEPD DASHBOARD_JSON WAITS_SH
set -euo pipefail
LOCKSTEPD="$PWD/$1"
DASHBOARD="$PWD/$2"
T="${TEST_TMPDIR:-$(mktemp -d)}/grafana"
rm -rf "$T"
mkdir -p "$T"
LOG_TAG=grafana
source "$3"

"$LOCKSTEPD" --coordinator --state-dir "$T/state" --listen 127.0.0.1:0 \
  --metrics-listen 127.0.0.1:0 --address-file "$T/addr" >"$T/daemon.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
wait_for 30 test -s "$T/addr" || fail "lockstepd did not become ready"
port=$(sed -n 's|.*metrics: serving http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$T/daemon.log" | head -n 1)
[ -n "$port" ] || fail "lockstepd did not log its metrics port"
curl -sf --max-time 10 "http://127.0.0.1:$port/metrics" >"$T/metrics.txt" || fail "GET /metrics failed"
log "scraped $(grep -c '^# TYPE' "$T/metrics.txt") families from 127.0.0.1:$port"

python3 - "$DASHBOARD" "$T/metrics.txt" "$T/rules.yml" <<'PY' ||
import json, re, sys
dashboard = json.load(open(sys.argv[1]))
types = {}
for line in open(sys.argv[2]):
    if line.startswith("# TYPE "):
        _, _, name, kind = line.split()
        types[name] = kind
exported = set(types)
for name, kind in types.items():
    if kind == "histogram":
        exported |= {name + s for s in ("_bucket", "_sum", "_count")}

exprs = []  # (where, expr)
def walk(panels):
    for p in panels:
        walk(p.get("panels", []))
        for t in p.get("targets", []):
            exprs.append((p["title"], t["expr"]))
walk(dashboard["panels"])
for v in dashboard.get("templating", {}).get("list", []):
    q = v.get("query")
    exprs.append(("variable " + v["name"], q["query"] if isinstance(q, dict) else q))

errors = []
for where, e in exprs:
    names = set(re.findall(r"\blockstep_[A-Za-z0-9_]+", e))
    if not names:
        errors.append(f"{where}: no lockstep metric in {e!r}")
    for n in sorted(names - exported):
        errors.append(f"{where}: {n} is not exported by lockstepd ({e!r})")
    if re.search(r"[{,]\s*job\s*[=!~]", e) or re.search(r"\bby\s*\([^)]*\bjob\b", e):
        errors.append(f"{where}: matches on `job` (Prometheus's scrape job); use job_id: {e!r}")
titles = {p["title"] for p in dashboard["panels"]}
for want in ("Jobs by state", "Nodes alive", "Step time per rank", "Samples/s",
             "Exposed communication per rank", "Bytes reduced per step", "RPC latency p50 / p99"):
    if want not in titles:
        errors.append(f"panel {want!r} missing")
for p in dashboard["panels"]:
    if p.get("datasource", {}).get("uid") != "${DS_PROMETHEUS}":
        errors.append(f"{p['title']}: datasource is not the import input DS_PROMETHEUS")
if errors:
    print("\n".join(errors))
    sys.exit(1)

# Recording rules for promtool: Grafana's variables as PromQL would see them.
with open(sys.argv[3], "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (where, e) in enumerate(exprs):
        e = e.replace("$__rate_interval", "1m").replace("$job_id", ".*")
        if e.startswith("label_values("):  # a Grafana function, not PromQL
            e = re.match(r"label_values\((\w+)", e).group(1)
        out.write(f"      - record: dashboard:expr_{i}\n        expr: {json.dumps(e)}\n")
print(f"{len(exprs)} expressions over {len(types)} exported families: every name exported")
PY
  fail "the dashboard names metrics lockstepd does not export, or lacks a panel"
if command -v promtool >/dev/null; then
  promtool check rules "$T/rules.yml" || fail "promtool refused a dashboard expression"
else
  log "promtool not installed (tools/setup.sh installs prometheus): PromQL syntax not checked"
fi
log "PASS"
