--- ddplua.cuda: CUDA devices from Lua, as torch.cuda (`dl.cuda`).
--
--   if dl.cuda.is_available() then
--     local x = dl.randn({64, 784}, {device = "cuda"})     -- the current device
--     print(dl.cuda.get_device_name(0), dl.cuda.memory_allocated(0))
--   end
--
-- Everything goes through runtime/include/ddplua/cuda.h and the CUDA plug-in
-- (build/libddplua_cuda.so, opened on first use; $DDPLUA_CUDA_PLUGIN names another, e.g.
-- the simulated device of the specs). Without a plug-in, a driver or a GPU,
-- is_available() is false, device_count() is 0, and every call that needs a device raises
-- "CUDA is not available: <why>". Errors are Lua errors carrying the C message, raised at
-- the caller's line.
--
-- Devices are written as PyTorch writes them: "cpu", "cuda" (the current device),
-- "cuda:1"; a number k stands for "cuda:k". Device numbers count from 0 (they are data, as
-- CUDA numbers them and LOCAL_RANK is), so dl.cuda.set_device(0) is the first GPU.
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check = lib.check

local M = {}

local int_out = ffi.new("int[1]")
local i64_out = ffi.new("int64_t[1]")
local float_out = ffi.new("float[1]")
local stream_box = ffi.new("ddp_stream*[1]")
local event_box = ffi.new("ddp_event*[1]")

-- ---- availability ----------------------------------------------------------------------

--- dl.cuda.is_available() -> true when the plug-in loaded and found at least one device
-- (probed once per process; never raises).
function M.is_available() return C.ddp_cuda_is_available() ~= 0 end

--- dl.cuda.device_count() -> number of CUDA devices (0 when CUDA is not available).
function M.device_count() return C.ddp_cuda_device_count() end

--- dl.cuda.unavailable_reason() -> why CUDA is not available (the plug-in did not load,
-- no driver, no device), or "" when it is.
function M.unavailable_reason() return ffi.string(C.ddp_cuda_unavailable_reason()) end

--- dl.cuda.backend_name() -> "cuda" for the real plug-in, "cuda-sim" for the simulated
-- device of the specs, "" when none loaded.
function M.backend_name() return ffi.string(C.ddp_cuda_backend_name()) end

--- dl.cuda.versions() -> {cudart =, cublas =, cudnn =, nccl =}: the versions the plug-in
-- was built with as integers (e.g. cudart 13000; 0 when unknown). Raises without CUDA.
function M.versions()
  local v = ffi.new("int[4]")
  check(C.ddp_cuda_versions(v, v + 1, v + 2, v + 3))
  return { cudart = v[0], cublas = v[1], cudnn = v[2], nccl = v[3] }
end

-- ---- device numbers --------------------------------------------------------------------

--- dl.cuda.current_device() -> the calling thread's current device number (0-based): where
-- work and tensors made with device "cuda" go. Raises without CUDA.
function M.current_device()
  check(C.ddp_cuda_current_device(int_out))
  return int_out[0]
end

--- dl.cuda.parse_device(d) -> the C device number of d: -1 (DDP_DEVICE_CPU) for "cpu",
-- k for "cuda:k" or the number k, the current device for "cuda" (raises without CUDA).
-- Raises naming a malformed device. (Whether cuda:k exists is checked where it is used.)
function M.parse_device(d)
  local td = type(d)
  if td == "number" then
    if d % 1 ~= 0 or d < -1 then lib.raise("invalid device number " .. tostring(d)) end
    return d
  end
  if td ~= "string" then lib.raise("expected a device ('cpu', 'cuda', 'cuda:1'), got " .. td) end
  if d == "cpu" then return C.DDP_DEVICE_CPU end
  if d == "cuda" then
    if C.ddp_cuda_is_available() == 0 then
      lib.raise("device 'cuda': CUDA is not available: " .. M.unavailable_reason())
    end
    return M.current_device()
  end
  local k = d:match("^cuda:(%d+)$")
  if k then return tonumber(k) end
  lib.raise("invalid device '" .. d .. "' (expected 'cpu', 'cuda' or 'cuda:<k>')")
end

