--- ddplua.distributed.optim: distributed optimizers, as torch.distributed.optim (reached as
-- dl.distributed.optim or require "ddplua.distributed.optim").
--
--   optim.ZeroRedundancyOptimizer(params, {optimizer_class = optim.Adam, lr = 1e-3})
--     the optimizer state sharded across the ranks (lua/ddplua/distributed/optim/
--     zero_redundancy_optimizer.lua documents it)
local M = {
  ZeroRedundancyOptimizer = require "ddplua.distributed.optim.zero_redundancy_optimizer",
}

return M
