--- tools/doc_comments.lua: reads the doc comments the code already carries, for the REPL's
-- help index (tools/gen_docindex.lua), the HTML reference (tools/gen_docs.lua) and the spec
-- that every public function has one (spec/docs_spec.lua). Docs are written once, in the
-- code; everything else is generated from them.
--
-- Note [doc comment shapes]
-- Lua: a block of comment lines whose first starts with `---` documents the definition on
-- the line right below it (`function M.f(a, b)`, `function C:m(a)`, `local function f(a)`,
-- `M.f = function(a)`). The block at the top of a file documents the module. Definitions
-- that follow a documented one with no blank line between (`function M.ones ... end` just
-- after `M.zeros`) share its comment: one comment for a family. A definition is public when
-- it is a field of a table (`M.f`, `Class:m`) and its name does not start with '_'.
-- C: a `/* ... */` block right above a declaration of a ddp_ function (in the public
-- headers) documents it, and the declarations right below it with no blank line; so does a
-- section comment one blank line above a group, and a comment at the end of the line.
local M = {}

-- The lines of a text (without their newlines).
local function lines_of(text)
  local list = {}
  for line in (text .. (text:sub(-1) == "\n" and "" or "\n")):gmatch("([^\n]*)\n") do
    list[#list + 1] = line
  end
  return list
end

-- Name and parameter list of a function definition line, and whether it is a field.
local function definition(line)
  local name, args = line:match("^%s*function%s+([%w_.:]+)%s*(%b())")
  if name then return name, args, name:find("[.:]") ~= nil end
  name, args = line:match("^%s*local%s+function%s+([%w_]+)%s*(%b())")
  if name then return name, args, false end
  name, args = line:match("^%s*([%w_.]+)%s*=%s*function%s*(%b())")
  if name then return name, args, name:find("[.]") ~= nil end
  name, args = line:match("^%s*local%s+([%w_]+)%s*=%s*function%s*(%b())")
  if name then return name, args, false end
end

-- Strip the comment marks of a block of lines.
local function comment_text(block)
  local out = {}
  for _, l in ipairs(block) do out[#out + 1] = (l:gsub("^%s*%-%-%-?%s?", "")) end
  return table.concat(out, "\n")
end

--- doc.module_name(path) -> "ddplua.nn.linear" for ".../lua/ddplua/nn/linear.lua" (init.lua
-- names its folder).
function M.module_name(path)
  local rel = path:match("lua/(ddplua/.*)%.lua$") or path
  return (rel:gsub("/init$", ""):gsub("/", "."))
end

--- doc.parse_lua(text) -> {doc = module comment or nil, functions = list of {name, args,
-- line, doc (or nil), public (boolean)}} (Note [doc comment shapes]).
function M.parse_lua(text)
  local result = { functions = {} }
  local block, block_start = nil, nil
  local family_doc = nil -- the comment a definition right below the previous one shares
  for i, line in ipairs(lines_of(text)) do
    if line:match("^%s*%-%-") and not line:match("^%s*%-%-%[") then
      if line:match("^%s*%-%-%-") and not line:match("^%s*%-%-%-%-") and not block then
        block, block_start = {}, i
      end
      if block then block[#block + 1] = line else family_doc = nil end
    else
      local name, args, field = definition(line)
      local doc = block and comment_text(block)
      if block and block_start == 1 and not name then result.doc = doc end
      if name then
        if not doc and family_doc then doc = family_doc end
        result.functions[#result.functions + 1] = {
          name = name, args = args, line = i, doc = doc,
          public = field and not name:match("[.:]_[%w_]*$"),
        }
        family_doc = doc
      elseif line:match("^%s*$") then
        family_doc = nil
      end
      block = nil
    end
  end
  return result
end

--- doc.parse_c(text) -> list of {name, sig (the declaration, one line), line, doc (or nil)}
-- for the ddp_ functions declared in a header.
function M.parse_c(text)
  local list = {}
  local ls = lines_of(text)
  local comment, in_comment, comment_end = {}, false, 0
  local family_doc, family_end = nil, -1 -- a declaration right below another shares its doc
  local i = 1
  while i <= #ls do
    local line = ls[i]
    if not in_comment and line:match("^%s*/%*") then
      comment, in_comment = {}, true
    end
    if in_comment then
      comment[#comment + 1] = line
      if line:find("%*/") then in_comment, comment_end = false, i end
      i = i + 1
    else
      local name = line:match("^[%w_ %*]-[%s%*](ddp_[%w_]+)%s*%(")
      if name then
        local decl, j = line, i
        while not decl:find(";") and j < #ls do
          j = j + 1
          decl = decl .. " " .. ls[j]:gsub("^%s+", "")
        end
        local doc
        local trailing = decl:match("/%*(.-)%*/")
        if trailing then
          doc = trailing:gsub("^%s+", ""):gsub("%s+$", "")
        elseif (comment_end == i - 1 or (comment_end == i - 2 and ls[i - 1]:match("^%s*$")))
           and #comment > 0 then
          doc = table.concat(comment, "\n"):gsub("^%s*/%*%s?", ""):gsub("%s*%*/%s*$", "")
          doc = doc:gsub("\n%s*%*? ?", "\n")
        elseif family_end == i - 1 then
          doc = family_doc
        end
        family_doc, family_end = doc, j
        list[#list + 1] = { name = name, sig = (decl:gsub("%s+", " "):gsub("%s*;.*$", "")),
          line = i, doc = doc }
        i = j + 1
      else
        i = i + 1
      end
    end
  end
  return list
end

local function read(path)
  local f = assert(io.open(path, "r"))
  local text = f:read("*a")
  f:close()
  return text
end

-- Sorted paths (relative to root) of the files under dir whose names match the glob.
local function find_sorted(root, dir, glob)
  local list = {}
  local p = io.popen(("cd '%s' && find %s -name '%s' | sort"):format(root, dir, glob))
  for path in p:lines() do list[#list + 1] = path end
  p:close()
  return list
end

--- doc.lua_files(root) / doc.header_files(root) -> sorted paths (relative to root) of the
-- front end's modules (lua/ddplua/**.lua) and of the public headers (runtime/include/**.h).
function M.lua_files(root) return find_sorted(root, "lua/ddplua", "*.lua") end

function M.header_files(root) return find_sorted(root, "runtime/include", "*.h") end

--- doc.collect(root) -> {modules = sorted module names, files = {[path] = {module, doc,
-- functions}}, c = list of C entries (with .header)}: everything under root.
function M.collect(root)
  local all = { modules = {}, files = {}, c = {} }
  for _, path in ipairs(M.lua_files(root)) do
    local parsed = M.parse_lua(read(root .. "/" .. path))
    parsed.module = M.module_name(path)
    all.files[path] = parsed
    all.modules[#all.modules + 1] = parsed.module
  end
  table.sort(all.modules)
  for _, path in ipairs(M.header_files(root)) do
    for _, e in ipairs(M.parse_c(read(root .. "/" .. path))) do
      e.header = path
      all.c[#all.c + 1] = e
    end
  end
  return all
end

return M
