--- ddplua.ops.nn: matrix products, convolution and pooling (runtime/ops/{matmul,conv,pool}.c).
-- Every op is differentiable and available both as dl.op(x, ...) and as x:op(...).
-- Operands of one call share a dtype (f32, f64, f16, bf16; matmul and bmm also take i64,
-- i32 and u8); a mismatch raises naming both dtypes. Sizes given as "pairs" are a number
-- (used for both H and W) or a table {h, w}.
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = { methods = {}, functions = {}, meta = {} }
local F = M.functions

local idx_box = ffi.new("ddp_tensor*[1]")

-- (h, w) from a number or a {h, w} table; `default` when nil. Raises naming `what`.
local function pair(v, what, op, default)
  if v == nil then v = default end
  local tv = type(v)
  if tv == "number" and v % 1 == 0 then return v, v end
  if tv == "table" and #v == 2 and type(v[1]) == "number" and type(v[2]) == "number"
      and v[1] % 1 == 0 and v[2] % 1 == 0 then
    return v[1], v[2]
  end
  lib.raise(("%s: %s must be an integer or a {h, w} pair of integers, got %s"):format(op, what, tostring(v)))
end

--- dl.matmul(a, b) / a:matmul(b): torch.matmul. (K)·(K) -> () dot product; (N, K)·(K, M) ->
-- (N, M); a 1-d left operand is taken as (1, K) and a 1-d right one as (K, 1), the added
-- dimension dropped from the result; (..., N, K)·(..., K, M) -> (..., N, M) with the batch
-- dimensions broadcast. Raises on a dtype mismatch, inner sizes that differ (both shapes
-- named), batch dimensions that do not broadcast, 0-d operands.
function F.matmul(a, b)
  check(C.ddp_matmul(box, a, b))
  return wrap(box[0])
end

--- dl.bmm(a, b) / a:bmm(b): a (B, N, K) · b (B, K, M) -> (B, N, M), no broadcasting.
-- Raises when either is not 3-d or the batch or inner sizes differ (shapes named).
function F.bmm(a, b)
  check(C.ddp_bmm(box, a, b))
  return wrap(box[0])
end

--- dl.linear(x, weight, bias) / x:linear(weight, bias): x (..., in) · weightᵀ + bias, with
-- weight (out, in) and bias (out) or nil -> (..., out). Raises on in-feature mismatch
-- (shapes named), a bias of the wrong shape, mixed dtypes.
function F.linear(x, weight, bias)
  check(C.ddp_linear(box, x, weight, bias))
  return wrap(box[0])
end

