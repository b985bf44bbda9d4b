#!/usr/bin/env bash
# The kernel's OOM killer kills one rank of a real DDP job (examples/train,
# 1 node x 2 ranks, no restart budget): rank 1 leaks 16 MiB a step
# (--leak-rank), and the test moves it mid-training into a memory cgroup of
# its own limited to 64 MiB more than it is charged there, as a container's
# or a systemd slice's limit would stop a leak. The job is
# FAILED with rank 1 as the first failure, killed by signal 9 and said to be
# the OOM killer's (`status`: "(out of memory: the kernel's OOM killer)", the
# worker table "signal 9 (OOM)", the JSON's oom_killed); rank 0, if it
# failed on its own, is listed only as a consequence; no worker is left and
# nothing in /dev/shm. Needs root, a memory cgroup it can make and a
# readable kernel log (/dev/kmsg); skips otherwise.
#
# WHERE=cgroup (the 6th argument): the same with the daemon's kernel log
# off (--kernel-log=, as under the shipped units' sandbox or in a pod):
# the agent tells the OOM kill by rank 1's memory cgroup's count. Rank 1
# is stopped (SIGSTOP) while it is moved, until the agent has seen it in
# the cgroup, so the kill comes after.
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"
BACKEND="${5:-gloo}"
WHERE="${6:-kmsg}"
backend_args "$BACKEND"
if [ "$(id -u)" != 0 ]; then log "SKIP: needs root (a memory cgroup)"; exit 0; fi
if [ "$WHERE" = kmsg ] && ! python3 -c '
import errno, os
fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
try:
    os.read(fd, 8192)
except OSError as e:
    if e.errno != errno.EAGAIN: raise
' 2>/dev/null; then
  log "SKIP: the kernel log (/dev/kmsg) cannot be read here"
  exit 0
fi
# A memory cgroup: v2 (a child of the root, memory enabled there) or v1 (a
# child of this process's memory cgroup). limit_file and usage_file per version.
name="lockstep-e2e-oom-$$"
if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
  cg="/sys/fs/cgroup/$name" limit_file=memory.max usage_file=memory.current swap_file=memory.swap.max
else
  v1=$(sed -n 's/^[0-9]*:memory:\(.*\)$/\1/p' /proc/self/cgroup)
  cg="/sys/fs/cgroup/memory${v1%/}/$name" limit_file=memory.limit_in_bytes usage_file=memory.usage_in_bytes
  swap_file=memory.swappiness
fi
if ! mkdir "$cg" 2>/dev/null; then log "SKIP: cannot make a memory cgroup ($cg)"; exit 0; fi
EXTRA_CLEANUP="rmdir '$cg' 2>/dev/null || true"
echo 0 >"$cg/$swap_file" 2>/dev/null || true

# What the job could leave in /dev/shm: its workers run as this test's uid
# (the daemon's --job-uids=off, tests/e2e/lib.sh). Other tests running
# beside this one leave entries there too, of their own uids
# (job_isolation_test's job uids) or while they run: only this uid's
# entries count, and only those that are not there before.
shm_mine() { find /dev/shm -mindepth 1 -maxdepth 1 -uid "$(id -u)" -printf '%f\n' | sort; }
shm_before=$(shm_mine)
daemon_args=()
[ "$WHERE" = cgroup ] && daemon_args=(--kernel-log=)
start_coordinator "${daemon_args[@]}"
job=$(ls_cli submit --detach --json --nodes 1 --nproc-per-node 2 --max-restarts 0 "${env_args[@]}" -- \
  "$TRAIN" --model mlp_small --steps 100000 --step-delay-ms 20 --timeout-s 30 --leak-rank 1 --leak-mb 16 |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_for 60 grep -q '"rank":1,"step":3,' "$T/coord/jobs/$job/rank-1.stdout" ||
  fail "rank 1 of $job never reached step 3: $(ls_cli status "$job")"
victim=$(job_field "$job" '[w["pid"] for w in j["workers"] if w.get("rank", 0) == 1][0]')
[ "$WHERE" = cgroup ] && kill -STOP "$victim"
echo "$victim" >"$cg/cgroup.procs" || fail "could not move rank 1 (pid $victim) into $cg"
if [ "$WHERE" = cgroup ]; then
  wait_for 15 grep -q "job=$job rank=1 worker pid $victim is now in memory cgroup .*$name" "$T/coord.log" ||
    fail "the agent never saw rank 1 (pid $victim) in $cg"
fi
# Charges made before the move stay where they were (cgroup v2, and v1 by
# default): the limit is what it has been charged here since, plus 64 MiB,
# which the leak passes within a few steps.
limit=$(( $(cat "$cg/$usage_file") + (64 << 20) ))
echo "$limit" >"$cg/$limit_file" || fail "could not set $cg/$limit_file to $limit"
log "rank 1 (pid $victim) in $cg, limited to $limit bytes"
[ "$WHERE" = cgroup ] && kill -CONT "$victim"
wait_state "$job" FAILED 60
text=$(ls_cli status "$job")
grep -q "^failure: .* rank 1 on node .* killed by signal 9 (out of memory: the kernel's OOM killer)" <<<"$text" ||
  fail "status does not name rank 1 killed by the OOM killer: $text"
[ "$(job_field "$job" '"%s %s %s" % (j["first_failure"].get("rank", 0), j["first_failure"]["exit"].get("signal", 0), j["first_failure"]["exit"].get("oom_killed", False))')" = "1 9 True" ] ||
  fail "first_failure is not rank 1, signal 9, oom_killed: $(ls_cli status --json "$job")"
grep -q "signal 9 (OOM)" <<<"$text" || fail "the worker table does not say OOM: $text"
if grep -q "^then: *rank 1 on " <<<"$text"; then fail "rank 1 listed as a consequence: $text"; fi
if grep -q "^then: .*rank 0 " <<<"$text"; then
  grep -q "^then: .*rank 0 .*after rank 1 failed" <<<"$text" || fail "rank 0 is not listed as a consequence of rank 1: $text"
fi
if [ "$WHERE" = cgroup ]; then
  grep -q "job=$job rank=1 the kernel log is not readable here (--kernel-log is empty); the worker's memory cgroup .*$name counted 1 OOM kill" "$T/coord.log" ||
    fail "the agent's log does not give the cgroup's count as the reason: $(grep "rank=1 " "$T/coord.log" | tail -5)"
fi
grep -Eq "job=$job rank=1 worker pid $victim killed by signal 9 by the kernel's OOM killer \(out of memory\)" "$T/coord.log" ||
  fail "the agent's log does not say the OOM killer killed rank 1: $(grep "rank=1 worker" "$T/coord.log")"
wait_for 15 no_workers || fail "workers left: $(describe_workers)"
check_invariants "$job" 0
shm_new=$(comm -13 <(echo "$shm_before") <(shm_mine))
[ -z "$shm_new" ] || fail "the job left entries in /dev/shm: $shm_new"
printf "%s\n" "$text"
log "PASS: rank 1 killed by the OOM killer at a $limit-byte limit, named as such (from the $WHERE); $(grep -c '^then:' <<<"$text") consequence line(s)"
