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
# Any other column (OVERLAP=1's, another bucket size), in the order first seen.
for r in runs.values():
    cols += [c for c in r if c not in cols]


def spread(values):
    """The median of the rounds' values, then their range."""
    return "%.0f [%.0f-%.0f]" % (statistics.median(values), min(values), max(values))


def table(columns, cell):
    print("| model | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for m, r in runs.items():
        print("| %s | %s |" % (m, " | ".join(cell(r.get(c, [])) for c in columns)))


def step_cell(ds):
    if not ds:
        return "-"
    cell = spread([d["step_ms_median"] for d in ds])
    if exposed := [d["comm_exposed_ms_median"] for d in ds if d.get("backend") in ("gloo", "shm")]:
        cell += " (exp %.0f)" % statistics.median(exposed)
    return cell


FIRST = "first_layer_reduced_after_backward_end_ms_median"


def first_layer_cell(ds):
    v = [d[FIRST] for d in ds if d.get(FIRST) is not None]
    return spread(v) if v else "-"


table(cols, step_cell)
# Gradient priority's measure: when the first layer's bucket (what the next
# forward needs first) was reduced, after backward's end.
first = [c for c in cols if "+overlap" in c]
if first:
    print()
    print("First layer's bucket reduced, ms after backward's end (median [range] over rounds):")
    print()
    table(first, first_layer_cell)
