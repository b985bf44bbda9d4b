#!/usr/bin/env bash
# The coordinator's memory over many short jobs, one after another.
#
#   bazel build //daemon:lockstepd //client:lockstep //tests/e2e:test_trainer
#   bench/coordinator_memory.sh [--jobs 200] [--nproc 2] [--payload-kb 64]
#       [--samples 1,50,100,150,200] [--keep]
#
# Starts a dedicated coordinator (lockstepd --coordinator --no-agent) and one
# agent, both on loopback with port 0 (read back from --address-file), in a
# fresh state dir. Submits JOBS jobs with the CLI, each waited for before the
# next: 1 node x NPROC workers of tests/e2e:test_trainer, one step. Every
# worker meets its peers through the coordinator's store (a CompareSet, an
# Add, a Set and a Wait in the namespace "<job>/<round>") and stores a
# PAYLOAD_KB value there, so every job leaves NPROC x PAYLOAD_KB (+4 small
# keys) in the coordinator's memory unless its namespaces are deleted when it
# ends: 200 jobs x 2 x 64 KiB = 25 MiB, plain in rss_kb if it stays.
#
# After each sample point (and once before the first job) prints a JSON line:
#   {"bench":"coordinator_memory","jobs":N,"rss_kb":...,"hwm_kb":...,
#    "agent_rss_kb":...,"store_keys":K,"store_namespaces":M,"elapsed_s":...}
# rss_kb / hwm_kb: the coordinator's VmRSS / VmHWM (/proc/PID/status).
# store_keys: keys still in the store in the namespaces of the jobs run so far
# (StoreService.NumKeys with the admin token, for rounds 1..last of each job);
# store_namespaces: how many of those namespaces still hold keys.
# Exits 1 if a job does not succeed. Binaries: $BIN (default bazel-bin).
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=200
NPROC=2
PAYLOAD_KB=64
SAMPLES="1,50,100,150,200"
KEEP=0
while (($#)); do
  case "$1" in
    --jobs) JOBS=$2; shift 2 ;;
    --nproc) NPROC=$2; shift 2 ;;
    --payload-kb) PAYLOAD_KB=$2; shift 2 ;;
    --samples) SAMPLES=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) echo "usage: $0 [--jobs N] [--nproc P] [--payload-kb K] [--samples a,b,c] [--keep]" >&2; exit 2 ;;
  esac
done

BIN="${BIN:-bazel-bin}"
LOCKSTEPD="$PWD/$BIN/daemon/lockstepd"
LOCKSTEP="$PWD/$BIN/client/lockstep"
TRAINER="$PWD/$BIN/tests/e2e/test_trainer"
for b in "$LOCKSTEPD" "$LOCKSTEP" "$TRAINER"; do
  [ -x "$b" ] || { echo "missing $b: bazel build //daemon:lockstepd //client:lockstep //tests/e2e:test_trainer" >&2; exit 2; }
done

T=$(mktemp -d /tmp/lockstep-coordinator-memory.XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if ((KEEP)); then echo "state and logs kept in $T" >&2; else rm -rf "$T"; fi
}
trap cleanup EXIT

