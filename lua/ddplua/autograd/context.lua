--- ddplua.autograd.context: the `ctx` a Lua autograd.Function's forward and backward get
-- (PyTorch's FunctionCtx). Any field may be set on it to pass values from forward to
-- backward; the tensors themselves go through save_for_backward, so the runtime keeps
-- them (detached, version checked: a saved tensor written in place since makes backward
-- raise naming the Function) and frees them after backward unless retain_graph.
--
--   ctx:save_for_backward(a, b)      in forward; ctx.saved_tensors = {a, b} in backward
--   ctx:mark_non_differentiable(o)   in forward: output o gets no history; backward gets
--                                    zeros for it
--   ctx.needs_input_grad[i]          whether forward argument i is a tensor requiring grad
local M = {}
M.__index = M

--- A new context; needs_input_grad as computed by Function.apply.
function M.new(needs_input_grad)
  return setmetatable({ needs_input_grad = needs_input_grad, _to_save = nil, _non_diff = {},
    _n_save = 0 }, M)
end

--- Save tensors (nil allowed) for backward, where ctx.saved_tensors lists them in order.
-- Call it once, in forward.
function M:save_for_backward(...)
  self._to_save = { ... }
  self._n_save = select("#", ...)
end

--- Mark outputs of forward as not differentiable: they get no history.
function M:mark_non_differentiable(...)
  for i = 1, select("#", ...) do self._non_diff[#self._non_diff + 1] = (select(i, ...)) end
end

--- Whether tensor t was marked non-differentiable.
function M:_is_non_differentiable(t)
  for _, o in ipairs(self._non_diff) do
    if o == t then return true end
  end
  return false
end

return M
