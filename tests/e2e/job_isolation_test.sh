#!/usr/bin/env bash
# Job isolation as a root lockstepd does it by default (no --job-uids, no
# --run-as): each job's workers run as a uid of their own from 70000-70999,
# so a hostile job (B) cannot read another job's (A's) environment and
# tokens in /proc/PID/environ, signal its workers, list its job dir or the
# jobs/ dir, or read the daemon's admin token, though it reaches them all
# (a state dir under a dir every uid may traverse); when A ends, its uid's
# processes are gone and its job dir belongs to root again. The uids are leased host-wide
# (/run/lockstep/job-uids), and what A left in /tmp (a dir, a file in a shared 1777 dir), /dev/shm and System V
# IPC goes with its uid: a second daemon on the same host runs the other
# rank of a real 2-node DDP job (examples/train) as a different uid, and the
# job succeeds with identical parameters. A root daemon without CAP_SETUID,
# one with --job-uids=off or --run-as, and a non-root daemon each say at
# start that jobs are not isolated, and how. Needs root (skips otherwise).
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"
if [ "$(id -u)" != 0 ]; then log "SKIP: needs root to switch users"; exit 0; fi
DEFAULT_JOB_UIDS=1
in_range() { [[ "$1" =~ ^70[0-9][0-9][0-9]$ ]]; }

start_coordinator
grep -q "job isolation: each job runs as its own uid from 70000-70999 (host-wide leases in /run/lockstep/job-uids)" "$T/coord.log" ||
  fail "the daemon did not say at start that jobs are isolated: $(head -n 20 "$T/coord.log")"
job_id() { python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])'; }

# Jobs A and B run on a daemon whose state dir lies under a dir every uid
# may traverse: under Bazel's tree (/root, 0700) every probe of B's would
# be refused by /root, whatever the daemon's own modes.
bin=$(mktemp -d /tmp/lockstep-isolation.XXXXXX)
EXTRA_CLEANUP="rm -rf '$bin'"
chmod 0755 "$bin"
start_abs() {  # start_abs LOG: daemon abs on its state dir; its pid in $abs_pid
  rm -f "$bin/abs.addr"
  "$LOCKSTEPD" --coordinator --listen 127.0.0.1:0 --state-dir "$bin/state" --address-file "$bin/abs.addr" \
    --node-id abs >"$1" 2>&1 &
  abs_pid=$!
  DAEMON_PIDS+=("$abs_pid")
  wait_for 30 test -s "$bin/abs.addr" || fail "daemon abs did not become ready: $(tail -n 5 "$1")"
}
start_abs "$T/abs.log"
absc() { "$LOCKSTEP" --coordinator "$(cat "$bin/abs.addr")" --token-file "$bin/state/token" "$@"; }
abs_field() { absc status --json "$1" | python3 -c "import json,sys; j=json.load(sys.stdin); print($2)"; }
abs_state_is() { [ "$(abs_field "$1" 'j["state"]')" = "$2" ]; }

# A: records its uid, then waits (its store token is in its environment).
# A also leaves data where the next job given its uid would find it: a
# file in /dev/shm, a dir in /tmp, a System V shared memory segment.
left="lockstep-isolation-$$"
install -d -m 1777 "/tmp/$left-shared"  # a dir every user may write, not A's
jobA=$(absc submit --detach --json --nproc-per-node 1 -- /bin/sh -c \
  "echo a-data > /dev/shm/$left; mkdir /tmp/$left && echo a-data > /tmp/$left/f; echo a-data > /tmp/$left-shared/f; \
   ipcmk -M 4096 | sed -n 's/.*id: //p' > shmid.txt; id -u > uid.txt; exec sleep 300" | job_id)
EXTRA_CLEANUP="$EXTRA_CLEANUP; rm -rf '/dev/shm/$left' '/tmp/$left' '/tmp/$left-shared'"
wait_for 30 abs_state_is "$jobA" RUNNING || fail "job A is not RUNNING: $(absc status "$jobA")"
dirA="$bin/state/jobs/$jobA"
wait_for 30 test -s "$dirA/uid.txt" || fail "job A never wrote its uid"
uidA=$(cat "$dirA/uid.txt")
pidA=$(abs_field "$jobA" 'j["workers"][0]["pid"]')
grep -q LOCKSTEP_STORE_TOKEN "/proc/$pidA/environ" || fail "job A's worker has no store token to steal"
log "job A: uid $uidA, pid $pidA"

