--- ddplua.train_state: a whole training state in one safetensors checkpoint, and back.
--
-- state = {
--   model = nn.Module,            -- its state_dict goes in as tensors "model.<name>"
--   optimizer = opt,              -- opt:state_dict()  (tensors "optimizer.<path>")
--   scheduler = sched,            -- sched:state_dict() (optional)
--   scaler = amp.GradScaler,      -- scaler:state_dict() (optional: scale, growth count)
--   generators = {name = dl.Generator, ...},  -- their (seed, offset) states
--   progress = {epoch = n, step = n, ...},    -- plain values
-- }
--
-- Model tensors keep their plain state_dict names under "model." so a PyTorch user can
-- read them (safetensors.torch.load_file). Everything else that is not a tensor goes into
-- the header's __metadata__ as JSON: a nested table is written as {"$k": [[key, value], ...]}
-- so numeric keys (PyTorch's 0-based parameter ids) and string keys both survive, and a
-- tensor inside such a table as {"$t": "<tensor name>"}.
local dl = require "ddplua.functions"
local lib = require "ddplua.lib"
local checkpoint = require "ddplua.checkpoint"

local M = {}

-- Encode a Lua value into a JSON-safe tree, collecting tensors into `tensors` under
-- `prefix.<path>`.
local function encode(v, prefix, tensors)
  if dl.is_tensor(v) then
    tensors[prefix] = v:contiguous()
    return { ["$t"] = prefix }
  end
  local tv = type(v)
  if tv == "number" then
    if v ~= v or v == math.huge or v == -math.huge then return { ["$n"] = tostring(v) } end
    return v
  elseif tv == "string" or tv == "boolean" then
    return v
  elseif tv == "table" then
    local keys = {}
    for k in pairs(v) do
      if type(k) ~= "number" and type(k) ~= "string" then
        lib.raise("train_state: cannot store a table key of type " .. type(k) .. " under " .. prefix)
      end
      keys[#keys + 1] = k
    end
    table.sort(keys, function(a, b)
      if type(a) == type(b) then return a < b end
      return type(a) == "number"
    end)
    local pairs_out = {}
    for _, k in ipairs(keys) do
      pairs_out[#pairs_out + 1] = { k, encode(v[k], prefix .. "." .. tostring(k), tensors) }
    end
    return { ["$k"] = pairs_out }
  elseif v == nil then
    return nil
  end
  lib.raise("train_state: cannot store a value of type " .. tv .. " under " .. prefix)
end

local function decode(v, tensors)
  if type(v) ~= "table" then return v end
  if v["$t"] then
    local t = tensors[v["$t"]]
    if not t then lib.raise("train_state: the checkpoint lacks tensor " .. v["$t"]) end
    return t
  end
  if v["$n"] then return tonumber(v["$n"]) or (v["$n"] == "nan" and 0 / 0) end
  local out = {}
  for _, kv in ipairs(v["$k"] or {}) do out[kv[1]] = decode(kv[2], tensors) end
  return out
end

--- train_state.save(path, state): write the state atomically (see checkpoint.save).
function M.save(path, state)
  local tensors, meta = {}, {}
  if state.model then
    for name, t in pairs(state.model:state_dict()) do tensors["model." .. name] = t:contiguous() end
  end
  if state.optimizer then meta.optimizer = encode(state.optimizer:state_dict(), "optimizer", tensors) end
  if state.scheduler then meta.scheduler = encode(state.scheduler:state_dict(), "scheduler", tensors) end
  if state.scaler then meta.scaler = encode(state.scaler:state_dict(), "scaler", tensors) end
  local gens = {}
  for name, g in pairs(state.generators or {}) do gens[name] = g:get_state() end
  meta.generators = encode(gens, "generators", tensors)
  meta.progress = encode(state.progress or {}, "progress", tensors)
  meta.format = "ddplua.train_state/1"
  checkpoint.save(path, tensors, meta)
end

--- train_state.load(path, state): restore into the objects of `state` (same fields as
-- save: model, optimizer, scheduler, generators) and return the saved progress table.
-- Raises naming the file and what differs (missing or mismatched model tensors; optimizer
-- state that its load_state_dict refuses: bad options, buffers of another shape, a step
-- that is not a count; a scaler state of the wrong types).
function M.load(path, state)
  local tensors, meta = checkpoint.load(path)
  if meta.format ~= "ddplua.train_state/1" then
    lib.raise(path .. ": not a ddplua training checkpoint (format " .. tostring(meta.format) .. ")")
  end
  if state.model then
    local sd = {}
    for name, t in pairs(tensors) do
      local plain = name:match("^model%.(.*)$")
      if plain then sd[plain] = t end
    end
    local ok, err = pcall(state.model.load_state_dict, state.model, sd, { strict = true })
    if not ok then lib.raise(path .. ": " .. tostring(err):gsub("^[^:\n]+:%d+: ", "", 1)) end
  end
  if state.optimizer and meta.optimizer then -- validated whole here, not at opt:step()
    local ok, err = pcall(state.optimizer.load_state_dict, state.optimizer, decode(meta.optimizer, tensors))
    if not ok then lib.raise(path .. ": " .. tostring(err):gsub("^[^:\n]+:%d+: ", "", 1)) end
  end
  if state.scheduler and meta.scheduler then state.scheduler:load_state_dict(decode(meta.scheduler, tensors)) end
  -- a scaler's state is carried when both sides have one (a checkpoint of a run without amp
  -- leaves the new scaler at its initial scale)
  local saved_scaler = meta.scaler and decode(meta.scaler, tensors)
  if state.scaler and saved_scaler and next(saved_scaler) ~= nil then state.scaler:load_state_dict(saved_scaler) end
  local gens = decode(meta.generators, tensors) or {}
  for name, g in pairs(state.generators or {}) do
    if gens[name] then g:set_state(gens[name]) end
  end
  return decode(meta.progress, tensors) or {}
end

--- train_state.save_model(path, model): the model's state_dict alone, with plain names
-- (what `ddplua verify` compares and PyTorch's load_state_dict reads).
function M.save_model(path, model)
  local tensors = {}
  for name, t in pairs(model:state_dict()) do tensors[name] = t:contiguous() end
  checkpoint.save(path, tensors, { format = "ddplua.model/1" })
end

return M
