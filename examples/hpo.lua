--- examples/hpo.lua: evolutionary hyperparameter search whose workers each train their
-- individual with DistributedDataParallel over several ranks (seed ddp-in-hpo-propulate.txt,
-- Propulate's torch_ddp_example.py). The world is cut into workers of --ranks_per_worker
-- consecutive ranks; each worker has its own process group (dist.new_group), and every
-- collective of its training (DDP, the sanity all_reduce of ones, the validation sums) names
-- that group, so the workers train different individuals at the same time.
--
--   ddplua --nproc_per_node=4 examples/hpo.lua          # 2 workers × 2 ranks
--      [--generations N] [--per_worker K] [--epochs N] [--steps N] [--batch_size B]
--      [--subset N] [--val_subset N] [--ranks_per_worker R] [--out DIR] [--top N] [--seed S]
--      [--save_models DIR]
--
-- Search space (the seed's limits): conv_layers 2–10, activation relu/sigmoid/tanh, lr
-- 1e-4…1e-2 (log-uniform), gamma 0.5…0.999; propagator probabilities crossover 0.7,
-- mutation 0.4, random init 0.1 (ddplua.utils.evolution, Note [breeding]). An individual
-- is the seed's Net (conv_layers 3×3 convolutions of 10 channels, its activation, one
-- linear layer) trained with Adadelta(lr) and StepLR(step_size 1, gamma) for up to --epochs
-- epochs, stopping early after 5 epochs in a row without a better validation loss (the
-- seed's counter is never reset, a slip: it stops after 5 non-improving epochs in all); its
-- loss is the best validation loss: the mean cross-entropy over the validation subset, its
-- sums reduced over the worker's group (the seed applies NLLLoss to the raw logits and
-- divides each rank's share by the whole set's size; neither is copied).
--
-- Generations are synchronous (Propulate breeds asynchronously): at each generation
-- boundary world rank 0 breeds workers × --per_worker individuals from all evaluated ones
-- and sends them to every rank (broadcast_object_list over the world). The workers then
-- train them in rounds, one individual per worker per round; after each round the results
-- are all-gathered over the world and rank 0 writes DIR/population.txt atomically, so a
-- search stopped at any point resumes at the round it was in (evaluated individuals are not
-- trained again; run the same command). At the end rank 0 prints the best individuals and
-- writes DIR/loss.dat (loss per generation) and, with gnuplot, DIR/loss.png.
local dl = require "ddplua"
local nn = require "ddplua.nn"
local optim = require "ddplua.optim"
local data = require "ddplua.data"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local DistributedSampler = require "ddplua.distributed.sampler"
local evo = require "ddplua.utils.evolution"

local parser = require("ddplua.utils.argparse").ArgumentParser { prog = "hpo.lua" }
parser:add_argument("--generations", { type = "number", metavar = "N", help = "generations (default 3)" })
parser:add_argument("--per_worker", { type = "number", metavar = "K", help = "individuals per worker and generation (default 2)" })
parser:add_argument("--ranks_per_worker", { type = "number", metavar = "R", help = "ranks training each individual (default 2)" })
parser:add_argument("--epochs", { type = "number", metavar = "N", help = "most epochs per individual (default 20, the seed's)" })
parser:add_argument("--steps", { type = "number", metavar = "N", help = "most steps per epoch (default: all)" })
parser:add_argument("--batch_size", { type = "number", metavar = "B", help = "batch per rank (default 8, the seed's)" })
parser:add_argument("--subset", { type = "number", metavar = "N", help = "train on the first N samples (default 2000)" })
parser:add_argument("--val_subset", { type = "number", metavar = "N", help = "validate on the first N test samples (default 500)" })
parser:add_argument("--out", { metavar = "DIR", help = "population.txt, loss.dat, loss.png (default runs/hpo)" })
parser:add_argument("--top", { type = "number", metavar = "N", help = "rows of the best-individuals table (default 5)" })
parser:add_argument("--save_models", { metavar = "DIR", help = "each rank writes DIR/worker<W>_rank<R>.safetensors after each individual (R: rank in the worker)" })
parser:add_argument("--seed", { type = "number", metavar = "S", help = "seed of breeding and weights (default 0)" })
local args = parser:parse_args(arg)
local generations, per_worker = args.generations or 3, args.per_worker or 2
local ranks_per_worker, max_epochs = args.ranks_per_worker or 2, args.epochs or 20
local batch_size, seed, out = args.batch_size or 8, args.seed or 0, args.out or "runs/hpo"
local EARLY_STOPPING_LIMIT = 5                                     -- the seed's

local SPACE = {
  { name = "conv_layers", kind = "int", min = 2, max = 10 },
  { name = "activation", kind = "choice", values = { "relu", "sigmoid", "tanh" } },
  { name = "lr", kind = "log", min = 1e-4, max = 1e-2 },
  { name = "gamma", kind = "float", min = 0.5, max = 0.999 },
}
local ACTIVATIONS = { relu = nn.ReLU, sigmoid = nn.Sigmoid, tanh = nn.Tanh }

dist.init_process_group { backend = "gloo" }
local rank, world = dist.get_rank(), dist.get_world_size()
if world % ranks_per_worker ~= 0 then
  error(("hpo.lua: the world size %d is not a multiple of --ranks_per_worker %d"):format(world, ranks_per_worker), 0)
end
local workers = math.floor(world / ranks_per_worker)
local pop_size = workers * per_worker                              -- breeding population, as the seed's 2 × ranks

-- One group per worker; every rank creates every group, in the same order (new_group is
-- collective over the world).
local groups = {}
for w = 0, workers - 1 do
  local ranks = {}
  for r = 0, ranks_per_worker - 1 do ranks[#ranks + 1] = w * ranks_per_worker + r end
  groups[w + 1] = dist.new_group(ranks)
end
local worker = math.floor(rank / ranks_per_worker)
local group = groups[worker + 1]
local group_rank = dist.get_rank(group)

-- The seed's sanity check of the worker's group: an all_reduce of ones sums to its size.
local ones = dl.ones({ 1 })
dist.all_reduce(ones, { group = group })
assert(ones:item() == ranks_per_worker, "hpo.lua: failed test of the worker's process group")

local train_set, val_set = data.FashionMNIST { train = true }, data.FashionMNIST { train = false }
local n_train, n_val = math.min(args.subset or 2000, #train_set), math.min(args.val_subset or 500, #val_set)

-- The seed's Net: conv_layers 3×3 convolutions (1→10, then 10→10, padding 1), each followed
-- by the activation, then one linear layer 10·28·28 → 10.
local function Net(conv_layers, activation)
  local layers = { nn.Conv2d(1, 10, 3, { padding = 1 }), ACTIVATIONS[activation]() }
  for _ = 2, conv_layers do
    layers[#layers + 1] = nn.Conv2d(10, 10, 3, { padding = 1 })
    layers[#layers + 1] = ACTIVATIONS[activation]()
  end
  layers[#layers + 1] = nn.Flatten()
  layers[#layers + 1] = nn.Linear(10 * 28 * 28, 10)
  return nn.Sequential(unpack(layers))
end

-- Train one individual on this worker's ranks (the seed's ind_loss): returns its best
-- validation loss and the epochs run. Collective over `group` only.
local function ind_loss(ind)
  local g = ind.genes
  dl.manual_seed(seed * 100003 + ind.generation * 1009 + ind.index)  -- DDP broadcasts group rank 0's weights anyway
  local model = DDP(Net(g.conv_layers, g.activation), { process_group = group })
  local sampler = DistributedSampler(n_train, { num_replicas = ranks_per_worker, rank = group_rank, shuffle = true, seed = seed })
  local loader = data.DataLoader(train_set, { batch_size = batch_size, sampler = sampler })
  local val_loader = data.DataLoader(val_set, { batch_size = 256,
    sampler = DistributedSampler.DistributedEvalSampler(n_val, { num_replicas = ranks_per_worker, rank = group_rank }) })
  local opt = optim.Adadelta(model:parameters(), { lr = g.lr })
  local scheduler = optim.StepLR(opt, { step_size = 1, gamma = g.gamma })
  local best, since_best, epochs = math.huge, 0, 0
  for epoch = 1, max_epochs do
    epochs = epoch
    sampler:set_epoch(epoch)
    model:train()
    local steps = 0
    for x, y in loader:iter() do
      opt:zero_grad()
      nn.functional.cross_entropy(model(x), y):backward()
      opt:step()
      steps = steps + 1
      if steps == args.steps then break end
    end
    model:eval()
    local sum, count = 0, 0
    dl.no_grad(function()
      for x, y in val_loader:iter() do
        sum = sum + nn.functional.cross_entropy(model(x), y, { reduction = "sum" }):item()
        count = count + y:numel()
      end
    end)
    local s = dist.sum_over_ranks({ sum, count }, { group = group }) -- every validation sample once
    local val_loss = s[1] / s[2]
    if val_loss < best then best, since_best = val_loss, 0 else since_best = since_best + 1 end
    if since_best >= EARLY_STOPPING_LIMIT then break end            -- the same decision on every rank of the group
    scheduler:step()
  end
  model:verify_sync()                                                -- the group's replicas hold the same bytes
  if args.save_models then                                           -- for `ddplua verify` (the seed's compare step)
    require("ddplua.os").mkdir_p(args.save_models)
    require("ddplua.train_state").save_model(("%s/worker%d_rank%d.safetensors"):format(args.save_models, worker, group_rank),
      model.module)
  end
  loader:close(); val_loader:close()
  return best, epochs
end

-- ---- the search --------------------------------------------------------------------------

local pop_path = out .. "/population.txt"
local population = {}
if rank == 0 then
  require("ddplua.os").mkdir_p(out)
  population = evo.load(pop_path, SPACE) or {}
  local done = 0
  for _, ind in ipairs(population) do if ind.loss then done = done + 1 end end
  if #population > 0 then
    print(("hpo: resuming from %s: %d individuals, %d evaluated"):format(pop_path, #population, done))
  end
  print(("hpo: %d workers x %d ranks, %d individuals per generation, %d generations, %d training / %d validation samples")
    :format(workers, ranks_per_worker, pop_size, generations, n_train, n_val))
end

local function of_generation(gen)
  local list = {}
  for _, ind in ipairs(population) do if ind.generation == gen then list[#list + 1] = ind end end
  table.sort(list, function(a, b) return a.index < b.index end)
  return list
end

local trained = 0
for gen = 1, generations do
  if rank == 0 then                                                  -- breed what this generation still lacks
    local have = of_generation(gen)
    if #have < pop_size then
      local evaluated = {}
      for _, ind in ipairs(population) do if ind.generation < gen and ind.loss then evaluated[#evaluated + 1] = ind end end
      local rng = evo.rng(seed * 7919 + gen)
      for _ = 1, #have do evo.breed(evaluated, SPACE, rng, { pop_size = pop_size, crossover_prob = 0.7,
        mutation_prob = 0.4, random_init_prob = 0.1 }) end          -- replay the draws of the kept ones
      for index = #have + 1, pop_size do
        local child = evo.breed(evaluated, SPACE, rng, { pop_size = pop_size, crossover_prob = 0.7,
          mutation_prob = 0.4, random_init_prob = 0.1 })
        child.generation, child.index = gen, index
        population[#population + 1] = child
      end
      evo.save(pop_path, population, SPACE)
    end
  end
  local box = { population }
  dist.broadcast_object_list(box, 0)                                 -- every rank agrees on the population
  population = box[1]

  local pending = {}
  for _, ind in ipairs(of_generation(gen)) do if not ind.loss then pending[#pending + 1] = ind end end
  for first = 1, #pending, workers do                                -- a round: one individual per worker
    local mine = pending[first + worker]
    local result = false
    if mine then
      local loss, epochs = ind_loss(mine)
      result = { generation = mine.generation, index = mine.index, loss = loss, epochs = epochs }
      if group_rank == 0 then
        print(("hpo: worker %d trained generation %d individual %d (conv_layers %d, %s, lr %.3g, gamma %.3f): loss %.4f after %d epoch(s), replicas identical")
          :format(worker, gen, mine.index, mine.genes.conv_layers, mine.genes.activation, mine.genes.lr,
            mine.genes.gamma, loss, epochs))
      end
    end
    local results = {}
    dist.all_gather_object(results, group_rank == 0 and result or false)
    for _, r in ipairs(results) do
      if r then
        trained = trained + 1
        for _, ind in ipairs(population) do
          if ind.generation == r.generation and ind.index == r.index then ind.loss, ind.epochs = r.loss, r.epochs end
        end
      end
    end
    if rank == 0 then evo.save(pop_path, population, SPACE) end     -- checkpoint after every round
  end
end

-- ---- report ------------------------------------------------------------------------------

if rank == 0 then
  local evaluated = {}
  for _, ind in ipairs(population) do if ind.loss and ind.generation <= generations then evaluated[#evaluated + 1] = ind end end
  table.sort(evaluated, function(a, b) return a.loss < b.loss end)
  print(("hpo: %d individuals trained in this run, %d evaluated in all; best %d:"):format(trained, #evaluated,
    math.min(args.top or 5, #evaluated)))
  print("| # | generation | conv_layers | activation | lr | gamma | loss | epochs |")
  print("|---|---|---|---|---|---|---|---|")
  for i = 1, math.min(args.top or 5, #evaluated) do
    local ind = evaluated[i]
    print(("| %d | %d | %d | %s | %.3g | %.3f | %.4f | %d |"):format(i, ind.generation, ind.genes.conv_layers,
      ind.genes.activation, ind.genes.lr, ind.genes.gamma, ind.loss, ind.epochs))
  end
  -- loss per generation: best of the generation, mean of the generation, best so far
  local dat = out .. "/loss.dat"
  local f = assert(io.open(dat, "w"))
  f:write("# generation best mean best_so_far\n")
  local so_far = math.huge
  for gen = 1, generations do
    local best, sum, n = math.huge, 0, 0
    for _, ind in ipairs(of_generation(gen)) do
      if ind.loss then best, sum, n = math.min(best, ind.loss), sum + ind.loss, n + 1 end
    end
    if n > 0 then
      so_far = math.min(so_far, best)
      f:write(("%d %.6f %.6f %.6f\n"):format(gen, best, sum / n, so_far))
    end
  end
  f:close()
  if os.execute("command -v gnuplot >/dev/null 2>&1") == 0 then
    local png = out .. "/loss.png"
    local p = io.popen("gnuplot 2>&1", "w")
    p:write(table.concat({
      "set terminal pngcairo size 700,420 noenhanced",
      ("set output '%s'"):format(png:gsub("'", "")),
      "set xlabel 'generation'; set ylabel 'validation loss'; set grid; set xtics 1",
      ("plot '%s' using 1:2 with linespoints title 'best', '' using 1:3 with linespoints title 'mean', "
        .. "'' using 1:4 with lines title 'best so far'"):format(dat:gsub("'", "")),
    }, "\n"), "\n")
    if p:close() then print("hpo: wrote " .. png .. " (loss per generation, data in " .. dat .. ")")
    else print("hpo: gnuplot failed; wrote the data file " .. dat) end
  else
    print("hpo: gnuplot is not installed (apt-get install gnuplot-nox): wrote the data file " .. dat .. " only")
  end
  print("hpo: population in " .. pop_path)
end
dist.destroy_process_group()
