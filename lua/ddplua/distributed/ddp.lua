--- ddplua.distributed.ddp: DistributedDataParallel, as torch.nn.parallel.DistributedDataParallel.
--
--   local DDP = require "ddplua.distributed.ddp"
--   dist.init_process_group{backend = "gloo"}
--   local model = DDP(Net(), {bucket_cap_mb = 25})
--   local loss = crit(model(x), y)          -- forward: broadcasts buffers, arms the reducer
--   loss:backward()                         -- gradients averaged over the ranks, overlapped
--   opt:step()
--
-- Construction is collective (every rank of the group calls it with the same model): it
-- checks that parameter names, dtypes and shapes agree on every rank, copies rank 0's
-- parameters and buffers to every rank, and builds the reducer (ddplua/reducer.h: buckets in
-- reverse parameter order, launched in index order, gradients divided by the world size before
-- the sum, rebuilt once in the order of the first iteration). Every forward with grad enabled
-- is then collective too. Parameters with requires_grad = false are not reduced (as PyTorch).
local options = require "ddplua.options"
local lib = require "ddplua.lib"
local dl = require "ddplua.functions"
local ffi, C = lib.ffi, lib.C
local check, raise = lib.check, lib.raise
local DDPJoinHook = require "ddplua.distributed.ddp_join_hook"
local OptimState = require "ddplua.optim.state"

local DDP = {}
DDP.__index = DDP

local MB = 1024 * 1024
--- PyTorch's bucket sizes: the first bucket 1 MiB, the others bucket_cap_mb (25 MiB).
DDP.FIRST_BUCKET_BYTES = 1 * MB
DDP.DEFAULT_BUCKET_CAP_MB = 25

local reducer_box = ffi.new("ddp_reducer*[1]")
local work_box = ffi.new("ddp_work*[1]")
local tbox = ffi.new("ddp_tensor*[1]")

-- t on CUDA device `dev` (t itself when it is there); differentiable.
local function to_device(t, dev)
  check(C.ddp_tensor_to_device(tbox, t, dev, 0))
  return lib.wrap(tbox[0])
end
local digest_box = ffi.new("uint64_t[1]")

-- ---- process group --------------------------------------------------------------------

local function dist_module() return require "ddplua.distributed.distributed_c10d" end

-- The group to reduce over: opts.process_group, else the default (world) group.
local function resolve_group(pg)
  if pg ~= nil then return pg end
  local dist = dist_module()
  if not dist.is_initialized() then
    raise("DistributedDataParallel: the default process group is not initialised (call " ..
          "dist.init_process_group first, or pass process_group =)")
  end
  return dist.get_default_group()
end

-- ---- small collectives on int64 rows (through the C process group directly) ----------

