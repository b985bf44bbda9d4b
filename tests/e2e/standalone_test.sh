#!/usr/bin/env bash
# `lockstep run` (and `submit --standalone`): one command starts a private
# coordinator and agent, runs the job, streams every rank's output with a
# "[R] " prefix, stops the daemon and exits with the job's state:
#   - real DDP, 2 ranks: exit 0, both ranks' lines, identical parameters;
#   - a failing program with one restart: exit 3, its output from both
#     rounds, FAILED;
#   - SIGINT mid-job: the job is cancelled, exit 130;
#   - the CLI killed with SIGKILL: its daemon and the workers still go
#     (the daemon's parent-death signal);
#   - a process the program left running in a session of its own is
#     killed with the job;
#   - a CLI copied out of the Bazel tree finds lockstepd through
#     $LOCKSTEPD, else beside itself, else on PATH;
#   - usage errors name the flag;
#   - without --state-dir a 0700 dir under $TMPDIR keeps the logs, and
#     --json prints only the final job.
# In every case nothing is left running. (Its jobs use Gloo, which shares
# no memory: ddp_trainer_test and straggler_test check shm segments.)
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"

# The daemons a run started: lockstepd processes whose state dir is under $T.
run_daemons() { pgrep -f -- "--state-dir=$T/" || true; }
nothing_left() { [ -z "$(run_daemons)" ] && no_workers; }
assert_nothing_left() {
  wait_for 20 nothing_left ||
    fail "left running after $1: daemons [$(run_daemons)] workers [$(worker_pids)]"
}

# 1. Real DDP over Gloo, lockstepd found beside the CLI (the Bazel tree).
rc=0
"$LOCKSTEP" run --state-dir "$T/run1" --nproc-per-node 2 -- \
  "$TRAIN" --model mlp_small --steps 20 --timeout-s 60 >"$T/run1.out" 2>"$T/run1.err" || rc=$?
cat "$T/run1.out"
[ "$rc" = 0 ] || fail "lockstep run of a 2-rank DDP job exited $rc: $(tail -n 20 "$T/run1.err")"
grep -q '^lockstep: SUCCEEDED' "$T/run1.out" || fail "run did not print SUCCEEDED"
for r in 0 1; do
  grep -q "^\[$r\] .*\"rank\":$r,\"step\":20," "$T/run1.out" || fail "no step-20 line of rank $r"
done
sums=$(sed -n 's/^\[[01]\] .*"checksum":\([^,]*\),"abs_checksum":\([^,]*\),.*/\1 \2/p' "$T/run1.out")
[ "$(echo "$sums" | wc -l)" = 2 ] || fail "expected 2 checksum lines, got: $sums"
[ "$(echo "$sums" | sort -u | wc -l)" = 1 ] || fail "ranks ended with different parameters: $sums"
grep -q '^\[0\] .*connected gloo communicator of 2 ranks' "$T/run1.err" ||
  fail "rank 0's stderr was not streamed with its prefix: $(head -n 5 "$T/run1.err")"
# The agent heads each rank's stdout and stderr alike: shown once.
for r in 0 1; do
  [ "$(cat "$T/run1.out" "$T/run1.err" | grep -c "^\[$r\] === lockstep: job ")" = 1 ] ||
    fail "rank $r's header shown other than once: $(grep -h '=== lockstep' "$T/run1.out" "$T/run1.err")"
done
[ -s "$T/run1/coordinator.db" ] || fail "the state dir was not kept"
assert_nothing_left "a run that succeeded"

# 2. A program that fails, with one restart: both rounds' output, exit 3.
rc=0
"$LOCKSTEP" run --lockstepd "$LOCKSTEPD" --state-dir "$T/run2" --max-restarts 1 -- \
  /bin/sh -c 'echo "boom in round $LOCKSTEP_ROUND" >&2; exit 7' >"$T/run2.out" 2>"$T/run2.err" || rc=$?
[ "$rc" = 3 ] || fail "a failing job's run exited $rc, not 3"
grep -q '^lockstep: FAILED' "$T/run2.out" || fail "run did not print FAILED: $(cat "$T/run2.out")"
grep -qx '\[0\] boom in round 1' "$T/run2.err" || fail "round 1's stderr missing: $(cat "$T/run2.err")"
grep -qx '\[0\] boom in round 2' "$T/run2.err" || fail "round 2's stderr missing: $(cat "$T/run2.err")"
assert_nothing_left "a failed run"

# A spec the private daemon refuses is bad usage (exit 2), as for submit.
rc=0
"$LOCKSTEP" run --lockstepd "$LOCKSTEPD" --state-dir "$T/run-refused" --nproc-per-node 0 -- /bin/true \
  >"$T/run-refused.out" 2>"$T/run-refused.err" || rc=$?
