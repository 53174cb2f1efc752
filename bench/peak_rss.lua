--- bench/peak_rss.lua: the peak resident memory of a script run, per process.
--   build/ddplua bench/peak_rss.lua train.lua [train.lua's options]
--   build/ddplua --nproc_per_node=2 bench/peak_rss.lua train.lua [options]   # each rank
-- Runs the script (a path, then its own arguments, which it reads from `arg` as when
-- started directly) in this process and, when it returns, prints to stderr one line per
-- process: "peak_rss rank=<RANK or -> maxrss_mb=<getrusage ru_maxrss> vmhwm_mb=<VmHWM of
-- /proc/self/status>" (MB = 2^20 bytes; the two are the same counter read two ways). A
-- script that raises prints nothing (the error propagates).
local os_ = require "ddplua.os"

local script = arg[1]
if not script then error("usage: ddplua bench/peak_rss.lua SCRIPT [ARGS...]", 0) end
local rest = {}
for i = 2, #arg do rest[#rest + 1] = arg[i] end
local chunk, err = loadfile(script)
if not chunk then error("bench/peak_rss.lua: cannot load " .. script .. ": " .. err, 0) end
arg = rest -- the script's own arguments, where a started script finds them
chunk()

local f = assert(io.open("/proc/self/status"))
local status = f:read("*a")
f:close()
local hwm_kb = tonumber(status:match("VmHWM:%s*(%d+)"))
io.stderr:write(("peak_rss rank=%s maxrss_mb=%.1f vmhwm_mb=%.1f\n"):format(os.getenv("RANK") or "-",
  os_.resource_usage().peak_rss_bytes / 2 ^ 20, hwm_kb / 1024))
