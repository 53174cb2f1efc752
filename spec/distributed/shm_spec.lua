-- Specs for the shared-memory all-reduce (runtime/comm/pg_shm.c): ranks on this host reduce
-- f32/f64 through a shared segment instead of Gloo's loopback TCP. Real ranks started by
-- spec/helpers/multiproc.lua. The segment reduces each element once, on one rank, over the
-- ranks in order 0 .. world-1; the references below compute exactly that order (f32 rounded
-- after every step), so they check the values bit for bit, and every rank reports a hash of
-- its result bits so the spec checks that all ranks hold the same bits.
local mp = require "multiproc"

local PRELUDE = [[
local ffi = require "ffi"
local dl = require "ddplua"
local dist = require "ddplua.distributed"
local C = require("ddplua.lib").C
RANK, WORLD = tonumber(os.getenv("RANK")), tonumber(os.getenv("WORLD_SIZE"))
function out(name, ...) io.write("OUT ", name, " ", table.concat({ ... }, ","), "\n"); io.flush() end
function err(name, fn)
  local ok, e = pcall(fn)
  io.write("ERR ", name, " ", ok and "no error" or tostring(e):gsub("\n", " "), "\n")
  io.flush()
end
local f32 = ffi.new("float[1]")
local function round(dtype, x)
  if dtype == "f64" then return x end
  f32[0] = x
  return f32[0]
end
-- Rank r's value at i (0-based): not integers, signs mixed, so summation order shows.
function value(dtype, r, i)
  return round(dtype, ((r * 7919 + i * 104729) % 1000003) / 1000003 * 2 - 1 + (r + 1) * 1e-3)
end
ctype = { f32 = "float *", f64 = "double *" }
-- Fill the contiguous tensor t with rank r's values; returns t.
function fill(t, dtype, r)
  local p = ffi.cast(ctype[dtype], C.ddp_tensor_data(t))
  for i = 0, t:numel() - 1 do p[i] = value(dtype, r, i) end
  return t
end
function make(dtype, r, n) return fill(dl.empty({ n }, { dtype = dtype }), dtype, r) end
-- A hash of the bytes of the contiguous tensor t (esize bytes per element).
function hash_bytes(t, esize)
  local p = ffi.cast("const uint8_t *", C.ddp_tensor_data(t))
  local h = 0
  for k = 0, t:numel() * esize - 1 do h = bit.bxor(bit.rol(h, 5), p[k]) end
  return bit.tohex(h)
end
local function combine(dtype, op, a, b)
  if op == "sum" or op == "avg" then return round(dtype, a + b)
  elseif op == "product" then return round(dtype, a * b)
  elseif op == "min" then return b < a and b or a
  else return b > a and b or a end
end
-- Reduced in rank order 0 .. WORLD-1, as the segment does; avg divides the sum afterwards.
function reference(dtype, op, i)
  local acc = value(dtype, 0, i)
  for r = 1, WORLD - 1 do acc = combine(dtype, op, acc, value(dtype, r, i)) end
  if op == "avg" then acc = round(dtype, acc / WORLD) end
  return acc
end
-- Mismatches against the reference (and the first one), and a hash of the result's bits.
function check(t, dtype, op)
  local n = t:numel()
  local p = ffi.cast(ctype[dtype], C.ddp_tensor_data(t))
  local words = ffi.cast("uint32_t *", p)
  local bad, first, h = 0, -1, 0
  for i = 0, n - 1 do
    if p[i] ~= reference(dtype, op, i) then
      bad = bad + 1
      if first < 0 then first = i end
    end
  end
  for k = 0, n * (dtype == "f64" and 2 or 1) - 1 do h = bit.bxor(bit.rol(h, 5), words[k]) end
  return bad, first, bit.tohex(h)
end
]]

