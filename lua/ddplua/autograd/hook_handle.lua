--- ddplua.autograd.hook_handle: what register_hook and register_post_accumulate_grad_hook
-- return: handle:remove() takes the hook off its tensor (PyTorch's RemovableHandle).
local lib = require "ddplua.lib"
local engine = require "ddplua.autograd.engine"
local C = lib.C

local M = {}
M.__index = M

--- A handle for hook `id` on tensor t (the handle keeps t alive until removed).
function M.new(t, id)
  return setmetatable({ tensor = t, id = id }, M)
end

--- Remove the hook (a second call does nothing).
function M:remove()
  if not self.tensor then return end
  C.ddp_tensor_remove_hook(self.tensor, self.id) -- fails only when already gone with its node
  engine.remove_hook(self.id)
  self.tensor = nil
end

return M