# B: tries everything against A and the daemon, and says what worked. The
# first two lines show the paths are reachable: B lists its own dir and
# passes through the state dir (search permission).
probe="id -u; \
  ls \"\$PWD\" >/dev/null 2>&1 && echo own-dir || echo OWN-DIR-REFUSED; \
  test -x $bin/state/jobs && echo reach || echo CANNOT-REACH; \
  cat /proc/$pidA/environ >/dev/null 2>&1 && echo READ-A-ENV || echo no-env; \
  kill -0 $pidA 2>/dev/null && echo SIGNAL-A || echo no-signal; \
  ls $dirA >/dev/null 2>&1 && echo LIST-A || echo no-list; \
  ls $bin/state/jobs >/dev/null 2>&1 && echo LIST-JOBS || echo no-list-jobs; \
  cat $bin/state/token >/dev/null 2>&1 && echo READ-TOKEN || echo no-token"
jobB=$(absc submit --detach --json --nproc-per-node 1 -- /bin/sh -c "$probe" | job_id)
wait_for 30 abs_state_is "$jobB" SUCCEEDED || fail "job B did not succeed: $(absc status "$jobB")"
out=$(absc logs "$jobB" --rank 0)
log "job B printed: $(echo "$out" | tr '\n' ' ')"
uidB=$(echo "$out" | sed -n '2p')
in_range "$uidA" && in_range "$uidB" || fail "uids $uidA and $uidB are not from the default range 70000-70999"
[ "$uidA" != "$uidB" ] || fail "jobs A and B share uid $uidA"
for want in own-dir reach no-env no-signal no-list no-list-jobs no-token; do
  grep -qx "$want" <<<"$out" || fail "job B was not stopped ($want missing): $out"
done
kill -0 "$pidA" || fail "job A's worker died"

# A ends: its uid's processes go, its dir is root's again (what it wrote
# stays readable to `lockstep logs`, not to the next job given the uid).
absc cancel "$jobA" >/dev/null
wait_for 30 abs_state_is "$jobA" CANCELLED || fail "job A was not cancelled: $(absc status "$jobA")"
# A function, so that wait_for stats the dir on every try (a $(stat) in
# wait_for's arguments is read once, before the agent has given it back).
owned_by_root() { [ "$(stat -c %u "$1")" = 0 ]; }
wait_for 30 owned_by_root "$dirA" ||
  fail "job A's dir still owned by uid $(stat -c %u "$dirA") after it ended"
[ "$(stat -c %u "$dirA/uid.txt")" = 0 ] || fail "job A's files not given back to root"
no_processes_of() { [ -z "$(pgrep -u "$1")" ]; }
wait_for 15 no_processes_of "$uidA" || fail "processes of uid $uidA outlived job A: $(pgrep -a -u "$uidA")"
wait_for 15 no_processes_of "$uidB" || fail "processes of uid $uidB outlived job B: $(pgrep -a -u "$uidB")"
wait_for 15 grep -q "uid $uidA returned" "$T/abs.log" || fail "the daemon did not log returning uid $uidA"
# What A left on the host went with its uid, as systemd's RemoveIPC does.
shmid=$(cat "$dirA/shmid.txt")
[ -n "$shmid" ] || fail "job A made no System V segment"
[ ! -e "/dev/shm/$left" ] && [ ! -e "/tmp/$left" ] && [ ! -e "/tmp/$left-shared/f" ] ||
  fail "what job A left outlived its uid: $(ls -ld "/dev/shm/$left" "/tmp/$left" "/tmp/$left-shared/f" 2>&1)"
[ -d "/tmp/$left-shared" ] || fail "the shared dir job A wrote into (root's) was removed"
if ipcs -m | awk -v id="$shmid" '$2 == id { found = 1 } END { exit !found }'; then
  fail "job A's System V segment $shmid outlived its uid: $(ipcs -m)"
