-- Specs for ddplua.tools.verify (`ddplua verify A B ...`): identical files, differing
-- values (named with their max abs diff), missing tensors, shape and dtype mismatches,
-- --atol, --quiet, and unreadable files, run through the executable as a child process.
local dl = require "ddplua"
local checkpoint = require "ddplua.checkpoint"
local verify = require "ddplua.tools.verify"

local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"
-- The executable is linked against build/libddplua.so; a different $DDPLUA_LIB (the
-- sanitizer run's) would load a second copy whose error messages land in the first copy's
-- state (ELF symbol interposition). Unless the caller chose the executable too, the child
-- uses the library it was built with.
local child_env = os.getenv("DDPLUA_EXE") and "" or "env -u DDPLUA_LIB "

local files = require "files"
local tmpdir
setup(function() tmpdir = files.tmpdir("verify") end)
teardown(function() files.remove(tmpdir) end)

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Run `ddplua verify args...`; returns the merged output and the exit status (read from
-- the shell: LuaJIT's popen:close() does not return it).
local function run(...)
  local parts = { q(exe), "verify" }
  for _, a in ipairs { ... } do parts[#parts + 1] = q(a) end
  local p = assert(io.popen(child_env .. "DDP_NUM_THREADS=1 " .. table.concat(parts, " ") .. " 2>&1; echo \"exit status $?\"", "r"))
  local out = p:read("*a")
  p:close()
  local status = tonumber(out:match("exit status (%d+)\n$"))
  return out:gsub("exit status %d+\n$", ""), status
end

local function path(name) return tmpdir .. "/" .. name end
local function esc(s) return (s:gsub("%p", "%%%0")) end

-- A model-like state: the same values each call (seeded), so two saves are replicas.
local function state()
  dl.manual_seed(42)
  return {
    ["fc1.weight"] = dl.randn({ 8, 5 }, { dtype = "f32" }),
    ["fc1.bias"] = dl.randn({ 8 }, { dtype = "f32" }),
    ["fc2.weight"] = dl.randn({ 3, 8 }, { dtype = "f64" }),
    ["bn.num_batches_tracked"] = dl.tensor({ 12 }, { dtype = "i64" }),
  }
end

local function save(name, s)
  checkpoint.save(path(name), s, { epoch = 3 })
  return path(name)
end

describe("ddplua.tools.verify", function()
  it("exits 0 for identical files and counts the tensors and files", function()
    local a, b, c = save("a0.safetensors", state()), save("b0.safetensors", state()), save("c0.safetensors", state())
    local out, status = run(a, b, c)
    assert.equal(0, status)
    assert.matches("4 tensors identical across 3 files", out)
  end)

  it("exits 1 naming the differing tensor, its max abs diff and the files", function()
    local s = state()
    local a = save("a1.safetensors", s)
    local w = s["fc2.weight"]
    -- change two elements; the larger change is the max abs diff
    local vals = w:tolist()
    vals[2][3] = vals[2][3] + 0.25
    vals[3][1] = vals[3][1] - 0.5
    s["fc2.weight"] = dl.tensor(vals, { dtype = "f64" })
    local b = save("b1.safetensors", s)
    local out, status = run(a, b)
    assert.equal(1, status)
    assert.matches("tensor 'fc2.weight' differs: max abs diff 0.5 ", out)
    assert.matches(esc(a) .. " vs " .. esc(b), out)
    assert.not_matches("fc1", out)
    assert.not_matches("identical", out)
  end)

  it("reports the max abs diff of f32 values computed in f64", function()
    local s = state()
    local a = save("a2.safetensors", s)
    local v = s["fc1.bias"]:tolist()
    local old = v[4]
    v[4] = v[4] + 1e-3
    s["fc1.bias"] = dl.tensor(v, { dtype = "f32" })
    -- the expected difference: both values as stored in f32, subtracted in f64
    local d = math.abs(s["fc1.bias"]:to("f64"):tolist()[4] - dl.tensor({ old }, { dtype = "f32" }):to("f64"):tolist()[1])
    local out, status = run(a, save("b2.safetensors", s))
    assert.equal(1, status)
    local printed = tonumber(out:match("tensor 'fc1%.bias' differs: max abs diff (%S+)"))
    assert.is_true(math.abs(printed - d) <= 1e-6 * d, "printed " .. tostring(printed) .. ", expected " .. d)
  end)

  it("names a tensor missing on either side", function()
    local s = state()
    local a = save("a3.safetensors", s)
    s["fc1.bias"] = nil
    s["extra"] = dl.zeros({ 2 })
    local b = save("b3.safetensors", s)
    local out, status = run(a, b)
    assert.equal(1, status)
    assert.matches("tensor 'fc1%.bias' missing in " .. esc(b), out)
    assert.matches("tensor 'extra' missing in " .. esc(a), out)
    assert.matches("2 differences found", out)
  end)

  it("names shape and dtype mismatches", function()
    local s = state()
    local a = save("a4.safetensors", s)
    s["fc1.weight"] = s["fc1.weight"]:reshape({ 5, 8 })
    s["fc2.weight"] = s["fc2.weight"]:to("f32")
    local out, status = run(a, save("b4.safetensors", s))
    assert.equal(1, status)
    assert.matches("tensor 'fc1%.weight' shape differs: %(8, 5%) in " .. esc(a) .. ", %(5, 8%) in", out)
    assert.matches("tensor 'fc2%.weight' dtype differs: f64 in " .. esc(a) .. ", f32 in", out)
  end)

  it("compares the first file with every other one", function()
    local s = state()
    local a, b = save("a5.safetensors", s), save("b5.safetensors", s)
    s["fc1.bias"] = s["fc1.bias"] * 2
    local c = save("c5.safetensors", s)
    local out, status = run(a, b, c)
    assert.equal(1, status)
    assert.matches("tensor 'fc1%.bias' differs: .*" .. esc(a) .. " vs " .. esc(c), out)
    assert.not_matches(esc(b), out)
  end)

  it("--atol treats small differences as equal, not larger ones", function()
    local s = state()
    local a = save("a6.safetensors", s)
    local v = s["fc2.weight"]:tolist()
    v[1][1] = v[1][1] + 1e-4
    s["fc2.weight"] = dl.tensor(v, { dtype = "f64" })
    local b = save("b6.safetensors", s)
    local out, status = run(a, b, "--atol", "1e-3")
    assert.equal(0, status)
    assert.matches("4 tensors identical across 2 files %(within atol 0.001%)", out)
    out, status = run(a, b, "--atol=1e-5")
    assert.equal(1, status)
    assert.matches("fc2%.weight", out)
    out, status = run(a, b)
    assert.equal(1, status)
  end)

  it("--quiet prints nothing", function()
    local s = state()
    local a = save("a7.safetensors", s)
    local out, status = run(a, a, "--quiet")
    assert.equal(0, status)
    assert.equal("", out)
    s["fc1.bias"] = s["fc1.bias"] + 1
    out, status = run("--quiet", a, save("b7.safetensors", s))
    assert.equal(1, status)
    assert.equal("", out)
  end)

  it("exits 2 for a missing or malformed file and for a bad command line", function()
    local a = save("a8.safetensors", state())
    local out, status = run(a, path("nope.safetensors"))
    assert.equal(2, status)
    assert.matches("nope%.safetensors", out)
    local f = assert(io.open(path("bad.safetensors"), "wb"))
    f:write("\1\0\0\0\0\0\0\0{")
    f:close()
    out, status = run(a, path("bad.safetensors"))
    assert.equal(2, status)
    assert.matches("bad%.safetensors", out)
    out, status = run(a)
    assert.equal(2, status)
    assert.matches("at least two files", out)
    out, status = run(a, a, "--atol", "-1")
    assert.equal(2, status)
    assert.matches("%-%-atol", out)
    out, status = run(a, a, "--bogus")
    assert.equal(2, status)
    assert.matches("unknown option %-%-bogus", out)
  end)

  describe("max_abs_diff", function()
    it("counts equal values, equal infinities and NaNs on both sides as 0, flags one-sided NaN", function()
      local inf, nan = math.huge, 0 / 0
      local a = dl.tensor({ 1, inf, nan, -0.0, 3 }, { dtype = "f64" })
      local b = dl.tensor({ 1, inf, nan, 0.0, 3.5 }, { dtype = "f64" })
      local d, nan_mismatch = verify.max_abs_diff(a, b)
      assert.equal(0.5, d)
      assert.is_false(nan_mismatch)
      local _, m = verify.max_abs_diff(dl.tensor({ 1, nan }, { dtype = "f64" }), dl.tensor({ 1, 2 }, { dtype = "f64" }))
      assert.is_true(m)
    end)

    it("bitwise mode reports -0 vs 0 as different, --atol does not", function()
      local a = save("a9.safetensors", { z = dl.tensor({ 0.0, 1 }, { dtype = "f32" }) })
      local b = save("b9.safetensors", { z = dl.tensor({ -0.0, 1 }, { dtype = "f32" }) })
      local out, status = run(a, b)
      assert.equal(1, status)
      assert.matches("tensor 'z' differs: max abs diff 0 %(bits differ", out)
      _, status = run(a, b, "--atol", "1e-9")
      assert.equal(0, status)
    end)
  end)
end)
