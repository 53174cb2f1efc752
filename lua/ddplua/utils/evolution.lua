--- ddplua.utils.evolution: a small evolutionary hyperparameter search, after Propulate's
-- default propagator (Helmholtz-AI-Energy/propulate, propulate/utils.py
-- get_default_propagator), and the population file that checkpoints it.
--
--   local evo = require "ddplua.utils.evolution"
--   local space = {                                   -- the search space ("limits")
--     { name = "conv_layers", kind = "int", min = 2, max = 10 },
--     { name = "activation", kind = "choice", values = { "relu", "sigmoid", "tanh" } },
--     { name = "lr", kind = "log", min = 1e-4, max = 1e-2 },        -- log-uniform
--     { name = "gamma", kind = "float", min = 0.5, max = 0.999 },
--   }
--   local rng = evo.rng(seed)
--   local child = evo.breed(evaluated, space, rng, {pop_size = 8, crossover_prob = 0.7,
--                                                  mutation_prob = 0.4, random_init_prob = 0.1})
--   evo.save(path, population, space); local population = evo.load(path, space)
--
-- Note [breeding]: as Propulate's Conditional(pop_size, Compose[SelectMin(pop_size),
-- SelectUniform(2), MateUniform(crossover_prob), PointMutation(mutation_prob),
-- IntervalMutationNormal(sigma_factor = 0.05, probability 1), InitUniform(random_init_prob)],
-- InitUniform): while fewer than pop_size individuals have a loss, a child is uniformly
-- random; after that its two parents are drawn uniformly from the pop_size best, it takes
-- each gene from either parent with probability crossover_prob (else it copies the first
-- parent), with probability mutation_prob one gene is redrawn uniformly, one numeric gene
-- moves by a normal step of sigma_factor × its range (clamped; in log space for "log"
-- genes, rounded for "int" genes), and with probability random_init_prob the child is
-- replaced by a uniformly random one. Propulate breeds asynchronously; here the caller
-- breeds a whole generation at once (see examples/hpo.lua).
--
-- Note [population file]: one line per individual, a header first:
--   generation index <gene names...> loss epochs
-- loss and epochs are "-" while the individual is not evaluated yet. The file is written to
-- <path>.tmp and renamed over <path> (rename is atomic on POSIX file systems), so a reader
-- or an interrupted search never sees half a file.
local lib = require "ddplua.lib"

local M = {}

local KINDS = { int = true, float = true, log = true, choice = true }

