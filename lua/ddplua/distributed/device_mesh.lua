--- ddplua.distributed.device_mesh: DeviceMesh and init_device_mesh, after PyTorch's
-- torch/distributed/device_mesh.py. A device mesh lays the ranks of the job out as an
-- n-dimensional array (rank r at row-major position r) and holds, for every mesh
-- dimension, the process group of the ranks that differ from this one only along it.
--
--   local dist = require "ddplua.distributed.distributed_c10d"
--   local mesh = dist.init_device_mesh("cpu", {dist.get_world_size()}, {mesh_dim_names = {"dp"}})
--   local model = DDP(net, {device_mesh = mesh})      -- reduces over mesh:get_group()
--
--   local mesh2 = dist.init_device_mesh("cpu", {2, 2}, {mesh_dim_names = {"dp", "tp"}})
--   local dp = mesh2["dp"]                             -- a 1-D mesh: this rank's dp group
--   local model = DDP(net, {device_mesh = dp})         -- DDP beside tensor parallelism
--
-- DDP's `device_mesh` option takes 1-D meshes only (as PyTorch's DDP): a 1-D mesh of its
-- own, or one dimension sliced out of a larger mesh (mesh["dp"]), the seed's DDP + tensor
-- parallel composition. Slicing (Note [mesh slices]) makes no new process group.
--
-- Note [mesh dimensions count from 1]: as every dimension in ddplua (Torch7's rule), mesh
-- dimensions are numbered 1 .. ndim where PyTorch writes 0 .. ndim-1: PyTorch's
-- mesh.get_group(mesh_dim=0) is mesh:get_group(1). Ranks stay data and count from 0.
local options = require "ddplua.options"
local lib = require "ddplua.lib"

local raise = lib.raise

local DeviceMesh = {}

-- The fields a mesh may leave unset (nil): reading them must not be taken for a slice.
local OPTIONAL_FIELDS = { mesh_dim_names = true, coordinate = true }

-- mesh.field and mesh:method() as usual; mesh["name"] / mesh[{"a", "b"}] slice (Note [mesh
-- slices]). A string that is neither a method, a field nor a dimension name raises.
DeviceMesh.__index = function(self, key)
  local method = DeviceMesh[key]
  if method ~= nil then return method end
  if OPTIONAL_FIELDS[key] then return nil end
  if type(key) == "string" or type(key) == "table" then return DeviceMesh._slice(self, key) end
  return nil
end

local function dist_module() return require "ddplua.distributed.distributed_c10d" end

-- "(2, 1)" / "(2,)", Python's tuple form (PyTorch's messages print tuples).
local function tuple(list)
  local parts = {}
  for i, v in ipairs(list) do parts[i] = tostring(v) end
  if #parts == 1 then return "(" .. parts[1] .. ",)" end
  return "(" .. table.concat(parts, ", ") .. ")"
end

local function quoted_tuple(names)
  local q = {}
  for i, n in ipairs(names) do q[i] = "'" .. n .. "'" end
  return tuple(q)
end

