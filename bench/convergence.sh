#!/usr/bin/env bash
# Convergence of the comm hooks: the loss after K steps of examples/train on
# its synthetic task (one fixed global batch of random inputs and labels,
# the ranks' batches consecutive slices of it), run as a real DDP job with
# `lockstep run` (a private lockstepd), once per hook and seed, beside one
# process training on the whole global batch (--local, no communication).
# The average (allreduce) must track the local run to rounding; Adasum
# (Maleki et al.) combines the ranks' gradients adaptively, close to their
# sum where they are orthogonal, so at the same learning rate it moves
# further per step at a large global batch.
#
# Prints one JSON line per run: {"bench":"convergence","hook":...,"seed":S,
# "world":W,"batch_per_rank":B,"global_batch":W*B,"lr":LR,"steps":K,
# "loss":{"STEP":mean loss over the ranks, ...}} for the steps in --at.
#
# Usage: bench/convergence.sh LOCKSTEP LOCKSTEPD TRAIN [--world W] [--batch B]
#   [--steps K] [--lr LR] [--model M] [--hooks "allreduce adasum"]
#   [--seeds "0 1 2"] [--at "1 10 25 50"]
set -euo pipefail
LOCKSTEP="$(realpath "$1")"
LOCKSTEPD="$(realpath "$2")"
TRAIN="$(realpath "$3")"
shift 3
world=4 batch=256 steps=50 lr=0.1 model=mlp_small hooks="allreduce adasum" seeds="0 1 2" at="1 10 25 50"
while [ $# -gt 0 ]; do
  case "$1" in
    --world) world=$2 ;;
    --batch) batch=$2 ;;
    --steps) steps=$2 ;;
    --lr) lr=$2 ;;
    --model) model=$2 ;;
    --hooks) hooks=$2 ;;
    --seeds) seeds=$2 ;;
    --at) at=$2 ;;
    *) echo "convergence.sh: unknown flag $1" >&2; exit 2 ;;
  esac
  shift 2
done
work="$(mktemp -d "${TMPDIR:-/tmp}/lockstep-convergence.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# summarize HOOK SEED WORLD RANK_BATCH < the trainer's JSON lines ([R] prefixes allowed)
summarize() {
  HOOK="$1" SEED="$2" WORLD="$3" RANK_BATCH="$4" LR="$lr" STEPS="$steps" AT="$at" MODEL="$model" \
    /usr/bin/python3 -c '
import json, os, re, sys
losses = {}
for line in sys.stdin:
    m = re.match(r"^(?:\[\d+\] )?(\{.*\})\s*$", line)
    if not m:
        continue
    d = json.loads(m.group(1))
    if "loss" in d and "step" in d:
        losses.setdefault(d["step"], {})[d["rank"]] = d["loss"]
world = int(os.environ["WORLD"])
out = {}
for s in os.environ["AT"].split():
    ranks = losses.get(int(s), {})
    if len(ranks) != world:
        sys.exit("step %s: losses of ranks %s, want %d ranks" % (s, sorted(ranks), world))
    out[s] = round(sum(ranks.values()) / world, 6)
batch = int(os.environ["RANK_BATCH"])
print(json.dumps({"bench": "convergence", "model": os.environ["MODEL"], "hook": os.environ["HOOK"],
                  "seed": int(os.environ["SEED"]), "world": world,
                  "batch_per_rank": batch, "global_batch": batch * world,
                  "lr": float(os.environ["LR"]), "steps": int(os.environ["STEPS"]), "loss": out},
                 separators=(",", ":")))
'
}

for seed in $seeds; do
  common=(--model "$model" --steps "$steps" --lr "$lr" --seed "$seed" --timeout-s 60)
  "$TRAIN" --local --batch $((world * batch)) "${common[@]}" 2>/dev/null | summarize local "$seed" 1 $((world * batch))
  for hook in $hooks; do
    "$LOCKSTEP" run --lockstepd "$LOCKSTEPD" --state-dir "$work/$hook-$seed" --nproc-per-node "$world" \
      --max-restarts 0 -- "$TRAIN" --batch "$batch" --comm-hook "$hook" "${common[@]}" \
      >"$work/$hook-$seed.out" 2>"$work/$hook-$seed.err" ||
      { tail -n 20 "$work/$hook-$seed.err" >&2; echo "convergence.sh: the $hook run (seed $seed) failed" >&2; exit 1; }
    summarize "$hook" "$seed" "$world" "$batch" <"$work/$hook-$seed.out"
  done
done
