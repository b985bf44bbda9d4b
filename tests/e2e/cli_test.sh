#!/usr/bin/env bash
# The CLI as scripts and torchrun users meet it:
#   - `--json` of a finished 2-rank job: every field present, rank 0, exit
#     code 0 and restart count 0 as numbers, pids as numbers, states
#     without enum prefixes; `logs --json` carries the log as text;
#   - torchrun's spellings (--nnodes, --nproc_per_node, --max_restarts) and
#     short flags are accepted; --wait=false (--no-wait) returns at once;
#   - a job short of nodes says how many it has and needs;
#   - `list` reads a job table larger than one answer (several pages);
#   - cancel of a finished job names its state without the enum prefix;
#   - the program's own flags after it are the program's (as torchrun
#     takes them), not lockstep's, without "--";
#   - typos get "did you mean", extra arguments are refused (the first one
#     named), `help` and `version` as commands, --version on
#     both binaries, help does not contradict itself nor leave out a
#     command's flags from the top-level usage, a missing token file
#     names --token-file, a token file's bad mode is printed in octal.
source tests/e2e/lib.sh "$@"

start_coordinator

# torchrun spellings, -e for --env.
rc=0
out=$(CLI_PREFIX=(timeout 120); ls_cli submit --nnodes 1 --nproc_per_node 2 --max_restarts 0 \
  -e TRAINER_STEPS=3 --env TRAINER_OUT_DIR="$T/out" --wait -- "$TRAINER" "$MARKER") || rc=$?
job=$(echo "$out" | sed -n 's/^submitted job //p')
[ "$rc" = 0 ] || fail "submit with torchrun's spellings did not succeed: rc $rc (124: still waiting" \
  "after 120 s; job ${job:-not submitted}${job:+ is $(job_state "$job")}): $out"
[ -n "$job" ] || fail "no job id in: $out"

ls_cli status --json "$job" >"$T/job.json"
python3 - "$T/job.json" <<'EOF' || fail "status --json is not what scripts need: $(cat "$T/job.json")"
import json, sys
j = json.load(open(sys.argv[1]))
def check(cond, what):
    if not cond:
        sys.exit("status --json: " + what)
check(j["state"] == "SUCCEEDED", "state %r" % j["state"])
check(j["restart_count"] == 0 and type(j["restart_count"]) is int, "restart_count %r" % j.get("restart_count"))
check(j["spec"]["nproc_per_node"] == 2 and j["spec"]["max_nodes"] == 1, "spec %r" % j["spec"])
check(j["first_failure"] is None, "first_failure should be null, is %r" % j["first_failure"])
check(j["consequences"] == [], "consequences %r" % j["consequences"])
ranks = sorted(w["rank"] for w in j["workers"])
check(ranks == [0, 1], "ranks %r (rank 0 must be present)" % ranks)
for w in j["workers"]:
    check(type(w["rank"]) is int and type(w["pid"]) is int and w["pid"] > 0, "worker %r" % w)
    check(w["state"] == "EXITED", "worker state %r" % w["state"])
    check(w["exit"]["exit_code"] == 0 and w["exit"]["signal"] == 0, "exit %r" % w["exit"])
    check(w["progress"]["step"] == 3, "progress %r" % w["progress"])
for h in j["history"]:
    check(not h["state"].startswith("JOB_STATE_"), "history state %r" % h["state"])
EOF
# Cancelling a finished job names its state as the rest of the CLI does.
err=$(ls_cli cancel "$job" 2>&1) && fail "cancelling a finished job succeeded: $err"
grep -q "already finished as SUCCEEDED$" <<<"$err" || fail "cancel of a finished job: $err"
ls_cli list --json | python3 -c '
import json, sys
jobs = json.load(sys.stdin)["jobs"]
assert [j["state"] for j in jobs] == ["SUCCEEDED"], jobs' || fail "list --json"
ls_cli nodes --json | python3 -c '
import json, sys
n = json.load(sys.stdin)["nodes"][0]
assert n["alive"] is True and type(n["registered_unix_ms"]) is int, n' || fail "nodes --json"
# One JSON object per chunk read (JSON lines).
ls_cli logs --json -r 1 "$job" | python3 -c '
import json, sys
d = "".join(json.loads(line)["data"] for line in sys.stdin)
assert "rank 1 step 3" in d, d' || fail "logs --json does not carry rank 1's log as text"

