#!/usr/bin/python3
"""Formats bench/run_table.sh output (JSON lines) as the markdown table of bench/README.md.

Each cell: the median over the rounds of each run's median step ms, then the
range of those medians in brackets (and for lockstep DDP the median exposed
communication ms)."""
import json, statistics, sys

runs = {}
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    if d["system"] == "lockstep":
        if d["backend"] == "local":
            key = "lockstep local"
        else:
            key = "lockstep %s %g MB" % (d["backend"], d["bucket_mb"])
            if not d.get("gradient_as_bucket_view", True):
                key += " own grads"
            if d.get("overlap_optimizer"):
                key += " +overlap"
            if d.get("gradient_priority"):
                key += " +priority"
    else:
        key = d["system"]
    row = d["model"]
    if d.get("batch_per_rank", 32) != 32:
        row += ", batch %d" % d["batch_per_rank"]
    runs.setdefault(row, {}).setdefault(key, []).append(d)
cols = ["lockstep local", "lockstep gloo 25 MB", "lockstep gloo 25 MB own grads",
        "lockstep shm 25 MB", "torch-ddp", "torch-local +keep", "torch-ddp +keep"]
# Columns run_table.sh adds when asked (OVERLAP=1), shown when present.
extra = ["lockstep gloo 25 MB +overlap", "lockstep gloo 25 MB +overlap +priority"]
cols += [c for c in extra if any(c in r for r in runs.values())]
# Any other lockstep column (another bucket size), in the order first seen.
for r in runs.values():
    cols += [c for c in r if c not in cols]
print("| model | " + " | ".join(cols) + " |")
print("|---" * (len(cols) + 1) + "|")
for m, r in runs.items():
    cells = []
    for c in cols:
        ds = r.get(c)
        if not ds:
            cells.append("-")
            continue
        steps = [d["step_ms_median"] for d in ds]
        cell = "%.0f [%.0f-%.0f]" % (statistics.median(steps), min(steps), max(steps))
        if d_exp := [d["comm_exposed_ms_median"] for d in ds if d.get("backend") in ("gloo", "shm")]:
            cell += " (exp %.0f)" % statistics.median(d_exp)
        cells.append(cell)
    print("| %s | %s |" % (m, " | ".join(cells)))
# Gradient priority's measure: when the first layer's bucket (what the next
# forward needs first) was reduced, after backward's end.
first = [c for c in cols if "+overlap" in c]
if first and any(d.get("first_layer_reduced_after_backward_end_ms_median") is not None
                 for r in runs.values() for c in first for d in r.get(c, [])):
    print()
    print("First layer's bucket reduced, ms after backward's end (median [range] over rounds):")
    print()
    print("| model | " + " | ".join(first) + " |")
    print("|---" * (len(first) + 1) + "|")
    for m, r in runs.items():
        cells = []
        for c in first:
            v = [d["first_layer_reduced_after_backward_end_ms_median"] for d in r.get(c, [])
                 if d.get("first_layer_reduced_after_backward_end_ms_median") is not None]
            cells.append("%.0f [%.0f-%.0f]" % (statistics.median(v), min(v), max(v)) if v else "-")
        print("| %s | %s |" % (m, " | ".join(cells)))
