--- ddplua.utils.checkpoint: activation checkpointing under PyTorch's module name
-- (torch.utils.checkpoint): checkpoint(fn, ...) and checkpoint_sequential(functions,
-- segments, input), the same functions as ddplua.nn.checkpoint (where they live, below the
-- application layer, so nn.CheckpointWrapper can use them: Note [lua layers] in
-- tools/check_layers.lua). Also dl.utils.checkpoint.
return require "ddplua.nn.checkpoint"