# --wait=false and --no-wait return at once, as --detach does: a job that
# waits for 3 nodes of this 1-node cluster would keep a waiting submit
# forever (the timeout only bounds a broken run).
for no_wait in --wait=false --no-wait; do
  rc=0
  out=$(timeout 60 "$LOCKSTEP" --coordinator "$COORD" --token-file "$TOKEN" submit "$no_wait" \
    --nodes 3 -- /bin/true) || rc=$?
  [ "$rc" = 0 ] || fail "submit $no_wait: rc $rc (124: it waited for the job): $out"
  pending=$(sed -n 's/^submitted job //p' <<<"$out")
  [ -n "$pending" ] && [ "$(wc -l <<<"$out")" = 1 ] || fail "submit $no_wait printed: $out"
  state_is "$pending" PENDING || fail "job of submit $no_wait is $(job_state "$pending")"
  # It says what it waits for.
  grep -qx "message: *waiting for nodes: 1 of 3 registered and alive (needs --nodes 3)" \
    <<<"$(ls_cli status "$pending")" || fail "status of a job short of nodes: $(ls_cli status "$pending")"
  ls_cli cancel "$pending" >/dev/null && ls_cli delete "$pending" >/dev/null ||
    fail "cannot remove the pending job $pending"
done
expect_usage '--wait=false returns at once: it cannot be used with --standalone' \
  "$LOCKSTEP" submit --wait=false --standalone -- /bin/true

# As torchrun takes them: the program and its own flags after lockstep's,
# without "--"; a flag after the program is the program's, even one
# lockstep also has (--name here), never taken by lockstep.
inner=$(ls_cli submit --detach --json --nproc_per_node 1 "$TRAINER" "$MARKER" --name inner-flag \
  --env TRAINER_STEPS=1 | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["job_id"], j["spec"]["name"] or "-", json.dumps(j["spec"]["command"][1:]))')
read -r inner_id inner_name inner_cmd <<<"$inner"
[ "$inner_name" = "-" ] && [ "$inner_cmd" = "[\"$MARKER\", \"--name\", \"inner-flag\", \"--env\", \"TRAINER_STEPS=1\"]" ] ||
  fail "a flag after the program was not the program's: name $inner_name, arguments $inner_cmd"
ls_cli cancel "$inner_id" >/dev/null && ls_cli delete "$inner_id" >/dev/null || fail "cancel/delete $inner_id"
expect_usage 'no command to run: expected -- CMD ARGS' ls_cli submit --nodes 1
expect_usage 'status: expected one JOB id, got 2 arguments ("extra" is one too many)' ls_cli status "$job" extra
expect_usage 'logs: expected one JOB id, got 2 arguments ("1" is one too many; a rank is --rank R)' ls_cli logs "$job" 1
expect_usage 'cancel: expected a JOB id' ls_cli cancel
expect_usage 'lockstep: no command given' "$LOCKSTEP"
expect_usage '(a flag of logs goes after it: lockstep logs --...)' \
  "$LOCKSTEP" --rank 1 logs "$job"
[ "$("$LOCKSTEP" version)" = "$("$LOCKSTEP" --version)" ] || fail "lockstep version: $("$LOCKSTEP" version)"
"$LOCKSTEP" help | grep -q "^usage: lockstep" || fail "lockstep help printed no usage"
expect_usage 'nothing to join: give --coordinator to host a coordinator' "$LOCKSTEPD" --state-dir "$T/nojoin"
expect_usage '--node-id "bad/node" is not a node id' \
  "$LOCKSTEPD" --state-dir "$T/badnode" --coordinator --node-id bad/node
expect_usage 'did you mean "status"?' ls_cli stauts "$job"
expect_usage 'did you mean --nproc-per-node?' ls_cli submit --nproc-per-nod 2 -- /bin/true
expect_usage 'list takes no arguments, got "extra"' ls_cli list extra
expect_usage 'nodes takes no arguments' ls_cli nodes extra
expect_usage 'unknown flag -q' ls_cli logs -q "$job"
expect_usage 'lockstep run runs on this host only: --nodes must be 1, got "2"' \
  "$LOCKSTEP" run --nodes 2 -- /bin/true
expect_usage '--tls-cert and --tls-key need --tls-ca' \
  env LOCKSTEP_TLS_CA= "$LOCKSTEP" --coordinator "$COORD" --token-file "$TOKEN" --tls-cert x --tls-key y list
