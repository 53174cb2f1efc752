"""bench/sharding_collectives_torch.py: torch.distributed's gloo on the same measurement as
bench/sharding_collectives.lua (its header has the method and the bus-bandwidth factors).
PyTorch 1.13's gloo has neither reduce_scatter_tensor ("ProcessGroup gloo does not support
_reduce_scatter_base"), nor the list reduce_scatter, nor all_gather_into_tensor ("no support
for _allgather_base in Gloo process group"), so this times what a script does instead:
  reduce_scatter_tensor   -> all_reduce of the input, then this rank's chunk copied out
  all_gather_into_tensor  -> all_gather into the output's chunks (a list of views)
Run:
  /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --redirects 2 --tee 2 \
      bench/sharding_collectives_torch.py [--sizes 1048576,16777216] [--max-mb 64] [--reps-mb 256]
Rank 0 prints "op=<name> bytes=<size> time_us=<t> busbw_gbs=<g>" per size and collective."""
import argparse
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--max-mb", type=int, default=64)
p.add_argument("--reps-mb", type=int, default=256)
p.add_argument("--sizes", default=None)
a = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
n, rank = dist.get_world_size(), dist.get_rank()
if a.sizes:
    sizes = [int(s) for s in a.sizes.split(",")]
else:
    sizes, s = [], 64 * 1024
    while s <= a.max_mb * 1024 * 1024:
        sizes.append(s)
        s *= 4
FACTOR = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter_tensor": (n - 1) / n,
          "all_gather_into_tensor": (n - 1) / n}
OPS = ["all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor"]


def caller(op, size):
    elems = size // 4
    if op == "all_reduce":
        t = torch.ones(elems)
        return lambda: dist.all_reduce(t)
    if op == "reduce_scatter_tensor":
        inp, out = torch.ones(elems), torch.zeros(elems // n)

        def rs():
            scratch = inp.clone()  # the input is not to be modified
            dist.all_reduce(scratch)
            out.copy_(scratch.chunk(n)[rank])
        return rs
    inp, out = torch.ones(elems // n), torch.zeros(elems)
    views = list(out.chunk(n))
    return lambda: dist.all_gather(views, inp)


for size in sizes:
    calls = [caller(op, size) for op in OPS]
    for c in calls:
        c()
        c()
    reps = max(5, min(200, a.reps_mb * 1024 * 1024 // size))
    times = [[] for _ in OPS]
    for _ in range(reps):
        for k, c in enumerate(calls):
            dist.barrier()
            t0 = time.perf_counter()
            c()
            times[k].append(time.perf_counter() - t0)
    for k, op in enumerate(OPS):
        ts = sorted(times[k])
        t = ts[(len(ts) + 1) // 2 - 1]
        if rank == 0:
            print(f"op={op} bytes={size} time_us={t * 1e6:.2f} busbw_gbs={size / t / 1e9 * FACTOR[op]:.3f}",
                  flush=True)
dist.destroy_process_group()
