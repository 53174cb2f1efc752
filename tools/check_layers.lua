-- tools/check_layers.lua: the layer rules of ddplua, checked three ways without compiling:
-- the #include lines of every C, C++ and CUDA file under runtime/, the symbols the built
-- objects define and use (nm), and the `require` graph of the Lua front end (lua/ddplua/).
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
--   tape         runtime/tape/: tape.h, node.c and view_history.c: nodes, saved tensors,
--                grad mode, hooks, in-place history of views; what an op needs to record
--                itself
--   ops          runtime/ops/: every op's front door (checks, promotion, recording on the
--                tape, one call through the kernel table); copies, casts, device moves,
--                random fills and gradient accumulation are ops too
--   comm         runtime/comm/: the communication layer: the store (store*.c), the
--                process-group front doors (pg.c), the ordered queue (pg_queue.c),
--                collective fingerprints and the flight recorder, the gloo / shm / nccl
--                backends. It moves bytes and reduces them through the kernel table (the
--                reduction entries of backend/kernels.h), so it sits on the ops and below
--                the autograd engine: an op or an autograd node may call a collective,
--                while nothing here calls the engine, io, or the DDP reducer (those are
--                its clients, above)
--   autograd     runtime/autograd/: the backward engine, which calls ops to sum gradients
--                (ops/copy.h), so it sits above them
--   io           runtime/io/: datasets, loaders, checkpoints
--   distributed  runtime/distributed/: the clients of comm: DDP reducer and its comm
--                hooks, sampler, process supervision (process.c)
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
-- Note [lua layers]: the Lua front end is a stack too, checked over the `require` calls of
-- every module under lua/ddplua/ (the lazy ones inside functions included: a require run
-- late is a dependency all the same). Bottom to top:
--
--   base         ddplua.lib (the FFI binding), options, format, os, clock, cuda, generator,
--                timeit, futures: the runtime's C API and plain helpers, no tensor methods
--   tensor       ddplua.tensor (the metatype) and the op modules ddplua.ops.* it installs;
--                ddplua.functions (the creation functions, grad mode and functional forms
--                the umbrella re-exports: what every module above may call); the stepwise
--                engine Lua hooks run in (ddplua.autograd.engine, hook_handle, context)
--   autograd     ddplua.autograd and autograd.function (Functions defined in Lua)
--   optim        ddplua.optim.*, ddplua.amp.*
--   data         ddplua.data.*, ddplua.checkpoint
--   distributed  ddplua.distributed.*: its modules reach the collectives through
--                ddplua.distributed.distributed_c10d, never through the package's own
--                init.lua, which only re-exports (as torch.distributed does)
--   nn           ddplua.nn.*: above distributed because SyncBatchNorm calls collectives,
--                while nothing in distributed builds layers
--   app          ddplua.utils.*, train_state, tools.*, repl.*, profiler: what scripts and
--                the executable use around a training loop
--   umbrella     ddplua (init.lua): re-exports ddplua.functions and loads the packages on
--                first use; for user code only, no library module requires it
--
-- A module may require modules of its own layer and of the layers below, and the require
-- graph has no cycle (two modules that require each other, however lazily, load in an
-- order that depends on who came first). Besides, the check fails on a required name it
-- cannot read (require(name) with a computed name: write the literal, so the graph stays
-- complete; "prefix." .. k is followed to every module under the prefix), a required name
-- that is neither a ddplua module nor a LuaJIT library (library code never requires user
-- code such as models/ or configs/: the caller passes it in), and a module no layer claims.
-- A peek at package.loaded["x"] (use x when something else loaded it) is no require.
--
-- Usage: luajit tools/check_layers.lua [ROOT [BUILD]]   (ROOT: the repository, default ".";
-- BUILD: the build folder, relative to the current folder; without it, or without objects
-- in it, the symbols are not checked and the summary says so)
-- Prints one line per violation, "path:line: what" (paths relative to ROOT; objects as
-- BUILD/obj/...), and exits 1 when there is any; else prints a summary and exits 0.

