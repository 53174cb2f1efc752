"""bench/dataloader_workers_torch.py: PyTorch's side of bench/dataloader_workers.lua.

samples/s of torch.utils.data.DataLoader(num_workers=N) over a Dataset whose __getitem__
does the same augmentation of a Fashion-MNIST image as the Lua dataset there (random shift
by -2..2 with zeros coming in, P passes of the 3x3 blur [1 2 1; 2 4 2; 1 2 1] / 16 with
zero padding, contrast in [0.8, 1.2) and brightness in [-0.1, 0.1) clamped to [0, 1],
normalised with mean 0.2860 and std 0.3530), written as a PyTorch user writes it at best:
tensor ops on the sample (F.pad and slicing for the shift, F.conv2d for the blur), not a
per-pixel Python loop. Data read from Debian's dataset-fashion-mnist with numpy (gzip).

    OMP_NUM_THREADS=1 /usr/bin/python3 bench/dataloader_workers_torch.py --workers N
        [--samples 10000] [--batch 64] [--passes 16] [--runs 3] [--persistent 0|1]

Prints "framework=pytorch workers=N samples_per_s=X main_cpu_ms_per_1k=Y
total_cpu_ms_per_1k=Z": medians of the timed runs after one untimed run (each run is one
epoch of a new DataLoader, shuffle=True, its workers' start included: non-persistent
workers, fork start method, Linux's default) of the samples/s, of the CPU time of the
training process itself per 1000 samples, and of that of the process and its workers
(RUSAGE_CHILDREN: the workers are joined at the epoch's end).
"""
import argparse
import gzip
import random
import resource
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

ROOT = "/usr/share/datasets/fashion-mnist"


def read_idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


class Augmented(torch.utils.data.Dataset):
    def __init__(self, n, passes):
        self.x = torch.from_numpy(read_idx(f"{ROOT}/train-images-idx3-ubyte.gz", 16).copy()).view(-1, 1, 28, 28)[:n]
        self.y = torch.from_numpy(read_idx(f"{ROOT}/train-labels-idx1-ubyte.gz", 8).astype(np.int64))[:n]
        self.passes = passes
        self.kernel = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]).div_(16).view(1, 1, 3, 3)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        dx, dy = random.randint(-2, 2), random.randint(-2, 2)
        img = F.pad(self.x[i].float(), (2, 2, 2, 2))[:, 2 + dy:30 + dy, 2 + dx:30 + dx].unsqueeze(0)
        for _ in range(self.passes):
            img = F.conv2d(img, self.kernel, padding=1)
        contrast = 0.8 + 0.4 * random.random()
        brightness = -0.1 + 0.2 * random.random()
        img = (img[0] / 255 * contrast + brightness).clamp_(0, 1).sub_(0.2860).div_(0.3530)
        return img, self.y[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--samples", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--passes", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--persistent", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    ds = Augmented(a.samples, a.passes)

    def cpu_seconds():
        u = resource.getrusage(resource.RUSAGE_SELF)
        return u.ru_utime + u.ru_stime

    def children_cpu_seconds():
        u = resource.getrusage(resource.RUSAGE_CHILDREN)
        return u.ru_utime + u.ru_stime

    persistent = []

    def run():
        if persistent:
            loader = persistent[0]
        else:
            loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers,
                                                 persistent_workers=a.persistent == 1)
            if a.persistent == 1:
                persistent.append(loader)
        t0, c0, k0 = time.perf_counter(), cpu_seconds(), children_cpu_seconds()
        n = 0
        with torch.no_grad():
            for x, _ in loader:
                n += x.shape[0]
        assert n == a.samples
        del loader  # a non-persistent iterator's workers are joined by now
        main = cpu_seconds() - c0
        return (n / (time.perf_counter() - t0), main * 1e6 / n,
                (main + children_cpu_seconds() - k0) * 1e6 / n)

    run()
    runs = [run() for _ in range(a.runs)]
    rate = statistics.median(r for r, _, _ in runs)
    cpu = statistics.median(c for _, c, _ in runs)
    total = statistics.median(t for _, _, t in runs)
    print(f"framework=pytorch workers={a.workers} samples_per_s={rate:.0f} main_cpu_ms_per_1k={cpu:.1f} "
          f"total_cpu_ms_per_1k={total:.1f}")


if __name__ == "__main__":
    main()
