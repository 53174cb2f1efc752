"""bench/allreduce_torch.py: torch.distributed's gloo all-reduce, the same measurement as
bench/allreduce.lua (its docstring has the method). Run:
  /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --redirects 2 --tee 2 bench/allreduce_torch.py \
      [--max-mb 256] [--sizes 4096,1048576] [--b2b] [--rounds 5]
Rank 0 prints "bytes=<b> tensor=ordinary time_us=<t> busbw_gbs=<g> [b2b_us=<t> b2b_busbw_gbs=<g>]"
per size (torch has no shared-buffer kind)."""
import argparse
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--max-mb", type=int, default=256)
p.add_argument("--sizes", default=None, help="comma-separated byte counts (multiples of 4)")
p.add_argument("--b2b", action="store_true", help="also time back-to-back calls")
p.add_argument("--rounds", type=int, default=5)
a = p.parse_args()
if a.sizes:
    sizes = [int(s) for s in a.sizes.split(",")]
else:
    sizes, s = [], 4096
    while s <= a.max_mb * 1024 * 1024:
        sizes.append(s)
        s *= 4

torch.set_num_threads(1)
dist.init_process_group("gloo")
n, rank = dist.get_world_size(), dist.get_rank()


def busbw(size, sec):
    return size / sec / 1e9 * 2 * (n - 1) / n


for size in sizes:
    t = torch.ones(size // 4)
    reps = max(3, min(200, (64 * 1024 * 1024) // size))
    for _ in range(2):
        dist.all_reduce(t)
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    times.sort()
    sync = times[(len(times) + 1) // 2 - 1]
    line = f"bytes={size} tensor=ordinary time_us={sync * 1e6:.2f} busbw_gbs={busbw(size, sync):.3f}"
    if a.b2b:
        # calls per round: rank 0's choice (about 0.1 s a round), the same on every rank
        k = torch.tensor([max(3, min(2000, int(0.1 / sync)))])
        dist.broadcast(k, 0)
        k = int(k.item())
        per = []
        for _ in range(a.rounds):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(k):
                dist.all_reduce(t)
            per.append((time.perf_counter() - t0) / k)
        per.sort()
        bb = per[(len(per) + 1) // 2 - 1]
        line += f" b2b_us={bb * 1e6:.2f} b2b_busbw_gbs={busbw(size, bb):.3f}"
    if rank == 0:
        print(line, flush=True)
dist.destroy_process_group()
