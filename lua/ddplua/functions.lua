--- ddplua.functions: the functions of the umbrella `ddplua` (what `dl.` reaches besides
-- the packages): creation functions (shape as a table: dl.zeros{2, 3}; options table last:
-- {dtype = "f64", device = "cuda:1", requires_grad = true}), seeding, grad mode, threads,
-- memory, dtype names and the functional forms of the ops (dl.add(a, b), dl.matmul(a, b),
-- dl.cat({a, b}, 1), ...).
--
-- Library modules call these through `require "ddplua.functions"`, never through the
-- umbrella, which sits above every package (Note [lua layers] in tools/check_layers.lua);
-- `require "ddplua"` re-exports all of them, so user code sees the same dl.zeros.
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local tensor = require "ddplua.tensor"
local generator = require "ddplua.generator"
local cuda = require "ddplua.cuda"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = {}

M.version = ffi.string(C.ddp_version())
M.is_tensor = tensor.is_tensor
M.Tensor = tensor.methods
M.Generator = generator.new
M.default_generator = generator.default
M.cuda = cuda
M.timeit = require("ddplua.timeit").timeit

-- dtype names, as PyTorch spells them and short
for _, name in ipairs { "f32", "f64", "f16", "bf16", "i64", "i32", "u8", "bool" } do M[name] = name end
M.float32, M.float64, M.float16, M.bfloat16 = "f32", "f64", "f16", "bf16"
M.int64, M.int32, M.uint8 = "i64", "i32", "u8"
M.float, M.double, M.half, M.long, M.int = "f32", "f64", "f16", "i64", "i32"

local F32 = C.DDP_F32

-- What the creation functions read from opts; anything else raises naming the function.
local FACTORY_KNOWN = options.known { "dtype", "device", "requires_grad", "generator" }
local check_options = options.check

-- The device number of opts.device (nil: the CPU).
local function device_of(opts)
  local d = opts and opts.device
  if d == nil then return C.DDP_DEVICE_CPU end
  return cuda.parse_device(d)
end