-- Row-major strides of `shape` (the mesh tensor's strides in PyTorch).
local function strides_of(shape)
  local s, acc = {}, 1
  for d = #shape, 1, -1 do
    s[d] = acc
    acc = acc * shape[d]
  end
  return s
end

-- The nested list of ranks of a mesh of `shape` (ranks 0 .. numel-1 in row-major order).
local function rank_array(shape, d, base, strides)
  local out = {}
  for i = 1, shape[d] do
    local r = base + (i - 1) * strides[d]
    out[i] = d == #shape and r or rank_array(shape, d + 1, r, strides)
  end
  return out
end

-- Every list of ranks that vary along dimension `dim` only, in row-major order of the
-- other coordinates (the subgroups of that dimension; PyTorch: mesh.swapdims(-1, dim)
-- .reshape(-1, mesh.size(dim))). Every rank enumerates them in the same order.
local function groups_along(shape, strides, dim)
  local lists = {}
  local function walk(d, base)
    if d > #shape then
      local ranks = {}
      for i = 1, shape[dim] do ranks[i] = base + (i - 1) * strides[dim] end
      lists[#lists + 1] = ranks
      return
    end
    if d == dim then return walk(d + 1, base) end
    for i = 1, shape[d] do walk(d + 1, base + (i - 1) * strides[d]) end
  end
  walk(1, 0)
  return lists
end

local function contains(list, v)
  for _, x in ipairs(list) do if x == v then return true end end
  return false
end

-- This rank's 0-based coordinate in a root mesh of `shape` (row-major over ranks
-- 0 .. numel-1), or nil when the rank is beyond the mesh.
local function coordinate_of(rank, shape, strides, numel)
  if rank >= numel then return nil end
  local c = {}
  for d = 1, #shape do c[d] = math.floor(rank / strides[d]) % shape[d] end
  return c
end

--- DeviceMesh.new(device_type, mesh_shape, mesh_dim_names) -> a DeviceMesh over global
-- ranks 0 .. prod(mesh_shape)-1 of the initialised default group. Collective: every rank
-- of the world calls it with the same arguments (it calls new_group for each subgroup of
-- each dimension, in the same order on every rank). A 1-D mesh of the whole world uses the
-- default group itself (as PyTorch). Use init_device_mesh, which checks the arguments.
function DeviceMesh.new(device_type, shape, names)
  local dist = dist_module()
  local world = dist.get_world_size()
  local rank = dist.get_rank()
  local numel = 1
  for _, n in ipairs(shape) do numel = numel * n end
  local strides = strides_of(shape)
  local self = setmetatable({
    device_type = device_type,
    shape = { unpack(shape) },
    ndim = #shape,
    stride = strides,
    base = 0,
    mesh = rank_array(shape, 1, 0, strides),
    mesh_dim_names = names and { unpack(names) } or nil,
    numel = numel,
    groups = {},
    in_mesh = rank < numel,
    coordinate = coordinate_of(rank, shape, strides, numel),
  }, DeviceMesh)
  if #shape == 1 and numel == world then
    self.groups[1] = dist.get_default_group()
  else
    for d = 1, #shape do
      for _, ranks in ipairs(groups_along(shape, strides, d)) do
        local g = dist.new_group(ranks)
        if contains(ranks, rank) then self.groups[d] = g end
      end
    end
  end
  return self
end

-- Note [mesh slices]
-- mesh["tp"] (or mesh[{"dp", "tp"}], names in the mesh's order) is the mesh of the ranks
-- that share this rank's coordinates on every other dimension, as PyTorch's
-- DeviceMesh.__getitem__: on a (dp=2, tp=2) mesh of ranks {{0, 1}, {2, 3}}, rank 3's
-- mesh["tp"] holds {2, 3} and its mesh["dp"] {1, 3}. A slice keeps the parent's process
-- group of each kept dimension (no new group is made, so slicing is not a collective and
-- any rank may slice at any time) and addresses its ranks as the parent does: rank at
-- coordinate c = base + sum_k c[k] * stride[k], with the parent's strides of the kept
-- dimensions and base = the parent's base plus this rank's offset along the dropped ones.
-- The printed stride is that of PyTorch's sliced mesh tensor: (2,) for mesh["dp"] above.
function DeviceMesh._slice(self, key)
  local names = type(key) == "table" and key or { key }
  local shown = quoted_tuple(names)
  if not self.mesh_dim_names or #self.mesh_dim_names == 0 then
    raise("DeviceMesh: Cannot slice a DeviceMesh without mesh_dim_names! (asked for " .. shown .. ")")
  end
  local dims = {}
  for i, n in ipairs(names) do
    local found
    for d, have in ipairs(self.mesh_dim_names) do
      if have == n then found = d end
    end
    if type(n) ~= "string" or not found or (i > 1 and found <= dims[i - 1]) then
      raise(("DeviceMesh: Invalid mesh_dim_names %s specified. Valid mesh_dim_names are %s, named in this order.")
            :format(shown, quoted_tuple(self.mesh_dim_names)))
    end
    dims[i] = found
  end
  if #dims == 0 then raise("DeviceMesh: a slice needs at least one mesh dimension name") end
  if not self.coordinate then
    raise(("DeviceMesh: rank %d is not in the mesh %s, so it has no slice %s"):format(
      dist_module().get_rank(), tostring(self), shown))
  end
  local kept = {}
  for _, d in ipairs(dims) do kept[d] = true end
  local base = self.base
  for d = 1, self.ndim do
    if not kept[d] then base = base + self.coordinate[d] * self.stride[d] end
  end
  local shape, stride, groups, coord, dim_names = {}, {}, {}, {}, {}
  local numel = 1
  for i, d in ipairs(dims) do
    shape[i], stride[i], groups[i], coord[i] = self.shape[d], self.stride[d], self.groups[d], self.coordinate[d]
    dim_names[i] = self.mesh_dim_names[d]
    numel = numel * shape[i]
  end
  return setmetatable({
    device_type = self.device_type,
    shape = shape,
    ndim = #shape,
    stride = stride,
    base = base,
    mesh = rank_array(shape, 1, base, stride),
    mesh_dim_names = dim_names,
    numel = numel,
    groups = groups,
    in_mesh = true,
    coordinate = coord,
  }, DeviceMesh)
end

--- mesh:get_coordinate() -> this rank's coordinates in the mesh, one per dimension, each
-- counting from 0 (data, as ranks; PyTorch's get_coordinate), or nil when the rank is
-- outside the mesh.
function DeviceMesh:get_coordinate()
  local c = rawget(self, "coordinate")
  return c and { unpack(c) } or nil
end

--- DeviceMesh.is_device_mesh(v) -> true when v is a DeviceMesh.
function DeviceMesh.is_device_mesh(v) return getmetatable(v) == DeviceMesh end

-- The dimension number (1 .. ndim) that mesh_dim names: a number, or one of mesh_dim_names
-- (PyTorch's KeyError texts otherwise).
function DeviceMesh:_dim(mesh_dim, op)
  if type(mesh_dim) == "string" then
    if not self.mesh_dim_names or #self.mesh_dim_names == 0 then
      raise(("DeviceMesh:%s: No `mesh_dim_names` found."):format(op))
    end
    for i, n in ipairs(self.mesh_dim_names) do
      if n == mesh_dim then return i end
    end
    raise(("DeviceMesh:%s: Mesh dimension '%s' does not exist. Available mesh dimensions are: mesh_dim_names=%s")
          :format(op, mesh_dim, quoted_tuple(self.mesh_dim_names)))
  end
  if type(mesh_dim) ~= "number" or mesh_dim % 1 ~= 0 or mesh_dim < 1 or mesh_dim > self.ndim then
    raise(("DeviceMesh:%s: mesh_dim must be a dimension 1 .. %d (mesh dimensions count from 1) or a name, got %s")
          :format(op, self.ndim, tostring(mesh_dim)))
  end
  return mesh_dim
end

local function need_dim(self, mesh_dim, op, extra)
  if mesh_dim == nil then
    if self.ndim > 1 then
      raise(("DeviceMesh:%s: Found the DeviceMesh have %d dimensions. Optional kwarg `mesh_dim` needs to be " ..
             "specified when device_mesh.ndim > 1.%s"):format(op, self.ndim, extra or ""))
    end
    return 1
  end
  return self:_dim(mesh_dim, op)
end

--- mesh:get_group(mesh_dim) -> the process group (ddplua.distributed.group) of mesh dimension
-- mesh_dim (a number 1 .. ndim, or a name of mesh_dim_names) that holds this rank; mesh_dim
-- may be left out for a 1-D mesh. Raises PyTorch's error when it is left out of an n-D
-- mesh, for an unknown name, and when this rank is not in the mesh.
function DeviceMesh:get_group(mesh_dim)
  local d = need_dim(self, mesh_dim, "get_group", " If you want to get the list of all the ProcessGroups " ..
    "in the DeviceMesh, please use `get_all_groups()` instead.")
  local g = self.groups[d]
  if not g then
    raise(("DeviceMesh:get_group: rank %d is not in the mesh (global ranks 0 .. %d)"):format(
      dist_module().get_rank(), self.numel - 1))
  end
  return g
end

--- mesh:get_all_groups() -> the list of this rank's groups, one per mesh dimension.
function DeviceMesh:get_all_groups()
  local out = {}
  for d = 1, self.ndim do out[d] = self:get_group(d) end
  return out
end

--- mesh:size(mesh_dim) -> the number of ranks in the mesh, or along mesh_dim (a number or
-- a name).
function DeviceMesh:size(mesh_dim)
  if mesh_dim == nil then return self.numel end
  return self.shape[self:_dim(mesh_dim, "size")]
end

--- mesh:get_rank() -> this process's global rank (as PyTorch: the default group's rank).
function DeviceMesh:get_rank() return dist_module().get_rank() end

--- mesh:get_local_rank(mesh_dim) -> this rank's rank within the group of mesh_dim (optional
-- for a 1-D mesh), counting from 0. Raises as get_group.
function DeviceMesh:get_local_rank(mesh_dim)
  local d = need_dim(self, mesh_dim, "get_local_rank")
  return dist_module().get_rank(self:get_group(d))
end

--- tostring(mesh): PyTorch's repr, "DeviceMesh((dp=2,), device: 'cpu', stride: (1,))" with
-- names, "DeviceMesh((2, 1), device: 'cpu', stride: (1, 1))" without.
function DeviceMesh:__tostring()
  local dims
  if self.mesh_dim_names then
    local parts = {}
    for i, n in ipairs(self.mesh_dim_names) do parts[i] = n .. "=" .. self.shape[i] end
    dims = tuple(parts)
  else
    dims = tuple(self.shape)
  end
  return ("DeviceMesh(%s, device: '%s', stride: %s)"):format(dims, self.device_type, tuple(self.stride))
end

local KNOWN = options.known { "mesh_dim_names" }

--- dist.init_device_mesh(device_type, mesh_shape, {mesh_dim_names = {...}}) -> a DeviceMesh,
-- after PyTorch's torch.distributed.device_mesh.init_device_mesh. Collective (every rank
-- calls it with the same arguments). device_type: "cpu" or "cuda" (a type, not a device:
-- "cuda:0" raises PyTorch's "Device type with index is not supported" error; the mesh does
-- not choose the current CUDA device, init_process_group's device_id does). mesh_shape: a
-- list of positive integers, e.g. {world_size} (1-D: what DDP takes) or {2, 4}; its product
-- may not exceed the world size ("Mesh should not be bigger than default world size ..."),
-- and when it is smaller the ranks beyond it are outside the mesh. mesh_dim_names: one
-- unique name per dimension. When no default group exists yet, one is initialised from the
-- launcher's environment (env://) with gloo for "cpu" and nccl for "cuda", as PyTorch.
-- Raises for the cases above (PyTorch's texts), for "cuda" without CUDA (with the reason),
-- and for an unknown option.
function DeviceMesh.init_device_mesh(device_type, mesh_shape, opts)
  opts = options.check("init_device_mesh", opts, KNOWN)
  local names = opts.mesh_dim_names
  if type(mesh_shape) ~= "table" or #mesh_shape == 0 then
    raise("init_device_mesh: mesh_shape must be a list of positive integers such as {4}, got " .. tostring(mesh_shape))
  end
  for i, n in ipairs(mesh_shape) do
    if type(n) ~= "number" or n % 1 ~= 0 or n < 1 then
      raise(("init_device_mesh: mesh_shape[%d] must be a positive integer, got %s"):format(i, tostring(n)))
    end
  end
  if names ~= nil then
    if type(names) ~= "table" then
      raise("init_device_mesh: mesh_dim_names must be a list of strings, got " .. type(names))
    end
    local seen = {}
    for i, n in ipairs(names) do
      if type(n) ~= "string" then
        raise(("init_device_mesh: mesh_dim_names[%d] must be a string, got %s"):format(i, type(n)))
      end
      if seen[n] then
        raise(("init_device_mesh: Each mesh_dim_name must be unique. Found repeated mesh_dim_name in " ..
               "mesh_dim_names %s"):format(quoted_tuple(names)))
      end
      seen[n] = true
    end
    if #names ~= #mesh_shape then
      raise(("init_device_mesh: mesh_shape and mesh_dim_names should have same length! " ..
             "Found len(mesh_dim_names): %d and len(mesh_shape):%d."):format(#names, #mesh_shape))
    end
  end
  if type(device_type) ~= "string" then
    raise("init_device_mesh: device_type must be a string ('cpu' or 'cuda'), got " .. type(device_type))
  end
  if not device_type:match("^%a+$") then
    raise(("init_device_mesh: Device type with index is not supported but got %s. Pass the device's type " ..
           "('%s') and choose the device with init_process_group's device_id."):format(
           device_type, device_type:match("^%a*")))
  end
  if device_type ~= "cpu" and device_type ~= "cuda" then
    raise(("init_device_mesh: device_type must be 'cpu' or 'cuda', got '%s'"):format(device_type))
  end
  local dl = require "ddplua.functions"
  if device_type == "cuda" and not dl.cuda.is_available() then
    raise("init_device_mesh: device_type 'cuda' but CUDA is not available: " .. dl.cuda.unavailable_reason())
  end
  local dist = dist_module()
  if not dist.is_initialized() then
    dist.init_process_group { backend = device_type == "cuda" and "nccl" or "gloo" }
  end
  local world = dist.get_world_size()
  local numel = 1
  for _, n in ipairs(mesh_shape) do numel = numel * n end
  if numel > world then
    raise(("init_device_mesh: Mesh should not be bigger than default world size %d, but found %d ranks!")
          :format(world, numel))
  end
  return DeviceMesh.new(device_type, mesh_shape, names)
end

return DeviceMesh
