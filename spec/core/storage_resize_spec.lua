-- Specs for ddp_tensor_storage_resize_ and ddp_tensor_version_restore (runtime/core/tensor.c,
-- Note [storage resize]): the storage of a tensor freed and re-allocated in place, as FSDP
-- frees an unsharded parameter after forward and gathers it again before backward.
local dl = require "ddplua"
local lib = require "ddplua.lib"
local C = lib.C
local cuda = require "cuda"

local function resize(t, nbytes) return C.ddp_tensor_storage_resize_(t, nbytes) end
local function last_error() return lib.ffi.string(C.ddp_last_error()) end

describe("storage resize_ (Note [storage resize])", function()
  it("frees the data of a tensor and its views in place; using either is an error, not a crash", function()
    for _, n in ipairs { 3, 400 } do -- an inline (small) and an allocated storage
      local t = dl.ones({ n })
      local v = t:narrow(1, 2, 2)
      assert.equal(0, resize(t, 0))
      assert.equal(0, tonumber(C.ddp_tensor_storage_bytes(t)))
      local ok, err = pcall(function() return t + 1 end)
      assert.is_false(ok)
      assert.truthy(tostring(err):find(("add: argument 'self' of shape (%d,) has no data"):format(n), 1, true))
      ok, err = pcall(function() return v:sum() end)
      assert.is_false(ok)
      assert.truthy(tostring(err):find("sum: argument 'self' of shape (2,) has no data", 1, true))
      -- re-allocated: usable again, the new bytes zero
      assert.equal(0, resize(t, 4 * n))
      assert.equal(0, t:sum():item())
      t:fill_(2)
      assert.equal(4, v:sum():item())
    end
  end)

  it("keeps the first bytes when shrinking or growing, and leaves the version counter alone", function()
    local t = dl.tensor { 1, 2, 3, 4 }
    local v0 = t._version
    assert.equal(0, resize(t, 8))
    assert.equal(0, resize(t, 16))
    assert.same({ 1, 2, 0, 0 }, t:tolist())
    assert.equal(v0, t._version)
  end)

  it("lets autograd's saved tensors see the re-allocated data; a backward through a freed one names it", function()
    local x = dl.tensor({ 1, 2, 3 }, { requires_grad = true })
    local w = dl.tensor({ 4, 5, 6 }, { requires_grad = true })
    local y = (x * w):sum() -- saves w for x's gradient
    local version = w._version
    assert.equal(0, resize(w, 0))
    local ok, err = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("saved for the gradient has no data", 1, true), tostring(err))
    -- refilled with other values and its version restored: backward reads the new values
    local x2 = dl.tensor({ 1, 2, 3 }, { requires_grad = true })
    local w2 = dl.tensor({ 4, 5, 6 }, { requires_grad = true })
    local y2 = (x2 * w2):sum()
    assert.equal(0, resize(w2, 0))
    assert.equal(0, resize(w2, 12))
    w2:detach():copy_(dl.tensor { 7, 8, 9 })
    C.ddp_tensor_version_restore(w2, version)
    y2:backward()
    assert.same({ 7, 8, 9 }, x2.grad:tolist())
  end)

  it("frees and re-allocates device storage in place (the simulated CUDA device)", function()
    local status, out = cuda.run_sim([[
local C = require("ddplua.lib").C
local t = dl.ones({300}):cuda()
local v = t:narrow(1, 1, 2)
io.write(C.ddp_tensor_storage_resize_(t, 0), " ")
io.write(tostring(pcall(function() return v:sum() end)), " ")
io.write(C.ddp_tensor_storage_resize_(t, 4 * 300), " ")
t:fill_(2)
io.write(v:sum():item(), "\n")
]])
    assert.equal(0, status, out)
    assert.equal("0 false 0 4\n", out)
  end)

  it("refuses a negative size and a freed tensor", function()
    local t = dl.ones({ 2 })
    assert.is_true(resize(t, -1) ~= 0)
    assert.truthy(last_error():find("nbytes must be >= 0", 1, true))
    t:free()
    assert.is_true(resize(t, 8) ~= 0)
    assert.truthy(last_error():find("freed tensor", 1, true))
  end)
end)
