"""bench/gpu_gemm_torch.py: torch.matmul's side of bench/gpu_gemm.lua: the same modes
(f32 with TF32 off, tf32, f16, bf16), sizes, random inputs rotating among up to 8 sets of
about 200 MB in all, warm-up, trials of back-to-back products bracketed by
torch.cuda.synchronize and read with a host clock, median trial, and the same correctness
check against an f64 CPU product at the smallest size.

    python3 bench/gpu_gemm_torch.py [--sizes 1024,2048,4096,8192] [--modes f32,tf32,f16,bf16]
        [--device cuda:0] [--trials 5] [--trial-ms 50]
    python3 bench/gpu_gemm_torch.py --dry      # n = 64 on the CPU

Prints one line per (mode, size) in gpu_gemm.lua's format, framework=torch.
"""
import argparse
import statistics
import sys
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--sizes", default="1024,2048,4096,8192")
p.add_argument("--modes", default="f32,tf32,f16,bf16")
p.add_argument("--device", default="cuda:0")
p.add_argument("--trials", type=int, default=5)
p.add_argument("--trial-ms", type=float, default=50.0)
p.add_argument("--dry", action="store_true")
a = p.parse_args()
sizes = [int(s) for s in a.sizes.split(",")]
modes = a.modes.split(",")
dev = a.device
if a.dry:
    sizes, dev, a.trials, a.trial_ms = [64], "cpu", 2, 5.0
cuda = dev.startswith("cuda")
if cuda and not torch.cuda.is_available():
    sys.exit("gpu_gemm_torch: torch.cuda.is_available() is False")

DTYPE = {"f32": torch.float32, "tf32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
ELEM = {"f32": 4, "tf32": 4, "f16": 2, "bf16": 2}


def sync():
    if cuda:
        torch.cuda.synchronize(dev)


def measure(mode, n, check):
    dtype = DTYPE[mode]
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    nsets = max(1, min(8, int(200e6 // (3 * n * n * ELEM[mode]))))
    g = torch.Generator().manual_seed(n)
    As = [torch.randn(n, n, generator=g).to(dtype).to(dev) for _ in range(nsets)]
    Bs = [torch.randn(n, n, generator=g).to(dtype).to(dev) for _ in range(nsets)]
    rel = -1.0
    if check:
        c = torch.matmul(As[0], Bs[0]).cpu().double()
        ref = torch.matmul(As[0].cpu().double(), Bs[0].cpu().double())
        rel = ((c - ref).norm() / ref.norm()).item()
    s = [0]

    def product():
        s[0] = (s[0] + 1) % nsets
        torch.matmul(As[s[0]], Bs[s[0]])

    for _ in range(3):
        product()
    sync()
    t0 = time.perf_counter()
    product()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    k = max(1, min(10000, int(a.trial_ms / 1e3 / one)))
    times = []
    for _ in range(a.trials):
        sync()
        t = time.perf_counter()
        for _ in range(k):
            product()
        sync()
        times.append((time.perf_counter() - t) / k)
    return statistics.median_low(times), rel


for mode in modes:
    for i, n in enumerate(sizes):
        try:
            sec, rel = measure(mode, n, i == 0)
        except RuntimeError as e:
            if not a.dry:
                raise
            # the CPU build of an older PyTorch has no f16 matmul: the dry run skips it
            print(f"framework=torch mode={mode} n={n} skipped ({str(e).splitlines()[0]})", flush=True)
            continue
        rel_s = f"{rel:.2e}" if rel >= 0 else "-"
        print(f"framework=torch mode={mode} n={n} ms={sec * 1e3:.4f} tflops={2 * n**3 / sec / 1e12:.2f} "
              f"rel_err={rel_s}", flush=True)
if cuda:
    torch.backends.cuda.matmul.allow_tf32 = False
