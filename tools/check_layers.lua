-- tools/check_layers.lua: the layer rules of ddplua, checked without compiling: the
-- #include lines of every C, C++ and CUDA file under runtime/ and the symbols the built
-- objects define and use (nm).
-- `make test` runs it after the build and before the specs; spec/layers_spec.lua runs it on
-- the real tree and on broken copies.
--
-- Note [layers]: the runtime is a stack of layers; a file may include headers of its own
-- layer and of the layers below it, never above. Bottom to top:
--
--   api          runtime/include/: the public C API (ddplua.h), the FFI boundary; it
--                includes only itself, so every layer may include it
--   core         runtime/core/: tensors, storage, allocator, dtypes, element iterator,
--                errors, threads, Philox generators, and device memory through the table
--                the backend registers (Note [device interface] in core/core.h). It knows
--                no backend, op or autograd: tensors free their autograd metadata through
--                the one hook autograd registers (Note [autograd release hook]).
--   backend      runtime/backend/: the kernel table (kernels.h), the CPU kernels, the CUDA
--                plug-in and its interfaces (cuda/plugin.h, cuda/nccl_api.h), the simulated
--                device, and the device registry (registry.c: dlopen of the plug-in,
--                ddp_kernels_for, the core's device table) with the public CUDA calls
--   tape         runtime/autograd/autograd.h, node.c and view_history.c: nodes, saved
--                tensors, grad mode, hooks, in-place history of views; what an op needs to
--                record itself
--   ops          runtime/ops/: every op's front door (checks, promotion, recording on the
--                tape, one call through the kernel table); copies, casts, device moves,
--                random fills and gradient accumulation are ops too
--   autograd     the rest of runtime/autograd/: the backward engine, which calls ops to sum
--                gradients (ops/copy.h), so it sits above them
--   io           runtime/io/: datasets, loaders, checkpoints
--   distributed  runtime/distributed/: store, process
--                groups, reducer, sampler
--   cli          runtime/cli/: the ddplua executable, the only place Lua headers may appear
--
-- Besides the order, the check fails on: a quoted include it cannot resolve (as the
-- compiler would: next to the file, then runtime/include/, then runtime/), a file under
-- runtime/ that no layer claims, a Lua header outside cli/, and an include cycle between
-- files (headers that include each other, even within one layer).
--
-- Note [symbol layers]: includes alone miss calls. Every layer includes the public header
-- ddplua.h (the api layer), which declares the whole C API, so a core file could call
-- ddp_add (an op) with no upward include at all. Given a build folder, the check also reads
-- the global symbols of every object under BUILD/obj/runtime/ (C, C++ and CUDA; `nm -A -g`,
-- one run) and fails when an object uses (nm U or w) a symbol whose only strong definitions
-- (T, D, B, R, ...) are in objects of higher layers. An object takes the layer of its
-- source (obj/runtime/core/tensor.o: runtime/core/tensor.c, .cc, .cpp or .cu); an object
-- whose source is gone is a stale leftover of an earlier build, never linked, and is
-- skipped. Weak definitions (W, V, u: C++ inline functions and template instances, which
-- every object using them carries) and symbols no object defines (libc, Gloo, CUDA) are
-- no layer's.
--
-- Usage: luajit tools/check_layers.lua [ROOT [BUILD]]   (ROOT: the repository, default ".";
-- BUILD: the build folder, relative to the current folder; without it, or without objects
-- in it, the symbols are not checked and the summary says so)
-- Prints one line per violation, "path:line: what" (paths relative to ROOT; objects as
-- BUILD/obj/...), and exits 1 when there is any; else prints a summary and exits 0.

local root = arg[1] or "."
local build = arg[2]

