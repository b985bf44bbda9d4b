#!/usr/bin/env python3
"""Samples, every 100 ms until killed, the live processes of one job and
records every instant at which two of them hold the same rank.

usage: rank_owners.py JOB_ID OUT_FILE
A process belongs to the job when its environment has LOCKSTEP_JOB_ID=JOB;
its rank is LOCKSTEP_RANK. The owner of a rank is a node's round of it
(LOCKSTEP_AGENT, LOCKSTEP_ROUND): a worker and the helpers it started
(which inherit its environment) are one owner; the same rank live in two
rounds, or on two nodes, is two. Zombies (exited, not yet reaped: a frozen
agent cannot reap) and processes that are gone own nothing. OUT_FILE gets
one line per sample: "<unix_ms> <live> live=<round>:<rank>,... [DOUBLE
rank=R pids=...]" (live: the number of owners, each listed once; "-" when
none), so a test can show the sampler saw the job's workers at all.
"""
import os
import sys
import time


def owners(job):
    by_rank = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if env.get(b"LOCKSTEP_JOB_ID") != job.encode():
                continue
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError):
            continue
        if state in ("Z", "X"):
            continue
        rank = int(env.get(b"LOCKSTEP_RANK", b"-1"))
        round_ = env.get(b"LOCKSTEP_ROUND", b"?").decode()
        node = env.get(b"LOCKSTEP_AGENT", b"?").decode()
        by_rank.setdefault(rank, {}).setdefault((round_, node), []).append(pid)
    return by_rank


def main():
    job, out = sys.argv[1], sys.argv[2]
    with open(out, "a", buffering=1) as f:
        while True:
            by_rank = owners(job)
            live = sorted(f"{r}:{rank}" for rank, owners_ in by_rank.items() for r, _ in owners_)
            line = f"{int(time.time() * 1000)} {len(live)} live={','.join(live) or '-'}"
            for rank, owners_ in sorted(by_rank.items()):
                if len(owners_) > 1:
                    pids = [p for procs in owners_.values() for p in procs]
                    line += f" DOUBLE rank={rank} pids={','.join(pids)}"
            f.write(line + "\n")
            time.sleep(0.1)


if __name__ == "__main__":
    main()
