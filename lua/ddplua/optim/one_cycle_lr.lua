--- ddplua.optim.OneCycleLR: the 1cycle policy (PyTorch's torch.optim.lr_scheduler.OneCycleLR;
-- Smith & Topin, "Super-Convergence: Very Fast Training of Neural Networks Using Large
-- Learning Rates"). Step it after every batch. The lr goes from initial_lr = max_lr /
-- div_factor up to max_lr over the first pct_start of total_steps, then down to min_lr =
-- initial_lr / final_div_factor (three_phase: up, back down to initial_lr symmetrically,
-- then down to min_lr). With cycle_momentum (default true) the momentum (SGD) or beta1
-- (Adam, AdamW) moves the opposite way between max_momentum and base_momentum.
--
--   local sched = optim.OneCycleLR(opt, {max_lr = 0.1, total_steps = 1000})
--   -- or {max_lr = 0.1, epochs = 10, steps_per_epoch = 100}
--   -- options: pct_start = 0.3, anneal_strategy = "cos" | "linear", cycle_momentum = true,
--   --          base_momentum = 0.85, max_momentum = 0.95, div_factor = 25,
--   --          final_div_factor = 1e4, three_phase = false, last_epoch = -1
--
-- max_lr, base_momentum and max_momentum may be lists (one per param group). Phase p
-- covers steps (start_p, end_p] with end_1 = pct_start * total_steps - 1 (three_phase:
-- end_2 = 2 * pct_start * total_steps - 2) and the last ending at total_steps - 1; within
-- a phase, pct = (step - start) / (end - start) and
--   cos:    value = end_v + (start_v - end_v) / 2 * (1 + cos(pi * pct))
--   linear: value = start_v + (end_v - start_v) * pct
-- Stepping past total_steps raises, as PyTorch. Errors name the option (total_steps,
-- epochs, steps_per_epoch, pct_start, anneal_strategy, max_lr, an optimizer without
-- momentum or betas when cycle_momentum).
local lib = require "ddplua.lib"
local LRScheduler = require "ddplua.optim.lr_scheduler"

local OneCycleLR = LRScheduler.subclass("OneCycleLR")
local NAME = "OneCycleLR"

local ALLOWED = {
  max_lr = true, total_steps = true, epochs = true, steps_per_epoch = true, pct_start = true,
  anneal_strategy = true, cycle_momentum = true, base_momentum = true, max_momentum = true,
  div_factor = true, final_div_factor = true, three_phase = true, last_epoch = true,
}

-- A number or a list with one number per group, as a list.
local function per_group(option, v, n)
  if type(v) == "number" then
    local out = {}
    for i = 1, n do out[i] = v end
    return out
  end
  if type(v) ~= "table" or #v ~= n then
    LRScheduler.invalid(NAME, option, v, ("must be a number or a list of %d numbers (one per param group)"):format(n))
  end
  for i = 1, n do
    if type(v[i]) ~= "number" then LRScheduler.invalid(NAME, option, v[i], "entries must be numbers") end
  end
  return { unpack(v, 1, n) }
end

local function anneal_cos(start, stop, pct)
  return stop + (start - stop) / 2 * (math.cos(math.pi * pct) + 1)
end

local function anneal_linear(start, stop, pct)
  return (stop - start) * pct + start
end

--- OneCycleLR(optimizer, opts) -> the scheduler (a subclass of LRScheduler), opts as described
-- above; raises on an unknown or invalid option.
function OneCycleLR.new(optimizer, opts)
  opts = LRScheduler.options(NAME, opts, ALLOWED)
  if type(optimizer) ~= "table" or type(optimizer.param_groups) ~= "table" then
    lib.raise(NAME .. ": the first argument must be an optimizer")
  end
  local self = setmetatable({}, OneCycleLR)
  local total = opts.total_steps
  if total ~= nil then
    LRScheduler.positive_int(NAME, "total_steps", total)
  elseif opts.epochs ~= nil or opts.steps_per_epoch ~= nil then
    LRScheduler.positive_int(NAME, "epochs", opts.epochs)
    LRScheduler.positive_int(NAME, "steps_per_epoch", opts.steps_per_epoch)
    total = opts.epochs * opts.steps_per_epoch
  else
    lib.raise(NAME .. ": you must define either total_steps or (epochs and steps_per_epoch)")
  end
  self.total_steps = total
  local pct = opts.pct_start or 0.3
  if type(pct) ~= "number" or not (pct >= 0 and pct <= 1) then
    LRScheduler.invalid(NAME, "pct_start", pct, "must be in [0, 1]")
  end
  local strategy = opts.anneal_strategy or "cos"
  if strategy ~= "cos" and strategy ~= "linear" then
    LRScheduler.invalid(NAME, "anneal_strategy", strategy, 'must be "cos" or "linear"')
  end
  self.anneal_strategy = strategy
  local div, final_div = opts.div_factor or 25, opts.final_div_factor or 1e4
  LRScheduler.number(NAME, "div_factor", div)
  LRScheduler.number(NAME, "final_div_factor", final_div)
  local three = opts.three_phase or false
  self.three_phase = three
  if three then
    self._schedule_phases = {
      { end_step = pct * total - 1, start_lr = "initial_lr", end_lr = "max_lr",
        start_momentum = "max_momentum", end_momentum = "base_momentum" },
      { end_step = 2 * pct * total - 2, start_lr = "max_lr", end_lr = "initial_lr",
        start_momentum = "base_momentum", end_momentum = "max_momentum" },
      { end_step = total - 1, start_lr = "initial_lr", end_lr = "min_lr",
        start_momentum = "max_momentum", end_momentum = "max_momentum" },
    }
  else
    self._schedule_phases = {
      { end_step = pct * total - 1, start_lr = "initial_lr", end_lr = "max_lr",
        start_momentum = "max_momentum", end_momentum = "base_momentum" },
      { end_step = total - 1, start_lr = "max_lr", end_lr = "min_lr",
        start_momentum = "base_momentum", end_momentum = "max_momentum" },
    }
  end
  local groups = optimizer.param_groups
  local last_epoch = opts.last_epoch or -1
  if opts.max_lr == nil then lib.raise(NAME .. ": max_lr is required") end
  local max_lrs = per_group("max_lr", opts.max_lr, #groups)
  if last_epoch == -1 then
    for i, g in ipairs(groups) do
      g.initial_lr = max_lrs[i] / div
      g.max_lr = max_lrs[i]
      g.min_lr = g.initial_lr / final_div
    end
  end
  local cycle = opts.cycle_momentum
  if cycle == nil then cycle = true end
  self.cycle_momentum = cycle
  if cycle then
    local defaults = optimizer.defaults or {}
    if defaults.momentum == nil and defaults.betas == nil then
      lib.raise(NAME .. ": optimizer must support momentum or beta1 with the cycle_momentum option enabled")
    end
    self.use_beta1 = defaults.betas ~= nil
    local mmax = per_group("max_momentum", opts.max_momentum or 0.95, #groups)
    local mbase = per_group("base_momentum", opts.base_momentum or 0.85, #groups)
    if last_epoch == -1 then
      for i, g in ipairs(groups) do
        if self.use_beta1 then g.betas = { mmax[i], g.betas[2] } else g.momentum = mmax[i] end
        g.max_momentum = mmax[i]
        g.base_momentum = mbase[i]
      end
    end
  end
  return LRScheduler.init(self, optimizer, last_epoch)
end

--- The lr of each group at step last_epoch (and, with cycle_momentum, the momentum or
-- beta1 written into the groups). Raises past total_steps.
function OneCycleLR:get_lr()
  local step = self.last_epoch
  if step > self.total_steps then
    lib.raise(("%s: tried to step %d times; the specified number of total steps is %d"):format(
      NAME, step, self.total_steps))
  end
  local anneal = self.anneal_strategy == "cos" and anneal_cos or anneal_linear
  local phases = self._schedule_phases
  local out = {}
  for i, g in ipairs(self.optimizer.param_groups) do
    local start_step, lr, mom = 0, nil, nil
    for k, phase in ipairs(phases) do
      if step <= phase.end_step or k == #phases then
        local pct = (step - start_step) / (phase.end_step - start_step)
        lr = anneal(g[phase.start_lr], g[phase.end_lr], pct)
        if self.cycle_momentum then mom = anneal(g[phase.start_momentum], g[phase.end_momentum], pct) end
        break
      end
      start_step = phase.end_step
    end
    out[i] = lr
    if self.cycle_momentum then
      if self.use_beta1 then g.betas = { mom, g.betas[2] } else g.momentum = mom end
    end
  end
  return out
end

return OneCycleLR
