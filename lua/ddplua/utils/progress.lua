--- ddplua.utils.progress: the per-epoch progress display of a training loop. On a terminal
-- a bar redrawn in place; otherwise (a pipe, a log file) a plain line every 10% of the
-- epoch, so logs stay readable.
--
--   local Progress = require "ddplua.utils.progress"
--   local bar = Progress.new { label = "epoch 1/3", total = #loader }
--   for b = 1, #loader do ...; bar:update(b, mean_loss, samples_per_s) end
--   bar:close()
--
-- Terminal:  "\repoch 1/3 [=========                     ]  30% loss 0.5123    812 samples/s"
-- Otherwise: "epoch 1/3  30% loss 0.5123 812 samples/s"
local options = require "ddplua.options"
local lib = require "ddplua.lib"
local os_ = require "ddplua.os"

local Progress = {}
Progress.__index = Progress

local WIDTH = 30 -- characters of the bar

local KNOWN = options.known { "label", "total", "terminal", "enabled", "every" }

--- Progress.new{label = text, total = steps, terminal = bool, enabled = bool, every = f}
-- -> a display. terminal defaults to whether stdout is a terminal; enabled = false shows
-- nothing (other ranks, --quiet); every is the fraction of the total between log lines
-- (default 0.1).
function Progress.new(opts)
  opts = options.check("Progress", opts, KNOWN)
  local terminal = opts.terminal
  if terminal == nil then terminal = os_.isatty(1) end
  return setmetatable({ label = opts.label or "", total = math.max(opts.total or 1, 1),
    terminal = terminal, enabled = opts.enabled ~= false, every = opts.every or 0.1,
    next_log = opts.every or 0.1 }, Progress)
end

--- bar:update(done, loss, samples_per_s): show `done` of `total` steps with the running
-- loss and throughput (samples per second).
function Progress:update(done, loss, samples_per_s)
  -- every rank tells the launcher's live view (Note [rank status pages]), shown or not here
  lib.C.ddp_status_progress(done, loss, samples_per_s)
  if not self.enabled then return end
  local frac = done / self.total
  local pct = math.floor(100 * frac)
  if self.terminal then
    local filled = math.floor(WIDTH * frac)
    io.write(("\r%s [%s%s] %3d%% loss %.4f %6.0f samples/s"):format(self.label, string.rep("=", filled),
      string.rep(" ", WIDTH - filled), pct, loss, samples_per_s))
    io.flush()
  elseif frac >= self.next_log then
    print(("%s %3d%% loss %.4f %.0f samples/s"):format(self.label, pct, loss, samples_per_s))
    self.next_log = self.next_log + self.every
  end
end

--- bar:close(): end the bar's line on a terminal (nothing otherwise).
function Progress:close()
  if self.enabled and self.terminal then io.write("\n") end
end

return Progress
