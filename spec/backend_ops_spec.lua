-- spec/backend_ops_spec.lua: the backend-ops harness (ggml's test-backend-ops is the model).
-- Every case of the op table (spec/fixtures/backend_ops/ops.lua: an op, its inputs, dtypes
-- and tolerance, forward and backward, plus finite-difference gradient checks, optimizer
-- and training steps) and of the area files (spec/fixtures/backend_ops/<area>.lua: errors,
-- mixed devices, a second device, dtype pairs, launch forms) runs on each device backend
-- against the CPU, which is the reference (engine: spec/helpers/backend_ops.lua):
--   - the simulated device (build/libddplua_cuda_sim.so): the ops layer's device paths,
--     results equal to the CPU's bit for bit;
--   - the emulated CUDA device (build/libddplua_cuda_emul.so, `make emulation`, built
--     where CUDA's headers are): the kernels of runtime/backend/cuda/*.cu that need no vendor
--     library, compiled for the host, within the GPU bounds (pending where it is not built);
--   - a real GPU (#cuda; pending with the reason elsewhere).
-- A backend is chosen once per process (DDPLUA_CUDA_PLUGIN), so each runs in a child
-- luajit; the children run side by side while this file collects their results.
local harness = require "backend_ops"

-- Start every child first (they run in parallel), then collect in order.
local runs = {}
for i, b in ipairs(harness.BACKENDS) do
  local plugin = harness.plugin_path(b)
  local f = plugin and io.open(plugin, "rb")
  if plugin and not f then
    runs[i] = { missing = plugin }
  else
    if f then f:close() end
    runs[i] = { handle = harness.start(b) }
  end
end

for i, b in ipairs(harness.BACKENDS) do
  local tag = b.name == "cuda" and " #cuda" or ""
  describe(("backend ops on %s (%s)%s"):format(b.name, b.title, tag), function()
    local run = runs[i]
    if run.missing then
      it("runs every case", function()
        pending("no " .. run.missing .. " (`make emulation` builds it where CUDA's headers are)")
      end)
      return
    end
    local r = harness.collect(run.handle)
    if r.unavailable and b.name == "cuda" then
      it("runs every case", function() pending("needs a GPU: " .. r.unavailable) end)
      return
    end
    it("loads the backend and runs every case to the end", function()
      assert.is_nil(r.unavailable, r.output)
      assert.is_true(r.ended, "the child stopped early:\n" .. r.output:sub(-4000))
      assert.is_true(#r.results > 500, "only " .. #r.results .. " cases ran:\n" .. r.output:sub(-4000))
      -- the simulated devices: DDPLUA_SIM_DEVICES=2, so the cases on cuda:1 run too
      if b.name ~= "cuda" then assert.are.equal(2, r.devices, r.output:sub(1, 2000)) end
    end)
    for _, res in ipairs(r.results) do
      local name, verdict, msg = res[1], res[2], res[3]
      it(name, function()
        if verdict == "skip" then
          pending(msg)
        elseif verdict ~= "ok" then
          error(msg, 0)
        end
      end)
    end
  end)
end
