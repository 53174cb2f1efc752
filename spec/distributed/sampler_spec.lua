-- Specs for ddplua.distributed.sampler: golden index lists derived by hand from PyTorch's
-- DistributedSampler rules, a plain-Lua reference of those rules over many (N, world)
-- pairs, shuffle properties (one permutation per epoch on every rank, a new one next
-- epoch), evaluation mode, defaults from the job, errors, and DataLoader integration.
local dl = require "ddplua"
local data = require "ddplua.data"
local DistributedSampler = require "ddplua.distributed.sampler"

local function list(t) return t:tolist() end

local function shares(n, world, opts)
  local out = {}
  for r = 0, world - 1 do
    local o = { num_replicas = world, rank = r }
    for k, v in pairs(opts or {}) do o[k] = v end
    out[r + 1] = DistributedSampler(n, o)
  end
  return out
end

-- PyTorch's rules written out with plain Lua lists (0-based values), from its documented
-- __init__/__iter__: num_samples, total_size, pad from the front, indices[rank::world].
local function reference(base, world, rank, drop_last)
  local n = #base
  local num_samples
  if drop_last and n % world ~= 0 then
    num_samples = math.ceil((n - world) / world)
    if num_samples < 0 then num_samples = 0 end -- Python's ceil of (-1, 0) is 0
  else
    num_samples = math.ceil(n / world)
  end
  local total = num_samples * world
  local idx = {}
  for i = 1, math.min(n, total) do idx[i] = base[i] end
  if not drop_last then
    local pad = total - #idx
    if pad <= n then
      for i = 1, pad do idx[#idx + 1] = base[i] end
    else
      local rep = {}
      for _ = 1, math.ceil(pad / n) do
        for i = 1, n do rep[#rep + 1] = base[i] end
      end
      for i = 1, pad do idx[#idx + 1] = rep[i] end
    end
  end
  assert(#idx == total)
  local out = {}
  for i = rank + 1, total, world do out[#out + 1] = idx[i] end
  return out
end

local function range(n)
  local t = {}
  for i = 1, n do t[i] = i - 1 end
  return t
end

describe("ddplua.distributed.sampler", function()
  describe("golden lists (shuffle = false)", function()
    local cases = {
      { n = 10, world = 3, drop_last = false, want = { { 0, 3, 6, 9 }, { 1, 4, 7, 0 }, { 2, 5, 8, 1 } } },
      { n = 10, world = 3, drop_last = true, want = { { 0, 3, 6 }, { 1, 4, 7 }, { 2, 5, 8 } } },
      { n = 2, world = 4, drop_last = false, want = { { 0 }, { 1 }, { 0 }, { 1 } } },
      { n = 2, world = 4, drop_last = true, want = { {}, {}, {}, {} } },
      { n = 8, world = 2, drop_last = false, want = { { 0, 2, 4, 6 }, { 1, 3, 5, 7 } } },
      { n = 8, world = 2, drop_last = true, want = { { 0, 2, 4, 6 }, { 1, 3, 5, 7 } } },
      { n = 7, world = 4, drop_last = false, want = { { 0, 4 }, { 1, 5 }, { 2, 6 }, { 3, 0 } } },
      { n = 7, world = 4, drop_last = true, want = { { 0 }, { 1 }, { 2 }, { 3 } } },
      -- N < world / 2: the whole list repeats twice and more (0 1 2 0 1 2 0)
      { n = 3, world = 7, drop_last = false, want = { { 0 }, { 1 }, { 2 }, { 0 }, { 1 }, { 2 }, { 0 } } },
      { n = 1, world = 3, drop_last = false, want = { { 0 }, { 0 }, { 0 } } },
      { n = 5, world = 1, drop_last = false, want = { { 0, 1, 2, 3, 4 } } },
      { n = 0, world = 2, drop_last = false, want = { {}, {} } },
    }
    for _, c in ipairs(cases) do
      it(("N = %d, world = %d, drop_last = %s"):format(c.n, c.world, tostring(c.drop_last)), function()
        local ss = shares(c.n, c.world, { shuffle = false, drop_last = c.drop_last })
        for r = 1, c.world do
          assert.same(c.want[r], list(ss[r]:indices()))
          assert.equal(#c.want[r], ss[r]:len())
          assert.equal(#c.want[r], #ss[r])
        end
      end)
    end
  end)

  it("matches the plain-Lua reference of PyTorch's rules over many (N, world)", function()
    for n = 0, 23 do
      for world = 1, 9 do
        for _, drop_last in ipairs { false, true } do
          for rank = 0, world - 1 do
            local s = DistributedSampler(n, { num_replicas = world, rank = rank, shuffle = false, drop_last = drop_last })
            local got = list(s:indices())
            assert.same(reference(range(n), world, rank, drop_last), got)
            assert.equal(#got, s:len())
          end
        end
      end
    end
  end)

  it("with shuffle, follows the same rules over the epoch's permutation", function()
    for _, c in ipairs { { 10, 3 }, { 2, 4 }, { 17, 5 }, { 3, 8 } } do
      local n, world = c[1], c[2]
      for _, drop_last in ipairs { false, true } do
        local ss = shares(n, world, { seed = 5, drop_last = drop_last })
        for _, s in ipairs(ss) do s:set_epoch(3) end
        -- the permutation: read it back from a single-rank sampler of the same seed + epoch
        local one = DistributedSampler(n, { num_replicas = 1, rank = 0, seed = 5 })
        one:set_epoch(3)
        local perm = list(one:indices())
        for r = 0, world - 1 do
          assert.same(reference(perm, world, r, drop_last), list(ss[r + 1]:indices()))
        end
      end
    end
  end)

  describe("shuffle = true", function()
    local n, world = 103, 3

    it("gives one permutation per epoch, split disjointly and covering the dataset", function()
      local ss = shares(n, world, { drop_last = true })
      local seen = {}
      for _, s in ipairs(ss) do
        for _, i in ipairs(list(s:indices())) do
          assert.is_nil(seen[i], "index " .. i .. " on two ranks")
          seen[i] = true
        end
      end
      -- drop_last keeps floor(103 / 3) * 3 = 102 distinct indices of 0..102
      local count = 0
      for i in pairs(seen) do
        assert.is_true(i >= 0 and i < n)
        count = count + 1
      end
      assert.equal(102, count)
      -- with padding: all 103 covered, and exactly total_size - N = 2 repeats
      local padded = shares(n, world)
      local counts, total = {}, 0
      for _, s in ipairs(padded) do
        for _, i in ipairs(list(s:indices())) do
          counts[i] = (counts[i] or 0) + 1
          total = total + 1
        end
      end
      assert.equal(105, total)
      for i = 0, n - 1 do assert.is_true(counts[i] == 1 or counts[i] == 2) end
    end)

    it("is a shuffle, identical across ranks and calls, and changes with the epoch and the seed", function()
      local function all_ranks(epoch, seed)
        local out = {}
        for _, s in ipairs(shares(n, world, { seed = seed })) do
          s:set_epoch(epoch)
          out[#out + 1] = list(s:indices())
        end
        return out
      end
      local e0 = all_ranks(0, 0)
      assert.are_not.same(reference(range(n), world, 0, false), e0[1])
      assert.same(e0, all_ranks(0, 0))
      local e1 = all_ranks(1, 0)
      assert.are_not.same(e0, e1)
      assert.are_not.same(e0, all_ranks(0, 1))
      -- seed + epoch is what seeds the generator (as PyTorch)
      assert.same(all_ranks(1, 0), all_ranks(0, 1))
      -- the same sampler object: set_epoch changes its order, going back restores it
      local s = DistributedSampler(n, { num_replicas = world, rank = 1 })
      assert.same(e0[2], list(s:indices()))
      assert.same(e0[2], list(s:indices()))
      s:set_epoch(1)
      assert.same(e1[2], list(s:indices()))
      s:set_epoch(0)
      assert.same(e0[2], list(s:indices()))
    end)

    it("does not touch or depend on the default generator", function()
      local s = DistributedSampler(n, { num_replicas = 2, rank = 0 })
      dl.manual_seed(1)
      local a = list(s:indices())
      local r1 = dl.rand({ 3 }):tolist()
      dl.manual_seed(1)
      dl.rand({ 5 })
      assert.same(a, list(s:indices()))
      dl.manual_seed(1)
      assert.same(r1, dl.rand({ 3 }):tolist())
    end)
  end)

  describe("evaluation mode (pad = false)", function()
    it("counts every sample exactly once across ranks, with uneven shares", function()
      for n = 0, 20 do
        for world = 1, 6 do
          for _, shuffle in ipairs { false, true } do
            local counts, total = {}, 0
            for r = 0, world - 1 do
              local s = DistributedSampler(n, { num_replicas = world, rank = r, shuffle = shuffle, pad = false })
              local got = list(s:indices())
              assert.equal(math.max(0, math.ceil((n - r) / world)), #got)
              assert.equal(#got, s:len())
              for _, i in ipairs(got) do
                counts[i] = (counts[i] or 0) + 1
                total = total + 1
              end
            end
            assert.equal(n, total)
            for i = 0, n - 1 do assert.equal(1, counts[i]) end
          end
        end
      end
      local ss = shares(10, 3, { shuffle = false, pad = false })
      assert.same({ 0, 3, 6, 9 }, list(ss[1]:indices()))
      assert.same({ 1, 4, 7 }, list(ss[2]:indices()))
      assert.same({ 2, 5, 8 }, list(ss[3]:indices()))
    end)

    it("DistributedEvalSampler is shuffle = false, pad = false", function()
      local s = DistributedSampler.DistributedEvalSampler(5, { num_replicas = 3, rank = 2 })
      assert.same({ 2 }, list(s:indices()))
      assert.is_false(s.shuffle)
      assert.is_false(s.pad)
    end)
  end)

  describe("defaults", function()
    local saved_env
    before_each(function() saved_env = package.loaded["ddplua.distributed.distributed_c10d"] end)
    after_each(function() package.loaded["ddplua.distributed.distributed_c10d"] = saved_env end)

    it("are shuffle = true, seed = 0, drop_last = false, pad = true, epoch 0", function()
      local s = DistributedSampler(10, { num_replicas = 3, rank = 0 })
      assert.is_true(s.shuffle)
      assert.equal(0, s.seed)
      assert.is_false(s.drop_last)
      assert.is_true(s.pad)
      assert.equal(0, s.epoch)
      assert.equal(4, s.num_samples)
      assert.equal(12, s.total_size)
    end)

    it("takes the world size and rank from an initialized process group", function()
      package.loaded["ddplua.distributed.distributed_c10d"] = {
        is_initialized = function() return true end,
        get_world_size = function() return 3 end,
        get_rank = function() return 2 end,
      }
      local s = DistributedSampler(10, { shuffle = false })
      assert.equal(3, s.num_replicas)
      assert.equal(2, s.rank)
      assert.same({ 2, 5, 8, 1 }, list(s:indices()))
      -- explicit values win
      local t = DistributedSampler(10, { shuffle = false, num_replicas = 2, rank = 0 })
      assert.same({ 0, 2, 4, 6, 8 }, list(t:indices()))
    end)

    it("falls back to 1 and 0 without a process group (or to WORLD_SIZE / RANK)", function()
      package.loaded["ddplua.distributed.distributed_c10d"] = { is_initialized = function() return false end }
      local s = DistributedSampler(4, { shuffle = false })
      local ws, rk = os.getenv("WORLD_SIZE"), os.getenv("RANK")
      assert.equal(ws and tonumber(ws) or 1, s.num_replicas)
      assert.equal(rk and tonumber(rk) or 0, s.rank)
    end)

    it("reads WORLD_SIZE and RANK from the environment in a child process", function()
      local script = os.tmpname()
      local f = assert(io.open(script, "w"))
      f:write([[
package.path = "lua/?.lua;lua/?/init.lua;build/lua/?.lua;" .. package.path
package.loaded["ddplua.distributed.distributed_c10d"] = { is_initialized = function() return false end }
local DS = require "ddplua.distributed.sampler"
local s = DS(10, { shuffle = false })
io.write(s.num_replicas, " ", s.rank, " ", table.concat(s:indices():tolist(), ","), "\n")
]])
      f:close()
      local p = io.popen("WORLD_SIZE=3 RANK=1 DDP_NUM_THREADS=1 luajit " .. script .. " 2>&1")
      local out = p:read("*a")
      p:close()
      os.remove(script)
      assert.equal("3 1 1,4,7,0\n", out)
    end)

    it("asks for explicit values when the process group module is incomplete", function()
      package.loaded["ddplua.distributed.distributed_c10d"] = { is_initialized = function() return true end }
      assert.has_error(function() DistributedSampler(10) end)
      local ok, err = pcall(DistributedSampler, 10)
      assert.is_false(ok)
      assert.matches("get_world_size", err)
      assert.matches("num_replicas and rank explicitly", err)
      -- explicit values need no module
      assert.equal(2, DistributedSampler(10, { num_replicas = 2, rank = 1 }).num_replicas)
    end)
  end)

  describe("errors", function()
    local function err_of(...)
      local ok, err = pcall(DistributedSampler, ...)
      assert.is_false(ok)
      return err
    end
    it("names a rank outside [0, world), a world < 1, and bad options", function()
      assert.matches("rank 3 is outside %[0, 3%) for num_replicas = 3", err_of(10, { num_replicas = 3, rank = 3 }))
      assert.matches("rank %-1 is outside %[0, 2%)", err_of(10, { num_replicas = 2, rank = -1 }))
      assert.matches("num_replicas must be an integer >= 1, got 0", err_of(10, { num_replicas = 0, rank = 0 }))
      assert.matches("rank 0.5", err_of(10, { num_replicas = 2, rank = 0.5 }))
      assert.matches("unknown option 'shufle'", err_of(10, { num_replicas = 1, rank = 0, shufle = true }))
      assert.matches("exclude each other", err_of(10, { num_replicas = 1, rank = 0, pad = false, drop_last = true }))
      assert.matches("dataset size must be an integer >= 0, got %-1", err_of(-1, { num_replicas = 1, rank = 0 }))
      assert.matches("seed must be an integer", err_of(3, { num_replicas = 1, rank = 0, seed = 1.5 }))
      local s = DistributedSampler(3, { num_replicas = 1, rank = 0 })
      local ok, err = pcall(s.set_epoch, s, "x")
      assert.is_false(ok)
      assert.matches("epoch must be an integer", err)
    end)
    it("the C entry point checks too", function()
      local lib = require "ddplua.lib"
      local C = lib.C
      assert.equal(C.DDP_ERR_ARG, C.ddp_dist_sampler_indices(lib.box, 10, 2, 2, 0, 0, 0, 0, 1))
      assert.matches("rank 2 is outside %[0, 2%)", lib.ffi.string(C.ddp_last_error()))
      assert.equal(C.DDP_ERR_ARG, C.ddp_dist_sampler_indices(lib.box, 10, 0, 0, 0, 0, 0, 0, 1))
      assert.matches("num_replicas %(world size%) must be >= 1, got 0", lib.ffi.string(C.ddp_last_error()))
    end)
  end)

  describe("DataLoader integration", function()
    for _, c in ipairs { { 10, 3, 0, false }, { 10, 3, 2, true }, { 23, 2, 1, false }, { 2, 4, 3, false } } do
      local n, world, rank, shuffle = c[1], c[2], c[3], c[4]
      it(("yields exactly the sampler's indices (N = %d, world = %d, rank = %d, shuffle = %s)")
        :format(n, world, rank, tostring(shuffle)), function()
        local ds = data.TensorDataset(dl.arange(0, n, 1, { dtype = "i64" }))
        local s = DistributedSampler(ds, { num_replicas = world, rank = rank, shuffle = shuffle, seed = 7 })
        local loader = data.DataLoader(ds, { sampler = s, batch_size = 4, prefetch = 0 })
        for epoch = 0, 1 do
          s:set_epoch(epoch)
          local got = {}
          for x in loader:iter() do
            for _, v in ipairs(x:tolist()) do got[#got + 1] = v end
          end
          assert.same(list(s:indices()), got)
          assert.equal(math.ceil(s:len() / 4), #loader)
        end
      end)
    end
  end)
end)
