--- ddplua.distributed.nn.functional: differentiable collectives, as PyTorch's
-- torch.distributed.nn.functional (plus the tensor forms all_gather_tensor and
-- reduce_scatter_tensor of torch.distributed._functional_collectives).
--
--   local F = require "ddplua.distributed.nn.functional"
--   local y = F.all_reduce(x)                        -- sum over the ranks; y:sum():backward()
--   local parts = F.all_gather(x)                    -- list of world tensors of x's shape
--   local full = F.all_gather_tensor(shard, 1)       -- (world * k, ...) from (k, ...)
--   local mine = F.reduce_scatter_tensor(full, 1)    -- (k, ...) from (world * k, ...)
--
-- Each function runs its collective at once (blocking) on a copy of its input and returns
-- new tensors; when grad mode is on and the input requires grad (floating dtypes), the C
-- runtime records a node on the autograd tape whose backward runs the adjoint collective
-- (runtime/comm/functional.c, ddplua/dist_functional.h): no Lua step in backward.
--
--   function                                   backward (gradient of the input)
--   all_reduce(tensor, op, group)              all_reduce (sum) of the gradient
--   broadcast(tensor, src, group)              reduce (sum) to src; zeros on other ranks
--   reduce(tensor, dst, op, group)             broadcast from dst (+ the rank's own output
--                                              gradient off dst, whose output is its input)
--   all_gather(tensor, group) -> list          each rank gets the sum over the ranks of the
--                                              gradients of its entry (a reduce-scatter)
--   gather(tensor, dst, group) -> list         scatter from dst (lists are zeros off dst)
--   scatter(tensors, src, group)               gather to src; zeros on other ranks
--   reduce_scatter(output, input_list, op, group) -> output     all_gather
--   all_to_all(output_tensor_list, input_tensor_list, group) -> output_tensor_list
--                                              the inverse all_to_all
--   all_to_all_single(output, input, output_split_sizes, input_split_sizes, group) -> output
--                                              all_to_all_single with the splits swapped
--   all_gather_tensor(input, gather_dim, group)            reduce_scatter_tensor (sum)
--   reduce_scatter_tensor(input, scatter_dim, op, group)   all_gather_tensor
--
-- Arguments as torch.distributed: op is a name ("sum" default, "avg", "min", "max",
-- "product"; dist.ReduceOp.SUM is "sum"), src / dst are GLOBAL ranks (default 0), group a
-- process group (default: the world). Dimensions count from 1 (-1 the last), as everywhere
-- in ddplua. reduce_scatter_tensor also takes PyTorch's order (input, op, scatter_dim,
-- group). The functions that fill given outputs (reduce_scatter, all_to_all,
-- all_to_all_single) copy into them with copy_, so the outputs carry the graph, and return
-- them, as PyTorch.
--
-- Only a sum is differentiable, as in PyTorch's functional collectives: backward through an
-- all_reduce, reduce, reduce_scatter or reduce_scatter_tensor made with another op raises
-- "all_reduce backward only supports 'sum' reduction, got 'max'" on every rank.
--
-- Every rank of the group must make the same calls in the same order, forward and backward
-- (Note [collectives on the tape] in ddplua/dist_functional.h: the backward walk runs the
-- adjoint collectives in the same order on every rank that built the same graph, and a
-- collective node runs even when no gradient reached it). Shapes that differ between ranks
-- fail on every rank naming both calls (Note [collective fingerprints]). The groups used
-- here are kept alive for the graphs that refer to them; do not destroy a group before the
-- backward of a graph that used it.
local lib = require "ddplua.lib"
local tensor = require "ddplua.tensor"
local dl = require "ddplua.functions"
local c10d = require "ddplua.distributed.distributed_c10d"
local ffi, C = lib.ffi, lib.C
local check, raise, wrap = lib.check, lib.raise, lib.wrap

local internal = c10d._internal
local group_of, op_arg, set_call_site = internal.group_of, internal.op_arg, internal.set_call_site

local M = {}

local box = ffi.new("ddp_tensor*[1]")

-- Groups a recorded graph may still use in backward: kept from the collector (a group's
-- handle frees its ddp_pg when collected; the tape holds the bare pointer).
local live_groups = {}

local function group(g, name)
  local grp = group_of(g ~= nil and { group = g } or nil, name)
  local h = grp:ptr(name)
  live_groups[grp] = true
  return grp, h
end

local function op_of(op, name) return op_arg(op ~= nil and { op = op } or nil, name) end

local function tensor_arg(t, name, what)
  if not tensor.is_tensor(t) then
    raise(("%s: %s must be a tensor, got %s"):format(name, what, type(t)))
  end
  return t
end

