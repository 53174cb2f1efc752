--- ddplua.nn.checkpoint: activation checkpointing, PyTorch's torch.utils.checkpoint with
-- use_reentrant = False semantics. dl.utils.checkpoint and dl.utils.checkpoint_sequential
-- are these functions.
--
--   local y = dl.utils.checkpoint(fn, x, w, 3)          -- fn(x, w, 3), activations dropped
--   local y = dl.utils.checkpoint({preserve_rng_state = false}, fn, x)   -- with options
--   local y = dl.utils.checkpoint_sequential(seq, 2, x) -- nn.Sequential (or a list) in 2 segments
--
-- A checkpointed segment keeps only its tensor arguments and its outputs; backward runs the
-- segment again with grad mode on to rebuild what it needs, then differentiates that graph.
-- Memory for the segment's intermediates is held only while its backward runs.
--
-- Note [checkpoint node]: PyTorch's non-reentrant checkpoint keeps the segment's graph and
-- replaces its saved tensors by placeholders (saved-tensor hooks) that the recomputation
-- fills. ddplua's walk is driven from Lua step by step (Note [stepwise backward]), and saved
-- tensors are read inside C backward functions, so the segment is one node instead: forward
-- runs fn once with grad mode on, finds the leaves that require grad it reached (the
-- parameters it used; Note [checkpoint segment] in runtime/autograd/node.c), and keeps only
-- the outputs, detached (the segment's graph and activations go with the handles). The
-- node's inputs are the tensor arguments that require grad and those leaves; its backward
-- reruns fn on fresh leaves holding the arguments' values, with the forward's random state
-- and autocast state, and takes the gradients w.r.t. the arguments and the leaves with
-- autograd.grad. What PyTorch users rely on holds:
--   * a parameter receives its gradient through the outer graph, once per backward, and
--     its post-accumulate hooks (DDP's reducer) fire once, in the outer walk, also when it
--     is used inside and outside the segment: no "marked ready twice" under DDP, with or
--     without find_unused_parameters and static_graph (PyTorch's non-reentrant semantics;
--     its reentrant variant needs static_graph for that case);
--   * arguments that do not require grad, non-tensor arguments and outputs, several outputs
--     work; an output that does not require grad is returned as computed;
--   * gradients equal those without checkpointing (the same ops run on the same values;
--     where a parameter is used inside and outside the segment its two contributions may
--     be summed in another order, so they agree within rounding).
-- Differences: the segment must take as arguments any tensor requiring grad it uses that
-- was computed outside it (parameters and other leaves may be captured): a captured
-- non-leaf raises, naming its grad_fn. Differentiable outputs must share one dtype and
-- device (they are packed into one buffer: a node has one output). The recomputation's
-- walk runs no leaf's register_hook hook (ddp_backward_skip_leaf_hooks): a parameter's
-- hook sees its whole gradient once, in the outer walk, as without checkpointing. Only the default generator's state is saved and restored (as PyTorch
-- restores the default CPU and CUDA generators, not generators passed to ops).
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local generator = require "ddplua.generator"
local Function = require "ddplua.autograd.function"
local engine = require "ddplua.autograd.engine"
local ffi, C = lib.ffi, lib.C

local M = {}

local KNOWN = options.known { "use_reentrant", "preserve_rng_state", "determinism_check" }

local function is_tensor(v) return type(v) == "cdata" and ffi.istype("ddp_tensor*", v) end

local function is_callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return mt ~= nil and type(mt) == "table" and mt.__call ~= nil
end

local function nbytes(t) return t:numel() * tonumber(C.ddp_dtype_size(lib.dtype(t.dtype))) end

local function pack(...) return { n = select("#", ...), ... } end

-- The autocast state of both device types, to replay it in the recomputation.
local AUTOCAST_KINDS = { cpu = C.DDP_AUTOCAST_CPU, cuda = C.DDP_AUTOCAST_CUDA }
local function autocast_state()
  local s = {}
  for name, kind in pairs(AUTOCAST_KINDS) do
    if C.ddp_autocast_is_enabled(kind) ~= 0 then
      s[#s + 1] = { name = name, dtype = lib.dtype_name(C.ddp_autocast_get_dtype(kind)) }
    end
  end
  return s
end

-- fn(...) inside the autocast regions listed in state (outermost first).
local function with_autocast(state, i, fn, ...)
  local region = state[i]
  if not region then return fn(...) end
  local amp = require "ddplua.amp"
  return amp.autocast(region.name, { dtype = region.dtype }, with_autocast, state, i + 1, fn, ...)
end

-- Fresh leaves holding the tensor arguments' values (requires_grad as the arguments), the
-- other arguments as they are.
local function fresh_args(args, needs)
  local inner = {}
  for i = 1, args.n do
    local a = args[i]
    if is_tensor(a) then
      local d = a:detach()
      if needs[i] then d.requires_grad = true end
      inner[i] = d
    else
      inner[i] = a
    end
  end
  return inner
end

-- Note [checkpoint collection]: a segment's intermediates are held by their Lua handles
-- until the collector finds them dead (Note [handle registry] in ddplua.lib), and the
-- collector's pacing lets dead tensors wait up to a quarter of the live bytes (Note
-- [collector pressure]): on a model whose parameters dominate, that is more than every
-- activation the checkpoints saved. So after a segment runs (forward, and recomputation
-- plus its backward), when what it allocated beyond what it keeps (outputs, or the
-- gradients handed on) passes 1 MiB and the Lua heap's size, checkpoint runs a full
-- collection itself: the segment's dead tensors are freed before the next segment runs. A
-- collection costs ~0.5 ns per Lua heap byte, so this spends at most ~0.5 ns per byte it
-- frees, less than writing that memory once.
local COLLECT_MIN_BYTES = 1024 * 1024
local function collect_after(live_before, kept_bytes)
  local dead = tonumber(C.ddp_memory_live_bytes()) - live_before - kept_bytes
  if dead > COLLECT_MIN_BYTES and dead > 1024 * collectgarbage("count") then
    collectgarbage("collect")
  end
end

local leaves_box = ffi.new("int[1]")

-- The leaves requiring grad that the tensors of `outs` reached through nodes newer than
-- `since` (Note [checkpoint segment]), as Lua handles.
local function segment_leaves(outs, since)
  local n = #outs
  local arr = ffi.new("ddp_tensor*[?]", math.max(n, 1))
  for i = 1, n do arr[i - 1] = outs[i] end
  local cap = 64
  while true do
    local buf = ffi.new("ddp_tensor*[?]", cap)
    lib.check(C.ddp_autograd_segment_leaves(n, arr, since, cap, buf, leaves_box))
    local found = leaves_box[0]
    if found <= cap then
      local leaves = {}
      for i = 1, found do leaves[i] = lib.wrap(buf[i - 1]) end
      return leaves
    end
    for i = 0, cap - 1 do C.ddp_tensor_release(buf[i]) end
    cap = found
  end
end

-- The node of one checkpointed call (Note [checkpoint node]). apply(state, ...) takes the
-- node's inputs (arguments requiring grad, then leaves) and returns state.packed.
local Checkpoint = Function:extend("Checkpoint")

--- Checkpoint.forward(ctx, state, ...) -> state.packed, the outputs computed already
-- (the node's inputs, ..., only give the node its edges).
function Checkpoint.forward(ctx, state)
  ctx.state = state
  local packed = state.packed
  state.packed = nil -- the node owns it now
  return packed
end

-- The recomputation: fn again on fresh leaves, with the forward's random and autocast
-- state (the caller's random state is put back afterwards, as torch.random.fork_rng).
local function recompute(st)
  local inner = fresh_args(st.args, st.needs)
  local outer_rng
  if st.rng then
    outer_rng = generator.default:get_state()
    generator.default:set_state(st.rng)
  end
  local prev = C.ddp_set_grad_enabled(1)
  local res = pack(pcall(with_autocast, st.autocast, 1, st.fn, unpack(inner, 1, st.args.n)))
  C.ddp_set_grad_enabled(prev)
  if outer_rng then generator.default:set_state(outer_rng) end
  if not res[1] then error(res[2], 0) end
  return inner, res
end

--- Checkpoint.backward(ctx, g) -> nil (state), then the gradient of each node input:
-- g is the packed outputs' gradient; the segment is recomputed and differentiated with
-- autograd.grad (Note [checkpoint node]). Raises when the recomputation differs
-- (determinism_check) and what fn raises.
function Checkpoint.backward(ctx, g)
  local st = ctx.state
  local live_before = tonumber(C.ddp_memory_live_bytes())
  local got, n = Checkpoint._gradients(st, g)
  local kept = 0
  for i = 1, n do kept = kept + (got[i] and nbytes(got[i]) or 0) end
  collect_after(live_before, kept)
  return nil, unpack(got, 1, n)
end

-- The gradients w.r.t. the node's inputs (a list and its length) from a recomputation.
function Checkpoint._gradients(st, g)
  local inner, res = recompute(st)
  local outs, grads = {}, {}
  for j, k in ipairs(st.diff) do
    local o, meta = res[k + 1], st.meta[j]
    local ok = is_tensor(o) and o.requires_grad and o.dtype == meta.dtype
    if ok then
      local shape = o.shape
      ok = #shape == #meta.shape
      for d = 1, #shape do ok = ok and shape[d] == meta.shape[d] end
    end
    if not ok and st.determinism_check then
      lib.raise(("checkpoint: Recomputed values for the following tensors have different "
        .. "metadata than during the forward pass: output %d was a %s tensor of shape (%s) "
        .. "requiring grad, the recomputation gave %s (the checkpointed function must compute "
        .. "the same thing when run again)"):format(k, meta.dtype, table.concat(meta.shape, ", "),
        is_tensor(o) and (o.dtype .. " (" .. table.concat(o.shape, ", ") .. ")"
          .. (o.requires_grad and "" or " not requiring grad")) or type(o)))
    end
    outs[j] = o
    if #st.diff == 1 then
      grads[j] = g
    else
      grads[j] = g:narrow(1, meta.offset + 1, meta.numel):view(meta.shape)
    end
  end
  local inputs = {}
  for _, i in ipairs(st.arg_pos) do inputs[#inputs + 1] = inner[i] end
  for _, leaf in ipairs(st.leaves) do inputs[#inputs + 1] = leaf end
  -- autograd.grad's walk, but without the leaves' register_hook hooks: the outer walk shows
  -- them each parameter's whole gradient (this part included) once
  return engine.run(outs, grads, inputs, false, true), #inputs
end

-- Options first (a plain table with no list part: not a module, nor a list of functions)
-- or not.
local function parse(first, ...)
  if type(first) == "table" and getmetatable(first) == nil and first[1] == nil then
    return options.check("checkpoint", first, KNOWN), ...
  end
  return {}, first, ...
end

--- checkpoint([opts,] fn, ...) -> fn(...)'s results, with fn's activations not kept for
-- backward (Note [checkpoint node]): torch.utils.checkpoint.checkpoint(fn, *args,
-- use_reentrant=False). fn: a function or a callable (a module); ...: its arguments (any
-- values; tensors that require grad get gradients). opts (a plain table before fn):
-- preserve_rng_state (default true: the recomputation draws the same random numbers from
-- the default generator, so dropout masks match), determinism_check ("default": the
-- recomputed outputs must have the forward's shapes and dtypes; "none"), use_reentrant
-- (only false: ddplua implements the non-reentrant variant). Under no_grad, fn just runs.
-- Errors: fn not callable, an unknown option, use_reentrant = true, a captured non-leaf
-- tensor requiring grad (naming its grad_fn), differentiable outputs of mixed dtypes or
-- devices, a recomputation that differs (determinism_check), and whatever fn raises.
function M.checkpoint(...)
  local args = pack(parse(...))
  local opts, fn = args[1], args[2]
  if not is_callable(fn) then
    lib.raise("checkpoint: function must be a function or a callable module, got " .. type(fn))
  end
  if opts.use_reentrant then
    lib.raise("checkpoint: use_reentrant = true is not supported: ddplua implements the "
      .. "non-reentrant variant (use_reentrant = false), which PyTorch recommends")
  end
  local dc = opts.determinism_check
  if dc ~= nil and dc ~= "default" and dc ~= "none" then
    lib.raise("checkpoint: determinism_check must be 'default' or 'none', got " .. tostring(dc))
  end
  local fargs = { n = args.n - 2 }
  for i = 1, fargs.n do fargs[i] = args[i + 2] end
  if C.ddp_grad_enabled() == 0 then return fn(unpack(fargs, 1, fargs.n)) end

  local st = { fn = fn, args = fargs, needs = {}, arg_pos = {}, determinism_check = dc ~= "none",
    autocast = autocast_state() }
  for i = 1, fargs.n do
    local a = fargs[i]
    if is_tensor(a) and a.requires_grad then
      st.needs[i] = true
      st.arg_pos[#st.arg_pos + 1] = i
    end
  end
  if opts.preserve_rng_state ~= false then st.rng = generator.default:get_state() end
  local live_before = tonumber(C.ddp_memory_live_bytes())
  local inner = fresh_args(fargs, st.needs)
  local since = C.ddp_autograd_seq_now()
  local res = pack(fn(unpack(inner, 1, fargs.n)))

  -- the differentiable outputs, their leaves, then the outputs without their graph
  st.diff, st.meta = {}, {}
  local diff_tensors = {}
  for k = 1, res.n do
    local o = res[k]
    if is_tensor(o) and o.requires_grad then
      st.diff[#st.diff + 1] = k
      diff_tensors[#diff_tensors + 1] = o
    end
  end
  if #st.diff == 0 then return unpack(res, 1, res.n) end
  local leaves = segment_leaves(diff_tensors, since)
  st.leaves = {}
  for _, leaf in ipairs(leaves) do
    local is_arg = false
    for _, i in ipairs(st.arg_pos) do is_arg = is_arg or leaf == inner[i] end
    if not is_arg then st.leaves[#st.leaves + 1] = leaf end
  end
  inner, leaves = nil, nil
  local first = diff_tensors[1]
  local offset = 0
  for j, o in ipairs(diff_tensors) do
    if o.dtype ~= first.dtype or o.device ~= first.device then
      lib.raise(("checkpoint: the differentiable outputs must share one dtype and device: "
        .. "output %d is %s on %s, output %d is %s on %s"):format(st.diff[1], first.dtype,
        first.device, st.diff[j], o.dtype, o.device))
    end
    local n = o:numel()
    st.meta[j] = { shape = o.shape, dtype = o.dtype, offset = offset, numel = n }
    offset = offset + n
  end
  local dl = require "ddplua.functions"
  local prev = C.ddp_set_grad_enabled(0)
  local ok, packed = pcall(function()
    if #diff_tensors == 1 then return first:detach() end
    local flat = {}
    for j, o in ipairs(diff_tensors) do flat[j] = o:detach():reshape { -1 } end
    return dl.cat(flat, 1)
  end)
  C.ddp_set_grad_enabled(prev)
  if not ok then error(packed, 0) end
  -- the segment's graph goes with the last handles on it (those of fn's intermediates too)
  diff_tensors, first = nil, nil
  st.packed = packed
  local node_inputs = {}
  for _, i in ipairs(st.arg_pos) do node_inputs[#node_inputs + 1] = fargs[i] end
  for _, leaf in ipairs(st.leaves) do node_inputs[#node_inputs + 1] = leaf end
  local out = Checkpoint.apply(st, unpack(node_inputs))
  if #st.diff == 1 then
    res[st.diff[1]] = out
  else
    for j, k in ipairs(st.diff) do
      local m = st.meta[j]
      res[k] = out:narrow(1, m.offset + 1, m.numel):view(m.shape)
    end
  end
  collect_after(live_before, nbytes(out))
  return unpack(res, 1, res.n)
end

--- checkpoint_sequential([opts,] functions, segments, input) -> the output of running input
-- through functions in order, torch.utils.checkpoint.checkpoint_sequential's: functions (an
-- nn.Sequential or a list of callables) are cut into `segments` runs of
-- floor(#functions / segments) (the last takes the rest); every run but the last is
-- checkpointed (checkpoint's opts apply), the last runs normally. Errors: segments not an
-- integer in 1 .. #functions, an element that is not callable.
function M.checkpoint_sequential(...)
  local opts, functions, segments, input = parse(...)
  local list = {}
  if type(functions) == "table" and type(functions.children) == "function" and rawget(functions, "_modules") then
    list = functions:children()
  elseif type(functions) == "table" then
    for i = 1, #functions do list[i] = functions[i] end
  else
    lib.raise("checkpoint_sequential: functions must be an nn.Sequential or a list of "
      .. "callables, got " .. type(functions))
  end
  for i, f in ipairs(list) do
    if not is_callable(f) then
      lib.raise("checkpoint_sequential: functions[" .. i .. "] is a " .. type(f) .. ", not callable")
    end
  end
  if type(segments) ~= "number" or segments % 1 ~= 0 or segments < 1 or segments > math.max(#list, 1) then
    lib.raise(("checkpoint_sequential: segments must be an integer between 1 and the number "
      .. "of functions (%d), got %s"):format(#list, tostring(segments)))
  end
  local function run(from, to)
    return function(x)
      for i = from, to do x = list[i](x) end
      return x
    end
  end
  local size = math.floor(#list / segments)
  local last = 0 -- the last function done
  for s = 1, segments - 1 do
    input = M.checkpoint(opts, run(last + 1, last + size), input)
    last = last + size
  end
  return run(last + 1, #list)(input)
end

return M
