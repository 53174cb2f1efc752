-- A path (or a name) with an embedded NUL byte is refused before it reaches C (issue 23,
-- item 2): C strings end at the first NUL, so checkpoint.save("dir/a\0b", ...) used to
-- write "dir/a" and report success. Every front-end function handing a caller's string to
-- C checks it with lib.c_string / lib.path, which names the function and the argument.
local dl = require "ddplua"
local checkpoint = require "ddplua.checkpoint"
local data = require "ddplua.data"
local store = require "ddplua.distributed.store"
local os_ = require "ddplua.os"
local MetricsFile = require "ddplua.utils.metrics_file"
local evo = require "ddplua.utils.evolution"
local train_config = require "ddplua.utils.train_config"
local files = require "files"

-- fn() must raise naming `prefix` (function and argument) and the NUL byte.
local function refuses(prefix, fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, prefix .. " accepted a string with a NUL byte")
  assert.matches(prefix .. " contains a NUL byte at byte", tostring(err), 1, true)
  assert.matches("path_nul_spec.lua", tostring(err), 1, true) -- raised at the caller's line
end

describe("strings with a NUL byte", function()
  local dir
  before_each(function() dir = files.tmpdir("pathnul") end)
  after_each(function() files.remove(dir) end)

  it("checkpoint.save, load and sweep_temp_files refuse the path and write nothing", function()
    local t = { w = dl.ones { 2 } }
    refuses("checkpoint.save: path", function() checkpoint.save(dir .. "/a\0b", t) end)
    assert.is_nil(files.read_if_exists(dir .. "/a"), "a truncated path was written")
    refuses("checkpoint.load: path", function() checkpoint.load(dir .. "/a\0b") end)
    refuses("checkpoint.sweep_temp_files: path", function() checkpoint.sweep_temp_files(dir .. "/a\0b") end)
    refuses("checkpoint.save: a tensor name", function() checkpoint.save(dir .. "/c", { ["w\0x"] = t.w }) end)
    refuses("checkpoint.save: a metadata key", function() checkpoint.save(dir .. "/c", t, { ["k\0"] = "v" }) end)
    refuses("checkpoint.save: metadata 'k'", function() checkpoint.save(dir .. "/c", t, { k = "v\0w" }) end)
    assert.is_nil(files.read_if_exists(dir .. "/c"))
    -- the message shows what C would have seen
    local ok, err = pcall(checkpoint.save, dir .. "/a\0b", t)
    assert.is_false(ok)
    assert.matches('C would see only "' .. dir .. '/a"', err, 1, true)
  end)

  it("the dataset readers refuse the path and the root", function()
    refuses("read_idx: path", function() data.read_idx(dir .. "/x\0.idx") end)
    refuses("read_cifar: paths[2]", function() data.read_cifar { dir .. "/a.bin", dir .. "/b\0.bin" } end)
    refuses("MNIST: root", function() data.MNIST { root = dir .. "\0/x" } end)
    refuses("CIFAR10: root", function() data.CIFAR10 { root = dir .. "\0/x" } end)
  end)

  it("file stores, folders, metrics, populations and configs refuse the path", function()
    refuses("FileStore: path", function() store.FileStore(dir .. "/s\0", { timeout = 1 }) end)
    local s = store.FileStore(dir .. "/store", { timeout = 1 })
    refuses("store:set: key", function() s:set("a\0b", "v") end)
    refuses("store:wait: key", function() s:wait({ "k", "a\0b" }, 0) end)
    s:set("a", "v") -- "a\0b" must not have become "a"
    assert.equal("v", s:get("a"))
    refuses("mkdir_p: path", function() os_.mkdir_p(dir .. "/d\0e") end)
    assert.is_nil(files.read_if_exists(dir .. "/d"))
    refuses("MetricsFile.open: path", function() MetricsFile.open(dir .. "/m\0.csv", { { "epoch", "%d" } }) end)
    local space = { { name = "lr", kind = "log", min = 1e-4, max = 1e-2 } }
    refuses("evolution.save: path", function() evo.save(dir .. "/p\0", {}, space) end)
    refuses("evolution.load: path", function() evo.load(dir .. "/p\0", space) end)
    refuses("train_config.load: path", function() train_config.load(dir .. "/c\0.lua") end)
  end)

  it("still accepts ordinary paths", function()
    checkpoint.save(dir .. "/ok.safetensors", { w = dl.ones { 2 } })
    local back = checkpoint.load(dir .. "/ok.safetensors")
    assert.same({ 1, 1 }, back.w:tolist())
  end)
end)
