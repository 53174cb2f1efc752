--- ddplua.data: datasets, transforms and batch loading. `local data = require "ddplua.data"`.
--
--   data.FashionMNIST{train = true}           -- (60000, 1, 28, 28) u8 + labels 0..9
--   data.MNIST{root = ...}, data.CIFAR10{root = ...}, data.TensorDataset(x, y)
--   data.Subset(ds, {0, 5, 9})                -- 0-based dataset indices, as PyTorch
--   data.Compose{data.RandomCrop(32, {padding = 4}), data.RandomHorizontalFlip(),
--                data.ToFloat(), data.Normalize(mean, std)}
--   data.DataLoader(ds, {batch_size = 64, shuffle = true, generator = g, prefetch = 2})
--   data.DataLoader(ds, {batch_size = 8, collate_fn = function(samples) ... return batch end})
--   data.DataLoader(ds, {batch_size = 64, num_workers = 2, persistent_workers = true})
--   data.get_worker_info()                    -- {id, num_workers, seed, dataset} in a worker
--   data.read_idx(path), data.read_cifar(paths)
--   data.text: tokenizers, token files, windows and evaluation for language models
--              (ddplua/data/text/init.lua)
--
-- The dataset protocol is described in ddplua/data/datasets.lua, the sampler protocol and
-- the two loading paths (C with a prefetch thread, or Lua) in ddplua/data/loader.lua, the
-- transforms in ddplua/data/transforms.lua.
local datasets = require "ddplua.data.datasets"
local transforms = require "ddplua.data.transforms"
local loader = require "ddplua.data.loader"
local worker_info = require "ddplua.data.worker_info"

local M = {}

M.TensorDataset = datasets.TensorDataset
M.Subset = datasets.Subset
M.FashionMNIST = datasets.FashionMNIST
M.MNIST = datasets.MNIST
M.CIFAR10 = datasets.CIFAR10
M.Dataset = datasets.Dataset
M.read_idx = datasets.read_idx
M.read_cifar = datasets.read_cifar

M.ToFloat = transforms.ToFloat
M.Normalize = transforms.Normalize
M.RandomCrop = transforms.RandomCrop
M.RandomHorizontalFlip = transforms.RandomHorizontalFlip
M.Compose = transforms.Compose
M.is_transform = transforms.is_transform

M.DataLoader = loader.DataLoader
M.default_collate = loader.default_collate
-- data.get_worker_info(): {id, num_workers, seed, dataset} in a DataLoader worker process,
-- nil in the training process (ddplua/data/worker_info.lua, set by the workers of
-- ddplua/data/dataloader_workers.lua).
M.get_worker_info = worker_info.get_worker_info

-- Text data (tokenizers, token files, windows): loaded on first use of data.text.
setmetatable(M, { __index = function(t, k)
  if k == "text" then
    local text = require "ddplua.data.text"
    rawset(t, k, text)
    return text
  end
end })

--- data.len(obj): length of a dataset or sampler under the protocol (obj:len() or #obj).
M.len = require("ddplua.data.object").len

return M