local function run(code, n, opts)
  opts = opts or {}
  local r = mp.run {
    code = PRELUDE .. code, nprocs = n, timeout = opts.timeout or 60, env = opts.env,
    rank_env = opts.rank_env,
    kill_on_failure = opts.kill_on_failure,
  }
  for i = 1, n do
    if r[i].output:find("AddressSanitizer", 1, true) or r[i].output:find("runtime error:", 1, true) then
      error("sanitizer report:\n" .. mp.describe(r), 2)
    end
  end
  if not opts.expect_failure and not r.ok then error("ranks failed:\n" .. mp.describe(r), 2) end
  local ranks = {}
  for i = 1, n do
    local outs, errs = {}, {}
    for line in (r[i].output .. "\n"):gmatch("([^\n]*)\n") do
      local name, vals = line:match("^OUT (%S+) (.*)$")
      if name then
        local list = {}
        for x in vals:gmatch("[^,]+") do list[#list + 1] = tonumber(x) or x end
        outs[name] = list
      end
      local ename, msg = line:match("^ERR (%S+) (.*)$")
      if ename then errs[ename] = msg end
    end
    ranks[i] = { out = outs, err = errs }
  end
  return ranks, r
end

-- 4 MiB slots: one chunk holds 1048576 f32 or 524288 f64 elements.
local BIG = 1048576 + 524288 + 3

-- Every rank's result of `name`: no mismatch, and the same bits everywhere.
local function assert_results(ranks, name, raw)
  local hash
  for rank = 1, #ranks do
    local o = ranks[rank].out[name]
    assert(o, ("rank %d printed no result for %s:\n%s"):format(rank - 1, name, mp.describe(raw)))
    assert(o[1] == 0, ("%s on rank %d: %d elements differ from the reference, the first at %d")
      :format(name, rank - 1, o[1], o[2]))
    hash = hash or o[3]
    assert.equal(hash, o[3], name .. ": ranks hold different bits")
  end
end

describe("shared-memory all_reduce #dist", function()
  for _, n in ipairs { 2, 3 } do
    it(("reduces every op in f32 and f64 on %d ranks, odd sizes and several chunks"):format(n), function()
      local ranks, raw = run(([[
        dist.init_process_group { timeout = 30 }
        local big = %d
        for _, dtype in ipairs { "f32", "f64" } do
          for k, op in ipairs { "sum", "avg", "min", "max", "product" } do
            -- the big size for one op in turn per dtype keeps the Lua reference quick
            for _, size in ipairs { 1, 7, 1001, (k + (dtype == "f64" and 1 or 0)) %% 2 == 0 and big or 0 } do
              local t = make(dtype, RANK, size)
              dist.all_reduce(t, { op = op })
              out(dtype .. "_" .. op .. "_" .. size, check(t, dtype, op))
            end
          end
        end
        dist.destroy_process_group()
      ]]):format(BIG), n)
      for _, dtype in ipairs { "f32", "f64" } do
        for k, op in ipairs { "sum", "avg", "min", "max", "product" } do
          for _, size in ipairs { 1, 7, 1001, (k + (dtype == "f64" and 1 or 0)) % 2 == 0 and BIG or 0 } do
            assert_results(ranks, dtype .. "_" .. op .. "_" .. size, raw)
          end
        end
      end
    end)
  end

  it("keeps launch order mixed with Gloo collectives, blocking and asynchronous (3 ranks)", function()
    local ranks, raw = run(([[
      dist.init_process_group { timeout = 30 }
      local works, ts = {}, {}
      for j = 1, 6 do
        ts[j] = make(j %% 2 == 0 and "f64" or "f32", RANK, j * 1000 + 1)
        works[#works + 1] = dist.all_reduce(ts[j], { async_op = true })
        local b = dl.full({ 3 }, RANK + j)
        works[#works + 1] = dist.broadcast(b, j %% WORLD, { async_op = true })
        ts["b" .. j] = b
      end
      for i = #works, 1, -1 do works[i]:wait() end
      for j = 1, 6 do
        local dtype = j %% 2 == 0 and "f64" or "f32"
        out("seq" .. j, check(ts[j], dtype, "sum"))
        out("bcast" .. j, unpack(ts["b" .. j]:tolist()))
      end
      local g = dl.zeros { WORLD, 2 }
      dist.all_gather_into_tensor(g, dl.full({ 2 }, RANK * 10))
      local flat = {}
      for _, row in ipairs(g:tolist()) do for _, v in ipairs(row) do flat[#flat + 1] = v end end
      out("gather", unpack(flat))
      local big = make("f32", RANK, %d)
      dist.all_reduce(big)
      out("big", check(big, "f32", "sum"))
      local i64 = dl.tensor({ RANK + 1, 2 }, { dtype = "i64" }) -- not a shared-memory dtype
      dist.all_reduce(i64)
      out("i64", unpack(i64:tolist()))
      dist.destroy_process_group()
    ]]):format(BIG), 3)
    for j = 1, 6 do
      assert_results(ranks, "seq" .. j, raw)
      for rank = 1, 3 do
        local root = j % 3
        assert.same({ root + j, root + j, root + j }, ranks[rank].out["bcast" .. j])
      end
    end
    assert_results(ranks, "big", raw)
    for rank = 1, 3 do
      assert.same({ 0, 0, 10, 10, 20, 20 }, ranks[rank].out.gather)
      assert.same({ 6, 6 }, ranks[rank].out.i64)
    end
  end)

  -- Gloo's timeout message has no "shared memory:" part: that tells which path ran.
  for _, case in ipairs { { "every rank", function() return { DDPLUA_SHM = "0" } end },
                          { "rank 1 only", function(r) return { DDPLUA_SHM = r == 1 and "0" or false } end } } do
    it("goes through Gloo when DDPLUA_SHM=0 is set on " .. case[1], function()
      local ranks, raw = run([[
        dist.init_process_group { timeout = 1.5 }
        local m = dl.full({ 5 }, RANK + 1)
        dist.all_reduce(m)
        out("sum", unpack(m:tolist()))
        local t = make("f64", RANK, 1001)
        dist.all_reduce(t, { op = "max" })
        out("max", check(t, "f64", "max"))
        if RANK == 1 then os.execute("sleep 3"); os.exit(0) end
        err("timeout", function() dist.all_reduce(m) end)
        os.exit(0)
      ]], 2, { rank_env = case[2], timeout = 40 })
      for rank = 1, 2 do assert.same({ 3, 3, 3, 3, 3 }, ranks[rank].out.sum) end
      assert_results(ranks, "max", raw)
      assert.matches("all_reduce timed out on rank 0", ranks[1].err.timeout, 1, true)
      assert.is_nil(ranks[1].err.timeout:find("shared memory", 1, true), ranks[1].err.timeout)
    end)
  end

  it("fails within seconds naming the rank killed during an all_reduce", function()
    local ranks, raw = run([[
      dist.init_process_group { timeout = 60 }
      local t = make("f32", RANK, 4096)
      dist.all_reduce(t)
      dist.barrier()
      if RANK == 1 then
        ffi.cdef "int getpid(void); int kill(int pid, int sig);"
        ffi.C.kill(ffi.C.getpid(), 9)
      end
      local t0 = os.time()
      err("dead", function() for _ = 1, 1000 do dist.all_reduce(t) end end)
      out("elapsed", os.time() - t0)
      err("later", function() dist.all_reduce(t) end)
      os.exit(0)
    ]], 2, { expect_failure = true, kill_on_failure = false, timeout = 40 })
    assert.is_nil(raw.timed_out, mp.describe(raw))
    local e = ranks[1].err
    assert.matches("all_reduce failed on rank 0: peer rank 1 disconnected", e.dead, 1, true)
    assert(ranks[1].out.elapsed[1] <= 5, "the survivor took " .. ranks[1].out.elapsed[1] .. " s")
    assert.matches("the process group was aborted", e.later, 1, true)
    assert.equal(0, raw[1].status)
    assert.equal(128 + 9, raw[2].status)
  end)

  it("times out naming this rank and the rank that did not arrive", function()
    local ranks, raw = run([[
      dist.init_process_group { timeout = 1.5 }
      local t = make("f64", RANK, 10)
      dist.all_reduce(t)
      if RANK == 1 then os.execute("sleep 4"); os.exit(0) end
      local t0 = os.time()
      err("timeout", function() dist.all_reduce(t) end)
      out("elapsed", os.time() - t0)
      os.exit(0)
    ]], 2, { timeout = 40 })
    local e = ranks[1].err
    assert.matches("all_reduce timed out on rank 0 after 1.5 s waiting for peer rank 1", e.timeout, 1, true)
    assert.matches("shared memory: rank 0 waited 1.5 s", e.timeout, 1, true)
    assert(ranks[1].out.elapsed[1] <= 4, "took " .. ranks[1].out.elapsed[1] .. " s")
  end)
end)

describe("shared-memory zero-copy all_reduce (dist.shared_buffer) #dist", function()
  for _, n in ipairs { 2, 3, 4 } do
    it(("reduces shared buffers in place, the same bits as the reference, on %d ranks"):format(n), function()
      local ranks, raw = run([[
        dist.init_process_group { timeout = 30 }
        for _, dtype in ipairs { "f32", "f64" } do
          for k, op in ipairs { "sum", "avg", "min", "max", "product" } do
            for _, size in ipairs { 7, 9001, k == 1 and 300001 or 20001 } do
              local t, placed = dist.shared_buffer(size, { dtype = dtype })
              assert(placed, "not placed in shared memory")
              fill(t, dtype, RANK)
              dist.all_reduce(t, { op = op })
              out(dtype .. "_" .. op .. "_" .. size, check(t, dtype, op))
            end
          end
        end
        -- a view into a shared buffer, at an offset
        local s = dist.shared_buffer(20011)
        local v = s:narrow(1, 5, 20001)
        fill(v, "f32", RANK)
        dist.all_reduce(v)
        out("view", check(v, "f32", "sum"))
        -- back to back, each rank refilling its buffer as soon as the call returns: every
        -- peer must have written its slice into this buffer before the call returns
        local bb, bad = dist.shared_buffer(1000003), 0
        for _ = 1, 6 do
          fill(bb, "f32", RANK)
          dist.all_reduce(bb)
          bad = bad + check(bb, "f32", "sum")
        end
        out("back_to_back", bad, 0, select(3, check(bb, "f32", "sum")))
        -- only rank 0's tensor is shared: every rank stages (several chunks)
        local m = RANK == 0 and fill(dist.shared_buffer(1100003), "f32", RANK) or make("f32", RANK, 1100003)
        dist.all_reduce(m)
        out("mixed", check(m, "f32", "sum"))
        dist.destroy_process_group()
      ]], n)
      for _, dtype in ipairs { "f32", "f64" } do
        for k, op in ipairs { "sum", "avg", "min", "max", "product" } do
          for _, size in ipairs { 7, 9001, k == 1 and 300001 or 20001 } do
            assert_results(ranks, dtype .. "_" .. op .. "_" .. size, raw)
          end
        end
      end
      assert_results(ranks, "view", raw)
      assert_results(ranks, "back_to_back", raw)
      assert_results(ranks, "mixed", raw)
    end)
  end

  it("gives ordinary memory without shared memory, outlives its group, checks its options", function()
    for _, env in ipairs { {}, { DDPLUA_SHM = "0" } } do
      local ranks = run([[
        dist.init_process_group { timeout = 30 }
        local t, placed = dist.shared_buffer({ 2, 3 }, { dtype = "f64" })
        out("placed", tostring(placed), t:numel(), t:sum():item())
        err("unknown", function() dist.shared_buffer(4, { dtpye = "f32" }) end)
        err("shape", function() dist.shared_buffer({ -1 }) end)
        t:fill_(RANK + 1)
        dist.all_reduce(t)
        dist.destroy_process_group()
        t:add_(1) -- still valid memory after the group is gone
        out("after", t:sum():item())
      ]], 2, { env = env })
      for rank = 1, 2 do
        local o = ranks[rank].out
        assert.same({ env.DDPLUA_SHM and "false" or "true", 6, 0 }, o.placed)
        assert.same({ 24 }, o.after)
        assert.matches("shared_buffer", ranks[rank].err.unknown, 1, true)
        assert.matches("dtpye", ranks[rank].err.unknown, 1, true)
        assert.matches("shared_buffer: bad size -1", ranks[rank].err.shape, 1, true)
      end
    end
  end)
end)

-- Note [shm pipelined all-reduce] in runtime/comm/pg_shm.c: above 32 KiB an all-reduce
-- is cut into one slice per rank (staged: per chunk), and each rank writes its slice's result
-- into every rank's buffer or slot. The sizes below give many staged chunks with an odd
-- tail, exact multiples of the staged chunk (for 3 and 4 ranks), and just over the
-- small-message limit; slices of odd lengths come with them.
local PIPE_CASES = {
  { "f32", "sum", 1000003 }, { "f32", "product", 786432 }, { "f32", "min", 8193 },
  { "f64", "sum", 500009 }, { "f64", "max", 393216 }, { "f64", "sum", 4097 },
}

describe("shared-memory pipelined all_reduce #dist", function()
  for _, n in ipairs { 3, 4 } do
    it(("staged, in place and mixed, every dtype, the reference's bits on %d ranks"):format(n), function()
      local cases = {}
      for i, c in ipairs(PIPE_CASES) do cases[i] = ("{ %q, %q, %d }"):format(c[1], c[2], c[3]) end
      local ranks, raw = run(([[
        dist.init_process_group { timeout = 30 }
        for _, c in ipairs { %s } do
          local dtype, op, size = c[1], c[2], c[3]
          local t = make(dtype, RANK, size)
          dist.all_reduce(t, { op = op })
          out("staged_" .. dtype .. "_" .. op .. "_" .. size, check(t, dtype, op))
          local s, placed = dist.shared_buffer(size, { dtype = dtype })
          assert(placed, "not placed in shared memory")
          fill(s, dtype, RANK)
          dist.all_reduce(s, { op = op })
          out("shared_" .. dtype .. "_" .. op .. "_" .. size, check(s, dtype, op))
        end
        -- half the ranks' tensors shared: every rank stages
        local m = RANK %% 2 == 0 and fill(dist.shared_buffer(1000003), "f32", RANK) or make("f32", RANK, 1000003)
        dist.all_reduce(m)
        out("mixed", check(m, "f32", "sum"))
        -- min / max keep x < acc ? x : acc and x > acc ? x : acc (x the next rank's value)
        -- over NaNs and signed zeros: compared bit for bit
        local special = { 0 / 0, 0.0, -0.0, 1.5, -1.5 }
        local function sv(r, i) return special[(r * 3 + i * 7 + math.floor(i / 5)) %% 5 + 1] end
        local bits = { f32 = ffi.new("float[1]"), f64 = ffi.new("double[1]") }
        local view = { f32 = "uint32_t *", f64 = "uint64_t *" }
        for _, dtype in ipairs { "f32", "f64" } do
          for _, op in ipairs { "min", "max" } do
            for _, kind in ipairs { "staged", "shared" } do
              local size = 100003
              local t = kind == "shared" and dist.shared_buffer(size, { dtype = dtype }) or dl.empty({ size }, { dtype = dtype })
              local p = ffi.cast(ctype[dtype], C.ddp_tensor_data(t))
              for i = 0, size - 1 do p[i] = sv(RANK, i) end
              dist.all_reduce(t, { op = op })
              local w, bad, first = ffi.cast(view[dtype], p), 0, -1
              for i = 0, size - 1 do
                local acc = sv(0, i)
                for r = 1, WORLD - 1 do
                  local x = sv(r, i)
                  if op == "min" then acc = x < acc and x or acc else acc = x > acc and x or acc end
                end
                bits[dtype][0] = acc
                if ffi.cast(view[dtype], bits[dtype])[0] ~= w[i] then
                  bad = bad + 1
                  if first < 0 then first = i end
                end
              end
              out(("nan_%%s_%%s_%%s"):format(kind, dtype, op), bad, first, hash_bytes(t, dtype == "f32" and 4 or 8))
            end
          end
        end
        -- f16 and bf16 are reduced as f32 (pg_gloo.c stages them) and rounded back once
        for _, dtype in ipairs { "f16", "bf16" } do
          local size = 100003
          local t = make("f32", RANK, size):to(dtype)
          dist.all_reduce(t)
          local ref = make("f32", 0, size):to(dtype):to("f32")
          for r = 1, WORLD - 1 do ref = ref + make("f32", r, size):to(dtype):to("f32") end
          local bad = t:to("f32"):ne(ref:to(dtype):to("f32")):sum():item()
          out(dtype, bad, 0, hash_bytes(t, 2))
        end
        dist.destroy_process_group()
      ]]):format(table.concat(cases, ", ")), n, { timeout = 120 })
      for _, c in ipairs(PIPE_CASES) do
        assert_results(ranks, "staged_" .. c[1] .. "_" .. c[2] .. "_" .. c[3], raw)
        assert_results(ranks, "shared_" .. c[1] .. "_" .. c[2] .. "_" .. c[3], raw)
      end
      assert_results(ranks, "mixed", raw)
      for _, dtype in ipairs { "f32", "f64" } do
        for _, op in ipairs { "min", "max" } do
          assert_results(ranks, "nan_staged_" .. dtype .. "_" .. op, raw)
          assert_results(ranks, "nan_shared_" .. dtype .. "_" .. op, raw)
        end
      end
      assert_results(ranks, "f16", raw)
      assert_results(ranks, "bf16", raw)
    end)
  end
end)

describe("shared-memory broadcast, all_gather and barrier #dist", function()
  it("broadcasts and gathers every size path and dtype, bit for bit (3 ranks)", function()
    local ranks, raw = run(([==[
      dist.init_process_group { timeout = 30 }
      local esize = { f32 = 4, f64 = 8 }
      -- broadcast: small, over the small area, over several slot chunks, from a shared buffer
      for _, c in ipairs { { "f64", 5 }, { "f32", 9001 }, { "f32", %d }, { "f64", 0 } } do
        local t = make(c[1], RANK, c[2])
        dist.broadcast(t, 1)
        out("bcast_" .. c[1] .. "_" .. c[2], hash_bytes(t, esize[c[1]]), hash_bytes(make(c[1], 1, c[2]), esize[c[1]]))
      end
      local sb = fill(dist.shared_buffer(70001), "f32", RANK)
      dist.broadcast(sb, 2)
      out("bcast_shared", hash_bytes(sb, 4), hash_bytes(make("f32", 2, 70001), 4))
      local u8 = dl.full({ 40000 }, RANK + 7, { dtype = "u8" })
      dist.broadcast(u8, 0)
      out("bcast_u8", u8:min():item(), u8:max():item())
      local nc = dl.full({ 3, 4 }, RANK):transpose(1, 2) -- not contiguous
      dist.broadcast(nc, 2)
      out("bcast_nc", nc:min():item(), nc:max():item())
      -- all_gather: small, one slot chunk, several chunks
      for _, c in ipairs { { "f64", 5 }, { "f32", 9001 }, { "f32", %d } } do
        local o = dl.empty({ WORLD, c[2] }, { dtype = c[1] })
        dist.all_gather_into_tensor(o, make(c[1], RANK, c[2]))
        local hs = {}
        for r = 0, WORLD - 1 do
          hs[#hs + 1] = hash_bytes(o:select(1, r + 1):contiguous(), esize[c[1]]) == hash_bytes(make(c[1], r, c[2]), esize[c[1]]) and 1 or 0
        end
        out("gather_" .. c[1] .. "_" .. c[2], unpack(hs))
      end
      local list = {}
      for r = 1, WORLD do list[r] = dl.empty({ 20001 }) end
      dist.all_gather(list, make("f32", RANK, 20001))
      local hs = {}
      for r = 0, WORLD - 1 do hs[#hs + 1] = hash_bytes(list[r + 1], 4) == hash_bytes(make("f32", r, 20001), 4) and 1 or 0 end
      out("gather_list", unpack(hs))
      for _ = 1, 50 do dist.barrier() end
      out("barriers", 1)
      dist.destroy_process_group()
    ]==]):format(BIG, BIG), 3)
    for rank = 1, 3 do
      local o = ranks[rank].out
      for _, name in ipairs { "bcast_f64_5", "bcast_f32_9001", "bcast_f32_" .. BIG, "bcast_f64_0", "bcast_shared" } do
        assert(o[name], name .. " missing:\n" .. mp.describe(raw))
        assert.equal(o[name][2], o[name][1], name .. " on rank " .. (rank - 1))
      end
      assert.same({ 7, 7 }, o.bcast_u8)
      assert.same({ 2, 2 }, o.bcast_nc)
      for _, name in ipairs { "gather_f64_5", "gather_f32_9001", "gather_f32_" .. BIG, "gather_list" } do
        assert.same({ 1, 1, 1 }, o[name], name .. " on rank " .. (rank - 1))
      end
      assert.same({ 1 }, o.barriers)
    end
  end)

  it("fails within seconds naming the rank killed before a broadcast", function()
    local ranks, raw = run([[
      dist.init_process_group { timeout = 60 }
      local t = make("f32", RANK, 100000)
      dist.broadcast(t, 0)
      dist.barrier()
      if RANK == 1 then
        ffi.cdef "int getpid(void); int kill(int pid, int sig);"
        ffi.C.kill(ffi.C.getpid(), 9)
      end
      local t0 = os.time()
      err("dead", function() for _ = 1, 1000 do dist.broadcast(t, 0) end end)
      out("elapsed", os.time() - t0)
      os.exit(0)
    ]], 2, { expect_failure = true, kill_on_failure = false, timeout = 40 })
    assert.is_nil(raw.timed_out, mp.describe(raw))
    assert.matches("broadcast failed on rank 0: peer rank 1 disconnected", ranks[1].err.dead, 1, true)
    assert(ranks[1].out.elapsed[1] <= 5, "the survivor took " .. ranks[1].out.elapsed[1] .. " s")
  end)

  it("times out a barrier naming the rank that did not arrive", function()
    local ranks = run([[
      dist.init_process_group { timeout = 1.5 }
      dist.barrier()
      if RANK == 1 then os.execute("sleep 4"); os.exit(0) end
      err("timeout", function() dist.barrier() end)
      os.exit(0)
    ]], 2, { timeout = 40 })
    assert.matches("barrier timed out on rank 0 after 1.5 s waiting for peer rank 1", ranks[1].err.timeout, 1, true)
    assert.matches("shared memory: rank 0 waited 1.5 s", ranks[1].err.timeout, 1, true)
  end)
end)
