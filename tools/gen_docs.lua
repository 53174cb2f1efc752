--- tools/gen_docs.lua ROOT OUTDIR: the HTML API reference (`make docs`), generated from the
-- doc comments the code carries (tools/doc_comments.lua, the same reader as the REPL's
-- `?name`), so nothing is written twice. One page per section (tensors, nn, optim, data,
-- distributed, cuda, the rest of the front end, the C API) with every module's comment and
-- every documented public function's signature and comment, and an index page.
-- (Debian's LDoc wants @param tags and one module per comment block; the comments here are
-- prose with the signature first, as the REPL shows them, so a small generator it is.)
package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local doc = require "doc_comments"

local root, outdir = arg[1] or ".", arg[2] or "build/docs"

local SECTIONS = {
  { id = "tensors", title = "Tensors and ops", match = { "^ddplua$", "^ddplua%.functions$", "^ddplua%.tensor$",
    "^ddplua%.ops" } },
  { id = "nn", title = "nn: layers and modules", match = { "^ddplua%.nn" } },
  { id = "optim", title = "optim: optimizers and schedulers", match = { "^ddplua%.optim" } },
  { id = "data", title = "data: datasets and loading", match = { "^ddplua%.data" } },
  { id = "distributed", title = "distributed: process groups, DDP", match = { "^ddplua%.distributed" } },
  { id = "cuda", title = "cuda: devices, memory, streams", match = { "^ddplua%.cuda$" } },
  { id = "more", title = "Everything else (checkpoints, REPL, tools)", match = { "" } },
}

local function escape(s)
  return (s:gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;"))
end

local function section_of(module)
  for _, s in ipairs(SECTIONS) do
    for _, pat in ipairs(s.match) do
      if module:find(pat) then return s end
    end
  end
end

local HEAD = [[<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>%s — ddplua API</title>
<style>body{font-family:sans-serif;max-width:60em;margin:auto;padding:1em}
pre{background:#f4f4f4;padding:.5em;white-space:pre-wrap}code.sig{font-weight:bold}
h2{border-bottom:1px solid #ccc}nav a{margin-right:1em}</style></head><body>
<nav><a href="index.html">index</a>%s</nav><h1>%s</h1>
]]

local function nav()
  local links = {}
  for _, s in ipairs(SECTIONS) do links[#links + 1] = ('<a href="%s.html">%s</a>'):format(s.id, s.id) end
  links[#links + 1] = '<a href="c_api.html">C API</a>'
  return table.concat(links)
end

local function write(name, text)
  local f = assert(io.open(outdir .. "/" .. name, "w"))
  f:write(text)
  f:close()
end

os.execute(("mkdir -p '%s'"):format(outdir))
local all = doc.collect(root)
local pages = {}
local paths = {}
for path in pairs(all.files) do paths[#paths + 1] = path end
table.sort(paths)
for _, path in ipairs(paths) do
  local f = all.files[path]
  local s = section_of(f.module)
  pages[s.id] = pages[s.id] or {}
  local out = pages[s.id]
  out[#out + 1] = ('<h2 id="%s">%s</h2>\n<p><small>%s</small></p>\n'):format(f.module, f.module, path)
  if f.doc then out[#out + 1] = "<pre>" .. escape(f.doc) .. "</pre>\n" end
  local last_doc
  for _, fn in ipairs(f.functions) do
    if fn.doc then -- the public ones and the documented locals the modules hand out (dl.add)
      out[#out + 1] = ('<h3 id="%s"><code class="sig">%s%s</code></h3>\n'):format(
        f.module .. "." .. fn.name, escape(fn.name), escape(fn.args))
      if fn.doc ~= last_doc then out[#out + 1] = "<pre>" .. escape(fn.doc) .. "</pre>\n" end
      last_doc = fn.doc
    end
  end
end
local index = { HEAD:format("index", nav(), "ddplua API reference"), "<ul>\n" }
for _, s in ipairs(SECTIONS) do
  write(s.id .. ".html", HEAD:format(s.title, nav(), escape(s.title)) .. table.concat(pages[s.id] or {}) .. "</body></html>\n")
  index[#index + 1] = ('<li><a href="%s.html">%s</a></li>\n'):format(s.id, escape(s.title))
end
local c = { HEAD:format("C API", nav(), "C API (runtime/include/ddplua.h)") }
local header
for _, e in ipairs(all.c) do
  if e.header ~= header then
    header = e.header
    c[#c + 1] = ("<h2>%s</h2>\n"):format(header)
  end
  c[#c + 1] = ('<h3 id="%s"><code class="sig">%s</code></h3>\n<pre>%s</pre>\n'):format(e.name,
    escape(e.sig), escape(e.doc or ""))
end
write("c_api.html", table.concat(c) .. "</body></html>\n")
index[#index + 1] = '<li><a href="c_api.html">C API (runtime/include/ddplua.h)</a></li>\n</ul></body></html>\n'
write("index.html", table.concat(index))
print(("docs: %s/index.html (%d modules, %d C functions)"):format(outdir, #all.modules, #all.c))
