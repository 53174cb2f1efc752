"""bench/allreduce_torch.py: torch.distributed's gloo all-reduce, the same measurement as
bench/allreduce.lua. Run:
  /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --redirects 2 --tee 2 bench/allreduce_torch.py
Rank 0 prints "bytes=<b> time_us=<t> busbw_gbs=<g>" per size."""
import sys, time
import torch
import torch.distributed as dist

max_mb = 256
if "--max-mb" in sys.argv:
    max_mb = int(sys.argv[sys.argv.index("--max-mb") + 1])
torch.set_num_threads(1)
dist.init_process_group("gloo")
n, rank = dist.get_world_size(), dist.get_rank()
size = 4096
while size <= max_mb * 1024 * 1024:
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
    med = times[(len(times) + 1) // 2 - 1]
    if rank == 0:
        print(f"bytes={size} time_us={med * 1e6:.1f} busbw_gbs={size / med / 1e9 * 2 * (n - 1) / n:.3f}", flush=True)
    size *= 4
dist.destroy_process_group()