--- dl.conv2d(x, weight, bias, opts) / x:conv2d(weight, bias, opts): 2-d cross-correlation
-- as torch.nn.functional.conv2d. x (N, C, H, W) or (C, H, W); weight (O, C / groups, kH, kW);
-- bias (O) or nil (opts may take bias's place). opts: stride (1), padding (0), dilation (1)
-- as numbers or {h, w} pairs, groups (1). Output (N, O, OH, OW) with
-- OH = floor((H + 2 padding - dilation (kH - 1) - 1) / stride) + 1.
-- Raises on channels that do not match the weight, channels not divisible by groups, a
-- dilated kernel larger than the padded input, bad options (sizes named).
function F.conv2d(x, weight, bias, opts)
  if type(bias) == "table" then bias, opts = nil, bias end
  local sh, sw, ph, pw, dh, dw, groups = 1, 1, 0, 0, 1, 1, 1
  if opts then
    sh, sw = pair(opts.stride, "stride", "conv2d", 1)
    ph, pw = pair(opts.padding, "padding", "conv2d", 0)
    dh, dw = pair(opts.dilation, "dilation", "conv2d", 1)
    groups = opts.groups or 1
  end
  check(C.ddp_conv2d(box, x, weight, bias, sh, sw, ph, pw, dh, dw, groups))
  return wrap(box[0])
end

--- dl.max_pool2d(x, kernel, opts) / x:max_pool2d(kernel, opts): the maximum over each window
-- as torch.nn.functional.max_pool2d. x (N, C, H, W) or (C, H, W); kernel a number or {kh, kw}.
-- opts: stride (= kernel), padding (0, at most half the kernel; padding counts as -inf),
-- dilation (1), ceil_mode (false), return_indices (false). Returns out, and with
-- return_indices also the i64 indices of the maxima flattened over (H, W), counting from 0
-- as PyTorch's. Raises when the output would be empty or an option is out of range.
function F.max_pool2d(x, kernel, opts)
  local kh, kw = pair(kernel, "kernel", "max_pool2d")
  local sh, sw, ph, pw, dh, dw, ceil, want = kh, kw, 0, 0, 1, 1, 0, false
  if opts then
    sh, sw = pair(opts.stride, "stride", "max_pool2d", kernel)
    ph, pw = pair(opts.padding, "padding", "max_pool2d", 0)
    dh, dw = pair(opts.dilation, "dilation", "max_pool2d", 1)
    ceil = opts.ceil_mode and 1 or 0
    want = opts.return_indices
  end
  check(C.ddp_max_pool2d(box, want and idx_box or nil, x, kh, kw, sh, sw, ph, pw, dh, dw, ceil))
  if want then
    local out, idx = box[0], idx_box[0]
    return wrap(out), wrap(idx)
  end
  return wrap(box[0])
end

--- dl.relu_max_pool2d(x, kernel, opts) / x:relu_max_pool2d(kernel, opts): dl.max_pool2d of
-- dl.relu(x) in one pass, with the same values and gradients bit for bit and no relu output
-- stored (nn.Sequential uses it for a ReLU followed by a MaxPool2d). opts as max_pool2d's
-- but for return_indices, which it does not take.
function F.relu_max_pool2d(x, kernel, opts)
  local kh, kw = pair(kernel, "kernel", "relu_max_pool2d")
  local sh, sw, ph, pw, dh, dw, ceil = kh, kw, 0, 0, 1, 1, 0
  if opts then
    if opts.return_indices then lib.raise("relu_max_pool2d: return_indices is not supported") end
    sh, sw = pair(opts.stride, "stride", "relu_max_pool2d", kernel)
    ph, pw = pair(opts.padding, "padding", "relu_max_pool2d", 0)
    dh, dw = pair(opts.dilation, "dilation", "relu_max_pool2d", 1)
    ceil = opts.ceil_mode and 1 or 0
  end
  check(C.ddp_relu_max_pool2d(box, x, kh, kw, sh, sw, ph, pw, dh, dw, ceil))
  return wrap(box[0])
end

--- dl.avg_pool2d(x, kernel, opts) / x:avg_pool2d(kernel, opts): the mean over each window as
-- torch.nn.functional.avg_pool2d. opts: stride (= kernel), padding (0), ceil_mode (false),
-- count_include_pad (true: padded cells count in the divisor). Raises as max_pool2d.
function F.avg_pool2d(x, kernel, opts)
  local kh, kw = pair(kernel, "kernel", "avg_pool2d")
  local sh, sw, ph, pw, ceil, include = kh, kw, 0, 0, 0, 1
  if opts then
    sh, sw = pair(opts.stride, "stride", "avg_pool2d", kernel)
    ph, pw = pair(opts.padding, "padding", "avg_pool2d", 0)
    ceil = opts.ceil_mode and 1 or 0
    include = opts.count_include_pad == false and 0 or 1
  end
  check(C.ddp_avg_pool2d(box, x, kh, kw, sh, sw, ph, pw, ceil, include))
  return wrap(box[0])
end

--- dl.adaptive_avg_pool2d(x, size) / x:adaptive_avg_pool2d(size): x (N, C, H, W) or
-- (C, H, W) -> (..., OH, OW) for size = {OH, OW} or a number; output cell i averages rows
-- floor(i H / OH) .. ceil((i + 1) H / OH) - 1 (and the same for columns), as PyTorch.
function F.adaptive_avg_pool2d(x, size)
  local oh, ow = pair(size, "output size", "adaptive_avg_pool2d")
  check(C.ddp_adaptive_avg_pool2d(box, x, oh, ow))
  return wrap(box[0])
end

--- dl.scaled_dot_product_attention(q, k, v[, opts]) -> (..., L, Ev), PyTorch 2.x's
-- F.scaled_dot_product_attention as one fused op (runtime/ops/attention.c; contract in
-- runtime/include/ddplua/ops_attention.h): softmax(q kᵀ * scale + mask) v, tiled with an
-- online softmax so the (L, S) scores are never held whole (memory linear in L and S).
-- q (..., L, E), k (..., S, E), v (..., S, Ev), one floating dtype and the same batch dims.
-- opts.attn_mask: bool (true = takes part) or q's dtype (added), broadcastable to
-- (..., L, S); opts.dropout_p (0) on the attention weights, drawn from opts.generator (a
-- dl.Generator; default generator); opts.is_causal (false): key j > query i takes no part
-- (not with attn_mask); opts.scale (default 1 / sqrt(E)). Differentiable w.r.t. q, k, v
-- and a floating mask. Raises naming scaled_dot_product_attention on shape, dtype or
-- device mismatches.
function F.scaled_dot_product_attention(q, k, v, opts)
  local mask, p, causal, scale, gen = nil, 0, false, 0 / 0, nil
  if opts then
    mask, p, causal = opts.attn_mask, opts.dropout_p or 0, opts.is_causal and true or false
    if opts.scale ~= nil then scale = opts.scale end
    gen = opts.generator and opts.generator.handle
  end
  check(C.ddp_scaled_dot_product_attention(box, q, k, v, mask, p, causal and 1 or 0, scale, gen))
  return wrap(box[0])
end

for _, name in ipairs { "matmul", "bmm", "linear", "conv2d", "max_pool2d", "relu_max_pool2d",
  "avg_pool2d", "adaptive_avg_pool2d" } do
  M.methods[name] = F[name]
end

return M
