#!/usr/bin/env bash
# The README's main command without its install and build steps: tools/demo.sh
# runs deploy/local_demo.sh on the example trainer, and so does this, with
# the binaries Bazel built (a small model, few steps). Checks what the demo
# promises: the job SUCCEEDED with two ranks, its status and the trainer's
# result are printed, both ranks end with the same parameters (checksum),
# and the daemon is gone afterwards.
# Usage: local_demo_test.sh LOCKSTEPD LOCKSTEP TRAIN
set -euo pipefail
LOCKSTEPD=$(realpath "$1")
LOCKSTEP=$(realpath "$2")
TRAIN=$(realpath "$3")
fail() { echo "FAIL: $*" >&2; exit 1; }
# Under /tmp, not TEST_TMPDIR: as root the job runs as a uid of its own,
# which cannot traverse Bazel's output tree under /root.
STATE=$(mktemp -d /tmp/lockstep-demo-test.XXXXXX)
chmod 0711 "$STATE"
trap 'rm -rf "$STATE"' EXIT

out=$(LOCKSTEPD="$LOCKSTEPD" LOCKSTEP="$LOCKSTEP" STATE="$STATE" NPROC=2 \
  "$(dirname "$0")/local_demo.sh" -- "$TRAIN" --model mlp_small --steps 5 2>&1) ||
  { echo "$out"; cat "$STATE/lockstepd.log" >&2; fail "local_demo.sh exited with $?"; }
echo "$out"

job=$(sed -n 's/^submitted job //p' <<<"$out")
[ -n "$job" ] || fail "no 'submitted job' line"
# The followed job's end, then `lockstep status`.
grep -Eq "^lockstep: SUCCEEDED .*all 2 ranks exited 0" <<<"$out" || fail "the followed job did not end SUCCEEDED"
grep -Eq "^state: +SUCCEEDED$" <<<"$out" || fail "the status printed is not SUCCEEDED"
grep -Eq "^nodes: .* world size 2$" <<<"$out" || fail "the status does not show a world of 2"
grep -q '"checksum"' <<<"$out" || fail "the trainer's result (checksum line) not printed"
sums=()
for r in 0 1; do
  f="$STATE/jobs/$job/rank-$r.stdout"
  [ -f "$f" ] || fail "no $f"
  sum=$(sed -n 's/.*"checksum":\([^,]*\),.*/\1/p' "$f" | tail -n 1)
  [ -n "$sum" ] || fail "rank $r printed no checksum"
  sums+=("$sum")
done
[ "${sums[0]}" = "${sums[1]}" ] || fail "ranks disagree: checksum ${sums[0]} against ${sums[1]}"
echo "both ranks: checksum ${sums[0]}"
# The demo stopped its daemon on the way out.
! pgrep -f -- "--state-dir $STATE" > /dev/null || fail "lockstepd of $STATE still runs"
echo "PASS"
