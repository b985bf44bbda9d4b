#!/usr/bin/env bash
# daemon/README.md's flag table against `lockstepd --help`: for every flag
# whose help states a numeric default ("(default: N)"), the table's default
# column must start with that number ("N", or "N / M" for two flags on one
# row). Catches a default changed in the code but not in the README, or the
# other way round.
set -euo pipefail
lockstepd=$1
readme=$2
help=$("$lockstepd" --help 2>&1 || true)
python3 -c '
import re, sys
help_text = sys.stdin.read()
defaults = {}
for m in re.finditer(r"^\s+(--[a-z0-9-]+)\s.*\(default: ([0-9.]+)\)\s*$", help_text, re.M):
    defaults[m.group(1)] = m.group(2)
if len(defaults) < 5:
    sys.exit("readme_defaults_test: only %d numeric defaults in --help:\n%s" % (len(defaults), help_text))
rows = {}
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.split("|")]
    if len(cells) < 4 or not cells[1].startswith("`--"):
        continue
    flags = re.findall(r"`(--[a-z0-9-]+)`", cells[1])
    values = [v.strip() for v in cells[2].split("/")]
    for i, f in enumerate(flags):
        rows[f] = values[i] if len(values) == len(flags) else values[0]
bad, checked = [], 0
for flag, want in sorted(defaults.items()):
    if flag not in rows:
        bad.append("%s: default %s in --help, no row in the README table" % (flag, want))
        continue
    got = rows[flag].split()[0] if rows[flag] else ""
    checked += 1
    if got.strip("`") != want:
        bad.append("%s: --help says %s, the README says %r" % (flag, want, rows[flag]))
for b in bad:
    print("readme_defaults_test:", b)
print("readme_defaults_test: %d numeric defaults checked" % checked)
sys.exit(1 if bad else 0)
' "$readme" <<<"$help"