fi
grep -Eq "removed what uid $uidA left: [0-9]+ entries under /tmp, /var/tmp, /dev/shm, /dev/mqueue and [0-9]+ System V IPC objects" "$T/abs.log" ||
  fail "the daemon did not log removing what uid $uidA left: $(grep "uid $uidA" "$T/abs.log")"

# Two daemons on one host, one rank each of a real DDP job: the trainer
# copied where every uid may run it (Bazel's tree is under /root, 0700).
install -m 0755 "$TRAIN" "$bin/train"
start_agent b
grep -q "job isolation: each job runs as its own uid from 70000-70999" "$T/b.log" ||
  fail "agent b did not say at start that jobs are isolated"
job=$(ls_cli submit --detach --json --nodes 2 --nproc-per-node 1 --max-restarts 0 -- \
  "$bin/train" --model mlp_small --steps 20 --timeout-s 30 | job_id)
wait_state "$job" SUCCEEDED 90
uids=()
for d in coord b; do
  u=$(sed -n "s/.*job=$job .*workers run as uid \([0-9]*\) (--job-uids).*/\1/p" "$T/$d.log" | head -n 1)
  in_range "$u" || fail "daemon $d: no uid from 70000-70999 for job $job: $(grep "$job" "$T/$d.log" | head -n 5)"
  uids+=("$u")
done
[ "${uids[0]}" != "${uids[1]}" ] || fail "the two daemons gave job $job's ranks the same uid ${uids[0]}"
sums=$(for r in 0 1; do
  ls_cli logs "$job" --rank "$r" | sed -n 's/.*"checksum":\([^,]*\),"abs_checksum":\([^,]*\),.*/\1 \2/p'
done)
[ "$(grep -c . <<<"$sums")" = 2 ] || fail "expected 2 checksum lines, got: $sums"
[ "$(sort -u <<<"$sums" | wc -l)" = 1 ] || fail "ranks ended with different parameters: $sums"
log "job $job: ranks as uids ${uids[*]}, one checksum $(head -n 1 <<<"$sums")"
for u in "${uids[@]}"; do
  wait_for 15 no_processes_of "$u" || fail "processes of uid $u outlived job $job: $(pgrep -a -u "$u")"
  left=$(find /dev/shm -maxdepth 1 -uid "$u")
  [ -z "$left" ] || fail "uid $u left in /dev/shm: $left"
done
check_invariants "$job" 0

# A worker reaches its own job dir by its absolute path ($PWD, what
# os.path.abspath and --checkpoint-dir $PWD/ckpt use): a daemon whose
# workers run as other uids makes its state dir and jobs/ 0711 (search, no
# listing). On daemon abs (above), under a dir every uid may traverse.
for d in "$bin/state" "$bin/state/jobs"; do
  [ "$(stat -c %a "$d")" = 711 ] || fail "$d is $(stat -c %a "$d"), want 711 (workers of other uids reach their job dir)"
done
out=$("$LOCKSTEP" --coordinator "$(cat "$bin/abs.addr")" --token-file "$bin/state/token" submit \
  --nproc-per-node 1 --max-restarts 0 -- /bin/sh -c 'touch "$PWD/abs.txt" && ls "$PWD" >/dev/null && id -u' 2>&1) ||
  fail "a worker could not use its job dir by its absolute path: $out"
abs_uid=$(sed -n 's/^\[0\] \([0-9]*\)$/\1/p' <<<"$out")
in_range "$abs_uid" || fail "the absolute-path job did not run as a job uid: $out"
log "a worker (uid $abs_uid) wrote and listed its job dir by its absolute path"

