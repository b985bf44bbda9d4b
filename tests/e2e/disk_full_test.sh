#!/usr/bin/env bash
# The coordinator's state dir fills up (a small tmpfs, filled by a ballast
# file) while a real 2-rank DDP job (examples/train) runs and a short job
# ends. The job store cannot be written; nothing else breaks:
#   - the agent's heartbeats still renew its lease (the coordinator says
#     the reports were not applied): the DDP job runs on past several
#     leases, no restart, no worker stopped;
#   - a submit is refused, naming the full disk, and leaves no job behind;
#   - no state change is logged as made while it is not written;
#   - once space is back, the short job's end is written (SUCCEEDED), the
#     DDP job succeeds in round 1 with identical parameters on both ranks.
# Then a job prints 20 MiB into the 16 MB state dir: --max-log-mb 1 rotates
# its log, the disk never fills and the job's end is written.
# Needs root (mount); runs in a mount namespace of its own (skips where
# it cannot make one).
if [ -z "${LOCKSTEP_DISK_FULL_NS:-}" ]; then
  # A mount namespace of its own where a tmpfs can be mounted.
  can_mount='d=$(mktemp -d) && mount -t tmpfs -o size=1m lockstep-probe "$d" && umount "$d"; r=$?; rmdir "$d"; exit $r'
  if [ "$(id -u)" != 0 ] || ! unshare -m --propagation private sh -c "$can_mount" 2>/dev/null; then
    echo "SKIP: needs root, a mount namespace (unshare -m) and tmpfs mounts in it"
    exit 0
  fi
  LOCKSTEP_DISK_FULL_NS=1 exec unshare -m --propagation private -- bash "$0" "$@"
fi
LEASE_S=2
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"

mkdir -p "$T/coord"
mount -t tmpfs -o size=16m lockstep-disk-full-test "$T/coord" || fail "cannot mount a tmpfs on $T/coord"
start_coordinator --max-log-mb 1
# The DDP job trains for 15 s or more, dumping its parameters outside the
# full disk (its stdout, on it, loses lines while the disk is full).
ddp=$(ls_cli submit --detach --json --nproc-per-node 2 --max-restarts 0 -- "$TRAIN" --model mlp_small \
  --steps 150 --step-delay-ms 100 --timeout-s 60 --dump-params "$T/out/params" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$ddp" RUNNING 30
wait_for 30 grep -q '"rank":1,"step":3,' "$T/coord/jobs/$ddp/rank-1.stdout" || fail "rank 1 never reached step 3"
short=$(ls_cli submit --detach --json --nproc-per-node 1 -- /bin/sh -c \
  "while [ ! -e '$T/out/go' ]; do sleep 0.05; done; exit 0" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$short" RUNNING 30

dd if=/dev/zero of="$T/coord/ballast" bs=64k 2>/dev/null || true
log "state dir full: $(df -h "$T/coord" | tail -n 1)"
rc=0
out=$(ls_cli submit --detach --nproc-per-node 1 -- /bin/true 2>&1) || rc=$?
[ "$rc" != 0 ] && grep -q "database or disk is full; the job may or may not have been accepted" <<<"$out" ||
  fail "a submit to a full state dir: exit $rc: $out"
# The short job's worker ends; several leases pass.
touch "$T/out/go"
sleep $((4 * LEASE_S))
state_is "$ddp" RUNNING || fail "the DDP job did not stay RUNNING while the disk was full: $(job_state "$ddp")"
state_is "$short" RUNNING || fail "the short job's end was recorded though nothing could be written"
grep -q "persisting the job failed, change (to SUCCEEDED) discarded (made again from the next report): .*database or disk is full" "$T/coord.log" ||
  fail "the coordinator did not say the short job's end was not written: $(grep -m3 'persisting' "$T/coord.log")"
grep -q "could not apply its job reports; they go again with every heartbeat: .*database or disk is full" "$T/coord.log" ||
  fail "the agent did not say its reports were not applied"
if grep -Eq "heartbeat failed|stopped this node's workers|lease not renewed" "$T/coord.log"; then
  fail "the agent lost its lease while the coordinator could not write: $(grep -Em3 "heartbeat failed|stopped this node's workers|lease not renewed" "$T/coord.log")"
fi
if grep -q "job=$short rank=- SUCCEEDED" "$T/coord.log"; then
  fail "the short job's SUCCEEDED was logged before it was written"
fi

rm "$T/coord/ballast"
log "space back: $(df -h "$T/coord" | tail -n 1)"
wait_state "$short" SUCCEEDED 15
[ "$(grep -c "job=$short rank=- SUCCEEDED" "$T/coord.log")" = 1 ] ||
  fail "the short job's SUCCEEDED logged other than once: $(grep "job=$short rank=- SUCCEEDED" "$T/coord.log")"
wait_state "$ddp" SUCCEEDED 90
[ "$(job_field "$ddp" 'j.get("restart_count", 0)')" = 0 ] || fail "the DDP job restarted"
[ "$(job_field "$ddp" 'j["round"]')" = 1 ] || fail "the DDP job did not finish in round 1"
[ -s "$T/out/params.0" ] && [ -s "$T/out/params.1" ] || fail "no parameter dumps: $(ls "$T/out")"
cmp -s "$T/out/params.0" "$T/out/params.1" || fail "ranks ended with different parameters"
[ "$(ls_cli list --json | grep -o '"job_id"' | wc -l)" = 2 ] || fail "the refused submit left a job: $(ls_cli list)"
check_invariants "$ddp" 0

# A job that prints 20 MiB, 512 KiB every 0.25 s, into the 16 MB state dir:
# its log is rotated once past 1 MiB (--max-log-mb 1; looked at every
# second, so a log holds at most 1 MiB + a second's output, as does .1),
# the disk never fills and the job's end is written.
chatty=$(ls_cli submit --detach --json --nproc-per-node 1 -- /bin/sh -c \
  'for i in $(seq 40); do head -c 524288 /dev/zero | tr "\0" x; echo " chunk $i"; sleep 0.25; done' |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
wait_state "$chatty" SUCCEEDED 60
used_mb=$(du -sm "$T/coord" | cut -f1)
(( used_mb <= 12 )) || fail "the state dir holds $used_mb MB after a job printed 20 MiB with --max-log-mb 1"
grep -q "job=$chatty rank=0 rank-0.stdout grew past 1048576 bytes: its [0-9]* bytes moved to rank-0.stdout.1" "$T/coord.log" ||
  fail "no rotation of the chatty job's log was logged"
grep -q "chunk 40$" "$T/coord/jobs/$chatty/rank-0.stdout" "$T/coord/jobs/$chatty/rank-0.stdout.1" ||
  fail "the chatty job's last chunk is in neither its log nor .1"
log "a job that printed 20 MiB left $used_mb MB in the state dir"
log "PASS"
