--- ddplua.futures: Future, the value of an asynchronous computation, as torch.futures.Future.
--
--   local fut = dist.all_reduce(t, {async_op = true}):get_future()
--   local fut2 = fut:then_(function(f) return f:value()[1]:div_(world) end)
--   local t2 = fut2:wait()               -- the divided tensor
--
-- `then` is a Lua keyword: call it as fut:then_(fn) (fut["then"](fut, fn) works too).
-- There is one thread here, so a Future completes when something waits for it: a Future
-- made from a collective's Work completes when that Work finished; a callback given to
-- then_ runs once, when the value of the Future it returned is first asked for (wait or
-- value) and its parent has completed; a Future from Future.new() completes with
-- set_result. PyTorch runs callbacks as soon as the parent completes, on its own thread;
-- the values are the same for callbacks that only use their argument.
-- Errors: a failure (of the collective, or raised by a callback) is kept and raised again
-- by every wait/value of that Future and of the Futures chained after it.
local M = {}

local Future = {}
Future.__index = Future
M.Future = Future

local PENDING, DONE, FAILED = 0, 1, 2

local function raise(msg) error(msg, 3) end

--- Future.new() (also futures.Future()) -> a Future nobody has completed yet: complete it
-- with fut:set_result(value) (torch.futures.Future() with set_result).
function Future.new()
  return setmetatable({ _state = PENDING }, Future)
end

setmetatable(Future, { __call = function() return Future.new() end })

--- futures.completed(value) -> a Future already completed with value.
function M.completed(value)
  return setmetatable({ _state = DONE, _value = value }, Future)
end

--- futures.from_work(work, value) -> a Future that completes when the ddplua.distributed
-- Work `work` finished, with `value` (the collective's output tensors, a list as PyTorch's
-- Work.get_future: fut:value()[1] is the first tensor). Work:get_future() calls this.
function M.from_work(work, value)
  return setmetatable({ _state = PENDING, _work = work, _value = value }, Future)
end

--- futures.is_future(x) -> true for a Future.
function M.is_future(x) return getmetatable(x) == Future end

--- fut:set_result(value): complete the Future with value. Raises when it is already
-- completed, or when it waits for a collective or a parent (those complete themselves).
function Future:set_result(value)
  if self._state ~= PENDING then raise("Future: set_result on a future that is already completed") end
  if self._work or self._parent then raise("Future: set_result on a future that completes by itself") end
  self._state, self._value = DONE, value
end

--- fut:set_exception(err): complete the Future with a failure (err: its message); wait and
-- value raise it.
function Future:set_exception(err)
  if self._state ~= PENDING then raise("Future: set_exception on a future that is already completed") end
  self._state, self._err = FAILED, tostring(err)
end

--- fut:done() -> true when the Future has completed (a value or a failure), or can
-- complete without waiting (its collective has finished). Never blocks.
function Future:done()
  if self._state ~= PENDING then return true end
  if self._work then return self._work:is_completed() end
  if self._parent then return self._parent:done() end
  return false
end

-- Complete the Future from its source, waiting as needed (timeout: seconds, for a Work).
local function resolve(self, timeout)
  if self._state ~= PENDING then return end
  if self._work then
    local ok, err = pcall(self._work.wait, self._work, timeout)
    if ok then self._state = DONE else self._state, self._err = FAILED, tostring(err) end
    self._work = nil
  elseif self._parent then
    local parent, fn = self._parent, self._fn
    resolve(parent, timeout)
    if parent._state == FAILED then
      self._state, self._err = FAILED, parent._err
    else
      local ok, v = pcall(fn, parent)
      if ok then self._state, self._value = DONE, v else self._state, self._err = FAILED, tostring(v) end
    end
    self._parent, self._fn = nil, nil
  else
    raise("Future: wait() on a future that nothing completes (call set_result first)")
  end
end

--- fut:wait([timeout]) -> the value, once the Future completed (timeout: seconds for a
-- collective, default its group's). Raises the failure.
function Future:wait(timeout)
  resolve(self, timeout)
  if self._state == FAILED then error(self._err, 2) end
  return self._value
end

--- fut:value() -> the value of a completed Future (as wait, which it calls once done()).
-- Raises "Future: value() called before the future completed" when it has not.
function Future:value()
  if not self:done() then raise("Future: value() called before the future completed (call wait())") end
  resolve(self)
  if self._state == FAILED then error(self._err, 2) end
  return self._value
end

--- fut:then_(fn) (PyTorch's then) -> a new Future whose value is fn(fut), computed after
-- fut completed; a failure of fut or of fn fails it. fn: function(future) -> value.
function Future:then_(fn)
  if type(fn) ~= "function" then raise("Future.then: callback must be a function, got " .. type(fn)) end
  return setmetatable({ _state = PENDING, _parent = self, _fn = fn }, Future)
end
Future["then"] = Future.then_

function Future:__tostring()
  local s = self._state == DONE and "done" or self._state == FAILED and "failed" or
            (self:done() and "ready" or "pending")
  return "Future(" .. s .. ")"
end

return M
