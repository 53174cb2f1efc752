--- ddplua.repl.help: `?name` and help(obj) at the prompt: the doc comment of a function,
-- class or module, with its signature, read from the index make generates from the code's
-- own doc comments (tools/gen_docindex.lua; build/lua/ddplua/docindex.lua beside the runtime
-- library, as the cdef).
--
-- A Lua function is found by the file and line where it is defined (debug.getinfo), so
-- aliases (dl.ones and Tensor.ones, dl.nn.functional.relu) find their one comment. A table
-- is found as a module (package.loaded) or, for an object, through its class (metatable).
-- ddp_ names (`?ddp_tensor_zeros`) show the public C header's comment.
local M = {}

local index_cache

-- Note [doc of a wrapper]: the REPL sometimes puts a wrapper where the library's value was
-- (the distributed prompt's dist and its in-place collectives, lua/ddplua/repl/ranks.lua).
-- Found by where it is defined, a wrapper would show no doc, or the wrapper's; so the one
-- who wraps says whose doc it shows, here, and describe() looks through it. Weak keys: a
-- dropped wrapper leaves nothing behind.
local doc_of = setmetatable({}, { __mode = "k" })

--- help.same_doc(wrapper, original) -> wrapper: `?` and help() on `wrapper` (a function or
-- table) show the doc comment and members of `original` (Note [doc of a wrapper]).
function M.same_doc(wrapper, original)
  doc_of[wrapper] = original
  return wrapper
end

--- help.index() -> the doc index table, or nil and why (no build).
function M.index()
  if index_cache then return index_cache end
  local ok, lib = pcall(require, "ddplua.lib")
  local dir = ok and lib.lib_path:match("^(.*)/[^/]*$")
  if not dir then return nil, "the runtime library is not loaded" end
  local chunk, err = loadfile(dir .. "/lua/ddplua/docindex.lua")
  if not chunk then return nil, err end
  index_cache = chunk()
  return index_cache
end

-- "lua/ddplua/nn/linear.lua" for a chunk source "@/any/where/lua/ddplua/nn/linear.lua".
local function relative(source)
  return source and source:match("(lua/ddplua/.*)$")
end

-- The first line of a text.
local function first_line(text)
  return (text or ""):match("^([^\n]*)") or ""
end

-- The module name and file entry of a table that is a loaded module (or a class returned by
-- one), else nil.
local function module_of(value, index)
  for name, mod in pairs(package.loaded) do
    if mod == value and type(name) == "string" then
      for path, f in pairs(index.files) do
        if f.module == name then return name, f, path end
      end
    end
  end
end

-- The help text of a function.
local function describe_function(fn, name, index)
  local info = debug.getinfo(fn, "S")
  local path = relative(info.source)
  local f = path and index.files[path]
  local entry = f and f.functions[info.linedefined]
  if not entry then
    if info.what == "C" then return (name or "function") .. ": a built-in function (no doc comment)\n" end
    return ("%s: defined at %s:%d (no doc comment)\n"):format(name or "function",
      info.short_src, info.linedefined)
  end
  local shown = (name or entry.name) .. entry.args
  local doc = entry.doc ~= "" and entry.doc or "(no doc comment)"
  return ("%s    [%s:%d]\n%s\n"):format(shown, path, info.linedefined, doc)
end

-- The public fields of a table that are functions or tables, sorted.
local function members(t)
  local names = {}
  for k, v in pairs(t) do
    if type(k) == "string" and not k:match("^_") and (type(v) == "function" or type(v) == "table") then
      names[#names + 1] = k
    end
  end
  table.sort(names)
  return names
end

-- The help text of a module, class or object.
local function describe_table(t, name, index)
  local mod, f, path = module_of(t, index)
  local target = t
  if not mod then
    local mt = getmetatable(t)
    if type(mt) == "table" then
      mod, f, path = module_of(mt, index)
      target = mt
    end
  end
  local out = {}
  if mod then
    out[#out + 1] = ("%s    [%s]\n%s\n"):format(name or mod, path, f.doc ~= "" and f.doc or "(no doc comment)")
  else
    out[#out + 1] = (name or "table") .. ": a table\n"
  end
  local list = members(target)
  if #list > 0 then
    out[#out + 1] = "members: " .. table.concat(list, ", ") .. "\n"
  end
  return table.concat(out)
end

--- help.describe(value[, name][, expr]) -> text: the doc comment (and signature) of `value`,
-- shown as `name` (what was typed). `expr` is the typed text, for C names.
function M.describe(value, name, expr)
  local index, err = M.index()
  if not index then return "no doc index (" .. tostring(err) .. "): run make\n" end
  local cname = (expr or name or ""):match("ddp_[%w_]+$")
  if cname and index.c[cname] then
    local e = index.c[cname]
    return ("%s    [%s]\n%s\n"):format(e.sig, e.header, e.doc ~= "" and e.doc or "(no doc comment)")
  end
  while doc_of[value] ~= nil do value = doc_of[value] end
  local tensor = package.loaded["ddplua.tensor"]
  if type(value) == "function" then return describe_function(value, name, index) end
  if type(value) == "cdata" and tensor and tensor.is_tensor(value) then
    return describe_table(package.loaded["ddplua.tensor"], name, index)
  end
  if type(value) == "table" then return describe_table(value, name, index) end
  if value == nil then return (name or "value") .. " is nil: nothing to describe\n" end
  return ("%s is a %s: %s\n"):format(name or "value", type(value), tostring(value))
end

--- help.namespaces() -> text: what `?` alone prints: the namespaces of `dl` with the first
-- line of their doc comment, and how to ask for more.
function M.namespaces()
  local index, err = M.index()
  if not index then return "no doc index (" .. tostring(err) .. "): run make\n" end
  local dl = package.loaded["ddplua"]
  local out = { "Namespaces (?dl.nn, ?dl.zeros, help(obj) for one; Tab completes names):\n" }
  local rows = { { "dl", "ddplua" } }
  if type(dl) == "table" then
    for _, m in ipairs(index.modules) do -- dl.nn and the other lazily loaded namespaces too
      local k = m:match("^ddplua%.([%w_]+)$")
      local ok, v = pcall(function() return k and dl[k] end)
      if ok and type(v) == "table" and module_of(v, index) then rows[#rows + 1] = { "dl." .. k, m } end
    end
  end
  for _, row in ipairs(rows) do
    local _, f = nil, nil
    for _, file in pairs(index.files) do
      if file.module == row[2] then f = file end
    end
    local summary = f and first_line(f.doc):gsub("^[%w_.]+:%s*", "") or ""
    out[#out + 1] = ("  %-18s %s\n"):format(row[1], summary)
  end
  out[#out + 1] = "  ddp_*              the C API (runtime/include/ddplua.h), e.g. ?ddp_tensor_zeros\n"
  return table.concat(out)
end

return M
