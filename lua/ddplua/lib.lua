--- ddplua.lib: the FFI boundary. Loads build/libddplua.so with the cdef generated from
-- runtime/include/ddplua.h, and holds the helpers every front-end module uses to call C:
-- status checks that raise at the user's line, handle wrapping with ffi.gc and collector
-- pressure, shape buffers and dimension/dtype conversion.
local ffi = require "ffi"

local M = {}

-- Where this file lives: lua/ddplua/lib.lua; the project root is two levels up.
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local module_dir = here .. "/"
local root = here .. "/../.."

--- Path of the runtime library: $DDPLUA_LIB, else <root>/build/libddplua.so. The cdef
-- text is read from beside it (<dir>/lua/ddplua/cdef.lua), so both always come from the
-- same build.
M.lib_path = os.getenv("DDPLUA_LIB") or (root .. "/build/libddplua.so")
local build_dir = M.lib_path:match("^(.*)/[^/]*$") or "."
local cdef_chunk, cdef_err = loadfile(build_dir .. "/lua/ddplua/cdef.lua")
if not cdef_chunk then
  error("ddplua: cannot read the FFI declarations (" .. tostring(cdef_err) .. "); run `make` first", 0)
end
ffi.cdef(cdef_chunk())
local C = ffi.load(M.lib_path)
M.C = C
M.ffi = ffi
M.root = root

--- The first stack level (as error() counts, from the function calling raise_at) whose
-- code is not in lua/ddplua/ and not C: the user's line.
local function user_level()
  local level = 3
  while true do
    local info = debug.getinfo(level, "S")
    if not info then return 2 end
    local src = info.source
    if src:sub(1, 1) == "@" and src:sub(2, #module_dir + 1) ~= module_dir then return level - 1 end
    if src:sub(1, 1) ~= "@" and src ~= "=[C]" then return level - 1 end
    level = level + 1
  end
end

--- Raise `msg` as a Lua error at the user's line (the first caller outside ddplua).
function M.raise(msg)
  error(msg, user_level())
end

--- Raise the C error message when status ~= 0 (the C side names op, argument and shapes).
function M.check(status)
  if status ~= 0 then
    error(ffi.string(C.ddp_last_error()), user_level())
  end
end

-- Collector pressure (DESIGN.md: LuaJIT does not see C memory). When the runtime's live
-- bytes pass `threshold`, run a full collection and set the next threshold to twice what
-- is still live after it (at least 64 MiB more).
local MIN_HEADROOM = 64 * 1024 * 1024
local threshold = MIN_HEADROOM
local release = C.ddp_tensor_release

local function collect_if_needed()
  local live = tonumber(C.ddp_memory_live_bytes())
  if live > threshold then
    collectgarbage("collect")
    live = tonumber(C.ddp_memory_live_bytes())
    threshold = live + math.max(live, MIN_HEADROOM)
  end
end
M.collect_if_needed = collect_if_needed

--- Wrap a new reference (ddp_tensor*) as a Lua handle that releases it when collected.
-- Returns nil for NULL.
function M.wrap(ptr)
  if ptr == nil then return nil end
  collect_if_needed()
  return ffi.gc(ptr, release)
end

--- The out-parameter box every call returning a tensor uses (`ddp_tensor*[1]`). Read
-- box[0] right after the call: the next call overwrites it.
M.box = ffi.new("ddp_tensor*[1]")

--- Call `fn(box, ...)`, check its status and return the wrapped result tensor.
function M.call(fn, ...)
  M.check(fn(M.box, ...))
  return M.wrap(M.box[0])
end

local shape_buf = ffi.new("int64_t[8]")
local shape_buf2 = ffi.new("int64_t[8]")

--- Convert a Lua shape ({2, 3} or varargs-style numbers) to (int64_t[8] buffer, ndim).
-- `which` = 2 uses a second buffer (for calls taking two shapes). Raises on a bad shape.
function M.shape(tbl, which)
  local buf = which == 2 and shape_buf2 or shape_buf
  if type(tbl) ~= "table" then M.raise("expected a shape table such as {2, 3}, got " .. type(tbl)) end
  local n = #tbl
  if n > 8 then M.raise("a shape has at most 8 dimensions, got " .. n) end
  for i = 1, n do
    local v = tbl[i]
    if type(v) ~= "number" or v ~= math.floor(v) then
      M.raise("shape entry " .. i .. " must be an integer, got " .. tostring(v))
    end
    buf[i - 1] = v
  end
  return buf, n
end

--- Lua dimension (1-based; negative counts from the end, -1 the last) to C's 0-based
-- form (negative passed through: C normalises and checks the range).
function M.dim(d, what)
  if type(d) ~= "number" or d ~= math.floor(d) then
    M.raise((what or "dim") .. " must be an integer, got " .. tostring(d))
  end
  if d == 0 then M.raise((what or "dim") .. " 0 is not valid: dimensions count from 1 (-1 is the last)") end
  return d > 0 and d - 1 or d
end

local dtype_cache = {}
--- dtype name ("f32", "float32", "i64", ...) or enum number to the enum number; nil gives
-- `default`. Raises naming the bad value.
function M.dtype(d, default)
  if d == nil then return default end
  if type(d) == "number" then return d end
  local v = dtype_cache[d]
  if v then return v end
  v = C.ddp_dtype_from_name(tostring(d))
  if v < 0 then M.raise("unknown dtype '" .. tostring(d) .. "' (f32, f64, f16, bf16, i64, i32, u8, bool)") end
  dtype_cache[d] = v
  return v
end

--- Name of a dtype enum value ("f32", ...).
function M.dtype_name(v)
  return ffi.string(C.ddp_dtype_name(v))
end

--- Shape of tensor t as a Lua table of sizes.
function M.size_table(t)
  local n = C.ddp_tensor_dim(t)
  local shape = C.ddp_tensor_shape(t)
  local s = {}
  for i = 1, n do s[i] = tonumber(shape[i - 1]) end
  return s
end

return M
