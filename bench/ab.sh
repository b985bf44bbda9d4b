#!/usr/bin/env bash
# A/B of examples/train binaries, side by side: ROUNDS rounds (default 4),
# each running `ddp_bench --local` once and then, for every binary in turn,
# each backend in BACKENDS (default "shm"), so a drift of the machine's speed
# hits every column alike. Prints ddp_bench's JSON lines with "system" set
# to "train_<label>" and "ab_round" added; bench/table.py-style summaries
# are left to the reader (python3 below, or jq).
# Usage: MODEL=mlp ROUNDS=4 BACKENDS="shm gloo" bench/ab.sh label=path/to/train ... > ab.jsonl
# The binaries are copies of bazel-out/k8-opt/bin/examples/train built at
# the commits compared (bazel build --config=opt //examples:train).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bench/ab.sh label=train_binary ..." >&2; exit 2; }
model=${MODEL:-mlp}
rounds=${ROUNDS:-4}
steps=${STEPS:-20}
batch=${BATCH:-32}
backends=${BACKENDS:-shm}
bench=${BENCH:-bazel-out/k8-opt/bin/bench/ddp_bench}
[ -x "$bench" ] || { echo "ab.sh: no $bench (bazel build --config=opt //bench:ddp_bench)" >&2; exit 2; }
for spec in "$@"; do
  [ -x "${spec#*=}" ] || { echo "ab.sh: $spec: not an executable" >&2; exit 2; }
done
tag() {  # label round
  python3 -c 'import json,sys
for l in sys.stdin:
    d = json.loads(l); d["system"] = "train_" + sys.argv[1]; d["ab_round"] = int(sys.argv[2]); print(json.dumps(d))' "$@"
}
run() {  # binary flags...
  local train=$1
  shift
  "$bench" --train "$train" --model "$model" --world 2 --steps "$steps" --batch "$batch" "$@" | tail -1
}
for r in $(seq "$rounds"); do
  echo "ab.sh: round $r of $rounds" >&2
  first=${1#*=}
  run "$first" --local | tag local "$r"
  for spec in "$@"; do
    for b in $backends; do
      run "${spec#*=}" --backend "$b" | tag "${spec%%=*}" "$r"
    done
  done
done
