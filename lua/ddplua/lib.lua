--- ddplua.lib: the FFI boundary. Loads build/libddplua.so with the cdef generated from
-- runtime/include/ddplua.h, and holds the helpers every front-end module uses to call C:
-- status checks that raise at the user's line, handle wrapping (Note [handle registry]) and collector
-- pressure, shape buffers and dimension/dtype conversion.
local ffi = require "ffi"
local jit = require "jit"

local M = {}

-- Where this file lives: lua/ddplua/lib.lua; the project root is two levels up.
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
local module_dir = here .. "/"
local root = here .. "/../.."

--- Path of the runtime library: $DDPLUA_LIB, else <root>/build/libddplua.so. The cdef
-- text is read from beside it (<dir>/lua/ddplua/cdef.lua), so both always come from the
-- same build.
M.lib_path = os.getenv("DDPLUA_LIB") or (root .. "/build/libddplua.so")
local build_dir = M.lib_path:match("^(.*)/[^/]*$") or "."
local cdef_chunk, cdef_err = loadfile(build_dir .. "/lua/ddplua/cdef.lua")
if not cdef_chunk then
  error("ddplua: cannot read the FFI declarations (" .. tostring(cdef_err) .. "); run `make` first", 0)
end
ffi.cdef(cdef_chunk())
local C = ffi.load(M.lib_path)
M.C = C
M.ffi = ffi
M.root = root

--- The first stack level (as error() counts, from the function calling raise_at) whose
-- code is not in lua/ddplua/ and not C: the user's line.
local function user_level()
  local level = 3
  while true do
    local info = debug.getinfo(level, "S")
    if not info then return 2 end
    local src = info.source
    if src:sub(1, 1) == "@" and src:sub(2, #module_dir + 1) ~= module_dir then return level - 1 end
    if src:sub(1, 1) ~= "@" and src ~= "=[C]" then return level - 1 end
    level = level + 1
  end
end

--- Raise `msg` as a Lua error at the user's line (the first caller outside ddplua).
function M.raise(msg)
  error(msg, user_level())
end

--- Raise the C error message when status ~= 0 (the C side names op, argument and shapes).
function M.check(status)
  if status ~= 0 then
    error(ffi.string(C.ddp_last_error()), user_level())
  end
end

-- Note [collector pressure] (DESIGN.md: LuaJIT does not see C memory): when the runtime's
-- live bytes pass `threshold`, run a full collection and set the next threshold to what is
-- still live after it plus a headroom: the largest of 8 MiB, 8 times the Lua heap, and a
-- quarter of what is live. The headroom is the dead tensor memory allowed to wait for the
-- collector. A full collection costs about 0.5 ns per Lua heap byte, so 8 heaps of headroom
-- keep its cost under ~0.06 ns per byte it frees, below touching that memory once; a
-- quarter of the live bytes keeps a forward pass, whose activations stay live, from
-- collecting for nothing every few MiB. The rule was "as much again as is live (at least
-- 64 MiB)": with Fashion-MNIST's 55 MB held as a tensor, 55-64 MB of dead activations
-- waited for each collection, so every step's tensors came from memory no cache held.
-- Measured (bench/train.lua, 200 steps, 2 threads, alternating, 3 rounds): MLP 93-96k ->
-- 111-123k samples/s, CNN 8.5-8.8k -> 9.2-9.6k, peak RSS 129 -> 75 MiB (MLP) and 139 ->
-- 91 MiB (CNN).
local MIN_HEADROOM, HEAP_FACTOR, LIVE_DIVISOR = 8 * 1024 * 1024, 8, 4
local threshold = MIN_HEADROOM

-- collectgarbage("collect"), seen by a recording profiler as "ddplua: collect garbage"
-- (category memory, Note [profiler events]): the tensors it frees are the step's work.
local function collect()
  if C.ddp_profiler_enabled() ~= 0 then
    C.ddp_profiler_range_push("ddplua: collect garbage", C.DDP_PROF_MEMORY)
    collectgarbage("collect")
    C.ddp_profiler_range_pop()
  else
    collectgarbage("collect")
  end
end

local function collect_if_needed()
  local live = tonumber(C.ddp_memory_live_bytes())
  if live > threshold then
    collect()
    live = tonumber(C.ddp_memory_live_bytes())
    threshold = live + math.max(MIN_HEADROOM, collectgarbage("count") * 1024 * HEAP_FACTOR,
                                live / LIVE_DIVISOR)
  end
end
M.collect_if_needed = collect_if_needed
--- collect(): a full collection now; every tensor no handle reaches is released when it
-- returns (Note [handle registry]). For the library (before a fork, Note [dataloader
-- workers]); a script never needs it.
M.collect = collect

