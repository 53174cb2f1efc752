--- ddplua.autograd (dl.autograd): what PyTorch keeps in torch.autograd.
--
--   dl.autograd.Function                    custom ops in Lua (ddplua.autograd.function)
--   dl.autograd.grad(outputs, inputs, grad_outputs, opts) -> {grads}
--   dl.autograd.backward(tensors, grad_tensors, opts)
--
-- Only first-order gradients: create_graph = true raises (the gradients would have no
-- graph, so a second derivative taken from them would be silently wrong).
local lib = require "ddplua.lib"
local options = require "ddplua.options"
local engine = require "ddplua.autograd.engine"
local ffi = lib.ffi

local M = {}

M.Function = require "ddplua.autograd.function"

local function is_tensor(v) return type(v) == "cdata" and ffi.istype("ddp_tensor*", v) end

-- A tensor or a list of tensors (nil entries allowed when `holes`) as a list and its length.
local function as_list(v, what, holes)
  if v == nil then return nil end
  if is_tensor(v) then return { v }, 1 end
  if type(v) ~= "table" then lib.raise(what .. " must be a tensor or a list of tensors, got " .. type(v)) end
  local n = table.maxn(v)
  for i = 1, n do
    if not (is_tensor(v[i]) or (holes and v[i] == nil)) then
      lib.raise(what .. "[" .. i .. "] must be a tensor, got " .. type(v[i]))
    end
  end
  return v, n
end

--- Raise the create_graph error (name: the calling function, for the message); defined in
-- ddplua.autograd.engine, which t:backward also calls (ddplua.tensor sits below this module).
M.refuse_create_graph = engine.refuse_create_graph

local GRAD_KNOWN = options.known { "retain_graph", "create_graph", "allow_unused" }

--- dl.autograd.grad(outputs, inputs, grad_outputs, opts) -> a list of tensors, the
-- gradients of the outputs (contracted with grad_outputs) w.r.t. each input, as
-- torch.autograd.grad. outputs, inputs: a tensor or a list; grad_outputs: a tensor or a
-- list (nil, or nil entries, for one-element outputs: 1). No .grad is touched and no
-- post-accumulate hook runs; tensor hooks do. opts.retain_graph (default false) keeps the
-- graph for another pass; opts.allow_unused: an input the outputs do not depend on gets
-- nil instead of an error; opts.create_graph = true raises (first order only).
function M.grad(outputs, inputs, grad_outputs, opts)
  opts = options.check("autograd.grad", opts, GRAD_KNOWN)
  if opts.create_graph then M.refuse_create_graph("autograd.grad") end
  local outs, n = as_list(outputs, "autograd.grad: outputs")
  if not outs then lib.raise("autograd.grad: outputs is nil") end
  local ins, ni = as_list(inputs, "autograd.grad: inputs")
  if not ins or ni == 0 then lib.raise("autograd.grad: inputs must name at least one tensor") end
  local gs, ng = as_list(grad_outputs, "autograd.grad: grad_outputs", true)
  if gs and ng > n then
    lib.raise("autograd.grad: " .. ng .. " grad_outputs for " .. n .. " outputs")
  end
  local res = engine.run(outs, gs, ins, opts.retain_graph)
  for i = 1, ni do
    if res[i] == nil and not opts.allow_unused then
      lib.raise("autograd.grad: input " .. i .. " was not used in the graph of the outputs "
        .. "(pass allow_unused = true to get nil for it)")
    end
  end
  return res
end

local BACKWARD_KNOWN = options.known { "retain_graph", "create_graph" }

--- dl.autograd.backward(tensors, grad_tensors, opts): backward from several outputs at
-- once (their gradients summed into the leaves' .grad), as torch.autograd.backward.
-- opts.retain_graph; opts.create_graph = true raises.
function M.backward(tensors, grad_tensors, opts)
  opts = options.check("autograd.backward", opts, BACKWARD_KNOWN)
  if opts.create_graph then M.refuse_create_graph("autograd.backward") end
  local outs = as_list(tensors, "autograd.backward: tensors")
  if not outs then lib.raise("autograd.backward: tensors is nil") end
  local gs = as_list(grad_tensors, "autograd.backward: grad_tensors", true)
  engine.run(outs, gs, nil, opts.retain_graph)
end

return M