local root = arg[1] or "."
local build = arg[2]

-- Layers bottom to top. A file belongs to the first layer one of whose patterns matches its
-- path relative to runtime/.
local LAYERS = {
  { name = "api", "^include/" },
  { name = "core", "^core/" },
  { name = "backend", "^backend/" },
  { name = "tape", "^tape/" },
  { name = "ops", "^ops/" },
  { name = "comm", "^comm/" },
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

-- ---- the Lua require graph (Note [lua layers]) -----------------------------------------------

-- Layers bottom to top; a module belongs to the first layer one of whose patterns matches its
-- name (so the engine's modules are claimed before ddplua.autograd.* is).
local LUA_LAYERS = {
  { name = "base", "^ddplua%.lib$", "^ddplua%.options$", "^ddplua%.format$", "^ddplua%.os$",
    "^ddplua%.clock$", "^ddplua%.cuda$", "^ddplua%.generator$", "^ddplua%.timeit$", "^ddplua%.futures$" },
  { name = "tensor", "^ddplua%.tensor$", "^ddplua%.ops%.", "^ddplua%.functions$",
    "^ddplua%.autograd%.engine$", "^ddplua%.autograd%.hook_handle$", "^ddplua%.autograd%.context$" },
  { name = "autograd", "^ddplua%.autograd$", "^ddplua%.autograd%." },
  { name = "optim", "^ddplua%.optim$", "^ddplua%.optim%.", "^ddplua%.amp$", "^ddplua%.amp%." },
  { name = "data", "^ddplua%.data$", "^ddplua%.data%.", "^ddplua%.checkpoint$" },
  { name = "distributed", "^ddplua%.distributed$", "^ddplua%.distributed%." },
  { name = "nn", "^ddplua%.nn$", "^ddplua%.nn%." },
  { name = "app", "^ddplua%.utils%.", "^ddplua%.train_state$", "^ddplua%.tools%.", "^ddplua%.repl$",
    "^ddplua%.repl%.", "^ddplua%.profiler$" },
  { name = "umbrella", "^ddplua$" },
}

-- Libraries of LuaJIT itself, which any module may require.
local LUAJIT_LIBRARIES = {
  ffi = true, bit = true, jit = true, ["jit.util"] = true, ["jit.profile"] = true,
  ["string.buffer"] = true, ["table.new"] = true, ["table.clear"] = true,
}

local function lua_layer_of(module)
  for rank, layer in ipairs(LUA_LAYERS) do
    for _, pattern in ipairs(layer) do
      if module:find(pattern) then return rank, layer.name end
    end
  end
  return nil
end

-- The tokens of a Lua source, comments dropped: { {kind = "name"|"string"|"op", text, line} }.
-- Enough of Lua's lexer to tell code from comments and strings (short and long forms).
local function lua_tokens(src)
  local toks, i, line, n = {}, 1, 1, #src
  local function skip_long(from) -- at "[", "[=[" ...: returns (content, position after)
    local eq = src:match("^%[(=*)%[", from)
    local open_end = from + #eq + 2
    local close = src:find("]" .. eq .. "]", open_end, true)
    local stop = close and close + #eq + 2 or n + 1
    local body = src:sub(open_end, (close or n + 1) - 1)
    local _, nl = src:sub(from, stop - 1):gsub("\n", "")
    line = line + nl
    return body, stop
  end
  while i <= n do
    local c = src:sub(i, i)
    if c == "\n" then
      line, i = line + 1, i + 1
    elseif c:match("%s") then
      i = i + 1
    elseif src:sub(i, i + 1) == "--" then
      if src:match("^%[=*%[", i + 2) then
        local _, stop = skip_long(i + 2)
        i = stop
      else
        i = (src:find("\n", i, true) or n + 1)
      end
    elseif c == "[" and src:match("^%[=*%[", i) then
      local start_line = line
      local body, stop = skip_long(i)
      toks[#toks + 1] = { kind = "string", text = body, line = start_line }
      i = stop
    elseif c == '"' or c == "'" then
      local j, start_line = i + 1, line
      while j <= n do
        local ch = src:sub(j, j)
        if ch == "\\" then
          if src:sub(j + 1, j + 1) == "\n" then line = line + 1 end
          j = j + 2
        elseif ch == c or ch == "\n" then
          break
        else
          j = j + 1
        end
      end
      toks[#toks + 1] = { kind = "string", text = src:sub(i + 1, j - 1), line = start_line }
      i = j + 1
    elseif c:match("[%a_]") then
      local word = src:match("^[%w_]+", i)
      toks[#toks + 1] = { kind = "name", text = word, line = line }
      i = i + #word
    elseif c:match("%d") then
      i = i + #src:match("^[%w%.]+", i)
    else
      local op = src:match("^%.%.%.", i) or src:match("^%.%.", i) or c
      toks[#toks + 1] = { kind = "op", text = op, line = line }
      i = i + #op
    end
  end
  return toks
end

-- The requires of a Lua source: { {line, kind = "literal"|"prefix"|"computed", name} }.
-- Forms read: require "m", require 'm', require [[m]], require("m"), require("m." .. x)
-- (a prefix), pcall(require, "m"); any other use of require is a computed name.
local function lua_requires(src)
  local toks, out = lua_tokens(src), {}
  local function tok(k) return toks[k] or { kind = "eof", text = "" } end
  for k, t in ipairs(toks) do
    local before = tok(k - 1)
    if t.kind == "name" and t.text == "require" and before.text ~= "." and before.text ~= ":"
        and before.text ~= "function" then
      local a, b, c = tok(k + 1), tok(k + 2), tok(k + 3)
      if a.kind == "string" then
        out[#out + 1] = { line = t.line, kind = "literal", name = a.text }
      elseif a.text == "(" and b.kind == "string" and c.text == ")" then
        out[#out + 1] = { line = t.line, kind = "literal", name = b.text }
      elseif a.text == "(" and b.kind == "string" and c.text == ".." then
        out[#out + 1] = { line = t.line, kind = "prefix", name = b.text }
      elseif a.text == "," and before.text == "(" and b.kind == "string" and
          (tok(k - 2).text == "pcall" or tok(k - 2).text == "xpcall") then
        out[#out + 1] = { line = t.line, kind = "literal", name = b.text }
      else
        out[#out + 1] = { line = t.line, kind = "computed" }
      end
    end
  end
  return out
end

local lua_summary
local function check_lua()
  local lua_root = root .. "/lua"
  local listing = assert(io.popen("cd " .. shell_quote(lua_root) .. " 2>/dev/null && find ddplua " ..
    "-name '*.lua' -type f | LC_ALL=C sort"))
  local modules, module_list = {}, {} -- modules[name] = {file =, rank =, layer =}
  for rel in listing:lines() do
    local name = rel:gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")
    local rank, layer = lua_layer_of(name)
    modules[name] = { name = name, file = "lua/" .. rel, rank = rank, layer = layer }
    module_list[#module_list + 1] = name
  end
  listing:close()
  if #module_list == 0 then
    lua_summary = "lua not checked (no modules under " .. lua_root .. "/ddplua)"
    return
  end
  local graph, n_requires = {}, 0 -- graph[name] = { {to =, line =} } (first require of each)
  for _, name in ipairs(module_list) do
    local m = modules[name]
    graph[name] = {}
    local seen = {}
    if not m.rank then
      report("%s:1: module %s belongs to no layer (add it to LUA_LAYERS in tools/check_layers.lua)",
        m.file, name)
    end
    local function edge(target, line)
      local t = modules[target]
      if m.rank and t.rank and t.rank > m.rank then
        local allowed = {}
        for i = 1, m.rank do allowed[#allowed + 1] = LUA_LAYERS[i].name end
        report('%s:%d: %s requires "%s" (layer %s) from layer %s: %s may require only %s', m.file,
          line, name, target, t.layer, m.layer, m.layer, table.concat(allowed, ", "))
      end
      if not seen[target] and target ~= name then
        seen[target] = true
        table.insert(graph[name], { to = target, line = line })
      end
    end
    local f = assert(io.open(root .. "/" .. m.file, "rb"))
    local src = f:read("*a")
    f:close()
    for _, r in ipairs(lua_requires(src)) do
      n_requires = n_requires + 1
      local ours = r.name and (r.name == "ddplua" or r.name:sub(1, 7) == "ddplua.")
      if r.kind == "computed" then
        report("%s:%d: %s requires a computed module name: write it as a literal " ..
          '(require "ddplua.x") so that the layer check can follow it', m.file, r.line, name)
      elseif ours and r.kind == "literal" then
        if modules[r.name] then edge(r.name, r.line)
        else report('%s:%d: %s requires "%s", which is no module under lua/', m.file, r.line, name, r.name) end
      elseif ours then -- a prefix: every module under it
        local any = false
        for _, other in ipairs(module_list) do
          if other:sub(1, #r.name) == r.name then edge(other, r.line) any = true end
        end
        if not any then
          report('%s:%d: %s requires "%s" .. ..., and no module under lua/ starts so', m.file, r.line,
            name, r.name)
        end
      elseif not (r.kind == "literal" and LUAJIT_LIBRARIES[r.name]) then
        report("%s:%d: %s requires %s, which is no ddplua module and no LuaJIT library: library " ..
          "code never requires user code (models/, configs/) or other packages; take it from the " ..
          "caller instead", m.file, r.line, name, '"' .. r.name .. '"' .. (r.kind == "prefix" and " .. ..." or ""))
      end
    end
  end
  -- Cycles: depth-first search, each cycle reported once at the require that closes it.
  local state, stack = {}, {}
  local function visit(name)
    state[name] = "open"
    stack[#stack + 1] = name
    for _, e in ipairs(graph[name]) do
      if state[e.to] == "open" then
        -- the cycle's modules, rotated to start at the least name (one report, whatever
        -- module the search started from), each step with the require that makes it
        local start
        for i = #stack, 1, -1 do if stack[i] == e.to then start = i break end end
        local cycle, first = {}, 1
        for i = start, #stack do
          cycle[#cycle + 1] = stack[i]
          if stack[i] < cycle[first] then first = #cycle end
        end
        local k = #cycle
        local steps, last_file, last_line = { cycle[first] }, nil, nil
        for j = 0, k - 1 do
          local from, to = cycle[(first - 1 + j) % k + 1], cycle[(first + j) % k + 1]
          local line
          for _, e2 in ipairs(graph[from]) do if e2.to == to then line = e2.line break end end
          steps[#steps + 1] = string.format("%s (%s:%d)", to, modules[from].file, line)
          last_file, last_line = modules[from].file, line
        end
        report("%s:%d: require cycle: %s", last_file, last_line, table.concat(steps, " -> "))
      elseif not state[e.to] then
        visit(e.to)
      end
    end
    stack[#stack] = nil
    state[name] = "done"
  end
  for _, name in ipairs(module_list) do
    if not state[name] then visit(name) end
  end
  local names = {}
  for _, layer in ipairs(LUA_LAYERS) do names[#names + 1] = layer.name end
  lua_summary = string.format("lua ok, %d modules, %d requires, layers %s", #module_list, n_requires,
    table.concat(names, " < "))
end

check_symbols()
check_lua()

if #problems > 0 then
  for _, p in ipairs(problems) do io.stderr:write(p, "\n") end
  io.stderr:write(string.format("check_layers: %d violation%s of the layer rules " ..
    "(Note [layers], [symbol layers] and [lua layers] in tools/check_layers.lua)\n", #problems,
    #problems == 1 and "" or "s"))
  os.exit(1)
end
local names = {}
for _, layer in ipairs(LAYERS) do names[#names + 1] = layer.name end
print(string.format("check_layers: ok, %d files, %d includes, layers %s", #files, n_includes,
  table.concat(names, " < ")))
print("check_layers: " .. symbols_summary)
print("check_layers: " .. lua_summary)
