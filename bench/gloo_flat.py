#!/usr/bin/python3
"""gloo_flat.py - gloo's flat all-reduce through torch, a reference of run_sync.sh.

Mode F: torch.distributed.all_reduce (SUM) on one flat f32 tensor holding the
parameters' bytes (allocated once), then one in-place multiply by 1 / world:
the best gloo can do with the same bytes (no buckets, no autograd hooks).
Launched like ddp_bench.py (rank from OMPI_COMM_WORLD_RANK or RANK; MASTER_ADDR
and MASTER_PORT from the environment), one thread per rank.  Each iteration
starts after a barrier; its time is the maximum over ranks; the first
(untimed) iteration checks the mean of 1..world.

Usage: gloo_flat.py PARAMS [--iters N] [--warmup N]
Prints (rank 0) "RESULT F median_s=.. min_s=.. max_s=.. n=.. bytes=.. gbps=..".
"""
import argparse
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("params")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    import torch
    import torch.distributed as dist
    total = 0
    with open(args.params) as f:
        for line in f:
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2:
                total += int(fields[1])
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29513")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    buf = torch.full((total,), float(rank + 1), dtype=torch.float32)
    times = []
    for it in range(args.warmup + args.iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        buf.mul_(1.0 / world)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if it == 0:
            want = (world + 1) / 2.0
            bad = torch.tensor([int((buf - want).abs().max().item() > 1e-5 * want)])
            dist.all_reduce(bad)
            if bad.item():
                if rank == 0:
                    print("gloo_flat: FAIL: wrong mean", flush=True)
                return 1
        elif it >= args.warmup:
            times.append(dt.item())
    if rank == 0:
        md, nbytes = statistics.median(times), total * 4
        print(f"RESULT F median_s={md:.6f} min_s={min(times):.6f} max_s={max(times):.6f} "
              f"n={len(times)} bytes={nbytes} gbps={nbytes / md / 1e9:.4f} "
              f"torch={torch.__version__}", flush=True)
    dist.barrier()
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    os._exit(rc)  # no destroy_process_group: see ddp_bench.py
