--- ddplua.utils.tensorboard: SummaryWriter, PyTorch's torch.utils.tensorboard.SummaryWriter:
-- TensorBoard event files ("events.out.tfevents.*") that `tensorboard --logdir DIR` reads.
--
--   local SummaryWriter = require("ddplua.utils.tensorboard").SummaryWriter
--   local writer = SummaryWriter("runs/exp1")
--   for step = 1, n do
--     writer:add_scalar("train/loss", loss:item(), step)
--   end
--   writer:add_histogram("fc.weight", model.fc.weight, step)
--   writer:close()
--
-- The methods and their argument orders are PyTorch's. The files are written in C
-- (runtime/io/event_file.c, through protobuf-c with the messages of proto/): one TFRecord
-- record per event, appended whole with one write() (Note [event file appends]), so
-- TensorBoard sees each value as soon as the call returns; flush() also fsyncs.
--
-- Note [summary writer ranks]: in a distributed job only rank 0 writes by default (what
-- PyTorch scripts do by hand with `if rank == 0`): on the other ranks SummaryWriter returns
-- a writer whose methods do nothing and which creates no folder or file (writer.enabled is
-- false), so a script calls the same methods on every rank. The rank is the default process
-- group's when one is initialized, else the RANK variable the launcher sets, else 0. Pass
-- { all_ranks = true } to write on every rank; give each rank its own log_dir then (e.g.
-- log_dir .. "/rank" .. rank), since TensorBoard shows the files of one folder as one run.
local lib = require "ddplua.lib"
local tensor = require "ddplua.tensor"
local options = require "ddplua.options"
local os_ = require "ddplua.os"
local ffi, C = lib.ffi, lib.C

local M = {}

local SummaryWriter = {}
SummaryWriter.__index = SummaryWriter

local NAN = 0 / 0
local KNOWN = options.known { "comment", "filename_suffix", "all_ranks", "rank", "max_queue", "flush_secs" }

-- This process's rank (Note [summary writer ranks]).
local function current_rank()
  local c10d = package.loaded["ddplua.distributed.distributed_c10d"]
  if c10d and c10d.is_initialized() then return c10d.get_rank() end
  return tonumber(os.getenv("RANK")) or 0
end

local function default_log_dir(comment)
  local host = os.getenv("HOSTNAME") or "localhost"
  return "runs/" .. os.date("%b%d_%H-%M-%S") .. "_" .. host .. (comment or "")
end

-- A Lua number from v (a number or a one-element tensor) for `what` of method `op`.
local function number_of(v, op, what)
  if type(v) == "number" then return v end
  if tensor.is_tensor(v) then
    if v:numel() ~= 1 then
      lib.raise(("%s: %s must be a number or a one-element tensor, got a tensor of %d elements"):format(
        op, what, v:numel()))
    end
    return v:item()
  end
  if type(v) == "boolean" then return v and 1 or 0 end
  lib.raise(("%s: %s must be a number or a one-element tensor, got %s"):format(op, what, type(v)))
end

local function step_of(step, op)
  if step == nil then return 0 end
  step = number_of(step, op, "global_step")
  if step ~= math.floor(step) then lib.raise(("%s: global_step must be an integer, got %s"):format(op, tostring(step))) end
  return step
end

local function walltime_of(t, op)
  if t == nil then return NAN end
  return number_of(t, op, "walltime")
end

local function open_file(log_dir, suffix)
  local box = ffi.new("ddp_event_file*[1]")
  lib.check(C.ddp_event_file_open(box, log_dir, suffix or ""))
  return ffi.gc(box[0], C.ddp_event_file_close)
end

