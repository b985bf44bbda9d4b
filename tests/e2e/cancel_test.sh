#!/usr/bin/env bash
# cancel stops every worker within the grace period; no process is left.
source tests/e2e/lib.sh "$@"

start_coordinator
start_agent nodeb
job=$(submit --nodes 2 --nproc-per-node 2 --stop-grace-s 2 --env TRAINER_STEPS=600)
wait_state "$job" RUNNING 30
wait_for 30 grep -q "^rank 3 step 1 " "$T/nodeb/jobs/$job/rank-3.stdout" || fail "rank 3 never stepped"
[ "$(worker_pids | wc -l)" = 4 ] || fail "expected 4 workers, found: $(describe_workers)"
start=$(date +%s%N)
ls_cli cancel "$job"
state_is "$job" CANCELLED || fail "cancel was acknowledged but the job is $(job_state "$job")"
# Heartbeat (0.3 s) + grace (2 s) + reaping, with slack for a loaded machine.
wait_for 5 no_workers || fail "workers still alive after the grace period: $(describe_workers)"
log "all workers gone after $(( ($(date +%s%N) - start) / 1000000 )) ms"
ls_cli cancel "$job" 2>"$T/again.txt" && fail "a second cancel should fail"
# The state as the rest of the CLI prints it, not the enum's name.
grep -q "already finished as CANCELLED$" "$T/again.txt" || fail "second cancel: $(cat "$T/again.txt")"
wait_for 10 field_is "$job" 'sum(w["state"]=="STOPPED" for w in j["workers"])' 4 ||
  fail "workers not reported STOPPED"
check_invariants "$job" 0
log "PASS"
