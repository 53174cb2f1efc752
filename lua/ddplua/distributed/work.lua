--- ddplua.distributed.work: the handle of an asynchronous collective (PyTorch's Work),
-- returned by the collectives when called with {async_op = true}.
local lib = require "ddplua.lib"
local C = lib.C

local Work = {}
Work.__index = Work

--- Work.new(handle, keep, after, outputs): wrap a ddp_work* (owned); `keep` holds Lua values
-- (output lists) alive until the work is collected, and `after` (optional) runs once after a
-- successful wait (copying results into Lua-side outputs); `outputs` (optional): the list of
-- the collective's output tensors, the value of work:get_future().
function Work.new(handle, keep, after, outputs)
  return setmetatable({ handle = lib.ffi.gc(handle, C.ddp_work_free), keep = keep, after = after,
                        outputs = outputs }, Work)
end

--- work:get_future() -> a ddplua.futures Future that completes when the collective finished;
-- its value is the list of the collective's output tensors (PyTorch's Work.get_future:
-- fut:value()[1] is the all-reduced tensor), an empty list for collectives with none.
function Work:get_future()
  return require("ddplua.futures").from_work(self, self.outputs or {})
end

--- work:wait(timeout) -> true once the collective finished on this rank. timeout: seconds
-- (default: the group's timeout). Raises the collective's failure (a dead peer, a timeout:
-- the message names the collective and the ranks), or a timeout error when the wait ran out
-- first (the work goes on; wait may be called again).
-- nccl backend (as PyTorch): the current CUDA stream waits for the collective and wait
-- returns at once; work done on that stream afterwards sees the result. Use
-- work:synchronize() to block the host.
function Work:wait(timeout)
  lib.check(C.ddp_work_wait(self.handle, timeout or 0))
  if self.after then
    local after = self.after
    self.after = nil
    after()
  end
  return true
end

--- work:synchronize(timeout) -> true once the collective finished, the host blocking (nccl:
-- polls the communicator, so a dead peer or the timeout raises instead of hanging; gloo: the
-- same as wait).
function Work:synchronize(timeout)
  lib.check(C.ddp_work_synchronize(self.handle, timeout or 0))
  if self.after then
    local after = self.after
    self.after = nil
    after()
  end
  return true
end

--- work:is_completed() -> true when the collective finished (successfully or not). Never
-- blocks.
function Work:is_completed()
  return C.ddp_work_is_completed(self.handle) ~= 0
end

return Work
