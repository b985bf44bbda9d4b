#!/usr/bin/env bash
# A job's store token opens its store only while the job runs. A real DDP
# job (examples/train, one rank) succeeds; then the same trainer started by
# hand with that job's store environment (LOCKSTEP_STORE, its token, its
# job id and round) is refused at once, naming the job and that it ended;
# after `lockstep delete` likewise (no such job). Before, both were let in,
# and what they wrote stayed in the coordinator's memory for good, up to
# the per-job quota per token. The next job is unaffected.
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"

start_coordinator
job_id() { python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])'; }
job=$(ls_cli submit --detach --json --nproc-per-node 1 -- /bin/sh -c \
  'env | grep -E "^LOCKSTEP_(JOB_ID|RANK|ROUND|STORE|STORE_TOKEN|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|NODE_RANK|NUM_NODES|NODE_ADDR)=" > store.env; exec "$0" "$@"' \
  "$TRAIN" --model mlp_small --steps 3 --timeout-s 30 | job_id)
wait_state "$job" SUCCEEDED 60
grep -q '"rank":0,"step":3,' "$T/coord/jobs/$job/rank-0.stdout" || fail "the job never trained"
mapfile -t store_env <"$T/coord/jobs/$job/store.env"
((${#store_env[@]} >= 8)) || fail "the job's environment is missing: ${store_env[*]}"

# by_hand WANT: the trainer with the ended job's store environment fails
# within its 5 s timeout, saying WANT.
by_hand() {
  local rc=0 out
  out=$(env -i PATH=/usr/bin:/bin "${store_env[@]}" timeout 60 "$TRAIN" --model mlp_small --steps 3 \
    --timeout-s 5 2>&1) || rc=$?
  [ "$rc" = 1 ] && ! grep -q "may or may not" <<<"$out" || fail "the trainer with job $job's ended store token exited $rc: $out"
  grep -qF -- "$1" <<<"$out" || fail "the refusal does not say '$1': $out"
  log "refused: $(grep -m1 'store' <<<"$out")"
}
by_hand "store: job \"$job\" has ended (SUCCEEDED): its store takes no more calls"
ls_cli delete "$job" >/dev/null
by_hand "store: no running job \"$job\" (it ended, was deleted or never existed)"

rc=0
out=$(CLI_PREFIX=(timeout 180); ls_cli submit --nproc-per-node 1 -- "$TRAIN" --model mlp_small \
  --steps 3 --timeout-s 30) || rc=$?
next=$(sed -n 's/^submitted job //p' <<<"$out")
[ "$rc" = 0 ] || fail "the next job failed: submit exited $rc (124: still streaming after 180 s;" \
  "job ${next:-not submitted}${next:+ is $(job_state "$next")}): $out"
log "PASS"
