#!/usr/bin/env bash
# log, fail and wait_for for shell tests (tests/e2e/lib.sh, the deploy
# tests). Set LOG_TAG (how log lines start) and T (fail prints the tail of
# every $T/*.log) before use.

log() { echo "[${LOG_TAG:-test} $(date +%H:%M:%S.%N | cut -c1-12)] $*" >&2; }
fail() {
  log "FAIL: $*"
  for f in "$T"/*.log; do [ -f "$f" ] && { echo "---- $f (tail)"; tail -n 40 "$f"; }; done >&2
  exit 1
}

# wait_for SECONDS CMD...: runs CMD every 0.1 s until it succeeds. CMD is
# run anew each time: poll through a function, not a $(...) argument, which
# the shell expands once, before wait_for starts.
wait_for() {
  local limit=$1; shift
  local deadline=$(( $(date +%s%N) + limit * 1000000000 ))
  while (( $(date +%s%N) < deadline )); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  return 1
}
