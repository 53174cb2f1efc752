-- Specs for ddplua.distributed.nn.functional, the differentiable collectives (issue 24 part
-- 3; runtime/comm/functional.c, Note [collectives on the tape] in
-- ddplua/dist_functional.h), on 2 real ranks started by spec/helpers/multiproc.lua, through
-- shared memory (the default on one host) and through Gloo over TCP (DDPLUA_SHM=0).
--
-- Each function is checked by spec/helpers/dist_gradcheck.lua: the loss is a sum over the
-- ranks of <W(rank, j), output j> with fixed weights, the analytic gradient comes from each
-- rank's backward (the adjoint collectives), the numeric one from perturbing every element
-- of every rank's inputs in turn, collectively. Ranks print "OUT name max_err checked
-- grad_norm first-mismatch" lines; the spec asserts on them here.
local mp = require "multiproc"

local root = io.popen("pwd"):read("*l")

local PRELUDE = [[
package.path = "]] .. root .. [[/spec/helpers/?.lua;" .. package.path
local dl = require "ddplua"
local dist = require "ddplua.distributed"
local F = require "ddplua.distributed.nn.functional"
local dgc = require "dist_gradcheck"
RANK, WORLD = tonumber(os.getenv("RANK")), tonumber(os.getenv("WORLD_SIZE"))
dist.init_process_group { backend = "gloo", timeout = 20 }
function input(shape, salt)
  return dl.randn(shape, { dtype = "f64", generator = dl.Generator(100 * (RANK + 1) + (salt or 0)) })
end
function report(name, r)
  io.write(("OUT %s %.3g %d %.6g %s\n"):format(name, r.max_err, r.checked, r.grad_norm, r.first or "-"))
  io.flush()
end
function emit_err(name, fn)
  local ok, err = pcall(fn)
  io.write("ERR ", name, " ", ok and "no error" or tostring(err):gsub("\n", " "), "\n")
  io.flush()
end
]]

-- Every function, gradient-checked on both ranks.
local GRADCHECK = [[
report("all_reduce", dgc.check(function(x) return F.all_reduce(x) end, { input({ 2, 3 }) }))
report("broadcast", dgc.check(function(x) return F.broadcast(x, 1) end, { input({ 3 }) }))
report("reduce", dgc.check(function(x) return F.reduce(x, 0) end, { input({ 2, 2 }) }))
report("all_gather", dgc.check(function(x) return F.all_gather(x) end, { input({ 2, 2 }) }))
report("all_gather_tensor", dgc.check(function(x) return F.all_gather_tensor(x, 2) end,
  { input({ 2, 3 }) }))
report("reduce_scatter_tensor", dgc.check(function(x) return F.reduce_scatter_tensor(x, 2) end,
  { input({ 3, 4 }) }))
report("reduce_scatter_tensor_dim1", dgc.check(function(x) return F.reduce_scatter_tensor(x, 1) end,
  { input({ 4, 2 }) }))
report("reduce_scatter", dgc.check(function(a, b)
  return F.reduce_scatter(dl.zeros({ 3 }, { dtype = "f64" }), { a, b })
end, { input({ 3 }, 1), input({ 3 }, 2) }))
report("gather", dgc.check(function(x) return F.gather(x, 1) end, { input({ 2 }) }))
report("scatter", dgc.check(function(a, b) return F.scatter({ a, b }, 0) end,
  { input({ 2 }, 1), input({ 2 }, 2) }))
-- all_to_all with entries of different sizes: rank r sends count(r, j) values to rank j
local function count(r, j) return 1 + r + 2 * j end
local function shapes(r)
  local s = {}
  for j = 0, WORLD - 1 do s[j + 1] = { count(r, j) } end
  return s
end
local ins = {}
for j = 0, WORLD - 1 do ins[j + 1] = input({ count(RANK, j) }, j) end
report("all_to_all", dgc.check(function(...)
  local outs = {}
  for i = 0, WORLD - 1 do outs[i + 1] = dl.zeros({ count(i, RANK) }, { dtype = "f64" }) end
  return F.all_to_all(outs, { ... })
end, ins, { shapes = shapes }))
-- all_to_all_single with uneven row splits (rows of 2 values)
local function rows_in(r) local n = 0 for j = 0, WORLD - 1 do n = n + count(r, j) end return n end
local in_split, out_split, rows_out = {}, {}, 0
for j = 0, WORLD - 1 do
  in_split[j + 1] = count(RANK, j)
  out_split[j + 1] = count(j, RANK)
  rows_out = rows_out + count(j, RANK)
end
report("all_to_all_single", dgc.check(function(x)
  return F.all_to_all_single(dl.zeros({ rows_out, 2 }, { dtype = "f64" }), x, out_split, in_split)
end, { input({ rows_in(RANK), 2 }) }, { shapes = function(r) return { { rows_in(r), 2 } } end }))
]]

