--- ddplua.autograd.engine: the Lua driver loop of the backward walk.
--
-- Note [Lua in backward]: the runtime never calls into Lua (the FFI design: no callbacks).
-- So the C engine walks the graph in steps (ddp_backward_step, Note [stepwise backward] in
-- runtime/include/ddplua/autograd.h) and returns here whenever Lua code must run: a tensor
-- hook (register_hook), a post-accumulate hook registered from Lua, or the backward of a
-- Lua-defined autograd.Function. This loop runs that code and answers (a replacement
-- gradient, the Function's input gradients), then steps again. Everything else (every
-- built-in op, the DDP reducer's C hooks) runs inside one step in C, so a graph with no
-- Lua in it costs one step. The Lua objects are kept here by id (hooks: positive ids from
-- C; Functions: negative ids from here); the runtime queues the ids of hooks and nodes it
-- freed and forget_dropped() lets them go.
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check, wrap = lib.check, lib.wrap

local M = {}

-- One registry per Lua state, not per load of this module: the runtime's ids are
-- process-wide, and a module may be loaded more than once in one state (busted reloads
-- modules for each spec file, while the Tensor metatype, set once, keeps the methods of the
-- first load), so a hook registered through one load must be found by the walk another
-- load drives. The Lua registry table is that per-state place (no global variable).
local REGISTRY_KEY = "ddplua.autograd.engine registry"
local registry = debug.getregistry()[REGISTRY_KEY]
if not registry then
  registry = { hooks = {}, functions = {}, next_function_id = 0 }
  debug.getregistry()[REGISTRY_KEY] = registry
end
local hooks = registry.hooks         -- id -> function(grad) -> nil | new grad, or function(tensor)
local functions = registry.functions -- id -> the record Function.apply made (ddplua.autograd.function)

--- Keep hook fn under the id C gave it.
function M.add_hook(id, fn) hooks[id] = fn end
function M.remove_hook(id) hooks[id] = nil end

--- A new (negative) id for a Function node, its record kept under it.
function M.add_function(record)
  registry.next_function_id = registry.next_function_id - 1
  functions[registry.next_function_id] = record
  return registry.next_function_id
end
function M.remove_function(id) functions[id] = nil end

local dropped = ffi.new("int64_t[256]")
--- Drop what was kept for hooks and Function nodes the runtime has freed.
function M.forget_dropped()
  repeat
    local n = C.ddp_autograd_dropped_ids(dropped, 256)
    for i = 0, n - 1 do
      local id = tonumber(dropped[i])
      hooks[id] = nil
      functions[id] = nil
    end
  until n < 256
end

-- Handle the event in ev (the caller's code runs here), then step until DONE.
local function drive(w, ev)
  while true do
    local kind = ev.kind
    if kind == C.DDP_BACKWARD_DONE then return end
    local t, id = wrap(ev.tensor), tonumber(ev.id)
    if kind == C.DDP_BACKWARD_GRAD_HOOK then
      local fn = hooks[id]
      local replaced = fn and fn(t)
      if replaced ~= nil then check(C.ddp_backward_answer(w, 0, replaced)) end
    elseif kind == C.DDP_BACKWARD_POST_HOOK then
      local fn = hooks[id]
      if fn then fn(t) end
    else -- a Function's backward
      local record = functions[id]
      if not record then lib.raise("backward: a Function node with no Lua record (id " .. id .. ")") end
      record:run_backward(w, t)
    end
    check(C.ddp_backward_step(w, ev))
  end
end

-- Buffers of the outermost walk, reused (a hook or Function that runs a backward of its
-- own gets fresh ones): a plain backward then allocates nothing in Lua.
local depth = 0
local cached = { outs = ffi.new("ddp_tensor*[8]"), gs = ffi.new("ddp_tensor*[8]"),
  ins = ffi.new("ddp_tensor*[8]"), wbox = ffi.new("ddp_backward_walk*[1]"),
  ev = ffi.new("ddp_backward_event") }

local function tensor_array(buf, list, n)
  local a = (buf and n <= 8) and buf or ffi.new("ddp_tensor*[?]", math.max(n, 1))
  for i = 1, n do a[i - 1] = list[i] end
  return a
end

-- Callbacks queued during the outermost walk (M.queue_callback), run when it ends.
local final_callbacks = {}

--- engine.is_running() -> true while a backward walk (backward or autograd.grad) is under
-- way: hooks and Functions' backward run inside one; a module's forward called then is a
-- recomputation (activation checkpointing), which FSDP's post-forward must not reshard.
function M.is_running() return depth > 0 end

--- engine.queue_callback(fn): run fn() once the outermost backward walk now under way has
-- finished (after every hook of the walk), as PyTorch's
-- Variable._execution_engine.queue_callback: FSDP finishes the post-backward of param
-- groups whose gradients never arrived there. Callbacks run in the order queued, each at
-- most once; when the walk fails they are dropped. Raises when no walk is running.
function M.queue_callback(fn)
  if depth == 0 then lib.raise("queue_callback: no backward is running (call it from a hook)") end
  if type(fn) ~= "function" then lib.raise("queue_callback: fn must be a function, got " .. type(fn)) end
  final_callbacks[#final_callbacks + 1] = fn
end

-- Run the queued callbacks (a callback may queue more: they run too); errors propagate.
local function run_final_callbacks()
  local i = 1
  while final_callbacks[i] do
    local fn = final_callbacks[i]
    final_callbacks[i] = false
    fn()
    i = i + 1
  end
  for k = #final_callbacks, 1, -1 do final_callbacks[k] = nil end
end

local function finish(w, ok, err, inputs, ni)
  local results
  if ok and inputs then
    results = {}
    for i = 1, ni do results[i] = wrap(C.ddp_backward_result(w, i - 1)) end
  end
  C.ddp_backward_end(w)
  -- callbacks run while depth still counts this walk (one that queues another is legal)
  if depth == 1 and #final_callbacks > 0 then
    if ok then
      local cb_ok, cb_err = pcall(run_final_callbacks)
      if not cb_ok then ok, err = false, cb_err end
    end
    for k = #final_callbacks, 1, -1 do final_callbacks[k] = nil end
  end
  depth = depth - 1
  -- the walk's gradients are no dropped handles (Note [step lifetimes], ddplua/lib.lua)
  if depth == 0 then lib.step_mark() end
  M.forget_dropped()
  if not ok then error(err, 0) end
  return results
end

-- The first step runs outside pcall (a graph with no Lua in it ends there, and the loop
-- stays compiled); drive, under pcall, takes over from the first event that needs Lua.
local function walk(w, ev, inputs, ni)
  if C.ddp_backward_step(w, ev) ~= 0 then
    local msg = ffi.string(C.ddp_last_error())
    C.ddp_backward_end(w)
    depth = depth - 1
    lib.raise(msg)
  end
  if ev.kind == C.DDP_BACKWARD_DONE then return finish(w, true, nil, inputs, ni) end
  local ok, err = pcall(drive, w, ev)
  return finish(w, ok, err, inputs, ni)
end

--- run1(output, grad, retain_graph): run({output}, {grad}, nil, retain_graph) without the
-- tables (Tensor.backward, once per training step).
function M.run1(output, grad, retain_graph)
  -- the forward's dropped tensors go first (Note [step lifetimes], ddplua/lib.lua)
  if depth == 0 then lib.release_step() end
  local buf = depth == 0 and cached or nil
  local outs = buf and buf.outs or ffi.new("ddp_tensor*[1]")
  local gs = buf and buf.gs or ffi.new("ddp_tensor*[1]")
  outs[0], gs[0] = output, grad
  local wbox = buf and buf.wbox or ffi.new("ddp_backward_walk*[1]")
  check(C.ddp_backward_begin(wbox, 1, outs, gs, 0, nil, retain_graph and 1 or 0))
  outs[0], gs[0] = nil, nil
  local w = wbox[0]
  depth = depth + 1
  return walk(w, buf and buf.ev or ffi.new("ddp_backward_event"), nil, 0)
end

--- run(outputs, grads, inputs, retain_graph, skip_leaf_hooks) -> the gradients w.r.t. inputs (a table of
-- tensors or nil, when inputs is given). outputs: a list of tensors that require grad;
-- grads: a list of the same length (nil entries: 1 for one-element outputs); inputs: nil
-- (backward: leaves accumulate into .grad) or a list (autograd.grad: nothing touches .grad).
-- skip_leaf_hooks: leaves' register_hook hooks do not run (ddp_backward_skip_leaf_hooks;
-- a checkpoint's recomputation). Raises the first error (an op's, a hook's, a Function's)
-- at the caller's line; the walk is always ended and grad mode restored.
function M.run(outputs, grads, inputs, retain_graph, skip_leaf_hooks)
  local n, ni = #outputs, inputs and #inputs or 0
  if depth == 0 then lib.release_step() end -- Note [step lifetimes], ddplua/lib.lua
  local buf = depth == 0 and cached or nil
  local outs = tensor_array(buf and buf.outs, outputs, n)
  local gs = tensor_array(buf and buf.gs, grads or {}, n)
  local ins = tensor_array(buf and buf.ins, inputs or {}, ni)
  local wbox = buf and buf.wbox or ffi.new("ddp_backward_walk*[1]")
  check(C.ddp_backward_begin(wbox, n, outs, gs, ni, ins, retain_graph and 1 or 0))
  local w = wbox[0]
  if skip_leaf_hooks then
    local status = C.ddp_backward_skip_leaf_hooks(w)
    if status ~= 0 then
      local msg = ffi.string(C.ddp_last_error())
      C.ddp_backward_end(w)
      lib.raise(msg)
    end
  end
  depth = depth + 1
  for i = 0, n - 1 do outs[i], gs[i] = nil, nil end -- the walk holds its own references
  for i = 0, ni - 1 do ins[i] = nil end
  return walk(w, buf and buf.ev or ffi.new("ddp_backward_event"), inputs, ni)
end

--- Raise the create_graph error (name: the calling function, for the message): ddplua
-- computes first-order gradients only. Re-exported as ddplua.autograd.refuse_create_graph.
function M.refuse_create_graph(name)
  lib.raise(name .. ": create_graph = true is not supported: ddplua computes first-order "
    .. "gradients only (the gradients it returns have no graph, so differentiating them "
    .. "again would be wrong); compute higher-order terms another way (e.g. finite "
    .. "differences of a first-order gradient)")
end

return M