-- Layers bottom to top. A file belongs to the first layer one of whose patterns matches its
-- path relative to runtime/ (so the tape's two files are claimed before autograd/ is).
local LAYERS = {
  { name = "api", "^include/" },
  { name = "core", "^core/" },
  { name = "backend", "^backend/" },
  { name = "tape", "^autograd/autograd%.h$", "^autograd/node%.c$", "^autograd/view_history%.c$" },
  { name = "ops", "^ops/" },
  { name = "autograd", "^autograd/" },
  { name = "io", "^io/" },
  { name = "distributed", "^distributed/" },
  { name = "cli", "^cli/" },
}

-- Headers of Lua and LuaJIT: only the executable (cli) embeds Lua.
local LUA_HEADERS = {
  ["lua.h"] = true, ["lauxlib.h"] = true, ["lualib.h"] = true, ["luajit.h"] = true,
  ["luaconf.h"] = true, ["lua.hpp"] = true,
}
local LUA_ALLOWED = "cli"

local function layer_of(rel)
  for rank, layer in ipairs(LAYERS) do
    for _, pattern in ipairs(layer) do
      if rel:find(pattern) then return rank, layer.name end
    end
  end
  return nil
end

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

-- Collapse "a/b/../c" and "./" so that a file has one name.
local function normalize(path)
  local parts = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." and #parts > 0 and parts[#parts] ~= ".." then
      parts[#parts] = nil
    elseif part ~= "." then
      parts[#parts + 1] = part
    end
  end
  return table.concat(parts, "/")
end

-- The #include lines of a file outside comments: { {line = n, quoted = bool, name = s} }.
local function includes_of(path)
  local f = assert(io.open(path, "r"))
  local out, in_comment, n = {}, false, 0
  for line in f:lines() do
    n = n + 1
    local code = {}
    local pos = 1
    while pos <= #line do -- keep only the text outside /* */ and // comments
      if in_comment then
        local close = line:find("*/", pos, true)
        if not close then pos = #line + 1 else in_comment, pos = false, close + 2 end
      else
        local open, slashes = line:find("/*", pos, true), line:find("//", pos, true)
        if slashes and (not open or slashes < open) then
          code[#code + 1] = line:sub(pos, slashes - 1)
          pos = #line + 1
        elseif open then
          code[#code + 1] = line:sub(pos, open - 1)
          in_comment, pos = true, open + 2
        else
          code[#code + 1] = line:sub(pos)
          pos = #line + 1
        end
      end
    end
    local text = table.concat(code)
    local open, name = text:match('^%s*#%s*include%s*([<"])([^>"]+)[>"]')
    if open then out[#out + 1] = { line = n, quoted = open == '"', name = name } end
  end
  f:close()
  return out
end

-- runtime-relative path of a quoted include, resolved as the compiler does with
-- -Iruntime/include -Iruntime: next to the including file first.
local function resolve(from_rel, name)
  local dir = from_rel:match("^(.*)/[^/]*$") or ""
  local candidates = { (dir ~= "" and dir .. "/" or "") .. name, "include/" .. name, name }
  for _, rel in ipairs(candidates) do
    rel = normalize(rel)
    if exists(root .. "/runtime/" .. rel) then return rel end
  end
  return nil
end

local listing = assert(io.popen("cd '" .. root .. "/runtime' && find . -type f \\( -name '*.c' " ..
  "-o -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' \\) " ..
  "| LC_ALL=C sort"))
local files = {}
for line in listing:lines() do files[#files + 1] = normalize(line) end
listing:close()

local problems = {}
local function report(fmt, ...)
  problems[#problems + 1] = string.format(fmt, ...)
end
local function problem(rel, line, fmt, ...)
  report("runtime/%s:%d: " .. fmt, rel, line, ...)
end

local edges, n_includes = {}, 0 -- edges[file] = { {to = rel, line = n} }
for _, rel in ipairs(files) do
  edges[rel] = {}
  local rank, name = layer_of(rel)
  if not rank then problem(rel, 1, "belongs to no layer (add it to LAYERS in tools/check_layers.lua)") end
  for _, inc in ipairs(includes_of(root .. "/runtime/" .. rel)) do
    n_includes = n_includes + 1
    local base = inc.name:match("([^/]+)$")
    if LUA_HEADERS[base] and name ~= LUA_ALLOWED then
      problem(rel, inc.line, "includes the Lua header %s: the runtime library never includes " ..
        "Lua (only runtime/cli/ embeds it)", inc.name)
    end
    if inc.quoted then
      local target = resolve(rel, inc.name)
      if not target then
        problem(rel, inc.line, 'includes "%s", which is not a file under runtime/', inc.name)
      else
        table.insert(edges[rel], { to = target, line = inc.line })
        local trank, tname = layer_of(target)
        if rank and trank and trank > rank then
          local allowed = {}
          for i = 1, rank do allowed[#allowed + 1] = LAYERS[i].name end
          problem(rel, inc.line, 'includes "%s" (layer %s) from layer %s: %s may include only %s',
            inc.name, tname, name, name, table.concat(allowed, ", "))
        end
      end
    end
  end
end

-- Include cycles: depth-first search, reporting each cycle once by its path.
local state, stack = {}, {}
local function visit(rel)
  state[rel] = "open"
  stack[#stack + 1] = rel
  for _, e in ipairs(edges[rel] or {}) do
    if state[e.to] == "open" then
      local cycle, start = {}, nil
      for i = #stack, 1, -1 do if stack[i] == e.to then start = i break end end
      for i = start, #stack do cycle[#cycle + 1] = "runtime/" .. stack[i] end
      cycle[#cycle + 1] = "runtime/" .. e.to
      problem(rel, e.line, "include cycle: %s", table.concat(cycle, " -> "))
    elseif not state[e.to] then
      visit(e.to)
    end
  end
  stack[#stack] = nil
  state[rel] = "done"
end
for _, rel in ipairs(files) do
  if not state[rel] then visit(rel) end
end

-- ---- symbols (Note [symbol layers]) -------------------------------------------------------

local function shell_quote(x) return "'" .. tostring(x):gsub("'", "'\\''") .. "'" end

-- The source of an object, relative to runtime/ ("core/tensor.o" -> "core/tensor.c"), or nil.
local SOURCE_EXTENSIONS = { "c", "cc", "cpp", "cu" }
local function source_of(obj_rel)
  local stem = obj_rel:gsub("%.o$", "")
  for _, ext in ipairs(SOURCE_EXTENSIONS) do
    if exists(root .. "/runtime/" .. stem .. "." .. ext) then return stem .. "." .. ext end
  end
  return nil
end

local symbols_summary
local function check_symbols()
  if not build then
    symbols_summary = "symbols not checked (no build folder given: luajit tools/check_layers.lua " ..
      "ROOT BUILD)"
    return
  end
  local obj_root = build .. "/obj/runtime"
  local found = assert(io.popen("cd " .. shell_quote(obj_root) .. " 2>/dev/null && find . -name '*.o' " ..
    "-type f | LC_ALL=C sort"))
  local objects, stale = {}, 0 -- { {rel = "core/tensor.o", rank =, layer =} }
  for line in found:lines() do
    local rel = normalize(line)
    local src = source_of(rel)
    if src then
      local rank, name = layer_of(src)
      if rank then objects[#objects + 1] = { rel = rel, src = src, rank = rank, layer = name } end
    else
      stale = stale + 1
    end
  end
  found:close()
  if #objects == 0 then
    symbols_summary = "symbols not checked (no objects under " .. obj_root .. ": build first)"
    return
  end
  local by_path = {}
  local paths = {}
  for _, o in ipairs(objects) do
    o.path = obj_root .. "/" .. o.rel
    by_path[o.path] = o
    paths[#paths + 1] = shell_quote(o.path)
  end
  -- One nm run: "path:address TYPE name" per global symbol (no address for undefined ones).
  local nm = assert(io.popen("LC_ALL=C nm -A -g " .. table.concat(paths, " ") .. " 2>&1; echo \"nm status $?\""))
  local defined, uses, status = {}, {}, nil -- defined[sym] = {objects}; uses = { {o, sym} }
  for line in nm:lines() do
    local path, kind, sym = line:match("^(.-):%x*%s+(%a)%s+(%S+)$")
    local o = path and by_path[path]
    if o then
      if kind == "U" or kind == "w" then
        uses[#uses + 1] = { o, sym }
      elseif kind:match("%u") and kind ~= "W" and kind ~= "V" then
        defined[sym] = defined[sym] or {}
        table.insert(defined[sym], o)
      end
    elseif line:match("^nm status %d+$") then
      status = tonumber(line:match("%d+"))
    end
  end
  nm:close()
  if status ~= 0 then
    report("%s: nm failed (status %s): cannot read the objects' symbols", obj_root, tostring(status))
    return
  end
  local n_refs = 0
  for _, u in ipairs(uses) do
    local o, sym = u[1], u[2]
    local definers = defined[sym]
    if definers then
      n_refs = n_refs + 1
      local lowest
      for _, d in ipairs(definers) do
        if not lowest or d.rank < lowest.rank then lowest = d end
      end
      if lowest.rank > o.rank then
        local allowed = {}
        for i = 1, o.rank do allowed[#allowed + 1] = LAYERS[i].name end
        report("%s (runtime/%s): uses %s, defined in %s/%s (layer %s), from layer %s: %s may use " ..
          "only %s", o.path, o.src, sym, obj_root, lowest.rel, lowest.layer, o.layer, o.layer,
          table.concat(allowed, ", "))
      end
    end
  end
  symbols_summary = string.format("symbols ok, %d objects, %d references between them%s", #objects,
    n_refs, stale > 0 and string.format(" (%d stale object%s without a source skipped)", stale,
    stale == 1 and "" or "s") or "")
end

check_symbols()

if #problems > 0 then
  for _, p in ipairs(problems) do io.stderr:write(p, "\n") end
  io.stderr:write(string.format("check_layers: %d violation%s of the layer rules " ..
    "(Note [layers] and [symbol layers] in tools/check_layers.lua)\n", #problems,
    #problems == 1 and "" or "s"))
  os.exit(1)
end
local names = {}
for _, layer in ipairs(LAYERS) do names[#names + 1] = layer.name end
print(string.format("check_layers: ok, %d files, %d includes, layers %s", #files, n_includes,
  table.concat(names, " < ")))
print("check_layers: " .. symbols_summary)
