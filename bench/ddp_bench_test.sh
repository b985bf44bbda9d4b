#!/usr/bin/env bash
# ddp_bench prints one JSON line per run with the fields bench/README.md and
# the issue name, for DDP and for the --local baseline. (Schema only: speed
# is compared in bench/README.md, never asserted here.)
set -euo pipefail
bench="$1"
train="$2"
for mode in "" "--local"; do
  line=$("$bench" --train "$train" --model mlp_small --world 2 --steps 3 --warmup 1 --bucket-mb 1 $mode)
  echo "$line"
  MODE="$mode" /usr/bin/python3 -c '
import json, os, sys
lines = [l for l in sys.stdin.read().splitlines() if l.startswith("{")]
assert len(lines) == 1, "expected one JSON line, got %r" % lines
d = json.loads(lines[0])
for k in ("system", "model", "world", "backend", "bucket_mb", "step_ms_median", "samples_per_s"):
    assert k in d, "missing field %s in %s" % (k, d)
assert d["system"] == "lockstep" and d["model"] == "mlp_small" and d["world"] == 2, d
assert d["backend"] == ("local" if os.environ["MODE"] else "gloo"), d
assert d["step_ms_median"] > 0 and d["samples_per_s"] > 0, d
' <<<"$line"
done
echo PASS
