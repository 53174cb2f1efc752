-- Specs for the collectives for sharding (issue 24 part 2; ddplua/pg.h "collectives for
-- sharding", Note [sharding collectives] in runtime/comm/pg_internal.h):
-- reduce_scatter_tensor, all_gather_into_tensor, all_to_all_single with uneven splits, their
-- coalesced forms and new_subgroups, on real ranks started by spec/helpers/multiproc.lua on
-- 127.0.0.1, through shared memory (the default on one host: Note [shm reduce-scatter] in
-- pg_shm.c), through Gloo over TCP (DDPLUA_SHM=0: Note [gloo ring reduce-scatter] in
-- gloo_shim.h) and through the simulated NCCL table (backend/sim/plugin.c).
--
-- Each rank computes the single-process reference itself: it rebuilds every rank's input
-- from the rule val(rank, i) and reduces / gathers / exchanges them with plain Lua loops,
-- then prints the largest difference between the collective's result and that reference
-- ("OUT name diff"), and a few values the spec recomputes here from the same rule.
local mp = require "multiproc"

local root = io.popen("pwd"):read("*l")
local SIM = root .. "/build/libddplua_cuda_sim.so"

-- Small positive integers: sums and products of up to 3 ranks are exact in f32 and f64.
local function val(r, i) return ((r + 1) * 5 + i * 3) % 7 + 1 end

local PRELUDE = [[
local dl = require "ddplua"
local dist = require "ddplua.distributed"
RANK, WORLD = tonumber(os.getenv("RANK")), tonumber(os.getenv("WORLD_SIZE"))
function val(r, i) return ((r + 1) * 5 + i * 3) % 7 + 1 end
function emit(name, v)
  if type(v) ~= "table" then v = { v } end
  local s = {}
  for i = 1, #v do s[i] = string.format("%.17g", v[i]) end
  io.write("OUT ", name, " ", table.concat(s, ","), "\n")
  io.flush()
end
function emit_err(name, fn)
  local ok, err = pcall(fn)
  io.write("ERR ", name, " ", ok and "no error" or tostring(err):gsub("\n", " "), "\n")
  io.flush()
end
-- rank r's input: count values from position off
function vals(r, count, off)
  local v = {}
  for i = 0, count - 1 do v[i + 1] = val(r, i + (off or 0)) end
  return v
end
function tensor_of(v, shape, dtype) return dl.tensor(v, { dtype = dtype }):view(shape) end
function flat(t)
  local v = t:contiguous():view({ -1 }):tolist()
  return v
end
-- op over the ranks, in rank order, of elements [lo, lo + count) of every rank's vals
function reduce_ref(op, count, lo)
  local out = {}
  for i = 1, count do
    local acc = val(0, lo + i - 1)
    for r = 1, WORLD - 1 do
      local x = val(r, lo + i - 1)
      if op == "sum" or op == "avg" then acc = acc + x
      elseif op == "product" then acc = acc * x
      elseif op == "min" then acc = math.min(acc, x)
      else acc = math.max(acc, x) end
    end
    out[i] = op == "avg" and acc / WORLD or acc
  end
  return out
end
-- the largest relative difference between the lists got and want (1e300: lengths differ)
function diff(got, want)
  if #got ~= #want then return 1e300 end
  local d = 0
  for i = 1, #want do d = math.max(d, math.abs(got[i] - want[i]) / (1 + math.abs(want[i]))) end
  return d
end
]]

local function run(code, n, opts)
  opts = opts or {}
  local r = mp.run { code = PRELUDE .. code, nprocs = n, timeout = opts.timeout or 60, env = opts.env }
  if not opts.expect_failure then assert(r.ok, "ranks failed:\n" .. mp.describe(r)) end
  local ranks = {}
  for i = 1, n do
    local out, err = {}, {}
    for line in (r[i].output .. "\n"):gmatch("([^\n]*)\n") do
      local name, vs = line:match("^OUT (%S+) (.*)$")
      if name then
        local list = {}
        for x in vs:gmatch("[^,]+") do list[#list + 1] = tonumber(x) end
        out[name] = list
      end
      local ename, msg = line:match("^ERR (%S+) (.*)$")
      if ename then err[ename] = msg end
    end
    ranks[i] = { out = out, err = err, output = r[i].output }
  end
  return ranks, r
end

-- The checks every path runs: every op and dtype of reduce_scatter_tensor at sizes that take
-- the small-message, staged (several chunks, a partial last one) and zero-copy paths of
-- shared memory, both input layouts; all_gather_into_tensor both layouts; all_to_all_single
-- with uneven splits (some empty); the coalesced forms; asynchronous calls; new_subgroups.
local MAIN = [[
dist.init_process_group { backend = "gloo", timeout = 30 }
local n, me = WORLD, RANK
for _, dtype in ipairs { "f32", "f64" } do
  for _, op in ipairs { "sum", "avg", "min", "max", "product" } do
    for _, k in ipairs { 3, 40000 } do
      local input = tensor_of(vals(me, n * k), { n * k }, dtype)
      local output = dl.zeros({ k }, { dtype = dtype })
      dist.reduce_scatter_tensor(output, input, { op = op })
      local name = ("rs_%s_%s_%d"):format(dtype, op, k)
      emit(name, diff(flat(output), reduce_ref(op, k, me * k)))
      emit(name .. "_input", diff(flat(input), vals(me, n * k)))   -- not modified
      emit(name .. "_first", flat(output)[1])
    end
  end
  -- stacked input (world, k, 2)
  local input = tensor_of(vals(me, n * 10), { n, 5, 2 }, dtype)
  local output = dl.zeros({ 5, 2 }, { dtype = dtype })
  dist.reduce_scatter_tensor(output, input, { op = "sum" })
  emit("rs_stacked_" .. dtype, diff(flat(output), reduce_ref("sum", 10, me * 10)))
  -- all_gather_into_tensor: concatenated and stacked outputs, small and slot-sized
  for _, k in ipairs { 3, 40000 } do
    local mine = tensor_of(vals(me, k), { k }, dtype)
    local cat = dl.zeros({ n * k }, { dtype = dtype })
    dist.all_gather_into_tensor(cat, mine)
    local want = {}
    for r = 0, n - 1 do for _, x in ipairs(vals(r, k)) do want[#want + 1] = x end end
    emit(("ag_cat_%s_%d"):format(dtype, k), diff(flat(cat), want))
    local stacked = dl.zeros({ n, k }, { dtype = dtype })
    dist.all_gather_into_tensor(stacked, mine)
    emit(("ag_stack_%s_%d"):format(dtype, k), diff(flat(stacked), want))
  end
end

-- the other dtypes: f16/bf16 reduced in f32, integers through the Gloo ring
for _, dtype in ipairs { "f16", "bf16", "i64", "i32" } do
  local output = dl.zeros({ 5 }, { dtype = dtype })
  dist.reduce_scatter_tensor(output, tensor_of(vals(me, n * 5), { n * 5 }, dtype), { op = "sum" })
  emit("rs_other_" .. dtype, diff(flat(output), reduce_ref("sum", 5, me * 5)))
end

-- more staged chunks than the segment's ring of buffers (Note [shm reduce-scatter])
for _, case in ipairs { { "f32", "sum", 300000 }, { "f64", "max", 150000 } } do
  local dtype, op, k = case[1], case[2], case[3]
  local output = dl.zeros({ k }, { dtype = dtype })
  dist.reduce_scatter_tensor(output, tensor_of(vals(me, n * k), { n * k }, dtype), { op = op })
  emit("rs_many_" .. dtype, diff(flat(output), reduce_ref(op, k, me * k)))
end
do -- and an all-gather of more pieces than that ring (Note [shm all-gather])
  local k = 300000
  local gathered = dl.zeros({ n * k })
  dist.all_gather_into_tensor(gathered, tensor_of(vals(me, k), { k }, "f32"))
  local want = {}
  for r = 0, n - 1 do for _, x in ipairs(vals(r, k)) do want[#want + 1] = x end end
  emit("ag_many", diff(flat(gathered), want))
end

-- zero copy: the input in the segment's arena on every rank, then on rank 0 only
for _, who in ipairs { "every", "rank0" } do
  local k = 30000
  local input = (who == "every" or me == 0) and dist.shared_buffer(n * k) or dl.zeros({ n * k })
  input:copy_(tensor_of(vals(me, n * k), { n * k }, "f32"))
  local output = dl.zeros({ k })
  dist.reduce_scatter_tensor(output, input, { op = "sum" })
  emit("rs_shared_" .. who, diff(flat(output), reduce_ref("sum", k, me * k)))
end

-- all_to_all_single: rank r sends split(r, j) rows of 2 to rank j; some splits are 0
local function split(r, j) return (r + 2 * j) % 3 end
local ins, outs, rows_in, rows_out = {}, {}, 0, 0
for j = 0, n - 1 do ins[j + 1] = split(me, j); rows_in = rows_in + ins[j + 1] end
for i = 0, n - 1 do outs[i + 1] = split(i, me); rows_out = rows_out + outs[i + 1] end
-- row t of rank r's input: 100 r + t, 100 r + t + 0.5
local function rows_of(r, first, count)
  local v = {}
  for t = first, first + count - 1 do v[#v + 1] = 100 * r + t; v[#v + 1] = 100 * r + t + 0.5 end
  return v
end
local input = tensor_of(rows_of(me, 0, rows_in), { rows_in, 2 }, "f64")
local output = dl.zeros({ rows_out, 2 }, { dtype = "f64" })
dist.all_to_all_single(output, input, { input_split_sizes = ins, output_split_sizes = outs })
local want = {}
for i = 0, n - 1 do
  local first = 0
  for j = 0, me - 1 do first = first + split(i, j) end
  for _, x in ipairs(rows_of(i, first, split(i, me))) do want[#want + 1] = x end
end
emit("a2a_uneven", diff(flat(output), want))
emit("a2a_rows", rows_out)
-- even splits, default sizes
local even_in = tensor_of(vals(me, n * 4), { n * 2, 2 }, "f32")
local even_out = dl.zeros({ n * 2, 2 })
dist.all_to_all_single(even_out, even_in)
local ew = {}
for i = 0, n - 1 do for _, x in ipairs(vals(i, 4, me * 4)) do ew[#ew + 1] = x end end
emit("a2a_even", diff(flat(even_out), ew))

-- coalesced: (n*3) and (n, 2, 2) inputs, one collective
for _, op in ipairs { "sum", "max" } do
  local a = tensor_of(vals(me, n * 3), { n * 3 }, "f64")
  local b = tensor_of(vals(me, n * 4, 50), { n, 2, 2 }, "f64")
  local oa, ob = dl.zeros({ 3 }, { dtype = "f64" }), dl.zeros({ 2, 2 }, { dtype = "f64" })
  dist.reduce_scatter_tensor_coalesced({ oa, ob }, { a, b }, { op = op })
  emit("rs_coalesced_a_" .. op, diff(flat(oa), reduce_ref(op, 3, me * 3)))
  emit("rs_coalesced_b_" .. op, diff(flat(ob), reduce_ref(op, 4, 50 + me * 4)))
end
do
  local a, b = tensor_of(vals(me, 3), { 3 }, "f32"), tensor_of(vals(me, 4, 9), { 2, 2 }, "f32")
  local ga, gb = dl.zeros({ n * 3 }), dl.zeros({ n, 2, 2 })
  local w = dist.all_gather_into_tensor_coalesced({ ga, gb }, { a, b }, { async_op = true })
  w:wait()
  local wa, wb = {}, {}
  for r = 0, n - 1 do
    for _, x in ipairs(vals(r, 3)) do wa[#wa + 1] = x end
    for _, x in ipairs(vals(r, 4, 9)) do wb[#wb + 1] = x end
  end
  emit("ag_coalesced_a", diff(flat(ga), wa))
  emit("ag_coalesced_b", diff(flat(gb), wb))
end

-- asynchronous reduce_scatter_tensor and all_gather_into_tensor, waited in reverse order
do
  local k = 20000
  local input = tensor_of(vals(me, n * k), { n * k }, "f32")
  local o1, o2 = dl.zeros({ k }), dl.zeros({ n * k })
  local w1 = dist.reduce_scatter_tensor(o1, input, { op = "sum", async_op = true })
  local w2 = dist.all_gather_into_tensor(o2, input:narrow(1, 1, k), { async_op = true })
  w2:wait(); w1:wait()
  emit("rs_async", diff(flat(o1), reduce_ref("sum", k, me * k)))
  local want = {}
  for r = 0, n - 1 do for _, x in ipairs(vals(r, k)) do want[#want + 1] = x end end
  emit("ag_async", diff(flat(o2), want))
end

-- new_subgroups: one rank per subgroup, then the whole world in one
local mine, all = dist.new_subgroups(1)
local t = dl.tensor({ me + 1 })
dist.all_reduce(t, { group = mine })
emit("sub1", { #all, dist.get_rank(mine), dist.get_world_size(mine), t:item() })
local whole, list = dist.new_subgroups(n)
t = dl.tensor({ me + 1 })
dist.all_reduce(t, { group = whole })
emit("subn", { #list, dist.get_rank(whole), t:item() })
emit_err("sub_big", function() dist.new_subgroups(n + 1) end)
emit_err("sub_zero", function() dist.new_subgroups(0) end)
if n == 3 then emit_err("sub_div", function() dist.new_subgroups(2) end) end
dist.destroy_process_group()
]]

local function check_main(ranks, n)
  for rank = 1, n do
    local me, out = rank - 1, ranks[rank].out
    local function zero(name, tol)
      assert(out[name], ("rank %d: no result %s\n%s"):format(me, name, ranks[rank].output))
      assert(out[name][1] <= (tol or 0),
             ("rank %d: %s differs from the reference by %g"):format(me, name, out[name][1]))
    end
    for _, dtype in ipairs { "f32", "f64" } do
      for _, op in ipairs { "sum", "avg", "min", "max", "product" } do
        for _, k in ipairs { 3, 40000 } do
          local name = ("rs_%s_%s_%d"):format(dtype, op, k)
          zero(name, op == "avg" and 1e-6 or 0)
          zero(name .. "_input")
          -- the first element, recomputed here from the same rule
          local acc = val(0, me * k)
          for r = 1, n - 1 do
            local x = val(r, me * k)
            if op == "sum" or op == "avg" then acc = acc + x
            elseif op == "product" then acc = acc * x
            elseif op == "min" then acc = math.min(acc, x)
            else acc = math.max(acc, x) end
          end
          if op == "avg" then acc = acc / n end
          assert.is_true(math.abs(out[name .. "_first"][1] - acc) <= 1e-6 * acc, name)
        end
      end
      zero("rs_stacked_" .. dtype)
      for _, k in ipairs { 3, 40000 } do
        zero(("ag_cat_%s_%d"):format(dtype, k))
        zero(("ag_stack_%s_%d"):format(dtype, k))
      end
    end
    zero("rs_shared_every"); zero("rs_shared_rank0")
    zero("rs_many_f32"); zero("rs_many_f64"); zero("ag_many")
    for _, dtype in ipairs { "f16", "bf16", "i64", "i32" } do zero("rs_other_" .. dtype) end
    zero("a2a_uneven"); zero("a2a_even")
    local rows = 0
    for i = 0, n - 1 do rows = rows + (i + 2 * me) % 3 end
    assert.are.equal(rows, out.a2a_rows[1])
    for _, op in ipairs { "sum", "max" } do
      zero("rs_coalesced_a_" .. op); zero("rs_coalesced_b_" .. op)
    end
    zero("ag_coalesced_a"); zero("ag_coalesced_b")
    zero("rs_async"); zero("ag_async")
    assert.are.same({ n, 0, 1, me + 1 }, out.sub1)
    assert.are.same({ 1, me, n * (n + 1) / 2 }, out.subn)
    local err = ranks[rank].err
    assert.matches(("new_subgroups: The arg 'group_size' (%d) must not exceed the world size (%d)"):format(n + 1, n),
                   err.sub_big, 1, true)
    assert.matches("new_subgroups: The arg 'group_size' (0) must be positive", err.sub_zero, 1, true)
    if n == 3 then
      assert.matches("new_subgroups: The world size (3) must be divisible by 'group_size' (2)", err.sub_div, 1, true)
    end
  end
end

local PATHS = {
  { "shared memory", nil },
  { "Gloo over TCP", { DDPLUA_SHM = "0" } },
}

describe("collectives for sharding #dist", function()
  for _, path in ipairs(PATHS) do
    for _, n in ipairs { 2, 3 } do
      it(("match a single-process reference on %d ranks through %s"):format(n, path[1]), function()
        check_main(run(MAIN, n, { env = path[2] }), n)
      end)
    end
  end

  it("raise clear errors for wrong shapes, dtypes and splits, also with async_op (2 ranks)", function()
    local ranks = run([[
dist.init_process_group { backend = "gloo", timeout = 20 }
local async = { async_op = true }
emit_err("rs_shape", function() dist.reduce_scatter_tensor(dl.zeros({ 3 }), dl.zeros({ 7 })) end)
emit_err("rs_shape_async", function() dist.reduce_scatter_tensor(dl.zeros({ 3, 2 }), dl.zeros({ 6, 3 }), async) end)
emit_err("rs_dtype", function() dist.reduce_scatter_tensor(dl.zeros({ 3 }, { dtype = "f64" }), dl.zeros({ 6 })) end)
emit_err("rs_avg_int", function()
  dist.reduce_scatter_tensor(dl.zeros({ 3 }, { dtype = "i64" }), dl.zeros({ 6 }, { dtype = "i64" }), { op = "avg" })
end)
emit_err("ag_shape", function() dist.all_gather_into_tensor(dl.zeros({ 5, 2 }), dl.zeros({ 2, 2 }), async) end)
emit_err("ag_scalar", function() dist.all_gather_into_tensor(dl.zeros({ 3 }), dl.tensor(1):view({})) end)
emit_err("a2a_sum", function()
  dist.all_to_all_single(dl.zeros({ 4, 2 }), dl.zeros({ 6, 2 }), { input_split_sizes = { 2, 3 }, output_split_sizes = { 2, 2 } })
end)
emit_err("a2a_count", function()
  dist.all_to_all_single(dl.zeros({ 4 }), dl.zeros({ 4 }), { input_split_sizes = { 4 } })
end)
emit_err("a2a_even", function() dist.all_to_all_single(dl.zeros({ 3 }), dl.zeros({ 3 }), async) end)
emit_err("a2a_rows", function() dist.all_to_all_single(dl.zeros({ 4, 3 }), dl.zeros({ 4, 2 })) end)
emit_err("co_pair", function()
  dist.reduce_scatter_tensor_coalesced({ dl.zeros({ 2 }), dl.zeros({ 2 }) }, { dl.zeros({ 4 }), dl.zeros({ 5 }) }, async)
end)
emit_err("co_len", function()
  dist.all_gather_into_tensor_coalesced({ dl.zeros({ 4 }) }, { dl.zeros({ 2 }), dl.zeros({ 2 }) })
end)
emit_err("co_contig", function()
  dist.all_gather_into_tensor_coalesced({ dl.zeros({ 3, 2 }):t() }, { dl.zeros({ 1, 3 }) })
end)
-- the group is still usable after the argument errors
local o = dl.zeros({ 2 })
dist.reduce_scatter_tensor(o, dl.ones({ 4 }))
emit("after", flat(o))
-- the flight recorder names each collective (to stderr)
dist.all_gather_into_tensor(dl.zeros({ 4 }), o)
dist.all_to_all_single(dl.zeros({ 2 }), o)
dist.reduce_scatter_tensor_coalesced({ dl.zeros({ 1 }) }, { o })
dist.all_gather_into_tensor_coalesced({ dl.zeros({ 4 }) }, { o })
dist.dump_flight_recorder()
dist.destroy_process_group()
]], 2)
    for rank = 1, 2 do
      local e = ranks[rank].err
      assert.matches("reduce_scatter_tensor: input must have shape (6,) (world size 2 times output's first dimension) or (2, 3) (world size 2, then output's shape) for output of shape (3,), got (7,)", e.rs_shape, 1, true)
      assert.matches("reduce_scatter_tensor: input must have shape (6, 2) (world size 2 times output's first dimension) or (2, 3, 2) (world size 2, then output's shape) for output of shape (3, 2), got (6, 3)", e.rs_shape_async, 1, true)
      assert.matches("reduce_scatter_tensor: input has dtype f32 but output has f64", e.rs_dtype, 1, true)
      assert.matches("reduce_scatter_tensor: op avg needs a floating dtype, got i64", e.rs_avg_int, 1, true)
      assert.matches("all_gather_into_tensor: output_tensor must have shape (4, 2) (world size 2 times input_tensor's first dimension) or (2, 2, 2) (world size 2, then input_tensor's shape) for input_tensor of shape (2, 2), got (5, 2)", e.ag_shape, 1, true)
      assert.matches("all_gather_into_tensor: output_tensor must have shape (2,) (world size 2) for the 0-dimensional input_tensor, got (3,)", e.ag_scalar, 1, true)
      assert.matches("all_to_all_single: input_split_sizes sum to 5 rows but input has 6 (shape (6, 2))", e.a2a_sum, 1, true)
      assert.matches("all_to_all_single: input_split_sizes has 1 entries but the group has 2 ranks", e.a2a_count, 1, true)
      assert.matches("all_to_all_single: input's first dimension must divide by the world size 2 when input_split_sizes is not given, got shape (3,)", e.a2a_even, 1, true)
      assert.matches("all_to_all_single: input and output must have at least one dimension and the same shape past the first, got input (4, 2) and output (4, 3)", e.a2a_rows, 1, true)
      assert.matches("reduce_scatter_tensor_coalesced: input 2 must have shape (4,)", e.co_pair, 1, true)
      assert.matches("got (5,)", e.co_pair, 1, true)
      assert.matches("all_gather_into_tensor_coalesced: 1 outputs but 2 inputs", e.co_len, 1, true)
      assert.matches("all_gather_into_tensor_coalesced: output 1 must be contiguous (shape (2, 3))", e.co_contig, 1, true)
      assert.are.same({ 2, 2 }, ranks[rank].out.after)
      local o = ranks[rank].output
      assert.matches("#0 reduce_scatter_tensor f32[4] at ", o, 1, true)
      assert.matches("#1 all_gather_into_tensor f32[2] at ", o, 1, true)
      assert.matches("#2 all_to_all_single f32[2] at ", o, 1, true)
      assert.matches("#3 reduce_scatter_tensor_coalesced f32[2] at ", o, 1, true)
      assert.matches("#4 all_gather_into_tensor_coalesced f32[2] at ", o, 1, true)
    end
  end)

  it("names reduce_scatter_tensor in a fingerprint mismatch and a timed-out asynchronous wait", function()
    local ranks = run([[
dist.init_process_group { backend = "gloo", timeout = 20 }
emit_err("mismatch", function()
  if RANK == 0 then dist.reduce_scatter_tensor(dl.zeros({ 2 }), dl.zeros({ 4 }))
  else dist.all_gather_into_tensor(dl.zeros({ 4 }), dl.zeros({ 2 })) end
end)
dist.destroy_process_group()
]], 2)
    for rank = 1, 2 do
      local m = ranks[rank].err.mismatch
      assert.matches("collective mismatch", m, 1, true)
      assert.matches("rank 0 called reduce_scatter_tensor(op sum, f32, shape (4,), #", m, 1, true)
      assert.matches("rank 1 called all_gather_into_tensor(f32, shape (2,), #", m, 1, true)
    end
    for _, path in ipairs(PATHS) do
      local r = run([[
dist.init_process_group { backend = "gloo", timeout = 2 }
if RANK == 1 then os.execute("sleep 4"); os.exit(0) end
local w = dist.reduce_scatter_tensor(dl.zeros({ 40000 }), dl.ones({ 80000 }), { async_op = true })
emit_err("wait", function() w:wait() end)
os.exit(0)
]], 2, { env = path[2], timeout = 30 })
      assert.matches("reduce_scatter_tensor timed out on rank 0", r[1].err.wait, 1, true)
    end
  end)

  it("run on the nccl backend's table (simulated NCCL, device tensors)", function()
    local ranks = run([[
local lib = require "ddplua.lib"
local box = lib.ffi.new("ddp_tensor*[1]")
local function dev(t, d) lib.check(lib.C.ddp_tensor_to_device(box, t, d, 0)); return lib.wrap(box[0]) end
dist.init_process_group { backend = "nccl", timeout = 20 }
local n, me = WORLD, RANK
local input = dev(tensor_of(vals(me, n * 6), { n * 6 }, "f32"), me)
local out = dev(dl.zeros({ 6 }), me)
dist.reduce_scatter_tensor(out, input, { op = "max" })
emit("rs", diff(flat(dev(out, -1)), reduce_ref("max", 6, me * 6)))
local ag = dev(dl.zeros({ n, 6 }), me)
dist.all_gather_into_tensor(ag, out)
local want = {}
for r = 0, n - 1 do for _, x in ipairs(reduce_ref("max", 6, r * 6)) do want[#want + 1] = x end end
emit("ag", diff(flat(dev(ag, -1)), want))
local oa, ob = dev(dl.zeros({ 3 }), me), dev(dl.zeros({ 1, 2 }), me)
dist.reduce_scatter_tensor_coalesced({ oa, ob }, { dev(tensor_of(vals(me, n * 3), { n * 3 }, "f32"), me),
  dev(tensor_of(vals(me, n * 2, 20), { n, 1, 2 }, "f32"), me) })
emit("co_a", diff(flat(dev(oa, -1)), reduce_ref("sum", 3, me * 3)))
emit("co_b", diff(flat(dev(ob, -1)), reduce_ref("sum", 2, 20 + me * 2)))
-- uneven: rank 0 sends 1 row to itself and 2 to rank 1, rank 1 sends 3 to rank 0 and none to itself
local sends = me == 0 and { 1, 2 } or { 3, 0 }
local recvs = me == 0 and { 1, 3 } or { 2, 0 }
local rows = me == 0 and 4 or 2
local a2a_in = dev(tensor_of(vals(me, 3 * 2), { 3, 2 }, "f32"), me)
local a2a_out = dev(dl.zeros({ rows, 2 }), me)
dist.all_to_all_single(a2a_out, a2a_in, { input_split_sizes = sends, output_split_sizes = recvs })
local w = me == 0 and { val(0, 0), val(0, 1), val(1, 0), val(1, 1), val(1, 2), val(1, 3), val(1, 4), val(1, 5) }
                   or { val(0, 2), val(0, 3), val(0, 4), val(0, 5) }
emit("a2a", diff(flat(dev(a2a_out, -1)), w))
dist.destroy_process_group()
]], 2, { env = { DDPLUA_CUDA_PLUGIN = SIM, DDPLUA_SIM_NCCL = "1" } })
    for rank = 1, 2 do
      local out = ranks[rank].out
      for _, name in ipairs { "rs", "ag", "co_a", "co_b", "a2a" } do
        assert(out[name], name .. ": no result\n" .. ranks[rank].output)
        assert.are.equal(0, out[name][1], name)
      end
    end
  end)
end)
