--- bench/train.lua: training throughput of one model on Fashion-MNIST, for the side-by-side
-- comparison with PyTorch (bench/train_torch.py does the same there).
--   build/ddplua bench/train.lua --model cnn|mlp --threads N [--steps 200] [--warmup 20]
-- Prints one line: "model=<m> threads=<n> samples_per_s=<x> peak_rss_mb=<y>".
-- Same model, data, batch size (64) and optimizer (SGD lr 0.05 momentum 0.9) as train.lua;
-- the timed steps exclude the warm-up steps and the data loading set-up.
local dl = require "ddplua"
local data = require "ddplua.data"
local optim = require "ddplua.optim"
local clock = require "ddplua.clock"
local ffi = require "ffi"

local model_name, threads, steps, warmup = "cnn", 1, 200, 20
for i = 1, #arg do
  if arg[i] == "--model" then model_name = arg[i + 1] end
  if arg[i] == "--threads" then threads = tonumber(arg[i + 1]) end
  if arg[i] == "--steps" then steps = tonumber(arg[i + 1]) end
  if arg[i] == "--warmup" then warmup = tonumber(arg[i + 1]) end
end
dl.set_num_threads(threads)
dl.manual_seed(0)

local model = require("models." .. model_name)()
local opt = optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9 })
local loader = data.DataLoader(data.FashionMNIST { train = true },
  { batch_size = 64, shuffle = true, generator = dl.Generator(1) })

local done, t0 = 0, nil
for x, y in loader:iter() do
  if done == warmup then t0 = clock.now() end
  opt:zero_grad()
  local loss = dl.cross_entropy(model(x), y)
  loss:backward()
  opt:step()
  done = done + 1
  if done == warmup + steps then break end
end
local seconds = clock.now() - t0
loader:close()

pcall(ffi.cdef, [[
  struct bench_rusage { long utime[2]; long stime[2]; long maxrss; long rest[13]; };
  int getrusage(int who, struct bench_rusage *usage);
]])
local ru = ffi.new("struct bench_rusage")
ffi.C.getrusage(0, ru)
print(("model=%s threads=%d samples_per_s=%.1f peak_rss_mb=%.1f"):format(model_name, threads,
  steps * 64 / seconds, tonumber(ru.maxrss) / 1024))
