"""bench/speed_table_torch.py: PyTorch's side of bench/speed_table.lua (one row of the seeds'
speed table, seed multigpu-demos.txt): the same models (the Fashion-MNIST CNN of
models/cnn.lua; ResNet-20 of models/resnet.lua, 1x1-convolution shortcuts), data (Fashion-
MNIST shuffled; random 32x32x3 images made before timing), global batch, SGD lr 0.05
momentum 0.9, warm-up and timed batches. Run with Debian's /usr/bin/python3 (python3-torch,
CPU), thread variables set by the caller before import (TOOLCHAIN.md):
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 \
        bench/speed_table_torch.py --model cnn|resnet20 [--batches 20] [--warmup 2] [--batch_size 256]
or under torchrun for DDP (gloo, DistributedSampler, batch_size / WORLD_SIZE per rank):
    /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 bench/speed_table_torch.py ...
Prints (rank 0) the line bench/speed_table.lua prints: "model=<m> method=<single|ddp>
processes=<n> devices=<d> batches=<N> epoch_time_s=<s> batch_time_s=<s>" (epoch: wall time
of the timed batches, loading included; batch: median step time, loading excluded).
No DataParallel row: torch.nn.DataParallel without GPUs just calls the module."""
import argparse, gzip, os, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--model", default="cnn", choices=["cnn", "resnet20"])
p.add_argument("--batches", type=int, default=20)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--batch_size", type=int, default=256)
p.add_argument("--threads", type=int, default=1)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
world = int(os.environ.get("WORLD_SIZE", "1"))
if a.batch_size % world:
    raise SystemExit(f"speed_table_torch.py: --batch_size {a.batch_size} does not divide over {world} processes")
per_rank = a.batch_size // world


class BasicBlock(nn.Module):
    def __init__(self, inp, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Identity()
        if stride != 1 or inp != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(inp, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def resnet20():
    layers, inp = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()], 16
    for planes, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            layers.append(BasicBlock(inp, planes, stride if i == 0 else 1))
            inp = planes
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


dist = None
if world > 1:
    import torch.distributed as dist
    dist.init_process_group("gloo")
if a.model == "cnn":
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    root = "/usr/share/datasets/fashion-mnist/"
    with gzip.open(root + "train-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(root + "train-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    dataset = torch.utils.data.TensorDataset((torch.from_numpy(images.copy()).float() / 255 - 0.2860) / 0.3530,
                                             torch.from_numpy(labels))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset) if dist else None
    batches = iter(torch.utils.data.DataLoader(dataset, batch_size=per_rank, sampler=sampler, shuffle=sampler is None))
else:
    model = resnet20()
    batches = iter([(torch.randn(per_rank, 3, 32, 32), torch.randint(0, 10, (per_rank,)))
                    for _ in range(a.warmup + a.batches)])
net = nn.parallel.DistributedDataParallel(model) if dist else model
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
steps, t0 = [], None
for i in range(a.warmup + a.batches):
    if i == a.warmup:
        t0 = time.perf_counter()
    x, y = next(batches)
    s = time.perf_counter()
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()
    if i >= a.warmup:
        steps.append(time.perf_counter() - s)
epoch = time.perf_counter() - t0
if not dist or dist.get_rank() == 0:
    print(f"model={a.model} method={'ddp' if dist else 'single'} processes={world} devices={world} "
          f"batches={a.batches} epoch_time_s={epoch:.4f} batch_time_s={float(np.median(steps)):.5f}", flush=True)
if dist:
    dist.destroy_process_group()
