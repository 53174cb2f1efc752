--- ddplua.tools.sample: `ddplua sample --checkpoint DIR [options]` prints text sampled from
-- a language model that train.lua trained (a config with task = "text"), nanoGPT's
-- sample.py.
--
--   ddplua sample --checkpoint runs/shakespeare_char_gpt --start "ROMEO:"
--
-- DIR holds what the training wrote: model.safetensors (the weights, nanoGPT's names),
-- model_config.json (the model's configuration) and meta.json (the tokenizer).
-- Options: --start TEXT (the prompt; default "\n"), --num-samples N (1), --max-new-tokens N
-- (500), --temperature X (0.8), --top-k K (200; 0 = all), --seed N (1337), --model NAME (the
-- module under models/, default gpt). Each sample is printed whole (prompt included),
-- samples separated by a line of dashes. Exit status: 0; 2 on a usage error or an unusable
-- DIR (missing or bad file, a prompt with characters outside the vocabulary), with the
-- message on stderr.
local dl = require "ddplua.functions"
local checkpoint = require "ddplua.checkpoint"
local text = require "ddplua.data.text"

local M = {}

local USAGE = "usage: ddplua sample --checkpoint DIR [--start TEXT] [--num-samples N] [--max-new-tokens N] "
  .. "[--temperature X] [--top-k K] [--seed N] [--model NAME]"

local function fail(msg)
  io.stderr:write("ddplua sample: ", msg, "\n", USAGE, "\n")
  return 2
end

local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then error(err, 0) end
  local s = f:read("*a")
  f:close()
  return s
end

-- The model class models/<name>.lua: from ./ first, else beside this project's lua/ folder.
-- Loaded by path, not required: library code does not require the user's modules (Note
-- [lua layers] in tools/check_layers.lua), and a models/ file is the user's.
local function model_class(name)
  if not name:match("^[%w_]+$") then error("--model must be a module name under models/, got " .. name, 0) end
  local chunk, err = loadfile("models/" .. name .. ".lua")
  if not chunk then
    local here = debug.getinfo(1, "S").source:match("^@(.*)/lua/ddplua/tools/[^/]+$")
    if here then chunk, err = loadfile(here .. "/models/" .. name .. ".lua") end
  end
  if not chunk then error(err, 0) end
  return chunk()
end

--- main(args) -> exit status (see the top).
function M.main(args)
  local o = { start = "\n", num_samples = 1, max_new_tokens = 500, temperature = 0.8, top_k = 200, seed = 1337,
    model = "gpt" }
  local NUMBER = { num_samples = true, max_new_tokens = true, temperature = true, top_k = true, seed = true }
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "-h" or a == "--help" then print(USAGE) return 0 end
    local key = a:match("^%-%-([%w-]+)$")
    key = key and key:gsub("-", "_")
    if not key or (o[key] == nil and key ~= "checkpoint") then return fail("unknown option " .. a) end
    if args[i + 1] == nil then return fail(a .. " needs a value") end
    local v = args[i + 1]
    if NUMBER[key] then
      v = tonumber(v)
      if not v then return fail(a .. " needs a number, got " .. args[i + 1]) end
    end
    o[key] = v
    i = i + 2
  end
  if not o.checkpoint then return fail("--checkpoint DIR is required") end
  local ok, err = pcall(function()
    local dir = o.checkpoint
    local cfg = checkpoint.json_decode(read_file(dir .. "/model_config.json"))
    local tok = text.load_tokenizer(dir)
    local model = model_class(o.model)(cfg)
    model:load_state_dict(checkpoint.load(dir .. "/model.safetensors"))
    model:eval()
    local g = dl.Generator(o.seed)
    local prompt = tok:encode(o.start):view(1, -1)
    for s = 1, o.num_samples do
      local out = model:generate(prompt, o.max_new_tokens,
        { temperature = o.temperature, top_k = o.top_k > 0 and o.top_k or nil, generator = g })
      io.write(tok:decode(out:select(1, 1)), "\n")
      if s < o.num_samples or o.num_samples > 1 then io.write("---------------\n") end
    end
  end)
  if not ok then
    io.stderr:write("ddplua sample: ", tostring(err), "\n")
    return 2
  end
  return 0
end

return M
