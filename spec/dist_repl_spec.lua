-- Specs for the distributed REPL, `ddplua --nproc_per_node=2 -i` (runtime/cli/dist_repl.c,
-- Note [distributed REPL]): every line on every rank in lockstep, identical outputs once as
-- "[all ranks]", collectives at the prompt, %rank K, an error on one rank that does not end
-- the session, Ctrl-C reaching every rank. Driven through a pipe and through a terminal.
local pty = require "pty"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

local function run(input)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(input)
  f:close()
  local p = assert(io.popen(("timeout 120 %s --nproc_per_node=2 --standalone -i < %s 2>&1; echo \"status=$?\"")
    :format(exe, path)))
  local out = p:read("*a")
  p:close()
  os.remove(path)
  return out
end

describe("distributed REPL", function()
  it("runs each line on both ranks, folds identical outputs, keeps going after an error", function()
    local out = run("x = dist.get_rank()\nx\ndist.all_reduce(dl.ones{2})\n%rank 1 x * 10\n" ..
      "if x == 1 then error('only on 1') end\nlocal y = 5\ny + 1\nfor i = 1, 2 do\nprint(i)\nend\n")
    assert.matches("[rank 0] 0\n[rank 1] 1\n", out, 1, true)
    assert.matches("[all ranks] tensor([2.0000, 2.0000])\n", out, 1, true)
    assert.matches("> [rank 1] 10\n", out, 1, true)
    assert.not_matches("%[rank 0%] 0\n?%[rank 0%] 0", out)
    assert.matches("[rank 1] ddplua: stdin:1: only on 1", out, 1, true)
    assert.not_matches("[rank 0] ddplua: stdin:1: only on 1", out, 1, true)
    assert.matches("[all ranks] 6\n", out, 1, true)
    assert.matches("[all ranks] 1\n[all ranks] 2\n", out, 1, true)
    assert.matches("status=0\n$", out)
  end)

  it("shows the plain REPL's doc comments for dist and the collectives the prompt wraps", function()
    -- The prompt's dist returns the tensor of an in-place collective; its wrappers used to
    -- hide the doc: "dist.all_reduce: defined at .../ranks.lua:16 (no doc comment)".
    local lines = "?dist.all_reduce\n?dist.broadcast\n?dist\n"
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write('dist = require "ddplua.distributed"\n' .. lines)
    f:close()
    local p = assert(io.popen(("%s < %s 2>&1"):format(exe, path)))
    local plain = p:read("*a")
    p:close()
    os.remove(path)
    local out = run(lines)
    assert.matches("status=0\n$", out)
    out = out:gsub("%[all ranks%] ", "")
    -- each answer of the plain REPL (the text between its prompts) appears whole
    local answers = 0
    for answer in plain:gmatch("> ([^>][^\n]*\n[^>]*)") do
      answers = answers + 1
      assert.matches(answer, out, 1, true)
    end
    assert.equal(3, answers, plain)
    assert.matches("dist.all_reduce(t, opts)    [lua/ddplua/distributed/distributed_c10d.lua:", out, 1, true)
    assert.not_matches("no doc comment", out, 1, true)
  end)

  it("completes dist's names on the prompt's dist", function()
    -- the prompt's dist used to index dist through a function, which completion cannot see
    local complete = require "ddplua.repl.complete"
    local d = require("ddplua.repl.ranks").prompt_dist(require "ddplua.distributed")
    local function lookup(name) return name == "dist" and d or nil end
    for _, case in ipairs { { "dist.get_ra", "dist.get_rank" }, { "dist.all_re", "dist.all_reduce" } } do
      assert.same({ case[2] }, complete.candidates(case[1], 1, #case[1], lookup, {}))
    end
  end)

  it("says so when %rank names no rank", function()
    local out = run("%rank 7 1\n")
    assert.matches("%rank: no rank 7 (ranks 0..1)", out, 1, true)
  end)

  -- Both nodes share the job's secret (the launcher refuses --nnodes > 1 without one). A
  -- process without it connects to the prompt first, claiming rank 1, and sends a bogus
  -- proof: it must get no code and must not take rank 1's place (Note [REPL handshake]).
  it("takes the --nnodes form: node 0 holds the prompt, node 1 only runs its ranks; a connection without the secret gets nothing #faults", function()
    local port = 30000 + math.random(0, 20000)
    local flags = ("--nnodes=2 --master_addr=127.0.0.1 --master_port=%d --nproc_per_node=1 -i"):format(port)
    local secret = "DDPLUA_STORE_SECRET=" .. string.rep("ab", 32)
    local log, got = os.tmpname(), os.tmpname()
    local nonce = string.rep("0", 64)
    local hello = ("1 %s"):format(nonce)
    local fake = string.rep("f", 64)
    os.execute(("timeout 60 bash -c 'for i in $(seq 600); do exec 3<>/dev/tcp/127.0.0.1/%d && break; " ..
      "sleep 0.05; done 2>/dev/null; printf \"H%%010d%%sP%%010d%%s\" %d \"%s\" 64 %s >&3; " ..
      "timeout 20 cat <&3 > %s' >/dev/null 2>&1 &"):format(port + 1, #hello, hello, fake, got))
    os.execute(("sleep 0.3; env %s timeout 120 %s --node_rank=1 %s > %s 2>&1 &"):format(secret, exe, flags, log))
    finally(function() os.remove(log); os.remove(got) end)
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write("dist.get_rank()\ndist.all_reduce(dl.ones{2})\n%rank 1 dist.get_world_size()\n")
    f:close()
    local p = assert(io.popen(("env %s timeout 120 %s --node_rank=0 %s < %s 2>&1; echo \"status=$?\"")
      :format(secret, exe, flags, path)))
    local out = p:read("*a")
    p:close()
    os.remove(path)
    assert.matches("[rank 0] 0\n[rank 1] 1\n", out, 1, true)
    assert.matches("[all ranks] tensor([2.0000, 2.0000])\n", out, 1, true)
    assert.matches("[rank 1] 2\n", out, 1, true)
    assert.matches("status=0\n$", out)
    os.execute("sleep 0.2")
    local f2 = io.open(got)
    local received = f2 and f2:read("*a") or ""
    if f2 then f2:close() end
    assert.not_matches("get_rank", received, 1, true)
    assert.not_matches("L%d%d%d%d%d%d%d%d%d%d", received)
  end)

  local it_tty = pty.available() and it or pending
  -- The distributed REPL on 2 ranks in a terminal, at its first prompt; closed after the spec.
  local function start_two_ranks()
    local term = pty.start(exe .. " --nproc_per_node=2 --standalone -i")
    finally(function() term:close() end)
    term:wait_for("Ctrl-D exits.", 120)
    term:wait_prompt(nil, 120)
    return term
  end
  it_tty("answers a collective once for all ranks and stops both ranks on Ctrl-C", function()
    local term = start_two_ranks()
    local out = term:enter("dist.all_reduce(dl.ones{2})", 60)
    assert.equal(1, select(2, out:gsub("%[all ranks%] tensor%(%[2%.0000, 2%.0000%]%)", "")))
    term:send("while true do end", "Enter")
    os.execute("sleep 0.5")
    term:send("C-c")
    term:wait_for("[all ranks] ddplua: interrupted!", 60)
    term:wait_prompt(nil, 60)
    assert.matches("[all ranks] 2", term:enter("1+1", 60), 1, true)
    term:send("C-d")
    local deadline = os.time() + 60
    while not term:dead() and os.time() < deadline do os.execute("sleep 0.1") end
    assert.is_true(term:dead())
  end)

  local function now()
    local p = io.popen("date +%s.%N")
    local t = tonumber(p:read("*l"))
    p:close()
    return t
  end

  -- The launcher's live view (Note [live view]) used to be drawn on the prompt's terminal
  -- while a collective waited, and its in-place redraws erased the prompt and the answers
  -- around them (under load "[all ranks] 2" came out as "ranks] 2").
  it_tty("keeps the launcher's live view off the prompt's terminal", function()
    local term = start_two_ranks()
    -- rank 0 waits 2 s in a barrier for rank 1: long enough for the view's 0.5 s ticks
    local out = term:enter("if dist.get_rank() == 1 then os.execute('sleep 2') end dist.barrier() print('after')", 60)
    assert.matches("[all ranks] after", out, 1, true)
    assert.matches("[all ranks] 6", term:enter("1 + 5", 60), 1, true)
    local screen = term:screen()
    assert.not_matches("rank %d: no step yet", screen)
    assert.not_matches("in barrier", screen, 1, true)
    term:send("C-d")
  end)

  -- Note [REPL group abort] (lua/ddplua/repl/ranks.lua): Ctrl-C used to leave a rank blocked
  -- in a collective for the group's 300 s timeout.
  it_tty("Ctrl-C ends a collective blocked on a peer within a second, and the next line makes the group again", function()
    local term = start_two_ranks()
    -- rank 0 waits in an all_reduce that rank 1 (busy in a loop) never calls
    local line = "if dist.get_rank() == 0 then dist.all_reduce(dl.ones{2}) else while true do end end"
    local before = #term:screen()
    term:send(line, "Enter")
    local _, e = term:wait_for(line .. "\n", 60, math.max(1, before - #line - 8))
    os.execute("sleep 1")
    local t0 = now()
    term:send("C-c")
    local screen = term:wait_prompt(nil, 60, e - 1)
    local took = now() - t0
    assert.is_true(took < 2.5, ("the prompt came back %.2f s after Ctrl-C:\n%s"):format(took, screen))
    -- rank 0's collective ended with the abort (or the interrupt that came with it)
    assert.matches("%[rank 0%] [^\n]*ddplua: [^\n]*", screen:sub(e))
    assert.matches("[rank 1] ddplua: interrupted!", screen:sub(e), 1, true)
    -- the next line makes the group again on both ranks, then runs on it
    local out = term:enter("dist.all_reduce(dl.ones{2})", 60)
    assert.matches("[all ranks] ddplua: the process group was aborted (interrupted (Ctrl-C in the distributed REPL) on rank 0 while all_reduce #", out, 1, true)
    assert.matches("[all ranks] tensor([2.0000, 2.0000])", out, 1, true)
    assert.matches("[all ranks] 2", term:enter("dist.get_world_size()", 60), 1, true)
    term:send("C-d")
    local deadline = os.time() + 60
    while not term:dead() and os.time() < deadline do os.execute("sleep 0.1") end
    assert.is_true(term:dead())
  end)
end)