--- dl.cuda.is_device(s) -> true when s is a device string ("cpu", "cuda", "cuda:<k>").
-- Used by to() to tell a device from a dtype name.
function M.is_device(s)
  return type(s) == "string" and (s == "cpu" or s == "cuda" or s:match("^cuda:%d+$") ~= nil)
end

--- dl.cuda.device_name(k) -> "cpu" for -1, "cuda:k" otherwise (the inverse of parse_device).
function M.device_name(k)
  return k < 0 and "cpu" or ("cuda:" .. k)
end

-- A CUDA device number from an optional argument: nil -> the current device.
local function cuda_device(k, what)
  if k == nil then return M.current_device() end
  local d = M.parse_device(k)
  if d < 0 then lib.raise((what or "cuda") .. ": expects a CUDA device, got cpu") end
  return d
end

--- dl.cuda.set_device(k): make device k (a number, or "cuda:k") the calling thread's
-- current device. Raises for "cpu", a device that does not exist, or without CUDA.
function M.set_device(k)
  local d = M.parse_device(k)
  check(C.ddp_cuda_set_device(d))
end

--- dl.cuda.get_device_name([k]) -> the device's name, e.g. "NVIDIA H100 80GB HBM3"
-- (default: the current device).
function M.get_device_name(k)
  local buf = ffi.new("char[256]")
  check(C.ddp_cuda_device_name(cuda_device(k, "get_device_name"), buf, 256))
  return ffi.string(buf)
end

--- dl.cuda.synchronize([k]): wait until all work queued on every stream of device k (default:
-- the current device) has finished.
function M.synchronize(k)
  check(C.ddp_cuda_synchronize(cuda_device(k, "synchronize")))
end

-- ---- memory ----------------------------------------------------------------------------

local function stat(which, name)
  return function(k)
    check(C.ddp_cuda_memory_stat(cuda_device(k, name), which, i64_out))
    return tonumber(i64_out[0])
  end
end

--- dl.cuda.memory_allocated([k]) -> bytes held by live tensors on device k (default: the
-- current device), from the caching allocator (torch.cuda.memory_allocated).
M.memory_allocated = stat(C.DDP_CUDA_MEM_ALLOCATED, "memory_allocated")
--- dl.cuda.max_memory_allocated([k]) -> the peak of memory_allocated since the start or the
-- last reset_peak_memory_stats, bytes.
M.max_memory_allocated = stat(C.DDP_CUDA_MEM_MAX_ALLOCATED, "max_memory_allocated")
--- dl.cuda.memory_reserved([k]) -> bytes obtained from the driver: allocated + cached.
M.memory_reserved = stat(C.DDP_CUDA_MEM_RESERVED, "memory_reserved")
--- dl.cuda.max_memory_reserved([k]) -> the peak of memory_reserved, bytes.
M.max_memory_reserved = stat(C.DDP_CUDA_MEM_MAX_RESERVED, "max_memory_reserved")

--- dl.cuda.memory_stats([k]) -> {allocated =, max_allocated =, reserved =, max_reserved =
-- (bytes), alloc_calls =, device_calls = (counts: allocations served, and of which went to
-- cudaMalloc)}.
function M.memory_stats(k)
  local d = cuda_device(k, "memory_stats")
  local out = {}
  for name, which in pairs { allocated = C.DDP_CUDA_MEM_ALLOCATED, max_allocated = C.DDP_CUDA_MEM_MAX_ALLOCATED,
    reserved = C.DDP_CUDA_MEM_RESERVED, max_reserved = C.DDP_CUDA_MEM_MAX_RESERVED,
    alloc_calls = C.DDP_CUDA_MEM_ALLOC_CALLS, device_calls = C.DDP_CUDA_MEM_DEVICE_CALLS } do
    check(C.ddp_cuda_memory_stat(d, which, i64_out))
    out[name] = tonumber(i64_out[0])
  end
  return out
end

--- dl.cuda.reset_peak_memory_stats([k]): set the peaks of device k to the current values.
function M.reset_peak_memory_stats(k)
  check(C.ddp_cuda_reset_peak_memory_stats(cuda_device(k, "reset_peak_memory_stats")))
end