--- SummaryWriter(log_dir[, opts]) -> a writer (PyTorch's SummaryWriter(log_dir, comment,
-- filename_suffix=...)). log_dir: the folder of the event file, created with its parents
-- when missing; nil: "runs/<Mon DD_HH-MM-SS>_<$HOSTNAME or localhost><comment>" as PyTorch.
-- opts: comment (appended to the default log_dir only), filename_suffix (appended to the
-- file's name), all_ranks (default false: only rank 0 writes, Note [summary writer ranks]),
-- rank (the rank to assume instead of asking the process group); PyTorch's max_queue and
-- flush_secs are accepted and have nothing to do (every record is in the file when its
-- call returns: Note [event file appends]). The event file is created at once
-- (its first record is the file-version event). Raises when the folder or the file cannot
-- be created, naming it. writer.log_dir is the folder, writer.enabled whether this
-- writer writes, writer:file_path() its file ("" when disabled).
function M.SummaryWriter(log_dir, opts)
  if type(log_dir) == "table" and opts == nil then -- SummaryWriter{log_dir = ..., ...}
    opts = {}
    for k, v in pairs(log_dir) do if k ~= "log_dir" then opts[k] = v end end
    log_dir = log_dir.log_dir
  end
  opts = options.check("SummaryWriter", opts, KNOWN)
  if log_dir == nil then log_dir = default_log_dir(opts.comment) end
  lib.path(log_dir, "SummaryWriter", "log_dir")
  if opts.filename_suffix ~= nil then lib.c_string(opts.filename_suffix, "SummaryWriter", "filename_suffix") end
  local rank = opts.rank or current_rank()
  local self = setmetatable({ log_dir = log_dir, filename_suffix = opts.filename_suffix or "",
    enabled = opts.all_ranks == true or rank == 0, rank = rank, all_writers = {} }, SummaryWriter)
  self.path = ""
  if self.enabled then
    self.file = open_file(log_dir, self.filename_suffix)
    self.path = ffi.string(C.ddp_event_file_path(self.file))
  end
  return self
end

local function file_of(self, op)
  if self.closed then lib.raise(("SummaryWriter.%s: the writer of '%s' is closed"):format(op, self.log_dir)) end
  return self.file
end

--- writer:get_logdir() -> the folder this writer writes into.
function SummaryWriter:get_logdir() return self.log_dir end

--- writer:file_path() -> the path of this writer's event file ("" on a disabled writer;
-- still the path after close).
function SummaryWriter:file_path() return self.path end

--- writer:add_scalar(tag, scalar_value[, global_step[, walltime]]): one scalar (a number
-- or a one-element tensor; stored as f32, Summary.Value.simple_value) at global_step (an
-- integer; default 0) and walltime (seconds since the epoch; default now). Raises on an
-- empty tag, a value that is no number, or a failed write (naming the file).
function SummaryWriter:add_scalar(tag, scalar_value, global_step, walltime)
  if not self.enabled then return end
  local f = file_of(self, "add_scalar")
  lib.c_string(tag, "SummaryWriter.add_scalar", "tag")
  lib.check(C.ddp_event_file_add_scalar(f, tag, number_of(scalar_value, "SummaryWriter.add_scalar", "scalar_value"),
    step_of(global_step, "SummaryWriter.add_scalar"), walltime_of(walltime, "SummaryWriter.add_scalar")))
end

--- writer:add_scalars(main_tag, tag_scalar_dict[, global_step[, walltime]]): several
-- scalars on one chart, as PyTorch: each key tag of tag_scalar_dict gets its own event
-- file in the folder log_dir/<main_tag with "/" as "_">_<tag> (one sub-writer per tag,
-- kept open until close), holding the value under the tag main_tag. The keys are written
-- in sorted order, all with the same walltime (default now).
function SummaryWriter:add_scalars(main_tag, tag_scalar_dict, global_step, walltime)
  if not self.enabled then return end
  local op = "SummaryWriter.add_scalars"
  file_of(self, "add_scalars")
  lib.c_string(main_tag, op, "main_tag")
  if type(tag_scalar_dict) ~= "table" then lib.raise(op .. ": tag_scalar_dict must be a table, got " .. type(tag_scalar_dict)) end
  local step = step_of(global_step, op)
  local wall = walltime == nil and os_.time() or walltime_of(walltime, op)
  local keys = {}
  for k in pairs(tag_scalar_dict) do
    if type(k) ~= "string" then lib.raise(op .. ": the keys of tag_scalar_dict must be strings, got " .. type(k)) end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  for _, tag in ipairs(keys) do
    local value = number_of(tag_scalar_dict[tag], op, ("tag_scalar_dict[%q]"):format(tag))
    local dir = self.log_dir .. "/" .. main_tag:gsub("/", "_") .. "_" .. tag
    local fw = self.all_writers[dir]
    if not fw then
      fw = open_file(dir, self.filename_suffix)
      self.all_writers[dir] = fw
    end
    lib.check(C.ddp_event_file_add_scalar(fw, main_tag, value, step, wall))
  end
