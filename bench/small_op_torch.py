"""PyTorch's reference for the small-op rows of bench/ops.lua: the cost of one `a + b` on
(4,) f32 tensors called from Python, tape on (b requires grad) and off, in microseconds per
call: the median of `runs` runs of `calls` calls, by wall clock (as bench/ops.lua) and by
the main thread's CPU time (which a shared machine disturbs less).
Run: /usr/bin/python3 bench/small_op_torch.py [calls] [runs]
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
    fn()
    times = []
    for _ in range(runs):
        t0 = clock()
        for _ in range(calls):
            fn()
        times.append((clock() - t0) / calls * 1e6)
    times.sort()
    return times[len(times) // 2]


for name, fn in (("a + b, tape on", lambda: a + b), ("a + b, no grad", lambda: a + a),
                 ("a.add(b), tape on", lambda: a.add(b))):
    print("torch %-18s wall %.3f us  cpu %.3f us"
          % (name, median_us(fn, time.perf_counter), median_us(fn, time.thread_time)))
