-- Specs for ddplua.utils.tensorboard (SummaryWriter) and the event files of
-- runtime/io/event_file.c, read back by readers that share no code with them:
-- spec/fixtures/tfevents_read.py (the TFRecord framing, CRC-32C and protobuf wire format
-- decoded from their specifications; works offline, checks exact values) and the
-- `tensorboard` Python package (installed with pip into a virtual environment in the
-- cache folder; pending with the reason when that cannot be done).
local ffi = require "ffi"
local lib = require "ddplua.lib"
local dl = require "ddplua"
local files = require "files"
local tensorboard = require "ddplua.utils.tensorboard"
local SummaryWriter = tensorboard.SummaryWriter
local C = lib.C

local PY = "/usr/bin/python3"

-- Run a Python fixture that prints a Lua chunk; returns what the chunk returns.
local function python_lua(script, args)
  local status, out = files.run(PY .. " spec/fixtures/" .. script .. " " .. args)
  assert(status == 0, script .. " failed: " .. out)
  return assert(loadstring(out))()
end

local function read_events(path) return python_lua("tfevents_read.py", files.quote(path)) end

-- The f32 rounding of x (what simple_value holds), as a Lua number.
local function f32(x) return tonumber(ffi.new("float[1]", x)[0]) end

local function event_files(dir)
  local list = {}
  local p = io.popen("ls " .. files.quote(dir) .. " 2>/dev/null")
  for name in p:lines() do
    if name:match("^events%.out%.tfevents%.") then list[#list + 1] = dir .. "/" .. name end
  end
  p:close()
  return list
end

describe("ddplua.utils.tensorboard", function()
  local dir
  before_each(function() dir = files.tmpdir("tensorboard") end)
  after_each(function() files.remove(dir) end)

  it("computes CRC-32C with RFC 3720's check values", function()
    assert.are.equal(0xE3069283, tonumber(C.ddp_crc32c(0, "123456789", 9)))
    assert.are.equal(0x8A9136AA, tonumber(C.ddp_crc32c(0, ffi.new("uint8_t[32]"), 32)))
    -- continuing a CRC over a second piece equals the CRC of the whole
    assert.are.equal(0xE3069283, tonumber(C.ddp_crc32c(C.ddp_crc32c(0, "1234", 4), "56789", 5)))
  end)

  it("writes scalars whose values, steps and wall times read back exactly", function()
    local w = SummaryWriter(dir .. "/run")
    local path = w:file_path()
    assert.matches("^" .. dir:gsub("%p", "%%%0") .. "/run/events%.out%.tfevents%.%d%d%d%d%d%d%d%d%d%d%.", path)
    local logged = {}
    for step = 1, 5 do
      local v = 1 / (step * 3) + step * 1e-9 -- no exact f32
      w:add_scalar("train/loss", v, step, 1700000000.25 + step)
      logged[step] = v
    end
    w:add_scalar("lr", dl.tensor({ 0.125 }), 7) -- a one-element tensor, default walltime
    w:add_scalar("big_step", 2.5, 2 ^ 40)
    w:close()
    local ev = read_events(path)
    assert.are.equal("brain.Event:2", ev[1].file_version)
    assert.are.equal(8, #ev)
    for step = 1, 5 do
      local e = ev[step + 1]
      assert.are.equal(step, e.step)
      assert.are.equal(1700000000.25 + step, e.wall_time)
      assert.are.equal("train/loss", e.values[1].tag)
      assert.are.equal(f32(logged[step]), e.values[1].simple_value)
      assert.are_not.equal(logged[step], e.values[1].simple_value) -- stored as f32
    end
    assert.are.equal("lr", ev[7].values[1].tag)
    assert.are.equal(0.125, ev[7].values[1].simple_value)
    assert.are.equal(7, ev[7].step)
    assert.is_true(math.abs(ev[7].wall_time - require("ddplua.os").time()) < 60)
    assert.are.equal(2 ^ 40, ev[8].step)
  end)

  it("writes histograms with the fields torch.utils.tensorboard computes", function()
    local values = {}
    for i = 1, 200 do values[i] = f32(math.sin(i * 0.37) * (i % 7) - 0.5) end -- exact in an f32 tensor too
    local vfile = files.write(dir, "values.txt", table.concat((function()
      local t = {}
      for i, v in ipairs(values) do t[i] = ("%.17g\n"):format(v) end
      return t
    end)()))
    local w = SummaryWriter(dir .. "/h")
    w:add_histogram("w/default", dl.tensor(values), 1) -- "tensorflow" bins
    w:add_histogram("w/ten", values, 2, 10)
    w:add_histogram("w/edges", dl.tensor(values):double(), 3, { -2, -1, 0, 0.5, 1, 4 })
    w:add_histogram("w/merged", values, 4, 30, nil, 7)
    w:add_histogram("w/const", { 3, 3, 3 }, 5, 4)
    w:close()
    local ev = read_events(w:file_path())
    local cases = {
      { "w/default", "tensorflow" }, { "w/ten", "10" }, { "w/edges", "-2,-1,0,0.5,1,4" }, { "w/merged", "30", "7" },
    }
    for k, c in ipairs(cases) do
      local got = ev[k + 1].values[1]
      assert.are.equal(c[1], got.tag)
      local want = python_lua("histogram_expect.py", files.quote(vfile) .. " " .. c[2] .. (c[3] and " " .. c[3] or ""))
      for _, field in ipairs { "min", "max", "num" } do assert.are.equal(want[field], got.histo[field], c[1] .. " " .. field) end
      -- numpy sums pairwise, the writer in order: equal to rounding
      for _, field in ipairs { "sum", "sum_squares" } do
        assert.is_true(math.abs(want[field] - got.histo[field]) <= 1e-12 * math.abs(want[field]) + 1e-12, c[1] .. " " .. field)
      end
      assert.are.same(want.bucket_limit, got.histo.bucket_limit, c[1])
      assert.are.same(want.bucket, got.histo.bucket, c[1])
    end
    local constant = ev[6].values[1].histo -- min == max: numpy's range widened by 0.5
    assert.are.same({ 3, 3.25 }, constant.bucket_limit) -- edges 2.5, 2.75, 3, 3.25, 3.5
    assert.are.same({ 0, 3 }, constant.bucket)
    assert.are.same({ 3, 3, 3, 9, 27 }, { constant.min, constant.max, constant.num, constant.sum, constant.sum_squares })
  end)

  it("writes text as PyTorch does: a string tensor for the text plugin", function()
    local w = SummaryWriter(dir .. "/t")
    w:add_text("notes", "**lr** 0.1, ünïcode", 3)
    w:close()
    local v = read_events(w:file_path())[2].values[1]
    assert.are.equal("notes/text_summary", v.tag)
    assert.are.equal("text", v.metadata.plugin_name)
    assert.are.equal(7, v.tensor.dtype) -- DT_STRING
    assert.are.same({ 1 }, v.tensor.shape)
    assert.are.same({ "**lr** 0.1, ünïcode" }, v.tensor.string_val)
  end)

  it("writes add_scalars into one sub-writer per tag, as PyTorch", function()
    local w = SummaryWriter(dir .. "/s")
    w:add_scalars("loss/all", { train = 0.5, test = 0.75 }, 1, 1234.5)
    w:add_scalars("loss/all", { train = 0.25, test = 0.625 }, 2)
    w:close()
    assert.are.equal(1, #event_files(dir .. "/s"))
    for tag, values in pairs { train = { 0.5, 0.25 }, test = { 0.75, 0.625 } } do
      local sub = event_files(dir .. "/s/loss_all_" .. tag)
      assert.are.equal(1, #sub, tag)
      local ev = read_events(sub[1])
      assert.are.equal(3, #ev)
      for i = 1, 2 do
        assert.are.equal("loss/all", ev[i + 1].values[1].tag)
        assert.are.equal(values[i], ev[i + 1].values[1].simple_value)
        assert.are.equal(i, ev[i + 1].step)
      end
      assert.are.equal(1234.5, ev[2].wall_time)
    end
  end)

  it("writes add_hparams as the hparams plugin's three summaries plus the metrics", function()
    local w = SummaryWriter(dir .. "/hp")
    w:add_hparams({ lr = 0.1, optimizer = "sgd", nesterov = true, batch = dl.tensor({ 64 }) },
      { ["hparam/accuracy"] = 0.875 }, nil, "run1")
    w:close()
    local sub = event_files(dir .. "/hp/run1")
    assert.are.equal(1, #sub)
    local ev = read_events(sub[1])
    assert.are.equal(5, #ev)
    local tags = {}
    for i = 2, 4 do
      local v = ev[i].values[1]
      tags[#tags + 1] = v.tag
      assert.are.equal("hparams", v.metadata.plugin_name)
    end
    assert.are.same({ "_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info" }, tags)
    local exp = ev[2].values[1].metadata.hparams.experiment
    assert.are.same({ { name = "batch", type = 3 }, { name = "lr", type = 3 }, { name = "nesterov", type = 3 },
      { name = "optimizer", type = 1 } }, exp.hparam_infos) -- FLOAT64 = 3, STRING = 1 (bool as a number, as PyTorch)
    assert.are.same({ "hparam/accuracy" }, exp.metric_infos)
    assert.are.same({ batch = 64, lr = 0.1, nesterov = 1, optimizer = "sgd" },
      ev[3].values[1].metadata.hparams.session_start_info.hparams)
    assert.are.equal(1, ev[4].values[1].metadata.hparams.session_end_info.status) -- STATUS_SUCCESS
    assert.are.equal("hparam/accuracy", ev[5].values[1].tag)
    assert.are.equal(0.875, ev[5].values[1].simple_value)
  end)

  it("writes on rank 0 only unless asked (Note [summary writer ranks])", function()
    local w = SummaryWriter(dir .. "/r1", { rank = 1 })
    assert.is_false(w.enabled)
    w:add_scalar("x", 1, 1)
    w:add_histogram("h", { 1, 2 }, 1)
    w:add_text("t", "x")
    w:add_scalars("m", { a = 1 })
    w:add_hparams({ a = 1 }, { m = 1 })
    w:flush()
    w:close()
    assert.is_nil(io.open(dir .. "/r1")) -- no folder, no file
    local all = SummaryWriter(dir .. "/r1all", { rank = 1, all_ranks = true })
    all:add_scalar("x", 1, 1)
    all:close()
    assert.are.equal(2, #read_events(all:file_path()))
  end)

  it("raises clear errors naming the tag, the file or the folder", function()
    local w = SummaryWriter(dir .. "/e")
    local ok, err = pcall(function() w:add_histogram("h", {}, 1) end)
    assert.is_false(ok)
    assert.matches("SummaryWriter.add_histogram: The input has no element %(tag 'h'%)", err)
    ok, err = pcall(function() w:add_histogram("h", { 1, 0 / 0 }, 1) end)
    assert.is_false(ok)
    assert.matches("the values of 'h' hold NaN %(element 1%)", err)
    ok, err = pcall(function() w:add_histogram("h", { 1, 2 }, 1, { 1, 1, 2 }) end)
    assert.matches("bins must increase monotonically", err)
    ok, err = pcall(function() w:add_histogram("h", { 1, 2 }, 1, "auto") end)
    assert.matches("bins must be \"tensorflow\", an integer or a list of edges, got \"auto\"", err)
    ok, err = pcall(function() w:add_scalar("s", "high", 1) end)
    assert.matches("SummaryWriter.add_scalar: scalar_value must be a number or a one%-element tensor, got string", err)
    ok, err = pcall(function() w:add_scalar("s", 1, 1.5) end)
    assert.matches("global_step must be an integer, got 1.5", err)
    w:close()
    w:close() -- a second close does nothing
    ok, err = pcall(function() w:add_scalar("s", 1, 1) end)
    assert.matches("SummaryWriter.add_scalar: the writer of '.*/e' is closed", err)
    -- PyTorch's queue options are accepted (nothing to queue); an unknown option raises
    SummaryWriter(dir .. "/q", { max_queue = 5, flush_secs = 10 }):close()
    ok, err = pcall(function() SummaryWriter(dir .. "/q", { purge_step = 3 }) end)
    assert.matches("SummaryWriter: unknown option 'purge_step'", err)
    -- a file where the folder should be: the error names it
    files.write(dir, "blocker", "x")
    ok, err = pcall(function() SummaryWriter(dir .. "/blocker/run") end)
    assert.is_false(ok)
    assert.matches("blocker", err)
  end)

  it("writes files whose CRCs the independent reader checks", function()
    local w = SummaryWriter(dir .. "/c")
    w:add_scalar("x", 1.5, 1)
    w:close()
    local data = files.read(w:file_path())
    -- flip one byte of the last record's data: the reader must refuse the file
    local bad = data:sub(1, #data - 6) .. string.char((data:byte(#data - 5) + 1) % 256) .. data:sub(#data - 4)
    local path = files.write(dir, "bad.tfevents", bad)
    local status, out = files.run(PY .. " spec/fixtures/tfevents_read.py " .. files.quote(path))
    assert.are_not.equal(0, status)
    assert.matches("bad data CRC", out)
  end)

  describe("read by the tensorboard package", function()
    local cache = os.getenv("DDPLUA_DATA") or ((os.getenv("XDG_CACHE_HOME") or ((os.getenv("HOME") or "/tmp") .. "/.cache")) .. "/ddplua")
    local venv = cache .. "/tensorboard-venv"
    local function have_tensorboard()
      return (files.run(venv .. "/bin/python -c 'import tensorboard' ")) == 0
    end
    local ready, why = have_tensorboard(), nil
    if not ready then
      local status, out = files.run(("(mkdir -p %s && %s -m venv %s && timeout 600 %s/bin/pip install -q tensorboard)"):format(
        files.quote(cache), PY, files.quote(venv), files.quote(venv)))
      ready = status == 0 and have_tensorboard()
      if not ready then why = (out:match("[^\n]*ERROR[^\n]*") or out:sub(-300)) end
    end
    if not ready then
      pending("the tensorboard package could not be installed into " .. venv .. ": " .. tostring(why))
      return
    end

    it("reads back the scalars, the histogram, the text and the hparams", function()
      local w = SummaryWriter(dir .. "/tb")
      local logged = {}
      for step = 1, 4 do
        logged[step] = 0.1 * step + 1 / 3
        w:add_scalar("loss", logged[step], step)
      end
      w:add_histogram("weights", { -1, 0.5, 0.25, 2, 2 }, 4, 4)
      w:add_text("note", "hello", 4)
      w:add_hparams({ lr = 0.25, optimizer = "adam" }, { ["hparam/loss"] = 0.5 }, nil, "hp")
      w:close()
      local status, out = files.run(venv .. "/bin/python spec/fixtures/tfevents_tensorboard.py " .. files.quote(dir .. "/tb")
        .. " " .. files.quote(dir .. "/tb/hp"))
      assert.are.equal(0, status, out)
      local got = assert(loadstring(out))()
      assert.are.equal(4, #got.loss)
      for step = 1, 4 do
        assert.are.equal(step, got.loss[step].step)
        assert.are.equal(f32(logged[step]), got.loss[step].value)
      end
      local h = got.weights[1]
      assert.are.same({ -1, 2, 5, 3.75, 9.3125 }, { h.min, h.max, h.num, h.sum, h.sum_squares })
      assert.are.same({ -1, -0.25, 0.5, 1.25, 2 }, h.bucket_limit)
      assert.are.same({ 0, 1, 1, 1, 2 }, h.bucket)
      assert.are.same({ "hello" }, got.text)
      assert.are.same({ names = { "lr", "optimizer" }, types = { 3, 1 }, metrics = { "hparam/loss" },
        values = { lr = 0.25, optimizer = "adam" }, status = 1 }, got.hparams)
    end)
  end)
end)
