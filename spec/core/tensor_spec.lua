-- Specs for the core tensor API: creation, metadata, element access, dtypes, copies,
-- printing, errors, freeing and memory accounting.
local dl = require "ddplua"
local close = require "close"

describe("ddplua tensor core", function()
  it("creates tensors from nested tables with shape and dtype", function()
    local t = dl.tensor { { 1, 2, 3 }, { 4, 5, 6 } }
    assert.same({ 2, 3 }, t:size())
    assert.equal(2, t:dim())
    assert.equal(6, t:numel())
    assert.equal("f32", t.dtype)
    assert.same({ { 1, 2, 3 }, { 4, 5, 6 } }, t:tolist())
    assert.equal(6, t:get(2, 3))
    assert.equal(4, t[{ 2, 1 }])
    assert.equal("bool", dl.tensor({ true, false }).dtype)
    assert.equal("i64", dl.tensor({ 7, 8 }, { dtype = "i64" }).dtype)
  end)

  it("rejects ragged tables and bad element types", function()
    assert.has_error(function() dl.tensor { { 1, 2 }, { 3 } } end)
    assert.has_error(function() dl.tensor { "a" } end)
  end)

  it("fills zeros, ones, full, arange, linspace and eye", function()
    assert.same({ 0, 0, 0 }, dl.zeros({ 3 }):tolist())
    assert.same({ { 1, 1 } }, dl.ones({ 1, 2 }):tolist())
    assert.same({ 2.5, 2.5 }, dl.full({ 2 }, 2.5):tolist())
    assert.same({ 0, 1, 2, 3 }, dl.arange(4):tolist())
    assert.equal("i64", dl.arange(4).dtype)
    assert.same({ 1, 3 }, dl.arange(1, 5, 2):tolist())
    assert.same({ 5, 4, 3 }, dl.arange(5, 2, -1):tolist())
    assert.equal(0, dl.arange(3, 1):numel())
    close.assert_close(dl.arange(0, 1, 0.25), { 0, 0.25, 0.5, 0.75 })
    close.assert_close(dl.linspace(0, 1, 5), { 0, 0.25, 0.5, 0.75, 1 })
    assert.same({ { 1, 0, 0 }, { 0, 1, 0 } }, dl.eye(2, 3):tolist())
  end)

  it("converts between all dtypes", function()
    local src = dl.tensor({ -2.75, 0, 1.5, 300 }, { dtype = "f64" })
    assert.same({ -2.75, 0, 1.5, 300 }, src:to("f32"):tolist())
    assert.same({ -2, 0, 1, 300 }, src:to("i64"):tolist())
    assert.same({ -2, 0, 1, 300 }, src:to("i32"):tolist())
    assert.same({ true, false, true, true }, src:to("bool"):tolist())
    assert.same({ -2.75, 0, 1.5, 300 }, src:to("f16"):tolist())
    assert.same({ -2.75, 0, 1.5, 300 }, src:to("bf16"):tolist())
    assert.same({ 44, 0 }, dl.tensor({ 300, 0 }):to("i32"):to("u8"):tolist()) -- wraps as C
  end)

  it("rounds f16 and bf16 to nearest even", function()
    -- 1 + 2^-11 is halfway between f16 neighbours 1 and 1 + 2^-10: ties to even (1)
    local h = dl.tensor({ 1 + 2 ^ -11, 1 + 3 * 2 ^ -11, 65504, 65520, 2 ^ -24, 2 ^ -26 }, { dtype = "f64" }):to("f16")
    assert.same({ 1, 1 + 2 ^ -9, 65504, math.huge, 2 ^ -24, 0 }, h:tolist())
    local b = dl.tensor({ 1 + 2 ^ -8, 1 + 3 * 2 ^ -8 }, { dtype = "f64" }):to("bf16")
    assert.same({ 1, 1 + 2 ^ -6 }, b:tolist())
  end)

  it("copies with broadcasting and keeps views sharing storage", function()
    local t = dl.zeros { 2, 3 }
    t:copy_(dl.tensor { 1, 2, 3 })
    assert.same({ { 1, 2, 3 }, { 1, 2, 3 } }, t:tolist())
    local c = t:clone()
    c:fill_(7)
    assert.same({ 1, 2, 3 }, t:tolist()[1])
    assert.has_error(function() t:copy_(dl.tensor { 1, 2 }) end,
      nil) -- (2,) does not broadcast to (2, 3)
  end)

  it("sets and gets elements with negative indices and bounds errors", function()
    local t = dl.zeros { 2, 2 }
    t:set(-1, -1, 5)
    assert.equal(5, t:get(2, 2))
    local ok, err = pcall(function() return t:get(3, 1) end)
    assert.is_false(ok)
    assert.matches("out of range for dimension 1 of size 2", err)
    assert.matches("tensor_spec.lua", err) -- raised at the caller's line
  end)

  it("prints values, dtype and shape", function()
    local s = tostring(dl.tensor { { 1, 2 }, { 3, 4 } })
    assert.matches("tensor%(%[%[1.0000, 2.0000%],", s)
    assert.matches("%[f32 tensor of shape %(2, 2%)%]", s)
    local big = tostring(dl.zeros { 2000 })
    assert.matches("%.%.%.", big)
    assert.matches("tensor%(%[%]%)", tostring(dl.zeros { 0, 3 }))
  end)

  it("frees idempotently and refuses use after free", function()
    local before = dl.memory_stats().live
    local t = dl.zeros { 1024, 1024 }
    assert.equal(before + 4 * 1024 * 1024, dl.memory_stats().live)
    t:free()
    t:free()
    assert.equal(before, dl.memory_stats().live)
    local ok, err = pcall(function() return t:item() end)
    assert.is_false(ok)
    assert.matches("freed tensor", err)
    assert.equal("[freed tensor]", tostring(t))
  end)

  it("runs a loop of temporaries in bounded memory", function()
    collectgarbage("collect")
    local start = dl.memory_stats().live
    for _ = 1, 300 do
      local _ = dl.zeros { 1024, 1024 } -- 4 MiB each, 1.2 GiB in all
    end
    assert.is_true(dl.memory_stats().live - start < 512 * 1024 * 1024)
  end)

  it("validates shapes and dtypes with clear errors", function()
    assert.has_error(function() dl.zeros { -1 } end)
    assert.has_error(function() dl.zeros { 1, 1, 1, 1, 1, 1, 1, 1, 1 } end)
    local ok, err = pcall(dl.zeros, { 2 }, { dtype = "f128" })
    assert.is_false(ok)
    assert.matches("unknown dtype 'f128'", err)
  end)
end)