log() { echo "[coordinator_memory $(date +%H:%M:%S)] $*" >&2; }
die() {
  log "FAIL: $*"
  for f in "$T"/*.log; do [ -f "$f" ] && { echo "---- $f (tail)"; tail -n 30 "$f"; }; done >&2
  exit 1
}

# wait_file SECONDS FILE: until FILE is non-empty.
wait_file() {
  local deadline=$(($(date +%s) + $1))
  while [ ! -s "$2" ]; do
    (($(date +%s) < deadline)) || return 1
    sleep 0.1
  done
}

"$LOCKSTEPD" --coordinator --no-agent --state-dir "$T/coord" --listen 127.0.0.1:0 \
  --address-file "$T/coord.addr" --node-id coord --allowed-env 'TRAINER_*' >"$T/coord.log" 2>&1 &
COORD_PID=$!
PIDS+=("$COORD_PID")
wait_file 30 "$T/coord.addr" || die "the coordinator did not become ready"
COORD=$(cat "$T/coord.addr")
TOKEN="$T/coord/token"

"$LOCKSTEPD" --state-dir "$T/agent" --listen 127.0.0.1:0 --address-file "$T/agent.addr" \
  --node-id agent --coordinator-address "$COORD" --token-file "$TOKEN" --allowed-env 'TRAINER_*' \
  >"$T/agent.log" 2>&1 &
AGENT_PID=$!
PIDS+=("$AGENT_PID")
wait_file 30 "$T/agent.addr" || die "the agent did not become ready"
log "coordinator pid $COORD_PID at $COORD, agent pid $AGENT_PID; $JOBS jobs x $NPROC workers x $PAYLOAD_KB KiB"

status_kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }

# store_count: prints "KEYS NAMESPACES" over the namespaces of $T/jobs.txt
# (lines "JOB LAST_ROUND"). Requests are hand-encoded (Debian's
# python3-grpcio ships no stubs): StoreNumKeysRequest{namespace=1}.
store_count() {
  /usr/bin/python3 - "$COORD" "$(cat "$TOKEN")" "$T/jobs.txt" <<'PY'
import sys, grpc
addr, token, jobs = sys.argv[1:4]
def varint(b, i):
    v, shift = 0, 0
    while True:
        c = b[i]; i += 1
        v |= (c & 0x7F) << shift; shift += 7
        if c < 0x80: return v, i
def enc_len(n):
    out = b""
    while True:
        if n < 0x80: return out + bytes([n])
        out += bytes([n & 0x7F | 0x80]); n >>= 7
call = grpc.insecure_channel(addr).unary_unary(
    "/lockstep.v1.StoreService/NumKeys",
    request_serializer=lambda b: b, response_deserializer=lambda b: b)
md = [("authorization", "Bearer " + token)]
keys = spaces = 0
for line in open(jobs):
    job, last = line.split()
    for r in range(1, int(last) + 1):
        ns = ("%s/%d" % (job, r)).encode()
        resp = call(b"\x0a" + enc_len(len(ns)) + ns, timeout=10, metadata=md)
        n = varint(resp, 1)[0] if resp[:1] == b"\x08" else 0  # StoreNumKeysResponse{num_keys=1}
        keys += n
        spaces += n > 0
print(keys, spaces)
PY
}

START_MS=$(($(date +%s%N) / 1000000))
: >"$T/jobs.txt"
sample() {
  local counts
  counts=$(store_count) || die "could not read the store's key counts"
  printf '{"bench":"coordinator_memory","jobs":%d,"nproc":%d,"payload_kb":%d,"rss_kb":%d,"hwm_kb":%d,"agent_rss_kb":%d,"store_keys":%d,"store_namespaces":%d,"elapsed_s":%.1f}\n' \
    "$1" "$NPROC" "$PAYLOAD_KB" "$(status_kb "$COORD_PID" VmRSS)" "$(status_kb "$COORD_PID" VmHWM)" \
    "$(status_kb "$AGENT_PID" VmRSS)" ${counts} \
    "$(awk -v ms=$(($(date +%s%N) / 1000000 - START_MS)) 'BEGIN { print ms / 1000 }')"
}

sample 0
for ((i = 1; i <= JOBS; i++)); do
  out=$("$LOCKSTEP" --coordinator "$COORD" --token-file "$TOKEN" submit --nodes 1 \
    --nproc-per-node "$NPROC" --wait --name "memory-$i" --env TRAINER_STEPS=1 \
    --env TRAINER_STEP_MS=1 --env TRAINER_STORE_BYTES=$((PAYLOAD_KB * 1024)) -- "$TRAINER" 2>&1) || die "job $i did not succeed: $out"
  job=$(sed -n 's/^submitted job //p' <<<"$out" | head -n 1)
  round=$(grep -o 'round [0-9]*' <<<"$out" | tail -n 1 | cut -d' ' -f2)
  [ -n "$job" ] && [ -n "$round" ] || die "could not read the job id and round from: $out"
  echo "$job $round" >>"$T/jobs.txt"
  if [[ ",$SAMPLES," == *",$i,"* ]]; then sample "$i"; fi
done
kill -0 "$COORD_PID" 2>/dev/null || die "the coordinator died"
