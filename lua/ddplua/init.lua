--- ddplua: the front end. `local dl = require "ddplua"`.
--
-- Creation functions (shape as a table: dl.zeros{2, 3}; options table last:
-- {dtype = "f64", device = "cuda:1", requires_grad = true}), seeding, grad mode, threads and the functional
-- forms of the ops (dl.add(a, b), dl.matmul(a, b), dl.cat({a, b}, 1), ...): all defined in
-- ddplua.functions and re-exported here; plus the packages (dl.autograd, and on first use
-- dl.nn, dl.optim, dl.data, dl.checkpoint, dl.distributed, dl.amp, dl.futures, dl.utils, dl.spawn,
-- dl.autocast).
--
-- This umbrella is for scripts: it sits above every package, so no library module requires
-- it (they require ddplua.functions or the package they need; Note [lua layers] in
-- tools/check_layers.lua).
local functions = require "ddplua.functions"

local M = {}
for k, v in pairs(functions) do M[k] = v end

-- Packages reachable from dl, loaded on first use (each also loads on its own: require
-- "ddplua.optim"). Each name is a literal, so the layer check sees every require.
local PACKAGES = {
  optim = function() return require "ddplua.optim" end,
  nn = function() return require "ddplua.nn" end,
  data = function() return require "ddplua.data" end,
  checkpoint = function() return require "ddplua.checkpoint" end,
  distributed = function() return require "ddplua.distributed" end,
  amp = function() return require "ddplua.amp" end,
  futures = function() return require "ddplua.futures" end,
  -- dl.autocast, dl.is_autocast_enabled: ddplua.amp's
  autocast = function() return require("ddplua.amp").autocast end,
  is_autocast_enabled = function() return require("ddplua.amp").is_autocast_enabled end,
  -- dl.utils.checkpoint / checkpoint_sequential (torch.utils.checkpoint's)
  utils = function()
    local ck = require "ddplua.nn.checkpoint"
    return { checkpoint = ck.checkpoint, checkpoint_sequential = ck.checkpoint_sequential }
  end,
  -- dl.spawn(fn, nprocs, opts): torch.multiprocessing.spawn's job
  spawn = function() return require "ddplua.distributed.spawn" end,
}
setmetatable(M, { __index = function(t, k)
  local load = PACKAGES[k]
  if load then
    local v = load()
    rawset(t, k, v)
    return v
  end
end })

--- dl.autograd: Function, grad, backward (ddplua.autograd)
M.autograd = require "ddplua.autograd"

return M