-- Values, errors and a rank whose output gets no gradient.
local BEHAVIOUR = [[
-- the forward values: all_gather_tensor along dim 2 puts rank r's columns at 2r+1 .. 2r+2
local x = dl.tensor({ { RANK + 1, 10 * (RANK + 1) } }, { dtype = "f64" })
local y = F.all_gather_tensor(x, 2)
io.write("OUT values ", table.concat(y:view({ -1 }):tolist(), ","), "\n")
-- the adjoint runs even when no gradient reaches the output on one rank (a Function whose
-- backward returns nil on rank 0): both ranks still meet in the all_reduce
local Function = require "ddplua.autograd.function"
local Drop = Function:extend("DropOnRank0")
function Drop.forward(ctx, t) return t * 1 end
function Drop.backward(ctx, g) if RANK == 0 then return nil end return g end
local a = dl.tensor({ 1, 2 }, { dtype = "f64", requires_grad = true })
local z = Drop.apply(F.all_reduce(a))
z:sum():backward()
io.write("OUT nograd ", table.concat(a.grad and a.grad:tolist() or { -1 }, ","), "\n")
io.flush()
-- errors
emit_err("max_backward", function()
  local t = dl.ones({ 2 }, { dtype = "f64", requires_grad = true })
  F.all_reduce(t, "max"):sum():backward()
end)
emit_err("rs_backward", function()
  local t = dl.ones({ 2 }, { dtype = "f64", requires_grad = true })
  F.reduce_scatter_tensor(t, 1, dist.ReduceOp.MIN):sum():backward()
end)
emit_err("rs_divisible", function() F.reduce_scatter_tensor(dl.ones({ 3, 2 }), 1) end)
emit_err("rs_list_shape", function()
  F.reduce_scatter(dl.zeros({ 2 }), { dl.ones({ 2 }), dl.ones({ 3 }) })
end)
emit_err("rs_list_len", function() F.reduce_scatter(dl.zeros({ 2 }), { dl.ones({ 2 }) }) end)
emit_err("a2a_dtype", function()
  F.all_to_all({ dl.zeros({ 1 }), dl.zeros({ 1 }) }, { dl.ones({ 1 }), dl.ones({ 1 }, { dtype = "f64" }) })
end)
emit_err("gather_dim", function() F.all_gather_tensor(dl.ones({ 2 }), 3) end)
emit_err("bad_op", function() F.all_reduce(dl.ones({ 2 }), "mean") end)
-- the group still works after the local errors, and integers pass without a node
local i = F.all_reduce(dl.tensor({ RANK + 1 }, { dtype = "i64" }))
io.write("OUT int ", i:item(), "\n")
dist.barrier()
]]

