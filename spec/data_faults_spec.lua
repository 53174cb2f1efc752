-- Fault-injection specs for the dataset readers (issue 10, part 4): a header may not make a
-- reader allocate more than its file can hold (Note [what the header may declare] in
-- runtime/io/idx.c): a small gzipped IDX file whose header announces gigabytes.
local data = require "ddplua.data"
local lib = require "ddplua.lib"
local files = require "files"

local function be32(n)
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 256) % 256, n % 256)
end

describe("dataset readers #faults", function()
  local dir
  before_each(function() dir = files.tmpdir("datafaults") end)
  after_each(function() files.remove(dir) end)

  it("a small gzipped IDX file declaring 2.6 GB fails before allocating it", function()
    -- u8 (26000, 100, 1000): 2.6e9 bytes declared, 512 KiB of zeros present
    local raw = dir .. "/bomb.idx"
    local f = assert(io.open(raw, "wb"))
    f:write("\0\0\8\3", be32(26000), be32(100), be32(1000), string.rep("\0", 512 * 1024))
    f:close()
    assert.equal(0, os.execute("gzip -9 " .. files.quote(raw)))
    local gz = raw .. ".gz"
    lib.C.ddp_memory_reset_peak()
    local before = tonumber(lib.C.ddp_memory_peak_bytes())
    local ok, err = pcall(data.read_idx, gz)
    local grew = tonumber(lib.C.ddp_memory_peak_bytes()) - before
    assert.is_false(ok)
    assert.matches("bomb.idx.gz: header says (26000, 100, 1000) of u8, 2600000000 bytes of data, "
      .. "more than a gzip file of", err, 1, true)
    assert.is_true(grew < 64 * 1024 * 1024, ("the reader took %.0f MB"):format(grew / 1e6))
  end)

  it("an IDX header with a size 0 and absurd other sizes fails naming the file (fuzz finding)", function()
    -- fuzz/corpus/idx/zero-size-overflow: 0 elements, but strides past 64 bits
    local raw = dir .. "/zero.idx"
    local f = assert(io.open(raw, "wb"))
    f:write("\0\0\13\8", be32(1736060265), be32(1685585920), string.rep(be32(0), 5), be32(71))
    f:close()
    local ok, err = pcall(data.read_idx, raw)
    assert.is_false(ok)
    assert.matches("zero.idx: absurd sizes (1736060265, 1685585920, 0, 0, 0, 0, 0, 71) of f32", err, 1, true)
  end)

  it("a raw IDX file declaring more than it holds fails before allocating it", function()
    local raw = dir .. "/short.idx"
    local f = assert(io.open(raw, "wb"))
    f:write("\0\0\8\2", be32(50000), be32(50000), string.rep("\1", 1000))
    f:close()
    lib.C.ddp_memory_reset_peak()
    local before = tonumber(lib.C.ddp_memory_peak_bytes())
    local ok, err = pcall(data.read_idx, raw)
    local grew = tonumber(lib.C.ddp_memory_peak_bytes()) - before
    assert.is_false(ok)
    assert.matches("short.idx: truncated: header says (50000, 50000) of u8, expected 2500000000 bytes of data, found 1000",
      err, 1, true)
    assert.is_true(grew < 64 * 1024 * 1024, ("the reader took %.0f MB"):format(grew / 1e6))
  end)
end)
