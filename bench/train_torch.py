"""bench/train_torch.py: PyTorch's side of bench/train.lua (same models, data, batch 64,
SGD lr 0.05 momentum 0.9). Run with Debian's /usr/bin/python3 (python3-torch, CPU):
    OPENBLAS_NUM_THREADS=N OMP_NUM_THREADS=N /usr/bin/python3 bench/train_torch.py --model cnn --threads N
or under torchrun for DDP (gloo, DistributedSampler, batch 64 per rank; samples/s of all
ranks, printed by rank 0):
    /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --redirects 2 --tee 2 bench/train_torch.py ...
Prints "model=<m> threads=<n> amp=<a> loader=<l> samples_per_s=<x> peak_rss_mb=<y>"; --amp bf16
runs the forward under torch.autocast("cpu", dtype=torch.bfloat16). PyTorch at its best per
TOOLCHAIN.md: thread variables set before import, OMP_WAIT_POLICY=PASSIVE set by the caller.
--loader dataloader (default) takes the batches from torch.utils.data.DataLoader, as a
typical script does; --loader index gathers each batch by indexing the whole tensors with a
shuffled index (x_all[idx]), the cheapest way PyTorch has: the "PyTorch at its best" rows of
bench/reference_table.sh. Under DDP each rank indexes its own shard of one permutation per
epoch (every world-th index from its rank on, as DistributedSampler splits)."""
import argparse, gzip, resource, time

import numpy as np
import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--model", default="cnn")
p.add_argument("--threads", type=int, default=1)
p.add_argument("--steps", type=int, default=200)
p.add_argument("--warmup", type=int, default=20)
p.add_argument("--amp", default=None, help="bf16: the forward under torch.autocast('cpu', bfloat16)")
p.add_argument("--loader", default="dataloader", choices=["dataloader", "index"],
               help="dataloader: torch.utils.data.DataLoader; index: batches gathered by indexing")
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)

root = "/usr/share/datasets/fashion-mnist/"
with gzip.open(root + "train-images-idx3-ubyte.gz") as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
with gzip.open(root + "train-labels-idx1-ubyte.gz") as f:
    labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
x_all = (torch.from_numpy(images.copy()).float() / 255 - 0.2860) / 0.3530
y_all = torch.from_numpy(labels)

if a.model == "cnn":
    model = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
else:
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                          nn.ReLU(), nn.Linear(128, 10))
import os
world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
dataset = torch.utils.data.TensorDataset(x_all, y_all)
if world > 1:
    import torch.distributed as dist
    dist.init_process_group("gloo")
    net = nn.parallel.DistributedDataParallel(model)
    loader = torch.utils.data.DataLoader(dataset, batch_size=64,
                                         sampler=torch.utils.data.distributed.DistributedSampler(dataset))
else:
    net = model
    loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True)


def indexed_batches():
    """Batches of 64 gathered by indexing x_all / y_all, epoch after epoch: one permutation
    per epoch (the same on every rank: seeded by the epoch), this rank's every world-th
    index, full batches only."""
    epoch = 0
    while True:
        g = torch.Generator().manual_seed(epoch)
        idx = torch.randperm(len(y_all), generator=g)[rank::world]
        for i in range(0, len(idx) - 63, 64):
            j = idx[i:i + 64]
            yield x_all[j], y_all[j]
        epoch += 1


if a.loader == "index":
    loader = indexed_batches()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
done, t0 = 0, None
for x, y in loader:
    if done == a.warmup:
        t0 = time.perf_counter()
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp == "bf16"):
        loss = nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    done += 1
    if done == a.warmup + a.steps:
        break
seconds = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
if world == 1 or dist.get_rank() == 0:
    print(f"model={a.model} threads={a.threads} amp={a.amp or 'f32'} loader={a.loader} samples_per_s={world * a.steps * 64 / seconds:.1f} peak_rss_mb={rss:.1f}", flush=True)
if world > 1:
    dist.destroy_process_group()
