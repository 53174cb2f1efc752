--- bench/gpt_gemm_bound.lua: how many tokens/s the GEMMs alone of a GPT training step allow.
-- Times, through dl.matmul (OpenBLAS's sgemm), exactly the matrix products of one step of a
-- nanoGPT-shaped model, forward and backward, with no other work: per linear layer (K in,
-- N out) on M = batch x block tokens, Y = X W^T, dX = dY W and dW = dY^T X (3 x 2MNK flops).
-- The layers: per block the fused q/k/v projection (C -> 3C), the attention output (C -> C),
-- the MLP (C -> 4C -> C); once the tied lm_head (C -> vocab). The attention's own products
-- run inside the fused attention kernel and are left out, so the bound is generous.
-- Prints the best of --reps step times: tokens per second per process that no
-- implementation calling these GEMMs could exceed, whatever it does around them.
--   build/ddplua bench/gpt_gemm_bound.lua [--n-layer 4] [--n-embd 128] [--block-size 64]
--     [--batch-size 12] [--vocab 65] [--threads 1] [--reps 20]
local dl = require "ddplua"
local os_ = require "ddplua.os"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "gpt_gemm_bound.lua" }
for _, a in ipairs { "n-layer", "n-embd", "block-size", "batch-size", "vocab", "threads", "reps" } do
  parser:add_argument("--" .. a, { type = "number" })
end
local args = parser:parse_args(arg)
local L, C = args.n_layer or 4, args.n_embd or 128
local M = (args.block_size or 64) * (args.batch_size or 12)
local V, reps = args.vocab or 65, args.reps or 20
dl.set_num_threads(args.threads or 1)
dl.manual_seed(0)

local layers = {} -- {K, N} per linear layer of one step
for _ = 1, L do
  for _, kn in ipairs { { C, 3 * C }, { C, C }, { C, 4 * C }, { 4 * C, C } } do layers[#layers + 1] = kn end
end
layers[#layers + 1] = { C, V }
local ops, flops = {}, 0
for i, kn in ipairs(layers) do
  local K, N = kn[1], kn[2]
  ops[i] = { x = dl.randn { M, K }, w = dl.randn { N, K }, dy = dl.randn { M, N } }
  flops = flops + 3 * 2 * M * N * K
end

local function step()
  for _, o in ipairs(ops) do
    local _ = dl.matmul(o.x, o.w:t())      -- Y = X W^T
    local _ = dl.matmul(o.dy, o.w)         -- dX = dY W
    local _ = dl.matmul(o.dy:t(), o.x)     -- dW = dY^T X
  end
end
step()
local best = math.huge
for _ = 1, reps do
  local t0 = os_.monotonic()
  step()
  best = math.min(best, os_.monotonic() - t0)
end
print(("gemm_bound layers=%d embd=%d tokens=%d threads=%d gflop_per_step=%.3f best_ms=%.2f gflops=%.1f tokens_per_s=%.0f"):format(
  L, C, M, args.threads or 1, flops / 1e9, best * 1e3, flops / best / 1e9, M / best))
