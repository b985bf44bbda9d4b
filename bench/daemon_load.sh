#!/usr/bin/env bash
# Runs bench/daemon_load.cc against a fresh coordinator of the given
# lockstepd binary on loopback and prints its JSON lines.
#   bench/daemon_load.sh LOCKSTEPD LABEL [daemon_load flags...]
# e.g. (figures in daemon/README.md, "Load"):
#   bazel build --config=opt //daemon:lockstepd //bench:daemon_load
#   bench/daemon_load.sh bazel-bin/daemon/lockstepd after
set -euo pipefail
LOCKSTEPD=$1
LABEL=$2
shift 2
LOAD="${DAEMON_LOAD:-$(dirname "$0")/../bazel-bin/bench/daemon_load}"
D=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$D"' EXIT
# Enough descriptors for the streams' connections on both sides.
ulimit -n 65536 2>/dev/null || true
"$LOCKSTEPD" --coordinator --no-agent --listen 127.0.0.1:0 --state-dir "$D/state" \
  --address-file "$D/addr" >"$D/log" 2>&1 &
pid=$!
for _ in $(seq 300); do [ -s "$D/addr" ] && break; sleep 0.1; done
[ -s "$D/addr" ] || { echo "lockstepd did not start:" >&2; cat "$D/log" >&2; exit 1; }
"$LOAD" --address "$(cat "$D/addr")" --token-file "$D/state/token" --pid "$pid" --label "$LABEL" "$@"
