--- ddplua.distributed.distributed_c10d: process groups and collectives, the body of
-- ddplua.distributed (as torch.distributed.distributed_c10d is torch.distributed's):
-- init_process_group, groups, every tensor collective, send/recv, barriers. The modules under
-- ddplua.distributed (DDP, objects, device meshes, ZeRO, join, comm hooks) call the
-- collectives through this module; ddplua.distributed re-exports it and adds those modules,
-- so nothing below it requires the package itself (Note [lua layers] in
-- tools/check_layers.lua). Scripts use `require "ddplua.distributed"`: see its doc there.
local options = require "ddplua.options"
local lib = require "ddplua.lib"
local tensor = require "ddplua.tensor"
local Group = require "ddplua.distributed.group"
local Work = require "ddplua.distributed.work"
local ffi, C = lib.ffi, lib.C
local check, raise = lib.check, lib.raise

local M = {}

M.Work = Work
M.Group = Group
--- PyTorch's default timeout of process groups and their store, in seconds.
M.DEFAULT_TIMEOUT = 300

-- The state of this process: the default group and how it was made.
local state = { group = nil, store = nil, local_rank = 0, backend = nil,
                rendezvous = nil, -- Note [re-initialising the default group]
                inits = 0 }      -- default groups this process has initialised

local pg_box = ffi.new("ddp_pg*[1]")
local work_box = ffi.new("ddp_work*[1]")

-- Reduce op name -> enum ddp_reduce_op, from the C table (pinned to the enum there).
local ops, op_list = {}, {}
for v = 0, C.DDP_REDUCE_OP_COUNT - 1 do
  local name = ffi.string(C.ddp_reduce_op_name(v))
  ops[name] = v
  op_list[#op_list + 1] = name
end
op_list = table.concat(op_list, ", ")

--- dist.ReduceOp: PyTorch's constants (dist.ReduceOp.SUM == "sum", ...).
M.ReduceOp = {}
for name in pairs(ops) do M.ReduceOp[name:upper()] = name end

local function op_arg(opts, name)
  local op = opts and opts.op or "sum"
  local v = ops[type(op) == "string" and op:lower() or op]
  if not v then
    raise(("%s: unknown op '%s' (%s)"):format(name, tostring(op), op_list))
  end
  return v
end

local tbox = ffi.new("ddp_tensor*[1]")
-- An uninitialised tensor of `shape` and dtype on the device of tensor `like` (scratch
-- outputs of the list forms: nccl needs them on the rank's device).
local function empty_like_device(shape, dtype, like)
  local dev = C.ddp_tensor_device(like)
  if dev < 0 then return require("ddplua.functions").empty(shape, { dtype = dtype }) end
  local dims, nd = lib.shape(shape)
  check(C.ddp_tensor_empty(tbox, nd, dims, lib.dtype(dtype), dev))
  return lib.wrap(tbox[0])
end

local function tensor_arg(t, name, what)
  if not tensor.is_tensor(t) then
    raise(("%s: %s must be a tensor, got %s"):format(name, what, type(t)))
  end
  return t
end

-- ---- environment -------------------------------------------------------------------------

local function env_int(names)
  for _, n in ipairs(names) do
    local v = os.getenv(n)
    if v and v ~= "" then
      local x = tonumber(v)
      if not x or x ~= math.floor(x) then
        raise(("init_process_group: environment variable %s=%q is not an integer"):format(n, v))
      end
      return x, n
    end
  end
end

-- Launchers and their variables: torchrun (and ddplua's launcher), Slurm's srun, Open MPI.
local RANK_VARS = { "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK" }
local SIZE_VARS = { "WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE" }
local LOCAL_VARS = { "LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID" }

--- dist.env_info() -> {rank =, world_size =, local_rank =} as read from the launcher's
-- environment (torchrun's RANK / WORLD_SIZE / LOCAL_RANK, else Slurm's SLURM_PROCID /
-- SLURM_NTASKS / SLURM_LOCALID, else Open MPI's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK);
-- fields are nil when not set.
function M.env_info()
  return { rank = env_int(RANK_VARS), world_size = env_int(SIZE_VARS), local_rank = env_int(LOCAL_VARS) }
end

-- ---- stores -------------------------------------------------------------------------------

local store_mod
local function store_module()
  if store_mod == nil then
    local ok, m = pcall(require, "ddplua.distributed.store")
    store_mod = ok and m or false
  end
  return store_mod
end

local function parse_host_port(s, what)
  local host, port = s:match("^%[(.+)%]:(%d+)$")
  if not host then host, port = s:match("^([^:]+):(%d+)$") end
  if not host then raise(("init_process_group: %s: expected host:port, got '%s'"):format(what, s)) end
  return host, tonumber(port)
end

-- Note [re-initialising the default group]: a script may destroy_process_group() and call
-- init_process_group again (PyTorch allows it; tests and elastic scripts do it). With env://
-- or tcp:// rank 0 hosts the TCP store. Closing that server in destroy_process_group raced
-- the other ranks' next init: a rank that destroyed first connected again to rank 0's old
-- server, which then closed under it ("lost the connection to the store server ... during
-- get"), or refused it half-way through authentication. So the store a TCP init made is kept
-- after destroy_process_group (state.rendezvous, keyed by address, port, rank, world size and
-- secret) and the next init with the same parameters connects nothing new: it reuses it.
-- The keys of the old group are still in that store, so each default group of the process
-- gets its own key prefix, as PyTorch's group count does: "pg" for the first init, "pg@k" for
-- the k-th re-init (every rank counts its own inits; in an SPMD script the counts agree). A
-- group_name given by the caller is used as given. The kept store is closed when an init
-- needs another one, or with the process (its handle's finaliser). A file:// store is closed
-- on destroy as before (no server to race: the file outlives any one process's handle).
local function rendezvous_key(init_method, rank, world_size, secret)
  if not (init_method:match("^env://") or init_method:match("^tcp://")) then return nil end
  return table.concat({ init_method, os.getenv("MASTER_ADDR") or "", os.getenv("MASTER_PORT") or "",
                        rank, world_size, secret or os.getenv("DDPLUA_STORE_SECRET") or "" }, "\0")
end

-- The store of init_method for this rank.
local function make_store(init_method, rank, world_size, timeout, secret)
  local sm = store_module()
  if not sm then raise("init_process_group: the store module (ddplua.distributed.store) is not available") end
  local scheme, rest = init_method:match("^(%a+)://(.*)$")
  if scheme == "env" then
    local addr, port = os.getenv("MASTER_ADDR"), os.getenv("MASTER_PORT")
    if not addr or addr == "" then
      raise("init_process_group: env:// needs the environment variable MASTER_ADDR (the address of rank 0)")
    end
    if not port or not tonumber(port) then
      raise("init_process_group: env:// needs the environment variable MASTER_PORT (a port number), got " ..
            tostring(port))
    end
    return sm.TCPStore(addr, tonumber(port), { is_server = rank == 0, rank = rank, timeout = timeout,
                                              secret = secret })
  elseif scheme == "tcp" then
    local host, port = parse_host_port(rest, init_method)
    return sm.TCPStore(host, port, { is_server = rank == 0, rank = rank, timeout = timeout, secret = secret })
  elseif scheme == "file" then
    if rest == "" then raise("init_process_group: file:// needs a path (file:///tmp/rendezvous)") end
    return sm.FileStore(rest, { rank = rank, timeout = timeout })
  end
  raise(("init_process_group: unknown init_method '%s' (env://, tcp://host:port, file:///path)"):format(init_method))
end

-- ---- the default group --------------------------------------------------------------------

-- The CUDA device an nccl group of this rank works on: opts.device_id ("cuda:1", 1), else
-- LOCAL_RANK modulo the device count (one device per process, torchrun's convention).
local function nccl_device(opts, local_rank)
  local d = opts.device_id
  if type(d) == "string" then
    local k = d:match("^cuda:(%d+)$")
    if not k then
      raise(("init_process_group: device_id must be a CUDA device such as 'cuda:0' or 0, got '%s'"):format(d))
    end
    return tonumber(k)
  elseif type(d) == "number" then
    if d < 0 or d ~= math.floor(d) then raise("init_process_group: device_id must be a CUDA ordinal >= 0, got " .. d) end
    return d
  elseif d ~= nil then
    raise("init_process_group: device_id must be a CUDA device ('cuda:0' or 0), got " .. type(d))
  end
  local count = C.ddp_cuda_device_count()
  if count < 1 then return 0 end -- ddp_pg_new_nccl then says why CUDA is not available
  return local_rank % count
end

local KNOWN = options.known { "backend", "init_method", "rank", "world_size", "timeout", "store",
  "device_id", "group_name", "store_secret", "stall_report_s" }

--- dist.init_process_group{backend = "gloo", init_method = "env://", rank =, world_size =,
-- timeout = 300, store =, device_id =, store_secret =}: join the job's default process group.
-- After destroy_process_group it may be called again (Note [re-initialising the default
-- group]: env:// and tcp:// reuse this process's store; each default group gets its own keys).
-- backend: "gloo" (any tensors; CUDA tensors staged through the host) or "nccl" (CUDA
-- tensors; NCCL through the CUDA plug-in; the unique id travels through the store). When
-- backend is omitted (or "default"), it is "nccl" if device_id names a CUDA device and
-- "gloo" otherwise (a CPU job keeps gloo). device_id (nccl): the CUDA device of this rank,
-- "cuda:k" or k; default LOCAL_RANK modulo the device count; it becomes the current device
-- (as torch.cuda.set_device). Without CUDA or NCCL, "nccl" raises "nccl backend: CUDA is not
-- available: <reason>" (or "NCCL is not available: ...").
-- rank / world_size: the arguments, else the launcher's environment (see env_info);
-- init_method: "env://" (MASTER_ADDR, MASTER_PORT; rank 0 hosts the TCP store, the others
-- connect), "tcp://host:port" (the same with that address), "file:///path" (a file store on
-- a shared file system); `store` (a ddplua.distributed.store object) replaces init_method.
-- store_secret: the job's store secret for env:// and tcp:// (default $DDPLUA_STORE_SECRET,
-- which the launcher and dl.spawn set; README "Security"): the same string on every rank.
-- timeout: seconds for the rendezvous and every collective. stall_report_s: seconds a
-- collective may wait for its peers before this rank prints a stall report naming the
-- ranks that are behind (default $DDPLUA_STALL_REPORT_S, else 30; the timeout still ends
-- the wait). Raises when already
-- initialised, on a missing rank/world size, an unknown backend, or a failed rendezvous
-- (naming the rank).
function M.init_process_group(opts)
  opts = options.check("init_process_group", opts, KNOWN)
  if state.group then raise("init_process_group: the default process group is already initialised") end
  local backend = opts.backend and tostring(opts.backend):lower() or "default"
  if backend == "default" then backend = opts.device_id ~= nil and opts.device_id ~= "cpu" and "nccl" or "gloo" end
  if backend ~= "gloo" and backend ~= "nccl" then
    raise(("init_process_group: unknown backend '%s' (gloo, nccl)"):format(backend))
  end
  local env = M.env_info()
  local rank = opts.rank or env.rank
  local world_size = opts.world_size or env.world_size
  if rank == nil then
    raise("init_process_group: no rank: pass rank = or set RANK (or SLURM_PROCID, OMPI_COMM_WORLD_RANK)")
  end
  if world_size == nil then
    raise("init_process_group: no world size: pass world_size = or set WORLD_SIZE (or SLURM_NTASKS, OMPI_COMM_WORLD_SIZE)")
  end
  if world_size < 1 or rank < 0 or rank >= world_size then
    raise(("init_process_group: rank %d is out of range for world size %d (ranks count from 0)"):format(rank, world_size))
  end
  local timeout = opts.timeout or M.DEFAULT_TIMEOUT
  if type(timeout) ~= "number" or not (timeout > 0) then
    raise("init_process_group: timeout must be a number of seconds > 0, got " .. tostring(timeout))
  end
  local stall = opts.stall_report_s
  if stall ~= nil and (type(stall) ~= "number" or not (stall > 0)) then
    raise("init_process_group: stall_report_s must be a number of seconds > 0, got " .. tostring(stall))
  end
  local device
  if backend == "nccl" then
    device = nccl_device(opts, env.local_rank or rank)
    -- Fail before the rendezvous when NCCL cannot work here (the error the C side gives).
    local why = ffi.new("char[512]")
    if C.ddp_pg_nccl_available(why, 512) == 0 then
      raise("nccl backend: " .. ffi.string(why))
    end
  end
  if opts.store_secret ~= nil and type(opts.store_secret) ~= "string" then
    raise("init_process_group: store_secret must be a string, got " .. type(opts.store_secret))
  end
  local store = opts.store
  if not store then -- Note [re-initialising the default group]
    local init_method = opts.init_method or "env://"
    local key = rendezvous_key(init_method, rank, world_size, opts.store_secret)
    local kept = state.rendezvous
    if kept and key and kept.key == key then
      store = kept.store
      store:set_timeout(timeout)
    else
      state.rendezvous = nil
      if kept then kept.store:close() end
      store = make_store(init_method, rank, world_size, timeout, opts.store_secret)
      if key then state.rendezvous = { key = key, store = store } end
    end
  end
  local inits = state.inits
  local group_name = opts.group_name or (inits == 0 and "pg" or ("pg@" .. inits))
  if backend == "nccl" then
    check(C.ddp_pg_new_nccl(pg_box, store:handle(), rank, world_size, group_name, timeout, device))
    check(C.ddp_cuda_set_device(device))
  else
    check(C.ddp_pg_new_gloo(pg_box, store:handle(), rank, world_size, group_name, timeout))
  end
  state.inits = inits + 1
  if stall then check(C.ddp_pg_set_stall_report(pg_box[0], stall)) end
  local ranks = {}
  for i = 1, world_size do ranks[i] = i - 1 end
  state.group = Group.new(pg_box[0], ranks, { store = store, backend = backend })
  state.store = store
  state.owns_store = opts.store == nil -- a store the caller passed outlives the group
  state.backend = backend
  state.local_rank = env.local_rank or rank
end

--- True once init_process_group succeeded (and destroy_process_group has not run).
function M.is_initialized() return state.group ~= nil end

--- True: this build has the gloo backend.
function M.is_available() return true end
function M.is_gloo_available() return true end
--- True when the nccl backend can work here: the CUDA plug-in loaded, a device exists and
-- the plug-in has NCCL (the simulated device has not).
function M.is_nccl_available() return C.ddp_pg_nccl_available(nil, 0) ~= 0 end

local function default_group(op)
  local g = state.group
  if not g then raise(op .. ": the default process group is not initialised (call init_process_group)") end
  return g
end

local function group_of(opts, op)
  local g = opts and opts.group
  if g == nil then return default_group(op) end
  if getmetatable(g) ~= Group then raise(op .. ": group must be a process group from new_group") end
  return g
end

--- dist.get_rank(group) -> this process's rank in group (default: the world; -1 when not a
-- member of group).
function M.get_rank(group)
  if group then return group:rank() end
  return default_group("get_rank"):rank()
end

--- dist.get_world_size(group) -> number of ranks in group (default: the world).
function M.get_world_size(group)
  if group then return group:size() end
  return default_group("get_world_size"):size()
end

--- dist.get_local_rank() -> rank on this node (LOCAL_RANK, SLURM_LOCALID or
-- OMPI_COMM_WORLD_LOCAL_RANK; the global rank when none is set).
function M.get_local_rank()
  default_group("get_local_rank")
  return state.local_rank
end

--- dist.get_backend(group) -> "gloo" or "nccl".
function M.get_backend(group)
  return (group or default_group("get_backend")).backend
end

--- dist.get_default_group() -> the world's process group object (its `handle` field is the
-- ddp_pg* for C code such as the DDP reducer).
function M.get_default_group()
  return default_group("get_default_group")
end

--- dist.get_store() -> the default group's store object.
function M.get_store()
  default_group("get_store")
  return state.store
end

--- dist.get_process_group_ranks(group) -> list of the global ranks of group's members.
function M.get_process_group_ranks(group)
  local g = group or default_group("get_process_group_ranks")
  local r = {}
  for i, v in ipairs(g.ranks) do r[i] = v end
  return r
end

local NEW_GROUP_KNOWN = options.known { "timeout" }

--- dist.new_group(ranks, opts) -> a subgroup of the world with the given global ranks
-- (default: all). Every rank must call it, in the same order relative to other new_group
-- calls, with the same list; on ranks not in the list the returned group is not usable
-- (get_rank(group) is -1 there). opts.timeout: seconds for its collectives (default: the
-- world's).
function M.new_group(ranks, opts)
  opts = options.check("new_group", opts, NEW_GROUP_KNOWN)
  local world = default_group("new_group")
  if ranks == nil then ranks = world.ranks end
  if type(ranks) ~= "table" then raise("new_group: ranks must be a list of ranks, got " .. type(ranks)) end
  local n = #ranks
  local buf = ffi.new("int[?]", math.max(n, 1))
  local list = {}
  for i = 1, n do
    local r = ranks[i]
    if type(r) ~= "number" or r ~= math.floor(r) then
      raise(("new_group: entry %d of ranks must be an integer, got %s"):format(i, tostring(r)))
    end
    buf[i - 1] = r
    list[i] = r
  end
  check(C.ddp_pg_new_group(pg_box, world.handle, buf, n))
  local g = Group.new(pg_box[0], list, { parent = world, store = state.store, backend = world.backend })
  world.children[#world.children + 1] = g
  if opts.timeout and g.handle then check(C.ddp_pg_set_timeout(g.handle, opts.timeout)) end
  return g
end

--- dist.new_subgroups(group_size, opts) -> the subgroup of this rank, the list of every
-- subgroup: as torch.distributed.new_subgroups, the world cut into world/group_size groups
-- of consecutive ranks ([0, group_size), [group_size, 2 group_size), ...). group_size
-- defaults to the ranks per node (LOCAL_WORLD_SIZE, else the world). Every rank must call
-- it (each subgroup is a new_group every rank takes part in). opts.timeout as new_group.
-- Raises "new_subgroups: The arg 'group_size' (0) must be positive", "... must not exceed
-- the world size (2)" and "... The world size (3) must be divisible by 'group_size' (2)".
function M.new_subgroups(group_size, opts)
  local world = default_group("new_subgroups")
  local n = world:size()
  if group_size == nil then group_size = tonumber(os.getenv("LOCAL_WORLD_SIZE") or "") or n end
  if type(group_size) ~= "number" or group_size ~= math.floor(group_size) then
    raise(("new_subgroups: The arg 'group_size' must be an integer, got %s"):format(tostring(group_size)))
  end
  if group_size <= 0 then
    raise(("new_subgroups: The arg 'group_size' (%d) must be positive"):format(group_size))
  end
  if group_size > n then
    raise(("new_subgroups: The arg 'group_size' (%d) must not exceed the world size (%d)"):format(group_size, n))
  end
  if n % group_size ~= 0 then
    raise(("new_subgroups: The world size (%d) must be divisible by 'group_size' (%d)"):format(n, group_size))
  end
  local me, mine, all = world:rank(), nil, {}
  for first = 0, n - 1, group_size do
    local ranks = {}
    for r = first, first + group_size - 1 do ranks[#ranks + 1] = r end
    local g = M.new_group(ranks, opts)
    all[#all + 1] = g
    if me >= first and me < first + group_size then mine = g end
  end
  return mine, all
end

--- dist.set_timeout(seconds, group): timeout of the collectives started from now on.
function M.set_timeout(seconds, group)
  check(C.ddp_pg_set_timeout((group or default_group("set_timeout")):ptr("set_timeout"), seconds))
end

--- dist.destroy_process_group(group): free group (default: the world and every subgroup,
-- then the store, unless the store was passed to init_process_group as `store`, which the
-- caller keeps, as in PyTorch). Queued work finishes first; peers still waiting on this rank
-- then see it disconnect. Also frees an aborted group (abort_process_group), after which
-- init_process_group may make a new one.
function M.destroy_process_group(group)
  if group and group ~= state.group then
    group:destroy()
    return
  end
  local g = default_group("destroy_process_group")
  g:destroy()
  -- a TCP rendezvous store is kept for the next init (Note [re-initialising the default group])
  local kept = state.rendezvous and state.rendezvous.store == state.store
  if state.owns_store and not kept and state.store and state.store.close then state.store:close() end
  state.group, state.store, state.backend = nil, nil, nil
end

-- ---- collectives ------------------------------------------------------------------------

-- The source prefix of the library's own files ("@/.../lua/ddplua/"): call sites skip them
-- (this file's name must be stripped: the pattern once named distributed/init.lua, which left
-- the whole path of this file, so the frames of the other library modules counted as calls).
local lib_prefix = (debug.getinfo(1, "S").source:gsub("distributed/distributed_c10d%.lua$", ""))

-- Note [collective fingerprints] (runtime/comm/pg_fingerprint.h): record the Lua
-- caller of the collective about to be submitted (the first frame outside the library, so
-- DDP's and the helpers' collectives name the user's line), for mismatch messages. Once
-- per collective, so kept cheap: debug.getinfo with "fl" creates no strings, and each
-- function's short source (and whether to skip it: the library's, or a C function such as
-- pcall) is looked up once and cached: about 0.25 us a call against 0.7 us for "Sl".
local getinfo = debug.getinfo
local source_of = setmetatable({}, { __mode = "k" }) -- function -> {short_src, skip}

local function set_call_site()
  for level = 3, 12 do
    local i = getinfo(level, "fl")
    if not i then return end
    local s = source_of[i.func]
    if not s then
      local si = getinfo(i.func, "S")
      s = { si.short_src, si.what == "C" or si.source:sub(1, #lib_prefix) == lib_prefix }
      source_of[i.func] = s
    end
    if not s[2] then
      C.ddp_pg_set_call_site(s[1], i.currentline)
      return
    end
  end
  C.ddp_pg_set_call_site(nil, 0)
end

-- Finish a submitted call: a Work for async_op, else nil (the call already waited).
-- outputs: the output tensors, the value of the Work's get_future().
local function finish(opts, keep, after, outputs)
  if opts and opts.async_op then return Work.new(work_box[0], keep, after, outputs) end
  if after then after() end
  return nil
end

local function wbox(opts) return opts and opts.async_op and work_box or nil end

--- dist.all_reduce(t, {op = "sum", group =, async_op = false}): in place, t on every rank
-- becomes op over all ranks' t. op: "sum", "avg" (floating dtypes), "min", "max",
-- "product". Returns a Work when async_op, else nil.
function M.all_reduce(t, opts)
  set_call_site()
  local g = group_of(opts, "all_reduce")
  tensor_arg(t, "all_reduce", "tensor")
  check(C.ddp_pg_allreduce(wbox(opts), g:ptr("all_reduce"), t, op_arg(opts, "all_reduce")))
  return finish(opts, nil, nil, { t })
end

local SHARED_KNOWN = options.known { "dtype", "group" }
local placed_box = ffi.new("int[1]")

--- dist.shared_buffer(shape, {dtype = "f32", group =}) -> a zero-filled CPU tensor of
-- `shape` (a number or a list of sizes) in the shared memory of the group's ranks on this
-- host, and whether it went there (boolean). All-reduces of such tensors (the same call on
-- every rank) read the peers' tensors in place, with no staging copy, and a broadcast reads
-- the root's; any other use is an ordinary tensor. When the group has no shared memory (ranks
-- on several hosts, DDPLUA_SHM=0, nccl) the tensor is ordinary memory and the second result
-- false. Up to 1 GiB per rank; no collective (ranks need not call it together). Raises
-- "shared_buffer: no room ..." when this rank's part is full. DDP's gradient buckets live
-- there already.
function M.shared_buffer(shape, opts)
  opts = options.check("shared_buffer", opts, SHARED_KNOWN)
  local g = group_of(opts, "shared_buffer")
  local dims, nd = lib.shape(type(shape) == "number" and { shape } or shape)
  check(C.ddp_pg_shared_zeros(tbox, g:ptr("shared_buffer"), nd, dims,
                              lib.dtype(opts and opts.dtype, C.DDP_F32), placed_box))
  return lib.wrap(tbox[0]), placed_box[0] == 1
end

--- dist.broadcast(t, src, opts): t of global rank src copied into t on every rank.
function M.broadcast(t, src, opts)
  set_call_site()
  local g = group_of(opts, "broadcast")
  tensor_arg(t, "broadcast", "tensor")
  check(C.ddp_pg_broadcast(wbox(opts), g:ptr("broadcast"), t, g:group_rank(src, "broadcast: src")))
  return finish(opts, nil, nil, { t })
end

--- dist.all_gather(out, t, opts): out is a list of world-size tensors of t's shape and dtype
-- (entry i, 1-based, receives the t of group rank i-1) or one tensor (world, ...t's shape).
function M.all_gather(out, t, opts)
  set_call_site()
  local g = group_of(opts, "all_gather")
  tensor_arg(t, "all_gather", "tensor")
  local h = g:ptr("all_gather")
  if tensor.is_tensor(out) then
    check(C.ddp_pg_allgather(wbox(opts), h, out, t))
    return finish(opts, nil, nil, { out })
  end
  if type(out) ~= "table" then raise("all_gather: output must be a list of tensors or a tensor") end
  local n = #out
  local arr = ffi.new("ddp_tensor*[?]", math.max(n, 1))
  for i = 1, n do arr[i - 1] = tensor_arg(out[i], "all_gather", "output entry " .. i) end
  check(C.ddp_pg_allgather_list(wbox(opts), h, arr, n, t))
  return finish(opts, out, nil, out)
end
--- dist.all_gather_into_tensor(output_tensor, input_tensor, {group =, async_op =}), as
-- torch.distributed: input_tensor (k, ...) of every group rank r lands in chunk r+1 of
-- output_tensor, which is (world * k, ...) (concatenated along dimension 1) or
-- (world, k, ...) (stacked), of input_tensor's dtype. One collective (through shared
-- memory when every rank is on this host, else Gloo; NCCL's ncclAllGather). Raises
-- "all_gather_into_tensor: output_tensor must have shape ..." naming the expected and the
-- given shape. Returns a Work when async_op, else nil.
function M.all_gather_into_tensor(output_tensor, input_tensor, opts)
  set_call_site()
  local g = group_of(opts, "all_gather_into_tensor")
  tensor_arg(output_tensor, "all_gather_into_tensor", "output_tensor")
  tensor_arg(input_tensor, "all_gather_into_tensor", "input_tensor")
  check(C.ddp_pg_allgather_into_tensor(wbox(opts), g:ptr("all_gather_into_tensor"), output_tensor,
                                       input_tensor))
  return finish(opts, nil, nil, { output_tensor })
end

--- dist.reduce_scatter(out, input, opts): input is one tensor (world * m, ...) or a list of
-- world tensors of out's shape; out (m, ...) receives op over all ranks of the chunk at this
-- rank's index. op as all_reduce.
function M.reduce_scatter(out, input, opts)
  set_call_site()
  local g = group_of(opts, "reduce_scatter")
  tensor_arg(out, "reduce_scatter", "output")
  if not tensor.is_tensor(input) then
    if type(input) ~= "table" then raise("reduce_scatter: input must be a tensor or a list of tensors") end
    for i = 1, #input do tensor_arg(input[i], "reduce_scatter", "input entry " .. i) end
    if #input ~= g:size() then
      raise(("reduce_scatter: the input list has %d tensors but the group has %d ranks"):format(#input, g:size()))
    end
    input = require("ddplua.functions").cat(input, 1)
  end
  check(C.ddp_pg_reduce_scatter(wbox(opts), g:ptr("reduce_scatter"), out, input,
                                op_arg(opts, "reduce_scatter")))
  return finish(opts, input, nil, { out })
end

--- dist.reduce_scatter_tensor(output, input, {op = "sum", group =, async_op =}), as
-- torch.distributed: input (world * k, ...) or (world, k, ...), output (k, ...) of input's
-- dtype; output receives op over every group rank of chunk (rank + 1) of input (rows
-- rank*k+1 .. rank*k+k). op as all_reduce. input is not modified. One collective: through
-- shared memory each rank reduces its own 1/world share in the segment (f32, f64; f16/bf16
-- through f32), else a Gloo ring sending (world-1)/world of the input per rank (never a
-- whole all-reduce); NCCL's ncclReduceScatter. Raises "reduce_scatter_tensor: input must
-- have shape ..." naming the expected and the given shapes. Returns a Work when async_op.
function M.reduce_scatter_tensor(output, input, opts)
  set_call_site()
  local g = group_of(opts, "reduce_scatter_tensor")
  tensor_arg(output, "reduce_scatter_tensor", "output")
  tensor_arg(input, "reduce_scatter_tensor", "input")
  check(C.ddp_pg_reduce_scatter_tensor(wbox(opts), g:ptr("reduce_scatter_tensor"), output, input,
                                       op_arg(opts, "reduce_scatter_tensor")))
  return finish(opts, nil, nil, { output })
end

-- The C array of a list of tensors for a coalesced call (arg names the list).
local function tensor_list(list, name, arg)
  if type(list) ~= "table" or tensor.is_tensor(list) then
    raise(("%s: %s must be a list of tensors, got %s"):format(name, arg, type(list)))
  end
  local arr = ffi.new("ddp_tensor*[?]", math.max(#list, 1))
  for i = 1, #list do arr[i - 1] = tensor_arg(list[i], name, ("%s entry %d"):format(arg, i)) end
  return arr, #list
end

-- Both lists of a coalesced call, of the same length.
local function tensor_lists(outputs, inputs, name)
  local outs, n = tensor_list(outputs, name, "outputs")
  local ins, m = tensor_list(inputs, name, "inputs")
  if n ~= m then raise(("%s: %d outputs but %d inputs"):format(name, n, m)) end
  return outs, ins, n
end

--- dist.reduce_scatter_tensor_coalesced(outputs, inputs, {op =, group =, async_op =}):
-- reduce_scatter_tensor of every pair (outputs[i], inputs[i]) in ONE collective over a
-- packed buffer (PyTorch's coalesced form, what its _coalescing_manager makes of a
-- sequence of reduce_scatter_tensor calls): the inputs are copied into one buffer when the
-- call is made, the outputs out of the result when it finishes. Every tensor of one dtype
-- and device; outputs contiguous. Errors name the pair ("output 2", "input 2").
function M.reduce_scatter_tensor_coalesced(outputs, inputs, opts)
  set_call_site()
  local name = "reduce_scatter_tensor_coalesced"
  local g = group_of(opts, name)
  local outs, ins, n = tensor_lists(outputs, inputs, name)
  check(C.ddp_pg_reduce_scatter_tensor_coalesced(wbox(opts), g:ptr(name), outs, ins, n,
                                                 op_arg(opts, name)))
  return finish(opts, { outputs, inputs }, nil, outputs)
end

--- dist.all_gather_into_tensor_coalesced(outputs, inputs, {group =, async_op =}):
-- all_gather_into_tensor of every pair in ONE collective over a packed buffer (as
-- reduce_scatter_tensor_coalesced).
function M.all_gather_into_tensor_coalesced(outputs, inputs, opts)
  set_call_site()
  local name = "all_gather_into_tensor_coalesced"
  local g = group_of(opts, name)
  local outs, ins, n = tensor_lists(outputs, inputs, name)
  check(C.ddp_pg_allgather_into_tensor_coalesced(wbox(opts), g:ptr(name), outs, ins, n))
  return finish(opts, { outputs, inputs }, nil, outputs)
end

--- dist.reduce(t, dst, opts): t of global rank dst becomes op over all ranks' t; other ranks'
-- t is unchanged. op as all_reduce.
function M.reduce(t, dst, opts)
  set_call_site()
  local g = group_of(opts, "reduce")
  tensor_arg(t, "reduce", "tensor")
  check(C.ddp_pg_reduce(wbox(opts), g:ptr("reduce"), t, g:group_rank(dst, "reduce: dst"), op_arg(opts, "reduce")))
  return finish(opts, nil, nil, { t })
end

--- dist.gather(t, gather_list, dst, opts): on global rank dst, gather_list (a list of world
-- tensors of t's shape, or one (world, ...) tensor) receives every rank's t in rank order;
-- other ranks pass nil.
function M.gather(t, gather_list, dst, opts)
  set_call_site()
  local g = group_of(opts, "gather")
  tensor_arg(t, "gather", "tensor")
  dst = dst or 0
  local h = g:ptr("gather")
  local root = g:group_rank(dst, "gather: dst")
  local out, after = nil, nil
  if gather_list ~= nil then
    if tensor.is_tensor(gather_list) then
      out = gather_list
    else
      if type(gather_list) ~= "table" then raise("gather: gather_list must be a list of tensors or a tensor") end
      if #gather_list ~= g:size() then
        raise(("gather: gather_list has %d tensors but the group has %d ranks"):format(#gather_list, g:size()))
      end
      local shape = t:size()
      table.insert(shape, 1, g:size())
      out = empty_like_device(shape, t:type(), t)
      after = function()
        for i = 1, #gather_list do gather_list[i]:copy_(out:select(1, i)) end
      end
    end
  end
  check(C.ddp_pg_gather(wbox(opts), h, out, t, root))
  return finish(opts, { out, gather_list }, after)
end

--- dist.scatter(t, scatter_list, src, opts): every rank's t receives entry (rank + 1) of
-- scatter_list (a list of world tensors of t's shape, or one (world, ...) tensor) of global
-- rank src; other ranks pass nil.
function M.scatter(t, scatter_list, src, opts)
  set_call_site()
  local g = group_of(opts, "scatter")
  tensor_arg(t, "scatter", "tensor")
  src = src or 0
  local h = g:ptr("scatter")
  local root = g:group_rank(src, "scatter: src")
  local input = scatter_list
  if input ~= nil and not tensor.is_tensor(input) then
    if type(input) ~= "table" then raise("scatter: scatter_list must be a list of tensors or a tensor") end
    if #input ~= g:size() then
      raise(("scatter: scatter_list has %d tensors but the group has %d ranks"):format(#input, g:size()))
    end
    input = require("ddplua.functions").stack(input, 1)
  end
  check(C.ddp_pg_scatter(wbox(opts), h, t, input, root))
  return finish(opts, input)
end

--- dist.all_to_all(out, input, opts): tensors (world * m, ...) of the same shape: chunk j
-- of rank i's input goes to chunk i of rank j's out. Lists of world tensors work too
-- (entry j goes to rank j; entry i of out comes from rank i).
function M.all_to_all(out, input, opts)
  set_call_site()
  local g = group_of(opts, "all_to_all")
  local h = g:ptr("all_to_all")
  local dl = require("ddplua.functions")
  local after
  local out_t, in_t = out, input
  if not tensor.is_tensor(input) then
    if type(input) ~= "table" or #input ~= g:size() then
      raise(("all_to_all: input must be a tensor or a list of %d tensors"):format(g:size()))
    end
    in_t = dl.stack(input, 1)
  end
  if not tensor.is_tensor(out) then
    if type(out) ~= "table" or #out ~= g:size() then
      raise(("all_to_all: output must be a tensor or a list of %d tensors"):format(g:size()))
    end
    out_t = empty_like_device(in_t:size(), in_t:type(), in_t)
    after = function()
      for i = 1, #out do out[i]:copy_(out_t:select(1, i)) end
    end
  end
  check(C.ddp_pg_alltoall(wbox(opts), h, out_t, in_t))
  return finish(opts, { out_t, in_t, out }, after)
end

-- Split sizes of all_to_all_single as an int64 array (nil: even).
local function split_sizes(v, what)
  if v == nil then return nil, 0 end
  if type(v) ~= "table" then
    raise(("all_to_all_single: %s must be a list of row counts, got %s"):format(what, type(v)))
  end
  local arr = ffi.new("int64_t[?]", math.max(#v, 1))
  for i = 1, #v do
    local x = v[i]
    if type(x) ~= "number" or x ~= math.floor(x) then
      raise(("all_to_all_single: %s entry %d must be an integer, got %s"):format(what, i, tostring(x)))
    end
    arr[i - 1] = x
  end
  return arr, #v
end

--- dist.all_to_all_single(output, input, {output_split_sizes =, input_split_sizes =, group =,
-- async_op =}), as torch.distributed: input's rows (dimension 1) go out in rank order,
-- input_split_sizes[j+1] of them to group rank j (default: dimension 1 split evenly);
-- output receives output_split_sizes[i+1] rows from group rank i, in rank order (default:
-- even). Same dtype and shape past dimension 1. Each rank's input_split_sizes[j+1] must
-- equal rank j's output_split_sizes[i+1] (not checked, as PyTorch). Errors name the list
-- and the sizes ("input_split_sizes sum to 5 rows but input has 6 (shape (6, 2))").
function M.all_to_all_single(output, input, opts)
  set_call_site()
  local g = group_of(opts, "all_to_all_single")
  tensor_arg(output, "all_to_all_single", "output")
  tensor_arg(input, "all_to_all_single", "input")
  local os_, on = split_sizes(opts and opts.output_split_sizes, "output_split_sizes")
  local is_, inn = split_sizes(opts and opts.input_split_sizes, "input_split_sizes")
  check(C.ddp_pg_alltoall_single(wbox(opts), g:ptr("all_to_all_single"), output, input, os_, on,
                                 is_, inn))
  return finish(opts, nil, nil, { output })
end

--- dist.send(t, dst, opts{tag = 0}): send t to global rank dst.
function M.send(t, dst, opts)
  local g = group_of(opts, "send")
  tensor_arg(t, "send", "tensor")
  check(C.ddp_pg_send(wbox(opts), g:ptr("send"), t, g:group_rank(dst, "send: dst"), opts and opts.tag or 0))
  return finish(opts)
end

--- dist.recv(t, src, opts{tag = 0}): receive into t from global rank src (required).
function M.recv(t, src, opts)
  local g = group_of(opts, "recv")
  tensor_arg(t, "recv", "tensor")
  check(C.ddp_pg_recv(wbox(opts), g:ptr("recv"), t, g:group_rank(src, "recv: src"), opts and opts.tag or 0))
  return finish(opts)
end

--- dist.isend / dist.irecv: send / recv returning a Work.
function M.isend(t, dst, opts)
  local o = { group = opts and opts.group, tag = opts and opts.tag, async_op = true }
  return M.send(t, dst, o)
end
function M.irecv(t, src, opts)
  local o = { group = opts and opts.group, tag = opts and opts.tag, async_op = true }
  return M.recv(t, src, o)
end

--- dist.barrier(opts): returns once every rank of the group reached it. As in PyTorch's Gloo
-- group it orders the collectives only: an isend/irecv still in flight is not waited for
-- (wait on its work handle).
function M.barrier(opts)
  set_call_site()
  local g = group_of(opts, "barrier")
  check(C.ddp_pg_barrier(wbox(opts), g:ptr("barrier")))
  return finish(opts)
end

--- dist.dump_flight_recorder(group): write the group's (default: the world's) flight
-- recorder -- its last 2000 collectives with their call sites and times -- to stderr.
-- kill -USR1 <pid> does the same for every group of a rank.
function M.dump_flight_recorder(group)
  local g = group or default_group("dump_flight_recorder")
  check(C.ddp_pg_dump_flight_recorder(g:ptr("dump_flight_recorder"), 2))
end

--- dist.monitored_barrier(opts{group =, timeout =, wait_all_ranks = false}) (or
-- dist.monitored_barrier(timeout)): a barrier through the store that names the ranks that did
-- not arrive within timeout seconds (default: the group's timeout), as PyTorch's: group rank 0
-- raises "monitored_barrier: rank(s) ... did not arrive within <t> s" (the first missing rank,
-- or all of them with wait_all_ranks); the others raise when rank 0 does not release them.
-- Not a collective of the group (no fingerprint): it works while the group is stuck.
function M.monitored_barrier(opts)
  if type(opts) == "number" then opts = { timeout = opts } end
  local g = group_of(opts, "monitored_barrier")
  local timeout = opts and opts.timeout or C.ddp_pg_get_timeout(g:ptr("monitored_barrier"))
  if type(timeout) ~= "number" or not (timeout > 0) then
    raise("monitored_barrier: timeout must be a number of seconds > 0, got " .. tostring(timeout))
  end
  if not g:is_member() then raise("monitored_barrier: this rank is not a member of the group") end
  require("ddplua.distributed.monitored_barrier").run(state.store, g.ranks, g:rank(), timeout,
                                                      opts and opts.wait_all_ranks)
end

--- dist.abort_process_group(group): abort group (default: the world) on every rank, as
-- PyTorch's abort_process_group and NCCL's ncclCommAbort: the group's collectives pending on
-- any rank, and every later one, raise within about a second with "<collective> on rank N:
-- the process group was aborted: abort_process_group called on rank <this rank> at
-- <file:line>" (or the group's earlier failure, when one came first: every failed or
-- timed-out collective aborts its group the same way). The group cannot be used again:
-- destroy_process_group(group) and make a new one (init_process_group: env:// and tcp:// give
-- the new default group its own keys, Note [re-initialising the default group]; on a store of
-- your own pass another group_name, since the abort stays recorded in the store under the
-- group's name). Idempotent. Raises for a group that was destroyed.
function M.abort_process_group(group)
  set_call_site()
  local g = group or default_group("abort_process_group")
  if getmetatable(g) ~= Group then raise("abort_process_group: group must be a process group") end
  check(C.ddp_pg_abort(g:ptr("abort_process_group"), nil))
end

--- dist.is_aborted(group) -> true when group (default: the world) was aborted, by
-- abort_process_group on any rank or by a failed collective (the collectives' errors name
-- the first failure).
function M.is_aborted(group)
  local g = group or default_group("is_aborted")
  return C.ddp_pg_is_aborted(g:ptr("is_aborted")) ~= 0
end

-- ---- helpers ------------------------------------------------------------------------------

--- dist.reduce_tensor(t, opts) -> a new tensor: the mean of t over the ranks of opts.group
-- (default: the world), in t's dtype when floating, else in f32. For logging metrics.
function M.reduce_tensor(t, opts)
  tensor_arg(t, "reduce_tensor", "tensor")
  local d = t:detach()
  local r = d:is_floating_point() and d:clone() or d:to("f32")
  M.all_reduce(r, { op = "avg", group = opts and opts.group })
  return r
end

--- dist.sum_over_ranks(values, opts) -> a new list: element i is the sum of values[i] over
-- the ranks of opts.group (default: the world). values: a Lua list of numbers (metric sums:
-- loss, correct, count), reduced in f64, so counts below 2^53 stay exact. opts.device: where
-- the reduction runs ("cpu", "cuda:k"); default the current CUDA device on an nccl group
-- (nccl takes device tensors only), else "cpu". Raises as all_reduce.
function M.sum_over_ranks(values, opts)
  local g = group_of(opts, "sum_over_ranks")
  local device = opts and opts.device
  if device == nil then
    local dl = require "ddplua.functions"
    device = g.backend == "nccl" and ("cuda:" .. dl.cuda.current_device()) or "cpu"
  end
  local t = require("ddplua.functions").tensor(values, { dtype = "f64", device = device })
  M.all_reduce(t, { group = opts and opts.group })
  return t:tolist()
end

--- dist.generator_for_rank(seed) -> a dl.Generator seeded seed + rank (rank 0 when not
-- initialised): independent random streams per rank (dropout, augmentation).
function M.generator_for_rank(seed)
  local rank = state.group and state.group:rank() or 0
  return require("ddplua.functions").Generator((seed or 0) + rank)
end

--- dist.is_main_process() -> true on rank 0, and when no group is initialised.
function M.is_main_process()
  return not state.group or state.group:rank() == 0
end

--- dist.print0(...): print on rank 0 only (everywhere when not initialised).
function M.print0(...)
  if M.is_main_process() then print(...) end
end

--- Internal helpers for the modules under ddplua.distributed that submit collectives of
-- their own (ddplua.distributed.nn.functional): group_of(opts, op) -> the group of
-- opts.group or the default one (raises naming op); op_arg(opts, name) -> the enum
-- ddp_reduce_op of opts.op (default "sum"; raises for an unknown name); set_call_site()
-- records the first caller outside the library for the next collective's fingerprint.
M._internal = { group_of = group_of, op_arg = op_arg, set_call_site = set_call_site }

return M
