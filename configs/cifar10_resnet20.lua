-- configs/cifar10_resnet20.lua: ResNet-20 on CIFAR-10 (binary batches from the path given
-- by --data-root or $CIFAR10_ROOT; not shipped by Debian). Schedule as He et al. scaled to
-- fewer epochs: SGD 0.1, momentum 0.9, weight decay 1e-4, cosine annealing.
return {
  name = "cifar10_resnet20",
  model = "resnet",
  model_opts = { depth = 20, num_classes = 10, in_channels = 3 },
  dataset = "cifar10",
  data_root = os.getenv("CIFAR10_ROOT"),
  augment = true,                -- RandomCrop(32, padding 4) + RandomHorizontalFlip
  batch_size = 128,
  epochs = 30,
  seed = 0,
  optimizer = { name = "SGD", lr = 0.1, momentum = 0.9, weight_decay = 1e-4 },
  schedule = { name = "CosineAnnealingLR" }, -- T_max = epochs * batches per epoch
}
