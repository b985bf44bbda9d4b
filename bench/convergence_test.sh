#!/usr/bin/env bash
# bench/convergence.sh on a small case (3 ranks: Adasum's non-power-of-two
# path, 6 steps): one JSON line per run with its fields; the average
# (allreduce) tracks one process on the whole global batch to 1e-4 at every
# reported step; Adasum starts from the same loss and, its ranks' gradients
# being far from parallel on this task, has moved further by the last step.
set -euo pipefail
out=$(bench/convergence.sh "$1" "$2" "$3" --world 3 --batch 32 --steps 6 --seeds 0 --at "1 3 6")
echo "$out"
/usr/bin/python3 - <<PY
import json
rows = {}
for line in """$out""".splitlines():
    d = json.loads(line)
    for k in ("bench", "model", "hook", "seed", "world", "batch_per_rank", "global_batch", "lr", "steps", "loss"):
        assert k in d, "missing %s in %s" % (k, d)
    assert d["bench"] == "convergence" and d["global_batch"] == 96 and d["steps"] == 6, d
    assert sorted(d["loss"]) == ["1", "3", "6"], d
    rows[d["hook"]] = d
assert sorted(rows) == ["adasum", "allreduce", "local"], sorted(rows)
assert rows["local"]["world"] == 1 and rows["allreduce"]["world"] == 3, rows
for s in ("1", "3", "6"):
    assert abs(rows["allreduce"]["loss"][s] - rows["local"]["loss"][s]) < 1e-4, (s, rows)
assert abs(rows["adasum"]["loss"]["1"] - rows["local"]["loss"]["1"]) < 1e-4, rows
assert rows["adasum"]["loss"]["6"] < rows["allreduce"]["loss"]["6"], rows
print("PASS")
PY
