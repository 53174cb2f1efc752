--- ddplua.autograd.function: custom differentiable operations defined in Lua, as PyTorch's
-- torch.autograd.Function:
--
--   local Exp = dl.autograd.Function:extend("Exp")
--   function Exp.forward(ctx, x)          -- runs with grad mode off
--     local y = x:exp()
--     ctx:save_for_backward(y)
--     return y
--   end
--   function Exp.backward(ctx, grad)      -- one gradient per forward output
--     local y = ctx.saved_tensors[1]
--     return grad * y                     -- one gradient (or nil) per forward argument
--   end
--   local y = Exp.apply(x)                -- y.grad_fn == "ExpBackward"
--
-- forward may take any arguments (non-tensors get no gradient: backward returns nil in
-- their place) and return several values; at most one tensor output may be
-- differentiable (the others non-tensors or marked with ctx:mark_non_differentiable),
-- because a node of the runtime has one output. An output that is an input or shares its
-- storage is cloned first (the node needs a tensor of its own). backward runs inside the
-- backward walk with grad mode off (Note [Lua in backward] in ddplua.autograd.engine);
-- errors raised in it surface from backward() at the caller's line. create_graph is not
-- supported, so backward's own ops are not recorded.
local lib = require "ddplua.lib"
local engine = require "ddplua.autograd.engine"
local Context = require "ddplua.autograd.context"
local ffi, C = lib.ffi, lib.C
local check, wrap = lib.check, lib.wrap

local M = {}
M.__index = M

local function is_tensor(v) return type(v) == "cdata" and ffi.istype("ddp_tensor*", v) end

-- What a recorded node needs at backward time (kept by the engine under its id).
local Record = {}
Record.__index = Record

local saved_box = ffi.new("ddp_tensor*[1]")

--- record:run_backward(w, g): run the Function's backward for gradient g (a tensor of the
-- differentiable output's shape) of one recorded call and answer the backward walk w with
-- one gradient per tensor argument (nil where there is none). Raises what the user's
-- backward raises, when a returned gradient is not a tensor or nil, and what the walk's
-- check of each answer raises (ddp_backward_answer).
function Record:run_backward(w, g)
  local ctx = self.ctx
  local saved = {}
  for i = 1, self.n_saved do
    check(C.ddp_backward_saved(w, i - 1, saved_box))
    saved[i] = wrap(saved_box[0])
  end
  ctx.saved_tensors = saved
  local grads = {}
  local dl = require "ddplua.functions"
  for k = 1, self.n_outputs do
    local o = self.outputs[k]
    if k == self.differentiable then grads[k] = g
    elseif o then grads[k] = dl.zeros(o.shape, { dtype = o.dtype, device = o.device }) end
  end
  local res = { self.class.backward(ctx, unpack(grads, 1, self.n_outputs)) }
  ctx.saved_tensors = nil
  for j, pos in ipairs(self.tensor_args) do
    local gi = res[pos]
    if gi ~= nil then
      if not is_tensor(gi) then
        lib.raise(self.name .. ".backward: returned a " .. type(gi) .. " for argument " .. pos
          .. " (expected a tensor or nil)")
      end
      check(C.ddp_backward_answer(w, j - 1, gi))
    end
  end
end

--- Function:extend(name) -> a new Function class; define its .forward(ctx, ...) and
-- .backward(ctx, grad, ...) and call .apply(...). name (default "Function") names the
-- node: "<name>Backward".
function M:extend(name)
  local cls = setmetatable({ name = name or "Function" }, { __index = self })
  cls.apply = function(...) return M._apply(cls, ...) end
  return cls
end

--- Run cls.forward with a fresh ctx and record its node when gradients are needed.
function M._apply(cls, ...)
  if not rawget(cls, "forward") or not rawget(cls, "backward") then
    lib.raise("autograd.Function " .. tostring(cls.name) .. ": define both forward and backward")
  end
  local n_args = select("#", ...)
  local args = { ... }
  local tensor_args, needs = {}, {}
  local any = false
  for i = 1, n_args do
    local a = args[i]
    needs[i] = is_tensor(a) and C.ddp_tensor_requires_grad(a) ~= 0
    any = any or needs[i]
    if is_tensor(a) then tensor_args[#tensor_args + 1] = i end
  end
  local ctx = Context.new(needs)
  local prev = C.ddp_set_grad_enabled(0)
  local res = { pcall(cls.forward, ctx, ...) }
  C.ddp_set_grad_enabled(prev)
  if not res[1] then error(res[2], 0) end
  local n_out = table.maxn(res) - 1
  local outs = { unpack(res, 2, n_out + 1) }
  if not (any and prev ~= 0) then
    ctx._to_save = nil
    return unpack(outs, 1, n_out)
  end
  local differentiable
  for k = 1, n_out do
    local o = outs[k]
    if is_tensor(o) and not ctx:_is_non_differentiable(o) then
      if differentiable then
        lib.raise("autograd.Function " .. cls.name .. ": forward returned more than one "
          .. "differentiable tensor (outputs " .. differentiable .. " and " .. k .. "); mark the "
          .. "others with ctx:mark_non_differentiable")
      end
      differentiable = k
    end
  end
  if not differentiable then return unpack(outs, 1, n_out) end
  local out = outs[differentiable]
  for _, pos in ipairs(tensor_args) do -- the node needs an output of its own
    if C.ddp_tensor_shares_storage(out, args[pos]) ~= 0 then
      out = out:clone()
      outs[differentiable] = out
      break
    end
  end
  if C.ddp_tensor_is_leaf(out) == 0 or C.ddp_tensor_requires_grad(out) ~= 0 then
    out = out:detach():clone()
    outs[differentiable] = out
  end
  local n_t = #tensor_args
  local inputs = ffi.new("ddp_tensor*[?]", math.max(n_t, 1))
  for j, pos in ipairs(tensor_args) do inputs[j - 1] = args[pos] end
  local n_saved = ctx._n_save
  local saved = ffi.new("ddp_tensor*[?]", math.max(n_saved, 1))
  for i = 1, n_saved do
    local s = ctx._to_save[i]
    if s ~= nil and not is_tensor(s) then
      lib.raise("save_for_backward: argument " .. i .. " is a " .. type(s) .. ", not a tensor "
        .. "(keep other values as fields of ctx)")
    end
    saved[i - 1] = s
  end
  ctx._to_save = nil -- the runtime keeps them now
  local shapes = {}
  for k = 1, n_out do
    local o = outs[k]
    if is_tensor(o) then shapes[k] = { shape = o.shape, dtype = o.dtype, device = o.device } end
  end
  local record = setmetatable({ class = cls, ctx = ctx, name = cls.name, n_saved = n_saved,
    tensor_args = tensor_args, n_outputs = n_out, outputs = shapes,
    differentiable = differentiable }, Record)
  local id = engine.add_function(record)
  local status = C.ddp_autograd_record_function(out, cls.name .. "Backward", id, n_t, inputs,
    n_saved, saved)
  if status ~= 0 then engine.remove_function(id) end
  check(status)
  engine.forget_dropped()
  return unpack(outs, 1, n_out)
end

return M
