-- Specs for ddplua.distributed.elastic's State (Note [elastic state]): commit / restore in
-- one process (model, optimizer state, sampler position, epoch, step), the commit file, and
-- sync on two ranks under the launcher: the newest commit any rank holds wins, from memory
-- or from the file, and reaches every rank.
local files = require "files"
local dl = require "ddplua"
local nn, optim = require "ddplua.nn", require "ddplua.optim"
local DistributedSampler = require "ddplua.distributed.sampler"
local elastic = require "ddplua.distributed.elastic"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
local q = files.quote

-- A model, an SGD with momentum (so the optimizer has state) and a sampler.
local function setup(seed)
  dl.manual_seed(seed)
  local model = nn.Linear(3, 2)
  local opt = optim.SGD(model:parameters(), { lr = 0.1, momentum = 0.9 })
  local sampler = DistributedSampler(12, { num_replicas = 2, rank = 0 })
  return model, opt, sampler
end

local function same(a, b) return (a - b):abs():max():item() == 0 end

local function train_step(model, opt)
  opt:zero_grad()
  model(dl.ones { 4, 3 }):sum():backward()
  opt:step()
end

describe("elastic.State", function()
  it("restores the last commit: parameters, optimizer state, sampler position, epoch and step", function()
    local model, opt, sampler = setup(1)
    local state = elastic.State { model = model, optimizer = opt, sampler = sampler, epoch = 2 }
    train_step(model, opt)
    sampler:set_epoch(2)
    sampler:record_batch(2)
    state.step = 5
    state:commit()
    local w = model.weight:clone()
    local buf = opt:state_dict().state[0].momentum_buffer:clone()
    -- go on without committing
    train_step(model, opt)
    sampler:record_batch(2)
    state.epoch, state.step = 3, 9
    assert.is_false(same(w, model.weight))
    state:restore()
    assert.is_true(same(w, model.weight))
    assert.is_true(same(buf, opt:state_dict().state[0].momentum_buffer))
    assert.same({ epoch = 2, processed = 4 }, sampler:state_dict())
    assert.equal(2, state.epoch)
    assert.equal(5, state.step)
    assert.equal(1, state.serial)
  end)

  it("refuses restore before any commit, sync before init_process_group, unknown options", function()
    local state = elastic.State {}
    assert.has_error(function() state:restore() end, "elastic.State:restore: nothing was committed in this process")
    assert.has_error(function() state:sync() end, "elastic.State:sync: call dist.init_process_group first")
    assert.has_error(function() elastic.State { modle = 1 } end)
  end)

  it("syncs the newest commit on two ranks: from a rank's memory, then from rank 0's file #dist", function()
    local dir = files.tmpdir("elastic-state")
    finally(function() files.remove(dir) end)
    local script = files.write(dir, "sync.lua", [[
local dl = require "ddplua"
local nn, optim = require "ddplua.nn", require "ddplua.optim"
local dist = require "ddplua.distributed"
local DistributedSampler = require "ddplua.distributed.sampler"
local elastic = require "ddplua.distributed.elastic"
local path = ...
dist.init_process_group { backend = "gloo", timeout = 20 }
local rank = dist.get_rank()
local function setup()
  dl.manual_seed(10 + rank) -- different on each rank: sync makes them equal
  local model = nn.Linear(3, 2)
  local opt = optim.SGD(model:parameters(), { lr = 0.1, momentum = 0.9 })
  local sampler = DistributedSampler(24, { seed = 1 })
  return model, opt, sampler
end
local function step(model, opt)
  opt:zero_grad(); model(dl.ones { 4, 3 }):sum():backward(); opt:step()
end
local function show(tag, state, model, opt, sampler)
  local w = model.weight:sum():item()
  local m = opt:state_dict().state[0].momentum_buffer:sum():item()
  print(("%s serial=%d epoch=%d step=%d pos=%d/%d weight=%.6f momentum=%.6f"):format(tag, state.serial, state.epoch,
    state.step, sampler.epoch, sampler.processed, w, m))
end
-- 1. rank 1 commits twice (serial 2), rank 0 once (serial 1): rank 1's state wins
local model, opt, sampler = setup()
local state = elastic.State { model = model, optimizer = opt, sampler = sampler }
step(model, opt)
state.epoch, state.step = rank, 3
sampler:set_epoch(rank); sampler:record_batch(2)
state:commit()
if rank == 1 then step(model, opt); state.step = 4; sampler:record_batch(2); state:commit() end
if rank == 1 then show("before", state, model, opt, sampler) end
step(model, opt) -- uncommitted: rolled back by sync
state:sync()
show("memory", state, model, opt, sampler)
-- 2. rank 0 commits to the file (serial 3); fresh states everywhere (a restart) load it
state.step = 6
state.path = path
state:commit()
if rank == 0 then show("file", state, model, opt, sampler) end
local model2, opt2, sampler2 = setup()
local state2 = elastic.State { model = model2, optimizer = opt2, sampler = sampler2, path = path }
state2:sync()
show("restart", state2, model2, opt2, sampler2)
dist.destroy_process_group()
]])
    local status, out = files.run(("%s --nproc_per_node=2 %s %s"):format(q(exe), q(script), q(dir .. "/c.safetensors")))
    assert.equal(0, status, out)
    local function line(tag, r)
      return assert(out:match("%[rank " .. r .. "%]: " .. tag .. " ([^\n]*)"), tag .. " " .. r .. "\n" .. out)
    end
    local before = line("before", 1)
    -- rank 1's commit (serial 2, epoch 1, step 4, position 2 x 2 x 2 = 8) on both ranks
    assert.matches("^serial=2 epoch=1 step=4 pos=1/8 ", before)
    assert.equal(before, line("memory", 0))
    assert.equal(before, line("memory", 1))
    -- after a "restart", the file's commit (serial 3, step 6) on both ranks
    local file = line("file", 0):gsub("^serial=3 epoch=1 step=6 ", "")
    assert.matches("^pos=1/8 ", file)
    for r = 0, 1 do assert.equal("serial=3 epoch=1 step=6 " .. file, line("restart", r)) end
  end)
end)
