-- Specs for README.md: its code snippets run as written. Every ```lua block runs in a
-- child `ddplua` (a block that joins a process group runs under the launcher with 2
-- processes; a block that asks for CUDA runs on the simulated device), the `ddplua -e`
-- block runs as a command, and the ```c block compiles against ddplua.h and runs. Shell
-- blocks (commands, the Slurm script) are exercised by the train, launcher and CLI specs.
local files = require "files"
local cuda = require "cuda"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

-- The fenced blocks of README.md in order: a list of {lang = "lua"|"c"|"", text = ...}.
local function blocks()
  local out = {}
  for lang, text in files.read("README.md"):gmatch("```(%w*)\n(.-)```") do
    out[#out + 1] = { lang = lang, text = text }
  end
  return out
end

describe("README.md", function()
  local dir
  before_each(function() dir = files.tmpdir("readme") end)
  after_each(function() files.remove(dir) end)

  local function write(name, text) return files.write(dir, name, text) end

  it("has Lua snippets that run as written #dist", function()
    local n = 0
    for i, b in ipairs(blocks()) do
      if b.lang == "lua" then
        n = n + 1
        local path = write(("snippet%d.lua"):format(i), b.text)
        local cmd = exe .. " " .. path
        if b.text:find("init_process_group") then
          cmd = exe .. " --nproc_per_node=2 --standalone " .. path
        elseif b.text:find(":cuda%(") then
          cmd = ("env DDPLUA_CUDA_PLUGIN=%s %s"):format(files.quote(cuda.sim_plugin()), cmd)
        end
        local status, out = files.run(cmd)
        assert.are.equal(0, status, ("README block %d (%s):\n%s\n%s"):format(i, cmd, b.text, out))
      end
    end
    assert.is_true(n >= 4, "found " .. n .. " lua blocks")
  end)

  it("has a `ddplua -e` example that runs", function()
    local found = false
    for _, b in ipairs(blocks()) do
      local code = b.text:match("^%$ ddplua %-e '(.*)'%s*$")
      if code then
        found = true
        local status, out = files.run(exe .. " -e " .. files.quote(code))
        assert.are.equal(0, status, out)
        assert.matches("^[%d.e+-]+%s+[%d.e+-]+\n$", out)
      end
    end
    assert.is_true(found)
  end)

  it("has a C snippet that compiles against ddplua.h and runs", function()
    local found = false
    for i, b in ipairs(blocks()) do
      if b.lang == "c" then
        found = true
        local src = write(("snippet%d.c"):format(i), b.text)
        local bin = dir .. "/snippet" .. i
        local status, out = files.run(("cc -std=c11 -Wall -Werror -Iruntime/include %s -Lbuild -lddplua -Wl,-rpath,%s/build -o %s")
          :format(src, os.getenv("PWD") or ".", bin))
        assert.are.equal(0, status, out)
        status, out = files.run(bin)
        assert.are.equal(0, status, out)
      end
    end
    assert.is_true(found)
  end)
end)
