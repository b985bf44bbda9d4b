#!/usr/bin/env python3
"""Peer for nccl_allreduce_bench: torch.distributed allreduce over NCCL on CUDA
tensors, timed the same way (per-call average of back-to-back calls, median of
--repeats batches; wait_us = one call waited alone). For the GPU machine (its
python3 has PyTorch with CUDA); one process per GPU.

usage: torch_nccl_allreduce_bench.py [--world N] [--max-mb 1024]
"""
import argparse, json, os, statistics, time
import torch, torch.distributed as dist, torch.multiprocessing as mp


def run(rank, a, q):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank,
                            world_size=a.world, device_id=torch.device("cuda", rank))
    out, nbytes = [], 1 << 10
    while nbytes <= a.max_mb << 20:
        t = torch.ones(nbytes // 4, device="cuda")
        iters = max(5, min(200, int(2e10 // nbytes)))
        for _ in range(5):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        batch, wait = [], []
        for _ in range(a.repeats):
            dist.barrier()
            torch.cuda.synchronize()
            s = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            batch.append((time.perf_counter() - s) / iters)
            s = time.perf_counter()
            dist.all_reduce(t)
            torch.cuda.synchronize()
            wait.append(time.perf_counter() - s)
        dt = statistics.median(batch)
        algbw = nbytes / dt / 1e9
        out.append({"system": "torch-nccl", "world": a.world, "device": "cuda", "bytes": nbytes,
                    "time_us": round(dt * 1e6, 2), "algbw_gbps": round(algbw, 3),
                    "busbw_gbps": round(algbw * 2 * (a.world - 1) / a.world, 3),
                    "wait_us": round(statistics.median(wait) * 1e6, 2), "iters": iters})
        nbytes <<= 2
    if rank == 0:
        q.put(out)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=0, help="processes, one GPU each (0: all)")
    p.add_argument("--max-mb", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--port", type=int, default=29811)
    a = p.parse_args()
    a.world = a.world or torch.cuda.device_count()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=run, args=(r, a, q)) for r in range(a.world)]
    for pr in ps:
        pr.start()
    for line in q.get():
        print(json.dumps(line))
    for pr in ps:
        pr.join()
