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
# The peer runs with OPENBLAS_NUM_THREADS=1 (see peer() below).
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
peer_script=${PEER:-../shared/bench/torch_ddp_bench.py}
keep() {
  MALLOC_MMAP_THRESHOLD_=2000000000 MALLOC_TRIM_THRESHOLD_=2000000000 "$@" |
    /usr/bin/python3 -c 'import json,sys
for l in sys.stdin:
    d = json.loads(l); d["system"] += " +keep"; print(json.dumps(d))'
}
# One lockstep run and one peer run of model $m, with the common flags.
lockstep() { $bench --train $train --model "$m" --world "$world" --steps "$steps" --batch "$batch" "$@"; }
# The peer's PyTorch (Debian's python3-torch) calls the same pthreads
# OpenBLAS, which torch.set_num_threads does not reach: OPENBLAS_NUM_THREADS=1
# gives it the one BLAS thread per rank that examples/train --threads 1 sets.
peer() { OPENBLAS_NUM_THREADS=1 /usr/bin/python3 $peer_script --model "$m" --world "$world" --steps "$steps" --batch "$batch" "$@"; }
for m in $models; do
  for r in $(seq "$rounds"); do
    echo "model $m round $r of $rounds" >&2
    lockstep --local
    lockstep
    lockstep --gradient-as-bucket-view=false
    lockstep --backend shm
    if [ -n "${OVERLAP:-}" ]; then
      lockstep --overlap-optimizer
      lockstep --overlap-optimizer --gradient-priority
    fi
    [ "$m" != deep_mlp ] || continue
    peer
    keep peer --no-ddp
    keep peer
  done
done
