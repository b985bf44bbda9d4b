#!/usr/bin/env bash
# Two hosts on a slow link: what overlapping the next step with the
# gradients' communication buys when the wire, not the CPU, is the limit.
# Two network namespaces joined by a veth pair (10.215.N.1 and .2, made
# here), each end shaped to RATE by tbf (default 1gbit), one examples/train
# rank in each over Gloo (a file store in a temporary directory, each rank
# binding its own address through LOCKSTEP_NODE_ADDR). ROUNDS rounds
# (default 3), each running every column once in turn:
#   local            both ranks with --local (no communication): the floor;
#   ddp              the defaults;
#   opt              --overlap-optimizer;
#   opt+prio         --overlap-optimizer --gradient-priority;
#   opt+fwd          --overlap-optimizer --overlap-forward;
#   opt+prio+fwd     all three.
# BUCKET_MB sets --bucket-mb (default 25); COLUMNS picks columns (default
# all, e.g. COLUMNS="local opt+prio opt+prio+fwd").
# Prints one JSON line per run (rank 0's median step ms over the steps after
# WARMUP, default 3) and, at the end, one "summary" line per column with the
# median over the rounds. Needs root (ip netns, tc) and the opt build:
#   bazel build --config=opt //examples:train
# Usage: MODEL=deep_mlp BATCH=128 RATE=1gbit STEPS=12 bench/netns_overlap.sh > out.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-deep_mlp}
batch=${BATCH:-128}
rate=${RATE:-1gbit}
steps=${STEPS:-12}
warmup=${WARMUP:-3}
rounds=${ROUNDS:-3}
bucket_mb=${BUCKET_MB:-25}
columns=${COLUMNS:-"local ddp opt opt+prio opt+fwd opt+prio+fwd"}
train=${TRAIN:-bazel-out/k8-opt/bin/examples/train}
[ -x "$train" ] || { echo "netns_overlap.sh: no $train (bazel build --config=opt //examples:train)" >&2; exit 2; }
net="10.215.$(($$ % 250))"
nsa="lsova$$" nsb="lsovb$$" va="lsova$$" vb="lsovb$$"
tmp=$(mktemp -d)
cleanup() {
  ip netns del "$nsa" 2>/dev/null || true
  ip netns del "$nsb" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$nsa"
ip netns add "$nsb"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$nsa"
ip link set "$vb" netns "$nsb"
ip -n "$nsa" addr add "$net.1/24" dev "$va"
ip -n "$nsb" addr add "$net.2/24" dev "$vb"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
ip -n "$nsa" link set "$va" up
ip -n "$nsb" link set "$vb" up
# Both directions shaped: each end's egress.
ip netns exec "$nsa" tc qdisc add dev "$va" root tbf rate "$rate" burst 256kb latency 100ms
ip netns exec "$nsb" tc qdisc add dev "$vb" root tbf rate "$rate" burst 256kb latency 100ms
echo "netns_overlap.sh: $nsa ($net.1) <-> $nsb ($net.2) at $rate, $model, batch $batch" >&2

# run LABEL ROUND FLAGS...: one run of both ranks; prints rank 0's line.
run() {
  local label=$1 round=$2
  shift 2
  local dir="$tmp/$label.$round"
  mkdir -p "$dir"
  local pids=()
  for r in 0 1; do
    local ns=$nsa addr=$net.1
    [ "$r" = 1 ] && ns=$nsb addr=$net.2
    ip netns exec "$ns" env LOCKSTEP_STORE="file:$dir/store" LOCKSTEP_JOB_ID=bench \
      LOCKSTEP_RANK=$r LOCKSTEP_WORLD_SIZE=2 LOCKSTEP_ROUND=0 LOCKSTEP_NODE_ADDR="$addr" \
      "$train" --model "$model" --steps $((steps + warmup)) --batch "$batch" --threads 1 \
      --bucket-mb "$bucket_mb" \
      --timeout-s 120 "$@" > "$dir/rank$r.out" 2> "$dir/rank$r.err" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do
    wait "$p" || { echo "netns_overlap.sh: $label round $round failed:" >&2; tail -n 5 "$dir"/rank*.err >&2; exit 1; }
  done
  python3 - "$dir/rank0.out" "$label" "$round" "$warmup" "$model" "$batch" "$rate" "$bucket_mb" <<'EOF'
import json, statistics, sys
path, label, rnd, warmup, model, batch, rate, bucket_mb = sys.argv[1:]
steps = [json.loads(l) for l in open(path) if l.startswith('{"rank"') and '"step"' in l]
steps = steps[int(warmup):]
ms = [s["step_ms"] for s in steps]
print(json.dumps({"bench": "netns_overlap", "column": label, "round": int(rnd), "model": model,
                  "batch_per_rank": int(batch), "rate": rate, "bucket_mb": float(bucket_mb),
                  "steps": len(ms),
                  "step_ms_median": round(statistics.median(ms), 2),
                  "comm_exposed_ms_median": round(statistics.median(
                      [s.get("comm_exposed_ms", 0) for s in steps]), 2)}))
EOF
}

results="$tmp/results.jsonl"
for round in $(seq "$rounds"); do
  echo "netns_overlap.sh: round $round of $rounds" >&2
  for column in $columns; do
    case "$column" in
      local) run local "$round" --local ;;
      ddp) run ddp "$round" ;;
      opt) run opt "$round" --overlap-optimizer ;;
      opt+prio) run opt+prio "$round" --overlap-optimizer --gradient-priority ;;
      opt+fwd) run opt+fwd "$round" --overlap-optimizer --overlap-forward ;;
      opt+prio+fwd) run opt+prio+fwd "$round" --overlap-optimizer --gradient-priority --overlap-forward ;;
      *) echo "netns_overlap.sh: unknown column $column" >&2; exit 2 ;;
    esac | tee -a "$results"
  done
done
python3 - "$results" <<'EOF'
import collections, json, statistics, sys
runs = collections.OrderedDict()
for line in open(sys.argv[1]):
    d = json.loads(line)
    runs.setdefault(d["column"], []).append(d["step_ms_median"])
local = statistics.median(runs["local"]) if "local" in runs else None
for column, ms in runs.items():
    m = statistics.median(ms)
    print(json.dumps({"bench": "netns_overlap", "summary": column, "step_ms_median": m,
                      "rounds": ms, "vs_local": round(m / local, 3) if local else None}))
EOF
