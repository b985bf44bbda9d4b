#!/usr/bin/env bash
# The systemd units pass `systemd-analyze verify` (with ExecStart pointed at
# the freshly built lockstepd, since /usr/local/bin/lockstepd may not exist).
set -euo pipefail
LOCKSTEPD="$PWD/$1"
shift
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIP: systemd-analyze not installed"
  exit 0
fi
dir="${TEST_TMPDIR:-$(mktemp -d)}/units"
mkdir -p "$dir"
for unit in "$@"; do
  sed "s|/usr/local/bin/lockstepd|$LOCKSTEPD|" "$unit" >"$dir/$(basename "$unit")"
done
out=$(cd "$dir" && systemd-analyze verify --man=no ./*.service 2>&1) || {
  echo "$out"
  echo "FAIL: systemd-analyze verify"
  exit 1
}
# verify prints warnings without failing; treat those about our units as errors.
if echo "$out" | grep -E "lockstepd-(agent|coordinator)\.service" | grep -v "Failed to connect to bus"; then
  echo "FAIL: warnings above"
  exit 1
fi
echo "$out"
echo "PASS: $* verified"
