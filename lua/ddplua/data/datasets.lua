--- ddplua.data.datasets: TensorDataset, Subset and the built-in image datasets
-- (Fashion-MNIST, MNIST, CIFAR-10), read by the C readers of runtime/io/.
--
-- Dataset protocol (what data.DataLoader needs; any object will do):
--   ds:len() or #ds   number of samples
--   ds:get(i)         sample at position i (1-based, as Lua counts), returning the sample's
--                     parts: tensors, or numbers for labels (class labels are data: 0 .. C-1)
--   ds:c_sources()    optional: a list of source tensors (N, ...) whose sample i-1 is part k
--                     of ds:get(i), and a list of transforms (or nil) per source. When it
--                     returns a list, the loader gathers batches in C on its prefetch thread;
--                     when it is absent or returns nil, batches are built in Lua from ds:get.
-- The datasets below are proxy objects (ddplua.data.object) so that `#ds` works.
local options = require "ddplua.options"
local lib = require "ddplua.lib"
local object = require "ddplua.data.object"
local transforms = require "ddplua.data.transforms"
local ffi, C = lib.ffi, lib.C
local check, wrap, box = lib.check, lib.wrap, lib.box

local M = {}

local function is_tensor(v) return require("ddplua.tensor").is_tensor(v) end

local function file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

--- data.read_idx(path): the IDX file (gzipped or raw) as a tensor of its shape (u8 for
-- image and label files). Raises naming the file and the fault.
function M.read_idx(path)
  lib.path(path, "read_idx")
  check(C.ddp_io_read_idx(box, path))
  return wrap(box[0])
end