[ "$rc" = 2 ] || fail "run of a refused spec exited $rc, not 2: $(cat "$T/run-refused.err")"
grep -q 'spec.nproc_per_node' "$T/run-refused.err" || fail "run's refusal lacks the field: $(cat "$T/run-refused.err")"
assert_nothing_left "a refused run"

# 3. SIGINT while the job runs (submit --standalone): cancelled, exit 130.
"$LOCKSTEP" submit --standalone --state-dir "$T/run3" --nproc-per-node 2 -- \
  "$TRAIN" --model mlp_small --steps 100000 --step-delay-ms 50 --timeout-s 60 \
  >"$T/run3.out" 2>"$T/run3.err" &
cli=$!
wait_for 60 grep -q '^\[1\] .*"step":3,' "$T/run3.out" || fail "run 3 never reached step 3 on rank 1"
kill -INT "$cli"
wait_for 60 exited "$cli" || fail "run 3's CLI (pid $cli) did not exit within 60 s of SIGINT: $(tail -n 5 "$T/run3.err")"
rc=0
wait "$cli" || rc=$?
[ "$rc" = 130 ] || fail "SIGINT: run exited $rc, not 130: $(tail -n 5 "$T/run3.err")"
grep -q '^lockstep: CANCELLED' "$T/run3.out" || fail "run 3 did not end CANCELLED: $(tail -n 3 "$T/run3.out")"
grep -q 'signal 2: cancelling job' "$T/run3.err" || fail "run 3 did not say why it cancelled"
assert_nothing_left "SIGINT"

# 4. The CLI killed outright: the daemon's parent-death signal stops it,
# and it stops the workers.
"$LOCKSTEP" run --state-dir "$T/run4" --nproc-per-node 2 -- \
  "$TRAIN" --model mlp_small --steps 100000 --step-delay-ms 50 --timeout-s 60 \
  >"$T/run4.out" 2>"$T/run4.err" &
cli=$!
wait_for 60 grep -q '^\[1\] .*"step":3,' "$T/run4.out" || fail "run 4 never reached step 3 on rank 1"
kill -KILL "$cli"
wait "$cli" 2>/dev/null || true
assert_nothing_left "SIGKILL of the CLI"
grep -q 'stopping' "$T/run4/lockstepd.log" || fail "the daemon did not log stopping its workers"

# 4b. A program that leaves a process running in a session of its own
# (setsid) and exits: the agent kills it with the job; nothing outlives the
# run. The program exits only once the helper is in its own session (it
# writes its pid from there): one still in the program's process group
# would go with that group, not by the agent's sweep this checks.
rc=0
"$LOCKSTEP" run --state-dir "$T/run4b" -- /bin/sh -c \
  "setsid sh -c 'echo \$\$ > \"$T/helper.pid.tmp\"; mv \"$T/helper.pid.tmp\" \"$T/helper.pid\"; exec sleep 300' </dev/null >/dev/null 2>&1 &
   while [ ! -s '$T/helper.pid' ]; do sleep 0.01; done; exit 0" \
  >"$T/run4b.out" 2>"$T/run4b.err" || rc=$?
[ "$rc" = 0 ] || fail "the run that left a helper exited $rc: $(tail -n 5 "$T/run4b.err")"
helper=$(cat "$T/helper.pid")
helper_gone() { ! kill -0 "$helper" 2>/dev/null; }
wait_for 10 helper_gone || fail "the helper (pid $helper, setsid) outlived its run: $(ps -o pid,ppid,sess,cmd -p "$helper")"
# Named by its command when killed: sh, or sleep once it has exec'd.
grep -Eq "killed pid $helper \((sh|sleep) and its process group\), which round 1's workers left running" "$T/run4b/lockstepd.log" ||
  fail "the daemon did not log killing the helper: $(grep -i 'killed pid' "$T/run4b/lockstepd.log")"
assert_nothing_left "a run that left a helper"

