-- spec/helpers/pytorch.lua: run a reference computation in PyTorch (Debian's python3-torch,
-- /usr/bin/python3) and read its JSON answer back, for specs that compare with PyTorch 1.13.
local files = require "files"
local checkpoint = require "ddplua.checkpoint"

local M = {}

local PYTHON = "/usr/bin/python3"

--- pytorch.run(script) -> the value the Python script printed as JSON (its last line), or
-- nil and a reason when /usr/bin/python3 or torch is missing (for pending()). The script
-- runs with `import json, math, torch` done and torch's default dtype f64; it prints one
-- JSON line. Raises with Python's output when the script fails.
function M.run(script)
  if not io.open(PYTHON, "r") then return nil, "no " .. PYTHON end
  local probe = io.popen(PYTHON .. " -c 'import torch' 2>&1; echo rc=$?")
  local out = probe:read("*a")
  probe:close()
  if not out:match("rc=0%s*$") then return nil, PYTHON .. " has no torch (python3-torch)" end
  local dir = files.tmpdir("pytorch")
  local path = dir .. "/ref.py"
  local f = assert(io.open(path, "w"))
  f:write("import json, math, torch\ntorch.set_default_dtype(torch.float64)\n", script)
  f:close()
  local p = io.popen(PYTHON .. " " .. files.quote(path) .. " 2>&1; echo; echo rc=$?")
  local text = p:read("*a")
  p:close()
  files.remove(dir)
  if not text:match("rc=0%s*$") then error("the PyTorch reference script failed:\n" .. text, 2) end
  local last
  for line in text:gmatch("[^\n]+") do
    if line:match("^%s*[%[{]") then last = line end
  end
  if not last then error("the PyTorch reference script printed no JSON:\n" .. text, 2) end
  return checkpoint.json_decode(last)
end

return M
