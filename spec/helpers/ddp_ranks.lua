--- ddp_ranks: the shared parts of the multi-rank DDP specs (spec/distributed/ddp_spec.lua and
-- its neighbours): the prelude every rank's script starts with, and the run that starts the
-- ranks (spec/helpers/multiproc.lua) and reads back what they printed.
--
--   local ddp_ranks = require "ddp_ranks"
--   local PRELUDE = ddp_ranks.prelude { helpers = { "mlp", "shard", "mse", "params_text" } } .. [[
--   function extra() ... end   -- what only this spec needs
--   ]]
--   local run = ddp_ranks.runner(PRELUDE, { timeout = 60 })
--   local ranks = run([[ out("loss", 1.5) ]], 2)   -- ranks[1].out.loss == "1.5"
--
-- Note [rank script protocol]: a rank reports a value with out(name, v), one line
-- "OUT name value", and the outcome of a call that may raise with try(name, fn), one line
-- "ERR name message" ("no error" when it returned); the spec asserts on the parsed tables,
-- never on the raw text, so a rank's other output (warnings, logs) cannot break it.
local mp = require "multiproc"

local M = {}

-- The head of every prelude: the front end's modules as locals, RANK and WORLD from the
-- launcher's environment, the default group (%s: the init_process_group line, where INIT,
-- when a run sets it, replaces the options), and the two printers of Note [rank script
-- protocol].
local HEAD = [[
local dl = require "ddplua"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
RANK, WORLD = tonumber(os.getenv("RANK")), tonumber(os.getenv("WORLD_SIZE"))
%s
function out(name, v) io.write("OUT ", name, " ", tostring(v), "\n"); io.flush() end
function try(name, fn)
  local ok, err = pcall(fn)
  io.write("ERR ", name, " ", ok and "no error" or tostring(err):gsub("\n", " | "), "\n")
  io.flush()
  return ok
end
]]

-- The helpers a prelude may take, by name; each defines the global functions it names.
local HELPERS = {
  -- 6-16-12-4 with tanh, seeded: the same initial weights on every rank.
  mlp = [[
function mlp()
  dl.manual_seed(1)
  return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 4))
end
]],
  -- (N, 2, 8, 8) -> (N, 3), seeded.
  cnn = [[
function cnn()
  dl.manual_seed(2)
  return nn.Sequential(nn.Conv2d(2, 4, 3, {padding = 1}), nn.ReLU(), nn.MaxPool2d(2),
                       nn.Conv2d(4, 6, 3), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 2 * 2, 3))
end
]],
  -- BranchNet(): x (N, 6) -> tanh(a) -> head (N, 4), seeded; forward(x, use_branch,
  -- use_head) adds branch's output when use_branch, and skips head (h's first 4 columns
  -- instead) when use_head is false: parameters unused on some iterations.
  branch_net = [[
BranchNet = nn.Module:extend("Net")
function BranchNet:init()
  dl.manual_seed(5)
  self.a = nn.Linear(6, 8)
  self.branch = nn.Linear(8, 4)
  self.head = nn.Linear(8, 4)
end
function BranchNet:forward(x, use_branch, use_head)
  local h = dl.tanh(self.a(x))
  local o = self.head(h)
  if use_head == false then o = h:narrow(2, 1, 4) * 1 end
  if use_branch then o = o + self.branch(h) end
  return o
end
]],
  -- k steps of B samples each, x (B, xshape...) and y (B, ydim), the same on every rank.
  batches = [[
function batches(k, B, xshape, ydim)
  local xs, ys = {}, {}
  dl.manual_seed(100)
  for s = 1, k do
    local shape = {B}
    for _, d in ipairs(xshape) do shape[#shape + 1] = d end
    xs[s], ys[s] = dl.randn(shape), dl.randn({B, ydim})
  end
  return xs, ys
end
]],
  -- Rank `rank`'s rows of t when cut into `world` equal parts (default: this rank's).
  shard = [[
function shard(t, world, rank)
  world, rank = world or WORLD, rank or RANK
  local n = t:size(1) / world
  return t:narrow(1, rank * n + 1, n)
end
]],
  mse = [[
function mse(a, b) return (a - b):pow(2):mean() end
]],
  -- The largest relative difference of two modules' parameters (max |a - b| / max |b|, the
  -- worst tensor).
  max_rel = [[
function max_rel(m1, m2)
  local p1, p2, worst = m1:parameters(), m2:parameters(), 0
  for i = 1, #p1 do
    local d = (p1[i] - p2[i]):abs():max():item()
    local s = p2[i]:abs():max():item()
    worst = math.max(worst, d / math.max(s, 1e-12))
  end
  return worst
end
]],
  -- The largest |a - b| over the parameters of two modules (0 means the same bits).
  max_abs = [[
function max_abs(m1, m2)
  local p1, p2, worst = m1:parameters(), m2:parameters(), 0
  for i = 1, #p1 do worst = math.max(worst, (p1[i] - p2[i]):abs():max():item()) end
  return worst
end
]],
  -- Every element of a list of tensors (tensors_text) or of a module's parameters
  -- (params_text) at 9 significant digits, comma-separated: replicas compare as strings.
  params_text = [[
function tensors_text(list)
  local parts = {}
  for _, p in ipairs(list) do
    for _, v in ipairs(p:reshape({-1}):tolist()) do parts[#parts + 1] = string.format("%.9g", v) end
  end
  return table.concat(parts, ",")
end
function params_text(m) return tensors_text(m:parameters()) end
]],
  -- to_dev(t, dev): a copy of t on device ordinal dev (-1: the host); module_to(m, dev):
  -- every parameter of m replaced by a device copy (a new leaf), in place.
  device = [[
local _lib = require "ddplua.lib"
local _box = _lib.ffi.new("ddp_tensor*[1]")
function to_dev(t, dev)
  _lib.check(_lib.C.ddp_tensor_to_device(_box, t, dev, 0))
  return _lib.wrap(_box[0])
end
function module_to(m, dev)
  local Parameter = require("ddplua.nn.module").Parameter
  dl.no_grad(function()
    for _, sub in ipairs(m:modules()) do
      local d = rawget(sub, "_parameters")
      for _, n in ipairs(d.names) do
        local t = d.values[n]
        if t ~= nil then d.values[n] = Parameter(to_dev(t, dev), t.requires_grad) end
      end
    end
  end)
  return m
end
]],
}