-- Apply the common options to a new tensor made on the CPU: opts.device (moved there; the
-- values are the CPU's, bit for bit) then opts.requires_grad (so the result is a leaf).
local function finish(t, opts)
  if opts then
    local dev = device_of(opts)
    if dev ~= C.DDP_DEVICE_CPU then
      check(C.ddp_tensor_to_device(box, t, dev, 0))
      t = wrap(box[0])
    end
    if opts.requires_grad then check(C.ddp_tensor_set_requires_grad(t, 1)) end
  end
  return t
end

-- Uninitialised, on the CPU (finish moves it).
local function empty_of(shape, opts, op)
  local dtype = lib.dtype(opts and opts.dtype, F32)
  local buf, n = lib.new_shape(shape, op, dtype)
  check(C.ddp_tensor_empty(box, n, buf, dtype, C.DDP_DEVICE_CPU))
  return wrap(box[0])
end

-- Options with the device removed (for a tensor already made on its device).
local function without_device(opts)
  if not (opts and opts.device) then return opts end
  return { requires_grad = opts.requires_grad }
end

--- dl.empty(shape, opts): uninitialised tensor. opts.dtype (default "f32"), opts.device
-- ("cpu" default, "cuda", "cuda:k": allocated there directly), opts.requires_grad. Every
-- creation function below takes these options; those that compute values make them on the
-- CPU and move them, so a device tensor holds exactly the values the CPU would.
function M.empty(shape, opts)
  if opts ~= nil then check_options("empty", opts, FACTORY_KNOWN) end
  local dtype = lib.dtype(opts and opts.dtype, F32)
  local buf, n = lib.new_shape(shape, "empty", dtype)
  check(C.ddp_tensor_empty(box, n, buf, dtype, device_of(opts)))
  return finish(wrap(box[0]), without_device(opts))
end

--- dl.zeros(shape, opts) / dl.ones(shape, opts) / dl.full(shape, value, opts).
function M.zeros(shape, opts)
  if opts ~= nil then check_options("zeros", opts, FACTORY_KNOWN) end
  local dtype = lib.dtype(opts and opts.dtype, F32)
  local buf, n = lib.new_shape(shape, "zeros", dtype)
  check(C.ddp_tensor_zeros(box, n, buf, dtype, device_of(opts)))
  return finish(wrap(box[0]), without_device(opts))
end
local function full_of(shape, value, opts, op)
  if opts ~= nil then check_options(op, opts, FACTORY_KNOWN) end
  local t = empty_of(shape, opts, op)
  check(C.ddp_fill_(t, value))
  return finish(t, opts)
end
function M.ones(shape, opts) return full_of(shape, 1, opts, "ones") end
function M.full(shape, value, opts) return full_of(shape, value, opts, "full") end

--- zeros_like / ones_like / empty_like / full_like / rand_like / randn_like: same shape,
-- dtype and device as t unless opts.dtype / opts.device say otherwise.
local function like_opts(t, opts, name)
  if opts ~= nil then check_options(name, opts, FACTORY_KNOWN) end
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  o.dtype = o.dtype or t:type()
  if o.device == nil then
    local d = C.ddp_tensor_device(t)
    if d ~= C.DDP_DEVICE_CPU then o.device = d end
  end
  return o
end
function M.zeros_like(t, opts) return M.zeros(t:size(), like_opts(t, opts, "zeros_like")) end
function M.ones_like(t, opts) return M.ones(t:size(), like_opts(t, opts, "ones_like")) end
function M.empty_like(t, opts) return M.empty(t:size(), like_opts(t, opts, "empty_like")) end
function M.full_like(t, v, opts) return M.full(t:size(), v, like_opts(t, opts, "full_like")) end
function M.rand_like(t, opts) return M.rand(t:size(), like_opts(t, opts, "rand_like")) end
function M.randn_like(t, opts) return M.randn(t:size(), like_opts(t, opts, "randn_like")) end

-- Flatten nested Lua tables of numbers/booleans; returns the flat list, the shape, and
-- whether every leaf was a boolean.
local function flatten(data)
  local shape, flat, all_bool = {}, {}, true
  local function walk(v, d)
    if type(v) == "table" then
      local n = #v
      if shape[d] == nil then shape[d] = n
      elseif shape[d] ~= n then
        lib.raise(("tensor: ragged nested table: dimension %d has sizes %d and %d"):format(d, shape[d], n))
      end
      for i = 1, n do walk(v[i], d + 1) end
    else
      if #shape ~= d - 1 then lib.raise("tensor: ragged nested table: a number where a table was expected") end
      if type(v) == "boolean" then v = v and 1 or 0
      elseif type(v) == "number" then all_bool = false
      else lib.raise("tensor: elements must be numbers or booleans, got " .. type(v)) end
      flat[#flat + 1] = v
    end
  end
  walk(data, 1)
  return flat, shape, all_bool and #flat > 0
end

--- dl.tensor(data, opts): a tensor from a number or nested tables. dtype defaults to f32
-- (Lua has one number type, so integers are not guessed: pass {dtype = "i64"} for labels),
-- or bool when every element is a boolean.
function M.tensor(data, opts)
  if opts ~= nil then check_options("tensor", opts, FACTORY_KNOWN) end
  if tensor.is_tensor(data) then
    local t = data:clone()
    if opts and (opts.device or opts.dtype) then t = t:to(opts.device, opts.dtype) end
    return t
  end
  local flat, shape, all_bool = flatten(data)
  local dtype = lib.dtype(opts and opts.dtype, all_bool and C.DDP_BOOL or F32)
  local buf, n = lib.shape(shape)
  local values = ffi.new("double[?]", #flat > 0 and #flat or 1)
  for i = 1, #flat do values[i - 1] = flat[i] end
  check(C.ddp_tensor_from_data(box, n, buf, dtype, values, C.DDP_F64))
  return finish(wrap(box[0]), opts)
end

--- dl.arange(end) / dl.arange(start, end[, step], opts): values start, start+step, ...
-- below end. dtype defaults to i64 when start, end and step are integers, else f32.
function M.arange(a, b, c, d)
  local opts
  if type(b) == "table" then opts, b = b, nil
  elseif type(c) == "table" then opts, c = c, nil
  elseif type(d) == "table" then opts = d end
  if opts ~= nil then check_options("arange", opts, FACTORY_KNOWN) end
  local start, stop, step = a, b, c or 1
  if b == nil then start, stop = 0, a end
  local integral = start % 1 == 0 and stop % 1 == 0 and step % 1 == 0
  local dtype = lib.dtype(opts and opts.dtype, integral and C.DDP_I64 or F32)
  check(C.ddp_arange(box, start, stop, step, dtype))
  return finish(wrap(box[0]), opts)
end

--- dl.linspace(start, end, steps, opts): steps values from start to end inclusive.
function M.linspace(start, stop, steps, opts)
  if opts ~= nil then check_options("linspace", opts, FACTORY_KNOWN) end
  check(C.ddp_linspace(box, start, stop, steps, lib.dtype(opts and opts.dtype, F32)))
  return finish(wrap(box[0]), opts)
end

--- dl.eye(n[, m], opts): identity matrix (n, m).
function M.eye(n, m, opts)
  if type(m) == "table" then opts, m = m, nil end
  if opts ~= nil then check_options("eye", opts, FACTORY_KNOWN) end
  check(C.ddp_eye(box, n, m or n, lib.dtype(opts and opts.dtype, F32)))
  return finish(wrap(box[0]), opts)
end

local function gen_handle(opts) return opts and opts.generator and opts.generator.handle end

--- dl.rand(shape, opts): uniform in [0, 1). opts.generator: a dl.Generator.
function M.rand(shape, opts)
  if opts ~= nil then check_options("rand", opts, FACTORY_KNOWN) end
  local t = empty_of(shape, opts, "rand")
  check(C.ddp_uniform_(t, 0, 1, gen_handle(opts)))
  return finish(t, opts)
end

--- dl.randn(shape, opts): standard normal.
function M.randn(shape, opts)
  if opts ~= nil then check_options("randn", opts, FACTORY_KNOWN) end
  local t = empty_of(shape, opts, "randn")
  check(C.ddp_normal_(t, 0, 1, gen_handle(opts)))
  return finish(t, opts)
end

--- dl.randint(low, high, shape, opts): integers uniform in [low, high); dtype i64.
function M.randint(low, high, shape, opts)
  if opts ~= nil then check_options("randint", opts, FACTORY_KNOWN) end
  local o = { dtype = (opts and opts.dtype) or "i64", generator = opts and opts.generator }
  local t = empty_of(shape, o, "randint")
  check(C.ddp_randint_(t, low, high, gen_handle(opts)))
  return finish(t, opts)
end

--- dl.randperm(n, opts): a random permutation of 0 .. n-1 (i64; values are data, so they
-- count from 0 as in PyTorch).
function M.randperm(n, opts)
  if opts ~= nil then check_options("randperm", opts, FACTORY_KNOWN) end
  check(C.ddp_randperm(box, n, lib.dtype(opts and opts.dtype, C.DDP_I64), gen_handle(opts)))
  return finish(wrap(box[0]), opts)
end

--- dl.manual_seed(seed): reseed the default generator.
function M.manual_seed(seed)
  C.ddp_generator_manual_seed(nil, seed)
end

--- dl.no_grad(fn, ...): run fn with grad mode off (nothing recorded), restoring the mode
-- even when fn raises; returns fn's results. The temporaries fn dropped are released when
-- it returns (Note [step lifetimes] in ddplua/lib.lua).
function M.no_grad(fn, ...)
  local prev = C.ddp_set_grad_enabled(0)
  local res = { pcall(fn, ...) }
  C.ddp_set_grad_enabled(prev)
  lib.release_step()
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

--- dl.enable_grad(fn, ...): the same with grad mode on.
function M.enable_grad(fn, ...)
  local prev = C.ddp_set_grad_enabled(1)
  local res = { pcall(fn, ...) }
  C.ddp_set_grad_enabled(prev)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

--- dl.is_grad_enabled() / dl.set_grad_enabled(flag) (returns the previous mode).
function M.is_grad_enabled() return C.ddp_grad_enabled() ~= 0 end
function M.set_grad_enabled(flag) return C.ddp_set_grad_enabled(flag and 1 or 0) ~= 0 end

--- Threads for the runtime's kernels, matrix products included (they split over the runtime's
-- pool; OpenBLAS itself stays at one thread: Note [pool and OpenBLAS threads], threads.c).
function M.set_num_threads(n) check(C.ddp_set_num_threads(n)) end
function M.get_num_threads() return C.ddp_get_num_threads() end

--- Memory held by CPU tensors: {live = bytes in use, peak = highest live, cached = freed
-- large blocks kept for reuse, dataloader_slots = bytes of batch slots kept for the next
-- DataLoader workers (Note [slot pool] in runtime/io/workers.c)}.
function M.memory_stats()
  return { live = tonumber(C.ddp_memory_live_bytes()), peak = tonumber(C.ddp_memory_peak_bytes()),
    cached = tonumber(C.ddp_memory_cached_bytes()),
    dataloader_slots = tonumber(C.ddp_io_workers_pool_bytes()) }
end

--- dl.empty_cache(): return the allocator's cached blocks to the system, and the batch slots
-- that finished DataLoader workers left for the next ones (Note [slot pool] in
-- runtime/io/workers.c). Runs a full Lua collection first, so that the blocks of tensors no
-- longer referenced, and the slots of loaders and batches no longer referenced, are
-- returned too (as dl.cuda.empty_cache; Note [step lifetimes] in ddplua/lib.lua); the
-- compiled traces are flushed before it, so what only they referenced goes as well (Note
-- [traces keep closures] in ddplua/lib.lua).
function M.empty_cache()
  lib.release_unreachable()
  C.ddp_memory_empty_cache()
  C.ddp_io_workers_empty_pool()
end
function M.reset_peak_memory() C.ddp_memory_reset_peak() end

-- functional forms of the ops (dl.add, dl.cat, ...: each op module's `functions`)
for _, mod in ipairs(tensor.op_modules) do
  for k, v in pairs(mod.functions or {}) do M[k] = v end
end

return M
