"""PyTorch's side of bench/profiler_overhead.lua: torch.profiler's cost on the same MLP
training (784-256-128-10, batch 64, random data, SGD momentum 0.9, 1 thread) and on one small
op, against the same work with the profiler off, with the same paired rounds and medians.
Run: OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/profiler_overhead_torch.py [steps] [rounds] [calls]
Prints "framework=torch mode=<...> value=<x> unit=<...> ratio=<on/off>" lines.
"""
import statistics
import sys
import time

import torch
from torch.profiler import profile, ProfilerActivity

torch.set_num_threads(1)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
calls = int(sys.argv[3]) if len(sys.argv) > 3 else 200000
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))


def train(mode):
    def run():
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if prof is not None:
                prof.step()
        return time.perf_counter() - t0, time.process_time() - c0
    prof = None
    if mode == "off":
        return run()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=(mode == "shapes")) as prof:
        return run()


modes = ["off", "on", "shapes"]
sps = {m: [] for m in modes}
ratio = {m: [] for m in modes}
cpu_ratio = {m: [] for m in modes}
train("off")
for r in range(1, rounds + 1):
    t, c = {}, {}
    for k in range(len(modes)):
        m = modes[(r + k) % len(modes)]
        t[m], c[m] = train(m)
    for m in modes:
        sps[m].append(steps * 64 / t[m])
        ratio[m].append(t["off"] / t[m])
        cpu_ratio[m].append(c["off"] / c[m])
for m in modes:
    print("framework=torch mode=mlp_%s value=%.0f unit=samples/s ratio=%.4f cpu_ratio=%.4f"
          % (m, statistics.median(sps[m]), statistics.median(ratio[m]),
             statistics.median(cpu_ratio[m])), flush=True)

a, b = torch.randn(4), torch.randn(4)


def op_cost(record):
    def run():
        t0 = time.perf_counter()
        for _ in range(calls):
            a.add(b)
        return (time.perf_counter() - t0) / calls * 1e9
    if not record:
        return run()
    with profile(activities=[ProfilerActivity.CPU]):
        return run()


with torch.no_grad():
    op_cost(False)
    off, on, rr = [], [], []
    for r in range(rounds):
        if r % 2:
            o, n = op_cost(False), op_cost(True)
        else:
            n, o = op_cost(True), op_cost(False)
        off.append(o), on.append(n), rr.append(n / o)
    print("framework=torch mode=add_4_off value=%.1f unit=ns/call" % statistics.median(off))
    print("framework=torch mode=add_4_on value=%.1f unit=ns/call ratio=%.4f"
          % (statistics.median(on), statistics.median(rr)), flush=True)
