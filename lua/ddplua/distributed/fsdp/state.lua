--- ddplua.distributed.fsdp.state: FSDPState, what fully_shard attaches to a module (as
-- PyTorch's FSDPState): its param group and the hooks around its forward and backward.
--
-- Note [fsdp hooks]: the order of one training step, for a model wrapped per block and at
-- the root (fully_shard(block) for each block, then fully_shard(model)):
--   * pre-forward (before the module's own forward): the root's first forward finds every
--     FSDPState under it (lazy init) and starts recording the forward order (first step
--     only); each module's group is unsharded (all-gather of its flat shards, copy-out,
--     the unsharded parameters registered), and from the second step on the NEXT module's
--     all-gather in forward order is issued asynchronously first, so it runs while this
--     module computes (prefetch). Floating tensor arguments are cast to param_dtype.
--   * post-forward: a hook on the gradient of each output that requires grad (pre-backward);
--     then, with reshard_after_forward, the shards are registered again and the unsharded
--     storages freed (the graph's saved tensors keep the same tensor objects: Note [storage
--     resize]). The root keeps its parameters unsharded (its backward starts at once).
--   * pre-backward (the first gradient of any output of the module): unshard again (a no-op
--     when prefetched or never resharded), then prefetch the module before it in forward
--     order. The root's pre-backward also queues the end-of-backward callback.
--   * post-backward (the post-accumulate-grad hook of the group's last gradient): reduce-
--     scatter of the flat padded gradients (asynchronous), reshard.
--   * end of backward (engine.queue_callback): post-backward of the groups whose gradients
--     did not all arrive (unused parameters), then every reduce-scatter is waited for and
--     added into the shards' .grad; the optimizer then steps the shards.
-- During a backward's recomputation (activation checkpointing runs the module's forward
-- again inside the walk: engine.is_running()) the pre-forward only unshards (no prefetch, no
-- recording) and the post-forward neither hooks nor reshards: the recomputed graph needs the
-- unsharded values until its own backward, and the post-backward reshards afterwards.
local dl = require "ddplua.functions"
local engine = require "ddplua.autograd.engine"

local FSDPState = {}
FSDPState.__index = FSDPState

--- FSDPState.new(module, param_group, opts) -> the state of a module fully_shard was applied
-- to; opts.param_dtype: the dtype its forward's floating tensor arguments are cast to (nil:
-- none). Not a root until lazy_init decides (is_root nil).
function FSDPState.new(module, param_group, opts)
  return setmetatable({
    module = module, group = param_group, is_root = nil, prefetch = true,
    cast_dtype = opts.param_dtype,
  }, FSDPState)
end

