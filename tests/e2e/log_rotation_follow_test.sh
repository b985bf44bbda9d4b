#!/usr/bin/env bash
# `lockstep logs --follow` across rotations (lockstepd --max-log-mb): a job
# prints numbered lines at about 200 KB/s into a log capped at 64 KiB, so
# the agent rotates it about once a second (copy to .1, empty, a marker
# line) while the CLI polls every 300 ms. Every line reaches the follower
# once and in order: a follower whose file was rotated since its last read
# reads on in .1 from where it was, then the new file. A gap is allowed only
# where it is said: the marker's "bytes written while it was copied were
# dropped", or the CLI's "rotated more than once since the last read".
# Before ReadLogs had generations the follower went on at its old offset in
# the emptied file (or from 0), losing the rest of .1 at every rotation.
source tests/e2e/lib.sh "$1" "$2" "$3"

start_coordinator --max-log-mb 0.0625
# Each burst of 100 lines is one write(2), so a rotation never falls between
# two halves of a line (Python's buffer would split a burst at 8 KiB).
job=$(ls_cli submit --detach --json --nproc-per-node 1 -- /usr/bin/python3 -c '
import os, time
pad = "p" * 88
n = 0
for burst in range(120):
    os.write(1, "".join("n %06d %s\n" % (n + i, pad) for i in range(100)).encode())
    n += 100
    time.sleep(0.05)
' | python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
rc=0
timeout 120 "$LOCKSTEP" --coordinator "$COORD" --token-file "$TOKEN" logs --follow "$job" \
  >"$T/out/followed" 2>"$T/out/follow.err" || rc=$?
[ "$rc" = 0 ] || fail "logs --follow exited $rc: $(tail -n 5 "$T/out/follow.err")"
rotations=$(grep -c "job=$job rank=0 rank-0.stdout grew past 65536 bytes: its [0-9]* bytes moved to rank-0.stdout.1" "$T/coord.log" || true)
(( rotations >= 3 )) || fail "the log was rotated $rotations times, want 3 or more"
python3 - "$T/out/followed" "$T/out/follow.err" <<'PY' || fail "the follower's output is not every line once, in order (above)"
import re, sys
out = open(sys.argv[1], encoding="utf-8", errors="replace").read().splitlines()
err = open(sys.argv[2]).read()
nums = [int(l.split()[1]) for l in out if re.fullmatch(r"n \d{6} p{88}", l)]
# A rotation line may follow a line cut short by output the rotation dropped.
markers = [l for l in out if "=== lockstep: rank-0.stdout grew past 65536 bytes" in l]
said = len([l for l in markers if "were dropped" in l]) + err.count("rotated more than once since the last read")
gaps = [(a, b) for a, b in zip(nums, nums[1:]) if b != a + 1]
bad = [(a, b) for a, b in gaps if b <= a]
print(f"{len(nums)} lines, first {nums[:1]}, last {nums[-1:]}, {len(markers)} rotation lines, "
      f"gaps {gaps[:5]} ({len(gaps)}), said {said}")
ok = nums[:1] == [0] and nums[-1:] == [11999] and not bad and len(gaps) <= said and len(markers) >= 3
sys.exit(0 if ok else 1)
PY
log "followed across $rotations rotations: $(wc -l <"$T/out/followed") lines"
log "PASS"
