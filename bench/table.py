#!/usr/bin/python3
"""Formats bench/run_table.sh output (JSON lines) as the markdown table of bench/README.md."""
import json, sys

rows = {}
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    m = d["model"]
    if d["system"] == "lockstep":
        key = "lockstep local" if d["backend"] == "local" else "lockstep %g MB" % d["bucket_mb"]
        if d["backend"] == "shm":
            key = "lockstep shm %g MB" % d["bucket_mb"]
        if d.get("gradient_as_bucket_view"):
            key += " view"
    else:
        key = d["system"]
    rows.setdefault(m, {})[key] = d
cols = ["lockstep local", "torch-local", "lockstep 1 MB", "lockstep 5 MB", "lockstep 25 MB",
        "lockstep 100 MB", "lockstep 25 MB view", "lockstep shm 25 MB", "torch-ddp", "torch-local +keep",
        "torch-ddp +keep"]
print("| model | " + " | ".join(cols) + " |")
print("|---" * (len(cols) + 1) + "|")
for m, r in rows.items():
    cells = []
    for c in cols:
        d = r.get(c)
        if d is None:
            cells.append("-")
        elif "cpu_ms_median" in d and d.get("backend") in ("gloo", "shm"):
            cells.append("%.0f (exp %.0f)" % (d["step_ms_median"], d["comm_exposed_ms_median"]))
        else:
            cells.append("%.0f" % d["step_ms_median"])
    print("| %s | %s |" % (m, " | ".join(cells)))
