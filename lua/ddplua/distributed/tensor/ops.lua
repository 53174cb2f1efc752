--- ddplua.distributed.tensor.ops: the sharding rules of the ops tensor parallelism needs, on
-- DTensors (PyTorch's DTensor sharding propagation, one rule per op family):
--
--   element-wise   unary ops and + - * / between DTensors, tensors and numbers: pieces
--                  computed locally; a Partial operand is reduced first unless the op is
--                  linear in it (negation, * or / by a replicated value, + - of two Partials)
--   linear/matmul  per mesh dimension, x (.., in) against weight (out, in):
--                    x Replicate, weight Replicate      -> Replicate
--                    x Shard(batch dim), weight Replicate -> Shard(batch dim)
--                    x Replicate, weight Shard(1)       -> Shard(-1)  (column parallel)
--                    x Shard(-1), weight Shard(2)       -> Partial    (row parallel)
--                  other combinations are redistributed to one of these first
--   embedding      weight Replicate -> the ids' placement; Shard(1) (vocabulary rows) ->
--                  Partial, ids outside this rank's rows giving zeros; Shard(2) -> Shard(-1)
--   layer_norm     x Replicate or sharded outside the normalised dimensions -> x's placements
--   dropout        masks drawn for the whole tensor from the generator, each rank taking its
--                  piece (Note [DTensor dropout])
--   cross_entropy  logits Replicate, or sharded along the classes (the last dimension) on one
--                  mesh dimension: the vocabulary-parallel loss (loss_parallel), never
--                  gathering the logits
--
-- Parameters used by every rank of a mesh dimension on its own piece of the data (a weight
-- against batch-sharded inputs) get their gradients all-reduced over that dimension in
-- backward (Note [DTensor gradients]). Any other op raises "DTensor: op 'name' has no
-- sharding rule (placements ...)".
local lib = require "ddplua.lib"
local dl = require "ddplua.functions"
local Function = require "ddplua.autograd.function"
local placement_types = require "ddplua.distributed.tensor.placement_types"
local coll = require "ddplua.distributed.tensor._collectives"

local raise = lib.raise
local Shard, Replicate, Partial = placement_types.Shard, placement_types.Replicate, placement_types.Partial
local tuple = placement_types.tuple

local M = {}

local DTensor = require "ddplua.distributed.tensor.dtensor"
local function DT() return DTensor end
local function is_dt(v) return DT().is_dtensor(v) end

local function all_replicate(n)
  local r = {}
  for i = 1, n do r[i] = Replicate() end
  return r
end

-- dt with every Partial placement reduced to Replicate.
local function no_partial(dt)
  local want, change = {}, false
  for i, p in ipairs(dt.placements) do
    want[i] = p
    if p.kind == "partial" then want[i], change = Replicate(), true end
  end
  return change and dt:redistribute(dt.device_mesh, want) or dt
end

-- dt redistributed so that mesh dimension i holds placement p (others unchanged).
local function with_placement(dt, i, p)
  if dt.placements[i] == p then return dt end
  local want = { unpack(dt.placements) }
  want[i] = p
  return dt:redistribute(dt.device_mesh, want)
end

-- ---- element-wise ----------------------------------------------------------------------

-- The replicated operand `t` (a plain tensor of the whole shape, or broadcastable to it)
-- cut as the DTensor `like` is cut: along each sharded dimension t has at full size.
local function cut_like(t, like)
  local mesh, n = like.device_mesh, like:dim()
  local s = t:size()
  local coord = mesh:get_coordinate()
  for i, p in ipairs(like.placements) do
    if p.kind == "shard" then
      local d = p.dim - (n - #s)
      if d >= 1 and s[d] > 1 then
        local start, len = placement_types.local_range(s[d], mesh.shape[i], coord[i])
        t = t:narrow(d, start + 1, len)
        s = t:size()
      end
    end
  end
  return t
end

-- Does every mesh dimension of dt hold Shard or Replicate (no Partial)?
local function has_partial(dt)
  for _, p in ipairs(dt.placements) do if p.kind == "partial" then return true end end
  return false
end

local function all_replicated(dt)
  for _, p in ipairs(dt.placements) do if p.kind ~= "replicate" then return false end end
  return true
end

local function same_placements(a, b)
  for i, p in ipairs(a.placements) do if p ~= b.placements[i] then return false end end
  return true
end

-- a op b where at least one is a DTensor; `linear_in_partial` tells which combinations keep
-- a Partial operand unreduced.
local function binary(name, fn, a, b)
  local da, db = is_dt(a), is_dt(b)
  local like = da and a or b
  if da and db and a.device_mesh ~= b.device_mesh then
    raise(("DTensor: op '%s' between DTensors on different meshes"):format(name))
  end
  -- Partial operands: + and - keep two Partials of the same op; * and / keep a Partial
  -- against a replicated value (number or all-Replicate); everything else reduces first.
  local keep = false
  if da and db and has_partial(a) and has_partial(b) and same_placements(a, b) and (name == "add" or name == "sub") then
    keep = true
  elseif name == "mul" or name == "div" then
    -- linear in the Partial operand when the other is a number or replicated everywhere
    local other = da and b or a
    local other_replicated = type(other) == "number" or (is_dt(other) and all_replicated(other))
    keep = other_replicated and not (name == "div" and db and has_partial(b))
  end
  if not keep then
    if da then a = no_partial(a) end
    if db then b = no_partial(b) end
  end
  if da and db and not same_placements(a, b) then
    -- bring the one with fewer shards to the other's placements
    b = b:redistribute(a.device_mesh, a.placements)
  end
  local la = da and a:to_local() or (dl.is_tensor(a) and cut_like(a, like) or a)
  local lb = db and b:to_local() or (dl.is_tensor(b) and cut_like(b, like) or b)
  local out = fn(la, lb)
  local base = da and a or b
  local shape = out:dim() == base:dim() and base:size() or nil
  if not shape then raise(("DTensor: op '%s' would broadcast the DTensor of shape (%s) to more dimensions")
    :format(name, table.concat(base:size(), ", "))) end
  return DT()._new(out, base.device_mesh, base.placements, shape)
end

M.__add = function(a, b) return binary("add", function(x, y) return x + y end, a, b) end
M.__sub = function(a, b) return binary("sub", function(x, y) return x - y end, a, b) end
M.__mul = function(a, b) return binary("mul", function(x, y) return x * y end, a, b) end
M.__div = function(a, b) return binary("div", function(x, y) return x / y end, a, b) end
M.__unm = function(a) return DT()._new(-a:to_local(), a.device_mesh, a.placements, a:size()) end

local UNARY = { relu = true, gelu = true, tanh = true, sigmoid = true, exp = true, log = true, sqrt = true,
  rsqrt = true, abs = true, silu = true, sin = true, cos = true, pow = true, square = true }
-- ops linear in their input: a Partial input stays Partial
local LINEAR_UNARY = { neg = true }

local function unary(name)
  return function(self, ...)
    local x = LINEAR_UNARY[name] and self or no_partial(self)
    local l = x:to_local()
    return DT()._new(l[name](l, ...), x.device_mesh, x.placements, x:size())
  end
end

-- ---- linear / matmul ---------------------------------------------------------------------

local function as_dt(t, like)
  if is_dt(t) then return t end
  return DT().from_local(t, like.device_mesh, all_replicate(like.device_mesh.ndim))
end

--- linear(x, weight, bias) -> x weight^T + bias on DTensors (x (.., in), weight (out, in),
-- bias (out) or nil; plain tensors are taken as Replicate), with the rules above.
function M.linear(x, weight, bias)
  local mesh = (is_dt(x) and x or weight).device_mesh
  x, weight = as_dt(x, weight), as_dt(weight, x)
  if bias ~= nil then bias = as_dt(bias, x) end
  local n = x:dim()
  local out_p, copy_x, copy_w = {}, {}, {}
  for i = 1, mesh.ndim do
    if x.placements[i].kind == "partial" then x = with_placement(x, i, Replicate()) end
    local px, pw = x.placements[i], weight.placements[i]
    if pw.kind == "partial" then weight = with_placement(weight, i, Replicate()); pw = weight.placements[i] end
    if px.kind == "shard" and px.dim < n then -- batch-sharded input
      if pw.kind ~= "replicate" then weight = with_placement(weight, i, Replicate()) end
      out_p[i], copy_w[i] = px, true
    elseif pw.kind == "shard" and pw.dim == 1 then -- column parallel
      if px.kind ~= "replicate" then x = with_placement(x, i, Replicate()) end
      out_p[i], copy_x[i] = Shard(n), true
    elseif pw.kind == "shard" and pw.dim == 2 then -- row parallel
      if not px:is_shard(n) then x = with_placement(x, i, Shard(n)) end
      out_p[i] = Partial()
    else -- weight replicated, x replicated or sharded along the contracted dimension
      if px.kind ~= "replicate" then x = with_placement(x, i, Replicate()) end
      out_p[i] = Replicate()
    end
  end
  local lx, lw = x:to_local(), weight:to_local()
  local lb
  for i = 1, mesh.ndim do
    if copy_x[i] then lx = coll.copy(lx, mesh:get_group(i)) end
    if copy_w[i] then lw = coll.copy(lw, mesh:get_group(i)) end
  end
  if bias ~= nil then
    local want = {}
    for i = 1, mesh.ndim do
      local o = out_p[i]
      want[i] = (o.kind == "shard" and o.dim == n) and Shard(1) or Replicate()
    end
    bias = bias:redistribute(mesh, want)
    lb = bias:to_local()
    for i = 1, mesh.ndim do
      if out_p[i].kind == "partial" then lb = coll.partition(lb, "sum", mesh:get_group(i))
      elseif copy_w[i] then lb = coll.copy(lb, mesh:get_group(i)) end
    end
  end
  local shape = x:size()
  shape[n] = weight:size(1)
  return DT()._new(dl.linear(lx, lw, lb), mesh, out_p, shape)
end

--- matmul(a, b) -> a @ b for a (.., n, k) and a 2-d b (k, m), as linear(a, b^T).
function M.matmul(a, b)
  if is_dt(b) and b:dim() ~= 2 then
    raise(("DTensor: op 'matmul' has a sharding rule for a 2-d right operand only, got (%s) with placements %s")
          :format(table.concat(b:size(), ", "), tuple(b.placements)))
  end
  local like = is_dt(a) and a or b
  b = as_dt(b, like)
  local tp = {}
  for i, p in ipairs(b.placements) do tp[i] = p.kind == "shard" and Shard(3 - p.dim) or p end
  local bs = b:size()
  local bt = DT()._new(b:to_local():t(), b.device_mesh, tp, { bs[2], bs[1] })
  return M.linear(a, bt, nil)
end

-- ---- embedding ---------------------------------------------------------------------------

--- embedding(ids, weight, opts) -> (ids..., D): ids a tensor or DTensor (Replicate or
-- Shard), weight (V, D) a DTensor. Vocabulary-sharded weight gives a Partial output.
function M.embedding(ids, weight, opts)
  local mesh = weight.device_mesh
  local lids = ids
  local id_p = all_replicate(mesh.ndim)
  if is_dt(ids) then
    ids = no_partial(ids)
    lids, id_p = ids:to_local(), ids.placements
  end
  local n = lids:dim() + 1
  local out_p, lw = {}, weight:to_local()
  local vocab_mask
  for i = 1, mesh.ndim do
    local pw = weight.placements[i]
    if pw.kind == "partial" then weight = with_placement(weight, i, Replicate()); pw = Replicate(); lw = weight:to_local() end
    if pw.kind == "shard" and pw.dim == 1 then
      if id_p[i].kind ~= "replicate" then
        raise(("DTensor: op 'embedding' with a vocabulary-sharded weight needs replicated ids on mesh dimension %d, got %s")
              :format(i, tostring(id_p[i])))
      end
      local start, len = placement_types.local_range(weight:size(1), mesh.shape[i], mesh:get_coordinate()[i])
      local inside = lids:ge(start) * lids:lt(start + len)
      vocab_mask = inside
      lids = ((lids - start) * inside:to(lids.dtype))
      out_p[i] = Partial()
    elseif pw.kind == "shard" then
      out_p[i] = Shard(n)
    else
      out_p[i] = id_p[i]
      if id_p[i].kind == "shard" then lw = coll.copy(lw, mesh:get_group(i)) end
    end
  end
  local out = dl.embedding(lids, lw, opts)
  if vocab_mask then out = out * vocab_mask:to(out.dtype):unsqueeze(-1) end
  local shape = is_dt(ids) and ids:size() or ids:size()
  shape[#shape + 1] = weight:size(2)
  return DT()._new(out, mesh, out_p, shape)
end

-- ---- layer norm --------------------------------------------------------------------------

--- layer_norm(x, normalized_shape, opts) on a DTensor x (weight and bias in opts: tensors or
-- replicated DTensors).
function M.layer_norm(x, normalized_shape, opts)
  x = no_partial(x)
  local mesh, n = x.device_mesh, x:dim()
  local k = type(normalized_shape) == "number" and 1 or #normalized_shape
  opts = opts or {}
  local w, b = opts.weight, opts.bias
  if is_dt(w) then w = w:full_tensor() end
  if is_dt(b) then b = b:full_tensor() end
  for i = 1, mesh.ndim do
    local p = x.placements[i]
    if p.kind == "shard" and p.dim > n - k then x = with_placement(x, i, Replicate())
    elseif p.kind == "shard" then
      if w then w = coll.copy(w, mesh:get_group(i)) end
      if b then b = coll.copy(b, mesh:get_group(i)) end
    end
  end
  local y = dl.layer_norm(x:to_local(), normalized_shape, { weight = w, bias = b, eps = opts.eps })
  return DT()._new(y, mesh, x.placements, x:size())
end

-- ---- dropout -----------------------------------------------------------------------------

-- Note [DTensor dropout]: the mask of a DTensor is the mask dropout would draw for the
-- whole tensor (one draw of the global shape from the generator, the same number of random
-- values as a plain dropout), each rank keeping its piece. So every rank of a Replicate
-- dimension applies the same mask and a sharded tensor gets exactly the single-process
-- mask, provided every rank's generator is in the same state (seed the ranks alike, e.g.
-- dl.manual_seed(s) on every rank: PyTorch's DTensor RNG tracker syncs its seed the same
-- way). Costs a mask of the global size per rank.
--- dropout(x, p, opts) on a DTensor x (opts.training, opts.generator as dl.dropout).
function M.dropout(x, p, opts)
  if (opts and opts.training == false) or p == 0 then return x end
  x = no_partial(x)
  local ones = dl.ones(x:size(), { dtype = x.dtype, device = x.device })
  local mask = dl.dropout(ones, p, opts)
  return DT()._new(x:to_local() * cut_like(mask, x), x.device_mesh, x.placements, x:size())
end

-- ---- cross entropy (loss_parallel) -----------------------------------------------------

local VocabParallelCE = Function:extend("VocabParallelCrossEntropy")

-- logits (N, Vl) this rank's classes [start, start + Vl); target (N) i64 class ids.
function VocabParallelCE.forward(ctx, logits, target, start, group, ignore_index)
  local dist = require "ddplua.distributed.distributed_c10d"
  local Vl = logits:size(2)
  local m = logits:max(2) -- (N)
  dist.all_reduce(m, { op = "max", group = group })
  local z = logits - m:unsqueeze(2)
  local e = z:exp()
  local s = e:sum(2)
  dist.all_reduce(s, { op = "sum", group = group })
  local inside = target:ge(start) * target:lt(start + Vl)
  local local_t = (target - start) * inside:to(target.dtype)
  local picked = z:gather(2, local_t:unsqueeze(2)):squeeze(2) * inside:to(z.dtype)
  dist.all_reduce(picked, { op = "sum", group = group })
  local valid = target:ne(ignore_index):to(z.dtype)
  local count = valid:sum():item()
  local loss = ((s:log() - picked) * valid):sum() / math.max(count, 1)
  if count == 0 then loss = loss * (0 / 0) end -- PyTorch: nan when every target is ignored
  ctx.softmax = e / s:unsqueeze(2)
  ctx.local_t, ctx.inside, ctx.valid, ctx.count = local_t, inside, valid, math.max(count, 1)
  return loss
end

--- VocabParallelCE's backward: (softmax - one-hot of the target) * g / count on this rank's
-- classes, rows with ignore_index zero.
function VocabParallelCE.backward(ctx, g)
  local onehot = dl.zeros_like(ctx.softmax):scatter_add(2, ctx.local_t:unsqueeze(2),
    ctx.inside:to(ctx.softmax.dtype):unsqueeze(2))
  local scale = ctx.valid:unsqueeze(2) * (g / ctx.count)
  return (ctx.softmax - onehot) * scale
end

--- cross_entropy(logits, target, opts) -> the mean loss over the rows, a Replicate 0-d
-- DTensor. logits (N, V) DTensor: Replicate, or Shard(2) (the classes) on one mesh dimension
-- and Replicate on the others: each rank computes over its classes, with three all-reduces
-- of (N) values (max, sum of exponentials, the target's logit), never the whole (N, V);
-- target (N) i64 tensor (replicated). opts.ignore_index (-100). Other placements are
-- gathered first.
function M.cross_entropy(logits, target, opts)
  local mesh = logits.device_mesh
  local ignore = opts and opts.ignore_index or -100
  for k, v in pairs(opts or {}) do
    if k ~= "ignore_index" and not (k == "reduction" and v == "mean") then
      raise(("DTensor: op 'cross_entropy' supports ignore_index and reduction = 'mean' only, got %s = %s")
            :format(tostring(k), tostring(v)))
    end
  end
  if is_dt(target) then target = target:full_tensor() end
  logits = no_partial(logits)
  local vocab_dim
  for i, p in ipairs(logits.placements) do
    if p.kind == "shard" and p.dim == 2 and vocab_dim == nil then vocab_dim = i
    elseif p.kind == "shard" then logits = with_placement(logits, i, Replicate()) end
  end
  local out
  if vocab_dim then
    local start = placement_types.local_range(logits:size(2), mesh.shape[vocab_dim], mesh:get_coordinate()[vocab_dim])
    out = VocabParallelCE.apply(logits:to_local(), target, start, mesh:get_group(vocab_dim), ignore)
  else
    out = dl.cross_entropy(logits:to_local(), target, { ignore_index = ignore })
  end
  return DT()._new(out, mesh, all_replicate(mesh.ndim), {})
end

-- ---- view / reshape ----------------------------------------------------------------------

--- view(dt, ...) / reshape(dt, ...) -> the DTensor of the new global shape (one size may be
-- -1). A sharded dimension must come through whole: a dimension of the new shape with its
-- size and the same number of elements before it (so (B, T, V) Shard(3) views as (B*T, V)
-- Shard(2)); the local tensor is viewed (reshape: reshaped) to its piece of the new shape.
-- Partial and Replicate carry over. Raises naming the shapes when a shard would be split
-- or merged.
local function reshaper(name)
  return function(self, ...)
    local sizes = select("#", ...) == 1 and type((...)) == "table" and { unpack((...)) } or { ... }
    local old = self:size()
    local total, unknown = 1, nil
    for i, v in ipairs(sizes) do
      if v == -1 then unknown = i else total = total * v end
    end
    if unknown then sizes[unknown] = self:numel() / math.max(total, 1) end
    local function before(shape, d)
      local n = 1
      for i = 1, d - 1 do n = n * shape[i] end
      return n
    end
    local placements, local_sizes = {}, { unpack(sizes) }
    for i, p in ipairs(self.placements) do
      placements[i] = p
      if p.kind == "shard" then
        local found
        for e = 1, #sizes do
          if sizes[e] == old[p.dim] and before(sizes, e) == before(old, p.dim) then found = e end
        end
        if not found then
          raise(("DTensor: op '%s' from (%s) to (%s) would split or merge the sharded dimension %d (placements %s)")
                :format(name, table.concat(old, ", "), table.concat(sizes, ", "), p.dim, tuple(self.placements)))
        end
        placements[i] = Shard(found)
        local_sizes[found] = self:to_local():size(p.dim)
      end
    end
    local l = self:to_local()
    return DT()._new(l[name](l, local_sizes), self.device_mesh, placements, sizes)
  end
end

--- backward(dt, ...) -> the local tensor's backward: a loss computed alike on every rank
-- (Replicate) or a Partial value whose pieces add up (Note [DTensor gradients]).
local function backward(self, ...) return self:to_local():backward(...) end

--- item(dt) -> the number a 0-d or one-element DTensor holds (reduced first when Partial).
local function item(self) return no_partial(self):full_tensor():item() end

-- ---- method dispatch -------------------------------------------------------------------

local METHODS = {
  linear = M.linear, matmul = M.matmul,
  layer_norm = M.layer_norm, dropout = M.dropout,
  add = M.__add, sub = M.__sub, mul = M.__mul, div = M.__div, neg = M.__unm,
  view = reshaper("view"), reshape = reshaper("reshape"), backward = backward, item = item,
  cross_entropy = M.cross_entropy, embedding = M.embedding,
}

--- method(dt, name) -> the function dt:name(...) runs: a rule above, or raises
-- "DTensor: op 'name' has no sharding rule (placements ...)".
function M.method(dt, name)
  local m = METHODS[name]
  if m then return m end
  if UNARY[name] then return unary(name) end
  raise(("DTensor: op '%s' has no sharding rule (placements %s); use to_local() or full_tensor() to leave DTensor")
        :format(tostring(name), tuple(rawget(dt, "placements"))))
end

-- DTensor's metamethods and method lookup go through the rules of this module.
DTensor._ops = M
for _, mm in ipairs { "__add", "__sub", "__mul", "__div", "__unm" } do DTensor[mm] = M[mm] end

return M
