#!/usr/bin/env bash
# No rank has two live owners, even when an agent is frozen. An elastic 1:2
# real DDP job (//examples:train, Gloo) runs on nodea (node rank 0: ranks
# 0, 1) and nodeb (ranks 2, 3). nodea's lockstepd is stopped with SIGSTOP:
# it can neither stop its workers nor answer anyone. Its workers fence
# themselves (the engine's watchdog, common/worker_link.h) once the fence
# deadline on their node's page passes, and the coordinator opens the next
# round, where nodeb alone runs ranks 0 and 1, only after that deadline.
# A sampler reads every process of the job every 100 ms: never two live
# processes with the same rank. Then nodea is resumed and the job succeeds.
# `lockstep logs --follow` of rank 0, started with the job, rides out the
# frozen agent (its read of nodea waits out its deadline) and reads round
# 2's rank 0 on nodeb, where the rank moved. One of rank 2 prints round 1's
# output on nodeb to its end, then round 3's on nodea (where rank 2 runs
# once nodea is back): a rank's output on the node it left is read out
# before its next node's.
#
# With "guard" as the last argument the workers do not fence themselves:
# they run as `env -u LOCKSTEP_FENCE_FD train ...`, so the engine finds no
# fence page, as any program that does not link it. nodea's agent's fence
# guard (daemon/fence_guard.h) kills them at the same deadline instead;
# without it they would train on, blocked on nodeb's stopped ranks until
# their 60 s timeout, while nodeb runs ranks 0 and 1 again (two owners).
# Each worker also leaves a helper in a session of its own (`setsid sleep`,
# outside the group the guard kills, its environment the worker's): the
# guard finds nodea's in its agent's tree and kills them too, while nodea
# is still frozen, and the sampler counts a helper as its worker's rank.
LEASE_S=3
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"
MODE="${5:-engine}"
PREFIX=()
[ "$MODE" = guard ] &&
  PREFIX=(sh -c 'setsid sleep 3000 & exec env -u LOCKSTEP_FENCE_FD "$@"' with-helper)