# A job cannot turn root's handling of its log files against the host: its
# worker (owning its job dir) replaces its log files with symlinks to a
# root-only file and fails; the agent (root) then reads the last lines of
# its stderr for the failure, writes the next round's header, opens and
# hands the files to the job's uid, and serves `lockstep logs`. None of
# that may follow the links: the file stays root's 0600 and unchanged, and
# its contents appear nowhere.
victim="$bin/victim"
printf 'ROOT-ONLY-SECRET\n' >"$victim"
chmod 0600 "$victim"
swap='if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  for f in rank-0.stdout rank-0.stderr; do rm -f "$f"; ln -s '"$victim"' "$f"; done; exit 1; fi
echo second-round'
job=$(absc submit --detach --json --nproc-per-node 1 --max-restarts 1 -- /bin/sh -c "$swap" | job_id)
state_of() { absc status --json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])'; }
finished() { [[ "$(state_of "$job")" =~ SUCCEEDED|FAILED ]]; }
wait_for 60 finished || fail "the symlinking job did not finish: $(absc status "$job")"
[ "$(stat -c '%u %a' "$victim")" = "0 600" ] || fail "a job's symlink got $victim chowned/chmodded: $(stat -c '%u %a' "$victim")"
[ "$(cat "$victim")" = ROOT-ONLY-SECRET ] || fail "root wrote into $victim through a job's symlink: $(cat "$victim")"
seen="$(absc status --json "$job"; absc logs "$job" --rank 0 2>&1; absc logs "$job" --rank 0 --stderr 2>&1)" || true
if grep -q ROOT-ONLY-SECRET <<<"$seen"; then fail "root read $victim through a job's symlink: $seen"; fi
log "log files a job replaced with symlinks were not followed (state $(state_of "$job"))"

# A daemon that stops while a job runs returns its uid clean before it
# exits; one that is killed (SIGKILL) cannot, and cleans that uid when it
# starts again (its job dir is still the uid's): no job ever finds what an
# earlier job of its uid left (checked with the file an earlier job left in
# /tmp and its job dir).
secret_job() {  # secret_job NAME: a job leaving /tmp/$left-NAME, as its uid
  absc submit --detach --json --nproc-per-node 1 --max-restarts 0 -- /bin/sh -c \
    "[ \"\$TORCHELASTIC_RESTART_COUNT\" = 0 ] && echo secret-of-$1 > /tmp/$left-$1; id -u > uid.txt; exec sleep 300" | job_id
}
EXTRA_CLEANUP="$EXTRA_CLEANUP; rm -f '/tmp/$left-c' '/tmp/$left-d'"
jobC=$(secret_job c)
wait_for 30 test -s "$bin/state/jobs/$jobC/uid.txt" || fail "job C never started: $(absc status "$jobC")"
uidC=$(cat "$bin/state/jobs/$jobC/uid.txt")
[ "$(stat -c %u "/tmp/$left-c")" = "$uidC" ] || fail "job C left no file of its uid $uidC"
kill -TERM "$abs_pid"
wait_for 30 exited "$abs_pid" || fail "daemon abs did not stop on SIGTERM"
[ ! -e "/tmp/$left-c" ] || fail "a daemon stopped with SIGTERM left job C's file (uid $uidC): $(ls -ln "/tmp/$left-c")"
grep -q "job=$jobC .*uid $uidC returned" "$T/abs.log" || fail "daemon abs did not log returning uid $uidC as it stopped"
start_abs "$T/abs2.log"
jobD=$(secret_job d)
dirD="$bin/state/jobs/$jobD"
wait_for 30 test -s "$dirD/uid.txt" || fail "job D never started: $(absc status "$jobD")"
uidD=$(cat "$dirD/uid.txt")
kill -KILL "$abs_pid"
wait_for 15 no_processes_of "$uidD" || fail "job D's worker outlived its killed daemon: $(pgrep -a -u "$uidD")"
[ "$(stat -c %u "/tmp/$left-d" "$dirD" | sort -u)" = "$uidD" ] ||
  fail "expected job D's file and dir still to be uid $uidD's after the daemon's SIGKILL: $(ls -lnd "/tmp/$left-d" "$dirD")"
start_abs "$T/abs3.log"
out=$(absc submit --nproc-per-node 1 --max-restarts 0 -- /bin/sh -c "id -u; cat /tmp/$left-d 2>&1 || true; ls $dirD 2>&1 || true" 2>&1) ||
  fail "the job after the killed daemon failed: $out"
if grep -q "secret-of-d\|uid.txt" <<<"$out"; then fail "a job read what job D (uid $uidD) left: $out"; fi
grep -q "job dirs under $bin/state/jobs are still uid $uidD's (this daemon stopped before returning it): cleaning it" "$T/abs3.log" ||
  fail "the restarted daemon did not say it cleans uid $uidD: $(grep "uid $uidD" "$T/abs3.log")"