--- dl.cuda.empty_cache(): give every cached (free) device block back to the driver
-- (memory_reserved drops to memory_allocated). Flushes the compiled traces and runs a full
-- Lua collection first so that tensors no longer referenced are freed (Note [traces keep
-- closures] in ddplua/lib.lua). Raises without CUDA.
function M.empty_cache()
  lib.release_unreachable()
  check(C.ddp_cuda_empty_cache())
end

-- ---- TF32 ------------------------------------------------------------------------------

--- dl.cuda.allow_tf32() -> whether f32 matmul and convolution may use TF32 tensor cores
-- (torch.backends.cuda.matmul.allow_tf32; off by default).
function M.allow_tf32() return C.ddp_cuda_get_allow_tf32() ~= 0 end
M.get_allow_tf32 = M.allow_tf32

--- dl.cuda.set_allow_tf32(flag) -> the previous setting. TF32 keeps about 10 bits of
-- mantissa in the products: faster, less exact. Raises without CUDA.
function M.set_allow_tf32(flag)
  local prev = M.allow_tf32()
  check(C.ddp_cuda_set_allow_tf32(flag and 1 or 0))
  return prev
end

-- ---- streams ---------------------------------------------------------------------------

local Stream = {}
Stream.__index = Stream

-- A Lua handle over a ddp_stream* ({handle = ptr or nil for the default stream, device =
-- k, owned = bool}). Owned handles are destroyed by the collector (ffi.gc) or :free().
local function stream_of(ptr, device, owned)
  local s = setmetatable({ device = device, owned = owned }, Stream)
  if ptr ~= nil and owned then
    s.handle = ffi.gc(ptr, C.ddp_cuda_stream_free)
  else
    s.handle = ptr ~= nil and ptr or nil
  end
  return s
end

--- dl.cuda.Stream([device[, opts]]) (also dl.cuda.Stream.new) -> a new non-blocking
-- stream on device (default: the current device). opts.priority: 0 normal (default),
-- negative is higher. Freed by the collector (ffi.gc) or by s:free().
function Stream.new(device, opts)
  if type(device) == "table" then device, opts = nil, device end
  local d = cuda_device(device, "Stream")
  check(C.ddp_cuda_stream_new(stream_box, d, opts and opts.priority or 0))
  return stream_of(stream_box[0], d, true)
end
M.Stream = setmetatable(Stream, { __call = function(_, ...) return Stream.new(...) end })

--- s:synchronize(): wait until everything queued on s has finished.
function Stream:synchronize()
  check(C.ddp_cuda_stream_synchronize(self.handle))
end

--- s:wait_event(e): work queued on s after this call waits until event e has happened
-- (no host wait).
function Stream:wait_event(e)
  if not M.is_event(e) then lib.raise("Stream:wait_event: expected a dl.cuda.Event") end
  if e.handle == nil then lib.raise("Stream:wait_event: the event was freed") end
  check(C.ddp_cuda_stream_wait_event(self.handle, e.handle))
end

--- s:wait_stream(other): work queued on s after this call waits for what other has queued
-- so far (records an event on other and waits for it).
function Stream:wait_stream(other)
  local e = M.Event(self.device)
  e:record(other)
  self:wait_event(e)
end

--- s:record_event([e]) -> e (a new Event when nil) recorded on s.
function Stream:record_event(e)
  e = e or M.Event(self.device)
  e:record(self)
  return e
end

--- s:query() -> true when all work queued on s has finished (through an event).
function Stream:query()
  return self:record_event():query()
end

--- s:free(): destroy an owned stream now (the default stream is never destroyed). Safe
-- to call twice.
function Stream:free()
  local h = self.handle
  if h ~= nil and self.owned then
    self.handle = nil
    ffi.gc(h, nil)
    C.ddp_cuda_stream_free(h)
  end
end

Stream.__tostring = function(s)
  return ("<dl.cuda.Stream device=cuda:%d %s>"):format(s.device, s.handle == nil and "default" or tostring(s.handle))
end
Stream.__eq = function(a, b)
  return a.device == b.device and ffi.cast("intptr_t", a.handle) == ffi.cast("intptr_t", b.handle)
end

--- dl.cuda.is_stream(v) -> true when v is a dl.cuda.Stream.
function M.is_stream(v) return type(v) == "table" and getmetatable(v) == Stream end