describe("ddplua random numbers", function()
  it("matches the Philox 4x32-10 known-answer vectors of Random123", function()
    local ffi = require "ffi"
    local C = require("ddplua.lib").C
    local out = ffi.new("uint32_t[4]")
    local function kat(ctr, key, expected)
      C.ddp_philox4x32_10(out, ffi.new("uint32_t[4]", ctr), ffi.new("uint32_t[2]", key))
      for i = 1, 4 do assert.equal(expected[i], tonumber(out[i - 1])) end
    end
    kat({ 0, 0, 0, 0 }, { 0, 0 }, { 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8 })
    kat({ 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff }, { 0xffffffff, 0xffffffff },
      { 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd })
    kat({ 0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344 }, { 0xa4093822, 0x299f31d0 },
      { 0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1 })
  end)

  it("reproduces a stream from the same seed and generator state", function()
    dl.manual_seed(42)
    local a = dl.rand { 100 }
    dl.manual_seed(42)
    local b = dl.rand { 100 }
    assert.same(a:tolist(), b:tolist())
    local g = dl.Generator(7)
    local state = g:get_state()
    local x = dl.randn({ 10 }, { generator = g })
    g:set_state(state)
    assert.same(x:tolist(), dl.randn({ 10 }, { generator = g }):tolist())
  end)

  it("draws uniform, normal, bernoulli, randint and randperm with the right statistics", function()
    local g = dl.Generator(3)
    local n = 20000
    local u = dl.rand({ n }, { generator = g, dtype = "f64" }):tolist()
    local mean, mn, mx = 0, 1, 0
    for _, v in ipairs(u) do mean = mean + v / n; mn = math.min(mn, v); mx = math.max(mx, v) end
    assert.is_true(math.abs(mean - 0.5) < 0.01 and mn >= 0 and mx < 1)
    local z = dl.randn({ n }, { generator = g, dtype = "f64" }):tolist()
    local m1, m2 = 0, 0
    for _, v in ipairs(z) do m1 = m1 + v / n; m2 = m2 + v * v / n end
    assert.is_true(math.abs(m1) < 0.03 and math.abs(m2 - 1) < 0.05)
    local b = dl.zeros({ n }):bernoulli_(0.3, g):tolist()
    local ones = 0
    for _, v in ipairs(b) do ones = ones + v end
    assert.is_true(math.abs(ones / n - 0.3) < 0.015)
    local r = dl.randint(-3, 4, { n }, { generator = g }):tolist()
    local seen = {}
    for _, v in ipairs(r) do assert.is_true(v >= -3 and v < 4); seen[v] = true end
    for v = -3, 3 do assert.is_true(seen[v]) end
    local p = dl.randperm(50, { generator = g }):tolist()
    table.sort(p)
    for i = 1, 50 do assert.equal(i - 1, p[i]) end
  end)
end)
