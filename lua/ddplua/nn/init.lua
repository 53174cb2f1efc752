--- ddplua.nn: neural-network layers, as PyTorch's torch.nn. `local nn = require "ddplua.nn"`.
--
--   nn.Module, nn.Parameter, nn.is_parameter, nn.is_module, nn.state_dict_keys  (module.lua)
--   containers: nn.Sequential, nn.ModuleList, nn.ModuleDict; nn.DataParallel (data_parallel.lua);
--     nn.CheckpointWrapper (checkpoint_wrapper.lua: activation checkpointing of a module)
--   layers: nn.Linear, nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d,
--     nn.BatchNorm1d, nn.BatchNorm2d, nn.SyncBatchNorm, nn.LayerNorm, nn.RMSNorm, nn.Dropout, nn.Flatten, nn.Embedding,
--     nn.Identity, nn.ReLU, nn.LeakyReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.SiLU,
--     nn.Softmax, nn.LogSoftmax
--   transformers: nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer
--   losses: nn.CrossEntropyLoss, nn.NLLLoss, nn.MSELoss
--   nn.init (weight_init.lua): kaiming_*, xavier_*, normal_, uniform_, constant_, ...
--   nn.functional (functional.lua): the stateless forms (F.relu, F.conv2d, ...)
--   nn.utils (utils.lua): clip_grad_norm_, clip_grad_value_, parameters_to_vector, ...
--
-- A model is a subclass of nn.Module (see module.lua for the idiom and the rules of
-- registration, naming and order). Positions (dims) count from 1 as everywhere in ddplua;
-- class labels and embedding ids are data and count from 0.
local module = require "ddplua.nn.module"

local M = {}

M.Module = module.Module
M.Parameter = module.Parameter
M.is_parameter = module.is_parameter
M.is_module = module.is_module
M.state_dict_keys = module.state_dict_keys

M.Sequential = require "ddplua.nn.sequential"
M.ModuleList = require "ddplua.nn.module_list"
M.ModuleDict = require "ddplua.nn.module_dict"

M.Linear = require "ddplua.nn.linear"
M.Conv2d = require "ddplua.nn.conv2d"
M.MaxPool2d = require "ddplua.nn.max_pool2d"
M.AvgPool2d = require "ddplua.nn.avg_pool2d"
M.AdaptiveAvgPool2d = require "ddplua.nn.adaptive_avg_pool2d"
local bn = require "ddplua.nn.batch_norm"
M.BatchNorm1d, M.BatchNorm2d = bn.BatchNorm1d, bn.BatchNorm2d
M.SyncBatchNorm = require "ddplua.nn.sync_batch_norm"
M.LayerNorm = require "ddplua.nn.layer_norm"
M.RMSNorm = require "ddplua.nn.rms_norm"
M.Dropout = require "ddplua.nn.dropout"
M.Flatten = require "ddplua.nn.flatten"
M.Embedding = require "ddplua.nn.embedding"
M.Identity = require "ddplua.nn.identity"
M.MultiheadAttention = require "ddplua.nn.multihead_attention"
M.TransformerEncoderLayer = require "ddplua.nn.transformer_encoder_layer"
M.TransformerDecoderLayer = require "ddplua.nn.transformer_decoder_layer"
M.DataParallel = require "ddplua.nn.data_parallel"
M.CheckpointWrapper = require "ddplua.nn.checkpoint_wrapper"

for name, cls in pairs(require "ddplua.nn.activation") do M[name] = cls end
for name, cls in pairs(require "ddplua.nn.loss") do M[name] = cls end

M.init = require "ddplua.nn.weight_init"
M.functional = require "ddplua.nn.functional"
M.utils = require "ddplua.nn.utils"

return M
