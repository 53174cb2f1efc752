--- ddplua.profiler: torch.profiler for ddplua. Records what each rank did when (ops,
-- autograd backward nodes, collectives with their bytes, DDP bucket launches, data-loader
-- waits, optimizer steps, your own ranges), prints PyTorch's key_averages table and exports
-- Chrome trace JSON (chrome://tracing, https://ui.perfetto.dev).
--
--   local profiler = require "ddplua.profiler"
--   local prof = profiler.profile{
--     activities = { profiler.ProfilerActivity.CPU },
--     schedule = profiler.schedule{ wait = 1, warmup = 1, active = 3, ["repeat"] = 1 },
--     record_shapes = true,
--     on_trace_ready = profiler.tensorboard_trace_handler("runs/trace"),
--   }
--   prof:start()
--   for step = 1, 8 do train_step(); prof:step() end
--   prof:stop()
--   print(prof:key_averages():table{ sort_by = "self_cpu_time_total", row_limit = 10 })
--
-- The events come from the runtime's per-process event stream in C (ddplua/profiler.h,
-- Note [profiler events] in runtime/core/profiler.c); this module drives it, reads it back
-- and formats it. One profiler records at a time per process. Times in traces are
-- microseconds (Chrome's unit) of the rank's CLOCK_MONOTONIC; each rank's trace carries the
-- offset of its clock to rank 0's (Note [trace clock alignment]), which `ddplua trace merge`
-- applies. Differences from PyTorch: op events time an op's kernels (not its argument
-- checks); record_shapes gives the input shapes of ops that record an autograd node (Note
-- [profiler shapes]); CUDA kernels are timed on the host at launch (no CUPTI).
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C
local check, raise = lib.check, lib.raise

local M = {}