start_daemon coord --coordinator --no-agent --listen 127.0.0.1:0
COORD="$ADDR_coord"
TOKEN="$T/coord/token"
start_agent nodea
start_agent nodeb
job=$(ls_cli submit --detach --json --nodes 1:2 --nproc-per-node 2 --max-restarts 3 --last-call-s 0.1 -- \
  "${PREFIX[@]}" "$TRAIN" --model mlp_small --steps 150 --step-delay-ms 50 --timeout-s 60 |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
python3 tests/e2e/rank_owners.py "$job" "$T/owners.txt" &
sampler=$!
ls_cli logs "$job" --rank 0 --follow >"$T/follow0.out" 2>"$T/follow0.err" &
follower=$!
ls_cli logs "$job" --rank 2 --follow >"$T/follow2.out" 2>"$T/follow2.err" &
follower2=$!
EXTRA_CLEANUP="kill $sampler $follower $follower2 2>/dev/null || true"
wait_for 60 field_is "$job" 'j["node_ids"]' "['nodea', 'nodeb']" ||
  fail "round 1 did not close on nodea and nodeb: $(job_field "$job" 'j["node_ids"]')"
wait_for 60 grep -q '"rank":0,"step":5,' "$T/nodea/jobs/$job/rank-0.stdout" || fail "rank 0 never reached step 5"
log "SIGSTOP nodea's lockstepd (pid $PID_nodea)"
stopped_at=$(date +%s%N)
kill -STOP "$PID_nodea"
wait_for 60 field_is "$job" '(j["round"] >= 2, j["node_ids"], j["state"])' \
  "(True, ['nodeb'], 'RUNNING')" || fail "no round on nodeb alone: $(ls_cli status "$job")"
# The recovery figure (bench/README.md): at least the fence deadline, about
# 1.25 lease + 1 s after nodea's last heartbeat, plus the new round's start.
log "nodea replaced: nodeb runs ranks 0 and 1 $(( ($(date +%s%N) - stopped_at) / 1000000 )) ms after the SIGSTOP (lease ${LEASE_S}s)"
wait_for 60 grep -q "\"rank\":0,\"step\":5," "$T/nodeb/jobs/$job/rank-0.stdout" ||
  fail "nodeb's rank 0 never reached step 5"
if [ "$MODE" = guard ]; then
  # nodea is still frozen: its guard, not its agent, stopped ranks 0 and 1.
  for r in 0 1; do
    grep -q "E \[fence-guard\] job=$job rank=$r SIGKILLed process group [0-9]* (round 1)" "$T/nodea.log" ||
      fail "nodea's fence guard did not kill rank $r: $(grep 'fence-guard' "$T/nodea.log")"
  done
  # ... and the helpers they had started in sessions of their own.
  for r in 0 1; do
    grep -q "E \[fence-guard\] job=$job rank=$r SIGKILLed pid [0-9]* (sleep and its process group), which round 1's workers started outside their process group" "$T/nodea.log" ||
      fail "nodea's fence guard did not kill rank $r's helper: $(grep 'fence-guard' "$T/nodea.log")"
  done
  if grep -q "lockstep: fenced" "$T/nodea/jobs/$job/rank-0.stderr"; then
    fail "nodea's rank 0 fenced itself: it was to run without the fence page"
  fi
else
  grep -q "lockstep: fenced" "$T/nodea/jobs/$job/rank-0.stderr" || fail "nodea's rank 0 did not fence itself"
fi
log "nodeb trains ranks 0 and 1; SIGCONT nodea"
kill -CONT "$PID_nodea"
wait_state "$job" SUCCEEDED 120
kill "$sampler"
followers=([0]="$follower" [2]="$follower2")  # rank -> pid
for r in 0 2; do
  wait_for 30 exited "${followers[$r]}" || fail "logs --follow of rank $r still runs 30 s after the job ended"
  rc=0; wait "${followers[$r]}" || rc=$?
  [ "$rc" = 0 ] || fail "logs --follow of rank $r exited $rc: $(cat "$T/follow$r.err")"
done
# line_of FILE LINE: the number of LINE's first whole-line match in FILE.
line_of() { grep -Fxn -- "$2" "$1" | head -n 1 | cut -d: -f1; }
# Rank 0: nodea's round 1 up to the freeze (its later lines may stay
# unread while nodea does not answer), then nodeb's whole file.
first=$(head -n 1 "$T/nodea/jobs/$job/rank-0.stdout")
[ -n "$(line_of "$T/follow0.out" "$first")" ] || fail "logs --follow of rank 0 lacks nodea's round 1: $(head -n 2 "$T/follow0.out")"
for end in head tail; do
  l=$($end -n 1 "$T/nodeb/jobs/$job/rank-0.stdout")
  [ -n "$(line_of "$T/follow0.out" "$l")" ] || fail "logs --follow of rank 0 lacks nodeb's line '$l'"
done
# Rank 2: nodeb's file (round 1) whole, then nodea's (round 3) whole.
b_last=$(line_of "$T/follow2.out" "$(tail -n 1 "$T/nodeb/jobs/$job/rank-2.stdout")")
a_first=$(line_of "$T/follow2.out" "$(head -n 1 "$T/nodea/jobs/$job/rank-2.stdout")")
a_last=$(line_of "$T/follow2.out" "$(tail -n 1 "$T/nodea/jobs/$job/rank-2.stdout")")
[ -n "$b_last" ] && [ -n "$a_first" ] && [ -n "$a_last" ] && (( b_last < a_first )) ||
  fail "logs --follow of rank 2 is not nodeb's round 1 to its end, then nodea's (lines $b_last, $a_first, $a_last): $(grep -n '^===' "$T/follow2.out")"
log "logs --follow: rank 0 from nodea, then nodeb after the freeze; rank 2 nodeb's round 1 to its end, then nodea's"
samples=$(wc -l <"$T/owners.txt")
(( samples > 50 )) || fail "only $samples samples taken"
# The sampler saw the job: round 1's four ranks before the SIGSTOP, and
# round 2's ranks 0 and 1 (nodeb's) after it.
stopped_ms=$((stopped_at / 1000000))
saw_round1=$(awk -v t="$stopped_ms" '$1 < t && $3 == "live=1:0,1:1,1:2,1:3"' "$T/owners.txt" | wc -l)
saw_round2=$(awk -v t="$stopped_ms" '$1 > t && $3 ~ /^live=[2-9]:0,[2-9]:1$/' "$T/owners.txt" | wc -l)
(( saw_round1 > 0 && saw_round2 > 0 )) ||
  fail "the sampler did not see the job ($saw_round1 samples of round 1's 4 ranks, $saw_round2 of round 2's 2): $(sort -u -k3,3 "$T/owners.txt" | cut -d' ' -f3- | head -n 20)"
if grep DOUBLE "$T/owners.txt"; then fail "a rank had two live owners (above)"; fi
ls_cli status "$job"
check_invariants "$job" 3
if [ "$MODE" = guard ]; then
  # Resumed, nodea's agent says who killed its round-1 workers.
  wait_for 10 grep -q "job=$job rank=0 .*killed by signal 9 by this node's fence guard" "$T/nodea.log" ||
    fail "nodea's agent did not tell its guard's kill of rank 0: $(grep 'worker pid' "$T/nodea.log" | head -n 4)"
fi
log "PASS: $samples samples ($saw_round1 of round 1's four ranks, $saw_round2 of round 2's two), never two live owners of a rank"
