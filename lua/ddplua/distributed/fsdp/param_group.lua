--- ddplua.distributed.fsdp.param_group: FSDPParamGroup, the parameters one fully_shard call
-- manages, gathered and reduced together (as PyTorch's FSDPParamGroup): one all-gather of
-- the group's flat padded shards before its forward (and again before its backward when it
-- was resharded), one reduce-scatter of its flat padded gradients after its backward
-- (Note [fsdp sharding] in ddplua.distributed.fsdp.fsdp_param).
--
-- States: "sharded" (the shards are registered, the unsharded storages freed), "gathering"
-- (an all-gather is in flight: a prefetch), "unsharded" (the unsharded parameters are
-- registered and hold the gathered values). unshard() issues the all-gather (asynchronously:
-- a prefetch returns at once), wait_for_unshard() waits for it and copies out; both do
-- nothing when there is nothing to do, so the pre-forward of a recomputation (activation
-- checkpointing) costs nothing when the group is already unsharded.
--
-- Note [fsdp no sync]: with set_requires_gradient_sync(false) the post-backward keeps each
-- unsharded gradient (fp.accumulated_grad, the parameter's full shape) and reshards the
-- parameter; the next synced backward adds its gradient to the kept one and reduce-scatters
-- the sum, so k micro-batches reduce once, as one big batch would (PyTorch FSDP2's
-- unsharded_accumulated_grad).
local lib = require "ddplua.lib"
local dl = require "ddplua.functions"
local clock = require "ddplua.clock"
local c10d = require "ddplua.distributed.distributed_c10d"

local FSDPParamGroup = {}
FSDPParamGroup.__index = FSDPParamGroup

--- FSDPParamGroup.new(fsdp_params, group, opts) -> the group of a list of FSDPParams.
-- group: the process group the parameters are sharded over (the mesh's); opts.param_dtype
-- and opts.reduce_dtype: the mixed-precision dtypes (nil: the parameters' own);
-- opts.reshard_after_forward (boolean). Each parameter's place in the flat shard is the sum
-- of the padded sizes before it; the flat shard's dtype is param_dtype (or the first
-- parameter's dtype; all must agree without a param_dtype).
function FSDPParamGroup.new(fsdp_params, group, opts)
  local self = setmetatable({
    params = fsdp_params, group = group, state = "sharded",
    reshard_after_forward = opts.reshard_after_forward,
    world = c10d.get_world_size(group),
    requires_gradient_sync = true,
    all_gather_wait_s = 0, -- seconds spent blocked on this group's all-gathers (exposed)
    offsets = {}, flat_numel = 0, n_need_grad = 0, n_ready = 0,
  }, FSDPParamGroup)
  local dtype = opts.param_dtype
  for i, fp in ipairs(fsdp_params) do
    dtype = dtype or fp.dtype
    if fp.param_dtype ~= dtype then
      lib.raise(("fully_shard: parameters of one module must share a dtype (or set "
        .. "mp_policy.param_dtype): '%s' is %s, an earlier one %s"):format(fp.infos[1][2], fp.param_dtype, dtype))
    end
    self.offsets[i] = self.flat_numel
    self.flat_numel = self.flat_numel + fp.padded_numel
    if fp.requires_grad then self.n_need_grad = self.n_need_grad + 1 end
  end
  self.dtype = dtype
  self.reduce_dtype = opts.reduce_dtype or dtype
  self.device = fsdp_params[1] and fsdp_params[1].sharded.device or "cpu"
  return self
end

--- g:unshard(async): start the all-gather of the group's flat shards unless the group is
-- already unsharded or gathering. async (default false) returns at once (a prefetch);
-- otherwise this waits and copies out too (wait_for_unshard).
function FSDPParamGroup:unshard(async)
  if self.state == "sharded" and #self.params > 0 then
    local S = self.flat_numel
    local input = dl.zeros({ S }, { dtype = self.dtype, device = self.device })
    for i, fp in ipairs(self.params) do fp:copy_in(input, self.offsets[i]) end
    local output = dl.empty({ S * self.world }, { dtype = self.dtype, device = self.device })
    self.gather = { input = input, output = output,
      work = c10d.all_gather_into_tensor(output, input, { group = self.group, async_op = true }) }
    self.state = "gathering"
  end
  if not async then self:wait_for_unshard() end
end

--- g:wait_for_unshard(): finish an all-gather started by unshard (wait, copy out into the
-- unsharded parameters, free the buffers) and register the unsharded parameters. The time
-- blocked in the wait is added to g.all_gather_wait_s (seconds): the all-gather time that
-- computation did not hide (bench/fsdp.lua reports it with prefetch on and off).
function FSDPParamGroup:wait_for_unshard()
  if self.state == "gathering" then
    local gather = self.gather
    self.gather = nil
    local t0 = clock.now()
    gather.work:wait()
    self.all_gather_wait_s = self.all_gather_wait_s + (clock.now() - t0)
    dl.no_grad(function()
      for i, fp in ipairs(self.params) do
        local version = fp:alloc_unsharded()
        fp:copy_out(gather.output, self.flat_numel, self.offsets[i], version)
      end
    end)
    gather.input:free()
    gather.output:free()
    self.state = "unsharded"
  end
  if self.state == "unsharded" then
    for _, fp in ipairs(self.params) do fp:to_unsharded() end
  end
end

--- g:reshard(): register the shards again and free the unsharded storages (waits for an
-- all-gather in flight first). Safe to call in any state.
function FSDPParamGroup:reshard()
  if self.state == "gathering" then self:wait_for_unshard() end
  for _, fp in ipairs(self.params) do
    fp:to_sharded()
    if fp.is_unsharded then fp:free_unsharded() end
  end
  self.state = "sharded"
end

--- g:reset_backward(): forget which gradients arrived (before a backward).
function FSDPParamGroup:reset_backward()
  self.n_ready = 0
  self.post_backward_done = false
end

--- g:grad_ready() -> true when this was the last gradient of the group that requires one
-- (called by each unsharded parameter's post-accumulate-grad hook).
function FSDPParamGroup:grad_ready()
  self.n_ready = self.n_ready + 1
  return self.n_ready == self.n_need_grad
end

--- g:post_backward(): the group's gradients are final. Without gradient sync, keep them
-- (Note [fsdp no sync]); else copy them into one flat padded buffer in reduce_dtype and
-- start its reduce-scatter (average over the group, asynchronous: finish_reduce completes
-- it). Then reshard. A parameter that received no gradient contributes zeros (every rank
-- issues the same collective). Runs once per backward.
function FSDPParamGroup:post_backward()
  if self.post_backward_done then return end
  self.post_backward_done = true
  if not self.requires_gradient_sync then
    for _, fp in ipairs(self.params) do
      if fp.requires_grad then fp:stash_unsharded_grad() end
    end
    self:reshard()
    return
  end
  local S, W = self.flat_numel, self.world
  local flat = dl.zeros({ S * W }, { dtype = self.reduce_dtype, device = self.device })
  local any = false
  dl.no_grad(function()
    for i, fp in ipairs(self.params) do
      if fp.requires_grad then
        local g = fp:take_unsharded_grad()
        if g then
          any = true
          fp:copy_grad_in(flat, S, self.offsets[i], g)
          g:free()
        end
      end
    end
  end)
  self:reshard()
  if not any then -- nothing reached this group in this backward: no gradient to give
    flat:free()
    return
  end
  local out = dl.empty({ S }, { dtype = self.reduce_dtype, device = self.device })
  self.reduce = { input = flat, output = out,
    work = c10d.reduce_scatter_tensor(out, flat, { op = "avg", group = self.group, async_op = true }) }
end

--- g:finish_reduce(): wait for the reduce-scatter started by post_backward and add each
-- parameter's reduced rows into its shard's .grad. Does nothing without one.
function FSDPParamGroup:finish_reduce()
  local r = self.reduce
  if not r then return end
  self.reduce = nil
  r.work:wait()
  r.input:free()
  dl.no_grad(function()
    for i, fp in ipairs(self.params) do
      if fp.requires_grad then fp:accumulate_sharded_grad(r.output, self.offsets[i]) end
    end
  end)
  r.output:free()
end

return FSDPParamGroup
