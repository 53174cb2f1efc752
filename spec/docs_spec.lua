-- Specs for the API documentation: every public Lua function of the front end and every C
-- function of the public header carries a doc comment (Note [doc comment shapes] in
-- tools/doc_comments.lua), and `make docs` (tools/gen_docs.lua) turns them into an HTML
-- reference covering tensors, nn, optim, data, distributed, cuda and the C API.
package.path = "tools/?.lua;" .. package.path
local doc = require "doc_comments"
local files = require "files"

-- Hooks a subclass overrides: documented once, on the base class (Module:init/forward/
-- extra_repr in nn/module.lua, validate/update in optim/optimizer.lua, closed_form_lr in
-- optim/lr_scheduler.lua). An override carries no second copy of that text.
local HOOKS = { init = true, forward = true, extra_repr = true, validate = true, update = true,
  closed_form_lr = true }

describe("API documentation", function()
  local all = doc.collect(".")

  it("documents every public Lua function", function()
    local missing = {}
    for path, f in pairs(all.files) do
      for _, fn in ipairs(f.functions) do
        local method = fn.name:match("[.:]([%w_]+)$")
        local is_base = path == "lua/ddplua/nn/module.lua" or path:match("optimizer%.lua$")
          or path:match("lr_scheduler%.lua$")
        if fn.public and not fn.doc and (is_base or not HOOKS[method]) then
          missing[#missing + 1] = ("%s:%d %s"):format(path, fn.line, fn.name)
        end
      end
    end
    table.sort(missing)
    assert.same({}, missing)
  end)

  it("documents the hooks once, on their base classes", function()
    local function documented(path, name)
      for _, fn in ipairs(all.files[path].functions) do
        if fn.name == name and fn.doc then return true end
      end
      return false
    end
    assert.is_true(documented("lua/ddplua/nn/module.lua", "Module:init"))
    assert.is_true(documented("lua/ddplua/nn/module.lua", "Module:forward"))
    assert.is_true(documented("lua/ddplua/nn/module.lua", "Module:extra_repr"))
    local opt = files.read("lua/ddplua/optim/optimizer.lua")
    assert.matches("validate(group)", opt, 1, true)
    assert.matches("update(p, grad, group, state)", opt, 1, true)
    assert.matches("configure(group, cfg)", opt, 1, true)
    assert.matches("closed_form_lr()", files.read("lua/ddplua/optim/lr_scheduler.lua"), 1, true)
  end)

  it("documents every C function of the public headers", function()
    local missing = {}
    for _, e in ipairs(all.c) do
      if not e.doc or e.doc == "" then missing[#missing + 1] = e.header .. " " .. e.name end
    end
    assert.same({}, missing)
    assert.is_true(#all.c > 300)
  end)

  it("reads a doc comment, a family sharing one, and the module's comment", function()
    local parsed = doc.parse_lua(table.concat({
      "--- m: a module.", "local M = {}", "",
      "--- M.a(x): doubles x.", "-- Second line.", "function M.a(x) return 2 * x end",
      "function M.b(x) return x end", "",
      "function M.c() end", "-- plain comment", "function M._d() end",
    }, "\n"))
    assert.equal("m: a module.", parsed.doc)
    local by = {}
    for _, fn in ipairs(parsed.functions) do by[fn.name] = fn end
    assert.equal("M.a(x): doubles x.\nSecond line.", by["M.a"].doc)
    assert.equal(by["M.a"].doc, by["M.b"].doc)
    assert.is_nil(by["M.c"].doc)
    assert.is_false(by["M._d"].public)
    local c = doc.parse_c("/* Adds. */\nint ddp_x(int a);\nint ddp_y(int a);\n\nint ddp_z(void); /* Zed. */\n")
    assert.same({ "Adds.", "Adds.", "Zed." }, { c[1].doc, c[2].doc, c[3].doc })
  end)

  it("generates the HTML reference (make docs) covering every section", function()
    local dir = files.tmpdir("docs")
    finally(function() files.remove(dir) end)
    assert.equal(0, os.execute(("luajit tools/gen_docs.lua . %s >/dev/null"):format(dir)))
    local index = files.read(dir .. "/index.html")
    for _, page in ipairs { "tensors", "nn", "optim", "data", "distributed", "cuda", "c_api" } do
      assert.matches(page .. ".html", index, 1, true)
    end
    assert.matches("dl.zeros(shape, opts)", files.read(dir .. "/tensors.html"), 1, true)
    assert.matches("ddplua.nn.linear", files.read(dir .. "/nn.html"), 1, true)
    assert.matches("ddp_tensor_zeros", files.read(dir .. "/c_api.html"), 1, true)
    assert.matches("all_reduce", files.read(dir .. "/distributed.html"), 1, true)
  end)
end)
