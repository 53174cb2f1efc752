-- Specs for dist.init_device_mesh / DeviceMesh (lua/ddplua/distributed/device_mesh.lua) and
-- DDP's device_mesh option, with real ranks on 127.0.0.1 (spec/helpers/multiproc.lua).
-- DDP over a 1-D mesh must give the same bits as DDP over the world group, and both must
-- match one process trained on the whole batch; the errors are PyTorch's.
local ddp_ranks = require "ddp_ranks"

local PRELUDE = ddp_ranks.prelude { helpers = { "shard", "max_abs", "params_text" } } .. [[
function mlp()
  dl.manual_seed(1)
  return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))
end
XS, YS = {}, {}
dl.manual_seed(100)
for s = 1, 3 do XS[s], YS[s] = dl.randn{8, 6}, dl.randn{8, 4} end
-- 3 SGD-momentum steps of `model` (DDP or plain) on this rank's shards of the batches.
function train(model, world, rank)
  local opt = optim.SGD(model:parameters(), {lr = 0.1, momentum = 0.9})
  for s = 1, 3 do
    opt:zero_grad()
    local x, y = shard(XS[s], world, rank), shard(YS[s], world, rank)
    ;(model(x) - y):pow(2):mean():backward()
    opt:step()
  end
  return model
end
]]

local run = ddp_ranks.runner(PRELUDE, { timeout = 40 })

