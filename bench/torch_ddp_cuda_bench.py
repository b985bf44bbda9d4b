#!/usr/bin/env python3
"""Peer for ddp_cuda_bench: PyTorch DDP over NCCL (world 1) against local
training on one GPU, with the peer script's models (torch_ddp_bench.py's
make_model), timed the same way: --repeats rounds of --steps steps, the two
modes alternating round by round, a device synchronise ending each step,
median step ms per mode.

usage: torch_ddp_cuda_bench.py --model mlp [--peer PATH/torch_ddp_bench.py]
       [--steps 30] [--warmup 5] [--repeats 3] [--batch 32] [--bucket-mb 25]
Prints one JSON line per mode: torch-local and torch-ddp.
"""
import argparse, importlib.util, json, os, statistics, time
import torch, torch.nn as nn, torch.distributed as dist


def load_peer(path):
    if not os.path.isfile(path):
        raise SystemExit(f"torch_ddp_cuda_bench: peer script not found: {path} (pass --peer)")
    spec = importlib.util.spec_from_file_location("torch_ddp_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp")
    p.add_argument("--peer", default=os.environ.get(
        "LOCKSTEP_PEER_BENCH", os.path.join(here, "..", "..", "shared", "bench", "torch_ddp_bench.py")))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--bucket-mb", type=float, default=25)
    p.add_argument("--port", type=int, default=29531)
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_ddp_cuda_bench: no CUDA device is visible")
    peer = load_peer(a.peer)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{a.port}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    modes = {}
    for name in ("torch-local", "torch-ddp"):
        model, shape = peer.make_model(a.model)
        model = model.cuda().train()
        if name == "torch-ddp":
            model = nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=a.bucket_mb)
        modes[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01), [])
    x = torch.randn(a.batch, *shape, device="cuda")
    y = torch.randint(0, 10, (a.batch,), device="cuda")
    lossf = nn.CrossEntropyLoss()

    def step(model, opt):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        lossf(model(x), y).backward()
        opt.step()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    for model, opt, _ in modes.values():
        for _ in range(a.warmup):
            step(model, opt)
    for _ in range(a.repeats):
        for model, opt, times in modes.values():
            times.extend(step(model, opt) for _ in range(a.steps))
    for name, (_, _, times) in modes.items():
        ms = statistics.median(times)
        print(json.dumps({"system": name, "model": a.model, "world": 1, "device": "cuda",
                          "batch": a.batch, "steps": len(times), "step_ms_median": round(ms, 3),
                          "samples_per_s": round(a.batch * 1e3 / ms, 1)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