-- Every FSDPState under the root (itself first), in named_modules order.
local function states_under(root_state, states_of)
  local list = {}
  for _, m in ipairs(root_state.module:modules()) do
    local s = states_of[m]
    if s then list[#list + 1] = s end
  end
  return list
end

--- state:lazy_init(states_of): at the first forward of a module with no FSDP forward around
-- it: it becomes a root, the FSDPStates under it its children (not roots).
function FSDPState:lazy_init(states_of)
  if self.is_root ~= nil then return end
  self.is_root = true
  self.all_states = states_under(self, states_of)
  for _, s in ipairs(self.all_states) do
    if s ~= self then s.is_root = false; s.root = self end
  end
  self.root = self
  self.forward_order = nil -- recorded by the first forward
end

-- Cast floating tensor arguments to dtype (mixed precision's cast_forward_inputs).
local function cast_args(dtype, n, ...)
  local args = { ... }
  for i = 1, n do
    local a = args[i]
    if dl.is_tensor(a) and a:is_floating_point() and a.dtype ~= dtype then args[i] = a:to(dtype) end
  end
  return args
end

--- state:pre_forward(n, ...) -> the forward's n arguments as a list when they were cast to
-- param_dtype, else nil (use them as given). Records the forward order (the root's first
-- forward), unshards this group and prefetches the next one (Note [fsdp hooks]).
function FSDPState:pre_forward(n, ...)
  local root = self.root
  local recomputing = engine.is_running()
  if self.is_root and not recomputing then
    if not root.forward_order then root.recording = {} end
    for _, s in ipairs(root.all_states) do s.backward_seen = false end
    root.in_backward = false
  end
  if root and root.recording and not recomputing then
    local rec = root.recording
    rec[#rec + 1] = self
    self.order_index = #rec
  end
  if not recomputing then
    self.group:unshard(true)
    local nxt = root and root.prefetch and root.forward_order and root.forward_order[self.order_index + 1]
    if nxt then nxt.group:unshard(true) end
  end
  self.group:unshard(false)
  if self.cast_dtype then return cast_args(self.cast_dtype, n, ...) end
  return nil
end

-- Tensors among the outputs (one level of tables, as a forward returns values or a list; a
-- DTensor of tensor parallelism counts by its local tensor).
local function each_tensor(fn, ...)
  local DTensor = require "ddplua.distributed.tensor.dtensor"
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    if dl.is_tensor(v) then fn(v)
    elseif DTensor.is_dtensor(v) then fn(v:to_local())
    elseif type(v) == "table" and getmetatable(v) == nil then
      for _, x in pairs(v) do if dl.is_tensor(x) then fn(x) end end
    end
  end
end

--- state:post_forward(...): hooks on the outputs' gradients, reshard (Note [fsdp hooks]).
function FSDPState:post_forward(...)
  if engine.is_running() then return end
  local hooked = false
  if dl.is_grad_enabled() then
    self.weak_self = self.weak_self or setmetatable({ state = self }, { __mode = "v" })
    local ref = self.weak_self -- Note [fsdp lifetimes]: the hooks hold the state weakly
    each_tensor(function(t)
      if t.requires_grad then
        hooked = true
        t:register_hook(function()
          local s = ref.state
          if s then s:pre_backward() end
        end)
      end
    end, ...)
  end
  if self.is_root then
    if self.recording then
      self.forward_order = self.recording
      self.recording = nil
    end
    if not hooked then self.group:reshard() end -- no backward will follow
  elseif self.group.reshard_after_forward or not hooked then
    self.group:reshard()
  end
end

--- state:pre_backward(): unshard for this module's backward and prefetch the one before it.
function FSDPState:pre_backward()
  if self.backward_seen then return end
  self.backward_seen = true
  local root = self.root
  if root and not root.in_backward then
    root.in_backward = true
    for _, s in ipairs(root.all_states) do s.group:reset_backward() end
    engine.queue_callback(function() root:finish_backward() end)
  end
  self.group:unshard(true)
  local order = root and root.forward_order
  local prev = root and root.prefetch and order and self.order_index and order[self.order_index - 1]
  if prev and not prev.backward_seen then prev.group:unshard(true) end
  self.group:wait_for_unshard()
end

--- state:post_backward(): the group's last gradient arrived (post-accumulate-grad hook).
function FSDPState:post_backward()
  self.group:post_backward()
end

--- root:finish_backward(): the end-of-backward callback (Note [fsdp hooks]).
function FSDPState:finish_backward()
  for _, s in ipairs(self.all_states) do
    local g = s.group
    if not g.post_backward_done and (g.state ~= "sharded" or g.n_ready > 0) then g:post_backward() end
  end
  for _, s in ipairs(self.all_states) do s.group:finish_reduce() end
  self.in_backward = false
end

--- state:register_grad_hooks(): the post-accumulate-grad hook of each unsharded parameter
-- that requires grad (once, at fully_shard: the unsharded parameters are persistent). The
-- hooks hold the state weakly (Note [fsdp lifetimes] in ddplua.distributed.fsdp).
function FSDPState:register_grad_hooks()
  local ref = setmetatable({ state = self }, { __mode = "v" }) -- Note [fsdp lifetimes]
  for _, fp in ipairs(self.group.params) do
    if fp.requires_grad then
      fp.unsharded:register_post_accumulate_grad_hook(function()
        local s = ref.state
        if s and s.group:grad_ready() then s:post_backward() end
      end)
    end
  end
end

return FSDPState