--- dl.cuda.current_stream([k]) -> the calling thread's current stream on device k (default:
-- the current device); the device's default stream unless set_stream chose another.
function M.current_stream(k)
  local d = cuda_device(k, "current_stream")
  check(C.ddp_cuda_current_stream(stream_box, d))
  return stream_of(stream_box[0], d, false)
end

--- dl.cuda.default_stream([k]) -> device k's default stream.
function M.default_stream(k)
  return stream_of(nil, cuda_device(k, "default_stream"), false)
end

--- dl.cuda.set_stream(s): make s the calling thread's current stream on s's device (new
-- kernels and copies there go to s). Keep s alive while it is current.
function M.set_stream(s)
  if not M.is_stream(s) then lib.raise("set_stream: expected a dl.cuda.Stream, got " .. type(s)) end
  check(C.ddp_cuda_set_stream(s.device, s.handle))
end

--- dl.cuda.stream(s, fn, ...) -> fn's results: run fn(...) with s as the current stream of
-- its device, then restore the previous stream, even when fn raises (torch.cuda.stream's
-- context manager). s = nil runs fn unchanged.
function M.stream(s, fn, ...)
  if s == nil then return fn(...) end
  local prev = M.current_stream(s.device)
  M.set_stream(s)
  local res = { pcall(fn, ...) }
  M.set_stream(prev)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

-- ---- events ----------------------------------------------------------------------------

local Event = {}
Event.__index = Event

--- dl.cuda.Event([device][, opts]) (also dl.cuda.Event.new) -> a new event on device
-- (default: the current device). opts.enable_timing (default false): needed for
-- elapsed_time. Freed by the collector (ffi.gc) or by e:free().
function Event.new(device, opts)
  if type(device) == "table" then device, opts = nil, device end
  local d = cuda_device(device, "Event")
  check(C.ddp_cuda_event_new(event_box, d, opts and opts.enable_timing and 1 or 0))
  return setmetatable({ device = d, handle = ffi.gc(event_box[0], C.ddp_cuda_event_free) }, Event)
end
M.Event = setmetatable(Event, { __call = function(_, ...) return Event.new(...) end })

--- dl.cuda.is_event(v) -> true when v is a dl.cuda.Event.
function M.is_event(v) return type(v) == "table" and getmetatable(v) == Event end

local function live_event(e, op)
  if e.handle == nil then lib.raise(op .. ": the event was freed") end
  return e.handle
end

--- e:record([s]): mark the point in stream s (default: the current stream of e's device)
-- after everything queued so far. Returns e.
function Event:record(s)
  local h = live_event(self, "Event:record")
  s = s or M.current_stream(self.device)
  check(C.ddp_cuda_event_record(h, s.handle))
  return self
end

--- e:synchronize(): wait on the host until the recorded work has finished.
function Event:synchronize()
  check(C.ddp_cuda_event_synchronize(live_event(self, "Event:synchronize")))
end

--- e:query() -> true once everything before the recorded point has run.
function Event:query()
  check(C.ddp_cuda_event_query(live_event(self, "Event:query"), int_out))
  return int_out[0] ~= 0
end

--- e:wait([s]): make stream s (default: the current stream) wait for e.
function Event:wait(s)
  s = s or M.current_stream(self.device)
  s:wait_event(self)
end

--- start:elapsed_time(stop) -> milliseconds between two recorded events made with
-- enable_timing (after stop has happened: call stop:synchronize() first).
function Event:elapsed_time(stop)
  if not M.is_event(stop) then lib.raise("Event:elapsed_time: expected a dl.cuda.Event") end
  check(C.ddp_cuda_event_elapsed_ms(live_event(self, "Event:elapsed_time"), live_event(stop, "Event:elapsed_time"),
    float_out))
  return float_out[0]
end

--- e:free(): destroy the event now. Safe to call twice.
function Event:free()
  local h = self.handle
  if h ~= nil then
    self.handle = nil
    ffi.gc(h, nil)
    C.ddp_cuda_event_free(h)
  end
end

Event.__tostring = function(e) return ("<dl.cuda.Event device=cuda:%d>"):format(e.device) end

return M