local function i64_tensor(values)
  local t = dl.zeros({ math.max(#values, 0) }, { dtype = "i64" })
  local p = ffi.cast("int64_t*", C.ddp_tensor_data(t))
  for i = 1, #values do p[i - 1] = values[i] end
  return t
end

-- All-gather the int64 list `values` (the same length on every rank) -> rows[rank + 1][i].
local function allgather_i64(self, values, op)
  local world = self.world_size
  local n = #values
  local t = i64_tensor(values)
  local out = dl.zeros({ world, math.max(n, 0) }, { dtype = "i64" })
  if n > 0 then
    local h = self.process_group:ptr(op)
    local dev = C.ddp_pg_device(h)
    if dev >= 0 then
      -- nccl reduces device memory: through the rank's device, the host waiting for the
      -- result it reads (synchronize polls the communicator: a dead peer raises).
      local od = to_device(out, dev)
      check(C.ddp_pg_allgather(work_box, h, od, to_device(t, dev)))
      local w = ffi.gc(work_box[0], C.ddp_work_free)
      check(C.ddp_work_synchronize(w, 0))
      check(C.ddp_copy_(out, od))
    else
      check(C.ddp_pg_allgather(nil, h, out, t))
    end
  end
  local p = ffi.cast("int64_t*", C.ddp_tensor_data(out))
  local rows = {}
  for r = 1, world do
    local row = {}
    for i = 1, n do row[i] = p[(r - 1) * n + i - 1] end
    rows[r] = row
  end
  return rows
end

local function shape_str(dims)
  local parts = {}
  for i, d in ipairs(dims) do parts[i] = tostring(d) end
  if #parts == 1 then return "(" .. parts[1] .. ",)" end
  return "(" .. table.concat(parts, ", ") .. ")"
end

local MAX_DIMS = 8
local RECORD = 3 + MAX_DIMS -- name digest, dtype, ndim, shape

local function record_of(name, p)
  local rec = { ffi.cast("int64_t", C.ddp_bytes_digest(name, #name)), C.ddp_tensor_dtype(p),
                C.ddp_tensor_dim(p) }
  local shape = C.ddp_tensor_shape(p)
  for d = 1, MAX_DIMS do rec[3 + d] = d <= rec[3] and shape[d - 1] or -1 end
  return rec
end

local function record_shape(rows, r, i)
  local base = (i - 1) * RECORD
  local dims = {}
  for d = 1, tonumber(rows[r][base + 3]) do dims[d] = tonumber(rows[r][base + 3 + d]) end
  return shape_str(dims)
end

-- Every rank must hold the same parameters (names, dtypes, shapes) in the same order.
local function check_same_parameters(self)
  local counts = allgather_i64(self, { #self.param_names }, "DistributedDataParallel")
  for r = 2, self.world_size do
    if counts[r][1] ~= counts[1][1] then
      raise(("DistributedDataParallel: the module has %d parameters on rank 0 but %d on rank %d")
            :format(tonumber(counts[1][1]), tonumber(counts[r][1]), r - 1))
    end
  end
  local flat = {}
  for i, name in ipairs(self.param_names) do
    for k, v in ipairs(record_of(name, self.params[i])) do flat[(i - 1) * RECORD + k] = v end
  end
  local rows = allgather_i64(self, flat, "DistributedDataParallel")
  local me = self.rank + 1
  for i, name in ipairs(self.param_names) do
    local base = (i - 1) * RECORD
    for r = 2, self.world_size do
      if rows[r][base + 1] ~= rows[1][base + 1] then
        raise(("DistributedDataParallel: parameter %d is named '%s' on rank %d but differently on rank %d")
              :format(i, name, me - 1, me == 1 and r - 1 or 0))
      end
      if rows[r][base + 2] ~= rows[1][base + 2] then
        raise(("DistributedDataParallel: parameter '%s' has dtype %s on rank 0 but %s on rank %d"):format(
          name, ffi.string(C.ddp_dtype_name(tonumber(rows[1][base + 2]))),
          ffi.string(C.ddp_dtype_name(tonumber(rows[r][base + 2]))), r - 1))
      end
      for k = 3, RECORD do
        if rows[r][base + k] ~= rows[1][base + k] then
          raise(("DistributedDataParallel: parameter '%s' has shape %s on rank 0 but %s on rank %d")
                :format(name, record_shape(rows, 1, i), record_shape(rows, r, i), r - 1))
        end
      end
    end
  end
end

-- ---- construction ---------------------------------------------------------------------

-- root: the group rank broadcasting (default 0; under join, Note [join shadow iteration]).
local function broadcast_from_0(self, tensors, op, root)
  local h = self.process_group:ptr(op)
  for _, t in ipairs(tensors) do check(C.ddp_pg_broadcast(nil, h, t, root or 0)) end
end

local function option(opts, name, default)
  local v = opts[name]
  if v == nil then return default end
  return v
end

-- ---- device mesh -----------------------------------------------------------------------

-- The group DDP reduces over when opts.device_mesh is given, after PyTorch's DDP
-- constructor: process_group and device_mesh exclude each other, the mesh must be 1-D (a
-- DeviceMesh from dist.init_device_mesh), and its one group is used.
local function device_mesh_group(opts)
  local mesh = opts.device_mesh
  if opts.process_group ~= nil then
    raise("DistributedDataParallel: Cannot specify both process_group and device_mesh arguments.")
  end
  local DeviceMesh = require "ddplua.distributed.device_mesh"
  if not DeviceMesh.is_device_mesh(mesh) then
    raise("DistributedDataParallel: device_mesh must be a DeviceMesh from dist.init_device_mesh, got " ..
          (type(mesh) == "table" and tostring(mesh) or type(mesh)))
  end
  if mesh.ndim ~= 1 then
    raise(("DistributedDataParallel: Only 1D device mesh is supported, but got %s."):format(tostring(mesh)))
  end
  return mesh:get_group()
end

local KNOWN = options.known { "process_group", "bucket_cap_mb", "find_unused_parameters", "broadcast_buffers", "gradient_as_bucket_view", "timeout", "device_ids", "output_device", "device_mesh",
  "static_graph", "comm_overlap" }

-- Every rank must all-reduce its buckets at the same point of the backward: with other
-- collectives during it (SyncBatchNorm's backward), ranks that overlap differently would
-- submit them in different orders. So the ranks check that they agree (a collective, at
-- construction) and raise, naming each rank's setting, when they do not.
local function agree_comm_overlap(self)
  local rows = allgather_i64(self, { self.comm_overlap and 1 or 0 }, "DistributedDataParallel")
  local differ = false
  for r = 2, self.world_size do differ = differ or rows[r][1] ~= rows[1][1] end
  if differ then
    local parts = {}
    for r = 1, self.world_size do parts[r] = ("rank %d %s"):format(r - 1, tostring(rows[r][1] == 1)) end
    raise("DistributedDataParallel: comm_overlap differs across ranks (" .. table.concat(parts, ", ") ..
          "): every rank must all-reduce its buckets at the same point of the backward")
  end
end

--- DDP(module, opts) -> the wrapped module. opts:
--   process_group (default: the world), device_mesh (a 1-D DeviceMesh from
--   dist.init_device_mesh, or a slice mesh["dp"] of a larger one: DDP reduces over its
--   group; not together with process_group,
--   and a mesh of more dimensions raises "Only 1D device mesh is supported", as PyTorch),
--   bucket_cap_mb = 25 (MiB per bucket; the first
--   bucket is min(1 MiB, bucket_cap_mb)), find_unused_parameters = false (mark parameters that got no gradient
--   ready with zeros at the end of backward; otherwise such an iteration makes the next
--   forward fail naming them), broadcast_buffers = true (rank 0's buffers copied to every
--   rank before each forward), gradient_as_bucket_view = false (param.grad views into the
--   buckets: no copy back), timeout (seconds for each bucket's all-reduce; default: the
--   group's), device_ids (as PyTorch for a single-device module: nil, or a list of ONE
--   device, "cuda:k" or k, where the module's parameters already are: one device per
--   process; positional tensor inputs of forward are then moved there; output_device is
--   accepted and must be that device too), static_graph = false (the graph is the same
--   every iteration: hook counts and unused parameters recorded in the first iteration, no
--   search after it; reentrant backward and parameters whose hooks fire more than once work;
--   ddplua/reducer_static_graph.h, Note [static graph]), comm_overlap = true (each
--   bucket's all-reduce runs on the group's communication thread while the backward goes
--   on, as PyTorch, the last one on the backward's thread; false: every bucket is
--   all-reduced after the backward, on its thread, one after the other, which may suit a
--   host whose ranks oversubscribe its cores: measure; every rank must give the same value;
--   the same bits either way; ddplua/reducer.h, Note [bucket overlap], Note [last bucket
--   inline]).
-- Device modules: every parameter on one CUDA device (mixed devices raise); the buckets live
-- on that device (ddplua/reducer.h, Note [device buckets]). With the nccl backend the group's
-- device must be the module's; with gloo, device gradients are staged through the host.
-- Raises when the ranks' parameters differ (naming the first one and the ranks).
function DDP.new(module, opts)
  opts = options.check("DistributedDataParallel", opts, KNOWN)
  if type(module) ~= "table" or type(module.parameters) ~= "function" then
    raise("DistributedDataParallel: module must be an nn.Module, got " .. type(module))
  end
  if opts.comm_overlap ~= nil and type(opts.comm_overlap) ~= "boolean" then
    raise("DistributedDataParallel: comm_overlap must be true or false, got " .. tostring(opts.comm_overlap))
  end
  local group = opts.device_mesh ~= nil and device_mesh_group(opts) or resolve_group(opts.process_group)
  local h = group:ptr("DistributedDataParallel")
  local self = setmetatable({
    module = module,
    process_group = group,
    device_mesh = opts.device_mesh,
    rank = C.ddp_pg_rank(h),
    world_size = C.ddp_pg_size(h),
    find_unused_parameters = option(opts, "find_unused_parameters", false),
    broadcast_buffers = option(opts, "broadcast_buffers", true),
    gradient_as_bucket_view = option(opts, "gradient_as_bucket_view", false),
    bucket_cap_mb = option(opts, "bucket_cap_mb", DDP.DEFAULT_BUCKET_CAP_MB),
    static_graph = option(opts, "static_graph", false),
    require_backward_grad_sync = true,
  }, DDP)
  if type(self.bucket_cap_mb) ~= "number" or not (self.bucket_cap_mb > 0) then
    raise("DistributedDataParallel: bucket_cap_mb must be a number > 0, got " .. tostring(self.bucket_cap_mb))
  end
  local timeout = opts.timeout or tonumber(C.ddp_pg_get_timeout(h))
  self.params, self.param_names = {}, {}
  for name, p in module:named_parameters() do
    if p.requires_grad then
      self.params[#self.params + 1] = p
      self.param_names[#self.params] = name
    end
  end
  self.device = #self.params > 0 and C.ddp_tensor_device(self.params[1]) or -1
  self.device_ids = DDP.check_device_ids(opts.device_ids, opts.output_device, self.device)
  self.buffers, self.buffer_names = {}, {}
  for name, b in module:named_buffers() do
    self.buffers[#self.buffers + 1] = b
    self.buffer_names[#self.buffers] = name
  end
  if self.world_size > 1 then
    check_same_parameters(self)
    dl.no_grad(function()
      broadcast_from_0(self, self.params, "DistributedDataParallel")
      broadcast_from_0(self, self.buffers, "DistributedDataParallel")
    end)
  end
  local n = #self.params
  local arr = ffi.new("ddp_tensor*[?]", math.max(n, 1))
  for i = 1, n do arr[i - 1] = self.params[i] end
  local cap = math.floor(self.bucket_cap_mb * MB + 0.5)
  cap = math.max(cap, 1)
  -- The first bucket is small so the first all-reduce starts early; a cap below it wins.
  check(C.ddp_reducer_new(reducer_box, h, arr, n, cap, math.min(DDP.FIRST_BUCKET_BYTES, cap),
                          self.find_unused_parameters and 1 or 0,
                          self.gradient_as_bucket_view and 1 or 0, timeout))
  self.reducer = ffi.gc(reducer_box[0], C.ddp_reducer_free)
  if self.static_graph then check(C.ddp_reducer_set_static_graph(self.reducer)) end
  self.comm_overlap = option(opts, "comm_overlap", true)
  if self.world_size > 1 then agree_comm_overlap(self) end
  check(C.ddp_reducer_set_overlap(self.reducer, self.comm_overlap and 1 or 0))
  return self
end

local function device_of(d, what)
  if type(d) == "number" and d >= 0 and d == math.floor(d) then return d end
  local k = type(d) == "string" and d:match("^cuda:(%d+)$")
  if k then return tonumber(k) end
  raise(("DistributedDataParallel: %s must name a CUDA device ('cuda:0' or 0), got %s"):format(what, tostring(d)))
end

local function device_name(d) return d < 0 and "cpu" or ("cuda:" .. d) end

--- DDP.check_device_ids(device_ids, output_device, params_device) -> the device ordinal of
-- device_ids (nil when none given). PyTorch's rules for one device per process.
function DDP.check_device_ids(device_ids, output_device, params_device)
  if device_ids == nil then return nil end
  if type(device_ids) ~= "table" then
    raise("DistributedDataParallel: device_ids must be a list with one device, got " .. type(device_ids))
  end
  if #device_ids ~= 1 then
    raise(("DistributedDataParallel: device_ids must list exactly one device (one device per process), got %d")
          :format(#device_ids))
  end
  local d = device_of(device_ids[1], "device_ids[1]")
  if params_device ~= d then
    raise(("DistributedDataParallel: device_ids is {%s} but the module's parameters are on %s (move the module there first)")
          :format(device_name(d), device_name(params_device)))
  end
  if output_device ~= nil and device_of(output_device, "output_device") ~= d then
    raise(("DistributedDataParallel: output_device %s differs from device_ids {%s}"):format(
      tostring(output_device), device_name(d)))
  end
  return d
end

setmetatable(DDP, { __call = function(_, module, opts) return DDP.new(module, opts) end })

local function reducer_of(self, op)
  local r = self.reducer
  if r == nil then raise("DistributedDataParallel:" .. op .. ": the DDP module was destroyed") end
  return r
end

--- ddp:destroy(): remove the reducer's hooks now (the module keeps training locally after).
function DDP:destroy()
  if self.reducer ~= nil then
    local r = self.reducer
    ffi.gc(r, nil)
    C.ddp_reducer_free(r)
    self.reducer = nil
    for _, hd in ipairs(self._comm_hook and self._comm_hook.handles or {}) do hd:remove() end
  end
end

-- ---- forward ---------------------------------------------------------------------------

local idx_buf = ffi.new("int[?]", 4096)

local function unfinished_error(self, msg)
  local n = C.ddp_reducer_unready_params(self.reducer, idx_buf, 4096)
  local names = {}
  for k = 1, math.min(n, 4096) do names[k] = self.param_names[idx_buf[k - 1] + 1] end
  if #names > 0 then
    msg = msg:gsub("%s*%([%w_./]+%.c:%d+%)$", "")
    msg = msg .. ("\nParameters which did not receive grad for rank %d: %s"):format(
      self.rank, table.concat(names, ", "))
  end
  raise(msg)
end

--- ddp(...) / ddp:forward(...): the module's forward, with DDP's bookkeeping: when grad is
-- enabled, fails if the prior iteration's reduction did not finish (parameters that received
-- no gradient, named) and rebuilds the buckets once after the first iteration; broadcasts
-- rank 0's buffers (broadcast_buffers); runs the module; arms the reducer for the backward
-- (unless inside no_sync). Under an enabled join (ddp:join) it first tells the joined ranks
-- what to shadow (Note [join shadow iteration]) and broadcasts the buffers of the highest
-- rank still training instead of rank 0's. Returns what the module returns. While a profiler
-- records (ddplua.profiler), the whole call is a range "DistributedDataParallel.forward", as
-- in PyTorch's traces.
local forward_body
function DDP:forward(...)
  if C.ddp_profiler_enabled() == 0 then return forward_body(self, ...) end
  check(C.ddp_profiler_range_push("DistributedDataParallel.forward", C.DDP_PROF_USER))
  local res = { pcall(forward_body, self, ...) }
  check(C.ddp_profiler_range_pop())
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

forward_body = function(self, ...)
  local r = reducer_of(self, "forward")
  local grad = C.ddp_grad_enabled() ~= 0
  local buffer_root = 0
  local join = self._join_config
  if join and join.enable then
    buffer_root = DDPJoinHook.pre_forward(self, grad)
  elseif C.ddp_reducer_get_divide_factor(r) ~= 0 then
    check(C.ddp_reducer_set_divide_factor(r, 0)) -- left by a join that raised
  end
  if grad then
    if C.ddp_reducer_prepare_for_forward(r) ~= 0 then
      local msg = ffi.string(C.ddp_last_error())
      if C.ddp_reducer_unready_params(r, idx_buf, 1) > 0 then unfinished_error(self, msg) end
      raise(msg)
    end
  end
  if self.broadcast_buffers and self.world_size > 1 and #self.buffers > 0 then
    dl.no_grad(function() broadcast_from_0(self, self.buffers, "DistributedDataParallel.forward", buffer_root) end)
  end
  -- After the module's forward, as PyTorch's _post_forward: the backward's compute time
  -- (ddp:_get_ddp_logging_data) starts here.
  if self.device_ids then return self:_post_forward(grad, self.module(self:_inputs_to_device(...))) end
  return self:_post_forward(grad, self.module(...))
end

-- Arm the reducer for the backward (unless inside no_sync); returns the forward's results.
function DDP:_post_forward(grad, ...)
  if grad and self.require_backward_grad_sync then
    check(C.ddp_reducer_prepare_for_backward(self.reducer))
  end
  return ...
end

local tensor_mod = require "ddplua.tensor"

-- With device_ids: positional tensor inputs moved to the module's device (as PyTorch's
-- DDP forward scatters its inputs to device_ids[0]); other values pass through.
function DDP:_inputs_to_device(...)
  local args, n = { ... }, select("#", ...)
  for i = 1, n do
    local a = args[i]
    if tensor_mod.is_tensor(a) and C.ddp_tensor_device(a) ~= self.device_ids then
      args[i] = to_device(a, self.device_ids)
    end
  end
  return unpack(args, 1, n)
end

DDP.__call = function(self, ...) return self:forward(...) end

--- ddp:no_sync(fn, ...) -> fn's results: run fn with gradient synchronisation off, so
-- backward passes inside accumulate locally into param.grad; the first backward after it (with
-- sync on) reduces the accumulated gradients. As PyTorch's `with ddp.no_sync():`.
function DDP:no_sync(fn, ...)
  local r = reducer_of(self, "no_sync")
  local prev = self.require_backward_grad_sync
  self.require_backward_grad_sync = false
  C.ddp_reducer_set_sync(r, 0)
  local function finish(ok, ...)
    self.require_backward_grad_sync = prev
    C.ddp_reducer_set_sync(r, prev and 1 or 0)
    if not ok then error((...), 0) end
    return ...
  end
  return finish(pcall(fn, ...))
end

-- ---- uneven inputs (join) --------------------------------------------------------------
-- The Joinable protocol (ddplua.distributed.algorithms.join); the collectives of both sides
-- are Note [join shadow iteration] (ddplua/reducer_join.h), the hook is
-- ddplua.distributed.ddp_join_hook.

--- DDP.JOIN_HOOK_OPTIONS: the Join options ddp:join_hook reads.
DDP.JOIN_HOOK_OPTIONS = DDPJoinHook.OPTIONS

local JOIN_KNOWN = options.known { "divide_by_initial_world_size", "comm_hook_divide_by_non_joined", "enable",
  "throw_on_early_termination" }

--- ddp:join(opts, fn, ...) / ddp:join(fn, ...) -> fn's results: run fn (the training loop)
-- so that ranks with fewer inputs than others finish without hanging, as PyTorch's
-- `with ddp.join(...):` (Join({ddp}, opts):run(fn, ...)). A rank whose fn returned shadows
-- the others' forward and backward collectives until every rank is done; then every rank
-- gets the model of the last rank to finish. opts: divide_by_initial_world_size = true
-- (gradients divided by the initial world size; false: by the ranks still training; with a
-- communication hook registered the hook divides by its group's size either way, as
-- PyTorch's built-in hooks, unless comm_hook_divide_by_non_joined = true (ddplua only, with
-- false; refused with a hook written in Lua) makes the built-in hooks divide by the ranks
-- still training: Note [join divisor with a comm hook] in ddplua.distributed.ddp_join_hook),
-- enable = true (false: plain DDP, for inputs known to be even), throw_on_early_termination
-- = false (true: when one rank runs out every rank raises, the others with "Detected at least
-- one rank that exhausted inputs. Throwing across all ranks."; PyTorch ignores
-- divide_by_initial_world_size then). Collective; the module's forward is a collective of the
-- join too, so other collectives inside fn (SyncBatchNorm) need throw_on_early_termination,
-- as PyTorch warns. Raises on unknown options.
function DDP:join(opts, fn, ...)
  if type(opts) == "function" then return self:join(nil, opts, fn, ...) end
  opts = options.check("DistributedDataParallel.join", opts, JOIN_KNOWN)
  reducer_of(self, "join")
  return require("ddplua.distributed.algorithms.join")({ self }, opts):run(fn, ...)
end

--- ddp:join_hook(opts) -> DDP's JoinHook (ddplua.distributed.ddp_join_hook):
-- opts.divide_by_initial_world_size (default true), opts.comm_hook_divide_by_non_joined
-- (default false), as ddp:join.
function DDP:join_hook(opts) return DDPJoinHook.new(self, opts) end

--- ddp:join_device() -> the device ordinal of the join's own all-reduces (the parameters'
-- device; -1 for the CPU).
function DDP:join_device() return self.device end

--- ddp:join_process_group() -> the group DDP reduces over.
function DDP:join_process_group() return self.process_group end

-- ---- the wrapped module's interface -----------------------------------------------------

--- ddp:parameters() / named_parameters / buffers / named_buffers / children / modules: the
-- wrapped module's.
function DDP:parameters(...) return self.module:parameters(...) end
function DDP:named_parameters(...) return self.module:named_parameters(...) end
function DDP:buffers(...) return self.module:buffers(...) end
function DDP:named_buffers(...) return self.module:named_buffers(...) end
function DDP:children() return { self.module } end
function DDP:modules() return self.module:modules() end

--- ddp:state_dict() -> the module's state dict (no "module." prefix).
function DDP:state_dict(...) return self.module:state_dict(...) end

--- ddp:load_state_dict(sd, opts) -> report: into the module (names without "module.").
function DDP:load_state_dict(sd, opts) return self.module:load_state_dict(sd, opts) end

--- ddp:train([mode]) / ddp:eval() -> ddp.
function DDP:train(mode)
  self.module:train(mode)
  return self
end
function DDP:eval()
  self.module:eval()
  return self
end

--- ddp:zero_grad(set_to_none): the module's.
function DDP:zero_grad(...) return self.module:zero_grad(...) end

--- ddp.training: the module's training flag.
function DDP:is_training() return self.module.training end

-- ---- inspection -------------------------------------------------------------------------

--- ddp:buckets() -> list of buckets, each a list of parameter names in slot order (bucket 1
-- is reduced first; Note [bucket order]).
function DDP:buckets()
  local r = reducer_of(self, "buckets")
  local out = {}
  local buf = ffi.new("int[?]", math.max(#self.params, 1))
  for k = 0, C.ddp_reducer_num_buckets(r) - 1 do
    local n = C.ddp_reducer_bucket_params(r, k, buf, #self.params)
    local names = {}
    for s = 1, n do names[s] = self.param_names[buf[s - 1] + 1] end
    out[k + 1] = names
  end
  return out
end

--- ddp:has_rebuilt_buckets() -> true once the buckets follow the first iteration's order.
function DDP:has_rebuilt_buckets() return C.ddp_reducer_has_rebuilt_buckets(reducer_of(self, "has_rebuilt_buckets")) ~= 0 end

--- ddp:exposed_comm_seconds() -> seconds the last backward waited at its end for the
-- gradient all-reduces (the communication the backward pass did not hide).
function DDP:exposed_comm_seconds()
  return tonumber(C.ddp_reducer_last_wait_seconds(reducer_of(self, "exposed_comm_seconds")))
end

--- ddp:verify_sync(): collective check that every parameter and buffer holds the same bytes
-- on every rank (64-bit FNV-1a digests, ddp_tensor_digest, all-gathered). Raises naming the
-- first tensor that differs and two ranks that disagree, e.g. "verify_sync: parameter
-- 'fc.weight' differs: ranks 0 and 2 hold different values". Returns true.
function DDP:verify_sync()
  local names, kinds, tensors = {}, {}, {}
  for name, p in self.module:named_parameters() do
    names[#names + 1], kinds[#names + 1], tensors[#names + 1] = name, "parameter", p
  end
  for name, b in self.module:named_buffers() do
    names[#names + 1], kinds[#names + 1], tensors[#names + 1] = name, "buffer", b
  end
  if self.world_size == 1 then return true end
  local counts = allgather_i64(self, { #names }, "verify_sync")
  for r = 2, self.world_size do
    if counts[r][1] ~= counts[1][1] then
      raise(("verify_sync: rank 0 has %d parameters and buffers but rank %d has %d"):format(
        tonumber(counts[1][1]), r - 1, tonumber(counts[r][1])))
    end
  end
  local digests = {}
  for i, t in ipairs(tensors) do
    check(C.ddp_tensor_digest(digest_box, t))
    digests[i] = ffi.cast("int64_t", digest_box[0])
  end
  local rows = allgather_i64(self, digests, "verify_sync")
  for i = 1, #names do
    for r = 2, self.world_size do
      if rows[r][i] ~= rows[1][i] then
        raise(("verify_sync: %s '%s' differs: ranks 0 and %d hold different values"):format(
          kinds[i], names[i], r - 1))
      end
    end
  end
  return true
end

-- ---- communication hooks (ddplua/comm_hook.h, Note [comm hooks]) ----------------------

local HOOK_KIND = { ALLREDUCE = C.DDP_COMM_HOOK_ALLREDUCE, FP16_COMPRESS = C.DDP_COMM_HOOK_FP16_COMPRESS,
  BF16_COMPRESS = C.DDP_COMM_HOOK_BF16_COMPRESS, POWER_SGD = C.DDP_COMM_HOOK_POWER_SGD }
local WRAP_DTYPE = { f16 = C.DDP_F16, bf16 = C.DDP_BF16 }

local function comm_hooks(name) return require("ddplua.distributed.algorithms.ddp_comm_hooks." .. name) end

--- PyTorch's dist.BuiltinCommHookType, for ddp:_register_builtin_comm_hook.
DDP.BuiltinCommHookType = { ALLREDUCE = "ALLREDUCE", FP16_COMPRESS = "FP16_COMPRESS" }

local function group_ptr(state, what)
  if state == nil then return nil end
  if type(state) ~= "table" or type(state.ptr) ~= "function" then
    raise(("register_comm_hook: the state of %s must be a process group or nil, got %s"):format(what, type(state)))
  end
  return state:ptr("register_comm_hook")
end

--- ddp:register_comm_hook(state, hook): reduce each gradient bucket with hook(state, bucket)
-- instead of the default averaging all-reduce (PyTorch's register_comm_hook). hook receives a
-- GradBucket (index(), buffer(), gradients(), parameters(), is_last(); the buffer holds the
-- bucket's gradients NOT divided by the world size) and returns a ddplua.futures Future whose
-- value is the reduced bucket tensor (numel,) (or a list whose first entry is); the reducer
-- copies it into the bucket and writes param.grad from it.
-- Built-ins (default_hooks.allreduce_hook, fp16_compress_hook, bf16_compress_hook, the
-- compress wrappers around them, powerSGD_hook.powerSGD_hook with a PowerSGDState) run in C
-- inside the reducer, their all-reduces overlapping the backward. Any other function is a
-- Lua hook: it runs from a post-accumulate hook on every parameter, as soon as its bucket is
-- launched (in bucket order), and its Futures are waited for when the last bucket was
-- handed over, still inside backward (not with find_unused_parameters, whose last buckets
-- complete where Lua cannot run). state: a process group or nil for the default hooks, a
-- PowerSGDState for PowerSGD, anything for a Lua hook.
-- Raises "register_comm_hook or register_builtin_comm_hook can only be called once." (as
-- PyTorch), and when called after the first backward; a hook returning something else than
-- a Future, or a Future of a tensor of another shape than the bucket, fails that backward.
function DDP:register_comm_hook(state, hook)
  local r = reducer_of(self, "register_comm_hook")
  if type(hook) ~= "function" then
    raise("register_comm_hook: hook must be a function (state, bucket) -> Future, got " .. type(hook))
  end
  local desc = comm_hooks("builtin").describe(hook)
  if desc then
    local pg, psgd = nil, nil
    if desc.kind == "POWER_SGD" then
      if type(state) ~= "table" or getmetatable(state) ~= comm_hooks("powerSGD_hook").PowerSGDState then
        raise("register_comm_hook: powerSGD_hook needs a PowerSGDState as its state, got " .. type(state))
      end
      pg, psgd = group_ptr(state.process_group, "powerSGD_hook"), state.handle
    else
      pg = group_ptr(state, "a default hook")
    end
    check(C.ddp_reducer_register_comm_hook(r, HOOK_KIND[desc.kind], desc.wrap and WRAP_DTYPE[desc.wrap] or -1, pg, psgd))
    self._comm_hook = { state = state, hook = hook }
    return
  end
  if self.find_unused_parameters then
    raise("register_comm_hook: a hook written in Lua cannot be used with find_unused_parameters = true " ..
          "(the buckets of unused parameters complete at the end of backward, where Lua cannot run); " ..
          "use a built-in hook (default_hooks, powerSGD_hook)")
  end
  check(C.ddp_reducer_register_comm_hook(r, C.DDP_COMM_HOOK_FRONT_END, -1, nil, nil))
  local h = { state = state, hook = hook, pending = {}, handles = {} }
  self._comm_hook = h
  local function run() self:_run_comm_hook() end
  for i, p in ipairs(self.params) do h.handles[i] = p:register_post_accumulate_grad_hook(run) end
end

--- ddp:_register_builtin_comm_hook(comm_hook_type): PyTorch's name: "ALLREDUCE" or
-- "FP16_COMPRESS" (DDP.BuiltinCommHookType) over the DDP module's group.
function DDP:_register_builtin_comm_hook(comm_hook_type)
  local default = comm_hooks("default_hooks")
  local hook = ({ ALLREDUCE = default.allreduce_hook, FP16_COMPRESS = default.fp16_compress_hook })[comm_hook_type]
  if not hook then
    raise("_register_builtin_comm_hook: comm_hook_type must be \"ALLREDUCE\" or \"FP16_COMPRESS\", got " .. tostring(comm_hook_type))
  end
  return self:register_comm_hook(nil, hook)
end

--- ddp:comm_hook_bytes() -> bytes the registered built-in hook handed to all-reduces so far
-- (its wire dtype; 0 with no hook or a Lua hook).
function DDP:comm_hook_bytes()
  return tonumber(C.ddp_reducer_comm_hook_bytes(reducer_of(self, "comm_hook_bytes")))
end

-- A Lua hook's turn (from a parameter's post-accumulate hook, after the reducer's own hook on
-- that parameter): run the hook on every bucket launched since, in bucket order; after the
-- last bucket, wait for every Future and hand the values to the reducer before it finalizes.
function DDP:_run_comm_hook()
  local h, r = self._comm_hook, self.reducer
  if r == nil then return end
  local nb = C.ddp_reducer_num_buckets(r)
  while true do
    local k = C.ddp_reducer_comm_hook_next(r)
    if k < 0 then return end
    if k == 0 then h.pending = {} end
    local GradBucket = comm_hooks("grad_bucket")
    local fut = h.hook(h.state, GradBucket.new(r, k, self.params))
    if not require("ddplua.futures").is_future(fut) then
      raise(("register_comm_hook: the hook must return a Future (ddplua.futures) of the reduced bucket, got %s for bucket %d")
            :format(type(fut), k))
    end
    h.pending[k] = fut
    if k == nb - 1 then
      for j = 0, nb - 1 do
        local v = h.pending[j]:wait()
        if type(v) == "table" then v = v[1] end
        if not tensor_mod.is_tensor(v) then
          raise(("expected the hook result is either a Tensor or a TensorList found %s (bucket %d)"):format(type(v), j))
        end
        check(C.ddp_reducer_comm_hook_set_result(r, j, v))
      end
      h.pending = {}
    end
  end
end

-- ---- static graph and logging data (ddplua/reducer_static_graph.h) ----------------------

--- ddp:_set_static_graph(): PyTorch's older spelling of static_graph = true; before the
-- first backward only (raises DDP_ERR_STATE's message after it).
function DDP:_set_static_graph()
  check(C.ddp_reducer_set_static_graph(reducer_of(self, "_set_static_graph")))
  self.static_graph = true
end

local logging_box = ffi.new("ddp_reducer_logging_data")

local function bucket_list(n_fn, buf)
  local list = {}
  for k = 1, n_fn do list[k] = tonumber(buf[k - 1]) end
  return list
end

--- ddp:_get_ddp_logging_data() -> a table with the keys of PyTorch's DDPLoggingData
-- (torch/csrc/distributed/c10d/logger.cpp) that apply here:
--   world_size, rank, module_name (the module's class name), backend_name,
--   bucket_cap_bytes, find_unused_parameters, static_graph, gradient_as_bucket_view
--   (booleans; PyTorch gives 0/1), bucket_sizes (bytes of each bucket as first built),
--   has_rebuilt_buckets (boolean), rebuilt_bucket_sizes (bytes of each bucket after the
--   rebuild; absent before it), unused_parameter_size (bytes of the parameters unused on
--   this rank in the last iteration, with find_unused_parameters or static_graph),
--   iteration (finished reductions), can_set_static_graph (false once an iteration's set of
--   unused parameters differed from the previous one's, with find_unused_parameters),
--   avg_backward_compute_time, avg_backward_comm_time,
--   avg_backward_compute_comm_overlap_time (NANOSECONDS, as PyTorch; means over every
--   finished iteration where PyTorch samples some; definitions in
--   ddplua/reducer_static_graph.h), num_parameter_tensors, total_parameter_size_bytes.
-- The sizes are lists of numbers where PyTorch joins them into a string. comm_hook is
-- absent (no hook registered).
function DDP:_get_ddp_logging_data()
  local r = reducer_of(self, "_get_ddp_logging_data")
  check(C.ddp_reducer_get_logging_data(r, logging_box))
  local d = logging_box
  local nb = math.max(C.ddp_reducer_num_buckets(r), 1)
  local buf = ffi.new("int64_t[?]", math.max(nb, 64))
  local n_initial = C.ddp_reducer_initial_bucket_bytes(r, buf, math.max(nb, 64))
  if n_initial > math.max(nb, 64) then
    buf = ffi.new("int64_t[?]", n_initial)
    n_initial = C.ddp_reducer_initial_bucket_bytes(r, buf, n_initial)
  end
  local total = 0
  for _, p in ipairs(self.params) do
    total = total + tonumber(C.ddp_tensor_numel(p)) * tonumber(C.ddp_dtype_size(C.ddp_tensor_dtype(p)))
  end
  local out = {
    world_size = d.world_size,
    rank = d.rank,
    module_name = self.module:_get_name(),
    backend_name = ffi.string(C.ddp_pg_backend(self.process_group:ptr("_get_ddp_logging_data"))),
    bucket_cap_bytes = tonumber(d.bucket_cap_bytes),
    find_unused_parameters = d.find_unused_parameters ~= 0,
    static_graph = d.static_graph ~= 0,
    gradient_as_bucket_view = d.gradient_as_bucket_view ~= 0,
    bucket_sizes = bucket_list(n_initial, buf),
    has_rebuilt_buckets = d.has_rebuilt_buckets ~= 0,
    unused_parameter_size = tonumber(d.unused_parameter_size),
    iteration = tonumber(d.iteration),
    can_set_static_graph = d.can_set_static_graph ~= 0,
    avg_backward_compute_time = tonumber(d.avg_backward_compute_time),
    avg_backward_comm_time = tonumber(d.avg_backward_comm_time),
    avg_backward_compute_comm_overlap_time = tonumber(d.avg_backward_compute_comm_overlap_time),
    num_parameter_tensors = #self.params,
    total_parameter_size_bytes = total,
  }
  if out.has_rebuilt_buckets then
    local sizes = {}
    for k = 0, C.ddp_reducer_num_buckets(r) - 1 do sizes[k + 1] = tonumber(C.ddp_reducer_bucket_bytes(r, k)) end
    out.rebuilt_bucket_sizes = sizes
  end
  return out
end

-- ---- optimizer in backward (ddplua/reducer_fused_optim.h) ----------------------------------

local fused_box = ffi.new("ddp_fused_optim_config")

-- The kind of a supported optimizer class (nil otherwise).
local function fused_kind(cls)
  local optim = require "ddplua.optim"
  if cls == optim.SGD then return C.DDP_FUSED_OPTIM_SGD end
  if cls == optim.Adam then return C.DDP_FUSED_OPTIM_ADAM end
  if cls == optim.AdamW then return C.DDP_FUSED_OPTIM_ADAMW end
  return nil
end

-- The C config (in fused_box) of kind from a param group of the matching Lua optimizer.
local function fused_config(kind, g)
  local c = fused_box
  c.kind = kind
  c.lr, c.weight_decay, c.maximize = g.lr, g.weight_decay, g.maximize and 1 or 0
  if kind == C.DDP_FUSED_OPTIM_SGD then
    c.momentum, c.dampening, c.nesterov = g.momentum, g.dampening, g.nesterov and 1 or 0
  else
    c.beta1, c.beta2, c.eps, c.amsgrad = g.betas[1], g.betas[2], g.eps, g.amsgrad and 1 or 0
  end
  return c
end

--- ddp:_register_fused_optim(optim_class, args) (PyTorch's private name; the public one is
-- ddp:register_optimizer_in_backward): from now on every backward also runs the optimizer
-- step of each bucket's parameters as soon as that bucket's all-reduce has completed,
-- overlapping the rest of backward (Note [optimizer in backward] in
-- ddplua/reducer_fused_optim.h). optim_class: optim.SGD (momentum, dampening, weight_decay,
-- nesterov, maximize), optim.Adam or optim.AdamW (betas, eps, weight_decay, amsgrad,
-- maximize); args: that optimizer's options table (defaults and checks as its constructor),
-- applied to every parameter of the module. After it, param.grad stays nil (the gradients
-- live only in the buckets, never as full .grad tensors) and the parameters are already
-- updated when backward returns: do not call an optimizer's step for them. The optimizer
-- state lives in the reducer; ddp:fused_optim_state_dict() / ddp:fused_optim_load_state_dict
-- checkpoint it, ddp:fused_optim_set_lr(lr) changes the learning rate for a schedule. Raises for another optimizer class (naming it and the
-- supported ones), a bad option (as the optimizer's constructor), a second registration,
-- or a registration after the first backward. Returns ddp.
function DDP:_register_fused_optim(optim_class, args)
  local r = reducer_of(self, "_register_fused_optim")
  local kind = type(optim_class) == "table" and fused_kind(optim_class)
  if not kind then
    local name = type(optim_class) == "table" and tostring(optim_class.name) or type(optim_class)
    raise(("DistributedDataParallel._register_fused_optim: optimizer %s is not supported in " ..
           "backward (supported: optim.SGD, optim.Adam, optim.AdamW)"):format(name))
  end
  if C.ddp_reducer_has_fused_optim(r) ~= 0 then
    raise(("DistributedDataParallel._register_fused_optim: an optimizer in backward is already " ..
           "registered on rank %d (register one, once)"):format(self.rank))
  end
  if #self.params == 0 then raise("DistributedDataParallel._register_fused_optim: the module has no parameters that require grad") end
  -- The optimizer's own constructor fills the defaults and checks the options.
  local g = optim_class.new(self.params, args).param_groups[1]
  check(C.ddp_reducer_register_fused_optim(r, fused_config(kind, g)))
  self.fused_optim = { class = optim_class.name, cls = optim_class, kind = kind, options = g }
  return self
end

--- ddp:register_optimizer_in_backward(optim_class, args): the public name of
-- ddp:_register_fused_optim (same arguments, errors and result).
function DDP:register_optimizer_in_backward(optim_class, args)
  return self:_register_fused_optim(optim_class, args)
end

--- ddp:fused_optim_set_lr(lr): the learning rate of the optimizer in backward from the next
-- step on (lr >= 0). Raises when none is registered.
function DDP:fused_optim_set_lr(lr)
  check(C.ddp_reducer_fused_optim_set_lr(reducer_of(self, "fused_optim_set_lr"), lr))
  if self.fused_optim then self.fused_optim.options.lr = lr end
end

-- The state tensors the C side keeps per parameter, by the Lua optimizers' state_dict names
-- (ddplua/reducer_fused_optim.h); Adam's entries also hold `step`, SGD's none.
local SGD_STATE = { "momentum_buffer" }
local ADAM_STATE = { "exp_avg", "exp_avg_sq", "max_exp_avg_sq" }

-- The registered optimizer in backward, or raise naming op.
local function fused_of(self, op)
  local f = self.fused_optim
  if not f then raise(("DistributedDataParallel.%s: no optimizer in backward is registered"):format(op)) end
  return f
end

-- A Lua optimizer of the registered class over the module's parameters, with the options
-- in use and no state: its state_dict() gives the format, its load_state_dict the checks
-- (so the optimizer in backward's state dict IS the plain optimizer's, by construction).
local function shadow_optimizer(self, f)
  local opts = {}
  for k, v in pairs(f.options) do if k ~= "params" then opts[k] = v end end
  return f.cls.new(self.params, opts)
end

--- ddp:fused_optim_state_dict() -> sd: the state of the optimizer in backward in the format
-- of the matching Lua optimizer's opt:state_dict() (optim.SGD / Adam / AdamW over
-- ddp.module's parameters, one param group): {state = {[id] = {momentum_buffer = t} for SGD
-- or {step = n, exp_avg = t, exp_avg_sq = t[, max_exp_avg_sq = t]} for Adam/AdamW},
-- param_groups = {{lr = ..., <options>, params = {0, ..., n-1}}}}, ids numbering the
-- parameters that require grad from 0 in ddp.module:parameters() order; a parameter not
-- stepped yet has no entry. Tensors are copies (the parameters' shape, dtype and device).
-- Call it between iterations. Raises when no optimizer in backward is registered.
function DDP:fused_optim_state_dict()
  local op = "fused_optim_state_dict"
  local r = reducer_of(self, op)
  local f = fused_of(self, op)
  local opt = shadow_optimizer(self, f)
  -- Note [optimizer state store]: the shadow's state is a view over the reducer's own store,
  -- which the optimizer in backward steps with the Lua optimizers' step function, so this is
  -- the Lua optimizer's state_dict over the same kind of entries.
  opt.state = OptimState.borrow(C.ddp_reducer_fused_optim_state(r), self, opt._ids)
  return opt:state_dict()
end

--- ddp:fused_optim_state() -> the state of the optimizer in backward as a Lua optimizer's
-- opt.state: a view (ddplua.optim.state) over the reducer's own store (Note [optimizer
-- state store] in ddplua/optim_state.h), keyed by ddp.module's parameters:
-- state[p].exp_avg is the tensor the next step updates (not a copy), state[p].step a
-- number; iterate with state:items(). Read or change it between iterations only (a
-- backward steps it). Raises when no optimizer in backward is registered.
function DDP:fused_optim_state()
  local op = "fused_optim_state"
  local r = reducer_of(self, op)
  fused_of(self, op)
  local handles = {}
  for _, p in ipairs(self.params) do handles[tonumber(ffi.cast("intptr_t", p))] = p end
  return OptimState.borrow(C.ddp_reducer_fused_optim_state(r), self, handles)
end

-- Note [loading the optimizer in backward]: a state dict is checked whole before anything
-- changes: first here, what only the optimizer in backward can tell (an option or a state
-- key the registered class does not have: a state dict of another optimizer; a state
-- tensor of another shape, naming the parameter by its id and its name in the module),
-- then by the Lua optimizer's own load_state_dict on a shadow optimizer (groups, ids,
-- steps, option values: Note [validate loaded state] in optim/optimizer.lua). Only then
-- are the options and the state handed to the reducer.

-- Raise unless sd's options and state keys and shapes fit the registered optimizer f.
local function check_fused_state_dict(self, f, sd, op)
  if type(sd) ~= "table" or type(sd.state) ~= "table" or type(sd.param_groups) ~= "table" then
    raise(op .. ": expects a table {state = ..., param_groups = ...} (an optimizer's state_dict())")
  end
  local cls, sgd = f.cls, f.kind == C.DDP_FUSED_OPTIM_SGD
  local known = { params = true }
  for k in pairs(cls.defaults) do known[k] = true end
  for _, k in ipairs(cls.optional) do known[k] = true end
  for gi, g in ipairs(sd.param_groups) do
    local unknown = {}
    for k in pairs(type(g) == "table" and g or {}) do
      if not known[k] then unknown[#unknown + 1] = "'" .. tostring(k) .. "'" end
    end
    if #unknown > 0 then
      table.sort(unknown)
      raise(("%s: loaded param group %d has option%s %s, which %s does not have (a state dict " ..
             "of another optimizer? the optimizer in backward is %s)"):format(op, gi,
             #unknown > 1 and "s" or "", table.concat(unknown, ", "), cls.name, cls.name))
    end
  end
  local keep = { step = not sgd }
  for _, k in ipairs(sgd and SGD_STATE or ADAM_STATE) do keep[k] = true end
  local ids = type(sd.param_groups[1]) == "table" and type(sd.param_groups[1].params) == "table"
    and sd.param_groups[1].params or {}
  local pos = {}
  for i, id in ipairs(ids) do if tonumber(id) then pos[tonumber(id)] = i end end
  for id, st in pairs(sd.state) do
    local i = pos[tonumber(id)]
    local p = i and self.params[i]
    if p and type(st) == "table" then
      local where = ("%s: the loaded state of parameter %s (%s)"):format(op, tostring(id), self.param_names[i])
      for k, v in pairs(st) do
        if not keep[k] then
          raise(("%s has '%s', which %s does not keep (a state dict of another optimizer? the " ..
                 "optimizer in backward is %s)"):format(where, tostring(k), cls.name, cls.name))
        end
        if k ~= "step" and dl.is_tensor(v) then
          local a, b = v:size(), p:size()
          local same = #a == #b
          for d = 1, #a do same = same and a[d] == b[d] end
          if not same then
            raise(("%s: %s has shape (%s), the parameter (%s)"):format(where, k,
              table.concat(a, ", "), table.concat(b, ", ")))
          end
        end
      end
      if not sgd and (st.step == nil or st.exp_avg == nil or st.exp_avg_sq == nil) then
        raise(("%s lacks %s (%s keeps step, exp_avg and exp_avg_sq)"):format(where,
          st.step == nil and "step" or st.exp_avg == nil and "exp_avg" or "exp_avg_sq", cls.name))
      end
    end
  end
end

--- ddp:fused_optim_load_state_dict(sd): replace the options and state of the optimizer in
-- backward by sd, a state dict of the same optimizer class over the same parameters (from
-- ddp:fused_optim_state_dict(), or from the plain Lua optimizer's opt:state_dict():
-- the formats are the same); the steps that follow continue bit for bit as the run that
-- saved it. Floating state tensors are converted to their parameter's dtype and device (as
-- the Lua optimizers do). Call it between iterations (after register_optimizer_in_backward,
-- before or after the first backward). Raises, before changing anything (Note [loading the
-- optimizer in backward]), when no optimizer in backward is registered, for a state dict of
-- another optimizer (an option or state key the registered class does not have, naming
-- it), for a state tensor whose shape is not its parameter's (naming the parameter's id and
-- name), and for what the Lua optimizer's load_state_dict refuses (groups, ids, steps,
-- option values).
function DDP:fused_optim_load_state_dict(sd)
  local op = "DistributedDataParallel.fused_optim_load_state_dict"
  local r = reducer_of(self, "fused_optim_load_state_dict")
  local f = fused_of(self, "fused_optim_load_state_dict")
  check_fused_state_dict(self, f, sd, op)
  local opt = shadow_optimizer(self, f)
  local ok, err = pcall(opt.load_state_dict, opt, sd)
  if not ok then raise(op .. ": " .. tostring(err)) end
  local g = opt.param_groups[1]
  check(C.ddp_reducer_fused_optim_configure(r, fused_config(f.kind, g)))
  -- the shadow's checked copies become the reducer's state (Note [optimizer state store])
  check(C.ddp_reducer_fused_optim_load_state(r, OptimState.store(opt.state)))
  f.options = g
end

local counts_box = ffi.new("int64_t[2]")

--- ddp:fused_optim_counts() -> during_backward, at_end: bucket steps of the optimizer in
-- backward that ran while backward went on, and after its final wait (since registration).
function DDP:fused_optim_counts()
  C.ddp_reducer_fused_optim_counts(reducer_of(self, "fused_optim_counts"), counts_box, counts_box + 1)
  return tonumber(counts_box[0]), tonumber(counts_box[1])
end

function DDP:__tostring()
  return "DistributedDataParallel(\n  (module): " .. tostring(self.module):gsub("\n", "\n  ") .. "\n)"
end

return DDP