-- A list of tensors (argument `what` of `name`); n: the length it must have (nil: any).
local function tensor_list(list, name, what, n)
  if type(list) ~= "table" or tensor.is_tensor(list) then
    raise(("%s: %s must be a list of tensors, got %s"):format(name, what, type(list)))
  end
  if n and #list ~= n then
    raise(("%s: %s has %d tensors but the group has %d ranks"):format(name, what, #list, n))
  end
  for i = 1, #list do tensor_arg(list[i], name, ("%s entry %d"):format(what, i)) end
  return list
end

local function shape_str(t) return "(" .. table.concat(t:size(), ", ") .. ")" end

-- The rows of a (world, ...) tensor as a list of views (differentiable).
local function rows(t)
  local out = {}
  for i = 1, t:size(1) do out[i] = t:select(1, i) end
  return out
end

--- F.all_reduce(tensor, op = "sum", group) -> a new tensor: op over every rank's tensor.
-- Backward (sum only): the all_reduce (sum) of the gradient.
function M.all_reduce(t, op, g)
  set_call_site()
  tensor_arg(t, "all_reduce", "tensor")
  local _, h = group(g, "all_reduce")
  check(C.ddp_dist_fn_all_reduce(box, h, t, op_of(op, "all_reduce")))
  return wrap(box[0])
end

--- F.broadcast(tensor, src = 0, group) -> a new tensor: src's tensor on every rank (src a
-- global rank). Backward: the gradients summed on src, zeros on the other ranks.
function M.broadcast(t, src, g)
  set_call_site()
  tensor_arg(t, "broadcast", "tensor")
  local grp, h = group(g, "broadcast")
  check(C.ddp_dist_fn_broadcast(box, h, t, grp:group_rank(src or 0, "broadcast: src")))
  return wrap(box[0])
end

--- F.reduce(tensor, dst = 0, op = "sum", group) -> a new tensor: op over every rank's tensor
-- on dst (a global rank), a copy of tensor elsewhere. Backward (sum only): dst's gradient
-- broadcast, plus the rank's own gradient on the other ranks.
function M.reduce(t, dst, op, g)
  set_call_site()
  tensor_arg(t, "reduce", "tensor")
  local grp, h = group(g, "reduce")
  check(C.ddp_dist_fn_reduce(box, h, t, grp:group_rank(dst or 0, "reduce: dst"), op_of(op, "reduce")))
  return wrap(box[0])
end

--- F.all_gather_tensor(input, gather_dim = 1, group) -> the inputs of every rank
-- concatenated along gather_dim in rank order: (.., world * k, ..) from (.., k, ..).
-- Backward: reduce_scatter_tensor (sum) of the gradient along gather_dim.
function M.all_gather_tensor(input, gather_dim, g)
  set_call_site()
  tensor_arg(input, "all_gather_tensor", "input")
  local _, h = group(g, "all_gather_tensor")
  check(C.ddp_dist_fn_all_gather_tensor(box, h, input, lib.dim(gather_dim or 1, "all_gather_tensor: gather_dim")))
  return wrap(box[0])
end

--- F.reduce_scatter_tensor(input, scatter_dim = 1, op = "sum", group) -> (.., k, ..) from
-- input (.., world * k, ..): op over the ranks of this rank's chunk along scatter_dim
-- (chunk rank + 1). PyTorch's argument order (input, op, scatter_dim, group) works too.
-- Raises "reduce_scatter_tensor: input dimension D (size S) must be a multiple of the
-- group size W". Backward (sum only): all_gather_tensor of the gradient along scatter_dim.
function M.reduce_scatter_tensor(input, scatter_dim, op, g)
  set_call_site()
  if type(scatter_dim) == "string" then scatter_dim, op = op, scatter_dim end
  tensor_arg(input, "reduce_scatter_tensor", "input")
  local _, h = group(g, "reduce_scatter_tensor")
  check(C.ddp_dist_fn_reduce_scatter_tensor(box, h, input,
    lib.dim(scatter_dim or 1, "reduce_scatter_tensor: scatter_dim"), op_of(op, "reduce_scatter_tensor")))
  return wrap(box[0])
end

--- F.all_gather(tensor, group) -> a list of world tensors of tensor's shape: entry i is
-- group rank i-1's tensor (views of one gathered tensor). Backward: each rank's gradient is
-- the sum over the ranks of the gradients of its entry (a reduce-scatter).
function M.all_gather(t, g)
  set_call_site()
  tensor_arg(t, "all_gather", "tensor")
  local _, h = group(g, "all_gather")
  check(C.ddp_dist_fn_all_gather_tensor(box, h, t:unsqueeze(1), 0))
  return rows(wrap(box[0]))
end

--- F.gather(tensor, dst = 0, group) -> a list of world tensors of tensor's shape: on dst
-- (a global rank) entry i is group rank i-1's tensor; zeros on the other ranks. Backward:
-- dst's gradients scattered back to their ranks.
function M.gather(t, dst, g)
  set_call_site()
  tensor_arg(t, "gather", "tensor")
  local grp, h = group(g, "gather")
  check(C.ddp_dist_fn_gather(box, h, t, grp:group_rank(dst or 0, "gather: dst")))
  return rows(wrap(box[0]))
end

--- F.scatter(tensors, src = 0, group) -> a new tensor: entry (rank + 1) of src's list of
-- world tensors (every rank passes a list of the same shapes; only src's values are read).
-- Backward: the gradients gathered on src (its list's gradients), zeros on other ranks.
function M.scatter(tensors, src, g)
  set_call_site()
  local grp, h = group(g, "scatter")
  tensor_list(tensors, "scatter", "tensors", grp:size())
  local stacked = dl.stack(tensors, 1)
  check(C.ddp_dist_fn_scatter(box, h, stacked, grp:group_rank(src or 0, "scatter: src")))
  return wrap(box[0])
end

--- F.reduce_scatter(output, input_list, op = "sum", group) -> output: output receives op
-- over the ranks of their input_list[rank + 1] (a list of world tensors of output's shape
-- and dtype). Raises "reduce_scatter: input_list entry I has shape ... but output has shape
-- ...". Backward (sum only): the all_gather of output's gradient gives input_list's.
function M.reduce_scatter(output, input_list, op, g)
  set_call_site()
  tensor_arg(output, "reduce_scatter", "output")
  local grp, h = group(g, "reduce_scatter")
  tensor_list(input_list, "reduce_scatter", "input_list", grp:size())
  local want = shape_str(output)
  for i, x in ipairs(input_list) do
    if shape_str(x) ~= want then
      raise(("reduce_scatter: input_list entry %d has shape %s but output has shape %s"):format(
        i, shape_str(x), want))
    end
  end
  local stacked = dl.stack(input_list, 1)
  check(C.ddp_dist_fn_reduce_scatter_tensor(box, h, stacked, 0, op_of(op, "reduce_scatter")))
  output:copy_(wrap(box[0]):select(1, 1))
  return output
end

-- Row split sizes of all_to_all_single as an int64_t array (nil: even).
local function split_sizes(v, what)
  if v == nil then return nil, 0 end
  if type(v) ~= "table" then
    raise(("all_to_all_single: %s must be a list of row counts, got %s"):format(what, type(v)))
  end
  local arr = ffi.new("int64_t[?]", math.max(#v, 1))
  for i = 1, #v do arr[i - 1] = lib.size(v[i], "all_to_all_single", what .. " entry " .. i) end
  return arr, #v
end

--- F.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group) ->
-- output, as dist.all_to_all_single: input's rows (dimension 1) go out in rank order,
-- input_split_sizes[j+1] of them to group rank j (nil: even); output receives
-- output_split_sizes[i+1] rows from rank i (nil: even). Backward: all_to_all_single of
-- output's gradient with the split sizes swapped.
function M.all_to_all_single(output, input, output_split_sizes, input_split_sizes, g)
  set_call_site()
  tensor_arg(output, "all_to_all_single", "output")
  tensor_arg(input, "all_to_all_single", "input")
  local _, h = group(g, "all_to_all_single")
  local os_, on = split_sizes(output_split_sizes, "output_split_sizes")
  local is_, inn = split_sizes(input_split_sizes, "input_split_sizes")
  check(C.ddp_dist_fn_all_to_all_single(box, h, input, os_, on, is_, inn))
  local r = wrap(box[0])
  if shape_str(r) ~= shape_str(output) then
    raise(("all_to_all_single: output has shape %s but the exchange gives %s"):format(
      shape_str(output), shape_str(r)))
  end
  output:copy_(r)
  return output
end

--- F.all_to_all(output_tensor_list, input_tensor_list, group) -> output_tensor_list:
-- input_tensor_list[j+1] goes to group rank j, output_tensor_list[i+1] receives what rank i
-- sent this rank (lists of world tensors of one dtype; shapes may differ per entry, as long
-- as each sender's entry has the element count of the receiver's). One all_to_all_single
-- over the flattened entries. Backward: the inverse all_to_all.
function M.all_to_all(output_tensor_list, input_tensor_list, g)
  set_call_site()
  local grp, h = group(g, "all_to_all")
  local w = grp:size()
  tensor_list(output_tensor_list, "all_to_all", "output_tensor_list", w)
  tensor_list(input_tensor_list, "all_to_all", "input_tensor_list", w)
  local dtype = input_tensor_list[1]:type()
  local flat = {}
  local in_split, out_split = ffi.new("int64_t[?]", w), ffi.new("int64_t[?]", w)
  for i = 1, w do
    local x, y = input_tensor_list[i], output_tensor_list[i]
    if x:type() ~= dtype then
      raise(("all_to_all: input_tensor_list entry %d has dtype %s but entry 1 has %s"):format(i, x:type(), dtype))
    end
    if y:type() ~= dtype then
      raise(("all_to_all: output_tensor_list entry %d has dtype %s but the inputs have %s"):format(i, y:type(), dtype))
    end
    flat[i] = x:reshape(-1)
    in_split[i - 1], out_split[i - 1] = x:numel(), y:numel()
  end
  check(C.ddp_dist_fn_all_to_all_single(box, h, dl.cat(flat, 1), out_split, w, in_split, w))
  local r = wrap(box[0])
  local at = 1
  for i = 1, w do
    local y = output_tensor_list[i]
    local n = y:numel()
    y:copy_(r:narrow(1, at, n):view(y:size()))
    at = at + n
  end
  return output_tensor_list
end

return M
