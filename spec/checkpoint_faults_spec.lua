-- Fault-injection specs for checkpoints and resumed runs (issue 10, part 4): a saver killed
-- with SIGKILL leaves its temporary file, which the next save or load removes (Note
-- [checkpoint temp files] in runtime/io/safetensors.c); a crash between an epoch's metrics
-- row and its checkpoint does not duplicate the row on resume (Note [metrics rows on
-- resume] in lua/ddplua/utils/metrics_file.lua); a train state with bad optimizer state
-- fails at load, naming what is wrong (Note [validate loaded state] in
-- lua/ddplua/optim/optimizer.lua).
local dl = require "ddplua"
local checkpoint = require "ddplua.checkpoint"
local MetricsFile = require "ddplua.utils.metrics_file"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local train_state = require "ddplua.train_state"
local files = require "files"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
local q = files.quote

-- The names in dir that start with `prefix`.
local function entries(dir, prefix)
  local out = {}
  local p = assert(io.popen("ls -A " .. q(dir)))
  for name in p:lines() do
    if name:sub(1, #prefix) == prefix then out[#out + 1] = name end
  end
  p:close()
  return out
end

-- A pid that no process has now: one of a shell that has ended.
local function dead_pid()
  local p = assert(io.popen("sh -c 'echo $$'"))
  local pid = tonumber(p:read("*l"))
  p:close()
  return pid
end

local function hostname()
  local p = assert(io.popen("hostname"))
  local h = p:read("*l")
  p:close()
  return (h:gsub("[/.]", "_"))
end

describe("checkpoint temp files #faults", function()
  local dir
  before_each(function() dir = files.tmpdir("ckfaults") end)
  after_each(function() files.remove(dir) end)

  local function touch(name)
    local f = assert(io.open(dir .. "/" .. name, "w"))
    f:write("partial")
    f:close()
  end

  it("sweep removes the temp files of dead writers of this host only", function()
    local path = dir .. "/ck.safetensors"
    local dead = dead_pid()
    -- our parent (the shell that runs busted): alive, and not the pid our own saves use
    local live = io.open("/proc/self/stat"):read("*l"):match("^%d+ %b() %S+ (%d+)")
    touch("ck.safetensors.tmp." .. hostname() .. "." .. dead)   -- killed writer, this host
    touch("ck.safetensors.tmp." .. dead)                        -- an earlier version's name
    touch("ck.safetensors.tmp." .. hostname() .. "." .. live)   -- a writer still running
    touch("ck.safetensors.tmp.otherhost." .. dead)              -- another node's writer
    touch("other.safetensors.tmp." .. hostname() .. "." .. dead) -- another checkpoint
    assert.equal(2, checkpoint.sweep_temp_files(path))
    local left = entries(dir, "ck.safetensors.tmp.")
    table.sort(left)
    local expected = { "ck.safetensors.tmp." .. hostname() .. "." .. live, "ck.safetensors.tmp.otherhost." .. dead }
    table.sort(expected)
    assert.same(expected, left)
    assert.equal(1, #entries(dir, "other.safetensors.tmp."))
    -- save and load sweep too
    touch("ck.safetensors.tmp." .. hostname() .. "." .. dead)
    checkpoint.save(path, { w = dl.ones({ 3 }) })
    assert.equal(2, #entries(dir, "ck.safetensors.tmp."))
    touch("ck.safetensors.tmp." .. dead)
    checkpoint.load(path)
    assert.equal(2, #entries(dir, "ck.safetensors.tmp."))
    assert.equal(0, checkpoint.sweep_temp_files(dir .. "/missing/x.safetensors"))
  end)

  it("kill -9 during save: at most one temp file is ever left, and the next load clears it", function()
    local path = dir .. "/ck.safetensors"
    local script = dir .. "/saver.lua"
    local f = assert(io.open(script, "w"))
    f:write(([[
local dl = require "ddplua"
local checkpoint = require "ddplua.checkpoint"
local t = dl.randn({ 4 * 1024 * 1024 }) -- 16 MB a save
io.open(%q, "w"):close()
while true do checkpoint.save(%q, { w = t }) end
]]):format(dir .. "/started", path))
    f:close()
    local left_behind = 0
    for kill = 1, 5 do
      os.remove(dir .. "/started")
      -- start a saver, wait until it saves, kill -9 it at some point of a save
      local cmd = ("%s %s & pid=$!; while [ ! -e %s ]; do sleep 0.01; done; sleep 0.%d; kill -9 $pid; wait $pid 2>/dev/null")
        :format(q(exe), q(script), q(dir .. "/started"), 1 + kill)
      os.execute(cmd)
      local n = #entries(dir, "ck.safetensors.tmp.")
      assert.is_true(n <= 1, n .. " temp files after kill " .. kill)
      left_behind = left_behind + n
    end
    checkpoint.load(path) -- the last complete save is intact
    assert.equal(0, #entries(dir, "ck.safetensors.tmp."))
    print(("\n[figure] kill -9 during save: %d of 5 kills left a temp file, none after the next load"):format(left_behind))
  end)
end)

describe("metrics rows on resume #faults", function()
  local dir
  before_each(function() dir = files.tmpdir("mfaults") end)
  after_each(function() files.remove(dir) end)
  local COLUMNS = { { "epoch", "%d" }, { "loss", "%.3f" } }

  it("resume_after drops the rows past the checkpoint's epoch", function()
    local path = dir .. "/m.csv"
    local m = MetricsFile.open(path, COLUMNS)
    for e = 1, 3 do m:write { epoch = e, loss = 1 / e } end -- crashed after row 3, checkpoint at 2
    MetricsFile.open(path, COLUMNS, { append = true, resume_after = 2 }):write { epoch = 3, loss = 0.3 }
    assert.equal("epoch,loss\n1,1.000\n2,0.500\n3,0.300\n", files.read(path))
    assert.has_error(function() MetricsFile.open(path, COLUMNS, { append = true, resume_after = "2" }) end)
  end)

  it("train.lua: a crash between the metrics row and the checkpoint gives one row per epoch", function()
    local common = exe .. " train.lua --subset 320 --test-subset 100 --threads 1 --quiet --epochs 2 --out " .. q(dir .. "/r")
    local status, out = files.run(common .. " --stop-after 1")
    assert.equal(0, status, out)
    -- the crash: epoch 2's row reached metrics.csv, its checkpoint did not
    local csv = files.read(dir .. "/r/metrics.csv")
    local f = assert(io.open(dir .. "/r/metrics.csv", "a"))
    f:write(csv:match("\n(1,[^\n]*\n)"):gsub("^1,", "2,"))
    f:close()
    status, out = files.run(common .. " --resume " .. q(dir .. "/r/checkpoint.safetensors"))
    assert.equal(0, status, out)
    csv = files.read(dir .. "/r/metrics.csv")
    local epochs = {}
    for e in csv:gmatch("\n(%d+),") do epochs[#epochs + 1] = tonumber(e) end
    assert.same({ 1, 2 }, epochs)
  end)
end)

describe("train state with bad optimizer state #faults", function()
  local dir
  before_each(function() dir = files.tmpdir("tsfaults") end)
  after_each(function() files.remove(dir) end)

  -- A saved state of a Linear(5, 3) trained one step by `make_opt`, with `corrupt(tensors,
  -- meta)` applied to the file; returns the error of loading it into a fresh model and
  -- optimizer (nil when the load passes).
  local function load_corrupted(make_opt, corrupt)
    local path = dir .. "/ck.safetensors"
    dl.manual_seed(0)
    local model = nn.Linear(5, 3)
    local opt = make_opt(model)
    opt:zero_grad()
    model(dl.randn({ 4, 5 })):sum():backward()
    opt:step()
    train_state.save(path, { model = model, optimizer = opt, progress = { epoch = 1 } })
    local tensors, meta = checkpoint.load(path)
    corrupt(tensors, meta)
    checkpoint.save(path, tensors, meta)
    local model2 = nn.Linear(5, 3)
    local opt2 = make_opt(model2)
    local ok, err = pcall(train_state.load, path, { model = model2, optimizer = opt2 })
    return not ok and tostring(err) or nil
  end
  local sgd = function(m) return optim.SGD(m:parameters(), { lr = 0.1, momentum = 0.9 }) end
  local adam = function(m) return optim.Adam(m:parameters(), { lr = 0.01 }) end

  it("a momentum buffer of another shape fails at load, naming the parameter and the field", function()
    local err = load_corrupted(sgd, function(t)
      t["optimizer.state.0.momentum_buffer"] = dl.zeros({ 7 })
    end)
    assert.is_not_nil(err, "the load passed")
    assert.matches("ck.safetensors: SGD: loaded state of parameter 0: momentum_buffer has shape (7), "
      .. "the parameter (3, 5)", err, 1, true)
  end)

  it("a step that is not a count and an invalid lr fail at load", function()
    local err = load_corrupted(adam, function(_, meta)
      local text = checkpoint.json_encode(meta.optimizer):gsub('%["step",1%]', '["step",-3]')
      meta.optimizer = checkpoint.json_decode(text)
    end)
    assert.is_not_nil(err, "the load passed")
    assert.matches("Adam: loaded state of parameter %d: step must be a count >= 0, got %-3", err)
    err = load_corrupted(sgd, function(_, meta)
      local text = checkpoint.json_encode(meta.optimizer):gsub('%["lr",0%.1%]', '["lr",-1]')
      meta.optimizer = checkpoint.json_decode(text)
    end)
    assert.is_not_nil(err, "the load passed")
    assert.matches("SGD (loaded param group 1): invalid lr -1", err, 1, true)
  end)

  it("state for a parameter the optimizer does not hold fails at load", function()
    local err = load_corrupted(sgd, function(t, meta)
      local text = checkpoint.json_encode(meta.optimizer):gsub('%[0,{', '[9,{', 1)
      meta.optimizer = checkpoint.json_decode(text)
    end)
    assert.is_not_nil(err, "the load passed")
    assert.matches("SGD: loaded state names parameter 9, which no param group holds", err, 1, true)
  end)
end)
