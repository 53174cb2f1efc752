--- ddplua.data.draw: scalar random draws for the Lua-side transforms and dataset tools,
-- taken from a dl.Generator's Philox stream (Note [transform randomness] in ddplua/io.h
-- describes the stream; ddplua.h ddp_philox4x32_10).
--
-- Each call takes whole Philox blocks at the generator's offset (block = philox(counter =
-- offset, key = seed)) and advances the offset past them, as the C fills do; a block gives
-- two numbers of 53 random bits each. Draws therefore depend only on the generator's
-- state: the same seed gives the same crops and flips on every machine and thread count.
local lib = require "ddplua.lib"
local generator = require "ddplua.generator"
local ffi, C = lib.ffi, lib.C

local M = {}

local out = ffi.new("uint32_t[4]")
local ctr = ffi.new("uint32_t[4]")
local key = ffi.new("uint32_t[2]")
local seed_b, off_b = ffi.new("uint64_t[1]"), ffi.new("uint64_t[1]")

--- draw.uniforms(gen, n) -> a list of n numbers uniform in [0, 1), from `gen` (a
-- dl.Generator; nil: the default generator), advancing it by ceil(n / 2) blocks.
function M.uniforms(gen, n)
  local h = (gen or generator.default).handle
  C.ddp_generator_get_state(h, seed_b, off_b)
  local seed, off = seed_b[0], off_b[0]
  key[0], key[1] = ffi.cast("uint32_t", seed), ffi.cast("uint32_t", seed / 4294967296ULL)
  local res = {}
  local blocks = math.ceil(n / 2)
  for b = 0, blocks - 1 do
    local c = off + b
    ctr[0], ctr[1], ctr[2], ctr[3] = ffi.cast("uint32_t", c), ffi.cast("uint32_t", c / 4294967296ULL), 0, 0
    C.ddp_philox4x32_10(out, ctr, key)
    for k = 0, 1 do
      local hi = math.floor(tonumber(out[2 * k]) / 32)      -- 27 bits
      local lo = math.floor(tonumber(out[2 * k + 1]) / 64)  -- 26 bits
      local i = 2 * b + k + 1
      if i <= n then res[i] = (hi * 67108864 + lo) / 9007199254740992 end
    end
  end
  C.ddp_generator_set_state(h, seed, off + blocks)
  return res
end

--- draw.uniform(gen, a, b) -> one number uniform in [a, b) (a, b default 0, 1).
function M.uniform(gen, a, b)
  a, b = a or 0, b or 1
  return a + (b - a) * M.uniforms(gen, 1)[1]
end

--- draw.randint(gen, lo, hi) -> an integer uniform in lo .. hi (inclusive, hi >= lo).
function M.randint(gen, lo, hi)
  return lo + math.min(hi - lo, math.floor(M.uniforms(gen, 1)[1] * (hi - lo + 1)))
end

return M
