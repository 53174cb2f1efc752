--- ddplua.repl.chunk: compiles what is typed at the REPL prompt, keeping `local`s alive from
-- one input to the next.
--
-- Note [persistent locals]
-- Lua scopes a `local` to its chunk, and each input at the prompt is a chunk of its own, so
-- `local z = 5` followed by `z` would read the global z (nil). The compiler keeps the
-- prompt's locals in an ordered list and puts them back in front of every input:
--
--   local __ddplua_repl_capture, z, y = ...; <input>
--   __ddplua_repl_capture()
--
-- The chunk is called with the capture function and the saved values. Because the
-- declaration shares line 1 with the input, error positions ("stdin:1:") stay the user's.
-- The capture call at the end reads the chunk's active locals with debug.getlocal (only
-- those still in scope at the top level: a `local` inside a `do ... end` block is gone, as
-- it should be) and saves them, so an assignment to a saved local sticks too. An input that
-- ends with `return` cannot take the trailing call: it runs without saving. A closure
-- keeps the value of a local as it was on its line (each line has its own copy), which is
-- the one visible difference from a script. LuaJIT allows 200 locals per function: beyond
-- MAX_LOCALS the oldest saved local is forgotten.
--
-- Note [interruptible input]
-- Ctrl-C is turned into an error by a debug hook (runtime/cli/host.c). LuaJIT runs hooks
-- in the interpreter only: a JIT-compiled loop such as `while true do end` would never see
-- it. Code typed at the prompt (and the functions it defines) is therefore kept out of the
-- JIT with jit.off(fn, true); the library it calls stays compiled and returns to the
-- interpreted caller, where the hook fires.
local M = {}
M.__index = M

local CAPTURE = "__ddplua_repl_capture"
local MAX_LOCALS = 180
local CHUNK_NAME = "=stdin"

--- chunk.new() -> a compiler with no saved locals.
function M.new()
  return setmetatable({ names = {}, values = {} }, M)
end

--- c:save(name, value): remember a prompt-level local (the latest declaration of a name wins
-- and moves to the end of the list).
function M:save(name, value)
  local names, values = self.names, self.values
  for i = #names, 1, -1 do
    if names[i] == name then
      table.remove(names, i)
      table.remove(values, i)
    end
  end
  names[#names + 1] = name
  values[#names] = value
  if #names > MAX_LOCALS then
    table.remove(names, 1)
    table.remove(values, 1)
  end
end

--- c:lookup(name) -> found, value: a saved local's value (completion and help read it).
function M:lookup(name)
  for i = #self.names, 1, -1 do
    if self.names[i] == name then return true, self.values[i] end
  end
  return false
end

--- c:prelude() -> the declaration put in front of every input (Note [persistent locals]).
function M:prelude()
  local list = { CAPTURE }
  for _, n in ipairs(self.names) do list[#list + 1] = n end
  return "local " .. table.concat(list, ", ") .. " = ...; "
end

--- c:capturer() -> a capture function for the chunk about to run: it saves the locals of
-- its caller (the chunk).
function M:capturer()
  return function()
    local i = 1
    while true do
      local name, value = debug.getlocal(2, i)
      if not name then break end
      if name ~= CAPTURE and not name:find("^%(") then self:save(name, value) end
      i = i + 1
    end
  end
end

-- Is a load error the parser meeting the end of the input early (more lines may help)?
local function incomplete(err)
  return err and err:sub(-7) == "'<eof>'"
end

-- An expression list as the arguments of an identity function: every value (nil included)
-- is kept, and LuaJIT makes no tail call of it (a tail call would drop the chunk's frame, and
-- `error("boom")` its "stdin:1:" position). The newline keeps a trailing comment from eating
-- the ')'.
local function returning(expr)
  if expr:sub(1, 1) == "=" then expr = expr:sub(2) end
  return "return (function(...) return ... end)(" .. expr .. "\n)"
end

-- The positions (from the end) where a trailing expression may start: after a ';' or a
-- newline.
local function split_points(src)
  local points = {}
  for i = #src, 1, -1 do
    local ch = src:sub(i, i)
    if ch == ";" or ch == "\n" then points[#points + 1] = i end
  end
  return points
end

--- c:compile(src) -> fn, args | nil, "more" | nil, message.
-- fn(unpack(args, 1, args.n)) runs the input and returns what should be printed: the values of
-- an expression, of a statement list's last expression (`x = 2; x * 3` gives 6), or nothing.
-- "more": the input is incomplete (a statement continues on the next line). A message: the
-- syntax error, as load reports it.
function M:compile(src)
  local prelude = self:prelude()
  local args = { n = #self.names + 1, self:capturer() }
  for i = 1, #self.names do args[i + 1] = self.values[i] end
  local function done(fn)
    if jit then jit.off(fn, true) end -- Note [interruptible input]
    return fn, args
  end
  local fn = loadstring(prelude .. returning(src), CHUNK_NAME)
  if fn then return done(fn) end
  local err
  fn, err = loadstring(prelude .. src .. "\n" .. CAPTURE .. "()", CHUNK_NAME)
  if fn then return done(fn) end
  if incomplete(err) then return nil, "more" end
  -- statements, then a trailing expression whose values are printed
  for _, p in ipairs(split_points(src)) do
    local head, tail = src:sub(1, p), src:sub(p + 1)
    if tail:find("%S") then
      fn = loadstring(prelude .. head .. "\n" .. CAPTURE .. "() " .. returning(tail), CHUNK_NAME)
      if fn then return done(fn) end
    end
  end
  -- an input that ends in `return`, which takes no statement after it
  local plain
  plain, err = loadstring(prelude .. src, CHUNK_NAME)
  if plain then return done(plain) end
  return nil, err
end

return M
