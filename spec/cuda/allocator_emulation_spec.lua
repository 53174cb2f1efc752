-- Specs for the CUDA caching allocator (runtime/backend/cuda/allocator.cu) without a GPU:
-- the file compiled for the host against a fake CUDA runtime
-- (spec/fixtures/fake_cuda_runtime.h: cudaMalloc over malloc with a capacity per device,
-- streams and events whose completion the checks control), driven by
-- spec/fixtures/allocator_emulation.cc, a test program that make builds (without a warning:
-- -Werror) as build/tests/allocator_emulation. Each group of checks runs in a fresh process
-- (the allocator's state is global). What this cannot show: a real driver's behaviour
-- (cudaMalloc's own caching, the timing of event completion, cross-device event rules
-- beyond what the fake models).
local files = require "files"

describe("CUDA caching allocator against a fake CUDA runtime", function()
  local lib = os.getenv("DDPLUA_LIB")
  local exe = (lib and lib:match("^(.*)/[^/]*$") or "build") .. "/tests/allocator_emulation"

  -- Run one group; every check must pass and the group must report its count.
  local function group(name, at_least)
    local status, out = files.run(files.quote(exe) .. " " .. name)
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

  it("is built by make for the host", function()
    local f = io.open(exe, "rb")
    assert.is_truthy(f, "no " .. exe .. ": run make")
    f:close()
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
