-- Specs for tools/check_layers.lua, the layer check `make test` runs after the build and
-- before the specs (Notes [layers], [symbol layers] and [lua layers] there): it passes on
-- the real tree and build, and fails, naming what is at fault, on copies broken the ways it
-- must catch. Includes: a core file that includes an ops header, an include from a lower
-- layer to a higher one elsewhere, a Lua header in the library, an include cycle, a file no
-- layer claims. Symbols: a core object that calls ddp_add (an op) with no upward include.
-- Lua requires: an upward require, the umbrella required by a library module, a cycle of
-- lazy requires, user code (models/) required by the library, a computed module name.
local files = require "files"

local tmpdir
setup(function() tmpdir = files.tmpdir("layers") end)
teardown(function() files.remove(tmpdir) end)

-- The build folder the specs run against: the one holding the library they load (build/, or
-- build-sanitize/ when make test runs with SANITIZE=...).
local BUILD = (os.getenv("DDPLUA_LIB") or "build/libddplua.so"):match("^(.*)/[^/]*$")

-- Run the check on the repository at root (and the build folder build, when given);
-- returns (exit status, output).
local function check(root, build)
  return files.run("luajit tools/check_layers.lua " .. files.quote(root) ..
    (build and (" " .. files.quote(build)) or ""))
end

-- A fresh copy of runtime/ and lua/ under a new folder of tmpdir (with BUILD's obj/ as
-- build/obj/ too when with_objects); returns that folder (the root).
local copies = 0
local function copy_tree(with_objects)
  copies = copies + 1
  local root = tmpdir .. "/tree" .. copies
  local q = files.quote(root)
  local status, out = files.run("mkdir -p " .. q .. " && cp -R runtime lua " .. q ..
    (with_objects and (" && mkdir -p " .. q .. "/build && cp -R " .. files.quote(BUILD .. "/obj") .. " " .. q ..
      "/build/obj") or ""))
  assert(status == 0, out)
  return root
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

-- Append text to file rel (relative to root); returns the number of its new last line.
local function append(root, rel, text)
  local path = root .. "/" .. rel
  local old = files.read(path)
  local f = assert(io.open(path, "ab"))
  f:write(text)
  f:close()
  local _, n = (old .. text):gsub("\n", "")
  return n
end