--- The prelude of a rank script (Lua source): the head (dl, nn, optim, dist and DDP as
-- locals; RANK and WORLD; init_process_group; out and try, Note [rank script protocol]),
-- then the named helpers in the order given. opts.init: Lua source of init_process_group's
-- options (default '{backend = "gloo", timeout = 20}'; false: the rank scripts call
-- init_process_group themselves); opts.helpers: names from mlp, cnn, branch_net (BranchNet),
-- batches, shard, mse, max_rel, max_abs, params_text (also tensors_text), device (to_dev,
-- module_to). Raises on an unknown helper name.
function M.prelude(opts)
  opts = opts or {}
  local init = ""
  if opts.init ~= false then
    init = ("dist.init_process_group(INIT or %s)\n"):format(opts.init or '{backend = "gloo", timeout = 20}')
  end
  local parts = { HEAD:format(init) }
  for _, name in ipairs(opts.helpers or {}) do
    parts[#parts + 1] = assert(HELPERS[name], "ddp_ranks.prelude: no helper named " .. tostring(name))
  end
  return table.concat(parts)
end

--- Run code (Lua source) after prelude on n ranks (default 2). opts: timeout (seconds,
-- default 40), env (the children's extra environment, multiproc.run's), init (Lua source of
-- init_process_group's options for this run: set as INIT before the prelude; it may read
-- os.getenv("RANK"), not RANK), prelude (another prelude for this run), expect_failure
-- (return even when a rank exits non-zero). Returns per-rank {out = {name = value},
-- err = {name = message}, output = text} (Note [rank script protocol]) and multiproc's raw
-- result. Raises with every rank's output unless all ranks exit 0 (or expect_failure), and
-- on a sanitizer report in any rank's output (UBSan reports without exiting non-zero).
function M.run(prelude, code, n, opts)
  n, opts = n or 2, opts or {}
  local init = opts.init and ("INIT = " .. opts.init .. "\n") or ""
  local r = mp.run { code = init .. (opts.prelude or prelude) .. code, nprocs = n,
                     timeout = opts.timeout or 40, env = opts.env }
  if not opts.expect_failure and not r.ok then error("ranks failed:\n" .. mp.describe(r), 3) end
  for i = 1, n do
    if r[i].output:find("runtime error:", 1, true) or r[i].output:find("Sanitizer", 1, true) then
      error("sanitizer report:\n" .. mp.describe(r), 3)
    end
  end
  local ranks = {}
  for i = 1, n do
    local rk = { out = {}, err = {}, output = r[i].output }
    for name, v in r[i].output:gmatch("OUT (%S+) ([^\n]*)") do rk.out[name] = v end
    for name, v in r[i].output:gmatch("ERR (%S+) ([^\n]*)") do rk.err[name] = v end
    ranks[i] = rk
  end
  return ranks, r
end

--- A spec's run(code, n, opts) over M.run with its prelude and default options (defaults:
-- a table of M.run's opts, e.g. {timeout = 60}; a call's opts win over them).
function M.runner(prelude, defaults)
  return function(code, n, opts)
    local merged = {}
    for k, v in pairs(defaults or {}) do merged[k] = v end
    for k, v in pairs(opts or {}) do merged[k] = v end
    return M.run(prelude, code, n, merged)
  end
end

return M