end

-- The values of a histogram as a C array of doubles and their count, plus what keeps the
-- array alive.
local function histogram_values(values, op)
  if tensor.is_tensor(values) then
    local t = values:detach():cpu():double():contiguous()
    return ffi.cast("const double*", C.ddp_tensor_data(t)), t:numel(), t
  end
  if type(values) == "table" then
    local arr = ffi.new("double[?]", math.max(#values, 1))
    for i = 1, #values do
      if type(values[i]) ~= "number" then lib.raise(("%s: values[%d] must be a number, got %s"):format(op, i, type(values[i]))) end
      arr[i - 1] = values[i]
    end
    return arr, #values, arr
  end
  lib.raise(op .. ": values must be a tensor or a list of numbers, got " .. type(values))
end

--- writer:add_histogram(tag, values[, global_step[, bins[, walltime[, max_bins]]]]): a
-- histogram of values (a tensor of any shape, dtype and device, or a list of numbers; all
-- finite) computed as PyTorch does (Note [histogram buckets] in runtime/io/event_file.c):
-- bins "tensorflow" (default: TensorBoard's exponential buckets), an integer (that many
-- equal bins from the minimum to the maximum), or a list or 1-d tensor of increasing bin
-- edges; max_bins merges bins down to at most that many. Raises on no values ("The input
-- has no element"), a NaN or infinity, bad bins, or a failed write.
function SummaryWriter:add_histogram(tag, values, global_step, bins, walltime, max_bins)
  if not self.enabled then return end
  local op = "SummaryWriter.add_histogram"
  local f = file_of(self, "add_histogram")
  lib.c_string(tag, op, "tag")
  local ptr, n, keep = histogram_values(values, op)
  local nbins, edges, nedges, keep_edges = 0, nil, 0, nil
  if bins == nil or bins == "tensorflow" then
    nbins = 0
  elseif type(bins) == "number" then
    if bins < 1 or bins ~= math.floor(bins) then lib.raise(("%s: bins must be a positive integer, got %s"):format(op, tostring(bins))) end
    nbins = bins
  elseif type(bins) == "table" or tensor.is_tensor(bins) then
    edges, nedges, keep_edges = histogram_values(bins, op .. " (bins)")
  else
    lib.raise(("%s: bins must be \"tensorflow\", an integer or a list of edges, got %s"):format(op,
      type(bins) == "string" and ("%q"):format(bins) or type(bins)))
  end
  if max_bins ~= nil and (type(max_bins) ~= "number" or max_bins < 1 or max_bins ~= math.floor(max_bins)) then
    lib.raise(("%s: max_bins must be a positive integer, got %s"):format(op, tostring(max_bins)))
  end
  lib.check(C.ddp_event_file_add_histogram(f, tag, ptr, n, nbins, edges, nedges, max_bins or 0,
    step_of(global_step, op), walltime_of(walltime, op)))
  local _ = keep, keep_edges -- alive until here
end

--- writer:add_text(tag, text_string[, global_step[, walltime]]): a text summary, as
-- PyTorch's: under the tag "<tag>/text_summary", a string tensor for TensorBoard's text
-- plugin (which renders Markdown). Raises on an empty tag, a text that is not a string.
function SummaryWriter:add_text(tag, text_string, global_step, walltime)
  if not self.enabled then return end
  local op = "SummaryWriter.add_text"
  local f = file_of(self, "add_text")
  lib.c_string(tag, op, "tag")
  lib.c_string(text_string, op, "text_string")
  lib.check(C.ddp_event_file_add_text(f, tag, text_string, step_of(global_step, op), walltime_of(walltime, op)))
end

--- writer:add_hparams(hparam_dict, metric_dict[, hparam_domain_discrete[, run_name[,
-- global_step]]]): hyperparameters and the metrics they gave, for TensorBoard's HPARAMS
-- tab, as PyTorch: a new event file in log_dir/<run_name> (default: the current time in
-- seconds, as PyTorch's str(time.time())) holding the hparams plugin's experiment, session
-- start and session end summaries, then each metric of metric_dict as a scalar. Values of
-- hparam_dict: numbers, strings, booleans (as PyTorch, where bool is an int: the number 1
-- or 0) or one-element tensors; of metric_dict: numbers or one-element tensors. Keys are
-- written sorted. hparam_domain_discrete is not supported (raises when given).
function SummaryWriter:add_hparams(hparam_dict, metric_dict, hparam_domain_discrete, run_name, global_step)
  if not self.enabled then return end
  local op = "SummaryWriter.add_hparams"
  file_of(self, "add_hparams")
  if type(hparam_dict) ~= "table" or type(metric_dict) ~= "table" then
    lib.raise(op .. ": hparam_dict and metric_dict should be tables")
  end
  if hparam_domain_discrete ~= nil then lib.raise(op .. ": hparam_domain_discrete is not supported") end
  local names = {}
  for k in pairs(hparam_dict) do
    if type(k) ~= "string" then lib.raise(op .. ": the keys of hparam_dict must be strings, got " .. type(k)) end
    names[#names + 1] = k
  end
  table.sort(names)
  local n = #names
  local c_names = ffi.new("const char*[?]", math.max(n, 1))
  local kinds = ffi.new("int[?]", math.max(n, 1))
  local numbers = ffi.new("double[?]", math.max(n, 1))
  local strings = ffi.new("const char*[?]", math.max(n, 1))
  for i, k in ipairs(names) do
    local v = hparam_dict[k]
    c_names[i - 1] = lib.c_string(k, op, "a key of hparam_dict")
    if type(v) == "string" then
      kinds[i - 1], strings[i - 1] = C.DDP_HPARAM_STRING, lib.c_string(v, op, ("hparam_dict[%q]"):format(k))
    elseif type(v) == "number" or type(v) == "boolean" or tensor.is_tensor(v) then
      kinds[i - 1], numbers[i - 1] = C.DDP_HPARAM_NUMBER, number_of(v, op, ("hparam_dict[%q]"):format(k))
    else
      lib.raise(("%s: hparam_dict[%q] should be a number, string, boolean or tensor, got %s"):format(op, k, type(v)))
    end
  end
  local metrics = {}
  for k in pairs(metric_dict) do
    if type(k) ~= "string" then lib.raise(op .. ": the keys of metric_dict must be strings, got " .. type(k)) end
    metrics[#metrics + 1] = k
  end
  table.sort(metrics)
  local c_metrics = ffi.new("const char*[?]", math.max(#metrics, 1))
  for i, k in ipairs(metrics) do c_metrics[i - 1] = k end
  local step = step_of(global_step, op)
  if run_name == nil or run_name == "" then run_name = ("%.7f"):format(os_.time()) end
  lib.c_string(run_name, op, "run_name")
  local w = M.SummaryWriter(self.log_dir .. "/" .. run_name, { all_ranks = true, filename_suffix = self.filename_suffix })
  local ok, err = pcall(function()
    lib.check(C.ddp_event_file_add_hparams(w.file, n, c_names, kinds, numbers, strings, #metrics, c_metrics, step, NAN))
    for _, k in ipairs(metrics) do w:add_scalar(k, number_of(metric_dict[k], op, ("metric_dict[%q]"):format(k)), step) end
  end)
  w:close()
  if not ok then error(err, 0) end
  local _ = names -- the C strings live in these tables until here
end

--- writer:flush(): fsync this writer's event files (their records are already in the
-- files, Note [event file appends]). Raises naming a file that cannot be synced.
function SummaryWriter:flush()
  if not self.enabled or self.closed then return end
  lib.check(C.ddp_event_file_flush(self.file))
  for _, fw in pairs(self.all_writers) do lib.check(C.ddp_event_file_flush(fw)) end
end

--- writer:close(): flush and close the event files (the add_scalars sub-writers too). A
-- second close does nothing; any other method raises afterwards. Raises when a file could
-- not be synced or closed.
function SummaryWriter:close()
  if not self.enabled or self.closed then return end
  self.closed = true
  local first_status
  local files = { self.file }
  for _, fw in pairs(self.all_writers) do files[#files + 1] = fw end
  self.file, self.all_writers = nil, {}
  for _, fw in ipairs(files) do
    ffi.gc(fw, nil)
    local s = C.ddp_event_file_close(fw)
    if s ~= 0 and not first_status then first_status = s end
  end
  if first_status then lib.check(first_status) end
end

return M
