--- ddplua.options: the one check of the options tables that constructors take.
--
--   local options = require "ddplua.options"
--   local KNOWN = options.known { "bias", "dtype", "device", "generator" }
--   function Linear:init(in_f, out_f, opts)
--     opts = options.check("Linear", opts, KNOWN)
--
-- A misspelt key (`bucket_cap_mbb`) or one this version does not have (`mixed_precision`)
-- would otherwise be read by nobody and silently leave the default in place, which is the
-- worst kind of failure: the run goes on, doing something else than asked. So every table
-- of options is checked against the names its constructor reads, and an unknown key raises
-- at the caller's line, naming the key, the closest known one and all known ones.
local lib = require "ddplua.lib"

local M = {}

--- options.known(list): the set {name = true} of a list of option names, made once per
-- constructor (at load time) and passed to options.check.
function M.known(list)
  local set = {}
  for _, k in ipairs(list) do set[k] = true end
  return set
end

-- Levenshtein distance of two short strings.
local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

-- The message for unknown key `key` of `name`'s options.
local function unknown(name, key, known)
  local names, best, best_d = {}, nil, math.huge
  for k in pairs(known) do
    names[#names + 1] = k
    local d = distance(tostring(key), k)
    if d < best_d or (d == best_d and k < best) then best, best_d = k, d end
  end
  table.sort(names)
  local hint = ""
  if best and best_d <= math.max(2, math.floor(#tostring(key) / 3)) then
    hint = ("did you mean '%s'? "):format(best)
  end
  return ("%s: unknown option '%s' (%sknown options: %s)"):format(name, tostring(key), hint,
    #names > 0 and table.concat(names, ", ") or "none")
end

--- options.check(name, opts, known): `opts` (nil gives a new empty table) must be a table
-- whose keys are all in `known` (a set from options.known). Returns the table. Raises at
-- the caller's line "<name>: options must be a table, got <type>" or "<name>: unknown option
-- '<key>' (did you mean '<closest>'? known options: a, b, ...)", naming the first unknown
-- key in sorted order (so the message does not depend on table traversal).
function M.check(name, opts, known)
  if opts == nil then return {} end
  if type(opts) ~= "table" then lib.raise(("%s: options must be a table, got %s"):format(name, type(opts))) end
  local bad
  for k in pairs(opts) do
    if not known[k] and (bad == nil or tostring(k) < tostring(bad)) then bad = k end
  end
  if bad ~= nil then lib.raise(unknown(name, bad, known)) end
  return opts
end

return M
