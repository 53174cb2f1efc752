-- Specs for train.lua on a language model (a config with task = "text",
-- ddplua/utils/text_train.lua) and `ddplua sample`, end to end in subprocesses, on a tiny
-- GPT and a small text written here: the loss falls, resuming equals an uninterrupted run,
-- DDP on 2 ranks equals one process over the same global batch, sample prints text.
local files = require "files"
local dl = require "ddplua"
local optim = require "ddplua.optim"
local checkpoint = require "ddplua.checkpoint"
local text = require "ddplua.data.text"
local torch_ref = require "torch_ref"
local exe = os.getenv("DDPLUA_EXE") or "./build/ddplua"

local function run(args)
  local status, out = files.run(exe .. " " .. args)
  return status == 0, out
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- A small text with structure to learn (about 24 kB, 27 distinct characters).
local function corpus()
  local words = { "the", "king", "shall", "speak", "now", "and", "we", "hear", "him", "well", "good", "lord" }
  local out, s = {}, 7
  for i = 1, 4000 do
    s = (s * 1103515245 + 12345) % 2147483648
    out[#out + 1] = words[s % #words + 1]
    out[#out + 1] = (i % 9 == 0) and ".\n" or " "
  end
  return table.concat(out)
end

local CONFIG = [[
return {
  name = "tiny_gpt", task = "text", data_dir = %q, model = "gpt",
  model_opts = { n_layer = 1, n_head = 2, n_embd = 16, dropout = 0.0, bias = false },
  block_size = 16, batch_size = 8, max_iters = 30, eval_interval = 10, eval_iters = 2, grad_clip = 1.0,
  seed = 1337,
  optimizer = { name = "AdamW", lr = 1e-2, betas = { 0.9, 0.99 }, weight_decay = 0.1 },
  schedule = { warmup_iters = 5, lr_decay_iters = 30, min_lr = 1e-3 },
}
]]

describe("train.lua with a text config", function()
  local dir, cfg
  setup(function()
    dir = files.tmpdir("text_train")
    write(dir .. "/input.txt", corpus())
    local ok, out = run(("prepare --out %s/data %s/input.txt"):format(dir, dir))
    assert(ok, out)
    cfg = dir .. "/tiny.lua"
    write(cfg, CONFIG:format(dir .. "/data"))
  end)
  teardown(function() files.remove(dir) end)

  it("lowers the train and val loss and writes the metrics and the sample files", function()
    local ok, out = run(("train.lua --config %s --threads 1 --out %s/a"):format(cfg, dir))
    assert.is_true(ok, out)
    local first = tonumber(out:match("step 0: train loss [%d.]+, val loss ([%d.]+)"))
    local last = tonumber(out:match("step 30: train loss [%d.]+, val loss ([%d.]+)"))
    assert.is_truthy(first and last, out)
    assert.is_true(last < 0.7 * first, ("val loss %.3f -> %.3f"):format(first, last))
    local csv = files.read(dir .. "/a/metrics.csv")
    assert.matches("^iter,lr,train_loss,val_loss", csv)
    assert.matches("\n30,", csv)
    for _, f in ipairs { "checkpoint.safetensors", "model.safetensors", "model_config.json", "meta.json" } do
      assert.is_truthy(io.open(dir .. "/a/" .. f), f)
    end
    -- the model file holds nanoGPT's names, lm_head and wte equal (Note [gpt weight tying])
    local sd = checkpoint.load(dir .. "/a/model.safetensors")
    assert.is_truthy(sd["transformer.h.0.attn.c_attn.weight"])
    assert.equal(0, (sd["lm_head.weight"] - sd["transformer.wte.weight"]):abs():max():item())
  end)

  it("resumes from a checkpoint to the same weights as an uninterrupted run", function()
    local common = ("train.lua --config %s --threads 1 "):format(cfg)
    assert.is_true((run(common .. "--out " .. dir .. "/full")))
    assert.is_true((run(common .. "--stop-after 14 --out " .. dir .. "/part")))
    local ok, out = run(common .. "--out " .. dir .. "/part --resume " .. dir .. "/part/checkpoint.safetensors")
    assert.is_true(ok, out)
    assert.matches("resumed from .* at iteration 14", out)
    assert.is_true(files.read(dir .. "/full/model.safetensors") == files.read(dir .. "/part/model.safetensors"),
      "the resumed run's model differs from the uninterrupted run's")
    local function row(path, it) return files.read(path):match("\n" .. it .. ",[^,]+,([^,]+,[^,]+)") end
    assert.equal(row(dir .. "/full/metrics.csv", 30), row(dir .. "/part/metrics.csv", 30))
  end)

  it("on 2 ranks takes the step of one process over both ranks' windows #dist", function()
    local ok, out = run(("--nproc_per_node=2 --standalone train.lua --config %s --max-iters 1 --out %s/ddp"):format(cfg,
      dir))
    assert.is_true(ok, out)
    assert.matches("%[rank 0%]: training .* batch 8 x 16 tokens %(4 per process%)", out)
    -- one process: the same model, optimizer and schedule, the global batch made of rank 0's
    -- then rank 1's windows (each rank's stream, text.RandomWindows)
    dl.manual_seed(1337)
    local model = require("models.gpt")(checkpoint.json_decode(files.read(dir .. "/ddp/model_config.json")))
    local opt = model:configure_optimizers(0.1, 1e-2, { 0.9, 0.99 })
    optim.WarmupCosineLR(opt, { warmup_iters = 5, lr_decay_iters = 30, min_lr = 1e-3 })
    local V = text.load_tokenizer(dir .. "/data").vocab_size
    local train = text.TokenFile(dir .. "/data/train.bin", { vocab_size = V })
    local xs, ys = {}, {}
    for r = 0, 1 do
      local w = text.RandomWindows(train, { block_size = 16, batch_size = 4, seed = 1337, rank = r, world_size = 2 })
      xs[#xs + 1], ys[#ys + 1] = w:next()
    end
    local _, loss = model(dl.cat(xs, 1), dl.cat(ys, 1))
    loss:backward()
    optim.clip_grad_norm_(model:parameters(), 1.0)
    opt:step()
    local got = checkpoint.load(dir .. "/ddp/model.safetensors")
    for name, t in pairs(model:state_dict()) do
      assert.is_true(torch_ref.rel_diff(got[name], t) < 1e-5, name)
    end
    -- and the step changed the weights
    dl.manual_seed(1337)
    local init = require("models.gpt")(checkpoint.json_decode(files.read(dir .. "/ddp/model_config.json")))
    assert.is_true(torch_ref.rel_diff(got["transformer.h.0.mlp.c_fc.weight"],
      init:state_dict()["transformer.h.0.mlp.c_fc.weight"]) > 1e-4)
  end)

  it("trains under bf16 autocast with --amp bf16, close to f32 after a few steps", function()
    local common = ("train.lua --config %s --threads 1 --max-iters 5 --eval-interval 5 "):format(cfg)
    local ok, out = run(common .. "--amp bf16 --out " .. dir .. "/bf16")
    assert.is_true(ok, out)
    assert.matches("amp bf16", out)
    local _, ref = run(common .. "--out " .. dir .. "/f32")
    local a = tonumber(out:match("step 5: train loss [%d.]+, val loss ([%d.]+)"))
    local b = tonumber(ref:match("step 5: train loss [%d.]+, val loss ([%d.]+)"))
    assert.is_truthy(a and b, out .. ref)
    assert.near(b, a, 0.05)
  end)

  it("refuses a global batch that does not divide over the ranks and micro-steps, and a bad max_iters", function()
    local ok, out = run(("train.lua --config %s --gradient-accumulation-steps 3 --out %s/bad"):format(cfg, dir))
    assert.is_false(ok)
    assert.matches("the batch size 8 %(global%) does not divide over 1 processes x 3 accumulation steps", out)
    ok, out = run(("train.lua --config %s --max-iters 2.5 --out %s/bad"):format(cfg, dir))
    assert.is_false(ok)
    assert.matches("the config's max_iters must be a non%-negative integer, got 2.5", out)
  end)

  it("accumulates gradients: 2 micro-steps of 4 windows take the step of one batch of 8", function()
    -- the stream hands out the same 8 windows either way (4 + 4 consecutive draws)
    local common = ("train.lua --config %s --threads 1 --max-iters 3 "):format(cfg)
    local ok, out = run(common .. "--gradient-accumulation-steps 2 --out " .. dir .. "/acc")
    assert.is_true(ok, out)
    assert.matches("batch 8 x 16 tokens %(4 per process x 2 micro%-steps%)", out)
    assert.is_true((run(common .. "--out " .. dir .. "/one")))
    local a, b = checkpoint.load(dir .. "/acc/model.safetensors"), checkpoint.load(dir .. "/one/model.safetensors")
    for name, t in pairs(b) do assert.is_true(torch_ref.rel_diff(a[name], t) < 1e-5, name) end
  end)
end)

describe("ddplua sample", function()
  it("prints text from a trained checkpoint, starting with the prompt", function()
    local dir = files.tmpdir("sample")
    write(dir .. "/input.txt", corpus())
    assert(run(("prepare --out %s/data %s/input.txt"):format(dir, dir)))
    write(dir .. "/tiny.lua", CONFIG:format(dir .. "/data"))
    local ok, out = run(("train.lua --config %s/tiny.lua --threads 1 --max-iters 20 --out %s/run"):format(dir, dir))
    assert.is_true(ok, out)
    local ok2, sample = run(("sample --checkpoint %s/run --start 'the king' --max-new-tokens 40 --seed 3"):format(dir))
    assert.is_true(ok2, sample)
    local body = sample:match("^the king([^\n]*)")
    assert.is_truthy(body, sample)
    -- 40 new characters over the lines they span (the model has learnt some words)
    local n = #sample:gsub("\n%-+\n?$", "") - #"the king"
    assert.is_true(n >= 40, sample)
    local _, again = run(("sample --checkpoint %s/run --start 'the king' --max-new-tokens 40 --seed 3"):format(dir))
    assert.equal(sample, again) -- the seed fixes the sample
    local bad, msg = run(("sample --checkpoint %s/missing"):format(dir))
    assert.is_false(bad)
    assert.matches("ddplua sample: .*missing", msg)
    files.remove(dir)
  end)
end)
