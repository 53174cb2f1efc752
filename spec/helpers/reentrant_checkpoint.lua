--- reentrant_checkpoint: PyTorch's reentrant CheckpointFunction (torch/utils/checkpoint.py)
-- as a ddplua autograd Function, for the specs of reentrant backward (Note [reentrant
-- backward] in runtime/autograd/engine.c). Its forward runs the segment without grad; its
-- backward recomputes the segment with grad and walks that inner graph, so the parameters
-- inside get their gradients (and their hooks fire) inside the outer backward.
--
--   local Ckpt = require "reentrant_checkpoint"()     -- in a spec (spec/helpers on the path)
--   local Ckpt = require "spec.helpers.reentrant_checkpoint"()  -- in a rank script (cwd = root)
--   local y = Ckpt.apply(fn, x)                         -- fn(x) with x (any shape) -> a tensor
local dl = require "ddplua"

--- A new Function class (named name, default "Checkpoint") whose apply(fn, x) returns fn(x)
-- and whose backward recomputes fn on a detached x with grad; the gradient for fn is nil.
return function(name)
  local Ckpt = dl.autograd.Function:extend(name or "Checkpoint")
  function Ckpt.forward(ctx, fn, x)
    ctx.fn = fn
    ctx:save_for_backward(x)
    return fn(x)
  end
  function Ckpt.backward(ctx, g)
    local x = ctx.saved_tensors[1]:detach()
    x.requires_grad = true
    local y = dl.enable_grad(function() return ctx.fn(x) end)
    y:backward(g)
    return nil, x.grad
  end
  return Ckpt
end
