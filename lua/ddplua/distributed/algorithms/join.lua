--- ddplua.distributed.algorithms.join: the generic join context for training with uneven
-- inputs, after PyTorch's torch/distributed/algorithms/join.py (Join, Joinable, JoinHook).
--
--   local Join = require "ddplua.distributed.algorithms.join"
--   Join({model, zero_optim}, {throw_on_early_termination = false}):run(function()
--     for _, batch in ipairs(my_batches) do      -- ranks may hold different counts
--       loss_of(model, batch):backward(); zero_optim:step()
--     end
--   end)                                         -- every rank gets here, none hangs
--
-- Lua has no `with`: the context is the function given to run. While fn runs, each joinable
-- calls Join.notify_join_context(self) once per iteration before its own collectives (DDP
-- does it in forward), which runs the presence all-reduce (a 1 from every rank that still
-- has data). A rank whose fn returned has "joined": it loops, all-reducing a 0 to match the
-- others' presence all-reduce, and while some rank has not joined runs every joinable's
-- main hook, which shadows that joinable's collectives of one iteration. Once the presence
-- sum is 0 every rank has joined and each runs the post hooks (DDP: the last joiner's model
-- is broadcast to all).
--
-- The Joinable protocol (duck-typed; DistributedDataParallel and ZeroRedundancyOptimizer
-- implement it):
--   joinable:join_hook(opts)     -> a JoinHook: {main_hook = function() end,
--                                   post_hook = function(is_last_joiner) end}, either nil;
--                                   opts: the extra options given to Join (the same table
--                                   for every joinable)
--   joinable:join_device()       -> device ordinal of the presence all-reduce (-1: CPU)
--   joinable:join_process_group()-> the ddplua.distributed group (the same for all)
--   joinable.JOIN_HOOK_OPTIONS   (optional) list of the option names its join_hook reads;
--                                   Join raises on an option no joinable declares, so a
--                                   join_hook ignores the options it does not read (they
--                                   may be another joinable's)
-- Join sets joinable._join_config = {enable, throw_on_early_termination, is_first_joinable}
-- while run is under way and restores the previous value (nil: disabled) when it returns
-- or raises, so outside run a joinable behaves as if no Join existed.
local lib = require "ddplua.lib"
local options = require "ddplua.options"

local raise = lib.raise

local Join = {}
Join.__index = Join

--- Join.WARN_THRESHOLD: main-hook iterations after which a joined rank warns (once) that
-- the inputs are this skewed (PyTorch's value).
Join.WARN_THRESHOLD = 1000

--- Join.THROW_MESSAGE: what a non-joined rank raises under throw_on_early_termination once
-- some rank exhausted its inputs (PyTorch's text).
Join.THROW_MESSAGE = "Detected at least one rank that exhausted inputs. Throwing across all ranks."

local DISABLED = { enable = false, throw_on_early_termination = false, is_first_joinable = false }

--- Join.disabled_join_config() -> the config of a joinable outside any Join (PyTorch's
-- _JoinConfig.construct_disabled_join_config). A fresh table each call.
function Join.disabled_join_config()
  return { enable = false, throw_on_early_termination = false, is_first_joinable = false }
end

--- Join.JoinHook(t) -> t with missing main_hook / post_hook filled by functions doing nothing
-- (PyTorch's JoinHook base class). Raises when a given hook is not a function.
function Join.JoinHook(t)
  t = t or {}
  for _, k in ipairs { "main_hook", "post_hook" } do
    if t[k] == nil then
      t[k] = function() end
    elseif type(t[k]) ~= "function" then
      raise(("JoinHook: %s must be a function, got %s"):format(k, type(t[k])))
    end
  end
  return t
end

local function is_joinable(j)
  return type(j) == "table" and type(j.join_hook) == "function" and
         type(j.join_device) == "function" and type(j.join_process_group) == "function"
end

-- Split Join's arguments into (joinables, opts). Accepted: Join(list, opts),
-- Join{list, enable = ...}, Join{j1, j2, enable = ...}.
local function split_args(a, b)
  if type(a) ~= "table" then
    raise("Join: expected a list of joinables, got " .. type(a))
  end
  if b ~= nil then
    if type(b) ~= "table" then raise("Join: options must be a table, got " .. type(b)) end
    return a, b
  end
  if is_joinable(a) then return { a }, {} end
  local list, opts = a, {}
  if type(a[1]) == "table" and not is_joinable(a[1]) then list = a[1] end
  for k, v in pairs(a) do
    if type(k) ~= "number" then opts[k] = v end
  end
  if list ~= a then
    for k in pairs(a) do
      if type(k) == "number" and k ~= 1 then raise("Join: give the joinables as one list") end
    end
  end
  return list, opts
end

--- Join(joinables, opts) / Join{joinables, enable = true, ...} / Join{j1, j2, ...} -> the
-- join context. joinables: a non-empty list of Joinables (their hooks run in that order).
-- opts: enable = true (false: run only calls fn; use it when the inputs are known to be
-- even), throw_on_early_termination = false (true: once a rank runs out of inputs every rank
-- raises: the non-joined ones Join.THROW_MESSAGE, the joined one "Rank R exhausted all
-- inputs."), and any option of the joinables' hooks (DistributedDataParallel:
-- divide_by_initial_world_size), passed to every joinable:join_hook(opts).
-- Calls join_hook of each joinable now (as PyTorch's constructor). Raises for an empty list
-- ("The join context manager requires at least one joinable", PyTorch's text), a value that
-- is no Joinable, joinables of different process groups ("Using join context manager with
-- multiple process groups"), or an option no joinable declares.
function Join.new(a, b)
  local joinables, opts = split_args(a, b)
  if #joinables == 0 then raise("The join context manager requires at least one joinable") end
  local names = { "enable", "throw_on_early_termination" }
  for i, j in ipairs(joinables) do
    if not is_joinable(j) then
      raise(("Join: joinable %d is not a Joinable (it needs join_hook, join_device and " ..
             "join_process_group methods), got %s"):format(i, type(j)))
    end
    for _, name in ipairs(j.JOIN_HOOK_OPTIONS or {}) do names[#names + 1] = name end
  end
  options.check("Join", opts, options.known(names))
  local enable = opts.enable
  if enable == nil then enable = true end
  local hook_opts = {}
  for k, v in pairs(opts) do
    if k ~= "enable" and k ~= "throw_on_early_termination" then hook_opts[k] = v end
  end
  local self = setmetatable({
    joinables = joinables,
    enable = enable and true or false,
    throw_on_early_termination = opts.throw_on_early_termination and true or false,
    hooks = {},
  }, Join)
  for i, j in ipairs(joinables) do self.hooks[i] = Join.JoinHook(j:join_hook(hook_opts)) end
  -- The process group and device of the context's own all-reduces (PyTorch's
  -- _extract_dist_info): one group for all, the first joinable's device.
  for _, j in ipairs(joinables) do
    local g = j:join_process_group()
    if self.process_group == nil then
      self.process_group = g
    elseif self.process_group ~= g then
      raise("Using join context manager with multiple process groups")
    end
    if self.device == nil then self.device = j:join_device() end
  end
  if type(self.process_group) ~= "table" or type(self.process_group.rank) ~= "function" then
    raise("Join: join_process_group() must return a process group, got " .. type(self.process_group))
  end
  self.rank = self.process_group:rank()
  return self
end

setmetatable(Join, { __call = function(_, a, b) return Join.new(a, b) end })

local function dist() return require "ddplua.distributed.distributed_c10d" end

-- A (1,) f32 tensor holding v on `device` (-1: the CPU).
local function scalar(v, device)
  local dl = require "ddplua.functions"
  local o = device ~= nil and device >= 0 and { device = device } or nil
  return v == 0 and dl.zeros({ 1 }, o) or dl.full({ 1 }, v, o)
end

--- Join.notify_join_context(joinable) -> Work, tensor (or nil): called by a joinable once per
-- iteration before its own collectives: tells the joined ranks this rank has not joined by
-- an asynchronous SUM all-reduce of 1 over the joinable's group; the returned (1,) f32
-- tensor holds the number of non-joined ranks once the Work is waited for. Does nothing
-- (returns nil) unless the joinable is the first of an enabled Join under way. With
-- throw_on_early_termination, also all-reduces a 0 (blocking) that a joined rank answers
-- with a 1, and raises Join.THROW_MESSAGE when it is not 0. As PyTorch's
-- Join.notify_join_context.
function Join.notify_join_context(joinable)
  local cfg = joinable._join_config
  if not cfg or not cfg.enable or not cfg.is_first_joinable then return nil end
  local device, group = joinable:join_device(), joinable:join_process_group()
  local ones = scalar(1, device)
  local work = dist().all_reduce(ones, { group = group, async_op = true })
  if cfg.throw_on_early_termination then
    local zeros = scalar(0, device)
    dist().all_reduce(zeros, { group = group })
    if zeros:item() ~= 0 then raise(Join.THROW_MESSAGE) end
  end
  return work, ones
end

-- The number of non-joined ranks, answering their presence all-reduce with a 0
-- (PyTorch's _get_num_nonjoined_procs).
function Join:_get_num_nonjoined_procs()
  local t = scalar(0, self.device)
  dist().all_reduce(t, { group = self.process_group })
  return t:item()
end

-- Answer the non-joined ranks' throw check with a 1, then raise (PyTorch's
-- _notify_procs_to_terminate).
function Join:_notify_procs_to_terminate()
  dist().all_reduce(scalar(1, self.device), { group = self.process_group })
  raise(("Rank %d exhausted all inputs."):format(self.rank))
end

-- After fn returned on this rank: run the main hooks until every rank joined, then the
-- post hooks (PyTorch's Join.__exit__).
function Join:_join_loop()
  local is_last_joiner, i, warned = true, 0, false
  while true do
    if i > Join.WARN_THRESHOLD and not warned then
      warned = true
      io.stderr:write(("Warning: Detected uneven input skew of greater than %d. This means that " ..
        "rank %d has at least %d fewer inputs than other currently-active ranks. This level of " ..
        "skew could lead to performance degradation during training.\n"):format(
        Join.WARN_THRESHOLD, self.rank, Join.WARN_THRESHOLD))
    end
    if self:_get_num_nonjoined_procs() == 0 then break end
    if self.throw_on_early_termination then self:_notify_procs_to_terminate() end
    for _, h in ipairs(self.hooks) do h.main_hook() end
    is_last_joiner = false
    i = i + 1
  end
  for _, h in ipairs(self.hooks) do h.post_hook(is_last_joiner) end
end

local function pack(...) return { n = select("#", ...), ... } end

--- join:run(fn, ...) -> fn's results: run fn(...) (the training loop) inside the context;
-- when it returns, shadow the other ranks until all joined, then run the post hooks
-- (module description above). Collective: every rank of the group calls it. An error in fn
-- propagates at once (no shadowing, as PyTorch's __exit__ with an exception); errors of the
-- shadowing (a timeout, the early-termination error) propagate too. The joinables' configs
-- are restored in every case.
function Join:run(fn, ...)
  if type(fn) ~= "function" then raise("Join:run: expected a function, got " .. type(fn)) end
  local saved = {}
  for i, j in ipairs(self.joinables) do
    saved[i] = rawget(j, "_join_config") or DISABLED
    j._join_config = { enable = self.enable, throw_on_early_termination = self.throw_on_early_termination,
                       is_first_joinable = i == 1 }
  end
  local function restore()
    for i, j in ipairs(self.joinables) do j._join_config = saved[i] end
  end
  local res = pack(pcall(fn, ...))
  if res[1] and self.enable then
    local ok, err = pcall(self._join_loop, self)
    if not ok then res = { false, err, n = 2 } end
  end
  restore()
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

return Join
