-- Specs for dist.sum_over_ranks (ddplua.distributed): numbers summed element-wise over the
-- ranks in f64, on 2 processes started by the launcher.
local files = require "files"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

describe("ddplua.distributed.sum_over_ranks", function()
  it("sums lists of numbers over the ranks, exactly for counts #dist", function()
    local dir = files.tmpdir("sum-over-ranks")
    finally(function() files.remove(dir) end)
    local f = assert(io.open(dir .. "/s.lua", "w"))
    f:write([[
      local dist = require "ddplua.distributed"
      dist.init_process_group { backend = "gloo" }
      local r = dist.get_rank()
      local s = dist.sum_over_ranks { 0.5 + r, 2 ^ 51 + r, -r }
      print(("sums %.17g %.17g %.17g"):format(s[1], s[2], s[3]))
      dist.destroy_process_group()
    ]])
    f:close()
    local status, out = files.run(("%s --nproc_per_node=2 --standalone %s/s.lua"):format(exe, dir))
    assert.are.equal(0, status, out)
    assert.matches("%[rank 0%]: sums 2 4503599627370497 %-1\n", out)
    assert.matches("%[rank 1%]: sums 2 4503599627370497 %-1\n", out)
  end)
end)