wait_for 15 grep -q "uid $uidD cleaned of an earlier job's leftovers (1 job dir(s) given back to root)" "$T/abs3.log" ||
  fail "the restarted daemon did not clean uid $uidD: $(grep "uid $uidD" "$T/abs3.log")"
[ ! -e "/tmp/$left-d" ] && owned_by_root "$dirD" ||
  fail "uid $uidD not cleaned: $(ls -lnd "/tmp/$left-d" "$dirD" 2>&1)"
log "uids came back clean: $uidC as its daemon stopped, $uidD (its daemon killed) as it started again; the next job ran as uid $(sed -n 's/^\[0\] \([0-9]*\)$/\1/p' <<<"$out" | head -n 1)"

# A root daemon that cannot switch users (a container or unit that dropped
# CAP_SETUID and CAP_SETGID) says at start that jobs are not isolated, and
# refuses an explicit --job-uids.
DAEMON_PREFIX=(setpriv --bounding-set=-setuid,-setgid)
start_agent nocaps
DAEMON_PREFIX=()
grep -q "jobs are not isolated: their workers run as root, because this root daemon lacks CAP_SETUID, CAP_SETGID" "$T/nocaps.log" ||
  fail "a root daemon without CAP_SETUID did not say jobs are not isolated: $(head -n 20 "$T/nocaps.log")"
if grep -q "job isolation: each job runs as its own uid" "$T/nocaps.log"; then
  fail "a root daemon without CAP_SETUID claimed per-job uids: $(head -n 20 "$T/nocaps.log")"
fi
rc=0
timeout 20 setpriv --bounding-set=-setuid,-setgid "$LOCKSTEPD" --coordinator --listen 127.0.0.1:0 \
  --state-dir "$T/nocaps-explicit" --job-uids 70000-70009 >"$T/nocaps-explicit.log" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q -- "--job-uids needs CAP_SETUID, CAP_SETGID, which this lockstepd lacks" "$T/nocaps-explicit.log" ||
  fail "--job-uids without CAP_SETUID: exit $rc: $(cat "$T/nocaps-explicit.log")"

# The other ways a daemon leaves jobs unisolated, each said at start:
# --job-uids=off, --run-as, and a daemon that is not root. Each daemon's
# state dir and address file lie in $bin/NAME, made beforehand.
says_at_start() {  # says_at_start NAME MESSAGE [prefix...] -- [lockstepd flags...]
  local name=$1 want=$2 prefix=() pid
  shift 2
  while [ "$1" != -- ]; do prefix+=("$1"); shift; done
  shift
  ${prefix[@]+"${prefix[@]}"} "$LOCKSTEPD" --coordinator --listen 127.0.0.1:0 \
    --state-dir "$bin/$name/state" --address-file "$bin/$name/addr" "$@" >"$T/$name.log" 2>&1 &
  pid=$!
  DAEMON_PIDS+=("$pid")
  wait_for 30 test -s "$bin/$name/addr" ||
    fail "daemon $name did not become ready: $(tail -n 5 "$T/$name.log")"
  grep -qF -- "$want" "$T/$name.log" || fail "daemon $name did not say \"$want\": $(head -n 20 "$T/$name.log")"
  if grep -q "job isolation: each job runs as its own uid" "$T/$name.log"; then
    fail "daemon $name claimed per-job uids: $(head -n 20 "$T/$name.log")"
  fi
  log "daemon $name said at start: $want"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}
mkdir -m 0700 "$bin/off" "$bin/runas"
install -d -o 65534 -g 65534 -m 0700 "$bin/nonroot"
says_at_start off "jobs are not isolated: their workers run as root (--job-uids=off)" -- --job-uids=off
says_at_start runas "jobs are not isolated from each other: every job runs as nobody (--job-uids gives each its own uid)" \
  -- --run-as nobody
says_at_start nonroot "jobs are not isolated: their workers run as this daemon's uid 65534 and can read its token" \
  setpriv --reuid=65534 --regid=65534 --clear-groups --
log "PASS"
