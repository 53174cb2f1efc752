--- ddplua.repl: the Lua side of the `ddplua` prompt (runtime/cli/repl.c reads the lines, runs
-- what this module compiles under Ctrl-C handling, and prints the results).
--
-- What can be typed:
--   expression or statements   run; an expression's values are printed, and so are those of
--                              a trailing expression after statements (`x = 2; x * 3`)
--   local z = 5                locals stay visible on the next lines (Note [persistent locals])
--   ?name   ?dl.zeros   ?      the doc comment of what `name` evaluates to; `?` alone lists
--                              the namespaces (also help(obj) as a function)
--   :time expr                 median time of expr over several runs (dl.timeit)
local chunk = require "ddplua.repl.chunk"
local help = require "ddplua.repl.help"
local complete = require "ddplua.repl.complete"
local timeit = require "ddplua.timeit"

local M = {}
M.__index = M

--- repl.new() -> a session (one per prompt): its saved locals, its completer.
function M.new()
  return setmetatable({ chunk = chunk.new() }, M)
end

-- Pack a compiled function and its arguments as compile returns them.
local function run(fn, args)
  return "run", fn, unpack(args, 1, args.n)
end

--- s:evaluator(expr) -> a function that evaluates the expression `expr` with the session's
-- locals and returns its first value, or nil and the syntax error.
function M:evaluator(expr)
  local fn, args = self.chunk:compile(expr)
  if not fn then return nil, args == "more" and "incomplete expression" or args end
  return function() return (fn(unpack(args, 1, args.n))) end
end

--- s:compile(src) -> "run", fn, args... | "more" | "error", message.
-- "run": call fn(args...) (under Ctrl-C handling); print the values it returns.
-- "more": the input continues on the next line. "error": a syntax error to report.
function M:compile(src)
  local what = src:match("^%s*%?%s*(.-)%s*$")
  if what then
    if what == "" then return "run", function() io.write(help.namespaces()) end end
    if what:match("^ddp_[%w_]+$") then -- a C function of the public header
      return "run", function() io.write(help.describe(nil, what, what)) end
    end
    local value, err = self:evaluator(what)
    if not value then return "error", err end
    return "run", function() io.write(help.describe(value(), what, what)) end
  end
  local expr = src:match("^%s*:time%s+(.-)%s*$")
  if expr then
    local fn, err = self:evaluator("function() return " .. expr .. " end")
    if not fn then
      fn, err = self:evaluator("function() " .. expr .. "\nend")
    end
    if not fn then return "error", err end
    return "run", function()
      local _, report = timeit.timeit(fn())
      print(report)
    end
  end
  local fn, args = self.chunk:compile(src)
  if fn then return run(fn, args) end
  if args == "more" then return "more" end
  return "error", args
end

--- s:complete(line, start, stop) -> list of words: what Tab may put in place of
-- line:sub(start, stop) (ddplua.repl.complete).
function M:complete(line, start, stop)
  return complete.candidates(line, start, stop, function(name)
    local found, value = self.chunk:lookup(name)
    if found then return value end
    return rawget(_G, name)
  end, self.chunk.names)
end

--- help(obj): print the doc comment of a function, class or module (as `?obj` does).
function M.help(obj)
  io.write(help.describe(obj))
end

return M
