-- configs/shakespeare_char_gpt.lua: nanoGPT's character-level Shakespeare model with its CPU
-- recipe (`train.py config/train_shakespeare_char.py --device=cpu --compile=False
-- --eval_iters=20 --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128
-- --max_iters=2000 --lr_decay_iters=2000 --dropout=0.0`), data-parallel:
--
--   ddplua --nproc_per_node=2 train.lua --config configs/shakespeare_char_gpt.lua [--max-iters N]
--
-- The fields are ddplua/utils/text_train.lua's. The token files are written on first use
-- from the corpus of `make data` (the 42 plays of the `shakespeare` 0.6 package; nanoGPT's
-- tinyshakespeare is another, smaller text).
return {
  name = "shakespeare_char_gpt",
  task = "text",
  dataset = "shakespeare_char",
  data_dir = "data/shakespeare_char",
  model = "gpt",
  model_opts = { n_layer = 4, n_head = 4, n_embd = 128, dropout = 0.0, bias = false },
  block_size = 64,
  batch_size = 12,                  -- global: 6 per rank on 2 ranks
  gradient_accumulation_steps = 1,
  max_iters = 2000,
  eval_interval = 250,
  eval_iters = 20,                  -- 20 * 12 fixed windows of each file
  grad_clip = 1.0,
  seed = 1337,
  optimizer = { name = "AdamW", lr = 1e-3, betas = { 0.9, 0.99 }, weight_decay = 0.1 },
  schedule = { warmup_iters = 100, lr_decay_iters = 2000, min_lr = 1e-4 },
}
