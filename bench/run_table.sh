#!/usr/bin/env bash
# Runs the DDP comparison of bench/README.md in one session: for each model,
# lockstep DDP at bucket caps 1/5/25/100 MB (Gloo) and 25 MB over shared
# memory (--backend shm), lockstep --local (N processes, no communication),
# and the peer script (PyTorch DDP gloo and --no-ddp).
# The peer runs twice more with glibc told to keep freed memory (the
# MALLOC_*_THRESHOLD_ variables; what ddp::KeepFreedMemory() does in
# lockstep's workers), tagged "+keep", so the allocator's share is visible.
# Usage: bench/run_table.sh [world] [steps] > results.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
world=${1:-2}
steps=${2:-20}
models=${MODELS:-"mlp convnet transformer"}
[ -n "${NO_BUILD:-}" ] || bazel build --config=opt //bench:ddp_bench //examples:train >&2
bench=bazel-out/k8-opt/bin/bench/ddp_bench
train=bazel-out/k8-opt/bin/examples/train
peer=${PEER:-../shared/bench/torch_ddp_bench.py}
for m in $models; do
  $bench --train $train --model "$m" --world "$world" --steps "$steps" --local
  /usr/bin/python3 $peer --model "$m" --world "$world" --steps "$steps" --no-ddp
  for b in 1 5 25 100; do
    $bench --train $train --model "$m" --world "$world" --steps "$steps" --bucket-mb "$b"
  done
  $bench --train $train --model "$m" --world "$world" --steps "$steps" --bucket-mb 25 --gradient-as-bucket-view
  $bench --train $train --model "$m" --world "$world" --steps "$steps" --bucket-mb 25 --backend shm
  /usr/bin/python3 $peer --model "$m" --world "$world" --steps "$steps"
  for args in "--no-ddp" ""; do
    MALLOC_MMAP_THRESHOLD_=2000000000 MALLOC_TRIM_THRESHOLD_=2000000000 \
      /usr/bin/python3 $peer --model "$m" --world "$world" --steps "$steps" $args |
      /usr/bin/python3 -c 'import json,sys
for l in sys.stdin:
    d = json.loads(l); d["system"] += " +keep"; print(json.dumps(d))'
  done
done
