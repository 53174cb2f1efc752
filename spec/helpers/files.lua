-- spec/helpers/files.lua: temporary folders, files and shell commands for specs.
local M = {}

--- Single-quote s for the shell.
function M.quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

--- A new empty folder /tmp/ddplua-<tag>-spec.XXXXXX; returns its path.
function M.tmpdir(tag)
  local p = io.popen("mktemp -d /tmp/ddplua-" .. (tag or "x") .. "-spec.XXXXXX")
  local dir = p:read("*l")
  p:close()
  assert(dir and dir ~= "", "mktemp -d failed")
  return dir
end

--- Remove a folder and everything in it (nil is ignored).
function M.remove(dir)
  if dir then os.execute("rm -rf " .. M.quote(dir)) end
end

--- The whole content of a file.
function M.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

--- The whole content of a file, or nil when it cannot be opened (not there yet).
function M.read_if_exists(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

--- Write `text` to dir/name (replacing it); returns the path.
function M.write(dir, name, text)
  local path = dir .. "/" .. name
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
  return path
end

--- Run a shell command with stderr merged into stdout; returns (exit status, output).
-- LuaJIT's popen:close() does not report the exit status, so the shell prints it last.
function M.run(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"exit status $?\"")
  local out = p:read("*a")
  p:close()
  local status = tonumber(out:match("exit status (%d+)\n$"))
  return status, out:gsub("exit status %d+\n$", "")
end

--- Run Lua `code` in a fresh `build/ddplua` process (its own allocator and collector
-- state) from a file in a new folder /tmp/ddplua-<tag>-spec.XXXXXX; returns its stdout and
-- stderr together. Raises with that output when the process fails.
function M.run_fresh(tag, code)
  local dir = M.tmpdir(tag)
  local path = dir .. "/main.lua"
  local f = assert(io.open(path, "w"))
  f:write(code)
  f:close()
  local p = assert(io.popen("build/ddplua " .. M.quote(path) .. " 2>&1"))
  local out = p:read("*a")
  local ok = p:close()
  M.remove(dir)
  assert(ok, out)
  return out
end

return M
