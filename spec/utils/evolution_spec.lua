-- Specs for ddplua.utils.evolution: the propagators of Propulate's default propagator
-- (Note [breeding]) and the population file (Note [population file]).
local evo = require "ddplua.utils.evolution"
local files = require "files"

local SPACE = {
  { name = "conv_layers", kind = "int", min = 2, max = 10 },
  { name = "activation", kind = "choice", values = { "relu", "sigmoid", "tanh" } },
  { name = "lr", kind = "log", min = 1e-4, max = 1e-2 },
  { name = "gamma", kind = "float", min = 0.5, max = 0.999 },
}
local NONE = { pop_size = 2, crossover_prob = 0, mutation_prob = 0, random_init_prob = 0 }

local function in_space(genes)
  return math.floor(genes.conv_layers) == genes.conv_layers and genes.conv_layers >= 2 and genes.conv_layers <= 10
    and ({ relu = true, sigmoid = true, tanh = true })[genes.activation] ~= nil
    and genes.lr >= 1e-4 and genes.lr <= 1e-2 and genes.gamma >= 0.5 and genes.gamma <= 0.999
end

local function with(t, k, v)
  local c = {}
  for a, b in pairs(t) do c[a] = b end
  c[k] = v
  return c
end

local A = { loss = 1.0, genes = { conv_layers = 3, activation = "relu", lr = 1e-3, gamma = 0.6 } }
local B = { loss = 2.0, genes = { conv_layers = 9, activation = "tanh", lr = 5e-3, gamma = 0.9 } }
local WORST = { loss = 9.0, genes = { conv_layers = 5, activation = "sigmoid", lr = 2e-4, gamma = 0.7 } }

