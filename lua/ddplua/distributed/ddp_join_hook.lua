--- ddplua.distributed.ddp_join_hook: DistributedDataParallel's side of uneven inputs (the
-- Joinable protocol of ddplua.distributed.algorithms.join), after PyTorch's _DDPJoinHook and
-- DistributedDataParallel._check_global_requires_backward_grad_sync,
-- _check_and_sync_module_buffers, _find_common_rank and _sync_final_model
-- (torch/nn/parallel/distributed.py). The collectives each side runs per iteration are
-- Note [join shadow iteration] (ddplua/reducer_join.h); this module holds both sides:
--   DDPJoinHook.pre_forward(ddp, grad)  a non-joined rank's forward under an enabled Join
--   DDPJoinHook.new(ddp, opts)          the hook a joined rank runs (main_hook, post_hook)
local lib = require "ddplua.lib"
local dl = require "ddplua.functions"
local Join = require "ddplua.distributed.algorithms.join"
local ffi, C = lib.ffi, lib.C
local check, raise = lib.check, lib.raise

local DDPJoinHook = {}
DDPJoinHook.__index = DDPJoinHook

--- DDPJoinHook.OPTIONS: the join_hook options DistributedDataParallel reads.
DDPJoinHook.OPTIONS = { "divide_by_initial_world_size", "comm_hook_divide_by_non_joined" }

local work_box = ffi.new("ddp_work*[1]")
local tbox = ffi.new("ddp_tensor*[1]")

