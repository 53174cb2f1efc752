-- configs/fashion_mnist_mlp.lua: the MLP (784-256-128-10) on Fashion-MNIST.
return {
  name = "fashion_mnist_mlp",
  model = "mlp",
  dataset = "fashion_mnist",
  batch_size = 64,
  epochs = 3,
  seed = 0,
  optimizer = { name = "SGD", lr = 0.05, momentum = 0.9 },
  schedule = nil,
}
