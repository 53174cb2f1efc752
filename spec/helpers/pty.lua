-- A terminal session for specs: runs a command in a detached tmux pane (a real
-- pseudo-terminal, as a user's), types into it and reads its screen. Waits poll the screen
-- for an expected text with a generous deadline instead of sleeping a fixed time, so a
-- loaded machine only makes a spec slower, not red.
--
--   local term = pty.start("./build/ddplua")
--   term:wait_for("> ")          -- the prompt
--   term:send("1+1", "Enter")    -- tmux key names: "Enter", "Tab", "C-c", "C-d"
--   term:wait_for("2\n> ")
--   term:close()
local M = {}
M.__index = M

local DEFAULT_TIMEOUT = 30 -- seconds

local function sh(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local counter = 0

--- Is tmux installed (specs pend without it)?
function M.available()
  return os.execute("command -v tmux >/dev/null 2>&1") == 0
end

--- pty.start(command[, env]) -> session: `command` (a shell command line) in a new 200x50
-- pane; `env` (a table) is added to its environment. HOME is a fresh folder (no history
-- of the user's is read or written).
function M.start(command, env)
  counter = counter + 1
  local self = setmetatable({}, M)
  self.socket = ("ddplua-spec-%d-%d"):format(math.random(1, 1e9), counter)
  self.home = os.tmpname()
  os.remove(self.home)
  os.execute("mkdir -p " .. sh(self.home))
  local vars = { "HOME=" .. sh(self.home), "TERM=xterm" }
  for k, v in pairs(env or {}) do vars[#vars + 1] = k .. "=" .. sh(v) end
  local line = "env " .. table.concat(vars, " ") .. " " .. command
  assert(os.execute(("tmux -L %s -f /dev/null new-session -d -x 200 -y 50 %s"):format(
    self.socket, sh(line))) == 0, "tmux could not start")
  os.execute(("tmux -L %s set-option -g remain-on-exit on >/dev/null 2>&1"):format(self.socket))
  return self
end

--- s:send(...): each argument a tmux key name ("Enter", "Tab", "C-c") or, when it holds a
-- space or is not a key name, literal text.
function M:send(...)
  for _, key in ipairs { ... } do
    local literal = not (key == "Enter" or key == "Tab" or key == "Escape" or key:match("^C%-%a$"))
    os.execute(("tmux -L %s send-keys -t 0 %s%s"):format(self.socket, literal and "-l " or "",
      sh(key)))
  end
end

--- s:screen() -> the pane's text (wrapped lines joined, trailing blanks cut).
function M:screen()
  local p = io.popen(("tmux -L %s capture-pane -p -J -S -1000 -t 0 2>/dev/null"):format(self.socket))
  local text = p:read("*a") or ""
  p:close()
  text = text:gsub("[ ]+\n", "\n"):gsub("\n+$", "\n")
  return text
end

--- s:wait_for(text[, timeout][, from]) -> screen: waits until the screen holds `text` (plain)
-- after the position `from` (default 1); raises with the screen on timeout. Returns the
-- screen and the position after the match.
function M:wait_for(text, timeout, from)
  local deadline = os.time() + (timeout or DEFAULT_TIMEOUT)
  local screen
  repeat
    screen = self:screen()
    local _, e = screen:find(text, from or 1, true)
    if e then return screen, e + 1 end
    os.execute("sleep 0.05")
  until os.time() > deadline
  error(("timed out waiting for %q; the screen:\n%s"):format(text, screen), 2)
end

--- s:wait_prompt([prompt][, timeout][, after]) -> screen: waits until the last line of the
-- screen is the prompt alone (default ">"; tmux drops the trailing space), i.e. the REPL is
-- ready; with `after`, that line must start after that position of the screen.
function M:wait_prompt(prompt, timeout, after)
  prompt = prompt or ">"
  local deadline = os.time() + (timeout or DEFAULT_TIMEOUT)
  local screen
  repeat
    screen = self:screen()
    local start, last = screen:match("()([^\n]*)\n?$")
    if (last == prompt or last == prompt .. " ") and start > (after or 0) then return screen end
    os.execute("sleep 0.05")
  until os.time() > deadline
  error(("timed out waiting for the prompt %q; the screen:\n%s"):format(prompt, screen), 2)
end

--- s:enter(line[, timeout]) -> output: types `line` and Enter, waits for its echo and for the
-- prompt after it, and returns what was printed in between.
function M:enter(line, timeout)
  local before = #self:screen()
  self:send(line, "Enter")
  local _, e = self:wait_for(line .. "\n", timeout, math.max(1, before - #line - 8))
  local screen = self:wait_prompt(nil, timeout, e - 1)
  return (screen:sub(e):gsub("[^\n]*\n?$", ""))
end

--- s:count(text) -> how many times the screen holds `text`.
function M:count(text)
  local n, pos, screen = 0, 1, self:screen()
  while true do
    local _, e = screen:find(text, pos, true)
    if not e then return n end
    n, pos = n + 1, e + 1
  end
end

--- s:wait_count(text, n[, timeout]): waits until the screen holds `text` at least n times.
function M:wait_count(text, n, timeout)
  local deadline = os.time() + (timeout or DEFAULT_TIMEOUT)
  repeat
    if self:count(text) >= n then return self:screen() end
    os.execute("sleep 0.05")
  until os.time() > deadline
  error(("timed out waiting for %d × %q; the screen:\n%s"):format(n, text, self:screen()), 2)
end

--- s:dead() -> is the command over (the pane shows it exited)?
function M:dead()
  local p = io.popen(("tmux -L %s display-message -p -t 0 '#{pane_dead}' 2>/dev/null"):format(self.socket))
  local out = p:read("*a") or ""
  p:close()
  return out:match("1") ~= nil
end

--- s:close(): ends the tmux server (and the command) and removes HOME.
function M:close()
  os.execute(("tmux -L %s kill-server >/dev/null 2>&1"):format(self.socket))
  os.execute("rm -rf " .. sh(self.home))
end

return M
