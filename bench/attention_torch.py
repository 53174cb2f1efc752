"""bench/attention_torch.py: PyTorch 1.13's explicit attention, softmax(q k^T scale + causal) v,
forward + backward (f32), at bench/attention.lua's shapes; milliseconds per call, median of
7 runs. PyTorch at its best: set the threads before import, e.g.
  OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/attention_torch.py --threads 2
"""
import sys, time
import torch

threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
torch.set_num_threads(threads)
SHAPES = [("nanogpt", 12, 4, 64, 32), ("gpt2-small", 4, 12, 256, 64)]
for name, B, H, T, D in SHAPES:
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    g = torch.randn(B, H, T, D)
    mask = torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))

    def step(fwd_only):
        s = (q @ k.transpose(-2, -1)) * (1.0 / D ** 0.5) + mask
        out = torch.softmax(s, -1) @ v
        if not fwd_only:
            out.backward(g)
            q.grad = k.grad = v.grad = None

    def median(fn, reps):
        for _ in range(3):
            fn()
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            times.append((time.perf_counter() - t0) / reps)
        return sorted(times)[3] * 1e3

    reps = 5 if T >= 256 else 20
    fwd = median(lambda: step(True), reps)
    both = median(lambda: step(False), reps)
    print("attention_torch %s threads=%d fwd_ms=%.3f fwd_bwd_ms=%.3f" % (name, threads, fwd, both))
