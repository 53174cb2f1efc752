-- spec/helpers/backend_ops.lua: the engine of the backend-ops harness (spec/backend_ops_spec.lua;
-- the idea of ggml's test-backend-ops): every case of the op table
-- (spec/fixtures/backend_ops/ops.lua) and of the area files (spec/fixtures/backend_ops/<area>.lua)
-- runs on the CPU, which is the reference, and on one device backend, and the results are
-- compared.
--
-- Backends (M.BACKENDS), one child luajit each, since the CUDA plug-in is chosen once per
-- process (DDPLUA_CUDA_PLUGIN):
--   sim       build/libddplua_cuda_sim.so: host memory, the CPU kernels. It checks the
--             device paths of the ops layer; the bound is 0 (the CPU's bits; where the ops
--             layer's device route itself rounds differently, the reference rule below
--             admits it).
--   emulated  build/libddplua_cuda_emul.so (`make emulation`, where CUDA's headers are):
--             the simulated device with the kernels of runtime/backend/cuda/{elementwise,
--             reduce,pool,loss,norm,optim,shape,attention,collective}.cu compiled for the host
--             (runtime/backend/sim/cuda_emulation.h); within the GPU bounds.
--   cuda      the real plug-in on a GPU; within the GPU bounds. Pending elsewhere.
--
-- Parent side: M.start(backend) starts the child (children run side by side),
-- M.collect(handle) waits for it and returns {results = {{name, verdict, message}},
-- unavailable = reason or nil, devices = count, ended = true when it finished, output = text}. As a script (`luajit backend_ops.lua
-- <backend>`, in the child) it prints "CASE\t<name>\t<ok|fail|skip>\t<message>\1" per case,
-- then "END"; "UNAVAILABLE\t<reason>" when the backend did not load.
--
-- How results compare (per op case): each input is drawn on the CPU from a generator seeded
-- per case, copied to the device, and the op runs on both; outputs and the gradients of
-- every floating input (backward from a random output gradient) are compared by
-- ||device - cpu|| / ||cpu|| in f64 against a bound per dtype (TOL: f64 1e-10, f32 1e-5 with
-- TF32 off, f16 1e-2, bf16 5e-2; 0 on the simulated device). A result over its bound still
-- passes when it is no further from the f64 reference (the case run in f64 on the CPU from
-- the same rounded inputs) than twice the CPU's own distance plus 4 units of rounding of the
-- dtype: the CPU's rounding, not the device's, is then what differs. Integer and bool
-- outputs must be equal; NaN and infinities must sit at the same places; every output must
-- be on the device its inputs were on. Inputs of max-like ops hold distinct values, so a tie
-- cannot make two correct kernels disagree.
local M = {}

M.BACKENDS = {
  { name = "sim", plugin = "libddplua_cuda_sim.so", backend = "cuda-sim", exact = true,
    title = "the simulated device (host memory, the CPU kernels)" },
  { name = "emulated", plugin = "libddplua_cuda_emul.so", backend = "cuda-emulated",
    title = "the emulated CUDA device (the .cu kernels compiled for the host)" },
  { name = "cuda", plugin = nil, backend = "cuda", title = "a real GPU" },
}

-- The area files of spec/fixtures/backend_ops/: each returns function(ctx) -> a list of
-- {name, fn} (fn raises on failure), the checks that are more than one op on one input set
-- (errors, mixed devices, a second device, dtype pairs, launch forms).
M.AREAS = { "elementwise", "reduce", "loss_norm", "shape", "optim", "matmul_conv", "launch_forms",
  "comm_math" }

local LUA_PATH = "lua/?.lua;lua/?/init.lua;build/lua/?.lua;spec/helpers/?.lua;./?.lua;;"

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function build_dir()
  local lib = os.getenv("DDPLUA_LIB")
  return lib and lib:match("^(.*)/[^/]*$") or "build"
end

--- The plug-in file of backend b, or nil for the default (real) one.
function M.plugin_path(b)
  return b.plugin and (build_dir() .. "/" .. b.plugin) or nil
end

--- Start the child of backend b; returns a handle for M.collect.
function M.start(b)
  local plugin = M.plugin_path(b)
  local env = "DDPLUA_CUDA_PLUGIN=" .. (plugin and quote(plugin) or "")
  local cmd = ("env %s DDPLUA_SIM_DEVICES=2 DDP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 LUA_PATH=%s "
    .. "luajit spec/helpers/backend_ops.lua %s 2>&1"):format(env, quote(LUA_PATH), b.name)
  return { pipe = io.popen(cmd, "r"), backend = b }
end

--- Wait for a child started by M.start and parse what it printed.
function M.collect(h)
  local out = h.pipe:read("*a")
  h.pipe:close()
  local r = { output = out, results = {}, ended = out:find("\nEND\n", 1, true) ~= nil }
  r.unavailable = out:match("UNAVAILABLE\t([^\n]*)")
  r.devices = tonumber(out:match("DEVICES\t(%d+)"))
  for name, verdict, msg in out:gmatch("CASE\t([^\t]*)\t(%a+)\t([^\1]-)\1\n") do
    r.results[#r.results + 1] = { name, verdict, msg }
  end
  return r
end

-- ---------------------------------------------------------------------------------------
-- The child: run every case on one backend.
-- ---------------------------------------------------------------------------------------

local function child(backend_name)
  local dl = require "ddplua"
  local lib = require "ddplua.lib"
  local G = require "bench.gpu_common"
  local ops = dofile("spec/fixtures/backend_ops/ops.lua")
  local gradcheck = require("gradcheck").gradcheck
  local ffi, C = lib.ffi, lib.C

  local B
  for _, b in ipairs(M.BACKENDS) do if b.name == backend_name then B = b end end
  assert(B, "unknown backend " .. tostring(backend_name))
  if C.ddp_cuda_is_available() == 0 then
    io.write("UNAVAILABLE\tCUDA is not available: ", ffi.string(C.ddp_cuda_unavailable_reason()), "\n")
    return
  end
  local loaded = ffi.string(C.ddp_cuda_backend_name())
  if loaded ~= B.backend then
    io.write("UNAVAILABLE\tthe plug-in loaded is ", loaded, ", not ", B.backend, "\n")
    return
  end

  io.write("DEVICES\t", C.ddp_cuda_device_count(), "\n")
  local EXACT, EMULATED = B.exact, B.name == "emulated"
  local DEV, DEV_INDEX = "cuda:0", 0
  local TOL = EXACT and { f64 = 0, f32 = 0, f16 = 0, bf16 = 0 }
    or { f64 = 1e-10, f32 = 1e-5, f16 = 1e-2, bf16 = 5e-2 }
  local LOW = { f16 = true, bf16 = true }
  local UNIT = { f64 = 2 ^ -53, f32 = 2 ^ -24, f16 = 2 ^ -11, bf16 = 2 ^ -8 }

  local function report(name, verdict, msg)
    io.write("CASE\t", name, "\t", verdict, "\t", (tostring(msg or ""):gsub("\1", "?")), "\1\n")
    io.stdout:flush()
  end
  local times = os.getenv("DDPLUA_BACKEND_OPS_TIMES") -- "1": each case's seconds on stderr
  local function run(name, fn)
    local t0 = os.clock()
    local ok, err = xpcall(fn, debug.traceback)
    if times then io.stderr:write(("%8.3f %s\n"):format(os.clock() - t0, name)) end
    report(name, ok and "ok" or "fail", ok and "" or err)
    collectgarbage()
  end

  local function shape_str(t) return "(" .. table.concat(t:size(), ", ") .. ")" end

  -- ||a - b|| / ||b|| in f64 with NaN and infinities masked (the caller checked that they
  -- sit at the same places); ||a - b|| when b is all zeros. Also ||a - b||, ||b||, the
  -- largest |a - b| and its flat index.
  local function rel_err(a, b)
    a, b = a:to("f64"), b:to("f64")
    a, b = dl.where(a:ne(a), 0, a), dl.where(b:ne(b), 0, b)
    a, b = dl.where(a:abs():eq(math.huge), 0, a), dl.where(b:abs():eq(math.huge), 0, b)
    local diff = a:sub(b)
    local err, ref = diff:norm():item(), b:norm():item()
    local maxabs, idx = diff:abs():flatten():max(1)
    return ref > 0 and err / ref or err, err, ref, maxabs:item(), idx:item()
  end

  -- Raise unless device tensor `got` matches CPU tensor `want` within `tol` (the rule at
  -- the top of this file). `ref`: a function giving the f64 CPU reference. Returns nil when
  -- within tol, else the relative error it passed with by the reference rule.
  local function compare(what, got, want, tol, ref)
    if got == nil or want == nil then
      if got ~= want then
        error(("%s: %s on the device, %s on the CPU"):format(what, got == nil and "nil" or "a tensor",
          want == nil and "nil" or "a tensor"), 0)
      end
      return
    end
    local gd = C.ddp_tensor_device(got)
    if gd ~= DEV_INDEX then
      error(("%s: the result is on %s, expected %s"):format(what, gd < 0 and "cpu" or ("cuda:" .. gd), DEV), 0)
    end
    got = G.cpu(got)
    if got:type() ~= want:type() then
      error(("%s: dtype %s on the device, %s on the CPU"):format(what, got:type(), want:type()), 0)
    end
    if shape_str(got) ~= shape_str(want) then
      error(("%s: shape %s on the device, %s on the CPU"):format(what, shape_str(got), shape_str(want)), 0)
    end
    if got:numel() == 0 then return end
    local a, b = got:to("f64"), want:to("f64")
    if not got:is_floating_point() then
      local bad = a:ne(b):sum():item()
      if bad > 0 then
        error(("%s: %d of %d values differ (integer/bool output must be equal)"):format(what, bad, got:numel()), 0)
      end
      return
    end
    local na, nb = a:ne(a), b:ne(b)
    local nan_bad = na:ne(nb):sum():item()
    if nan_bad > 0 then error(("%s: NaN at %d places on one side only"):format(what, nan_bad), 0) end
    local ia, ib = a:abs():eq(math.huge), b:abs():eq(math.huge)
    local inf_bad = ia:ne(ib):sum():item() + dl.where(ia, a, 0):ne(dl.where(ib, b, 0)):sum():item()
    if inf_bad > 0 then error(("%s: infinities differ at %d places"):format(what, inf_bad), 0) end
    local rel, err, norm, maxabs, idx = rel_err(a, b)
    if (tol == 0 and err == 0) or (tol > 0 and rel <= tol) then return end
    local detail = ""
    if ref then
      local r = ref()
      if r then
        local e_dev, e_cpu = rel_err(a, r), rel_err(b, r)
        if e_dev <= 2 * e_cpu + 4 * UNIT[want:type()] then return rel end
        detail = (", and %.3g from the f64 reference where the CPU is %.3g"):format(e_dev, e_cpu)
      end
    end
    error(("%s: relative error %.3g > bound %.3g (|diff| %.3g, |cpu| %.3g, largest difference %.3g at "
      .. "flat index %d of %s%s)"):format(what, rel, tol, err, norm, maxabs, idx, shape_str(want), detail), 0)
  end

  -- Run case c in dtype on the CPU or the device (`dev` nil: CPU): the outputs (a list)
  -- and, when backward ran, the gradients of the inputs (false for those without).
  -- upcast: draw the inputs in dtype, then run in f64 on the CPU (the reference).
  local function run_case(c, dtype, dev, seed, upcast)
    local gen = dl.Generator(seed)
    local inputs, leaves = {}, {}
    for i, spec in ipairs(c.inputs) do
      local t = ops.make_input(spec, dtype, gen, seed * 131 + i)
      if upcast and t:is_floating_point() then t = t:to("f64") end
      if dev then t = G.to(t, dev) end
      local wants_grad = c.grad ~= false and not spec.nograd and t:is_floating_point()
      if wants_grad then t:requires_grad_(true) end
      inputs[i], leaves[i] = t, wants_grad
    end
    local outs = { n = 0 }
    local function pack(...) outs = { n = select("#", ...), ... } end
    pack(c.fn(unpack(inputs, 1, #c.inputs)))
    local grads
    if c.grad ~= false then
      local y = outs[1]
      local gy = dl.randn(y:size(), { dtype = "f64", generator = dl.Generator(seed + 7777) }):to(dtype)
      gy = gy:to(y:type())
      if dev then gy = G.to(gy, dev) end
      y:backward(gy)
      grads = {}
      for i = 1, #c.inputs do grads[i] = leaves[i] and inputs[i].grad or false end
    end
    return outs, grads
  end

  local function check_case(c, dtype, seed)
    local tol = (TOL[dtype] or 0) * (c.tol_scale or 1)
    local want, want_grads = run_case(c, dtype, nil, seed)
    local got, got_grads = run_case(c, dtype, DEV, seed)
    local ref_outs, ref_grads
    local function reference()
      if ref_outs == nil then ref_outs, ref_grads = run_case(c, dtype, nil, seed, true) end
    end
    if got.n ~= want.n then error(("%d outputs on the device, %d on the CPU"):format(got.n, want.n), 0) end
    for k = 1, want.n do
      local w, g = want[k], got[k]
      if dl.is_tensor(w) then
        compare(("output %d"):format(k), g, w, tol, w:is_floating_point() and function()
          reference()
          return ref_outs[k]
        end)
      elseif g ~= w then
        error(("output %d: %s on the device, %s on the CPU"):format(k, tostring(g), tostring(w)), 0)
      end
    end
    if want_grads then
      for i = 1, #c.inputs do
        if want_grads[i] ~= false then
          compare(("gradient of input %d"):format(i), got_grads[i] or nil, want_grads[i] or nil, tol, function()
            reference()
            return ref_grads[i] or nil
          end)
        end
      end
    end
  end

  -- The finite-difference check of case c on the device, in f64: the inputs live on the
  -- CPU, fn moves them to the device, runs the op there and brings the first output back.
  local function check_gradient(c, seed)
    local gen = dl.Generator(seed)
    local inputs, skip = {}, {}
    for i, spec in ipairs(c.inputs) do
      inputs[i] = ops.make_input(spec, "f64", gen, seed * 131 + i)
      if spec.nograd then skip[i] = true end
    end
    gradcheck(function(...)
      local args = { ... }
      for i = 1, #c.inputs do args[i] = G.to(args[i], DEV) end
      return G.cpu((c.fn(unpack(args, 1, #c.inputs))))
    end, inputs, { skip = skip })
  end

  local prev_tf32 = G.set_tf32(false) -- f32 products in full f32 (TF32 would need ~1e-3)

  -- 1. the op table
  for ci, c in ipairs(ops.cases) do
    for _, dtype in ipairs(c.dtypes or ops.FLOATS) do
      local seed = ci * 16 + #dtype
      local label = ("%s %s"):format(c.name, dtype)
      if EMULATED and c.large then
        report(label, "skip", "too large for the emulated device (Note [block emulation])")
      else
        -- f16/bf16 only where the CPU has the op in that dtype
        local cpu_err
        if LOW[dtype] then
          local ok, err = pcall(run_case, c, dtype, nil, seed)
          if not ok then cpu_err = tostring(err):gsub("\n.*", "") end
        end
        if cpu_err then
          report(label, "skip", "the CPU has no " .. dtype .. " for it (" .. cpu_err .. ")")
        else
          run(label, function() check_case(c, dtype, seed) end)
        end
      end
    end
    if c.gradcheck then
      run(c.name .. " gradcheck f64", function() check_gradient(c, ci * 16 + 99) end)
    end
  end

  -- 2. optimizer steps and training steps
  for _, t in ipairs(ops.steps(G, compare, TOL, DEV, EXACT, EMULATED)) do
    if t.skip then report(t[1], "skip", t.skip) else run(t[1], t[2]) end
  end
  G.set_tf32(prev_tf32)

  -- 3. the area files
  local box = ffi.new("ddp_tensor*[1]")
  local ctx = { backend = B.name, exact = EXACT, emulated = EMULATED, devices = C.ddp_cuda_device_count() }
  function ctx.dev(t, device)
    lib.check(C.ddp_tensor_to_device(box, t, device or 0, 0))
    return lib.wrap(box[0])
  end
  function ctx.cpu(t) return ctx.dev(t, -1) end
  local function flat(v, out)
    if type(v) == "table" then for i = 1, #v do flat(v[i], out) end else out[#out + 1] = v end
    return out
  end
  local function values(x)
    if type(x) == "number" then return { x } end
    if type(x) == "table" then return flat(x, {}) end
    assert(x.device == "cpu", "close: compare CPU tensors (got one on " .. x.device .. ")")
    local v = x:tolist()
    return type(v) == "table" and flat(v, {}) or { v }
  end
  -- Compare two CPU tensors or numbers: exactly on the simulated device, else within
  -- rtol/atol (NaN equals NaN).
  function ctx.close(a, b, what, rtol, atol)
    what = what or "value"
    if type(a) ~= "number" and type(b) ~= "number" and type(a) ~= "table" then
      local sa, sb = table.concat(a.shape, ","), table.concat(b.shape, ",")
      if sa ~= sb then error(("%s: shape (%s) vs (%s)"):format(what, sa, sb), 2) end
    end
    local va, vb = values(a), values(b)
    if #va ~= #vb then error(("%s: %d vs %d elements"):format(what, #va, #vb), 2) end
    for i = 1, #va do
      local x, y = va[i], vb[i]
      if type(x) == "boolean" then x, y = x and 1 or 0, y and 1 or 0 end
      local same = x == y or (x ~= x and y ~= y)
      if not same and not EXACT then
        same = math.abs(x - y) <= (atol or 1e-6) + (rtol or 1e-5) * math.abs(y)
      end
      if not same then error(("%s: element %d is %.17g, expected %.17g"):format(what, i, x, y), 2) end
    end
  end
  function ctx.raises(fn, pattern)
    local ok, err = pcall(fn)
    if ok then error("expected an error containing: " .. pattern, 2) end
    if not tostring(err):find(pattern, 1, true) then
      error(("expected an error containing %q, got: %s"):format(pattern, tostring(err)), 2)
    end
  end
  for _, area in ipairs(M.AREAS) do
    local ok, cases = pcall(function() return dofile("spec/fixtures/backend_ops/" .. area .. ".lua")(ctx) end)
    if not ok then
      report(area .. ": the case file", "fail", cases)
    else
      for _, c in ipairs(cases) do
        if c.skip then report(area .. ": " .. c[1], "skip", c.skip) else run(area .. ": " .. c[1], c[2]) end
      end
    end
  end
end

if arg and arg[0] and arg[0]:match("backend_ops%.lua$") and arg[1] then
  child(arg[1])
  io.write("END\n")
  io.stdout:flush()
  os.exit(0)
end

return M