# 5. Where a CLI outside the Bazel tree finds lockstepd, in order: $LOCKSTEPD,
# beside itself, on PATH. Each candidate is a wrapper that notes its use and
# runs the real daemon; a copy of the CLI sits where nothing else is found.
wrapper() {  # wrapper DIR NAME: DIR/lockstepd, which appends NAME to $T/used
  mkdir -p "$1"
  printf '#!/bin/sh\necho %s >>"%s/used"\nexec "%s" "$@"\n' "$2" "$T" "$LOCKSTEPD" >"$1/lockstepd"
  chmod 0755 "$1/lockstepd"
}
wrapper "$T/env" env
wrapper "$T/beside" beside
wrapper "$T/path" path
cp "$LOCKSTEP" "$T/beside/lockstep"
mkdir -p "$T/alone" && cp "$LOCKSTEP" "$T/alone/lockstep"
found_by() {  # found_by WANT CLI [env...]: a run of /bin/true used wrapper WANT only
  local want=$1 cli=$2 out rc=0
  shift 2
  rm -f "$T/used"
  out=$(env "$@" "$cli" run --state-dir "$T/find-$want" -- /bin/true 2>&1) || rc=$?
  [ "$rc" = 0 ] || fail "lockstep run, lockstepd to be found by $want: exit $rc: $out"
  [ "$(cat "$T/used" 2>/dev/null)" = "$want" ] ||
    fail "lockstep run should have found lockstepd by $want, used: [$(cat "$T/used" 2>/dev/null)]"
}
clean_path=PATH=/usr/bin:/bin
found_by env "$T/beside/lockstep" LOCKSTEPD="$T/env/lockstepd" PATH="$T/path:/usr/bin:/bin"
found_by beside "$T/beside/lockstep" -u LOCKSTEPD PATH="$T/path:/usr/bin:/bin"
found_by beside "$T/beside/lockstep" LOCKSTEPD="$T/nonexistent" "$clean_path"
found_by path "$T/alone/lockstep" -u LOCKSTEPD PATH="$T/path:/usr/bin:/bin"
rc=0
out=$(env -u LOCKSTEPD "$clean_path" "$T/alone/lockstep" run --state-dir "$T/find-none" -- /bin/true 2>&1) || rc=$?
[ "$rc" = 1 ] && grep -q "cannot find lockstepd to start (tried $T/alone/lockstepd, .*lockstepd on PATH); pass --lockstepd PATH or set LOCKSTEPD" <<<"$out" ||
  fail "no lockstepd anywhere: exit $rc: $out"
assert_nothing_left "finding lockstepd"

# 6. Usage errors name what was wrong and start nothing.
expect_usage "--nodes must be 1" "$LOCKSTEP" run --nodes 2 -- /bin/true
expect_usage "--coordinator cannot be used with lockstep run" "$LOCKSTEP" run --coordinator 127.0.0.1:1 -- /bin/true
# Every flag that names a cluster is refused, not ignored, however given;
# `run --help` does not list them.
expect_usage "--tls-ca cannot be used with lockstep run" "$LOCKSTEP" run --tls-ca /nonexistent -- /bin/true
expect_usage "--token-file cannot be used with lockstep run" "$LOCKSTEP" --token-file /x run -- /bin/true
expect_usage "--insecure-plaintext cannot be used with --standalone" "$LOCKSTEP" submit --standalone --insecure-plaintext -- /bin/true
expect_usage "always starts its own daemon" "$LOCKSTEP" run --no-standalone -- /bin/true
help=$("$LOCKSTEP" run --help)
for f in coordinator token-file tls-ca tls-cert tls-key insecure-plaintext standalone detach wait; do
  if grep -qE -- "^  (-., )?--$f\b" <<<"$help"; then fail "lockstep run --help lists --$f: $help"; fi
done
grep -q -- "--state-dir  *the private daemon's state dir" <<<"$help" || fail "run --help: $help"
expect_usage "need --standalone" "$LOCKSTEP" submit --state-dir "$T/x" -- /bin/true
expect_usage "no command to run" "$LOCKSTEP" run
rc=0
out=$(LOCKSTEPD=/nonexistent PATH=/usr/bin:/bin "$LOCKSTEP" run --lockstepd /nonexistent -- /bin/true 2>&1) || rc=$?
[ "$rc" = 1 ] && grep -q "not an executable file" <<<"$out" || fail "a missing lockstepd: rc $rc: $out"
[ ! -e "$T/x" ] || fail "a refused run made its state dir"
assert_nothing_left "usage errors"

# Without --state-dir: a new 0700 $TMPDIR/lockstep-run-XXXXXX, kept with the
# job's logs. With --json: only the final job, as JSON, on stdout.
mkdir -p "$T/tmpdir"
rc=0
TMPDIR="$T/tmpdir" "$LOCKSTEP" run --json -- /bin/echo hello-json >"$T/json.out" 2>"$T/json.err" || rc=$?
[ "$rc" = 0 ] || fail "lockstep run --json exited $rc: $(tail -n 5 "$T/json.err")"
python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["state"] == "SUCCEEDED", j["state"]' \
  "$T/json.out" || fail "run --json did not print the job as JSON: $(cat "$T/json.out")"
[ "$(wc -l <"$T/json.out")" = 1 ] && ! grep -q '^\[0\]' "$T/json.out" ||
  fail "run --json printed more than the job: $(cat "$T/json.out")"
dirs=("$T"/tmpdir/lockstep-run-*)
[ "${#dirs[@]}" = 1 ] && [ "$(stat -c %a "${dirs[0]}")" = 700 ] ||
  fail "no single 0700 state dir under \$TMPDIR: ${dirs[*]}"
grep -qx hello-json "${dirs[0]}"/jobs/*/rank-0.stdout || fail "the job's log was not kept in ${dirs[0]}"
assert_nothing_left "run --json"
log "PASS"
