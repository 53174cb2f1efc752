--- ddplua.utils.argparse: command-line options for scripts, a small subset of Python's
-- argparse (long options only).
--
--   local argparse = require "ddplua.utils.argparse"
--   local parser = argparse.ArgumentParser { prog = "train.lua", usage = "ddplua train.lua [options]" }
--   parser:add_argument("--epochs", { type = "number", metavar = "N", help = "number of epochs" })
--   parser:add_argument("--quiet", { action = "store_true", help = "no progress output" })
--   local opts = parser:parse_args(arg)     -- {epochs = 3, quiet = true}
--
-- Options are written `--name value` or `--name=value`; a flag (`store_true`) takes no
-- value. The destination key is the name without its dashes, with `-` turned into `_`
-- (`--batch-size` -> `batch_size`), as in Python; a flag may be spelt with `_` as well
-- (`--world_size`, as the seeds' PyTorch scripts write theirs). Options not given are absent (nil) from
-- the result, so callers can tell "not given" from a value and let a config decide.
-- `--help` / `-h` prints the usage to stdout and exits with status 0.
--
-- Errors (raised with error(msg, 0), so the message is shown as written, without a Lua
-- position): "<prog>: unknown option '--x'" and "<prog>: --x needs a value", both followed by
-- the usage; "<prog>: --x expects a number, got 'y'".
local options = require "ddplua.options"

local M = {}

local Parser = {}
Parser.__index = Parser

local KNOWN = options.known { "prog", "usage" }

--- argparse.ArgumentParser{prog = name, usage = text} -> a parser. `prog` prefixes error
-- messages (default "ddplua"); `usage` is the first usage line after "usage: " (default
-- "<prog> [options]").
function M.ArgumentParser(opts)
  opts = options.check("ArgumentParser", opts, KNOWN)
  local prog = opts.prog or "ddplua"
  return setmetatable({ prog = prog, usage_line = opts.usage or (prog .. " [options]"), args = {}, by_flag = {} },
    Parser)
end

--- parser:add_argument(flag, {type = "string"|"number", action = "store"|"store_true",
-- metavar = text, help = text, dest = key}): declare the long option `flag` ("--name").
-- Help text may span lines ("\n"); they are indented under the first. Returns the parser.
function Parser:add_argument(flag, spec)
  spec = spec or {}
  if type(flag) ~= "string" or not flag:match("^%-%-[%w][%w%-_]*$") then
    error(("add_argument: flag must look like '--name', got %s"):format(tostring(flag)), 2)
  end
  local action = spec.action or "store"
  if action ~= "store" and action ~= "store_true" then
    error(("add_argument: unknown action '%s' (store, store_true)"):format(tostring(action)), 2)
  end
  local a = {
    flag = flag, action = action, type = spec.type or "string", help = spec.help or "",
    metavar = spec.metavar, dest = spec.dest or flag:sub(3):gsub("%-", "_"),
  }
  self.args[#self.args + 1] = a
  self.by_flag[flag] = a
  return self
end

--- parser:format_help() -> the usage text: "usage: <usage>" then one line per option,
-- "  --flag METAVAR" padded to 19 columns, then its help.
function Parser:format_help()
  local lines = { "usage: " .. self.usage_line }
  for _, a in ipairs(self.args) do
    local head = a.flag .. (a.action == "store" and " " .. (a.metavar or a.dest:upper()) or "")
    local help = a.help:gsub("\n", "\n" .. string.rep(" ", 21))
    lines[#lines + 1] = ("  %-18s %s"):format(head, help)
  end
  return table.concat(lines, "\n") .. "\n"
end

local function fail(self, msg, with_usage)
  error(self.prog .. ": " .. msg .. (with_usage and "\n" .. self:format_help() or ""), 0)
end

--- parser:parse_args(argv) -> a table of the options given, keyed by dest (see the top).
-- argv is a Lua list of strings (the script's `arg`). Raises on an unknown option, a
-- missing value or a non-numeric value for a number option; exits 0 after printing the
-- usage on --help / -h.
function Parser:parse_args(argv)
  local out = {}
  local i = 1
  while i <= #argv do
    local word = argv[i]
    local key, value = word:match("^(%-%-[%w%-_]+)=(.*)$")
    key = key or word
    if key == "--help" or key == "-h" then
      io.write(self:format_help())
      os.exit(0)
    end
    local a = self.by_flag[key]
    if not a then fail(self, "unknown option '" .. word .. "'", true) end
    if a.action == "store_true" then
      out[a.dest] = true
    else
      if not value then
        i = i + 1
        value = argv[i]
      end
      if value == nil then fail(self, key .. " needs a value", true) end
      if a.type == "number" then
        local n = tonumber(value)
        if not n then fail(self, key .. " expects a number, got '" .. value .. "'") end
        value = n
      end
      out[a.dest] = value
    end
    i = i + 1
  end
  return out
end

return M