-- Device tensors: each rank's gradients against closed forms (loss on rank r weighs its
-- outputs by r + 1, so the sums over the ranks are 1 + 2 = 3), on the simulated device
-- through gloo's host staging and through the simulated NCCL table.
local DEVICE = [[
local lib = require "ddplua.lib"
local box = lib.ffi.new("ddp_tensor*[1]")
local function dev(t, d) lib.check(lib.C.ddp_tensor_to_device(box, t, d, 0)); return lib.wrap(box[0]) end
local function leaf(shape) return dev(dl.ones(shape), RANK):requires_grad_() end
local function grad(x) return table.concat(dev(x.grad, -1):view({ -1 }):tolist(), ",") end
local w = RANK + 1
local a = leaf({ 2 })
local la = (F.all_reduce(a) * w):sum()
la:backward()
io.write("OUT dev_all_reduce ", grad(a), "\n")
local b = leaf({ 2, 2 })
local lb = (F.all_gather_tensor(b, 2) * w):sum()
lb:backward()
io.write("OUT dev_all_gather_tensor ", grad(b), "\n")
local c = leaf({ 4 })
local rs = F.reduce_scatter_tensor(c, 1)
local lc = (rs * dev(dl.tensor({ 1, 2 }), RANK)):sum()
lc:backward()
io.write("OUT dev_reduce_scatter_tensor ", grad(c), "\n")
local d = leaf({ 2 })
local ld = (F.all_to_all_single(dev(dl.zeros({ 2 }), RANK), d) * w):sum()
ld:backward()
io.write("OUT dev_all_to_all_single ", grad(d), "\n")
local e = leaf({ 2 })
local le = (F.broadcast(e, 1) * w):sum()
le:backward()
io.write("OUT dev_broadcast ", grad(e), "\n")
io.flush()
dist.barrier()
]]

local function run(code, env)
  local r = mp.run { code = PRELUDE .. code, nprocs = 2, timeout = 60, env = env }
  assert(r.ok, "ranks failed:\n" .. mp.describe(r))
  local ranks = {}
  for i = 1, 2 do
    local out, err = {}, {}
    for line in (r[i].output .. "\n"):gmatch("([^\n]*)\n") do
      local name, rest = line:match("^OUT (%S+) (.*)$")
      if name then out[name] = rest end
      local ename, msg = line:match("^ERR (%S+) (.*)$")
      if ename then err[ename] = msg end
    end
    ranks[i] = { out = out, err = err }
  end
  return ranks
end

local CHECKED = { "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_tensor",
  "reduce_scatter_tensor", "reduce_scatter_tensor_dim1", "reduce_scatter", "gather", "scatter",
  "all_to_all", "all_to_all_single" }

