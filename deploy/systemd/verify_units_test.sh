#!/usr/bin/env bash
# The systemd units pass `systemd-analyze verify` (with ExecStart pointed at
# the freshly built lockstepd: /usr/bin/lockstepd exists only where the
# package is installed; //deploy:package_install_test verifies them there
# exactly as shipped), `systemd-analyze security` rates each at most 4.0,
# and each keeps running when the OOM killer ends one of its workers.
set -euo pipefail
LOCKSTEPD="$PWD/$1"
shift
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "FAIL: systemd-analyze is not installed (tools/setup.sh installs systemd)"
  exit 1
fi
dir="${TEST_TMPDIR:-$(mktemp -d)}/units"
mkdir -p "$dir"
for unit in "$@"; do
  sed "s|/usr/bin/lockstepd|$LOCKSTEPD|" "$unit" >"$dir/$(basename "$unit")"
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
# An OOM kill of one worker must not stop the unit (systemd's default,
# DefaultOOMPolicy=stop, does), and with it every job on the host.
for unit in "$@"; do
  grep -qx "OOMPolicy=continue" "$unit" ||
    { echo "FAIL: $unit lacks OOMPolicy=continue: one worker's OOM kill would stop every job on the host"; exit 1; }
done
for unit in "$@"; do
  rating=$(systemd-analyze security --offline=true "$unit" 2>&1 | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p')
  [ -n "$rating" ] || { echo "FAIL: no security rating for $unit"; exit 1; }
  python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 4.0 else 1)" "$rating" ||
    { echo "FAIL: $unit is rated $rating by systemd-analyze security, above 4.0"; exit 1; }
  echo "$(basename "$unit"): security $rating"
done
echo "PASS: $* verified"