local function check_space(space)
  if type(space) ~= "table" or #space == 0 then error("evolution: space must be a non-empty list of genes", 2) end
  for i, g in ipairs(space) do
    if type(g.name) ~= "string" or not KINDS[g.kind] then
      error(("evolution: gene %d needs a name and a kind (int, float, log or choice)"):format(i), 3)
    end
    if g.kind == "choice" and (type(g.values) ~= "table" or #g.values == 0) then
      error(("evolution: gene '%s' (choice) needs a non-empty values list"):format(g.name), 3)
    end
    if g.kind ~= "choice" and not (type(g.min) == "number" and type(g.max) == "number" and g.min < g.max
        and (g.kind ~= "log" or g.min > 0)) then
      error(("evolution: gene '%s' needs numbers min < max (and min > 0 when log)"):format(g.name), 3)
    end
  end
end

--- evo.rng(seed) -> a random-number function rng() in [0, 1) of its own (xorshift64*, Vigna
-- 2014), so breeding does not depend on math.random's shared state. seed: an integer.
function M.rng(seed)
  local s = 0x9E3779B97F4A7C15ULL + (seed or 0) * 0x100000001B3ULL
  if s == 0ULL then s = 1ULL end
  return function()
    s = bit.bxor(s, bit.rshift(s, 12))
    s = bit.bxor(s, bit.lshift(s, 25))
    s = bit.bxor(s, bit.rshift(s, 27))
    local v = s * 0x2545F4914F6CDD1DULL
    return tonumber(bit.rshift(v, 11)) / 9007199254740992 -- 53 bits
  end
end

local function randint(rng, lo, hi) return lo + math.floor(rng() * (hi - lo + 1)) end

-- A standard normal draw (Box-Muller).
local function normal(rng)
  local u = 1 - rng()
  return math.sqrt(-2 * math.log(u)) * math.cos(2 * math.pi * rng())
end

local function random_gene(g, rng)
  if g.kind == "int" then return randint(rng, g.min, g.max)
  elseif g.kind == "choice" then return g.values[randint(rng, 1, #g.values)]
  elseif g.kind == "log" then return math.exp(math.log(g.min) + rng() * (math.log(g.max) - math.log(g.min)))
  else return g.min + rng() * (g.max - g.min) end
end

--- evo.random_individual(space, rng) -> {genes = {name = value}} drawn uniformly (log-uniformly
-- for "log" genes): Propulate's InitUniform.
function M.random_individual(space, rng)
  check_space(space)
  local genes = {}
  for _, g in ipairs(space) do genes[g.name] = random_gene(g, rng) end
  return { genes = genes }
end

-- The normal step of IntervalMutationNormal on a numeric gene, clamped to its range.
local function nudge(g, v, rng, sigma_factor)
  if g.kind == "log" then
    local lo, hi = math.log(g.min), math.log(g.max)
    return math.exp(math.min(hi, math.max(lo, math.log(v) + normal(rng) * sigma_factor * (hi - lo))))
  end
  local x = math.min(g.max, math.max(g.min, v + normal(rng) * sigma_factor * (g.max - g.min)))
  if g.kind == "int" then
    x = math.floor(x + 0.5)
    if x == v then x = math.min(g.max, math.max(g.min, v + (rng() < 0.5 and -1 or 1))) end -- move at least one step
  end
  return x
end

local BREED_KNOWN = { pop_size = true, crossover_prob = true, mutation_prob = true, random_init_prob = true, sigma_factor = true }

--- evo.breed(evaluated, space, rng, opts) -> a new individual {genes = {...}} (Note
-- [breeding]). evaluated: list of individuals with a numeric .loss (lower is better; others
-- are ignored). opts: pop_size (breeding population, > 0), crossover_prob, mutation_prob,
-- random_init_prob (probabilities in [0, 1]), sigma_factor (default 0.05). Raises on an
-- unknown option or a value out of range.
function M.breed(evaluated, space, rng, opts)
  check_space(space)
  for k in pairs(opts) do
    if not BREED_KNOWN[k] then error("evolution.breed: unknown option '" .. tostring(k) .. "'", 2) end
  end
  for _, k in ipairs { "crossover_prob", "mutation_prob", "random_init_prob" } do
    local p = opts[k]
    if type(p) ~= "number" or p < 0 or p > 1 then
      error(("evolution.breed: %s must be a probability in [0, 1], got %s"):format(k, tostring(p)), 2)
    end
  end
  local pop_size = opts.pop_size
  if type(pop_size) ~= "number" or pop_size < 1 then error("evolution.breed: pop_size must be a number >= 1, got " .. tostring(pop_size), 2) end
  local pool = {}
  for _, ind in ipairs(evaluated) do
    if type(ind.loss) == "number" and ind.loss == ind.loss then pool[#pool + 1] = ind end
  end
  if #pool < pop_size then return M.random_individual(space, rng) end        -- Conditional
  table.sort(pool, function(a, b) return a.loss < b.loss end)               -- SelectMin
  local a, b = pool[randint(rng, 1, pop_size)], pool[randint(rng, 1, pop_size)] -- SelectUniform(2)
  local genes = {}
  local mate = rng() < opts.crossover_prob                                    -- MateUniform
  for _, g in ipairs(space) do
    genes[g.name] = (mate and rng() < 0.5) and b.genes[g.name] or a.genes[g.name]
  end
  if rng() < opts.mutation_prob then                                          -- PointMutation
    local g = space[randint(rng, 1, #space)]
    genes[g.name] = random_gene(g, rng)
  end
  local numeric = {}                                                          -- IntervalMutationNormal
  for _, g in ipairs(space) do if g.kind ~= "choice" then numeric[#numeric + 1] = g end end
  if #numeric > 0 then
    local g = numeric[randint(rng, 1, #numeric)]
    genes[g.name] = nudge(g, genes[g.name], rng, opts.sigma_factor or 0.05)
  end
  if rng() < opts.random_init_prob then return M.random_individual(space, rng) end -- InitUniform
  return { genes = genes }
end

local function fmt_gene(g, v)
  if g.kind == "int" then return ("%d"):format(v) end
  if g.kind == "choice" then return tostring(v) end
  return ("%.17g"):format(v)
end

--- evo.save(path, population, space): write the population (a list of {generation, index,
-- genes, loss (number or nil), epochs (number or nil)}) to path atomically (Note [population
-- file]). Raises naming the path when it cannot be written or renamed.
function M.save(path, population, space)
  lib.path(path, "evolution.save")
  check_space(space)
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "w")
  if not f then error("evolution.save: cannot write " .. tmp .. ": " .. tostring(err), 2) end
  local head = { "generation", "index" }
  for _, g in ipairs(space) do head[#head + 1] = g.name end
  head[#head + 1] = "loss"; head[#head + 1] = "epochs"
  f:write(table.concat(head, " "), "\n")
  for _, ind in ipairs(population) do
    local row = { ("%d"):format(ind.generation), ("%d"):format(ind.index) }
    for _, g in ipairs(space) do row[#row + 1] = fmt_gene(g, ind.genes[g.name]) end
    row[#row + 1] = ind.loss and ("%.17g"):format(ind.loss) or "-"
    row[#row + 1] = ind.epochs and ("%d"):format(ind.epochs) or "-"
    f:write(table.concat(row, " "), "\n")
  end
  local ok, werr = f:close()
  if not ok then error("evolution.save: cannot write " .. tmp .. ": " .. tostring(werr), 2) end
  local rok, rerr = os.rename(tmp, path)
  if not rok then error("evolution.save: cannot rename " .. tmp .. " to " .. path .. ": " .. tostring(rerr), 2) end
end

--- evo.load(path, space) -> the population saved by evo.save, or nil when path does not
-- exist. Raises naming the path and line when the header does not match space or a value
-- does not parse.
function M.load(path, space)
  lib.path(path, "evolution.load")
  check_space(space)
  local f = io.open(path, "r")
  if not f then return nil end
  local want = { "generation", "index" }
  for _, g in ipairs(space) do want[#want + 1] = g.name end
  want[#want + 1] = "loss"; want[#want + 1] = "epochs"
  local header = f:read("*l")
  if header ~= table.concat(want, " ") then
    f:close()
    error(("evolution.load: %s: header '%s' does not match the search space ('%s')"):format(
      path, tostring(header), table.concat(want, " ")), 2)
  end
  local population, line_no = {}, 1
  for line in f:lines() do
    line_no = line_no + 1
    local cells = {}
    for c in line:gmatch("%S+") do cells[#cells + 1] = c end
    local function bad(what)
      f:close()
      error(("evolution.load: %s line %d: %s"):format(path, line_no, what), 3)
    end
    if #cells ~= #want then bad(("%d fields, expected %d"):format(#cells, #want)) end
    local ind = { generation = tonumber(cells[1]), index = tonumber(cells[2]), genes = {} }
    if not (ind.generation and ind.index) then bad("generation and index must be integers") end
    for i, g in ipairs(space) do
      local c = cells[i + 2]
      local v = g.kind == "choice" and c or tonumber(c)
      if v == nil then bad(("gene '%s' = '%s' is not a number"):format(g.name, c)) end
      ind.genes[g.name] = v
    end
    ind.loss = tonumber(cells[#want - 1])
    ind.epochs = tonumber(cells[#want])
    population[#population + 1] = ind
  end
  f:close()
  return population
end

return M