describe("ddplua.utils.evolution", function()
  it("rng: a reproducible stream in [0, 1) per seed", function()
    local r1, r2, r3 = evo.rng(7), evo.rng(7), evo.rng(8)
    local same, differ = true, false
    for _ = 1, 1000 do
      local a, b, c = r1(), r2(), r3()
      assert.is_true(a >= 0 and a < 1)
      if a ~= b then same = false end
      if a ~= c then differ = true end
    end
    assert.is_true(same and differ)
  end)

  it("random_individual: uniform in the space, lr log-uniform (its median near 1e-3)", function()
    local rng = evo.rng(1)
    local lrs, acts, layers = {}, {}, {}
    for i = 1, 2001 do
      local ind = evo.random_individual(SPACE, rng)
      assert.is_true(in_space(ind.genes))
      lrs[i] = ind.genes.lr
      acts[ind.genes.activation] = (acts[ind.genes.activation] or 0) + 1
      layers[ind.genes.conv_layers] = true
    end
    table.sort(lrs)
    assert.is_true(lrs[1001] > 7e-4 and lrs[1001] < 1.4e-3, "median lr " .. lrs[1001]) -- uniform: ~5e-3
    for _, a in ipairs { "relu", "sigmoid", "tanh" } do assert.is_true(acts[a] > 550 and acts[a] < 790, a) end
    assert.is_true(layers[2] and layers[10] and not layers[1] and not layers[11])
  end)

  it("breed: random while fewer than pop_size individuals have a loss", function()
    local rng = evo.rng(3)
    local seen = {}
    for _ = 1, 200 do
      local child = evo.breed({ A, { genes = B.genes } }, SPACE, rng, NONE) -- B has no loss: one evaluated < 2
      assert.is_true(in_space(child.genes))
      seen[child.genes.activation] = true
    end
    assert.is_true(seen.relu and seen.sigmoid and seen.tanh)
  end)

  it("breed: without crossover, mutation or random init the child is a parent from the best pop_size with one numeric gene nudged", function()
    local rng = evo.rng(4)
    for _ = 1, 300 do
      local child = evo.breed({ WORST, B, A }, SPACE, rng, NONE)  -- pop_size 2: WORST never breeds
      local g = child.genes
      local p = g.activation == "relu" and A or g.activation == "tanh" and B or error("parent " .. g.activation)
      assert.is_true(in_space(g))
      local changed = 0
      for _, k in ipairs { "conv_layers", "lr", "gamma" } do if g[k] ~= p.genes[k] then changed = changed + 1 end end
      assert.are.equal(1, changed)
      assert.is_true(math.abs(g.gamma - p.genes.gamma) <= 0.05 * 0.499 * 6)    -- 6 sigma
      assert.is_true(math.abs(g.conv_layers - p.genes.conv_layers) <= 3)
    end
  end)

  it("breed: crossover mixes the parents' genes; random init ignores them", function()
    local rng = evo.rng(5)
    local mixed = false
    for _ = 1, 300 do
      local g = evo.breed({ A, B }, SPACE, rng, with(NONE, "crossover_prob", 1)).genes
      local from_a = (g.conv_layers == 3 and 1 or 0) + (g.lr == 1e-3 and 1 or 0) + (g.gamma == 0.6 and 1 or 0)
      local from_b = (g.conv_layers == 9 and 1 or 0) + (g.lr == 5e-3 and 1 or 0) + (g.gamma == 0.9 and 1 or 0)
      assert.are.equal(2, from_a + from_b)                    -- the third numeric gene is the nudged one
      if from_a > 0 and from_b > 0 then mixed = true end
    end
    assert.is_true(mixed)
    local sigmoid = 0
    for _ = 1, 300 do
      local g = evo.breed({ A, B }, SPACE, rng, with(NONE, "random_init_prob", 1)).genes
      assert.is_true(in_space(g))
      if g.activation == "sigmoid" then sigmoid = sigmoid + 1 end -- neither parent's
    end
    assert.is_true(sigmoid > 60, "sigmoid " .. sigmoid)
  end)

  it("breed: point mutation redraws a gene with probability mutation_prob", function()
    local rng = evo.rng(6)
    local other = 0
    for _ = 1, 2000 do -- the only way to a sigmoid child from relu/tanh parents: a redrawn activation
      if evo.breed({ A, B }, SPACE, rng, with(NONE, "mutation_prob", 0.4)).genes.activation == "sigmoid" then other = other + 1 end
    end
    -- P = 0.4 (mutate) × 1/4 (the activation gene) × 1/3 (sigmoid) = 1/30: ~67 of 2000
    assert.is_true(other > 35 and other < 105, "sigmoid children " .. other)
  end)

  it("breed: rejects unknown options and probabilities outside [0, 1]", function()
    assert.has_error(function() evo.breed({}, SPACE, evo.rng(0), with(NONE, "crossover", 1)) end,
      "evolution.breed: unknown option 'crossover'")
    assert.has_error(function() evo.breed({}, SPACE, evo.rng(0), with(NONE, "mutation_prob", 1.5)) end,
      "evolution.breed: mutation_prob must be a probability in [0, 1], got 1.5")
  end)

  describe("the population file", function()
    local dir = files.tmpdir("evolution")
    teardown(function() files.remove(dir) end)

    it("saves and loads exactly (losses of unevaluated individuals stay nil), replacing the old file", function()
      local path = dir .. "/pop.txt"
      local f = assert(io.open(path, "w")); f:write(("x"):rep(10000)); f:close()
      local pop = {
        { generation = 1, index = 1, genes = { conv_layers = 4, activation = "tanh", lr = 1 / 3 * 1e-3, gamma = 0.7123456789012345 },
          loss = 2.302585092994046, epochs = 5 },
        { generation = 1, index = 2, genes = { conv_layers = 10, activation = "relu", lr = 1e-2, gamma = 0.5 } },
      }
      evo.save(path, pop, SPACE)
      assert.is_nil(io.open(path .. ".tmp", "r"))
      assert.are.same(pop, evo.load(path, SPACE))
      assert.matches("^generation index conv_layers activation lr gamma loss epochs\n", files.read(path))
      assert.matches("\n1 2 10 relu 0.01 0.5 %- %-\n$", files.read(path))
      assert.is_nil(evo.load(dir .. "/absent.txt", SPACE))
    end)

    it("names the file and line of a bad population file", function()
      local path = dir .. "/bad.txt"
      local f = assert(io.open(path, "w"))
      f:write("generation index conv_layers activation lr gamma loss epochs\n1 1 4 tanh fast 0.7 - -\n")
      f:close()
      assert.has_error(function() evo.load(path, SPACE) end, ("evolution.load: %s line 2: gene 'lr' = 'fast' is not a number"):format(path))
      f = assert(io.open(path, "w")); f:write("generation index lr loss epochs\n"); f:close()
      assert.has_error(function() evo.load(path, SPACE) end)
    end)
  end)
end)
