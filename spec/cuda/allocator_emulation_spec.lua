-- Specs for the CUDA caching allocator (runtime/backend/cuda/allocator.cu) without a GPU:
-- the file compiled for the host against a fake CUDA runtime
-- (spec/fixtures/fake_cuda_runtime.h: cudaMalloc over malloc with a capacity per device,
-- streams and events whose completion the checks control), driven by
-- spec/fixtures/allocator_emulation.cc. Each group of checks runs in a fresh process (the
-- allocator's state is global). What this cannot show: a real driver's behaviour
-- (cudaMalloc's own caching, the timing of event completion, cross-device event rules
-- beyond what the fake models).
local files = require "files"

describe("CUDA caching allocator against a fake CUDA runtime", function()
  local dir, exe, build_out

  local function build()
    if exe then return exe end
    dir = files.tmpdir("alloc-emul")
    local pwd = io.popen("pwd")
    local here = pwd:read("*l")
    pwd:close()
    local target = dir .. "/allocator_emulation"
    local status, out = files.run(("%s -std=c++20 -O1 -Iruntime/include -Iruntime "
      .. "-Ispec/fixtures spec/fixtures/allocator_emulation.cc -o %s -Lbuild -lddplua "
      .. "-Wl,-rpath,%s"):format(os.getenv("CXX") or "c++", files.quote(target),
        files.quote(here .. "/build")))
    build_out = out
    assert.are.equal(0, status, out)
    exe = target
    return exe
  end

  teardown(function()
    if dir then files.remove(dir) end
  end)

  -- Run one group; every check must pass and the group must report its count.
  local function group(name, at_least)
    local status, out = files.run(files.quote(build()) .. " " .. name)
    local bad = {}
    for l in out:gmatch("[^\n]+") do
      if l:match("^FAIL ") then bad[#bad + 1] = l end
    end
    assert.are.equal("", table.concat(bad, "\n"))
    assert.are.equal(0, status, out)
    local n = tonumber(out:match("(%d+) checks, 0 failed"))
    assert.is_truthy(n, out)
    assert.is_true(n >= at_least, out)
  end

  it("compiles for the host", function()
    build()
    assert.are.equal("", build_out)
  end)

  it("rounds requests to 512 B below 1 MiB and to 2 MiB from 1 MiB on", function()
    group("rounding", 36)
  end)

  it("reuses a cached block only when it is at most 1.25x the request, smallest first", function()
    group("reuse", 20)
  end)

  it("reuses a block only on the device and stream it was cached for", function()
    group("device_stream", 15)
  end)

  it("counts allocated, reserved, their peaks and the calls; reset_peak", function()
    group("counters", 15)
  end)

  it("empty_cache releases the cached blocks of every device and keeps live ones", function()
    group("empty_cache", 12)
  end)

  it("record_stream keeps a freed block out of the cache until its events complete", function()
    group("record_stream", 35)
  end)

  it("on out of memory releases the cache, retries once, then names the sizes", function()
    group("oom", 20)
  end)

  it("ignores frees of pointers it did not hand out", function()
    group("foreign", 8)
  end)
end)
