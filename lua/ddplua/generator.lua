--- ddplua.generator: a stream of random numbers (Philox 4x32-10 in C; see ddplua.h).
-- Each Generator is independent; nil where a generator is expected means the default one.
local lib = require "ddplua.lib"
local ffi, C = lib.ffi, lib.C

local Generator = {}
Generator.__index = Generator

local gen_box = ffi.new("ddp_generator*[1]")
local u64a, u64b = ffi.new("uint64_t[1]"), ffi.new("uint64_t[1]")

--- Generator(seed): a new generator (seed: integer >= 0, default 0).
local function new(seed)
  lib.check(C.ddp_generator_new(gen_box, seed or 0))
  local self = setmetatable({ handle = ffi.gc(gen_box[0], C.ddp_generator_free) }, Generator)
  return self
end

--- Reset to `seed` (offset 0); returns self.
function Generator:manual_seed(seed)
  C.ddp_generator_manual_seed(self.handle, seed)
  return self
end

--- The state as a table {seed = n, offset = n} (numbers; exact below 2^53).
function Generator:get_state()
  C.ddp_generator_get_state(self.handle, u64a, u64b)
  return { seed = tonumber(u64a[0]), offset = tonumber(u64b[0]) }
end

--- Restore a state from get_state().
function Generator:set_state(state)
  C.ddp_generator_set_state(self.handle, state.seed, state.offset)
  return self
end

local default = setmetatable({ handle = C.ddp_generator_default() }, Generator)

return { new = new, default = default, Generator = Generator }
