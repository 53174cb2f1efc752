--- ddplua.data: datasets, transforms and batch loading. `local data = require "ddplua.data"`.
--
--   data.FashionMNIST{train = true}           -- (60000, 1, 28, 28) u8 + labels 0..9
--   data.MNIST{root = ...}, data.CIFAR10{root = ...}, data.TensorDataset(x, y)
--   data.Subset(ds, {0, 5, 9})                -- 0-based dataset indices, as PyTorch
--   data.random_split(ds, {0.8, 0.2}, g), data.ConcatDataset{ds1, ds2}
--   data.IterableDataset(class, state)        -- streams, sharded over ranks and workers
--   data.get_worker_info()                    -- nil in the main process
--   data.ImageFolder{root = dir}, data.DatasetFolder{root = dir, loader = fn, extensions = {...}}
--   data.read_image(path), data.write_png(path, img), data.write_jpeg(path, img, quality)
--   data.read_npy(path), data.read_npz(path), data.read_csv(path, {header = true})
--   data.Resize(32), data.CenterCrop(28), data.RandomResizedCrop(24), data.ColorJitter{...},
--   data.ToTensor()                           -- ddplua/data/vision_transforms.lua
--   data.Compose{data.RandomCrop(32, {padding = 4}), data.RandomHorizontalFlip(),
--                data.ToFloat(), data.Normalize(mean, std)}
--   data.DataLoader(ds, {batch_size = 64, shuffle = true, generator = g, prefetch = 2})
--   data.DataLoader(ds, {batch_size = 8, collate_fn = function(samples) ... return batch end})
--   data.DataLoader(ds, {batch_size = 64, num_workers = 2, persistent_workers = true})
--   data.RandomSampler(ds, {replacement = true, num_samples = n}), data.SequentialSampler(ds),
--   data.SubsetRandomSampler(indices), data.WeightedRandomSampler(weights, n),
--   data.BatchSampler(sampler, 32, false)     -- for DataLoader's batch_sampler
--                                             -- ddplua/data/samplers.lua, for `sampler`
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
local random_split = require "ddplua.data.random_split"
local concat_dataset = require "ddplua.data.concat_dataset"
local iterable_dataset = require "ddplua.data.iterable_dataset"
local worker_info = require "ddplua.data.worker_info"
local image = require "ddplua.data.image"
local image_folder = require "ddplua.data.image_folder"
local vision = require "ddplua.data.vision_transforms"
local arrays = require "ddplua.data.arrays"
local samplers = require "ddplua.data.samplers"

local M = {}

M.TensorDataset = datasets.TensorDataset
M.Subset = datasets.Subset
M.FashionMNIST = datasets.FashionMNIST
M.MNIST = datasets.MNIST
M.CIFAR10 = datasets.CIFAR10
M.Dataset = datasets.Dataset
M.read_idx = datasets.read_idx
M.read_cifar = datasets.read_cifar
M.random_split = random_split.random_split
M.ConcatDataset = concat_dataset.ConcatDataset
M.IterableDataset = iterable_dataset.IterableDataset
M.get_worker_info = worker_info.get_worker_info
M.DatasetFolder = image_folder.DatasetFolder
M.ImageFolder = image_folder.ImageFolder
M.IMG_EXTENSIONS = image_folder.IMG_EXTENSIONS
M.read_image = image.read_image
M.write_png = image.write_png
M.write_jpeg = image.write_jpeg
M.read_npy = arrays.read_npy
M.read_npz = arrays.read_npz
M.read_csv = arrays.read_csv

M.ToFloat = transforms.ToFloat
M.Normalize = transforms.Normalize
M.RandomCrop = transforms.RandomCrop
M.RandomHorizontalFlip = transforms.RandomHorizontalFlip
M.Compose = transforms.Compose
M.Resize = vision.Resize
M.CenterCrop = vision.CenterCrop
M.RandomResizedCrop = vision.RandomResizedCrop
M.ColorJitter = vision.ColorJitter
M.ToTensor = vision.ToTensor
M.is_transform = transforms.is_transform

M.DataLoader = loader.DataLoader
M.default_collate = loader.default_collate
M.SequentialSampler = samplers.SequentialSampler
M.RandomSampler = samplers.RandomSampler
M.SubsetRandomSampler = samplers.SubsetRandomSampler
M.WeightedRandomSampler = samplers.WeightedRandomSampler
M.BatchSampler = samplers.BatchSampler

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