describe("ddplua.distributed.device_mesh #dist", function()
  it("a 1-D mesh of the world: its group, ranks and names; DDP over it gives DDP's bits over the world", function()
    local ranks = run([[
local mesh = dist.init_device_mesh("cpu", {WORLD}, {mesh_dim_names = {"dp"}})
out("repr", tostring(mesh))
out("size", mesh:size() .. " " .. mesh:size(1) .. " " .. mesh:size("dp"))
out("ranks", mesh:get_rank() .. " " .. mesh:get_local_rank() .. " " .. mesh:get_local_rank("dp"))
out("mesh", table.concat(mesh.mesh, ",") .. " " .. mesh.device_type .. " " .. table.concat(mesh.mesh_dim_names, ","))
out("world_group", tostring(mesh:get_group() == dist.get_default_group()))
local t = dl.ones{3}
dist.all_reduce(t, {group = mesh:get_group("dp")})
out("allreduce", t:sum():item())
local with_mesh = train(DDP(mlp(), {device_mesh = mesh}), WORLD, RANK)
local with_world = train(DDP(mlp()), WORLD, RANK)
out("mesh_vs_world", max_abs(with_mesh.module, with_world.module))
out("kept", tostring(with_mesh.device_mesh == mesh) .. " " .. tostring(with_mesh.process_group == dist.get_default_group()))
if RANK == 0 then out("vs_single", max_abs(with_mesh.module, train(mlp(), 1, 0))) end
out("params", params_text(with_mesh.module))
try("both", function() DDP(mlp(), {device_mesh = mesh, process_group = dist.get_default_group()}) end)
try("not_a_mesh", function() DDP(mlp(), {device_mesh = {ndim = 1}}) end)
]], 2)
    for r = 1, 2 do
      local o = ranks[r].out
      assert.are.equal("DeviceMesh((dp=2,), device: 'cpu', stride: (1,))", o.repr)
      assert.are.equal("2 2 2", o.size)
      assert.are.equal(("%d %d %d"):format(r - 1, r - 1, r - 1), o.ranks)
      assert.are.equal("0,1 cpu dp", o.mesh)
      assert.are.equal("true", o.world_group)
      assert.are.equal("6", o.allreduce)
      assert.are.equal("0", o.mesh_vs_world) -- the same bits
      assert.are.equal("true true", o.kept)
      assert.are.equal("DistributedDataParallel: Cannot specify both process_group and device_mesh arguments.",
        ranks[r].err.both:match("^.-:%d+: (.*)$"))
      assert.matches("device_mesh must be a DeviceMesh from dist.init_device_mesh", ranks[r].err.not_a_mesh)
    end
    assert.are.equal(ranks[1].out.params, ranks[2].out.params)
    assert.is_true(tonumber(ranks[1].out.vs_single) < 1e-6, ranks[1].out.vs_single) -- f32 sums in another order
  end)

  it("a mesh smaller than the world: rank 0 alone reduces over its own group; rank 1 is outside", function()
    local ranks = run([[
local mesh = dist.init_device_mesh("cpu", {1})
out("repr", tostring(mesh))
if RANK == 0 then
  out("group", mesh:get_group():size() .. " " .. tostring(mesh:get_group() ~= dist.get_default_group()))
  -- DDP over the one-rank group: rank 1 takes no part, so a reduction over the world would time out.
  local ddp = train(DDP(mlp(), {device_mesh = mesh, timeout = 5}), 1, 0)
  out("vs_single", max_abs(ddp.module, train(mlp(), 1, 0)))
else
  try("outside", function() mesh:get_group() end)
  try("ddp_outside", function() DDP(mlp(), {device_mesh = mesh}) end)
end
dist.barrier()
]], 2)
    assert.are.equal("DeviceMesh((1,), device: 'cpu', stride: (1,))", ranks[1].out.repr)
    assert.are.equal("1 true", ranks[1].out.group)
    assert.are.equal("0", ranks[1].out.vs_single)
    assert.matches("DeviceMesh:get_group: rank 1 is not in the mesh %(global ranks 0 .. 0%)", ranks[2].err.outside)
    assert.matches("rank 1 is not in the mesh", ranks[2].err.ddp_outside)
  end)

  it("a 2-D mesh has a group per dimension, and DDP refuses it as PyTorch does", function()
    local ranks = run([[
local mesh = dist.init_device_mesh("cpu", {2, 1}, {mesh_dim_names = {"dp", "tp"}})
out("repr", tostring(mesh))
out("sizes", mesh:size() .. " " .. mesh:size("dp") .. " " .. mesh:size(2) .. " " .. mesh.ndim)
out("groups", mesh:get_group("dp"):size() .. " " .. mesh:get_group("tp"):size() .. " " .. #mesh:get_all_groups())
out("local", mesh:get_local_rank(1) .. " " .. mesh:get_local_rank("tp"))
local t = dl.ones{2}
dist.all_reduce(t, {group = mesh:get_group("dp")})
out("dp_sum", t:sum():item())
try("ddp", function() DDP(mlp(), {device_mesh = mesh}) end)
try("get_group", function() mesh:get_group() end)
try("local_rank", function() mesh:get_local_rank() end)
try("bad_name", function() mesh:get_group("pp") end)
try("bad_dim", function() mesh:get_group(0) end)
local unnamed = dist.init_device_mesh("cpu", {1, 2})
out("unnamed", tostring(unnamed))
try("no_names", function() unnamed:get_group("dp") end)
try("too_big", function() dist.init_device_mesh("cpu", {4}) end)
try("indexed", function() dist.init_device_mesh("cuda:0", {2}) end)
try("repeated", function() dist.init_device_mesh("cpu", {1, 2}, {mesh_dim_names = {"dp", "dp"}}) end)
try("names_len", function() dist.init_device_mesh("cpu", {2}, {mesh_dim_names = {"dp", "tp"}}) end)
try("shape", function() dist.init_device_mesh("cpu", {0}) end)
try("type", function() dist.init_device_mesh("tpu", {2}) end)
try("option", function() dist.init_device_mesh("cpu", {2}, {mesh_dim_name = {"dp"}}) end)
out("cuda", tostring(dl.cuda.is_available()))
try("cuda", function() dist.init_device_mesh("cuda", {2}) end)
]], 2)
    for r = 1, 2 do
      local o, e = ranks[r].out, ranks[r].err
      assert.are.equal("DeviceMesh((dp=2, tp=1), device: 'cpu', stride: (1, 1))", o.repr)
      assert.are.equal("2 2 1 2", o.sizes)
      assert.are.equal("2 1 2", o.groups)
      assert.are.equal((r - 1) .. " 0", o["local"])
      assert.are.equal("4", o.dp_sum)
      assert.matches("DistributedDataParallel: Only 1D device mesh is supported, but got "
        .. "DeviceMesh%(%(dp=2, tp=1%), device: 'cpu', stride: %(1, 1%)%)%.$", e.ddp)
      assert.matches("Found the DeviceMesh have 2 dimensions%. Optional kwarg `mesh_dim` needs to be specified "
        .. "when device_mesh%.ndim > 1%. If you want", e.get_group)
      assert.matches("get_local_rank: Found the DeviceMesh have 2 dimensions", e.local_rank)
      assert.matches("Mesh dimension 'pp' does not exist%. Available mesh dimensions are: "
        .. "mesh_dim_names=%('dp', 'tp'%)", e.bad_name)
      assert.matches("mesh_dim must be a dimension 1 %.%. 2 %(mesh dimensions count from 1%)", e.bad_dim)
      assert.are.equal("DeviceMesh((1, 2), device: 'cpu', stride: (2, 1))", o.unnamed)
      assert.matches("No `mesh_dim_names` found%.", e.no_names)
      assert.matches("Mesh should not be bigger than default world size 2, but found 4 ranks!", e.too_big, 1, true)
      assert.matches("Device type with index is not supported but got cuda:0%.", e.indexed)
      assert.matches("Each mesh_dim_name must be unique%. Found repeated mesh_dim_name in mesh_dim_names "
        .. "%('dp', 'dp'%)", e.repeated)
      assert.matches("mesh_shape and mesh_dim_names should have same length! Found len%(mesh_dim_names%): 2 "
        .. "and len%(mesh_shape%):1%.", e.names_len)
      assert.matches("mesh_shape%[1%] must be a positive integer, got 0", e.shape)
      assert.matches("device_type must be 'cpu' or 'cuda', got 'tpu'", e.type)
      assert.matches("unknown option 'mesh_dim_name' %(did you mean 'mesh_dim_names'", e.option)
      if o.cuda == "false" then
        assert.matches("init_device_mesh: device_type 'cuda' but CUDA is not available: ", e.cuda)
      end
    end
  end)
  it("slices a 2 x 2 mesh by name (Note [mesh slices]); DDP over mesh['dp'] equals one process (4 ranks)", function()
    local ranks = run([[
local mesh = dist.init_device_mesh("cpu", {2, 2}, {mesh_dim_names = {"dp", "tp"}})
local dp, tp = mesh["dp"], mesh["tp"]
out("coord", table.concat(mesh:get_coordinate(), ","))
out("dp", tostring(dp) .. " " .. table.concat(dp.mesh, ",") .. " " .. dp:get_local_rank())
out("tp", tostring(tp) .. " " .. table.concat(tp.mesh, ",") .. " " .. tp:get_local_rank())
out("same_groups", tostring(dp:get_group() == mesh:get_group("dp")) .. " " .. tostring(tp:get_group() == mesh:get_group(2)))
local both = mesh[{"dp", "tp"}]
out("both", tostring(both) .. " " .. both.mesh[2][1])
out("tp_of_tp", table.concat(tp["tp"].mesh, ","))
local t = dl.tensor{RANK}
dist.all_reduce(t, {group = tp:get_group()})
out("tp_sum", t:item())
-- DDP over the dp slice: each dp group holds ranks with the same tp coordinate, and each
-- takes its dp shard of the batches, so every rank must end with the one-process model.
local model = train(DDP(mlp(), {device_mesh = dp}), 2, dp:get_local_rank())
out("vs_single", max_abs(model.module, train(mlp(), 1, 0)))
out("params", params_text(model.module))
try("reversed", function() return mesh[{"tp", "dp"}] end)
try("unknown", function() return mesh["pp"] end)
try("unnamed", function() return dist.init_device_mesh("cpu", {4})["dp"] end)
]], 4)
    local want_dp = { "0,2", "1,3", "0,2", "1,3" }
    local want_tp = { "0,1", "0,1", "2,3", "2,3" }
    for r = 1, 4 do
      local o, e = ranks[r].out, ranks[r].err
      local dp_c, tp_c = math.floor((r - 1) / 2), (r - 1) % 2
      assert.are.equal(dp_c .. "," .. tp_c, o.coord)
      assert.are.equal("DeviceMesh((dp=2,), device: 'cpu', stride: (2,)) " .. want_dp[r] .. " " .. dp_c, o.dp)
      assert.are.equal("DeviceMesh((tp=2,), device: 'cpu', stride: (1,)) " .. want_tp[r] .. " " .. tp_c, o.tp)
      assert.are.equal("true true", o.same_groups)
      assert.are.equal("DeviceMesh((dp=2, tp=2), device: 'cpu', stride: (2, 1)) 2", o.both)
      assert.are.equal(want_tp[r], o.tp_of_tp)
      assert.are.equal(tostring(want_tp[r] == "0,1" and 1 or 5), o.tp_sum)
      assert.is_true(tonumber(o.vs_single) < 1e-6, o.vs_single)
      assert.are.equal(ranks[1].out.params, o.params)
      assert.matches("Invalid mesh_dim_names %('tp', 'dp'%) specified%. Valid mesh_dim_names are %('dp', 'tp'%)", e.reversed)
      assert.matches("Invalid mesh_dim_names %('pp',%) specified", e.unknown)
      assert.matches("Cannot slice a DeviceMesh without mesh_dim_names! %(asked for %('dp',%)%)", e.unnamed)
    end
  end)
end)
