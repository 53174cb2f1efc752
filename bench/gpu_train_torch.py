"""bench/gpu_train_torch.py: PyTorch eager's side of bench/gpu_train.lua: the same models
(the Fashion-MNIST CNN of models/cnn.lua, ResNet-20 of models/resnet.lua), batch sizes,
optimizers, random device-resident data and timing (warm-up steps untimed; timed steps
bracketed by torch.cuda.synchronize and read with a host clock).

    python3 bench/gpu_train_torch.py --model cnn|resnet20 [--batch N] [--steps 50]
        [--warmup 10] [--device cuda:0] [--tf32] [--max-seconds 60] [--threads N]
    python3 bench/gpu_train_torch.py --dry      # 1 tiny step on the CPU

PyTorch at its best for this comparison: cudnn.benchmark on (the warm-up covers its
autotuning); TF32 off for matmul AND convolution unless --tf32 (PyTorch's default allows it
for convolutions; ddplua's allows it nowhere), so both sides do the same arithmetic.
--threads N calls torch.set_num_threads(N) (for --device cpu; set OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS to N before starting Python too, as bench/reference_table.sh does).
Prints one line in gpu_train.lua's format, framework=torch.
"""
import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--model", default="cnn", choices=["cnn", "resnet20"])
p.add_argument("--batch", type=int, default=None)
p.add_argument("--steps", type=int, default=50)
p.add_argument("--warmup", type=int, default=10)
p.add_argument("--device", default="cuda:0")
p.add_argument("--tf32", action="store_true")
p.add_argument("--max-seconds", type=float, default=60.0)
p.add_argument("--dry", action="store_true")
p.add_argument("--threads", type=int, default=None)
a = p.parse_args()


def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:  # option B, as models/resnet.lua
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, depth=20, num_classes=10, in_channels=3):
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        layers, cin = [], 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = []
            for i in range(n):
                blocks.append(BasicBlock(cin, planes, stride if i == 0 else 1))
                cin = planes
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = layers
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        return self.fc(torch.flatten(self.pool(out), 1))


MODELS = {
    # model, default batch, input (C, H, W), SGD options (configs/*.lua)
    "cnn": (cnn, 256, (1, 28, 28), dict(lr=0.05, momentum=0.9)),
    "resnet20": (ResNet, 128, (3, 32, 32), dict(lr=0.1, momentum=0.9, weight_decay=1e-4)),
}
if a.threads is not None:
    if a.threads < 1:
        sys.exit(f"gpu_train_torch: --threads must be a positive integer, got {a.threads}")
    torch.set_num_threads(a.threads)
build, batch, shape, sgd = MODELS[a.model]
batch = a.batch or batch
dev = a.device
if a.dry:
    dev, batch, a.steps, a.warmup = "cpu", 4, 1, 1
if dev.startswith("cuda"):
    if not torch.cuda.is_available():
        sys.exit("gpu_train_torch: torch.cuda.is_available() is False")
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32


def sync():
    if dev.startswith("cuda"):
        torch.cuda.synchronize(dev)


torch.manual_seed(0)
model = build().to(dev).train()
opt = torch.optim.SGD(model.parameters(), **sgd)
g = torch.Generator().manual_seed(1)
xs = [torch.randn((batch,) + shape, generator=g).to(dev) for _ in range(4)]
ys = [torch.randint(0, 10, (batch,), generator=g).to(dev) for _ in range(4)]
if dev.startswith("cuda"):
    torch.cuda.reset_peak_memory_stats(dev)

loss = None


def step(i):
    global loss
    k = i % 4
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(xs[k]), ys[k])
    loss.backward()
    opt.step()


for i in range(a.warmup):
    step(i)
sync()
t0 = time.perf_counter()
done = 0
for i in range(a.steps):
    step(i)
    done = i + 1
    if done >= 3 and time.perf_counter() - t0 > a.max_seconds:
        break
sync()
seconds = time.perf_counter() - t0
peak = torch.cuda.max_memory_allocated(dev) / 2**20 if dev.startswith("cuda") else 0.0
print(f"framework=torch model={a.model} batch={batch} device={dev} tf32={int(a.tf32)} steps={done} "
      f"samples_per_s={done * batch / seconds:.1f} step_ms={seconds / done * 1e3:.3f} "
      f"peak_mem_mb={peak:.1f} loss={loss.item():.4f}", flush=True)
