#!/usr/bin/env bash
# Runs the DDP comparison of bench/README.md in one session, side by side:
# ROUNDS rounds (default 3), each running every column once in turn, so a
# drift of the machine's speed hits every column alike; bench/table.py then
# takes the median of each column's per-run medians.
# Columns, per model: lockstep --local (N processes, no communication);
# lockstep DDP over Gloo with the defaults (25 MB buckets, gradients as
# bucket views), and with gradients in memory of their own
# (--gradient-as-bucket-view=false); lockstep over shared memory
# (--backend shm); the peer script (PyTorch DDP, Gloo) as it is, and with
# glibc told to keep freed memory ("+keep": the MALLOC_*_THRESHOLD_
# variables, what ddp::KeepFreedMemory() does in lockstep's workers), with
# and without DDP. Both systems' training loops reset gradients to
# undefined each step (the peer's zero_grad(set_to_none=True); the
# trainer's --set-to-none, its default). With OVERLAP=1, two more lockstep
# Gloo columns: --overlap-optimizer, and it with --gradient-priority.
# BATCH sets the samples per rank (default 32). deep_mlp (in MODELS) is not
# in the peer script, so it gets the lockstep columns only.
# Usage: bench/run_table.sh [world] [steps] > results.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
world=${1:-2}
steps=${2:-20}
rounds=${ROUNDS:-3}
batch=${BATCH:-32}
models=${MODELS:-"mlp convnet transformer"}
[ -n "${NO_BUILD:-}" ] || bazel build --config=opt //bench:ddp_bench //examples:train >&2
bench=bazel-out/k8-opt/bin/bench/ddp_bench
train=bazel-out/k8-opt/bin/examples/train
peer=${PEER:-../shared/bench/torch_ddp_bench.py}
keep() {
  MALLOC_MMAP_THRESHOLD_=2000000000 MALLOC_TRIM_THRESHOLD_=2000000000 "$@" |
    /usr/bin/python3 -c 'import json,sys
for l in sys.stdin:
    d = json.loads(l); d["system"] += " +keep"; print(json.dumps(d))'
}
for m in $models; do
  for r in $(seq "$rounds"); do
    echo "model $m round $r of $rounds" >&2
    $bench --train $train --model "$m" --world "$world" --steps "$steps" --batch "$batch" --local
    $bench --train $train --model "$m" --world "$world" --steps "$steps" --batch "$batch"
    $bench --train $train --model "$m" --world "$world" --steps "$steps" --batch "$batch" --gradient-as-bucket-view=false
    $bench --train $train --model "$m" --world "$world" --steps "$steps" --batch "$batch" --backend shm
    if [ -n "${OVERLAP:-}" ]; then
      $bench --train $train --model "$m" --world "$world" --steps "$steps" --batch "$batch" --overlap-optimizer
      $bench --train $train --model "$m" --world "$world" --steps "$steps" --batch "$batch" --overlap-optimizer \
        --gradient-priority
    fi
    [ "$m" != deep_mlp ] || continue
    /usr/bin/python3 $peer --model "$m" --world "$world" --steps "$steps" --batch "$batch"
    keep /usr/bin/python3 $peer --model "$m" --world "$world" --steps "$steps" --batch "$batch" --no-ddp
    keep /usr/bin/python3 $peer --model "$m" --world "$world" --steps "$steps" --batch "$batch"
  done
done