expect_usage 'must be more than 0 (got 45 and 0)' \
  "$LOCKSTEPD" --state-dir "$T/hb0" --coordinator-address 127.0.0.1:1 --heartbeat-interval-s 0
# Durations past a day, negative or NaN: refused, not overflowed (1e10 s
# made the backoff cap negative: no backoff at all).
expect_usage '--max-restart-backoff-s: want 0 to 86400 seconds, got 1e+10' \
  "$LOCKSTEPD" --state-dir "$T/bo" --coordinator --max-restart-backoff-s 1e10
expect_usage '--restart-backoff-s: want 0 to 86400 seconds, got nan' \
  "$LOCKSTEPD" --state-dir "$T/bo" --coordinator --restart-backoff-s nan
expect_usage '--shutdown-grace-s: want 0 to 86400 seconds, got -1' \
  "$LOCKSTEPD" --state-dir "$T/bo" --coordinator --shutdown-grace-s -1
expect_usage '--lease-s: want more than 0 to 86400 seconds, got 1e+300' \
  "$LOCKSTEPD" --state-dir "$T/bo" --coordinator --lease-s 1e300
expect_usage '--advertise-address "node-a": want host:port' \
  "$LOCKSTEPD" --state-dir "$T/adv" --coordinator-address 127.0.0.1:1 --advertise-address node-a
expect_usage '--run-as: workers never run as root' \
  "$LOCKSTEPD" --state-dir "$T/adv" --coordinator-address 127.0.0.1:1 --run-as 00

# certs: the CA a second run finds is reused and said so, not "wrote";
# --days past what a certificate's clock holds, and a host that is neither a
# DNS name nor an IP address, are refused naming them.
"$LOCKSTEP" certs --out "$T/certs" --hosts node-1,10.0.0.2,::1 >"$T/certs1.txt" ||
  fail "lockstep certs: $(cat "$T/certs1.txt")"
grep -qx "wrote $T/certs/ca.pem" "$T/certs1.txt" || fail "the first certs run did not write the CA: $(cat "$T/certs1.txt")"
"$LOCKSTEP" certs --out "$T/certs" --hosts node-2 >"$T/certs2.txt" || fail "lockstep certs again: $(cat "$T/certs2.txt")"
grep -q "^reused $T/certs/ca.pem and $T/certs/ca.key" "$T/certs2.txt" &&
  ! grep -q "^wrote $T/certs/ca" "$T/certs2.txt" && grep -qx "wrote $T/certs/node-2.pem" "$T/certs2.txt" ||
  fail "the second certs run did not say it reused the CA: $(cat "$T/certs2.txt")"
expect_usage 'days must be 1 to 36500 (100 years), got 100000' \
  "$LOCKSTEP" certs --out "$T/certs" --hosts node-3 --days 100000
expect_usage "host 'bad host' is neither a DNS name nor an IP address" \
  "$LOCKSTEP" certs --out "$T/certs" --hosts "bad host"
expect_usage "certs prints no JSON: leave out --json" \
  "$LOCKSTEP" --json certs --out "$T/certs" --hosts node-4
expect_usage "certs prints no JSON: leave out --json" \
  "$LOCKSTEP" certs --json --out "$T/certs" --hosts node-4
expect_usage "certs: --out DIR (where to write) is missing" "$LOCKSTEP" certs --hosts node-4
expect_usage "certs: --hosts HOST,... (a certificate each) is missing" "$LOCKSTEP" certs --out "$T/certs"
expect_usage "certs: --hosts names no host" "$LOCKSTEP" certs --out "$T/certs" --hosts ,
expect_usage 'certs takes no arguments, got "node-4" (hosts go in --hosts)' \
  "$LOCKSTEP" certs --out "$T/certs" --hosts node-5 node-4
[ ! -e "$T/certs/node-3.pem" ] && [ ! -e "$T/certs/bad host.pem" ] && [ ! -e "$T/certs/node-4.pem" ] &&
  [ ! -e "$T/certs/node-5.pem" ] ||
  fail "a refused certs run wrote a certificate"


