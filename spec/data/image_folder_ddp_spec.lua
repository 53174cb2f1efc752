-- Spec for the bring-your-own-data path end to end: an ImageFolder of PNG and JPEG files,
-- written from Fashion-MNIST test images by data.write_png / write_jpeg, trains under
-- 2-rank DDP (a DistributedSampler over the folder, a random-crop / flip / normalize
-- pipeline, gloo), the loss falls and the replicas stay identical.
require "ddplua" -- the tensor methods
local data = require "ddplua.data"
local files = require "files"
local os_ = require "ddplua.os"

local FMNIST = "/usr/share/datasets/fashion-mnist"

describe("ImageFolder under DDP #dist", function()
  local root
  setup(function() root = files.tmpdir("imagefolder") end)
  teardown(function() files.remove(root) end)

  it("trains a small model on a generated folder of PNG and JPEG files", function()
    if not io.open(FMNIST .. "/t10k-images-idx3-ubyte.gz", "rb") then return pending("no " .. FMNIST) end
    local ds = data.FashionMNIST { train = false, transform = false }
    local per_class, count = 16, {}
    local i = 0
    while true do
      i = i + 1
      local x, y = ds:get(i)
      count[y] = (count[y] or 0) + 1
      if count[y] <= per_class then
        local dir = ("%s/%d_%s"):format(root, y, ds.classes[y + 1]:gsub("[^%w]", "_"))
        os_.mkdir_p(dir)
        -- half the class as PNG, half as JPEG
        if count[y] % 2 == 0 then data.write_png(("%s/%04d.png"):format(dir, i), x)
        else data.write_jpeg(("%s/%04d.jpg"):format(dir, i), x, 92) end
      end
      local done = true
      for c = 0, 9 do if (count[c] or 0) < per_class then done = false end end
      if done then break end
    end
    local folder = data.ImageFolder { root = root, mode = "gray" }
    assert.are.equal(10 * per_class, #folder)
    assert.are.equal(10, #folder.classes)

    local mp = require "multiproc"
    local code = ([[
local dl = require "ddplua"
local nn, optim, data = require "ddplua.nn", require "ddplua.optim", require "ddplua.data"
local dist = require "ddplua.distributed"
local DDP = require "ddplua.distributed.ddp"
local DistributedSampler = require "ddplua.distributed.sampler"
dist.init_process_group { backend = "gloo", timeout = 30 }
dl.manual_seed(0)
local ds = data.ImageFolder { root = %q, mode = "gray", generator = dl.Generator(1 + dist.get_rank()),
  transform = data.Compose { data.RandomResizedCrop(28, { scale = { 0.85, 1 } }), data.RandomHorizontalFlip(),
                             data.ToFloat(), data.Normalize(0.2860, 0.3530) } }
local model = DDP(nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10)))
local opt = optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9 })
local sampler = DistributedSampler(ds, { shuffle = true, seed = 0 })
local loader = data.DataLoader(ds, { batch_size = 16, sampler = sampler })
for epoch = 1, 6 do
  sampler:set_epoch(epoch)
  local sum, n = 0, 0
  for x, y in loader:iter() do
    assert(x.dtype == "f32" and x:size(2) == 1 and x:size(3) == 28)
    opt:zero_grad()
    local loss = nn.functional.cross_entropy(model(x), y)
    loss:backward()
    opt:step()
    sum, n = sum + loss:item(), n + 1
  end
  print(("EPOCH %%d %%.6f %%d"):format(epoch, sum / n, n))
end
local s = 0
for _, p in ipairs(model:parameters()) do s = s + p:to("f64"):abs():sum():item() end
print(("PARAMS %%.17g"):format(s))
dist.destroy_process_group()
]]):format(root)
    local r = mp.run { code = code, nprocs = 2, timeout = 60 }
    assert.is_true(r.ok, mp.describe(r))
    local params = {}
    for rank = 1, 2 do
      local out = r[rank].output
      local first = tonumber(out:match("EPOCH 1 (%S+) 5"))
      local last = tonumber(out:match("EPOCH 6 (%S+) 5"))
      assert.is_truthy(first and last, out) -- 80 samples per rank: 5 batches of 16
      assert.is_true(last < 0.7 * first, ("rank %d: loss %g -> %g"):format(rank - 1, first, last))
      params[rank] = out:match("PARAMS (%S+)")
    end
    assert.are.equal(params[1], params[2]) -- DDP keeps the replicas identical
  end)
end)
