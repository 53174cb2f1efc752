--- ddplua.nn.functional (`local F = require "ddplua.nn.functional"`, also nn.functional):
-- the stateless forms of the layers, as PyTorch's torch.nn.functional, in its argument
-- order; what PyTorch takes as keyword arguments goes in a trailing options table (the
-- ddplua convention). Thin wrappers over the dl functions: shapes, dtypes, gradients and
-- errors are theirs (runtime/include/ddplua/ops_*.h, lua/ddplua/ops/*.lua).
-- Dimensions count from 1 (Lua); class labels and embedding ids count from 0 (data).
local dl = require "ddplua.functions"

local F = {}

-- ---- activations ---------------------------------------------------------------------

--- F.relu(x): max(x, 0).
function F.relu(x) return dl.relu(x) end

--- F.leaky_relu(x[, negative_slope]): x for x > 0, else negative_slope * x (0.01).
function F.leaky_relu(x, negative_slope) return dl.leaky_relu(x, negative_slope or 0.01) end

--- F.gelu(x[, opts]): GELU; opts.approximate "none" (default) or "tanh".
function F.gelu(x, opts) return dl.gelu(x, opts) end

--- F.tanh(x), F.sigmoid(x), F.silu(x) (x * sigmoid(x)).
function F.tanh(x) return dl.tanh(x) end
function F.sigmoid(x) return dl.sigmoid(x) end
function F.silu(x) return dl.silu(x) end

--- F.softmax(x, dim) / F.log_softmax(x, dim): along dimension dim (1-based, -1 the last).
function F.softmax(x, dim) return x:softmax(dim) end
function F.log_softmax(x, dim) return x:log_softmax(dim) end

-- ---- linear, convolution, pooling ----------------------------------------------------

--- F.linear(x, weight[, bias]): x (..., in) · weightᵀ (out, in) + bias (out) -> (..., out).
function F.linear(x, weight, bias) return dl.linear(x, weight, bias) end

--- F.conv2d(x, weight[, bias[, opts]]): x (N, C, H, W), weight (O, C / groups, kH, kW);
-- opts.stride (1), opts.padding (0), opts.dilation (1) as numbers or {h, w}; opts.groups (1).
function F.conv2d(x, weight, bias, opts) return dl.conv2d(x, weight, bias, opts) end

--- F.max_pool2d(x, kernel_size[, opts]): opts.stride (= kernel_size), padding, dilation,
-- ceil_mode, return_indices.
function F.max_pool2d(x, kernel_size, opts) return dl.max_pool2d(x, kernel_size, opts) end

--- F.avg_pool2d(x, kernel_size[, opts]): opts.stride (= kernel_size), padding, ceil_mode,
-- count_include_pad (true).
function F.avg_pool2d(x, kernel_size, opts) return dl.avg_pool2d(x, kernel_size, opts) end

--- F.adaptive_avg_pool2d(x, output_size): output_size a number or {oh, ow}.
function F.adaptive_avg_pool2d(x, output_size) return dl.adaptive_avg_pool2d(x, output_size) end

-- ---- attention -------------------------------------------------------------------------

--- F.scaled_dot_product_attention(query, key, value[, opts]): PyTorch 2.x's, one fused op;
-- opts.attn_mask, opts.dropout_p (0), opts.is_causal (false), opts.scale (1 / sqrt(E)),
-- opts.generator (see dl.scaled_dot_product_attention).
function F.scaled_dot_product_attention(query, key, value, opts)
  return dl.scaled_dot_product_attention(query, key, value, opts)
end

-- ---- normalisation, dropout, embedding -----------------------------------------------

--- F.batch_norm(x, running_mean, running_var[, opts]): opts.weight, opts.bias,
-- opts.training (false), opts.momentum (0.1), opts.eps (1e-5); x (N, C, *).
function F.batch_norm(x, running_mean, running_var, opts)
  return dl.batch_norm(x, running_mean, running_var, opts)
end

--- F.batch_norm_relu(x, running_mean, running_var[, opts]): relu(F.batch_norm(x, ...) +
-- opts.residual) fused (dl.batch_norm_relu); F.batch_norm's options plus opts.residual
-- (nil, or x's shape).
function F.batch_norm_relu(x, running_mean, running_var, opts)
  return dl.batch_norm_relu(x, running_mean, running_var, opts)
end

--- F.layer_norm(x, normalized_shape[, opts]): opts.weight, opts.bias, opts.eps (1e-5).
function F.layer_norm(x, normalized_shape, opts) return dl.layer_norm(x, normalized_shape, opts) end

--- F.dropout(x[, p[, opts]]): p = 0.5; opts.training (true, as PyTorch's F.dropout),
-- opts.generator.
function F.dropout(x, p, opts) return dl.dropout(x, p or 0.5, opts) end

--- F.embedding(ids, weight[, opts]): ids any shape, i64 values in [0, V); weight (V, D);
-- opts.padding_idx.
function F.embedding(ids, weight, opts) return dl.embedding(ids, weight, opts) end

--- F.flatten(x[, start_dim[, end_dim]]): dims start_dim .. end_dim merged (1, -1).
function F.flatten(x, start_dim, end_dim) return x:flatten(start_dim or 1, end_dim or -1) end

-- ---- losses --------------------------------------------------------------------------

--- F.cross_entropy(input, target[, opts]): logits (N, C) or (N, C, d...), target class ids
-- (i64, 0-based) or probabilities; opts.weight, reduction ("mean"), ignore_index (-100),
-- label_smoothing (0). A DTensor input (tensor parallelism) takes the sharding rule of
-- ddplua.distributed.tensor.ops.cross_entropy: class-sharded logits give the
-- vocabulary-parallel loss (loss_parallel), a Replicate 0-d DTensor.
function F.cross_entropy(input, target, opts)
  if type(input) == "table" then return require("ddplua.distributed.tensor.ops").cross_entropy(input, target, opts) end
  return dl.cross_entropy(input, target, opts)
end

--- F.nll_loss(input, target[, opts]): log-probabilities; opts as cross_entropy's but
-- label_smoothing.
function F.nll_loss(input, target, opts) return dl.nll_loss(input, target, opts) end

--- F.mse_loss(input, target[, opts]): opts.reduction ("mean", "sum", "none").
function F.mse_loss(input, target, opts) return dl.mse_loss(input, target, opts) end

return F