--- profiler.ProfilerActivity: the activities profile{} takes (PyTorch's names). CPU records
-- everything the process does; CUDA is accepted and records the host side of device work.
M.ProfilerActivity = { CPU = "CPU", CUDA = "CUDA" }

--- profiler.ProfilerAction: what a schedule answers for a step (PyTorch's names).
M.ProfilerAction = { NONE = "NONE", WARMUP = "WARMUP", RECORD = "RECORD",
  RECORD_AND_SAVE = "RECORD_AND_SAVE" }
local A = M.ProfilerAction

local CATEGORY = {
  op = C.DDP_PROF_OP, autograd = C.DDP_PROF_AUTOGRAD, collective = C.DDP_PROF_COLLECTIVE,
  bucket = C.DDP_PROF_BUCKET, loader = C.DDP_PROF_LOADER, optimizer = C.DDP_PROF_OPTIMIZER,
  user_annotation = C.DDP_PROF_USER, step = C.DDP_PROF_STEP, memory = C.DDP_PROF_MEMORY,
}

-- ---- ranges ------------------------------------------------------------------------------

local function push(name, category, who)
  if type(name) ~= "string" then
    raise(("%s: name must be a string, got %s"):format(who, type(name)), 3)
  end
  check(C.ddp_profiler_range_push(name, category))
end

--- profiler.record_function(name, fn, ...) -> fn(...)'s results: runs fn inside a range
-- named `name` (category "user_annotation", as PyTorch's record_function), recorded while a
-- profiler records and free otherwise. An error in fn closes the range and propagates.
function M.record_function(name, fn, ...)
  if type(fn) ~= "function" then
    raise("record_function: fn must be a function, got " .. type(fn), 2)
  end
  push(name, C.DDP_PROF_USER, "record_function")
  local res = { pcall(fn, ...) }
  check(C.ddp_profiler_range_pop())
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
end

--- profiler.range_push(name) / profiler.range_pop(): the begin/end pair of record_function
-- for code that cannot be wrapped in a function (as torch.cuda.nvtx.range_push/pop). Ranges
-- nest per thread; range_pop without an open range raises "record_function: end without a
-- matching begin on this thread".
function M.range_push(name) push(name, C.DDP_PROF_USER, "range_push") end
function M.range_pop() check(C.ddp_profiler_range_pop()) end

-- ---- schedule ----------------------------------------------------------------------------

local function count_arg(opts, key, default, who)
  local v = opts[key]
  if v == nil then return default end
  if type(v) ~= "number" or v < 0 or v % 1 ~= 0 then
    raise(("%s: %s must be an integer >= 0, got %s"):format(who, key, tostring(v)), 3)
  end
  return v
end

--- profiler.schedule{wait, warmup, active, repeat = 0, skip_first = 0} -> fn(step) -> a
-- ProfilerAction, with PyTorch's semantics: after skip_first steps, cycles of `wait` steps
-- doing nothing, `warmup` steps recording (dropped), `active` steps recorded, the last of
-- them RECORD_AND_SAVE (on_trace_ready runs after it); `repeat` cycles (0: no limit), then
-- NONE. Steps count from 0 (profile:step() advances). active must be >= 1.
function M.schedule(opts)
  if type(opts) ~= "table" then raise("schedule: expected a table {wait, warmup, active, repeat}", 2) end
  local wait = count_arg(opts, "wait", 0, "schedule")
  local warmup = count_arg(opts, "warmup", 0, "schedule")
  local active = count_arg(opts, "active", 1, "schedule")
  local rep = count_arg(opts, "repeat", 0, "schedule")
  local skip = count_arg(opts, "skip_first", 0, "schedule")
  if active < 1 then raise("schedule: active must be >= 1, got " .. active, 2) end
  local cycle = wait + warmup + active
  return function(step)
    if step < skip then return A.NONE end
    step = step - skip
    local n = math.floor(step / cycle)
    if rep > 0 and n >= rep then return A.NONE end
    local at = step % cycle
    if at < wait then return A.NONE end
    if at < wait + warmup then return A.WARMUP end
    return at == cycle - 1 and A.RECORD_AND_SAVE or A.RECORD
  end
end

-- ---- clock alignment ---------------------------------------------------------------------

-- Note [trace clock alignment]: every rank stamps its events with its own CLOCK_MONOTONIC,
-- which on one host is one clock and between hosts is not (each counts from its boot). At
-- profile:start(), when a process group of more than one rank is initialized, the ranks
-- measure the offset of their clock to rank 0's through the store, as NTP does with one
-- server: rank r (r > 0), ROUNDS times, reads its clock t1, sets "q<i>", reads rank 0's
-- answer "a<i>" (rank 0 waits for q<i> and answers with its clock t0) and reads its clock t2.
-- Rank 0's stamp was taken between t1 and t2 on rank r's clock, so
--     offset = t0 - (t1 + t2) / 2      (rank 0's clock minus rank r's)
-- is off by at most (t2 - t1) / 2 (plus any drift over the run: ppm for NTP-disciplined
-- clocks, i.e. microseconds over seconds). The round with the shortest round trip wins;
-- the offset and that bound go in the trace's metadata (ddplua.clock_offset_ns,
-- clock_error_ns) and `ddplua trace merge` adds the offset to every timestamp. Rank 0
-- answers the ranks one after another: ROUNDS x (world - 1) store round trips (about
-- 0.1 ms each on a LAN). Every rank of the group must call profile:start() (as every rank
-- runs the same training loop); a rank that does not is named in a timeout error after
-- ALIGN_TIMEOUT_S (or pass align_clocks = false).
local ROUNDS, ALIGN_TIMEOUT_S = 8, 60
local align_sessions = 0

local function align_clocks()
  local dist = require "ddplua.distributed.distributed_c10d"
  if not dist.is_initialized() then return 0, 0, 0, 1 end
  local rank, world = dist.get_rank(), dist.get_world_size()
  if world < 2 then return 0, 0, rank, world end
  align_sessions = align_sessions + 1
  local store = dist.get_store()
  local prefix = ("ddplua/profiler/clock/%d/"):format(align_sessions)
  if rank == 0 then
    for r = 1, world - 1 do
      for i = 1, ROUNDS do
        local q = prefix .. r .. "/q" .. i
        local ok, err = pcall(store.wait, store, { q }, ALIGN_TIMEOUT_S)
        if not ok then
          raise(("profiler: clock alignment: rank %d did not call profile:start() within %d s "
            .. "(every rank must start its profiler, or pass align_clocks = false): %s")
            :format(r, ALIGN_TIMEOUT_S, tostring(err)), 3)
        end
        store:set(prefix .. r .. "/a" .. i, ("%d"):format(tonumber(C.ddp_profiler_now_ns())))
      end
    end
    return 0, 0, rank, world
  end
  local best_rtt, best_off = math.huge, 0
  for i = 1, ROUNDS do
    local t1 = tonumber(C.ddp_profiler_now_ns())
    store:set(prefix .. rank .. "/q" .. i, "")
    local t0 = tonumber(store:get(prefix .. rank .. "/a" .. i))
    local t2 = tonumber(C.ddp_profiler_now_ns())
    if t2 - t1 < best_rtt then best_rtt, best_off = t2 - t1, t0 - (t1 + t2) / 2 end
  end
  return math.floor(best_off + 0.5), math.ceil(best_rtt / 2), rank, world
end

-- ---- reading the C stream ----------------------------------------------------------------

local n_box = ffi.new("int64_t[1]")

-- The recorded events as Lua tables {name, cat, ts, dur (ns), tid, bytes, arg, detail},
-- sorted by start (longer first at equal starts, so parents precede children).
local function read_events()
  local n = tonumber(C.ddp_profiler_event_count())
  local buf = ffi.new("ddp_prof_event[?]", math.max(n, 1))
  check(C.ddp_profiler_events(buf, n, n_box))
  local names, cats, out = {}, {}, {}
  for i = 0, tonumber(n_box[0]) - 1 do
    local e = buf[i]
    -- one literal may name an op and a node ("CrossEntropyBackward"): key by both
    local key = tonumber(ffi.cast("intptr_t", e.name)) * 16 + e.category
    local name = names[key]
    if not name then
      name = ffi.string(e.name)
      -- PyTorch's name for a backward node's event (keeps it apart from an op of that name)
      if e.category == C.DDP_PROF_AUTOGRAD then name = "autograd::engine::evaluate_function: " .. name end
      names[key] = name
    end
    local cat = cats[e.category]
    if not cat then cat = ffi.string(C.ddp_profiler_category_name(e.category)); cats[e.category] = cat end
    local ts = tonumber(e.begin_ns)
    out[#out + 1] = {
      name = name, cat = cat, ts = ts, dur = tonumber(e.end_ns) - ts, tid = e.tid,
      bytes = e.bytes >= 0 and tonumber(e.bytes) or nil, arg = e.arg >= 0 and tonumber(e.arg) or nil,
      detail = e.detail[0] ~= 0 and ffi.string(e.detail) or nil,
    }
  end
  table.sort(out, function(a, b)
    if a.ts ~= b.ts then return a.ts < b.ts end
    return a.dur > b.dur
  end)
  return out
end

-- ---- the profile object ------------------------------------------------------------------

local Profile = {}
Profile.__index = Profile

--- profiler.profile{activities, schedule, record_shapes, on_trace_ready, align_clocks,
-- events_per_thread} -> a profile object (not started):
--   activities: a list of ProfilerActivity values (default {CPU});
--   schedule: a function step -> ProfilerAction (profiler.schedule{...}), or the table
--     {wait, warmup, active, repeat, skip_first} that profiler.schedule takes; without one,
--     everything between start() and stop() is recorded and saved at stop();
--   record_shapes: op events carry their input shapes (Note [profiler shapes]);
--   on_trace_ready: fn(prof), called after each RECORD_AND_SAVE step (and at stop() for a
--     recording cut short): export from it (profiler.tensorboard_trace_handler(dir));
--   align_clocks (default true): measure the clock offset to rank 0 at start() when a
--     process group is initialized (Note [trace clock alignment]); collective: every rank;
--   events_per_thread: each thread's buffer (default 131072 events, 112 bytes each).
-- Methods: start, stop, step, export_chrome_trace(path), key_averages(), events().
function M.profile(opts)
  opts = opts or {}
  if type(opts) ~= "table" then raise("profile: expected a table of options", 2) end
  local activities = opts.activities or { M.ProfilerActivity.CPU }
  if type(activities) ~= "table" then raise("profile: activities must be a list of ProfilerActivity values", 2) end
  for _, a in ipairs(activities) do
    if not M.ProfilerActivity[a] then
      raise(("profile: unknown activity %s (ProfilerActivity.CPU or .CUDA)"):format(tostring(a)), 2)
    end
  end
  local schedule = opts.schedule
  if type(schedule) == "table" then schedule = M.schedule(schedule) end
  if schedule ~= nil and type(schedule) ~= "function" then
    raise("profile: schedule must be a table {wait, warmup, active, repeat} or a function step -> "
      .. "ProfilerAction (profiler.schedule{...})", 2)
  end
  if opts.on_trace_ready ~= nil and type(opts.on_trace_ready) ~= "function" then
    raise("profile: on_trace_ready must be a function(prof)", 2)
  end
  local per_thread = opts.events_per_thread or 0
  if type(per_thread) ~= "number" or per_thread < 0 or per_thread % 1 ~= 0 then
    raise("profile: events_per_thread must be an integer >= 0", 2)
  end
  return setmetatable({
    activities = activities, schedule = schedule, record_shapes = opts.record_shapes and true or false,
    on_trace_ready = opts.on_trace_ready, align = opts.align_clocks ~= false, per_thread = per_thread,
    step_num = 0, action = A.NONE, started = false, step_open = false, events_ = nil,
    rank = 0, world_size = 1, clock_offset_ns = 0, clock_error_ns = 0, dropped = 0,
  }, Profile)
end

local function recording(action) return action == A.RECORD or action == A.RECORD_AND_SAVE end

local function open_step(self)
  if recording(self.action) and not self.step_open then
    check(C.ddp_profiler_range_push("ProfilerStep#" .. self.step_num, C.DDP_PROF_STEP))
    self.step_open = true
  end
end

local function close_step(self)
  if self.step_open then
    check(C.ddp_profiler_range_pop())
    self.step_open = false
  end
end

-- Enter `action` coming from self.action (the C stream follows: on for WARMUP and RECORD*,
-- warm-up events dropped when recording begins).
local function enter(self, action)
  local prev = self.action
  if action ~= A.NONE and C.ddp_profiler_enabled() == 0 then
    check(C.ddp_profiler_start(self.per_thread, self.record_shapes and C.DDP_PROF_RECORD_SHAPES or 0))
  elseif recording(action) and prev == A.WARMUP then
    C.ddp_profiler_clear()
  end
  if action == A.NONE and C.ddp_profiler_enabled() ~= 0 then C.ddp_profiler_stop() end
  self.action = action
  open_step(self)
end

-- Stop recording, keep the events, call on_trace_ready.
local function save(self)
  close_step(self)
  C.ddp_profiler_stop()
  self.dropped = tonumber(C.ddp_profiler_dropped())
  self.events_ = read_events()
  self.action = A.NONE
  if self.on_trace_ready then self.on_trace_ready(self) end
end

--- prof:start(): align the clocks (when distributed; every rank must call it) and begin
-- the schedule at step 0 (or record, without a schedule). Raises when another profiler of
-- this process records.
function Profile:start()
  if self.started then raise("profile:start: already started", 2) end
  if C.ddp_profiler_enabled() ~= 0 then
    raise("profile:start: another profiler of this process is recording (stop it first)", 2)
  end
  if self.align then
    self.clock_offset_ns, self.clock_error_ns, self.rank, self.world_size = align_clocks()
  else
    local ok, dist = pcall(require, "ddplua.distributed.distributed_c10d")
    if ok and dist.is_initialized() then self.rank, self.world_size = dist.get_rank(), dist.get_world_size() end
  end
  self.started = true
  self.step_num = 0
  self.action = A.NONE
  enter(self, self.schedule and self.schedule(0) or A.RECORD)
  return self
end

--- prof:step(): the end of a training step: closes this step's ProfilerStep#N range,
-- advances the schedule, and after a RECORD_AND_SAVE step stops recording and calls
-- on_trace_ready. Call it once per iteration, on every rank.
function Profile:step()
  if not self.started then raise("profile:step: not started (call prof:start() first)", 2) end
  close_step(self)
  local prev = self.action
  self.step_num = self.step_num + 1
  local nxt = self.schedule and self.schedule(self.step_num) or A.RECORD
  if prev == A.RECORD_AND_SAVE then save(self) end
  enter(self, nxt)
end

--- prof:stop(): stop recording; a recording not saved yet (no schedule, or cut short) is
-- kept and handed to on_trace_ready.
function Profile:stop()
  if not self.started then return end
  self.started = false
  if recording(self.action) then
    save(self)
  else
    close_step(self)
    C.ddp_profiler_stop()
    self.action = A.NONE
  end
end

--- prof:events() -> the last saved recording: a list of {name, cat, ts, dur, tid, bytes,
-- arg, detail} (ts, dur in ns of this rank's clock; cat one of "op", "autograd",
-- "collective", "bucket", "loader", "optimizer", "user_annotation", "step", "memory").
function Profile:events()
  if not self.events_ then raise("profile: nothing recorded yet (no saved step; call stop())", 2) end
  return self.events_
end

-- ---- Chrome trace ------------------------------------------------------------------------

local escapes = { ['"'] = '\\"', ["\\"] = "\\\\" }
local function jstr(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return escapes[c] or ("\\u%04x"):format(c:byte()) end) .. '"'
end

-- JSON text of one event (ts, dur in microseconds, ns precision) for process `pid`.
local function event_json(e, pid, shift_ns)
  local args = {}
  if e.bytes then args[#args + 1] = '"bytes":' .. ("%d"):format(e.bytes) end
  if e.arg then args[#args + 1] = (e.cat == "bucket" and '"bucket":' or '"seq":') .. ("%d"):format(e.arg) end
  if e.detail then
    args[#args + 1] = (e.cat == "op" and '"Input Dims":' or '"site":') .. jstr(e.detail)
  end
  local ts = (e.ts + shift_ns) / 1000
  local head = ('{"name":%s,"cat":"%s","pid":%d,"tid":%d,"ts":%.3f'):format(jstr(e.name), e.cat, pid, e.tid, ts)
  if e.cat == "bucket" and e.dur == 0 then head = head .. ',"ph":"i","s":"t"'
  else head = head .. (',"ph":"X","dur":%.3f'):format(e.dur / 1000) end
  return head .. ',"args":{' .. table.concat(args, ",") .. "}}"
end

--- profiler.write_chrome_trace(path, events, meta): write `events` (prof:events() form)
-- as Chrome trace JSON: {"traceEvents": [...], "displayTimeUnit": "ms", "distributedInfo":
-- {rank, world_size}, "ddplua": meta}. meta.rank is the pid; meta.clock_offset_ns, when
-- meta.aligned is true, has already been applied by the caller. Raises naming the path
-- when it cannot be written.
function M.write_chrome_trace(path, events, meta)
  local parts = {}
  local pids = {}
  for _, e in ipairs(events) do
    local pid = e.pid or meta.rank or 0
    pids[pid] = true
    parts[#parts + 1] = event_json(e, pid, 0)
  end
  for pid in pairs(pids) do
    parts[#parts + 1] = ('{"name":"process_name","ph":"M","pid":%d,"args":{"name":"rank %d"}}'):format(pid, pid)
    parts[#parts + 1] = ('{"name":"process_sort_index","ph":"M","pid":%d,"args":{"sort_index":%d}}'):format(pid, pid)
  end
  local ckpt = require "ddplua.checkpoint"
  local text = '{"traceEvents":[\n' .. table.concat(parts, ",\n") .. '\n],\n"displayTimeUnit":"ms",\n'
    .. ('"distributedInfo":{"rank":%d,"world_size":%d},\n'):format(meta.rank or 0, meta.world_size or 1)
    .. '"ddplua":' .. ckpt.json_encode(meta) .. "}\n"
  local f, err = io.open(path, "w")
  if not f then raise(("export_chrome_trace: cannot write %s: %s"):format(path, tostring(err)), 3) end
  f:write(text)
  f:close()
end

--- prof:export_chrome_trace(path): write the last saved recording as Chrome trace JSON
-- (pid = rank, tid = OS thread id, ts/dur in microseconds of this rank's clock; metadata
-- "ddplua": rank, world_size, clock_offset_ns, clock_error_ns, dropped). Raises when nothing
-- was recorded or the file cannot be written.
function Profile:export_chrome_trace(path)
  if type(path) ~= "string" then raise("export_chrome_trace: path must be a string", 2) end
  local events = self:events()
  M.write_chrome_trace(path, events, {
    rank = self.rank, world_size = self.world_size, clock_offset_ns = self.clock_offset_ns,
    clock_error_ns = self.clock_error_ns, dropped = self.dropped, aligned = false,
    record_shapes = self.record_shapes,
  })
end

--- profiler.read_chrome_trace(path) -> events, meta: the events of a trace file written by
-- export_chrome_trace or `ddplua trace merge` (ts, dur back in ns; pid kept), and its
-- "ddplua" metadata ({} for a foreign trace). Raises naming the file when it cannot be read
-- or is not a trace.
function M.read_chrome_trace(path)
  local f, err = io.open(path, "r")
  if not f then raise("trace: cannot read " .. tostring(err), 2) end
  local text = f:read("*a")
  f:close()
  local ok, doc = pcall(require("ddplua.checkpoint").json_decode, text)
  if not ok or type(doc) ~= "table" or type(doc.traceEvents) ~= "table" then
    raise(("trace: %s is not a Chrome trace (no traceEvents list)%s"):format(path,
      ok and "" or ": " .. tostring(doc)), 2)
  end
  local events = {}
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == "X" or e.ph == "i" then
      local a = e.args or {}
      events[#events + 1] = {
        name = e.name, cat = e.cat or "op", ts = math.floor(e.ts * 1000 + 0.5),
        dur = math.floor((e.dur or 0) * 1000 + 0.5), tid = e.tid or 0, pid = e.pid or 0,
        bytes = a.bytes, arg = a.bucket or a.seq, detail = a["Input Dims"] or a.site,
      }
    end
  end
  return events, doc.ddplua or {}
end

-- ---- key_averages ------------------------------------------------------------------------

local Averages = {}
Averages.__index = Averages

--- profiler.key_averages(events) -> a list of rows {key, count, self_cpu_time_total,
-- cpu_time_total, cpu_time (avg), cat} (times in microseconds, as PyTorch's FunctionEventAvg),
-- one per event name, with a :table{sort_by, row_limit} method. Self time is an event's
-- time minus that of the events nested in it on the same thread (an op inside a backward
-- node, a node inside a range). ProfilerStep ranges and instant events count calls only
-- in their own rows.
function M.key_averages(events)
  local rows, by_key = {}, {}
  local by_thread = {}
  for _, e in ipairs(events) do
    local k = (e.pid or 0) .. ":" .. e.tid
    local list = by_thread[k]
    if not list then list = {}; by_thread[k] = list end
    list[#list + 1] = e
  end
  local self_ns = {}
  for _, list in pairs(by_thread) do
    table.sort(list, function(a, b) if a.ts ~= b.ts then return a.ts < b.ts end return a.dur > b.dur end)
    local stack = {}
    for _, e in ipairs(list) do
      -- pop what ends before e ends: finished, or overlapping without nesting (no parent)
      while #stack > 0 and stack[#stack].ts + stack[#stack].dur < e.ts + e.dur do stack[#stack] = nil end
      self_ns[e] = e.dur
      local parent = stack[#stack]
      if parent then self_ns[parent] = self_ns[parent] - e.dur end
      stack[#stack + 1] = e
    end
  end
  for _, e in ipairs(events) do
    local r = by_key[e.name]
    if not r then
      r = { key = e.name, cat = e.cat, count = 0, self_cpu_time_total = 0, cpu_time_total = 0 }
      by_key[e.name] = r
      rows[#rows + 1] = r
    end
    r.count = r.count + 1
    r.cpu_time_total = r.cpu_time_total + e.dur / 1000
    r.self_cpu_time_total = r.self_cpu_time_total + math.max(self_ns[e] or e.dur, 0) / 1000
  end
  for _, r in ipairs(rows) do r.cpu_time = r.cpu_time_total / r.count end
  return setmetatable(rows, Averages)
end

--- prof:key_averages(): profiler.key_averages of the last saved recording.
function Profile:key_averages() return M.key_averages(self:events()) end

-- PyTorch's time format: "12.345us", "1.234ms", "1.234s".
local function fmt_us(us)
  if us >= 1e6 then return ("%.3fs"):format(us / 1e6) end
  if us >= 1e3 then return ("%.3fms"):format(us / 1e3) end
  return ("%.3fus"):format(us)
end

local SORT_KEYS = { self_cpu_time_total = true, cpu_time_total = true, cpu_time = true, count = true }

--- averages:table{sort_by = "self_cpu_time_total" | "cpu_time_total" | "cpu_time" | "count",
-- row_limit = 100} -> the text of PyTorch's table (Name, Self CPU %, Self CPU, CPU total %,
-- CPU total, CPU time avg, # of Calls), rows in decreasing sort_by, and the line "Self CPU
-- time total: ..." (the sum of self times, all threads). ProfilerStep rows are left out
-- (they span the others), as PyTorch's table shows them but they add nothing to a sum.
function Averages:table(opts)
  opts = opts or {}
  local sort_by = opts.sort_by or "self_cpu_time_total"
  if not SORT_KEYS[sort_by] then
    raise(("key_averages:table: sort_by must be self_cpu_time_total, cpu_time_total, cpu_time "
      .. "or count, got %s"):format(tostring(sort_by)), 2)
  end
  local limit = opts.row_limit or 100
  local rows, total = {}, 0
  for _, r in ipairs(self) do
    if r.cat ~= "step" then
      rows[#rows + 1] = r
      total = total + r.self_cpu_time_total
    end
  end
  table.sort(rows, function(a, b)
    if a[sort_by] ~= b[sort_by] then return a[sort_by] > b[sort_by] end
    return a.key < b.key
  end)
  local width = 4
  for i = 1, math.min(#rows, limit) do width = math.max(width, math.min(#rows[i].key, 60)) end
  local cols = { "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "# of Calls" }
  local rule = ("-"):rep(width) .. ("  " .. ("-"):rep(12)):rep(#cols)
  local out = { rule, ("%-" .. width .. "s"):format("Name") }
  for _, c in ipairs(cols) do out[2] = out[2] .. ("  %12s"):format(c) end
  out[3] = rule
  local pct = function(v) return total > 0 and ("%.2f%%"):format(100 * v / total) or "0.00%" end
  for i = 1, math.min(#rows, limit) do
    local r = rows[i]
    local name = #r.key > width and r.key:sub(1, width - 3) .. "..." or r.key
    out[#out + 1] = ("%-" .. width .. "s  %12s  %12s  %12s  %12s  %12s  %12d"):format(name,
      pct(r.self_cpu_time_total), fmt_us(r.self_cpu_time_total), pct(r.cpu_time_total),
      fmt_us(r.cpu_time_total), fmt_us(r.cpu_time), r.count)
  end
  out[#out + 1] = rule
  out[#out + 1] = "Self CPU time total: " .. fmt_us(total)
  return table.concat(out, "\n") .. "\n"
end

Averages.__tostring = function(self) return self:table() end

-- ---- step coverage -----------------------------------------------------------------------

-- Categories that are work of the rank (not annotations): what coverage counts.
M.WORK_CATEGORIES = { op = true, autograd = true, collective = true, bucket = true, loader = true,
  optimizer = true, memory = true }

--- profiler.step_coverage(events) -> a list, one per ProfilerStep#N event, of {pid, step
-- (the name), ts, dur (ns), covered (ns), fraction}: how much of the step's wall time the
-- union of the rank's work events (op, autograd, collective, bucket, loader, optimizer,
-- memory: the collections that release tensors; every
-- thread of that rank) covers. Used by `ddplua trace summary` and the specs: what no event
-- covers is time in Lua between ops.
function M.step_coverage(events)
  local out = {}
  for _, s in ipairs(events) do
    if s.cat == "step" then
      local a, b = s.ts, s.ts + s.dur
      local spans = {}
      for _, e in ipairs(events) do
        if M.WORK_CATEGORIES[e.cat] and (e.pid or 0) == (s.pid or 0) and e.ts < b and e.ts + e.dur > a then
          spans[#spans + 1] = { math.max(e.ts, a), math.min(e.ts + e.dur, b) }
        end
      end
      table.sort(spans, function(x, y) return x[1] < y[1] end)
      local covered, lo, hi = 0, nil, nil
      for _, sp in ipairs(spans) do
        if hi and sp[1] <= hi then
          if sp[2] > hi then hi = sp[2] end
        else
          if hi then covered = covered + hi - lo end
          lo, hi = sp[1], sp[2]
        end
      end
      if hi then covered = covered + hi - lo end
      out[#out + 1] = { pid = s.pid or 0, step = s.name, ts = s.ts, dur = s.dur, covered = covered,
        fraction = s.dur > 0 and covered / s.dur or 1 }
    end
  end
  return out
end

-- ---- handlers ----------------------------------------------------------------------------

--- profiler.tensorboard_trace_handler(dir[, worker_name]) -> an on_trace_ready function
-- writing dir/<worker_name>.<step>.pt.trace.json (worker_name default "rank<r>"; step: the
-- profiler's step count when saved), creating dir. `ddplua trace merge dir` joins the
-- ranks' files.
function M.tensorboard_trace_handler(dir, worker_name)
  if type(dir) ~= "string" or dir == "" then raise("tensorboard_trace_handler: dir must be a path", 2) end
  return function(prof)
    check(C.ddp_os_mkdir_p(dir))
    local name = worker_name or ("rank" .. prof.rank)
    prof:export_chrome_trace(("%s/%s.%d.pt.trace.json"):format(dir, name, prof.step_num))
  end
end

return M