grep -qx "lockstep [0-9.]*" <<<"$("$LOCKSTEP" --version)" || fail "lockstep --version: $("$LOCKSTEP" --version)"
grep -qx "lockstepd [0-9.]*" <<<"$("$LOCKSTEPD" --version)" || fail "lockstepd --version: $("$LOCKSTEPD" --version)"
# After the global flags too (it printed the usage text before).
grep -qx "lockstep [0-9.]*" <<<"$("$LOCKSTEP" --coordinator 127.0.0.1:1 --json --version)" ||
  fail "lockstep --coordinator ... --version: $("$LOCKSTEP" --coordinator 127.0.0.1:1 --json --version)"
# The top-level usage lists every flag of the commands it spells out in
# full (submit and run it abbreviates with "...").
"$LOCKSTEP" --help >"$T/usage.txt"
for cmd in status list logs cancel delete nodes watch certs; do
  "$LOCKSTEP" "$cmd" --help | python3 -c '
import re, sys
cmd, usage = sys.argv[1], open(sys.argv[2]).read()
common = {"coordinator", "token-file", "json", "tls-ca", "tls-cert", "tls-key", "insecure-plaintext"}
flags = [m.group(1) for m in re.finditer(r"^\s+(?:-\w, )?--([\w-]+)", sys.stdin.read(), re.M)]
line = next(l for l in usage.splitlines() if l.startswith("  " + cmd + " ") or l == "  " + cmd)
missing = [f for f in flags if f not in common and "--" + f + " " not in line + " " and "--" + f + "]" not in line]
sys.exit("lockstep --help: %s lacks %s: %r" % (cmd, ", ".join("--" + f for f in missing), line) if missing else 0)
' "$cmd" "$T/usage.txt" || fail "the top-level usage and $cmd --help disagree"
done
help=$(ls_cli submit --help)
grep -q -- "--nodes, --nnodes" <<<"$help" || fail "submit --help does not show --nnodes"
if grep -q "(default [^:].*(default: " <<<"$help"; then
  fail "submit --help contradicts itself: $(echo "$help" | grep "(default [^:].*(default: ")"
fi

# A job table larger than one ListJobs answer (16 MiB of jobs): 70 jobs left
# pending (3 nodes wanted) with 240 KiB of arguments each; list reads every
# page, in order, with each job once.
pad=$(python3 -c 'print("x" * 122880)')
for i in $(seq 70); do
  ls_cli submit --detach --nodes 3 -- /bin/true "$pad" "$pad" >/dev/null || fail "submitting pending job $i"
done
ls_cli list --json | python3 -c '
import json, sys
jobs = json.load(sys.stdin)["jobs"]
ids = [j["job_id"] for j in jobs]
assert len(ids) == 71 and len(set(ids)) == 71, "%d jobs, %d distinct, want 71" % (len(ids), len(set(ids)))
assert [j["state"] for j in jobs].count("PENDING") == 70, [j["state"] for j in jobs]
keys = [(int(j.get("submitted_unix_ms", 0)), j["job_id"]) for j in jobs]
assert keys == sorted(keys), "not in submit order"' || fail "list --json over several pages"
[ "$(ls_cli list | tail -n +2 | wc -l)" = 71 ] || fail "list does not show 71 jobs: $(ls_cli list | wc -l) lines"

rc=0
err=$("$LOCKSTEP" --coordinator "$COORD" --token-file "$T/no-such-token" list 2>&1) || rc=$?
[ "$rc" = 1 ] && grep -q -- "--token-file or \$LOCKSTEP_TOKEN_FILE" <<<"$err" ||
  fail "a missing token file: rc $rc, no hint: $err"
cp "$TOKEN" "$T/open-token" && chmod 0644 "$T/open-token"
err=$("$LOCKSTEP" --coordinator "$COORD" --token-file "$T/open-token" list 2>&1) && fail "an open token file was used"
grep -q "(mode 0644)" <<<"$err" || fail "the token file's mode is not printed in octal: $err"
# A worker that never starts (an unknown user): logs --follow ends with the
# job's state and exit 3, saying the rank left no output, not a read error.
never=$(ls_cli submit --detach --run-as lockstep-no-such-user -- /bin/true | sed -n 's/^submitted job //p')
rc=0; ls_cli logs "$never" --follow >/dev/null 2>"$T/never.err" || rc=$?
[ "$rc" = 3 ] && grep -q "rank 0 left no stdout on node .* (it never started: lockstep status $never says why)" "$T/never.err" &&
  grep -q "job $never FAILED" "$T/never.err" ||
  fail "logs --follow of a job whose worker never started: exit $rc: $(cat "$T/never.err")"
check_invariants "$job" 0
log "PASS"
