--- ddplua.nn.data_parallel: nn.DataParallel, single-process data parallelism over several
-- devices, as torch.nn.DataParallel.
--
--   local net = Net():cuda(0)                       -- parameters on device_ids[1]
--   local dp = nn.DataParallel(net, {device_ids = {0, 1}})
--   local opt = optim.SGD(net:parameters(), {lr = 0.1})
--   local loss = F.cross_entropy(dp(x), y:cuda(0))  -- x (B, ...) on any device
--   loss:backward()                                 -- gradients land on net's parameters
--
-- Each forward (Note [data parallel]):
--  1. scatter: every tensor argument is cut along `dim` (Lua 1-based, default 1, the batch)
--     into at most #device_ids chunks of ceil(B / n) (t:chunk) and chunk i is moved to
--     device_ids[i]; tables of tensors are scattered entry by entry; other values are given
--     to every replica as they are. A batch smaller than the device count uses fewer
--     devices.
--  2. replicate: replica 1 is the module itself (its parameters live on device_ids[1]);
--     replica i > 1 is a shallow copy of the module tree whose parameters are
--     differentiable copies p:to(device_ids[i]) of the originals and whose buffers are
--     plain copies. Backward through those copies (autograd's to-device backward) moves
--     each replica's gradient back to device_ids[1] and sums it into the original
--     parameter's .grad: the gradients equal those of the whole batch on one device (up
--     to the order of floating-point sums).
--  3. run: the replicas' forwards run one after another on this thread. Their kernels are
--     queued asynchronously on each device's current stream, so on real GPUs the devices
--     still overlap; the host side is sequential (PyTorch uses one thread per device).
--  4. gather: the outputs (tensors, or tables of them, the same shape on every replica)
--     are moved to output_device (default device_ids[1]) and concatenated along `dim`;
--     0-d outputs (a loss per replica) become a vector of one value per replica.
-- Buffers updated in forward (BatchNorm's running statistics) are kept from replica 1
-- only, as in PyTorch. With one device the module just runs on it; without CUDA (no
-- device_ids) DataParallel calls the module unchanged.
--
-- PyTorch recommends DistributedDataParallel (one process per device) over DataParallel
-- for speed; so does ddplua (ddplua.distributed).
local options = require "ddplua.options"
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local module = require "ddplua.nn.module"
local ffi, C = lib.ffi, lib.C

local DataParallel = module.Module:extend("DataParallel")

local function device_number(d, what)
  local ok, k = pcall(dl.cuda.parse_device, d)
  if not ok or k < 0 then
    lib.raise(("DataParallel: %s must be a CUDA device (a number k or 'cuda:k'), got %s"):format(what, tostring(d)))
  end
  return k
end

local KNOWN = options.known { "device_ids", "output_device", "dim" }

--- nn.DataParallel(module, opts) -> a Module running `module` on several devices.
-- opts.device_ids: list of device numbers (or "cuda:k"), default every device
-- (0 .. dl.cuda.device_count()-1; none without CUDA); opts.output_device: where outputs are
-- gathered (default device_ids[1]); opts.dim: the dimension to scatter and gather along
-- (1-based, default 1). `module` must have its parameters and buffers on device_ids[1]
-- (checked at each forward, as PyTorch). Its state_dict names are "module.<name>", as
-- PyTorch's. Raises for a device that does not exist.
function DataParallel:init(mod, opts)
  if not module.is_module(mod) then lib.raise("DataParallel: expected a Module, got " .. type(mod)) end
  opts = options.check("DataParallel", opts, KNOWN)
  for k in pairs(opts) do
    if k ~= "device_ids" and k ~= "output_device" and k ~= "dim" then
      lib.raise("DataParallel: unknown option '" .. tostring(k) .. "'")
    end
  end
  self.module = mod
  local ids = {}
  if opts.device_ids ~= nil then
    if type(opts.device_ids) ~= "table" then lib.raise("DataParallel: device_ids must be a list of devices") end
    for i, d in ipairs(opts.device_ids) do ids[i] = device_number(d, "device_ids[" .. i .. "]") end
  elseif dl.cuda.is_available() then
    for k = 0, dl.cuda.device_count() - 1 do ids[#ids + 1] = k end
  end
  local count = dl.cuda.device_count()
  for i, k in ipairs(ids) do
    if k >= count then
      lib.raise(("DataParallel: device_ids[%d] is cuda:%d but there %s %d CUDA device%s%s"):format(i, k,
        count == 1 and "is" or "are", count, count == 1 and "" or "s",
        count == 0 and (" (" .. dl.cuda.unavailable_reason() .. ")") or ""))
    end
  end
  self.device_ids = ids
  self.output_device = opts.output_device ~= nil and device_number(opts.output_device, "output_device") or ids[1]
  local dim = opts.dim or 1
  if type(dim) ~= "number" or dim % 1 ~= 0 or dim == 0 then
    lib.raise("DataParallel: dim must be a non-zero integer (dimensions count from 1), got " .. tostring(dim))
  end
  self.dim = dim
end

-- ---- scatter ---------------------------------------------------------------------------

-- Number of chunks `v` (a tensor or a table holding tensors) is cut into, or nil.
local function chunk_count(v, n, dim)
  if dl.is_tensor(v) then
    local size = v:size(dim)
    return math.min(n, size == 0 and 1 or math.ceil(size / math.ceil(size / n)))
  elseif type(v) == "table" and not module.is_module(v) then
    for _, x in pairs(v) do
      local c = chunk_count(x, n, dim)
      if c then return c end
    end
  end
  return nil
end

-- v cut into `count` pieces, piece i on devices[i].
local function scatter_value(v, devices, count, dim)
  if dl.is_tensor(v) then
    local parts = v:chunk(count, dim)
    if #parts ~= count then
      lib.raise(("DataParallel: inputs of dimension %d sizes give %d and %d chunks; every tensor argument must "
        .. "have the same batch size"):format(dim, count, #parts))
    end
    local out = {}
    for i = 1, count do out[i] = parts[i]:to(dl.cuda.device_name(devices[i])) end
    return out
  elseif type(v) == "table" and not module.is_module(v) and getmetatable(v) == nil then
    local out = {}
    for i = 1, count do out[i] = {} end
    for k, x in pairs(v) do
      local parts = scatter_value(x, devices, count, dim)
      for i = 1, count do out[i][k] = parts[i] end
    end
    return out
  end
  local out = {}
  for i = 1, count do out[i] = v end
  return out
end

--- DataParallel.scatter(args, devices, dim) -> list of argument lists, one per device used
-- (at most #devices; fewer for a small batch). args: a list of the forward's arguments
-- (with .n for trailing nils).
function DataParallel.scatter(args, devices, dim)
  local nargs = args.n or #args
  local count
  for i = 1, nargs do
    count = chunk_count(args[i], #devices, dim)
    if count then break end
  end
  count = count or #devices
  local per = {}
  for i = 1, count do per[i] = { n = nargs } end
  for a = 1, nargs do
    local parts = scatter_value(args[a], devices, count, dim)
    for i = 1, count do per[i][a] = parts[i] end
  end
  return per
end

-- ---- replicate -------------------------------------------------------------------------

local function tensor_key(t) return tonumber(ffi.cast("intptr_t", t)) end

local function copy_odict(d, map)
  local out = { names = {}, values = {}, has = {} }
  for i, name in ipairs(d.names) do
    out.names[i] = name
    out.has[name] = true
    local v = d.values[name]
    if v ~= nil then v = map(v) end
    out.values[name] = v
  end
  return out
end

--- DataParallel.replicate(mod, devices) -> list of replicas: mod itself on devices[1], then
-- for each other device a copy of the module tree (same classes, attributes copied
-- shallowly) whose parameters are differentiable copies on that device (so gradients flow
-- back to mod's parameters) and whose buffers are copies. Shared modules and parameters
-- stay shared within a replica.
function DataParallel.replicate(mod, devices)
  local replicas = { mod }
  for i = 2, #devices do
    local dev = dl.cuda.device_name(devices[i])
    local tensors, modules = {}, {}
    local function param_copy(p)
      local key = tensor_key(p)
      local c = tensors[key]
      if not c then c = p:to(dev); tensors[key] = c end
      return c
    end
    local function buffer_copy(b)
      local key = tensor_key(b)
      local c = tensors[key]
      if not c then c = dl.no_grad(function() return b:to(dev) end); tensors[key] = c end
      return c
    end
    local function clone(m)
      local c = modules[m]
      if c then return c end
      c = setmetatable({}, getmetatable(m))
      modules[m] = c
      local attrs = {}
      for k, v in pairs(rawget(m, "_attrs")) do attrs[k] = v end
      local np = {}
      for k, v in pairs(rawget(m, "_non_persistent")) do np[k] = v end
      rawset(c, "_attrs", attrs)
      rawset(c, "_non_persistent", np)
      rawset(c, "_parameters", copy_odict(rawget(m, "_parameters"), param_copy))
      rawset(c, "_buffers", copy_odict(rawget(m, "_buffers"), buffer_copy))
      rawset(c, "_modules", copy_odict(rawget(m, "_modules"), clone))
      return c
    end
    replicas[i] = clone(mod)
  end
  return replicas
end

-- ---- gather ----------------------------------------------------------------------------

--- DataParallel.gather(outputs, device, dim) -> the replicas' outputs (a list, one per
-- replica) combined on `device`: tensors concatenated along dim (0-d ones stacked into a
-- vector), tables gathered entry by entry, other values taken from replica 1.
function DataParallel.gather(outputs, device, dim)
  local first = outputs[1]
  local dev = dl.cuda.device_name(device)
  if dl.is_tensor(first) then
    if #outputs == 1 then return first:to(dev) end
    local moved = {}
    for i, o in ipairs(outputs) do
      if not dl.is_tensor(o) then lib.raise("DataParallel: replica " .. i .. " returned a " .. type(o) .. ", replica 1 a tensor") end
      if o:dim() == 0 then o = o:reshape { 1 } end
      moved[i] = o:to(dev)
    end
    return dl.cat(moved, first:dim() == 0 and 1 or dim)
  elseif type(first) == "table" and not module.is_module(first) and getmetatable(first) == nil then
    local out = {}
    for k in pairs(first) do
      local parts = {}
      for i, o in ipairs(outputs) do parts[i] = o[k] end
      out[k] = DataParallel.gather(parts, device, dim)
    end
    return out
  end
  return first
end

-- ---- forward ---------------------------------------------------------------------------

-- PyTorch's check: the module's parameters and buffers must be on device_ids[1].
local function check_placement(self)
  local want = self.device_ids[1]
  local m = self.module
  for _, list in ipairs { m:parameters(), m:buffers() } do
    for _, t in ipairs(list) do
      local d = C.ddp_tensor_device(t)
      if d ~= want then
        lib.raise(("DataParallel: module must have its parameters and buffers on device cuda:%d (device_ids[1]) "
          .. "but found one of them on device: %s"):format(want, dl.cuda.device_name(d)))
      end
    end
  end
end

--- dp(...) runs the module data-parallel (Note [data parallel] above) and returns the
-- outputs gathered on output_device.
function DataParallel:forward(...)
  local ids = self.device_ids
  if #ids == 0 then return self.module(...) end
  check_placement(self)
  local args = { n = select("#", ...), ... }
  local per = DataParallel.scatter(args, ids, self.dim)
  if #per == 1 then
    local out = self.module(unpack(per[1], 1, per[1].n))
    return DataParallel.gather({ out }, self.output_device, self.dim)
  end
  local used = {}
  for i = 1, #per do used[i] = ids[i] end
  local replicas = DataParallel.replicate(self.module, used)
  local outputs = {}
  for i, r in ipairs(replicas) do
    outputs[i] = r(unpack(per[i], 1, per[i].n))
  end
  return DataParallel.gather(outputs, self.output_device, self.dim)
end

function DataParallel:extra_repr() return "" end

return DataParallel
