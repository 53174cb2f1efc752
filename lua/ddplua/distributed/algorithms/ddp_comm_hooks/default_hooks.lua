--- ddplua.distributed.algorithms.ddp_comm_hooks.default_hooks: the default communication
-- hooks, as torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py.
--
--   local default = dl.distributed.algorithms.ddp_comm_hooks.default_hooks
--   ddp:register_comm_hook(nil, default.fp16_compress_hook)   -- state: a process group or nil
--
-- Registered with register_comm_hook these run in C inside the reducer, without returning to
-- Lua per bucket (ddplua/comm_hook.h, Note [comm hooks]); each is also a plain Lua hook
-- function (state, bucket) -> Future doing the same math, usable inside a hook of your own.
-- state: the process group to communicate over (nil: the DDP module's group when registered,
-- the default group when called from Lua).
local builtin = require "ddplua.distributed.algorithms.ddp_comm_hooks.builtin"
local futures = require "ddplua.futures"
local lib = require "ddplua.lib"

local M = {}

local function dist() return require "ddplua.distributed.distributed_c10d" end

local function first(v) return type(v) == "table" and v[1] or v end

--- _allreduce_fut(process_group, tensor) -> Future of tensor: tensor /= world size, then an
-- asynchronous all-reduce (SUM) of it (PyTorch's _allreduce_fut).
function M._allreduce_fut(process_group, tensor)
  local d = dist()
  tensor:div_(d.get_world_size(process_group))
  return d.all_reduce(tensor, { group = process_group, async_op = true }):get_future()
    :then_(function(fut) return fut:value()[1] end)
end

--- allreduce_hook(process_group, bucket) -> Future of the bucket buffer divided by the world
-- size and summed over the ranks: the average, as DDP without a hook. In C the same:
-- bitwise equal to no hook when the world size is a power of two (Note [comm hooks]).
M.allreduce_hook = builtin.mark(function(process_group, bucket)
  return M._allreduce_fut(process_group, bucket:buffer())
end, { kind = "ALLREDUCE" })

local function compress_hook(dtype)
  return function(process_group, bucket)
    local d = dist()
    local buffer = bucket:buffer()
    local compressed = buffer:to(dtype):div_(d.get_world_size(process_group))
    if compressed == buffer then compressed = compressed:clone() end
    return d.all_reduce(compressed, { group = process_group, async_op = true }):get_future()
      :then_(function(fut)
        buffer:copy_(fut:value()[1]) -- decompress in place
        return buffer
      end)
  end
end

--- fp16_compress_hook(process_group, bucket) -> Future of the bucket: cast to f16, divided by
-- the world size (in f16), all-reduced in f16 (half the bytes of f32 on the wire), cast back.
M.fp16_compress_hook = builtin.mark(compress_hook("f16"), { kind = "FP16_COMPRESS" })

--- bf16_compress_hook(process_group, bucket): as fp16_compress_hook with bf16.
M.bf16_compress_hook = builtin.mark(compress_hook("bf16"), { kind = "BF16_COMPRESS" })

local function compress_wrapper(dtype, name)
  return function(hook)
    if type(hook) ~= "function" then
      lib.raise(name .. ": hook must be a communication hook function, got " .. type(hook))
    end
    local function wrapped(state, bucket)
      local buffer = bucket:buffer()
      bucket:set_buffer(buffer:to(dtype))
      local fut = hook(state, bucket)
      if not futures.is_future(fut) then
        lib.raise(name .. ": the wrapped hook must return a Future, got " .. type(fut))
      end
      bucket:set_buffer(buffer)
      return fut:then_(function(f)
        buffer:copy_(first(f:value())) -- decompress in place
        return buffer
      end)
    end
    local inner = builtin.describe(hook)
    if inner and not inner.wrap then
      builtin.mark(wrapped, { kind = inner.kind, wrap = dtype })
    end
    return wrapped
  end
end

--- fp16_compress_wrapper(hook) -> a hook that casts the bucket to f16, runs `hook` on the
-- cast copy and casts its result back into the bucket. Around a built-in hook
-- (allreduce_hook, powerSGD_hook, ...) the result is again a built-in that runs in C.
M.fp16_compress_wrapper = compress_wrapper("f16", "fp16_compress_wrapper")

--- bf16_compress_wrapper(hook): as fp16_compress_wrapper with bf16.
M.bf16_compress_wrapper = compress_wrapper("bf16", "bf16_compress_wrapper")

return M
