--- ddplua.utils.metrics_file: a CSV file of metrics, one row per call (per epoch, say),
-- kept whole on disk at every moment: each row rewrites the file through a temporary file
-- renamed over it, so a reader (a plot, a crashed run's post-mortem) never sees half a row.
--
--   local MetricsFile = require "ddplua.utils.metrics_file"
--   local m = MetricsFile.open("runs/x/metrics.csv",
--     { { "epoch", "%d" }, { "lr", "%.6g" }, { "train_loss", "%.6f" } }, { append = resumed })
--   m:write { epoch = 1, lr = 0.05, train_loss = 0.61 }
--   m:close()
local lib = require "ddplua.lib"
local options = require "ddplua.options"

local MetricsFile = {}
MetricsFile.__index = MetricsFile

local function read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local KNOWN = options.known { "append", "resume_after" }

-- The header and the rows of `text` whose first cell is a number <= `last` (Note [metrics
-- rows on resume]).
local function rows_until(text, last)
  local out, first = {}, true
  for line in text:gmatch("[^\n]*\n?") do
    if line == "" then break end
    if first then
      out[#out + 1] = line
      first = false
    else
      local key = tonumber(line:match("^([^,\n]*)"))
      if key and key <= last then out[#out + 1] = line end
    end
  end
  local s = table.concat(out)
  if s ~= "" and s:sub(-1) ~= "\n" then s = s .. "\n" end
  return s
end

--- MetricsFile.open(path, columns, {append = bool, resume_after = n}) -> a metrics file.
-- columns: a list of {name, format} pairs (string.format formats, e.g. "%d", "%.6f"). A new
-- file (append false, or no file or an empty one yet) starts with the header line of the
-- names; append = true keeps the rows already there (a resumed run), and with resume_after
-- only those whose first column (the epoch, say) is <= n: Note [metrics rows on resume].
-- Raises when the file cannot be written, naming it and the reason.
--
-- Note [metrics rows on resume]: a run writes an epoch's row, then its checkpoint. A crash
-- between the two leaves a row for an epoch that the checkpoint does not hold; resuming
-- from that checkpoint runs the epoch again and wrote its row a second time. resume_after =
-- the checkpoint's epoch drops such rows first, so the file reads as one uninterrupted run.
function MetricsFile.open(path, columns, opts)
  lib.path(path, "MetricsFile.open")
  opts = options.check("MetricsFile", opts, KNOWN)
  local self = setmetatable({ path = path, columns = columns }, MetricsFile)
  local old = opts.append and read(path)
  if old and old ~= "" and opts.resume_after ~= nil then
    if type(opts.resume_after) ~= "number" then
      error("MetricsFile: resume_after must be a number, got " .. type(opts.resume_after), 2)
    end
    old = rows_until(old, opts.resume_after)
  end
  if old and old ~= "" then
    self.text = old
  else
    local names = {}
    for i, c in ipairs(columns) do names[i] = c[1] end
    self.text = table.concat(names, ",") .. "\n"
  end
  self:flush()
  return self
end

--- m:write(row): append one row; row maps each column name to its value (a missing value
-- raises naming the column). The file on disk is replaced atomically (rename).
function MetricsFile:write(row)
  local cells = {}
  for i, c in ipairs(self.columns) do
    local v = row[c[1]]
    if v == nil then error(("metrics_file: no value for column '%s'"):format(c[1]), 2) end
    cells[i] = c[2]:format(v)
  end
  self.text = self.text .. table.concat(cells, ",") .. "\n"
  self:flush()
end

--- m:flush(): write the whole text to <path>.tmp and rename it over path.
function MetricsFile:flush()
  local tmp = self.path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then error("metrics_file: cannot write " .. tostring(err), 0) end
  f:write(self.text)
  f:close()
  local ok, rerr = os.rename(tmp, self.path)
  if not ok then error("metrics_file: cannot rename " .. tmp .. " to " .. self.path .. ": " .. tostring(rerr), 0) end
end

--- m:close(): nothing is left to write (every row is on disk); present so a metrics file
-- reads like any other file.
function MetricsFile:close() end

return MetricsFile
