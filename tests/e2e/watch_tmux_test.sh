#!/usr/bin/env bash
# `lockstep watch` on a real terminal (tmux, 80x24, read back with
# capture-pane): one screen redrawn in place (the header once, nothing
# scrolled into history, the step advancing in the same rows), every line
# within 80 columns; "STALE" while the coordinator is stopped (SIGSTOP), gone
# once it answers again; exit 3 when the job ends CANCELLED. The job is real
# DDP (examples/train over Gloo).
source tests/e2e/lib.sh "$@"
TRAIN="$PWD/$4"
command -v tmux >/dev/null || fail "tmux is not installed (tools/setup.sh installs it)"

start_coordinator --no-agent
start_agent nodeb
job=$(ls_cli submit --detach --json --nproc-per-node 2 -- "$TRAIN" --model mlp_small --steps 100000 \
  --step-delay-ms 20 --timeout-s 120 | python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')

# tmux's socket path must fit in sun_path (108 bytes): $T is too deep.
TMUX_TMPDIR=$(mktemp -d /tmp/lockstep-tmux.XXXXXX)
export TMUX_TMPDIR
TM=(tmux -L watch -f /dev/null)
EXTRA_CLEANUP='kill -CONT "$PID_coord" 2>/dev/null || true; "${TM[@]}" kill-server 2>/dev/null || true; rm -rf "$TMUX_TMPDIR"'
"${TM[@]}" new-session -d -x 80 -y 24 -s w \
  "TERM=xterm '$LOCKSTEP' --coordinator '$COORD' --token-file '$TOKEN' watch '$job' --interval-s 0.3; echo \"watch exited \$?\"; sleep 600"
screen() { "${TM[@]}" capture-pane -p -t w; }
# Whether the screen has a line matching $1 (read whole first: `screen |
# grep -q` under pipefail fails when grep exits before tmux's last write).
screen_has() { grep -q "$1" <<<"$(screen)"; }
history_size() { "${TM[@]}" display-message -p -t w '#{history_size}'; }
# The step rank R shows on screen now (empty if none).
step_of() { screen | awk -v r="$1" '$1 == r && $3 == "RUNNING" { print $4 }'; }
has_step() { [ -n "$(step_of "$1")" ] && [ "$(step_of "$1")" -ge "$2" ]; }

wait_for 30 has_step 1 2 || fail "watch shows no progress of rank 1: $(screen)"
first=$(step_of 1)
wait_for 20 has_step 1 $((first + 5)) || fail "watch did not advance past step $first: $(screen)"
screen >"$T/screen1.txt"
[ "$(grep -c "^job $job " "$T/screen1.txt")" = 1 ] ||
  fail "the header is not on screen exactly once: $(cat "$T/screen1.txt")"
[ "$(history_size)" = 0 ] || fail "watch scrolled $(history_size) lines into history instead of redrawing"
awk 'length($0) > 80 { exit 1 }' "$T/screen1.txt" || fail "a line is wider than 80 columns"
for r in 0 1; do
  [ "$(grep -Ec "^$r +nodeb +RUNNING " "$T/screen1.txt")" = 1 ] || fail "rank $r is not one row: $(cat "$T/screen1.txt")"
done
if grep -q STALE "$T/screen1.txt"; then fail "fresh data marked STALE"; fi

log "stopping the coordinator"
kill -STOP "$PID_coord"
wait_for 15 screen_has "^STALE: coordinator $COORD unreachable for" ||
  fail "watch did not mark the data stale: $(screen)"
screen_has "^RUNNING (stale)" || fail "the state line is not marked stale: $(screen)"
[ "$(history_size)" = 0 ] || fail "the stale screen scrolled"
kill -CONT "$PID_coord"
wait_for 15 eval '! screen_has STALE' || fail "STALE stayed after the coordinator came back: $(screen)"

ls_cli cancel "$job" >/dev/null
wait_for 30 screen_has "watch exited 3" || fail "watch did not end with exit 3: $(screen)"
screen_has "^CANCELLED " || fail "the last frame does not show CANCELLED: $(screen)"
wait_for 20 no_workers || fail "workers left: $(describe_workers)"
log "PASS"
