#!/usr/bin/env bash
# The torchrun habit, no daemon: ranks of //examples:train started by hand
# with MASTER_ADDR/MASTER_PORT (rank 0 serves the job's store there).
#  1. A reference run of job 1 alone (its checksum).
#  2. Job 1 again; once it trains, job 2 is started on the same MASTER_PORT:
#     its rank 0 cannot bind the port and its rank 1 is refused by job 1's
#     store, both with clear errors; job 1 ends with the reference checksum.
#  3. While job 1 trains, garbage is sent to every TCP port its ranks listen
#     on (once the Gloo mesh is up that is only the store): job 1 is unharmed.
#  4. A rank whose peer never starts is named within --timeout-s, and says
#     whom it waits for while it waits.
source tests/e2e/lib.sh "$1" "$2" "$3"
TRAIN="$PWD/$4"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# start_rank NAME RANK PORT [train flags]: background rank, output in $T/NAME.{out,err}.
start_rank() {
  local name=$1 rank=$2 port=$3; shift 3
  env -u LOCKSTEP_STORE LOCKSTEP_RANK="$rank" LOCKSTEP_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT="$port" "$TRAIN" --model mlp_small --timeout-s 20 "$@" \
    >"$T/$name.out" 2>"$T/$name.err" &
  eval "PID_$name=$!"
}
checksum() { sed -n 's/.*"checksum":\([^,]*\),.*/\1/p' "$T/$1.out"; }
# Job 1 must still be training when job 2 has failed and the garbage is
# sent: 40 steps of at least 150 ms (6 s), where starting job 2's two
# ranks and seeing them fail takes 1-2 s. (At 50 ms a step, job 1 once
# ended before the garbage, and the test found no port to send it to.)
JOB1=(--steps 40 --step-delay-ms 150 --seed 7)

log "reference run of job 1"
port=$(free_port)
start_rank ref0 0 "$port" "${JOB1[@]}"
start_rank ref1 1 "$port" "${JOB1[@]}"
wait "$PID_ref0" || fail "reference rank 0 failed: $(tail -n 3 "$T/ref0.err")"
wait "$PID_ref1" || fail "reference rank 1 failed: $(tail -n 3 "$T/ref1.err")"
want=$(checksum ref0)
[ -n "$want" ] && [ "$want" = "$(checksum ref1)" ] || fail "reference ranks disagree: $want / $(checksum ref1)"

log "job 1 on port P, then job 2 on the same port"
port=$(free_port)
start_rank a0 0 "$port" "${JOB1[@]}"
start_rank a1 1 "$port" "${JOB1[@]}"
wait_for 60 grep -q '"step":5,' "$T/a1.out" || fail "job 1 never trained: $(tail -n 3 "$T/a1.err")"
start_rank b0 0 "$port" --steps 5 --seed 99
start_rank b1 1 "$port" --steps 5 --seed 99
rc=0; wait "$PID_b0" || rc=$?
[ "$rc" != 0 ] || fail "job 2's rank 0 ran on a port in use"
grep -q "rank 0 serves the job's store at MASTER_ADDR:MASTER_PORT: store server cannot listen on 127.0.0.1:$port: Address already in use" "$T/b0.err" ||
  fail "job 2's rank 0 does not say the port is in use: $(tail -n 2 "$T/b0.err")"
rc=0; wait "$PID_b1" || rc=$?
[ "$rc" != 0 ] || fail "job 2's rank 1 joined job 1"
grep -q "rank 1 of job local round 0 already joined the store at 127.0.0.1:$port" "$T/b1.err" ||
  fail "job 2's rank 1 does not say why it was refused: $(tail -n 2 "$T/b1.err")"

log "garbage to every port job 1 listens on"
! grep -q '"checksum"' "$T/a0.out" || fail "job 1 ended before the garbage could be sent"
ports=$(ss -ltnpH 2>/dev/null | { grep -E "pid=($PID_a0|$PID_a1)," || true; } | awk '{print $4}' | sed 's/.*://' | sort -u)
[ -n "$ports" ] || fail "found no listening port of job 1 (ss)"
for p in $ports; do
  for _ in 1 2 3; do
    python3 -c "import socket,sys; s=socket.create_connection(('127.0.0.1',$p)); s.sendall(b'\x16\x03garbage'); s.close()" || true
  done
done
log "sent garbage to ports: $(echo $ports)"

wait "$PID_a0" || fail "job 1's rank 0 failed: $(tail -n 3 "$T/a0.err")"
wait "$PID_a1" || fail "job 1's rank 1 failed: $(tail -n 3 "$T/a1.err")"
[ "$(checksum a0)" = "$want" ] && [ "$(checksum a1)" = "$want" ] ||
  fail "job 1's result changed: $(checksum a0) / $(checksum a1), want $want"

log "a peer that never starts"
port=$(free_port)
start_rank lone 1 "$port" --steps 5 --timeout-s 6
start=$(date +%s)
rc=0; wait "$PID_lone" || rc=$?
took=$(( $(date +%s) - start ))
[ "$rc" != 0 ] || fail "a rank without its peer succeeded"
(( took <= 15 )) || fail "the wait was not bounded by --timeout-s 6: $took s"
grep -q "waiting for rank 0's store at 127.0.0.1:$port" "$T/lone.err" ||
  fail "the rank never said whom it waited for: $(tail -n 3 "$T/lone.err")"
grep -q "rank 0's store at MASTER_ADDR:MASTER_PORT 127.0.0.1:$port did not come up within 6 s" "$T/lone.err" ||
  fail "the error does not name the missing rank 0: $(tail -n 2 "$T/lone.err")"
# Rank 0 alone: the store is up, rank 1 never arrives.
port=$(free_port)
start_rank lone0 0 "$port" --steps 5 --timeout-s 6
rc=0; wait "$PID_lone0" || rc=$?
[ "$rc" != 0 ] || fail "rank 0 without its peer succeeded"
grep -q "still waiting for ranks \[1\]" "$T/lone0.err" || fail "rank 0 never said it waited for rank 1"
grep -q "ranks \[1\] did not arrive within 6 s" "$T/lone0.err" ||
  fail "rank 0's error does not name rank 1: $(tail -n 2 "$T/lone0.err")"
log "PASS"