--- data.read_cifar(paths): CIFAR-10 binary batch files (a path or a list) -> images
-- (N, 3, 32, 32) u8, labels (N) i64. Raises naming the file and the fault.
function M.read_cifar(paths)
  if type(paths) == "string" then paths = { paths } end
  if type(paths) ~= "table" then lib.raise("read_cifar: paths must be a string or a list of strings, got " .. type(paths)) end
  local arr = ffi.new("const char*[?]", #paths)
  for i, p in ipairs(paths) do arr[i - 1] = lib.path(p, "read_cifar", "paths[" .. i .. "]") end
  local boxes = ffi.new("ddp_tensor*[2]")
  check(C.ddp_io_read_cifar(boxes, boxes + 1, #paths, arr))
  return wrap(boxes[0]), wrap(boxes[1])
end

local function reshape(t, shape)
  local buf, n = lib.shape(shape)
  check(C.ddp_io_reshape(box, t, n, buf))
  return wrap(box[0])
end
M.reshape = reshape

-- ---- TensorDataset ---------------------------------------------------------------------

local TensorDataset = { name = "TensorDataset" }

--- data.TensorDataset(t1, t2, ...): sample i is (t1[i], t2[i], ...), each tk (N, ...) with
-- the same N. ds:get(i) returns new tensors (a 0-d tensor for a 1-d source, as PyTorch).
function M.TensorDataset(...)
  local ts = { ... }
  if #ts == 0 then lib.raise("TensorDataset: expected at least one tensor") end
  for k, t in ipairs(ts) do
    if not is_tensor(t) then lib.raise("TensorDataset: argument " .. k .. " is not a tensor") end
    if t:dim() < 1 then lib.raise("TensorDataset: argument " .. k .. " is 0-d (expected (N, ...))") end
    if t:size(1) ~= ts[1]:size(1) then
      lib.raise(("TensorDataset: size mismatch: tensor 1 has %d samples, tensor %d has %d"):format(
        ts[1]:size(1), k, t:size(1)))
    end
  end
  return object.new(TensorDataset, { tensors = ts })
end

--- ds:len() -> number of samples (the first dimension of the tensors).
function TensorDataset.len(self) return self.tensors[1]:size(1) end

--- ds:get(i) -> the i-th slice of each tensor (i counts from 1); raises out of range.
function TensorDataset.get(self, i)
  local n = TensorDataset.len(self)
  if type(i) ~= "number" or i < 1 or i > n or i % 1 ~= 0 then
    lib.raise(("TensorDataset: index %s out of range 1..%d"):format(tostring(i), n))
  end
  local out = {}
  for k, t in ipairs(self.tensors) do out[k] = transforms.sample(t, i - 1, nil) end
  return unpack(out, 1, #self.tensors)
end

--- ds:c_sources() -> the tensors and no transforms: the loader batches them in C.
function TensorDataset.c_sources(self) return self.tensors, {} end

function TensorDataset.__tostring(self)
  return ("TensorDataset(%d tensors, %d samples)"):format(#self.tensors, TensorDataset.len(self))
end

-- ---- image classification datasets -------------------------------------------------------

local ImageDataset = { name = "ImageDataset" }

--- ds:len() -> number of images.
function ImageDataset.len(self) return self.data:size(1) end

--- ds:get(i) -> image (C, H, W) after the transform (f32 with the default one), label (a
-- number, 0-based class). i counts from 1.
function ImageDataset.get(self, i)
  local n = ImageDataset.len(self)
  if type(i) ~= "number" or i < 1 or i > n or i % 1 ~= 0 then
    lib.raise(("%s: index %s out of range 1..%d"):format(self.name, tostring(i), n))
  end
  local label = self.targets:get(i)
  local tf = self.transform
  local x
  if tf and not transforms.c_able(tf) then
    x = tf(transforms.sample(self.data, i - 1, nil))
  else
    x = transforms.sample(self.data, i - 1, self:_spec())
  end
  if self.target_transform then label = self.target_transform(label) end
  return x, label
end

-- The C spec of the transform, cached.
function ImageDataset._spec(self)
  if self.transform == nil or self.transform == false then return nil end
  if not self.spec_cache then
    self.spec_cache = transforms.spec(self.transform, C.ddp_tensor_dtype(self.data))
  end
  return self.spec_cache
end

--- ds:c_sources() -> the images and labels and the transform spec when the loader can
-- batch them in C (no target_transform, a transform it knows), else nil.
function ImageDataset.c_sources(self)
  if self.target_transform then return nil end
  local tf = self.transform
  if tf and not transforms.c_able(tf) then return nil end
  return { self.data, self.targets }, { tf or nil }
end

function ImageDataset.__tostring(self)
  return ("%s(%s, %d samples, %s)"):format(self.name, self.train and "train" or "test",
    ImageDataset.len(self), tostring(self.transform or "no transform"))
end

local function make(name, data, targets, opts, default_transform, classes)
  local tf = opts.transform
  if tf == nil then tf = default_transform end
  if tf ~= false and tf ~= nil and not transforms.is_transform(tf) and type(tf) ~= "function" then
    lib.raise(name .. ": transform must be a transform object, a function or false")
  end
  if type(tf) == "function" then tf = transforms.Compose { tf } end
  return object.new(ImageDataset, {
    name = name, data = data, targets = targets, transform = tf or false,
    target_transform = opts.target_transform, train = opts.train ~= false,
    root = opts.root, classes = classes,
  })
end

local function read_mnist_like(name, opts, default_root)
  opts = opts or {}
  local root = opts.root or default_root
  if not root then lib.raise(name .. ": root is required (the folder holding the IDX files)") end
  lib.path(root, name, "root")
  local prefix = (opts.train == false) and "t10k" or "train"
  local function find(base)
    for _, p in ipairs { root .. "/" .. base .. ".gz", root .. "/" .. base } do
      if file_exists(p) then return p end
    end
    lib.raise(("%s: %s/%s(.gz) not found"):format(name, root, base))
  end
  local images = M.read_idx(find(prefix .. "-images-idx3-ubyte"))
  local labels = M.read_idx(find(prefix .. "-labels-idx1-ubyte"))
  if images:dim() ~= 3 or labels:dim() ~= 1 or images:size(1) ~= labels:size(1) then
    lib.raise(("%s: images %s and labels %s do not match: expected (N, H, W) and (N)"):format(
      name, table.concat(images:size(), "x"), table.concat(labels:size(), "x")))
  end
  local n, h, w = images:size(1), images:size(2), images:size(3)
  check(C.ddp_to_dtype(box, labels, C.DDP_I64))
  local targets = wrap(box[0])
  return reshape(images, { n, 1, h, w }), targets
end

local KNOWN = options.known { "root", "train", "transform", "target_transform" }

--- data.FashionMNIST{root = "/usr/share/datasets/fashion-mnist", train = true,
-- transform = ..., target_transform = fn}: Zalando's Fashion-MNIST (Xiao, Rasul, Vollgraf
-- 2017), 60000 train / 10000 test images (N, 1, 28, 28) u8 with labels 0..9 (i64), read
-- from train-images-idx3-ubyte.gz etc. (Debian's dataset-fashion-mnist puts them in the
-- default root). Default transform: Compose{ToFloat(), Normalize(0.2860, 0.3530)}, the
-- mean and std of the training images scaled to [0, 1]; transform = false gives raw u8.
function M.FashionMNIST(opts)
  opts = options.check("FashionMNIST", opts, KNOWN)
  local images, labels = read_mnist_like("FashionMNIST", opts, "/usr/share/datasets/fashion-mnist")
  return make("FashionMNIST", images, labels, opts,
    transforms.Compose { transforms.ToFloat(), transforms.Normalize(0.2860, 0.3530) },
    { "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot" })
end

--- data.MNIST{root = path, train = true, transform = ...}: LeCun's MNIST digits in the same
-- IDX layout (root required). Default transform: Compose{ToFloat(), Normalize(0.1307,
-- 0.3081)} (the training set's mean and std).
function M.MNIST(opts)
  opts = options.check("MNIST", opts, KNOWN)
  local images, labels = read_mnist_like("MNIST", opts, nil)
  return make("MNIST", images, labels, opts,
    transforms.Compose { transforms.ToFloat(), transforms.Normalize(0.1307, 0.3081) },
    { "0", "1", "2", "3", "4", "5", "6", "7", "8", "9" })
end

--- data.CIFAR10{root = path, train = true, transform = ...}: Krizhevsky's CIFAR-10 binary
-- version: data_batch_1.bin .. data_batch_5.bin (train, 50000) or test_batch.bin (10000)
-- in root (or in root/cifar-10-batches-bin, where the archive unpacks). Images
-- (N, 3, 32, 32) u8, labels 0..9. Default transform: Compose{ToFloat(), Normalize({0.4914,
-- 0.4822, 0.4465}, {0.2470, 0.2435, 0.2616})}, the per-channel mean and std of the
-- training images.
function M.CIFAR10(opts)
  opts = options.check("CIFAR10", opts, KNOWN)
  local root = opts.root
  if not root then lib.raise("CIFAR10: root is required (the folder holding data_batch_1.bin ...)") end
  lib.path(root, "CIFAR10", "root")
  local names = opts.train == false and { "test_batch.bin" }
    or { "data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin" }
  local dir = root
  if not file_exists(dir .. "/" .. names[1]) and file_exists(root .. "/cifar-10-batches-bin/" .. names[1]) then
    dir = root .. "/cifar-10-batches-bin"
  end
  local paths = {}
  for i, nm in ipairs(names) do
    paths[i] = dir .. "/" .. nm
    if not file_exists(paths[i]) then lib.raise("CIFAR10: " .. paths[i] .. " not found") end
  end
  local images, labels = M.read_cifar(paths)
  return make("CIFAR10", images, labels, opts,
    transforms.Compose { transforms.ToFloat(),
      transforms.Normalize({ 0.4914, 0.4822, 0.4465 }, { 0.2470, 0.2435, 0.2616 }) },
    { "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck" })
end

-- ---- Subset ------------------------------------------------------------------------------

local Subset = { name = "Subset" }

-- The indices as a 1-d i64 tensor, checked against the dataset's length n.
local function subset_indices(indices, n)
  local t
  if is_tensor(indices) then
    local dt = indices.dtype
    if indices:dim() ~= 1 or (dt ~= "i64" and dt ~= "i32" and dt ~= "u8") then
      lib.raise(("Subset: indices must be a table or a 1-d integer tensor, got a %d-d %s tensor")
        :format(indices:dim(), dt))
    end
    t = indices:to("i64"):contiguous():clone() -- the caller's later changes stay theirs
  elseif type(indices) == "table" then
    for k, v in ipairs(indices) do
      if type(v) ~= "number" or v % 1 ~= 0 then
        lib.raise(("Subset: indices[%d] = %s is not an integer"):format(k, tostring(v)))
      end
    end
    local values = ffi.new("double[?]", math.max(1, #indices))
    for k, v in ipairs(indices) do values[k - 1] = v end
    check(C.ddp_tensor_from_data(box, 1, ffi.new("int64_t[1]", #indices), C.DDP_I64, values, C.DDP_F64))
    t = wrap(box[0])
  else
    lib.raise("Subset: indices must be a table or a 1-d integer tensor, got " .. type(indices))
  end
  local p = ffi.cast("const int64_t*", C.ddp_tensor_data(t))
  for k = 0, t:numel() - 1 do
    local v = p[k]
    if v < 0 or v >= n then
      lib.raise(("Subset: indices[%d] = %d is out of range 0..%d (indices are 0-based, as "
        .. "PyTorch's and as a sampler's)"):format(k + 1, tonumber(v), n - 1))
    end
  end
  return t
end

--- data.Subset(dataset, indices): the samples of `dataset` at `indices`, in that order
-- (PyTorch's torch.utils.data.Subset). `indices` is a Lua table of integers or a 1-d integer
-- tensor (copied) of 0-based dataset indices: data values, like the indices a sampler
-- yields and index_select takes, so dl.randperm(n) or a sampler's indices() fit as they
-- are; repeats are allowed. The subset follows the dataset protocol: #sub = #indices and
-- sub:get(i) (i counts from 1, as every dataset's get) = dataset:get(indices[i] + 1).
-- Fields: sub.dataset, sub.indices (the 1-d i64 tensor). Works with DataLoader and
-- DistributedSampler like any dataset; when `dataset` has c_sources() the loader gathers
-- the subset's batches in C from the sources' rows at `indices`, copied once (len(sub)
-- samples) when a loader first asks. Raises naming the first index that is not an integer
-- or outside 0 .. #dataset-1, or a bad argument.
function M.Subset(dataset, indices)
  if dataset == nil or (type(dataset) ~= "table" and type(dataset) ~= "userdata") then
    lib.raise("Subset: expected a dataset, got " .. type(dataset))
  end
  local n = object.len(dataset)
  return object.new(Subset, { dataset = dataset, indices = subset_indices(indices, n) })
end

--- sub:len() -> number of indices.
function Subset.len(self) return self.indices:numel() end

--- sub:get(i) -> dataset:get(indices[i] + 1), i counting from 1; raises out of range.
function Subset.get(self, i)
  local n = Subset.len(self)
  if type(i) ~= "number" or i < 1 or i > n or i % 1 ~= 0 then
    lib.raise(("Subset: index %s out of range 1..%d"):format(tostring(i), n))
  end
  local p = ffi.cast("const int64_t*", C.ddp_tensor_data(self.indices))
  return self.dataset:get(tonumber(p[i - 1]) + 1)
end

--- sub:c_sources() -> the dataset's sources taken at the indices (index_select on the first
-- dimension, made once and kept) and its transforms, or nil when the dataset has none.
function Subset.c_sources(self)
  local ds = self.dataset
  local ok, f = pcall(function() return ds.c_sources end)
  if not ok or type(f) ~= "function" then return nil end
  local sources, tfs = f(ds)
  if not sources then return nil end
  local cache = self.sources_cache
  if not cache or cache.from ~= sources then -- a dataset may build a new list per call
    cache = { from = sources, rows = {} }
    for k, src in ipairs(sources) do cache.rows[k] = src:index_select(1, self.indices) end
    self.sources_cache = cache
  end
  return cache.rows, tfs
end

function Subset.__tostring(self)
  return ("Subset(%s, %d samples)"):format(tostring(self.dataset), Subset.len(self))
end

--- data.Dataset(class, state): make a proxy dataset object (so `#ds` works) with methods
-- from `class` (needs len and get) over the fields in `state`.
function M.Dataset(class, state)
  if type(class) ~= "table" or type(class.get) ~= "function" or type(class.len) ~= "function" then
    lib.raise("Dataset: class must have get(self, i) and len(self) methods")
  end
  return object.new(class, state or {})
end

return M