-- SUM all-reduce of the list `values` (small integers, exact in f32) over ddp's group,
-- labelled `label` (Note [collective fingerprints]); returns the summed list. f32 SUM because
-- it takes the shared-memory path between ranks of one host (about 16 us here, where an i64
-- MAX over Gloo's TCP path took 2 ms). nccl: through the group's device, the host waiting
-- for the result it reads.
local function allreduce_sum(ddp, values, label)
  local t = dl.zeros({ #values })
  local p = ffi.cast("float*", C.ddp_tensor_data(t))
  for i = 1, #values do p[i - 1] = values[i] end
  local h = ddp.process_group:ptr(label)
  local dev = C.ddp_pg_device(h)
  C.ddp_pg_set_call_site(label, 0)
  if dev >= 0 then
    check(C.ddp_tensor_to_device(tbox, t, dev, 0))
    local td = lib.wrap(tbox[0])
    check(C.ddp_pg_allreduce(work_box, h, td, C.DDP_REDUCE_SUM))
    local w = ffi.gc(work_box[0], C.ddp_work_free)
    check(C.ddp_work_synchronize(w, 0))
    check(C.ddp_copy_(t, td))
  else
    check(C.ddp_pg_allreduce(nil, h, t, C.DDP_REDUCE_SUM))
  end
  local out = {}
  for i = 1, #values do out[i] = p[i - 1] end
  return out
end

-- The highest group rank r whose `offer` was true on it: one SUM all-reduce of the one-hot
-- rows {offer and rank == r} over r (PyTorch's _find_common_rank is a MAX all-reduce), after
-- `head` (a list of counts summed in the same all-reduce). Returns the rank (-1: none) and
-- the summed head.
local function common_rank(ddp, offer, head, label)
  local values = {}
  for i, v in ipairs(head) do values[i] = v end
  local base = #values
  for r = 0, ddp.world_size - 1 do values[base + r + 1] = (offer and r == ddp.rank) and 1 or 0 end
  local sums = allreduce_sum(ddp, values, label)
  local root = -1
  for r = 0, ddp.world_size - 1 do
    if sums[base + r + 1] > 0 then root = r end
  end
  local summed = {}
  for i = 1, base do summed[i] = sums[i] end
  return root, summed
end

-- The join state all-reduce of Note [join shadow iteration]: over the ranks, whether some
-- rank synchronises this backward, whether some has grad enabled, and the highest rank that
-- offered itself as the authoritative copy (a joined rank offers nothing). PyTorch runs this
-- as two all-reduces (_check_global_requires_backward_grad_sync and _find_common_rank); one
-- carries both. Returns sync, grad, authoritative rank, and the number of ranks that
-- synchronise (the non-joined ranks, when they agree on no_sync).
local function join_state(ddp, sync, grad, offer)
  local root, s = common_rank(ddp, offer, { sync and 1 or 0, grad and 1 or 0 },
                              "DistributedDataParallel join state")
  return s[1] > 0, s[2] > 0, root, math.floor(s[1] + 0.5)
end

-- Note [join divisor with a comm hook]: divide_by_initial_world_size chooses the divisor of
-- the reducer's own all-reduce. A communication hook divides the bucket itself, and
-- PyTorch's built-in hooks (allreduce_hook, the fp16/bf16 compress hooks and wrappers,
-- PowerSGD) always divide by their process group's size: in PyTorch 1.13 a hook run under
-- join with divide_by_initial_world_size = False trains exactly as the run without a hook
-- with True (checked with Debian's torch, 2 gloo ranks, uneven inputs). ddplua does the
-- same by default: with a hook registered the join sets no divisor (ddp_reducer_set_divide_
-- factor stays 0, so reducer_comm_hook.c's hook_divisor is the group's size).
-- comm_hook_divide_by_non_joined = true (ddplua's own, with divide_by_initial_world_size =
-- false) makes the built-in hooks divide by the ranks still training instead, as the
-- no-hook run with false: the divisor is set as without a hook, and the joined rank's
-- shadow divides as the others do (PowerSGD's state stays in step). A hook written in Lua
-- divides as it chooses, so that option is refused with one rather than silently ignored.

-- Whether this join's divisor applies to `ddp`'s reducer: always without a hook; with a
-- built-in hook only under comm_hook_divide_by_non_joined (Note [join divisor with a comm
-- hook]).
local function divisor_applies(ddp)
  return C.ddp_reducer_comm_hook_kind(ddp.reducer) == C.DDP_COMM_HOOK_NONE
      or ddp._comm_hook_divide_by_non_joined == true
end

local function check_lua_hook_divisor(ddp, where)
  if ddp._comm_hook_divide_by_non_joined and ddp.reducer ~= nil
     and C.ddp_reducer_comm_hook_kind(ddp.reducer) == C.DDP_COMM_HOOK_FRONT_END then
    raise(where .. ": comm_hook_divide_by_non_joined = true cannot be combined with a " ..
          "communication hook written in Lua (the hook chooses its own divisor); leave the " ..
          "option out (the hook divides as in PyTorch) or use a built-in hook (default_hooks, " ..
          "powerSGD_hook)")
  end
end
DDPJoinHook.check_lua_hook_divisor = check_lua_hook_divisor

-- A joined rank's side of a hook written in Lua (Note [join shadow with a comm hook]): the
-- hook on a zero GradBucket per bucket, in bucket order, then every Future waited for in
-- bucket order, as the non-joined ranks' backward runs it (DDP:_run_comm_hook). The values
-- are dropped: the joined rank's gradients stay as they were.
local function shadow_lua_hook(ddp)
  local h, r = ddp._comm_hook, ddp.reducer
  local GradBucket = require "ddplua.distributed.algorithms.ddp_comm_hooks.grad_bucket"
  local futures = require "ddplua.futures"
  local pending = {}
  for k = 0, C.ddp_reducer_num_buckets(r) - 1 do
    local fut = h.hook(h.state, GradBucket.zeros_like(r, k, ddp.params))
    if not futures.is_future(fut) then
      raise(("register_comm_hook: the hook must return a Future (ddplua.futures) of the reduced " ..
             "bucket, got %s for zero bucket %d on joined rank %d"):format(type(fut), k, ddp.rank))
    end
    pending[#pending + 1] = fut
  end
  for _, fut in ipairs(pending) do fut:wait() end
end

-- Broadcast `tensors` from group rank `root` (in place, no autograd).
local function broadcast_from(ddp, tensors, root, label)
  local h = ddp.process_group:ptr(label)
  dl.no_grad(function()
    for _, t in ipairs(tensors) do
      C.ddp_pg_set_call_site(label, 0)
      check(C.ddp_pg_broadcast(nil, h, t, root))
    end
  end)
end

--- DDPJoinHook.pre_forward(ddp, grad) -> the group rank whose buffers this forward
-- broadcasts. A non-joined rank's forward under an enabled Join (Note [join shadow
-- iteration]): the presence all-reduce (Join.notify_join_context; raises there under
-- throw_on_early_termination once a rank has joined), the gradient divisor of this
-- iteration (the number of non-joined ranks unless divide_by_initial_world_size; Note [join
-- divisor with a comm hook] when a hook is registered), and the
-- join state all-reduce telling the joined ranks whether to shadow the bucket rebuild
-- (`grad`: grad mode is on) and the backward (grad and not inside no_sync). As PyTorch's
-- DistributedDataParallel._pre_forward under join.
function DDPJoinHook.pre_forward(ddp, grad)
  local cfg = ddp._join_config
  if cfg and cfg.enable then check_lua_hook_divisor(ddp, "DistributedDataParallel.join") end
  local work, count = Join.notify_join_context(ddp)
  local div = 0
  if work and ddp._divide_by_initial_world_size == false and divisor_applies(ddp) then
    work:wait()
    div = math.floor(count:item() + 0.5)
  end
  check(C.ddp_reducer_set_divide_factor(ddp.reducer, div))
  local _, _, root = join_state(ddp, grad and ddp.require_backward_grad_sync, grad, true)
  return root
end

--- DDPJoinHook.new(ddp, opts) -> the JoinHook of DistributedDataParallel `ddp` (what
-- ddp:join_hook(opts) returns). opts.divide_by_initial_world_size = true: gradients divided
-- by the initial world size even when ranks have joined (every sample weighs the same);
-- false: by the number of non-joined ranks (parity with a smaller world). Neither changes
-- what a communication hook divides by: PyTorch's built-in hooks divide by their group's
-- size, and so do ddplua's (Note [join divisor with a comm hook]), unless
-- opts.comm_hook_divide_by_non_joined = true (ddplua only; needs divide_by_initial_world_size
-- = false) makes the built-in hooks divide by the non-joined ranks too. Other options are
-- ignored (Join checks them against every joinable's JOIN_HOOK_OPTIONS).
--   main_hook(): on a joined rank, once per iteration of the others: the join state
--     all-reduce, then as they do the bucket rebuild (when pending), the buffer broadcasts
--     from the highest non-joined rank (broadcast_buffers), and the backward's bucket
--     all-reduces over zeros and the used-parameter flags (ddp_reducer_join_shadow_backward);
--     with a communication hook, the hook on zero buckets instead of the bucket all-reduces
--     (Note [join shadow with a comm hook]).
-- Raises on a non-boolean option, on comm_hook_divide_by_non_joined = true without
-- divide_by_initial_world_size = false, and on comm_hook_divide_by_non_joined = true when a
-- hook written in Lua is registered (now or at a later forward under the join).
--   post_hook(is_last_joiner): every rank: the highest-ranked of the last joiners is the
--     authoritative copy; its parameters (and buffers, with broadcast_buffers) are
--     broadcast to every rank (PyTorch's _sync_final_model).
function DDPJoinHook.new(ddp, opts)
  -- Not options.check: Join passes every joinable the same table, checked against the
  -- union of their JOIN_HOOK_OPTIONS; the others' options are ignored here.
  if opts ~= nil and type(opts) ~= "table" then
    raise("DistributedDataParallel.join_hook: options must be a table, got " .. type(opts))
  end
  opts = opts or {}
  local divide = opts.divide_by_initial_world_size
  if divide == nil then divide = true end
  if type(divide) ~= "boolean" then
    raise("DistributedDataParallel.join_hook: divide_by_initial_world_size must be a boolean, got " ..
          type(divide))
  end
  local by_non_joined = opts.comm_hook_divide_by_non_joined
  if by_non_joined ~= nil and type(by_non_joined) ~= "boolean" then
    raise("DistributedDataParallel.join_hook: comm_hook_divide_by_non_joined must be a boolean, got " ..
          type(by_non_joined))
  end
  if by_non_joined and divide then
    raise("DistributedDataParallel.join_hook: comm_hook_divide_by_non_joined = true needs " ..
          "divide_by_initial_world_size = false (with true every divisor is the initial world size)")
  end
  ddp._divide_by_initial_world_size = divide
  ddp._comm_hook_divide_by_non_joined = by_non_joined or false
  check_lua_hook_divisor(ddp, "DistributedDataParallel.join_hook")
  local self = setmetatable({ ddp = ddp }, DDPJoinHook)
  -- Join calls the hooks as plain functions (the JoinHook protocol): closures over self.
  return { main_hook = function() return self:_main_hook() end,
           post_hook = function(is_last_joiner) return self:_post_hook(is_last_joiner) end }
end

function DDPJoinHook:_main_hook()
  local ddp = self.ddp
  local r = ddp.reducer
  if r == nil then raise("DistributedDataParallel.join: the DDP module was destroyed") end
  local sync, grad, root, n_sync = join_state(ddp, false, false, false)
  if grad then check(C.ddp_reducer_join_rebuild_buckets(r, nil)) end
  if ddp.broadcast_buffers and ddp.world_size > 1 and #ddp.buffers > 0 then
    broadcast_from(ddp, ddp.buffers, root, "DistributedDataParallel buffers")
  end
  if sync then
    -- divide as the non-joined ranks do (PowerSGD's state stays in step)
    if ddp._divide_by_initial_world_size == false and divisor_applies(ddp) then
      check(C.ddp_reducer_set_divide_factor(r, n_sync))
    end
    if ddp.world_size > 1 and C.ddp_reducer_comm_hook_kind(r) == C.DDP_COMM_HOOK_FRONT_END then
      shadow_lua_hook(ddp)
    end
    check(C.ddp_reducer_join_shadow_backward(r))
  end
end

function DDPJoinHook:_post_hook(is_last_joiner)
  local ddp = self.ddp
  if ddp.reducer ~= nil then check(C.ddp_reducer_set_divide_factor(ddp.reducer, 0)) end
  if ddp.world_size == 1 then return end
  local root = common_rank(ddp, is_last_joiner, {}, "DistributedDataParallel join final model")
  if root < 0 then
    raise("BUG! Expected rank_cond to be true for at least one process.")
  end
  local states = {}
  for _, p in ipairs(ddp.module:parameters()) do states[#states + 1] = p end
  if ddp.broadcast_buffers then
    for _, b in ipairs(ddp.buffers) do states[#states + 1] = b end
  end
  broadcast_from(ddp, states, root, "DistributedDataParallel join final model")
end

return DDPJoinHook
