"""bench/gpt_torch.py: PyTorch's side of bench/gpt.lua: nanoGPT's model.py shape (GPT-2 blocks,
no bias, exact GELU, weight tying, nanoGPT's init: N(0, 0.02), c_proj N(0, 0.02/sqrt(2 n_layer))),
the same data (random windows of data/shakespeare_char/train.bin, uint16, as nanoGPT's
get_batch; uniform random tokens over 65 characters when the file is absent, or over
--vocab-size tokens when that is given: GPT-2's 50257 for llm.c's shape), batch per
process, loss, clip_grad_norm_ 1.0 and AdamW (decay 0.1 on the 2-d parameters, betas
0.9/0.99, lr 1e-3). PyTorch 1.13 has no F.scaled_dot_product_attention: the attention is
nanoGPT's explicit path (q k^T, causal mask, softmax, @ v), what nanoGPT runs there.
Run with Debian's /usr/bin/python3 (python3-torch), PyTorch at its best per TOOLCHAIN.md
(thread variables set before import, OMP_WAIT_POLICY=PASSIVE):
    OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/gpt_torch.py --threads 2 ...
or under torchrun for DDP (gloo; tokens/s of all ranks, printed by rank 0):
    /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 bench/gpt_torch.py --threads 1 ...
Prints "gpt ... tokens_per_s=<x> step_ms=<y> cpu_tokens_per_s=<z>" as bench/gpt.lua (z: tokens
per CPU second of rank 0's process, time.process_time, times the processes); --amp bf16 runs the forward
under torch.autocast("cpu", dtype=torch.bfloat16)."""
import argparse, math, os, time

p = argparse.ArgumentParser()
for name, default in [("n-layer", 4), ("n-head", 4), ("n-embd", 128), ("block-size", 64), ("batch-size", 12),
                      ("steps", 100), ("warmup", 20), ("threads", 1), ("vocab-size", 0)]:
    p.add_argument("--" + name, type=int, default=default)
p.add_argument("--amp", default=None)
p.add_argument("--train-iters", type=int, default=0,
               help="instead of timing: nanoGPT's whole recipe for N iterations (warm-up 100, cosine 1e-3 -> 1e-4 "
               "over N), printing train/val loss every 250 over the fixed windows of train.lua (240 per file)")
a = p.parse_args()

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

torch.set_num_threads(a.threads)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.n_head = n_head
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = [t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, elementwise_affine=True)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd, elementwise_affine=True)
        self.mlp = nn.Sequential()
        self.mlp.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
        self.mlp.gelu = nn.GELU()
        self.mlp.c_proj = nn.Linear(4 * n_embd, n_embd, bias=False)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)
        for pn, prm in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(prm, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))
        # nanoGPT's LayerNorm without bias (bias=False): drop the biases
        for m in self.modules():
            if isinstance(m, nn.LayerNorm):
                m.bias = None

    def forward(self, idx, targets):
        T = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(0, T, dtype=torch.long))
        for b in self.transformer.h:
            x = b(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


world = int(os.environ.get("WORLD_SIZE", "1"))
rank = int(os.environ.get("RANK", "0"))
if world > 1:
    import torch.distributed as dist
    dist.init_process_group("gloo")

path = "data/shakespeare_char/train.bin"
V = a.vocab_size or 65
data = None
if not a.vocab_size and os.path.exists(path):
    import json
    with open("data/shakespeare_char/meta.json") as f:
        meta = json.load(f)
    V = len(meta["chars"]) if "chars" in meta else meta.get("vocab_size", 65)
    data = np.memmap(path, dtype=np.uint16, mode="r")
torch.manual_seed(1337 + rank)
B, T = a.batch_size, a.block_size


def get_batch():
    if data is None:
        t = torch.randint(V, (B, T + 1))
        return t[:, :T].contiguous(), t[:, 1:].contiguous()
    ix = torch.randint(len(data) - T, (B,))
    x = torch.stack([torch.from_numpy(data[i:i + T].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + T].astype(np.int64)) for i in ix])
    return x, y


torch.manual_seed(1337)
model = GPT(V, T, a.n_layer, a.n_head, a.n_embd)
net = model
if world > 1:
    net = torch.nn.parallel.DistributedDataParallel(model)
decay = [p_ for p_ in model.parameters() if p_.dim() >= 2]
no_decay = [p_ for p_ in model.parameters() if p_.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=1e-3, betas=(0.9, 0.99))
torch.manual_seed(1337 + rank)


def eval_windows(n, m=240):
    # ddplua.data.text.eval_starts: m of the file's non-overlapping windows, evenly spaced
    full = (n - 1) // T
    m = min(m, full)
    return [(j * full // m) * T for j in range(m)]


@torch.no_grad()
def estimate(arr):
    model.eval()
    starts = eval_windows(len(arr))
    total = 0.0
    for i in range(0, len(starts), B):
        s = starts[i:i + B]
        x = torch.stack([torch.from_numpy(arr[j:j + T].astype(np.int64)) for j in s])
        y = torch.stack([torch.from_numpy(arr[j + 1:j + 1 + T].astype(np.int64)) for j in s])
        total += model(x, y)[1].item() * len(s)
    model.train()
    return total / len(starts)


if a.train_iters:
    val = np.memmap("data/shakespeare_char/val.bin", dtype=np.uint16, mode="r")

    def get_lr(it, lr=1e-3, warmup=100, decay=a.train_iters, min_lr=1e-4):
        if it < warmup:
            return lr * (it + 1) / (warmup + 1)
        if it > decay:
            return min_lr
        r = (it - warmup) / (decay - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (lr - min_lr)

    t0 = time.perf_counter()
    for it in range(a.train_iters + 1):
        for g in opt.param_groups:
            g["lr"] = get_lr(it)
        if it % 250 == 0 or it == a.train_iters:
            print("step %d: train loss %.4f, val loss %.4f (%.1f s)" % (it, estimate(data), estimate(val),
                                                                      time.perf_counter() - t0), flush=True)
        if it == a.train_iters:
            break
        x, y = get_batch()
        _, loss = net(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    raise SystemExit(0)

t0 = None
for step in range(a.warmup + a.steps):
    if step == a.warmup:
        t0, cpu0 = time.perf_counter(), time.process_time()
    x, y = get_batch()
    if a.amp == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = net(x, y)
    else:
        _, loss = net(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
if rank == 0:
    print("gpt layers=%d heads=%d embd=%d block=%d batch=%d procs=%d threads=%d amp=%s tokens_per_s=%.1f step_ms=%.2f "
          "cpu_tokens_per_s=%.1f" % (
              a.n_layer, a.n_head, a.n_embd, T, B, world, a.threads, a.amp or "f32", a.steps * B * T * world / seconds,
              seconds / a.steps * 1e3, a.steps * B * T / cpu_seconds))
if world > 1:
    dist.destroy_process_group()
