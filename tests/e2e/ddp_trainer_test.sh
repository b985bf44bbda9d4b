#!/usr/bin/env bash
# The real DDP example trainer (//examples:train, Gloo over the
# coordinator's store) as a 2-node x 2-worker job: SUCCEEDED, and
# `logs --rank 3` returns rank 3's own step lines.
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"

start_coordinator
start_agent nodeb
out=$(ls_cli submit --nodes 2 --nproc-per-node 2 --max-restarts 1 --wait -- \
  "$TRAIN" --model mlp_small --steps 10 --timeout-s 60) || fail "DDP job did not succeed: $out"
echo "$out"
job=$(echo "$out" | sed -n 's/^submitted job //p')
ls_cli status "$job"
ls_cli logs "$job" --rank 3 >"$T/rank3.txt"
grep -q '"rank":3,"step":10' "$T/rank3.txt" || fail "rank 3's log lacks its step 10: $(tail -n 3 "$T/rank3.txt")"
if grep -q '"rank":[012],' "$T/rank3.txt"; then fail "rank 3's log has other ranks' lines"; fi
check_invariants "$job" 1
log "PASS"
