#!/usr/bin/python3
"""ddp_bench.py - PyTorch DDP (gloo) gradient sync on a parameter list (issue 4).

The PyTorch side of bench/run_sync.sh: the same parameter list and process
count as bench_sync_mpi, launched by the same mpirun (rank and world size
from OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE, or torchrun's RANK /
WORLD_SIZE; MASTER_ADDR defaults to 127.0.0.1, MASTER_PORT to 29512).

Model: one nn.Parameter per line of the list, with the line's shape (f32),
in an nn.ParameterList, so DDP sees exactly those tensors in that order.
Forward: loss = sum_p (p * c).sum() with c = rank + 1 (a different
gradient on every rank); its backward writes grad(p) = c everywhere, a
cheap memory-bound backward whose gradients become ready in reverse
registration order, as in a real backward.

Wrapped as DDP(model, bucket_cap_mb=25) (other options at their defaults:
first bucket 1 MB, gradient_as_bucket_view=False, gloo all-reduce, grads
divided by the world size).  DDP's backward() returns only after every
bucket's all-reduce has finished and been copied back, so:

    sync time (d) = median(backward with DDP sync)
                  - median(backward under model.no_sync())

The two backwards run interleaved (one of each per iteration, after a
barrier), each timed from loss.backward() to its return with
time.perf_counter(); an iteration's time is the maximum over ranks (min_s
and max_s in the RESULT line: extremes of the per-iteration differences).  The
forward (and zero_grad) is outside the timed region.  The difference is the
sync's cost on top of the backward (DDP overlaps its all-reduces with the
rest of the backward; this backward is so cheap that almost nothing can
hide behind it).  The first warm-up iteration checks that every gradient
is the mean of 1..world.

torch.set_num_threads(1) (default here; --threads N changes it): every
rank is one single-threaded process, as the C benchmark's ranks are, and
4 ranks already share the machine's cores.

PARAMS defaults to gpt-small.params next to this script (bench/README.md).

Prints (rank 0) "RESULT d median_s=.. ..." for bench/run_sync.sh and "#"
lines for people.  Exit status 0, 1 on a failed check, 2 on a usage error.
"""
import argparse
import os
import statistics
import sys
import time


def load_params(path):
    out = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            try:
                name, count = fields[0], int(fields[1])
                shape = tuple(int(x) for x in fields[2].split("x")) if len(fields) > 2 else (count,)
            except (IndexError, ValueError):
                sys.exit(f"ddp_bench: {path}:{lineno}: expected `name elements shape`")
            n = 1
            for s in shape:
                n *= s
            if count <= 0 or n != count:
                sys.exit(f"ddp_bench: {path}:{lineno}: shape {fields[2]} has {n} elements, "
                         f"the line says {count}")
            out.append((name, shape))
    if not out:
        sys.exit(f"ddp_bench: {path}: no parameters")
    return out


def env_int(*names):
    for n in names:
        v = os.environ.get(n)
        if v is not None:
            return int(v)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("params", nargs="?",
                    default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                         "gpt-small.params"),
                    help="parameter list (default: gpt-small.params next to this script)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.iters < 1 or args.warmup < 1:
        ap.error("--iters and --warmup must be >= 1")

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = env_int("OMPI_COMM_WORLD_RANK", "RANK", "PMI_RANK")
    world = env_int("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", "PMI_SIZE")
    if rank is None or world is None:
        sys.exit("ddp_bench: no rank / world size in the environment (run under mpirun "
                 "or torchrun)")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    plist = load_params(args.params)
    total = sum(torch.Size(s).numel() for _, s in plist)
    nbytes = total * 4

    class ListModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = nn.ParameterList(
                [nn.Parameter(torch.zeros(s, dtype=torch.float32)) for _, s in plist])

        def forward(self, c):
            loss = None
            for p in self.ps:
                t = (p * c).sum()
                loss = t if loss is None else loss + t
            return loss

    model = DDP(ListModel(), bucket_cap_mb=args.bucket_mb)
    params = list(model.module.ps)
    c = torch.tensor(float(rank + 1))

    def one(sync):
        """One timed backward (zero_grad and forward untimed)."""
        model.zero_grad(set_to_none=False)
        if sync:
            loss = model(c)
        else:
            with model.no_sync():
                loss = model(c)
        dist.barrier()
        t0 = time.perf_counter()
        if sync:
            loss.backward()
        else:
            with model.no_sync():
                loss.backward()
        dt = time.perf_counter() - t0
        t = torch.tensor([dt], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    # Checked warm-up: the mean over ranks of (rank + 1) is (world + 1) / 2.
    one(True)
    want = (world + 1) / 2.0
    bad = sum(int((p.grad - want).abs().max().item() > 1e-5 * want) for p in params)
    flag = torch.tensor([bad], dtype=torch.int64)
    dist.all_reduce(flag)
    if flag.item():
        if rank == 0:
            print(f"ddp_bench: FAIL: {flag.item()} tensors are not the mean {want}", flush=True)
        dist.barrier()
        return 1
    one(False)
    for _ in range(args.warmup - 1):
        one(True)
        one(False)

    with_sync, without = [], []
    for _ in range(args.iters):
        with_sync.append(one(True))
        without.append(one(False))

    if rank == 0:
        ms = statistics.median(with_sync)
        mn = statistics.median(without)
        d = ms - mn
        buckets, sizes = "?", ""
        try:  # DDP's record of its buckets (rebuilt after the first step), bytes
            info = model._get_ddp_logging_data()
            sizes = str(info.get("rebuilt_bucket_sizes", info.get("bucket_sizes", "")))
            if sizes:
                buckets = str(len(sizes.split(",")))
                sizes = ", bucket MB: " + " ".join(
                    "%.1f" % (int(x) / 1e6) for x in sizes.split(","))
        except Exception:
            pass
        print(f"# ddp_bench: torch {torch.__version__}, gloo, world {world}, {len(plist)} "
              f"tensors, {total} elements, {nbytes / 1e6:.2f} MB f32, bucket_cap_mb "
              f"{args.bucket_mb:g}, {torch.get_num_threads()} thread(s) per rank; {buckets} "
              f"buckets{sizes}")
        print(f"# ddp_bench: backward with DDP sync median {ms * 1e3:.2f} ms (min "
              f"{min(with_sync) * 1e3:.2f}), under no_sync {mn * 1e3:.2f} ms (min "
              f"{min(without) * 1e3:.2f}); {args.iters} iterations after {args.warmup} "
              f"warm-up")
        paired = [x - y for x, y in zip(with_sync, without)]
        print(f"RESULT d median_s={d:.6f} min_s={min(paired):.6f} "
              f"max_s={max(paired):.6f} n={args.iters} bytes={nbytes} "
              f"gbps={nbytes / d / 1e9 if d > 0 else float('nan'):.4f} "
              f"ddp_backward_s={ms:.6f} nosync_backward_s={mn:.6f} buckets={buckets}",
              flush=True)
    dist.barrier()
    return 0


if __name__ == "__main__":
    rc = main()
    # Leave without dist.destroy_process_group(): with torch 1.13 + gloo a
    # rank was seen to hang in teardown after the others had exited (one
    # thread spinning), which made mpirun wait forever.  Every rank has
    # passed the final barrier, so nothing is left to synchronise.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
