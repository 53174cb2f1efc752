--- ddplua.os: the operating-system services Lua code needs (a monotonic clock, terminals,
-- folders, resource usage, a sleep), through the runtime's C API (runtime/include/ddplua/os.h)
-- rather than libc declarations of its own.
--
--   local os_ = require "ddplua.os"
--   local t0 = os_.monotonic()                 -- seconds
--   os_.sleep(0.5)                             -- seconds; signals do not cut it short
--   if os_.isatty(1) then ... end              -- stdout is a terminal
--   os_.mkdir_p("runs/x/checkpoints")          -- raises naming the component and the reason
--   for _, e in ipairs(os_.list_dir("data")) do print(e.name, e.type) end
--   print(os_.resource_usage().peak_rss_bytes)
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local M = {}

--- Seconds from a monotonic clock (CLOCK_MONOTONIC), as a number; for intervals only.
function M.monotonic()
  return C.ddp_os_monotonic_seconds()
end

--- Seconds since the Unix epoch (CLOCK_REALTIME, fractions included), as Python's
-- time.time(): the time of day (TensorBoard's wall times), not for intervals.
function M.time()
  return C.ddp_os_wall_seconds()
end

--- Sleep `seconds` (a number >= 0, fractions allowed), as Python's time.sleep: a signal
-- handled meanwhile (SIGUSR1's flight-recorder dump) does not cut it short, unlike libc's
-- sleep through the FFI. Raises for a negative or non-number argument.
function M.sleep(seconds)
  if type(seconds) ~= "number" then lib.raise("sleep: seconds must be a number, got " .. type(seconds)) end
  lib.check(C.ddp_os_sleep(seconds))
end

--- true when file descriptor fd (0 stdin, 1 stdout, 2 stderr; default 1) is a terminal.
function M.isatty(fd)
  return C.ddp_os_isatty(fd or 1) == 1
end

--- Create folder `path` and its missing parents (`mkdir -p`); an existing folder is fine.
-- Raises at the caller's line "mkdir -p '<path>': cannot create '<part>': <reason>".
function M.mkdir_p(path)
  lib.path(path, "mkdir_p")
  lib.check(C.ddp_os_mkdir_p(path))
end

--- os_.list_dir(path) -> a list of {name = string, type = "dir" | "file" | "other"} for the
-- entries of folder `path` ("." and ".." left out; symbolic links followed), unsorted.
-- Raises naming the folder and the reason when it cannot be read.
function M.list_dir(path)
  lib.path(path, "list_dir")
  local needed = ffi.new("size_t[1]")
  local cap = 4096
  local buf
  while true do
    buf = ffi.new("char[?]", cap)
    local st = C.ddp_os_list_dir(path, buf, cap, needed)
    if st == 0 then break end
    if tonumber(needed[0]) <= cap then lib.check(st) end
    cap = tonumber(needed[0])
  end
  local out, at, n = {}, 0, tonumber(needed[0])
  local types = { d = "dir", f = "file", o = "other" }
  while at < n do
    local t = string.char(buf[at])
    local name = ffi.string(buf + at + 1)
    out[#out + 1] = { name = name, type = types[t] or "other" }
    at = at + #name + 2
  end
  return out
end

local ru = ffi.new("ddp_os_rusage")

--- The process's resource usage so far: a table {peak_rss_bytes = bytes (number),
-- user_seconds = s, system_seconds = s} (CPU seconds summed over threads).
function M.resource_usage()
  lib.check(C.ddp_os_resource_usage(ru))
  return { peak_rss_bytes = tonumber(ru.peak_rss_bytes), user_seconds = ru.user_seconds,
    system_seconds = ru.system_seconds }
end

--- true when the n bytes at pointers a and b are equal (memcmp); n = 0 gives true.
function M.bytes_equal(a, b, n)
  return C.ddp_os_bytes_equal(a, b, n) == 1
end

return M