describe("tools/check_layers.lua", function()
  it("passes on the real tree and build: includes, symbols and Lua requires", function()
    local status, out = check(".", BUILD)
    assert.are.equal(0, status, out)
    assert.matches("check_layers: ok", out)
    assert.matches("core < backend < tape < ops < comm < autograd < io < distributed < cli", out, 1, true)
    local objects, refs = out:match("check_layers: symbols ok, (%d+) objects, (%d+) references")
    assert.is_truthy(objects, out)
    assert.is_true(tonumber(objects) > 50 and tonumber(refs) > 500, out)
    assert.matches("check_layers: lua ok, %d+ modules, %d+ requires, layers base < tensor < " ..
      "autograd < optim < data < distributed < nn < app < umbrella", out)
  end)

  it("without a build folder checks includes and requires only, and says so", function()
    local status, out = check(".")
    assert.are.equal(0, status, out)
    assert.matches("check_layers: symbols not checked (no build folder given", out, 1, true)
    assert.matches("check_layers: lua ok", out, 1, true)
    status, out = check(".", tmpdir .. "/no-build-here")
    assert.are.equal(0, status, out)
    assert.matches("check_layers: symbols not checked (no objects under " .. tmpdir ..
      "/no-build-here/obj/runtime: build first)", out, 1, true)
  end)

  it("fails on a core object that calls an op, naming the object, the symbol and both layers", function()
    local root = copy_tree(true)
    -- core.h includes the umbrella ddplua.h (api), so the includes alone are within the rules
    local src = "#include \"core/core.h\"\n" ..
      "int ddp_core_calls_add(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return ddp_add(out, a, b); }\n"
    local function compile(rel)
      write(root .. "/runtime/" .. rel .. ".c", src)
      local status, out = files.run("cc -c -Iruntime/include -Iruntime -o " ..
        files.quote(root .. "/build/obj/runtime/" .. rel .. ".o") .. " " .. files.quote(root .. "/runtime/" .. rel .. ".c"))
      assert.are.equal(0, status, out)
    end
    compile("core/calls_add")
    local status, out = check(root)
    assert.are.equal(0, status, out) -- the includes do not see it
    local build = root .. "/build"
    status, out = check(root, build)
    assert.are.equal(1, status, out)
    assert.matches(build .. "/obj/runtime/core/calls_add.o (runtime/core/calls_add.c): uses ddp_add, " ..
      "defined in " .. build .. "/obj/runtime/ops/elementwise.o (layer ops), from layer core: core " ..
      "may use only api, core", out, 1, true)
    assert.matches("1 violation of the layer rules", out, 1, true)
    -- the same call from a layer above the ops is no violation
    files.run("rm " .. files.quote(root .. "/runtime/core/calls_add.c") .. " " ..
      files.quote(build .. "/obj/runtime/core/calls_add.o"))
    compile("io/calls_add")
    status, out = check(root, build)
    assert.are.equal(0, status, out)
    assert.matches("check_layers: symbols ok", out, 1, true)
  end)

  it("places comm between ops and autograd: a comm object may call an op, never the DDP reducer", function()
    local root = copy_tree(true)
    local build = root .. "/build"
    local function compile(rel, src)
      write(root .. "/runtime/" .. rel .. ".c", "#include \"core/core.h\"\n" .. src)
      local status, out = files.run("cc -c -Iruntime/include -Iruntime -o " ..
        files.quote(build .. "/obj/runtime/" .. rel .. ".o") .. " " .. files.quote(root .. "/runtime/" .. rel .. ".c"))
      assert.are.equal(0, status, out)
    end
    -- an op and the kernel table are below comm (a collective may reduce through them)
    compile("comm/calls_op",
      "int ddp_comm_calls_add(ddp_tensor **out, ddp_tensor *a, ddp_tensor *b) { return ddp_add(out, a, b); }\n")
    local status, out = check(root, build)
    assert.are.equal(0, status, out)
    assert.matches("layers api < core < backend < tape < ops < comm < autograd < io < distributed < cli",
      out, 1, true)
    -- the reducer is a client above: calling it from comm is a violation the includes miss
    compile("comm/calls_reducer",
      "int ddp_comm_calls_reducer(ddp_reducer *r) { return ddp_reducer_prepare_for_backward(r); }\n")
    status, out = check(root)
    assert.are.equal(0, status, out)
    status, out = check(root, build)
    assert.are.equal(1, status, out)
    assert.matches(build .. "/obj/runtime/comm/calls_reducer.o (runtime/comm/calls_reducer.c): uses " ..
      "ddp_reducer_prepare_for_backward, defined in " .. build .. "/obj/runtime/distributed/reducer.o " ..
      "(layer distributed), from layer comm: comm may use only api, core, backend, tape, ops, comm", out, 1, true)
    assert.matches("1 violation of the layer rules", out, 1, true)
  end)

  it("fails on an upward Lua require, however lazy, naming the file, line, modules and layers", function()
    local root = copy_tree()
    local line = append(root, "lua/ddplua/tensor.lua", "-- require \"ddplua.nn\" in a comment is no require\n" ..
      "local in_a_string = 'require \"ddplua.nn\"'\n--[[ require \"ddplua.optim\" ]]\n" ..
      "local function later() return require(\"ddplua.data\").DataLoader end\n")
    local umbrella = append(root, "lua/ddplua/nn/linear.lua", "local function dl() return require 'ddplua' end\n")
    local status, out = check(root)
    assert.are.equal(1, status, out)
    assert.matches("lua/ddplua/tensor.lua:" .. line .. ': ddplua.tensor requires "ddplua.data" (layer data) ' ..
      "from layer tensor: tensor may require only base, tensor", out, 1, true)
    assert.matches("lua/ddplua/nn/linear.lua:" .. umbrella .. ': ddplua.nn.linear requires "ddplua" (layer ' ..
      "umbrella) from layer nn", out, 1, true)
    assert.is_nil(out:find("ddplua.nn\" (layer", 1, true))
    assert.is_nil(out:find("ddplua.optim\" (layer", 1, true))
  end)

  it("fails on a require cycle, even one closed by a lazy require within one layer", function()
    local root = copy_tree()
    local line = append(root, "lua/ddplua/optim/optimizer.lua",
      "local function sgd() return require \"ddplua.optim.sgd\" end\n")
    local status, out = check(root)
    assert.are.equal(1, status, out)
    local n, sgd_line = 0, nil -- where sgd.lua requires the optimizer base class
    for l in io.lines(root .. "/lua/ddplua/optim/sgd.lua") do
      n = n + 1
      if l:find('require "ddplua.optim.optimizer"', 1, true) then sgd_line = n break end
    end
    assert.is_truthy(sgd_line)
    assert.matches("lua/ddplua/optim/sgd.lua:" .. sgd_line .. ": require cycle: ddplua.optim.optimizer -> " ..
      "ddplua.optim.sgd (lua/ddplua/optim/optimizer.lua:" .. line .. ") -> ddplua.optim.optimizer " ..
      "(lua/ddplua/optim/sgd.lua:" .. sgd_line .. ")", out, 1, true)
    assert.matches("1 violation of the layer rules", out, 1, true)
  end)

  it("fails on a library module that requires user code or a computed name", function()
    local root = copy_tree()
    local user = append(root, "lua/ddplua/utils/train_config.lua",
      "local function net(name) return require(\"models.\" .. name) end\n")
    local computed = append(root, "lua/ddplua/data/loader.lua",
      "local function load(name) return require(name) end\n")
    local status, out = check(root)
    assert.are.equal(1, status, out)
    assert.matches("lua/ddplua/utils/train_config.lua:" .. user .. ': ddplua.utils.train_config requires ' ..
      '"models." .. ..., which is no ddplua module and no LuaJIT library: library code never requires ' ..
      "user code", out, 1, true)
    assert.matches("lua/ddplua/data/loader.lua:" .. computed .. ": ddplua.data.loader requires a computed " ..
      "module name", out, 1, true)
    assert.matches("2 violations of the layer rules", out, 1, true)
  end)

  it("fails when a core file includes an ops header, naming the file, line and include", function()
    local root = copy_tree()
    local line = append(root, "runtime/core/tensor.c", '#include "ops/copy.h"\n')
    local status, out = check(root)
    assert.are.equal(1, status, out)
    assert.matches("runtime/core/tensor.c:" .. line .. ': includes "ops/copy.h" (layer ops) from ' ..
      "layer core: core may include only api, core", out, 1, true)
    assert.matches("1 violation of the layer rules", out, 1, true)
  end)

  it("fails on an include from a lower layer to a higher one outside core", function()
    local root = copy_tree()
    local line = append(root, "runtime/backend/cpu/copy.c", '#include "tape/tape.h"\n')
    local status, out = check(root)
    assert.are.equal(1, status, out)
    assert.matches("runtime/backend/cpu/copy.c:" .. line .. ': includes "tape/tape.h" ' ..
      "(layer tape) from layer backend", out, 1, true)
    -- the engine is above the ops; the tape is not
    root = copy_tree()
    line = append(root, "runtime/tape/node.c", '#include "ops/copy.h"\n')
    status, out = check(root)
    assert.are.equal(1, status, out)
    assert.matches("runtime/tape/node.c:" .. line .. ': includes "ops/copy.h" (layer ops) ' ..
      "from layer tape", out, 1, true)
  end)

  it("fails on a Lua header in the runtime library, but not in cli/", function()
    local root = copy_tree()
    local line = append(root, "runtime/io/idx.c", "#include <lua.h>\n")
    append(root, "runtime/cli/args.c", "#include <lauxlib.h>\n")
    local status, out = check(root)
    assert.are.equal(1, status, out)
    assert.matches("runtime/io/idx.c:" .. line .. ": includes the Lua header lua.h", out, 1, true)
    assert.is_nil(out:find("runtime/cli/args.c", 1, true))
  end)

  it("fails on an include cycle, even within one layer", function()
    local root = copy_tree()
    local a = root .. "/runtime/ops/cycle_a.h"
    local b = root .. "/runtime/ops/cycle_b.h"
    write(a, '#include "ops/cycle_b.h"\n')
    write(b, '/* #include "ops/ignored.h" in a comment is no include */\n#include "cycle_a.h"\n')
    local status, out = check(root)
    assert.are.equal(1, status, out)
    assert.matches("include cycle: runtime/ops/cycle_a.h -> runtime/ops/cycle_b.h -> " ..
      "runtime/ops/cycle_a.h", out, 1, true)
    assert.is_nil(out:find("ignored.h", 1, true))
  end)

  it("fails on a file no layer claims and on an include that is not there", function()
    local root = copy_tree()
    files.run("mkdir -p " .. files.quote(root .. "/runtime/misc"))
    write(root .. "/runtime/misc/x.c", '#include "core/nowhere.h"\n')
    local status, out = check(root)
    assert.are.equal(1, status, out)
    assert.matches("runtime/misc/x.c:1: belongs to no layer", out, 1, true)
    assert.matches('runtime/misc/x.c:1: includes "core/nowhere.h", which is not a file under ' ..
      "runtime/", out, 1, true)
  end)
end)
