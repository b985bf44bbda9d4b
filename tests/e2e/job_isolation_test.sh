#!/usr/bin/env bash
# Job isolation with --job-uids: each job's workers run as a uid of their
# own, so a hostile job (B) cannot read another job's (A's) environment and
# tokens in /proc/PID/environ, signal its workers, list its job dir, or read
# the daemon's admin token; when A ends, its uid's processes are gone and
# its job dir belongs to root again. Needs root (skips otherwise).
source tests/e2e/lib.sh "$1" "$2" "$3"
if [ "$(id -u)" != 0 ]; then log "SKIP: needs root to switch users"; exit 0; fi

start_coordinator --job-uids 61184-61189
job_id() { python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])'; }

# A: records its uid, then waits (its store token is in its environment).
jobA=$(ls_cli submit --detach --json --nproc-per-node 1 -- /bin/sh -c 'id -u > uid.txt; exec sleep 300' | job_id)
wait_state "$jobA" RUNNING 30
wait_for 30 test -s "$T/coord/jobs/$jobA/uid.txt" || fail "job A never wrote its uid"
uidA=$(cat "$T/coord/jobs/$jobA/uid.txt")
pidA=$(job_field "$jobA" 'j["workers"][0]["pid"]')
grep -q LOCKSTEP_STORE_TOKEN "/proc/$pidA/environ" || fail "job A's worker has no store token to steal"
log "job A: uid $uidA, pid $pidA"

# B: tries everything against A and the daemon, and says what worked.
probe="id -u; \
  cat /proc/$pidA/environ >/dev/null 2>&1 && echo READ-A-ENV || echo no-env; \
  kill -0 $pidA 2>/dev/null && echo SIGNAL-A || echo no-signal; \
  ls $T/coord/jobs/$jobA >/dev/null 2>&1 && echo LIST-A || echo no-list; \
  cat $T/coord/token >/dev/null 2>&1 && echo READ-TOKEN || echo no-token"
jobB=$(ls_cli submit --detach --json --nproc-per-node 1 -- /bin/sh -c "$probe" | job_id)
wait_state "$jobB" SUCCEEDED 30
out=$(ls_cli logs "$jobB" --rank 0)
log "job B printed: $(echo "$out" | tr '\n' ' ')"
uidB=$(echo "$out" | sed -n '2p')
[[ "$uidA" =~ ^6118[4-9]$ && "$uidB" =~ ^6118[4-9]$ ]] || fail "uids $uidA and $uidB are not from --job-uids 61184-61189"
[ "$uidA" != "$uidB" ] || fail "jobs A and B share uid $uidA"
for want in no-env no-signal no-list no-token; do
  echo "$out" | grep -qx "$want" || fail "job B was not stopped ($want missing): $out"
done
kill -0 "$pidA" || fail "job A's worker died"

# A ends: its uid's processes go, its dir is root's again (what it wrote
# stays readable to `lockstep logs`, not to the next job given the uid).
ls_cli cancel "$jobA" >/dev/null
wait_state "$jobA" CANCELLED 30
# A function, so that wait_for stats the dir on every try (a $(stat) in
# wait_for's arguments is read once, before the agent has given it back).
owned_by_root() { [ "$(stat -c %u "$1")" = 0 ]; }
wait_for 30 owned_by_root "$T/coord/jobs/$jobA" ||
  fail "job A's dir still owned by uid $(stat -c %u "$T/coord/jobs/$jobA") after it ended"
[ "$(stat -c %u "$T/coord/jobs/$jobA/uid.txt")" = 0 ] || fail "job A's files not given back to root"
[ -z "$(pgrep -u "$uidA")" ] || fail "processes of uid $uidA outlived job A: $(pgrep -u "$uidA")"
grep -q "uid $uidA returned" "$T/coord.log" || fail "the daemon did not log returning uid $uidA"
grep -q "job isolation: each job runs as its own uid from 61184-61189" "$T/coord.log" ||
  fail "the daemon did not say at start that jobs are isolated"
check_invariants "$jobB" 0
log "PASS"