-- Note [traces keep closures]: LuaJIT compiles a hot loop into a trace specialised to the
-- functions the loop calls. A closure called there while it is the only closure its
-- prototype has made becomes a constant of the trace, and so do its upvalues that are
-- never assigned (LuaJIT's rec_call_specialize and upvalue constification; from the second
-- closure of a prototype on, traces check the prototype instead). A trace lives until it
-- is flushed, so what such a closure reached stayed live after the script dropped it: a
-- fresh process that iterated one model's named_parameters() in a loop kept the whole
-- model (41,600 bytes of 200 Linear layers) after it was dropped and collected; the first
-- epoch of a DataLoader kept its dataset (1,056,000 bytes); the first of three FSDP models
-- built and dropped in a row stayed (spec/distributed/fsdp_spec.lua failed about one run in
-- ten, when the loop that built it was compiled while its iterator was the only one). So:
--   * the library's iterators are tables with a shared __call (lib.iterator), never
--     per-call closures: a trace keeps the shared function, which holds nothing of a model
--     or a dataset;
--   * dl.empty_cache() and dl.cuda.empty_cache() flush the compiled traces before they
--     collect (release_unreachable), so `model = nil; dl.empty_cache()` (PyTorch's `del
--     model; torch.cuda.empty_cache()`) frees what a script's own closures left in traces.
--     The loops that run again are compiled again: in an MLP training loop (batch 64,
--     784-128-10, one thread) that called dl.empty_cache() after every step, a step took
--     0.78 ms against 0.70 ms with a collection alone (0.41 ms without either).

--- release_unreachable(): flush LuaJIT's compiled traces, then collect: every tensor the
-- script no longer reaches is released when it returns, those that only a trace's
-- constants reached included (Note [traces keep closures]). For dl.empty_cache and
-- dl.cuda.empty_cache.
function M.release_unreachable()
  jit.flush()
  collect()
end

--- iterator(step) -> make: make(state) returns the table `state` made callable, each call
-- returning step(state): an iterator for a generic for (`for a, b in make{...} do`; step
-- returns nil at the end) or to call by hand (`it()`). step is one function for every
-- iterator of its kind, made once when its module loads, which keeps everything of an
-- iterator in `state` and nothing in upvalues that a compiled trace could keep (Note
-- [traces keep closures]).
function M.iterator(step)
  local mt = { __call = step }
  return function(state) return setmetatable(state, mt) end
end

local list_pairs = M.iterator(function(it)
  local i = it.i + 1
  local k = it.keys[i]
  if k == nil then return nil end
  it.i = i
  return k, it.values[i]
end)

--- list_iterator(keys, values) -> an iterator (M.iterator) of keys[i], values[i] for
-- i = 1, 2, ... until keys[i] is nil (values[i] may be nil).
function M.list_iterator(keys, values)
  return list_pairs { keys = keys, values = values, i = 0 }
end

-- Note [step lifetimes] (DESIGN.md "Tensors": tensor lifetimes are not the script's
-- business). A tensor the script can no longer reach is held by its handle until a
-- collection finds the handle (Note [handle registry]); nothing short of a collection can
-- tell a dropped handle from one the script keeps, and a handle the script keeps must stay
-- readable. So the library collects at the points of a training or evaluation loop where
-- the step's temporaries have just become unreachable, and only when they are worth it:
--   * the start of every outermost backward (ddplua.autograd.engine): the forward's
--     intermediates that the graph did not save (a convolution's output once its ReLU ran,
--     every handle a module's forward dropped) are freed before the backward allocates the
--     gradients; what the graph saved goes node by node as the walk runs each node's
--     backward (the C engine frees a node's saved tensors right after it, retain_graph
--     false); so when backward returns, the runtime holds the tensors the script can
--     reach (and, when the step allocated less than the bound below, what it dropped),
--     and nothing of the graph's but its small node blocks (not tensor bytes);
--   * each batch a DataLoader hands out, and the end of dl.no_grad(fn): the temporaries
--     of the previous batch of an evaluation loop (no backward there), and those of fn;
--   * dl.empty_cache() collects before it returns the cached blocks (as dl.cuda.empty_cache).
-- "Worth it": the runtime allocated more than STEP_BYTES (8 MiB) and STEP_HEAPS (8) times
-- the Lua heap (as the last collection here left it) since the mark
-- (ddp_memory_allocated_bytes counts every allocation, freed or not, the loader thread's
-- batches included): a collection can newly free at most what was allocated since the last
-- one. The mark moves at each collection made here and at the end of every outermost
-- backward: the walk's own allocations (the gradients) are freed by the engine itself or
-- kept as .grad, and counting them would collect a second time in each step for nothing.
-- (The growth of the live bytes is no measure: a collection that collector pressure runs in
-- the middle of a forward frees the previous step's dead tensors, and the live bytes then
-- hide this forward's.) A full collection of bench/train.lua's ~0.8 MB Lua heap took 0.26
-- ms with the MLP and 0.58 ms with the CNN (which frees the step's tensors in it); 8 heaps
-- of tensors per collection is Note [collector pressure]'s rate. The CNN's forward (~12 MB
-- at batch 64, ~17 ms a step) collects once a step, as train.lua did by hand before (its
-- Note [step memory], now gone); the MLP's step (~0.35 MB with its batch, ~0.75 ms)
-- every ~20 steps, where a collection in every step would cost a third of the step (a bound
-- of 4 MiB and 4 heaps, every ~12 steps, cost it ~3% of its CPU in bench/RESULTS.md's
-- paired runs). So at each of these points the tensors nobody can reach hold at most
-- max(8 MiB, 8 heaps), plus what the script still reached at the last collection and
-- dropped since (the previous step's outputs: freed by the next collection): a bound that
-- depends neither on the collector's pacing nor on how much the script keeps live (Note
-- [collector pressure]'s headroom grows with that: ~14 MB with Fashion-MNIST's 55 MB in
-- memory), which stays the backstop between these points. Nothing here frees a tensor that
-- a handle still reaches. CUDA memory is not counted (the CPU allocator's bytes only).
local STEP_BYTES, STEP_HEAPS = 8 * 1024 * 1024, 8
local step_mark = 0 -- ddp_memory_allocated_bytes() at the last mark
local step_heap = 0 -- the Lua heap's bytes after the last collection made here (its count
                    -- before one includes the garbage, which would raise the bound)

--- Release what the previous step left unreachable when it is worth a collection (Note
-- [step lifetimes]); called by the library at step boundaries, never needed in scripts.
function M.release_step()
  local since = tonumber(C.ddp_memory_allocated_bytes()) - step_mark
  if since > STEP_BYTES and since > step_heap * STEP_HEAPS then
    collect()
    step_mark = tonumber(C.ddp_memory_allocated_bytes())
    step_heap = collectgarbage("count") * 1024
  end
end

--- Move the mark of Note [step lifetimes] to now without collecting (the end of an
-- outermost backward: what its walk allocated, the engine frees or keeps as .grad).
function M.step_mark()
  step_mark = tonumber(C.ddp_memory_allocated_bytes())
end

-- Note [handle registry]: a tensor handle owns one reference, released once the collector
-- finds the handle unreachable. LuaJIT's per-object finaliser (ffi.gc) costs about 250 ns
-- per handle here (an insert into its finaliser table, then one protected call per object,
-- which also aborts any trace being recorded), more than the C side of a small op. So the
-- handles are registered instead, and released in batches:
--   slots[i]  (a weak-valued table) the handle of slot i, or false while slot i is free;
--   owned[i]  (C memory) the reference that handle owns;
--   free_stack[0 .. n_free - 1]  (C memory) the free slot numbers.
-- The collector clears slots[i] in the cycle that finds its handle unreachable. Each cycle
-- also collects one sentinel userdata, whose __gc (run in that cycle's finaliser phase,
-- like ffi.gc's finalisers) sweeps: every slot in 1 .. high whose value became nil has its
-- reference released (one C call for all, ddp_tensor_release_indexed) and becomes free;
-- then a new sentinel is made for the next cycle. So tensors are released in the same
-- cycle as ffi.gc released them, and collectgarbage("collect") still returns with every
-- unreachable tensor freed. At lua_close the closer (a userdata this module keeps alive,
-- finalised only then) releases what is left, as ffi.gc's finalisers did.
-- A collection step, and so a sweep, may run at any allocation: register() writes a new
-- slot's handle before `high` covers the slot, and a popped free slot still reads false
-- until its handle is stored, so a sweep never sees a half-made entry.
--
-- Note [collector pacing]: LuaJIT starts a cycle when its own heap has doubled, and a handle
-- is a few dozen bytes of that heap holding most of a kilobyte of C memory (header,
-- storage, graph node). Left alone, a loop of small ops on a small Lua heap ran 140 000
-- ops per cycle: 40-70 MB of dead tensors waiting, released from DRAM long after they were
-- made, which doubled the cost of an op. So wrap() also runs a full collection once more
-- than `sweep_every` handles were made since the last sweep: 2048, or one per 128 bytes of
-- Lua heap when that is more. A full collection costs about 0.5 ns per heap byte here, so
-- this adds at most ~60 ns per handle, and a small heap keeps a few hundred KB of dead
-- tensors, which stay in cache and fit the block cache (Note [small block cache]).
local MIN_SWEEP_EVERY = 2048
local made_since_sweep, sweep_every = 0, MIN_SWEEP_EVERY
local slots = setmetatable({}, { __mode = "v" })
local owned, free_stack, dead  -- ddp_tensor*[cap + 1], int32_t[cap + 1], int32_t[cap + 1]
local cap, high, n_free = 0, 0, 0
local closed = false
local ptr_array = ffi.typeof("ddp_tensor*[?]")
local int_array = ffi.typeof("int32_t[?]")

-- Release the references of the slots whose handles were collected (all in-use slots
-- when `all`, at lua_close) and put those slots on the free stack.
local function sweep(all)
  local n = 0
  for i = 1, high do
    local h = slots[i]
    if h == nil or (all and h ~= false) then
      slots[i] = false
      dead[n] = i
      n = n + 1
      free_stack[n_free] = i
      n_free = n_free + 1
    end
  end
  if n > 0 then
    local profiled = C.ddp_profiler_enabled() ~= 0 -- Note [profiler events]: memory
    if profiled then C.ddp_profiler_range_push("ddplua: release tensors", C.DDP_PROF_MEMORY) end
    C.ddp_tensor_release_indexed(owned, dead, n)
    if profiled then C.ddp_profiler_range_pop() end
  end
  made_since_sweep = 0
  sweep_every = math.max(MIN_SWEEP_EVERY, collectgarbage("count") * (1024 / 128))
end

local function arm_sentinel()
  local sentinel = newproxy(true)
  getmetatable(sentinel).__gc = function()
    if closed then return end
    arm_sentinel()
    sweep(false)
  end
end

local closer = newproxy(true)
getmetatable(closer).__gc = function()
  closed = true
  sweep(true)
end
M._handle_registry_closer = closer -- keeps it reachable until lua_close

-- Room for twice as many slots (all arrays keep their entries).
local function grow()
  local new_cap = cap == 0 and 1024 or 2 * cap
  local o, f, d = ptr_array(new_cap + 1), int_array(new_cap + 1), int_array(new_cap + 1)
  -- nothing allocates from here on, so no sweep runs between the copies and the switch
  if cap > 0 then
    ffi.copy(o, owned, (cap + 1) * ffi.sizeof("ddp_tensor*"))
    ffi.copy(f, free_stack, n_free * 4)
  end
  owned, free_stack, dead, cap = o, f, d, new_cap
end
grow()
arm_sentinel()

-- Register handle h (a new reference) so that its reference is released once h is
-- unreachable.
local function register(h)
  if n_free > 0 then
    local i = free_stack[n_free - 1]
    n_free = n_free - 1
    owned[i] = h
    slots[i] = h
  else
    if high == cap then grow() end
    local i = high + 1
    owned[i] = h
    slots[i] = h
    high = i
  end
  return h
end

--- Wrap a new reference (ddp_tensor*) as a Lua handle that releases it when collected
-- (Note [handle registry]). Returns nil for NULL.
function M.wrap(ptr)
  if ptr == nil then return nil end
  made_since_sweep = made_since_sweep + 1
  if made_since_sweep > sweep_every then
    collect() -- Note [collector pacing]; its sweep resets the count
  else
    collect_if_needed()
  end
  return register(ptr)
end

--- The out-parameter box every call returning a tensor uses (`ddp_tensor*[1]`). Read
-- box[0] right after the call: the next call overwrites it.
M.box = ffi.new("ddp_tensor*[1]")

--- Call `fn(box, ...)`, check its status and return the wrapped result tensor.
function M.call(fn, ...)
  M.check(fn(M.box, ...))
  return M.wrap(M.box[0])
end

local shape_buf = ffi.new("int64_t[8]")
local shape_buf2 = ffi.new("int64_t[8]")

-- A number as the user typed it: integers in full (2^63 prints 9223372036854775808, not
-- 9.2233720368548e+18), anything else as tostring does.
local function show_number(v)
  if type(v) == "number" and v == math.floor(v) and v > -math.huge and v < math.huge then
    return ("%.0f"):format(v)
  end
  return tostring(v)
end

--- Check one size (or position, count) given to `op` as argument `what` before it becomes
-- an int64_t: it must be a Lua number holding an integer in [-2^63, 2^63) (what an int64_t
-- holds; a double holds no integer between 2^63 - 1024 and 2^63). Non-integers, inf, NaN
-- and larger magnitudes raise "op: what must be an integer that fits in 64 bits, got inf"
-- at the user's line (the FFI would convert them to an unrelated int64_t). Returns v.
function M.size(v, op, what)
  if type(v) ~= "number" or v ~= math.floor(v) or v >= 2 ^ 63 or v < -2 ^ 63 then
    M.raise(("%s: %s must be an integer that fits in 64 bits, got %s"):format(
      op or "shape", what, type(v) == "number" and show_number(v) or type(v) .. " " .. tostring(v)))
  end
  return v
end

--- Convert a Lua shape ({2, 3}) to (int64_t[8] buffer, ndim). `which` = 2 uses a second
-- buffer (for calls taking two shapes). `op` names the function for errors (default
-- "shape"). Each entry must pass M.size; sizes may still be negative (-1 "inferred" for
-- view): C checks the shape as a whole. Raises naming op, the entry and the value.
function M.shape(tbl, which, op)
  local buf = which == 2 and shape_buf2 or shape_buf
  if type(tbl) ~= "table" then
    M.raise((op and op .. ": " or "") .. "expected a shape table such as {2, 3}, got " .. type(tbl))
  end
  local n = #tbl
  if n > 8 then M.raise((op and op .. ": " or "") .. "a shape has at most 8 dimensions, got " .. n) end
  for i = 1, n do buf[i - 1] = M.size(tbl[i], op, "shape entry " .. i) end
  return buf, n
end

--- M.shape for a function `op` making a tensor of that shape and dtype (an enum number:
-- zeros, randn, ...): also checks the shape as a whole (sizes >= 0, element and byte
-- counts within 64 bits: ddp_shape_check), so the error names `op` rather than the
-- internal call that allocates. An unknown dtype is left for that call to report.
function M.new_shape(tbl, op, dtype)
  local buf, n = M.shape(tbl, nil, op)
  local known = dtype >= 0 and dtype < C.DDP_DTYPE_COUNT
  M.check(C.ddp_shape_check(op, n, buf, known and C.ddp_dtype_size(dtype) or 0))
  return buf, n
end

--- Check that `v`, given to `op` as argument `what` (a path, a tensor name, ...), is a
-- string C can take whole, and return it. C strings end at the first NUL byte, so
-- "a\0b" would silently name "a" (a checkpoint written to a truncated path, say): every
-- function passing a caller's string to C (or to io.open, which is C's fopen) checks it
-- here first. Raises at the user's line "op: what must be a string, got number" or
-- "op: what contains a NUL byte at byte 2 (\"a\0b\"): C would see only \"a\"".
function M.c_string(v, op, what)
  if type(v) ~= "string" then
    M.raise(("%s: %s must be a string, got %s"):format(op, what, type(v)))
  end
  local at = v:find("\0", 1, true)
  if at then
    M.raise(("%s: %s contains a NUL byte at byte %d (%q): C would see only %q"):format(
      op, what, at, v, v:sub(1, at - 1)))
  end
  return v
end

--- M.c_string for a file or folder path given to `op` as argument `what` (default "path").
function M.path(v, op, what)
  return M.c_string(v, op, what or "path")
end

--- Lua dimension (1-based; negative counts from the end, -1 the last) to C's 0-based
-- form (negative passed through: C normalises and checks the range).
function M.dim(d, what)
  if type(d) ~= "number" or d ~= math.floor(d) then
    M.raise((what or "dim") .. " must be an integer, got " .. tostring(d))
  end
  if d == 0 then M.raise((what or "dim") .. " 0 is not valid: dimensions count from 1 (-1 is the last)") end
  return d > 0 and d - 1 or d
end

local dtype_cache = {}
--- dtype name ("f32", "float32", "i64", ...) or enum number to the enum number; nil gives
-- `default`. Raises naming the bad value.
function M.dtype(d, default)
  if d == nil then return default end
  if type(d) == "number" then return d end
  local v = dtype_cache[d]
  if v then return v end
  v = C.ddp_dtype_from_name(tostring(d))
  if v < 0 then M.raise("unknown dtype '" .. tostring(d) .. "' (f32, f64, f16, bf16, i64, i32, u8, bool)") end
  dtype_cache[d] = v
  return v
end

--- Name of a dtype enum value ("f32", ...).
function M.dtype_name(v)
  return ffi.string(C.ddp_dtype_name(v))
end

--- Shape of tensor t as a Lua table of sizes.
function M.size_table(t)
  local n = C.ddp_tensor_dim(t)
  local shape = C.ddp_tensor_shape(t)
  local s = {}
  for i = 1, n do s[i] = tonumber(shape[i - 1]) end
  return s
end

return M
