--- ddplua.ops.norm: batch norm, layer norm, dropout and embedding (C: runtime/ops/norm.c,
-- contracts in runtime/include/ddplua/ops_norm.h).
-- Returns { methods = {name = fn(self, ...)}, functions = {name = fn(...)}, meta = {} }:
-- ddplua.tensor installs the methods, ddplua installs the functions.
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = { methods = {}, functions = {}, meta = {} }
local methods, functions = M.methods, M.functions

local box2 = ffi.new("ddp_tensor*[1]")

--- dl.batch_norm(x, running_mean, running_var, opts) -> y, as PyTorch's F.batch_norm.
-- x: (N, C), (N, C, L) or (N, C, H, W), floating. running_mean, running_var: (C) or nil.
-- opts.weight, opts.bias: (C) or nil (x's dtype); opts.training (default false): normalise
-- with the batch mean and biased variance and update the running stats in place with
-- opts.momentum (default 0.1) using the unbiased variance; otherwise use the running stats
-- (then required). opts.eps (default 1e-5). Differentiable w.r.t. x, weight, bias.
-- Raises (naming batch_norm) on a channel count mismatch, eval without running stats, or
-- training with one value per channel.
function functions.batch_norm(x, running_mean, running_var, opts)
  local weight, bias, training, momentum, eps
  if opts then
    weight, bias, training, momentum, eps = opts.weight, opts.bias, opts.training, opts.momentum, opts.eps
  end
  check(C.ddp_batch_norm(box, x, running_mean, running_var, weight, bias, training and 1 or 0,
    momentum or 0.1, eps or 1e-5))
  return wrap(box[0])
end
methods.batch_norm = functions.batch_norm

--- dl.batch_norm_relu(x, running_mean, running_var, opts) -> y = relu(batch_norm(x) +
-- opts.residual): batch norm, the residual add and the ReLU fused into one pass and one
-- autograd node (the tail of a ResNet block). Arguments and running-stat updates as
-- dl.batch_norm; opts.residual: nil or a tensor of x's shape, dtype and device. Values and
-- gradients are bitwise those of dl.batch_norm, + and :relu() in a row on the CPU; other
-- devices, f16/bf16 and autocast run that composition. Differentiable w.r.t. x, weight,
-- bias and residual. Raises as dl.batch_norm (naming batch_norm_relu), and for a residual
-- whose shape, dtype or device differs from x's.
function functions.batch_norm_relu(x, running_mean, running_var, opts)
  local weight, bias, training, momentum, eps, residual
  if opts then
    weight, bias, training, momentum, eps = opts.weight, opts.bias, opts.training, opts.momentum, opts.eps
    residual = opts.residual
  end
  check(C.ddp_batch_norm_relu(box, x, residual, running_mean, running_var, weight, bias,
    training and 1 or 0, momentum or 0.1, eps or 1e-5))
  return wrap(box[0])
end
methods.batch_norm_relu = functions.batch_norm_relu

--- dl.batch_norm_stats(x, eps) -> mean (C), invstd (C): per-channel batch mean and
-- 1 / sqrt(biased var + eps) of x (N, C, *) (f64 for f64 x, else f32); no autograd.
function functions.batch_norm_stats(x, eps)
  check(C.ddp_batch_norm_stats(box, box2, x, eps or 1e-5))
  local mean, invstd = box[0], box2[0]
  return wrap(mean), wrap(invstd)
end

--- dl.batch_norm_moments(x) -> (2, C) f64: row 1 the per-channel mean, row 2 the biased
-- variance of x (N, C, *) over N and the spatial dims (zeros for an empty batch), from batch
-- norm's kernels. Differentiable in x (the local statistics of nn.SyncBatchNorm).
function functions.batch_norm_moments(x)
  check(C.ddp_batch_norm_moments(box, x))
  return wrap(box[0])
end

--- dl.batch_norm_sums(x) -> sum (C), sumsq (C): per-channel sum and sum of squares of
-- x (N, C, *) in f64 (what a synchronised batch norm all-reduces); no autograd.
function functions.batch_norm_sums(x)
  check(C.ddp_batch_norm_sums(box, box2, x))
  local s, sq = box[0], box2[0]
  return wrap(s), wrap(sq)
end

--- dl.batch_norm_elemt(x, weight, bias, mean, var, eps) -> y of x's shape: (x - mean) /
-- sqrt(var + eps) * weight + bias per channel, with given mean and biased var (C) (a
-- synchronised batch norm's global statistics; PyTorch's torch.batch_norm_elemt).
-- x (N, C, *) f32/f64 (f16/bf16 answered in f32); weight, bias (C) or nil; eps default
-- 1e-5. Differentiable in x, weight, bias, mean and var (Note [differentiable sync batch
-- norm steps] in runtime/ops/norm.c). Raises (naming batch_norm_elemt) as
-- ddp_batch_norm_elemt.
function functions.batch_norm_elemt(x, weight, bias, mean, var, eps)
  check(C.ddp_batch_norm_elemt(box, x, weight, bias, mean, var, eps or 1e-5))
  return wrap(box[0])
end

--- dl.batch_norm_backward_reduce(grad_out, x, mean) -> sum_dy (C), sum_dy_xmu (C), f64:
-- sum(grad_out) and sum(grad_out * (x - mean)) per channel of x (N, C, *) (PyTorch's
-- torch.batch_norm_backward_reduce, less the weight and bias gradients). No autograd.
function functions.batch_norm_backward_reduce(grad_out, x, mean)
  check(C.ddp_batch_norm_backward_reduce(box, box2, grad_out, x, mean))
  local s, sxm = box[0], box2[0]
  return wrap(s), wrap(sxm)
end

--- dl.batch_norm_backward_elemt(grad_out, x, mean, invstd, weight, mean_dy, mean_dy_xmu)
-- -> grad_in of x's shape: weight * invstd * (grad_out - mean_dy - (x - mean) * invstd^2 *
-- mean_dy_xmu), the batch norm input gradient with global statistics (mean_dy, mean_dy_xmu:
-- the all-reduced sums of batch_norm_backward_reduce divided by the global count; PyTorch's
-- torch.batch_norm_backward_elemt takes the sums and the counts). weight (C) or nil. No
-- autograd.
function functions.batch_norm_backward_elemt(grad_out, x, mean, invstd, weight, mean_dy, mean_dy_xmu)
  check(C.ddp_batch_norm_backward_elemt(box, grad_out, x, mean, invstd, weight, mean_dy, mean_dy_xmu))
  return wrap(box[0])