local function assert_gradchecks(ranks)
  for _, name in ipairs(CHECKED) do
    for i = 1, 2 do
      local line = ranks[i].out[name]
      assert.is_not_nil(line, ("rank %d printed no result for %s"):format(i - 1, name))
      local max_err, checked, norm, first = line:match("^(%S+) (%d+) (%S+) (.*)$")
      assert.are.equal("-", first, name .. ": " .. first)
      assert.is_true(tonumber(max_err) < 1e-6, name .. ": max_err " .. max_err)
      assert.is_true(tonumber(checked) > 0, name .. ": no element checked")
      -- gradients are not all zero, but on the rank that is not the source of a broadcast
      -- (rank 1) or a scatter (rank 0), whose input is never read (PyTorch's zeros)
      if not ((name == "broadcast" and i == 1) or (name == "scatter" and i == 2)) then
        assert.is_true(tonumber(norm) > 0, name .. ": only zero gradients on rank " .. (i - 1))
      end
    end
  end
end

describe("ddplua.distributed.nn.functional #dist", function()
  it("passes a 2-rank f64 gradcheck of every collective through shared memory", function()
    assert_gradchecks(run(GRADCHECK))
  end)

  it("passes a 2-rank f64 gradcheck of every collective through Gloo over TCP", function()
    assert_gradchecks(run(GRADCHECK, { DDPLUA_SHM = "0" }))
  end)

  it("fails on both ranks when they disagree, forward or backward, naming both call sites", function()
    local r = mp.run { code = PRELUDE .. [[
dist.set_timeout(10)
local x = dl.ones({ 2 }, { dtype = "f64", requires_grad = true })
emit_err("shape", function() F.all_gather(RANK == 0 and x or dl.ones({ 3 }, { dtype = "f64" })) end)
]], nprocs = 2, timeout = 30, kill_on_failure = false }
    for i = 1, 2 do
      local line = r[i].output:match("ERR shape ([^\n]*)")
      assert.is_not_nil(line, r[i].output)
      assert.matches("collective mismatch", line, 1, true)
      assert.matches("shape (1, 2)", line, 1, true)
      assert.matches("shape (1, 3)", line, 1, true)
    end
    -- rank 1 skips the backward of its all_reduce: its next collective meets rank 0's
    -- backward all-reduce, whose call site is named after the forward's line
    r = mp.run { code = PRELUDE .. [[
dist.set_timeout(10)
local x = dl.ones({ 2 }, { dtype = "f64", requires_grad = true })
local y = F.all_reduce(x)
emit_err("backward", function()
  if RANK == 0 then y:sum():backward() else dist.broadcast(dl.ones({ 2 }, { dtype = "f64" }), 0) end
end)
]], nprocs = 2, timeout = 30, kill_on_failure = false }
    for i = 1, 2 do
      local line = r[i].output:match("ERR backward ([^\n]*)")
      assert.is_not_nil(line, r[i].output)
      assert.matches("collective mismatch", line, 1, true)
      assert.matches("at backward of [^ ]*script.lua:%d+", line)
    end
  end)

  local SIM = root .. "/build/libddplua_cuda_sim.so"
  for _, case in ipairs {
    { "gloo staging", { DDPLUA_CUDA_PLUGIN = SIM } },
    { "simulated NCCL", { DDPLUA_CUDA_PLUGIN = SIM, DDPLUA_SIM_NCCL = "1" }, "nccl" },
  } do
    it("differentiates device tensors (simulated device, " .. case[1] .. ")", function()
      local code = DEVICE
      if case[3] then
        -- the prelude's gloo group is the default; start an nccl one instead
        code = "dist.destroy_process_group()\ndist.init_process_group { backend = 'nccl', timeout = 20 }\n" .. code
      end
      local ranks = run(code, case[2])
      for i = 1, 2 do
        local out = ranks[i].out
        assert.are.equal("3,3", out.dev_all_reduce)
        assert.are.equal("3,3,3,3", out.dev_all_gather_tensor)
        assert.are.equal("1,2,1,2", out.dev_reduce_scatter_tensor) -- chunk j weighs [1, 2] on rank j
        assert.are.equal("1,2", out.dev_all_to_all_single)
        assert.are.equal(i == 2 and "3,3" or "0,0", out.dev_broadcast)
      end
    end)
  end

  it("gathers the right values, runs adjoints without a gradient, and names errors as PyTorch", function()
    local ranks = run(BEHAVIOUR)
    for i = 1, 2 do
      local out, err = ranks[i].out, ranks[i].err
      assert.are.equal("1,10,2,20", out.values)
      -- rank 0's output got no gradient, rank 1's did: both got the sum of what arrived
      assert.are.equal("1,1", out.nograd)
      assert.are.equal("3", out.int)
      assert.matches("all_reduce backward only supports 'sum' reduction, got 'max'", err.max_backward, 1, true)
      assert.matches("reduce_scatter_tensor backward only supports 'sum' reduction, got 'min'",
        err.rs_backward, 1, true)
      assert.matches("reduce_scatter_tensor: input dimension 1 (size 3) must be a multiple of the group size 2",
        err.rs_divisible, 1, true)
      assert.matches("reduce_scatter: input_list entry 2 has shape (3) but output has shape (2)",
        err.rs_list_shape, 1, true)
      assert.matches("reduce_scatter: input_list has 1 tensors but the group has 2 ranks", err.rs_list_len, 1, true)
      assert.matches("all_to_all: input_tensor_list entry 2 has dtype f64 but entry 1 has f32", err.a2a_dtype, 1, true)
      assert.matches("all_gather_tensor: gather_dim", err.gather_dim, 1, true)
      assert.matches("out of range", err.gather_dim, 1, true)
      assert.matches("all_reduce: unknown op 'mean'", err.bad_op, 1, true)
    end
  end)
end)
