#!/usr/bin/env bash
# //examples:train --weight-by-samples --batch-sizes 8,16,40: three ranks
# started by hand (MASTER_ADDR/MASTER_PORT, no daemon), each with its own
# batch size, end with the parameters of --local training on the 64
# concatenated samples (float32, max error < 1e-5); without
# --weight-by-samples (the average over ranks) they do not.
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
COMMON=(--model mlp_small --steps 5 --lr 0.1 --seed 3 --timeout-s 60)

# run_job NAME [train flags]: three ranks, parameters in $T/NAME.params.<rank>.
run_job() {
  local name=$1; shift
  local port pids=()
  port=$(free_port)
  for rank in 0 1 2; do
    env -u LOCKSTEP_STORE LOCKSTEP_RANK="$rank" LOCKSTEP_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT="$port" "$TRAIN" "${COMMON[@]}" --batch-sizes 8,16,40 \
      --dump-params "$T/$name.params" "$@" >"$T/$name.$rank.out" 2>"$T/$name.$rank.err" &
    pids+=($!)
  done
  for rank in 0 1 2; do
    wait "${pids[$rank]}" || fail "$name rank $rank failed: $(tail -n 3 "$T/$name.$rank.err")"
  done
}
# max_error A B: largest |a - b| over two float32 dumps.
max_error() {
  python3 -c '
import array, sys
a, b = array.array("f"), array.array("f")
a.frombytes(open(sys.argv[1], "rb").read()); b.frombytes(open(sys.argv[2], "rb").read())
assert len(a) == len(b) and len(a) > 0, (len(a), len(b))
print(max(abs(x - y) for x, y in zip(a, b)))' "$1" "$2"
}
below() { python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)" "$1" "$2"; }

log "one process on the 64 samples"
"$TRAIN" "${COMMON[@]}" --local --batch 64 --dump-params "$T/local.params" \
  >"$T/local.out" 2>"$T/local.err" || fail "local run failed: $(tail -n 3 "$T/local.err")"

log "3 ranks with batches 8, 16, 40, weighted by samples"
run_job weighted --weight-by-samples
for rank in 0 1 2; do
  err=$(max_error "$T/local.params" "$T/weighted.params.$rank")
  log "rank $rank: max error $err"
  below "$err" 1e-5 || fail "weighted rank $rank differs from the local run by $err"
done

log "the same without --weight-by-samples (average over ranks) differs"
run_job averaged
err=$(max_error "$T/local.params" "$T/averaged.params.0")
log "averaged: max error $err"
below 1e-4 "$err" || fail "the unweighted run matches the local one too ($err): the test cannot tell"

# The trainer's own bad input is refused, naming it: a stray word (it left
# "--set-to-none false" true), micro-batches that do not split the batch
# (32 into 9 segfaulted), a batch below 1 (aborted).
refused() {
  local want=$1 rc=0 out
  shift
  out=$("$TRAIN" --local --model mlp_small --steps 1 "$@" 2>&1) || rc=$?
  [ "$rc" = 1 ] || [ "$rc" = 2 ] || fail "train $*: exit $rc, not a refusal: $out"
  grep -qF -- "$want" <<<"$out" || fail "train $*: does not say '$want': $out"
}
refused "unexpected argument 'false'" --set-to-none false
refused "--micro-batches 9 does not split --batch 32" --micro-batches 9
refused "--micro-batches 0 does not split" --micro-batches 0
refused "--batch: expected 1 or more, got -3" --batch -3
# A learning rate or momentum that is not a finite number >= 0 (nan aborted
# in torch's SGD), and a timeout of 0.
refused "--lr: expected a finite number >= 0, got nan" --lr nan
refused "--lr: expected a finite number >= 0, got -0.1" --lr -0.1
refused "--momentum: expected a finite number >= 0, got inf" --momentum inf
refused "--timeout-s: expected a finite number of seconds > 0, got 0" --timeout-s 0
# --micro-batches must split each rank's own batch (--batch-sizes 3 with 4
# micro-batches segfaulted); a test hook that needs DDP, under --local
# (segfaulted); negative counts.
refused "--micro-batches 4 does not split rank 0's --batch-sizes entry 3" --batch-sizes 3 --micro-batches 4
refused "--stall-rank needs DDP" --stall-rank 0
refused "--steps: expected 0 or more, got -5" --steps -5
refused "--leak-mb: expected 0 to 1073741824, got -1" --leak-mb -1
refused "--step-delay-ms: expected 0 to 3600000, got -10" --step-delay-ms -10

# Ranks that find different checkpoints (each its own dir here; a node-local
# dir or a stale listing of a shared one) fail together naming the steps,
# instead of training different steps against each other.
"$TRAIN" --local --model mlp_small --steps 2 --checkpoint-dir "$T/ckpt-0" --checkpoint-every 2 \
  >"$T/ckpt-local.out" 2>&1 || fail "the local checkpointing run failed: $(tail -n 3 "$T/ckpt-local.out")"
port=$(free_port)
pids=()
for rank in 0 1; do
  env -u LOCKSTEP_STORE LOCKSTEP_RANK="$rank" LOCKSTEP_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT="$port" "$TRAIN" --model mlp_small --steps 4 --timeout-s 60 \
    --checkpoint-dir "$T/ckpt-$rank" >"$T/split.$rank.out" 2>"$T/split.$rank.err" &
  pids+=($!)
done
for rank in 0 1; do
  rc=0
  wait "${pids[$rank]}" || rc=$?
  [ "$rc" != 0 ] || fail "rank $rank trained from its own checkpoint step: $(tail -n 3 "$T/split.$rank.err")"
  grep -qF "ranks resumed from different checkpoints in $T/ckpt-$rank (rank 0 at step 2, rank 1 at step 0" \
    "$T/split.$rank.err" || fail "rank $rank does not name the steps: $(tail -n 3 "$T/split.$rank.err")"
done
log "ok: ranks at different checkpoint steps are refused together"

# A misspelt model is refused before the rank looks for its peers (no store
# in this environment: it would otherwise fail on that, or wait for them).
rc=0
out=$(env -u LOCKSTEP_STORE "$TRAIN" --model mlpp --steps 1 2>&1) || rc=$?
[ "$rc" = 1 ] && grep -qF "unknown model 'mlpp' (mlp, convnet" <<<"$out" ||
  fail "train --model mlpp without --local: exit $rc: $out"
log "PASS"
