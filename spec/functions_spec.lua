-- Specs for ddplua.functions, the functions of the umbrella (dl.zeros, dl.cat, dl.no_grad,
-- the functional forms of the ops ...), which library modules call instead of requiring the
-- umbrella (Note [lua layers] in tools/check_layers.lua): `require "ddplua"` re-exports each
-- one as the same function value and still loads the packages on first use; likewise
-- ddplua.distributed re-exports ddplua.distributed.distributed_c10d, where the modules of
-- the distributed package take their collectives from.
describe("ddplua.functions", function()
  it("is what the umbrella re-exports, the same function values", function()
    local dl, functions = require "ddplua", require "ddplua.functions"
    local n = 0
    for k, v in pairs(functions) do
      assert.are.equal(v, dl[k], "dl." .. k)
      n = n + 1
    end
    assert.is_true(n > 100, "only " .. n .. " functions")
    for _, k in ipairs { "zeros", "tensor", "cat", "stack", "no_grad", "add", "matmul", "Generator",
        "manual_seed", "memory_stats" } do
      assert.are.equal("function", type(functions[k]), k)
    end
    assert.are.same({ 1, 1, 0 }, dl.cat({ dl.ones { 2 }, functions.zeros { 1 } }, 1):tolist())
  end)

  it("leaves the packages to the umbrella, loaded on first use", function()
    local dl, functions = require "ddplua", require "ddplua.functions"
    for _, k in ipairs { "nn", "optim", "data", "distributed", "amp", "autograd" } do
      assert.is_nil(rawget(functions, k), k)
      assert.are.equal(require("ddplua." .. k), dl[k], "dl." .. k)
    end
    assert.are.equal(require("ddplua.amp").autocast, dl.autocast)
    assert.are.equal(require "ddplua.distributed.spawn", dl.spawn)
  end)

  it("has a twin in the distributed package: distributed_c10d, re-exported by ddplua.distributed", function()
    local dist, c10d = require "ddplua.distributed", require "ddplua.distributed.distributed_c10d"
    for k, v in pairs(c10d) do assert.are.equal(v, dist[k], "dist." .. k) end
    for _, k in ipairs { "init_process_group", "all_reduce", "broadcast", "barrier", "new_group" } do
      assert.are.equal("function", type(c10d[k]), k)
    end
    -- what the package adds on first use stays out of distributed_c10d
    assert.are.equal(require "ddplua.distributed.ddp", dist.DistributedDataParallel)
    assert.are.equal(require("ddplua.distributed.objects").all_gather_object, dist.all_gather_object)
    assert.is_nil(rawget(c10d, "DistributedDataParallel"))
  end)
end)
