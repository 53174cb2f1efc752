"""PyTorch's side of bench/small_op.lua: the cost of one small op on (4,) f32 tensors called
from Python, tape on (the right operand requires grad) and off, in microseconds per call: the
median of `runs` runs of `calls` calls (after one untimed run), by wall clock and by the main
thread's CPU time (which a shared machine disturbs less).
Run: /usr/bin/python3 bench/small_op_torch.py [calls] [runs]     (defaults 100000, 7)
Prints one line per op: "framework=torch op=<plus_tape|plus_nograd|add_tape|add_nograd>
wall_us=<x> cpu_us=<y>" (plus = `a + b`, add = `a.add(b)`).
"""
import sys
import time

import torch

torch.set_num_threads(1)
calls = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 7
a = torch.randn(4)
b = torch.randn(4, requires_grad=True)


def median_us(fn, clock):
    for _ in range(calls):
        fn()
    times = []
    for _ in range(runs):
        t0 = clock()
        for _ in range(calls):
            fn()
        times.append((clock() - t0) / calls * 1e6)
    times.sort()
    return times[len(times) // 2]


for name, fn in (("plus_tape", lambda: a + b), ("plus_nograd", lambda: a + a),
                 ("add_tape", lambda: a.add(b)), ("add_nograd", lambda: a.add(a))):
    print("framework=torch op=%s wall_us=%.3f cpu_us=%.3f"
          % (name, median_us(fn, time.perf_counter), median_us(fn, time.thread_time)), flush=True)
