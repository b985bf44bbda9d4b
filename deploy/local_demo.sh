#!/usr/bin/env bash
# Local demo: start a coordinator+agent, submit a 2-worker job, follow it to
# SUCCEEDED, print its status and where its logs are, stop the daemon.
#
#   deploy/local_demo.sh                       # the e2e test trainer
#   deploy/local_demo.sh -- bazel-bin/examples/<trainer> ARGS   # any trainer
#
# Env: STATE (default /tmp/lockstep-demo), NPROC (2), NODES (1), LOCKSTEPD
# and LOCKSTEP (the binaries; default bazel-bin/daemon/lockstepd and
# bazel-bin/client/lockstep). Run after `bazel build //daemon:lockstepd
# //client:lockstep //tests/e2e:test_trainer`. //deploy:local_demo_test runs
# it as tools/demo.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE="${STATE:-/tmp/lockstep-demo}"
NPROC="${NPROC:-2}"
NODES="${NODES:-1}"
LOCKSTEPD="${LOCKSTEPD:-bazel-bin/daemon/lockstepd}"
LOCKSTEP="${LOCKSTEP:-bazel-bin/client/lockstep}"
if [ "${1:-}" = "--" ]; then shift; fi
if [ $# -eq 0 ]; then set -- "$PWD/bazel-bin/tests/e2e/test_trainer"; fi

mkdir -p "$STATE"
rm -f "$STATE/address"
# As root, lockstepd runs each job as a uid of its own (daemon/README.md,
# Job isolation), which cannot reach a program in Bazel's output tree
# (under /root, 0700): the trainer is copied where every uid may run it.
if [ "$(id -u)" = 0 ] && [ -f "$1" ]; then
  install -d -m 0755 "$STATE/bin"
  install -m 0755 "$1" "$STATE/bin/$(basename "$1")"
  set -- "$STATE/bin/$(basename "$1")" "${@:2}"
fi
"$LOCKSTEPD" --coordinator --state-dir "$STATE" --listen 127.0.0.1:0 \
  --address-file "$STATE/address" >"$STATE/lockstepd.log" 2>&1 &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$STATE/address" ] && break; sleep 0.1; done
[ -s "$STATE/address" ] || { echo "lockstepd did not start; see $STATE/lockstepd.log" >&2; exit 1; }
L=("$LOCKSTEP" --coordinator "$(cat "$STATE/address")" --token-file "$STATE/token")
echo "coordinator+agent at $(cat "$STATE/address"), state dir $STATE"
"${L[@]}" nodes
out=$("${L[@]}" submit --nodes "$NODES" --nproc-per-node "$NPROC" --max-restarts 2 --name demo --wait -- "$@") || {
  echo "$out"
  job=$(echo "$out" | sed -n 's/^submitted job //p')
  [ -n "$job" ] && "${L[@]}" status "$job"
  exit 1
}
echo "$out"
job=$(echo "$out" | sed -n 's/^submitted job //p')
"${L[@]}" status "$job"
echo "--- last lines of rank 1 (lockstep logs $job --rank 1):"
"${L[@]}" logs "$job" --rank 1 | tail -n 3
echo "logs: $STATE/jobs/$job/rank-*.stdout|stderr; daemon log: $STATE/lockstepd.log"