end

--- dl.layer_norm(x, normalized_shape, opts) -> y, as PyTorch's F.layer_norm.
-- x: (..., *normalized_shape) floating; normalized_shape: a table of the trailing sizes
-- ({D} or {H, W}; a number is taken as {D}). opts.weight, opts.bias: normalized_shape or
-- nil; opts.eps (default 1e-5). Differentiable w.r.t. x, weight, bias. Raises (naming
-- layer_norm) when normalized_shape does not match the trailing dims of x.
function functions.layer_norm(x, normalized_shape, opts)
  if type(normalized_shape) == "number" then normalized_shape = { normalized_shape } end
  local buf, n = lib.shape(normalized_shape)
  local weight, bias, eps
  if opts then weight, bias, eps = opts.weight, opts.bias, opts.eps end
  check(C.ddp_layer_norm(box, x, n, buf, weight, bias, eps or 1e-5))
  return wrap(box[0])
end
methods.layer_norm = functions.layer_norm

--- dl.dropout(x, p, opts) -> y, as PyTorch's F.dropout (inverted dropout).
-- x: any shape, floating; p: drop probability in [0, 1] (default 0.5).
-- opts.training (default true): zero each element with probability p and scale the kept
-- ones by 1 / (1 - p); otherwise (or p == 0) return x. opts.generator: a dl.Generator
-- drawing the mask (default: the default generator). Differentiable (the gradient is
-- mask / (1 - p)). Raises (naming dropout) for p outside [0, 1].
function functions.dropout(x, p, opts)
  local training, gen = true, nil
  if opts then
    if opts.training == false then training = false end
    gen = opts.generator and opts.generator.handle
  end
  check(C.ddp_dropout(box, x, p or 0.5, training and 1 or 0, gen))
  return wrap(box[0])
end
methods.dropout = functions.dropout

--- dl.embedding(indices, weight, opts) -> (*indices.shape, D), as PyTorch's F.embedding.
-- indices: any shape, i64 or i32, values 0-based in [0, V); weight: (V, D).
-- opts.padding_idx: a row (0-based, negative counts from the end) that gets no gradient.
-- Differentiable w.r.t. weight (rows accumulate over repeated indices). Raises (naming
-- embedding) for an index out of range, giving the value and V.
function functions.embedding(indices, weight, opts)
  local padding_idx = -1
  if opts and opts.padding_idx then
    padding_idx = opts.padding_idx
    if padding_idx < 0 and C.ddp_tensor_dim(weight) == 2 then
      padding_idx = padding_idx + C.ddp_tensor_shape(weight)[0]
      if padding_idx < 0 then
        lib.raise(("embedding: padding_idx %d is out of range for %d rows"):format(
          opts.padding_idx, tonumber(C.ddp_tensor_shape(weight)[0])))
      end
    end
  end
  check(C.ddp_embedding(box, weight, indices, padding_idx))
  return wrap(box[0])
end
--- indices:embedding(weight, opts): the method form of dl.embedding.
methods.embedding = functions.embedding

return M
