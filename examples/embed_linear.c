/* examples/embed_linear.c: the runtime embedded in a C program, no Lua anywhere.
 *
 * Fits y = X w_true + b_true (X (256, 8) from the Philox generator, a little noise) with a
 * linear layer, mean squared error and plain SGD written with the runtime's own ops:
 * forward (ddp_linear, ddp_mse_loss), ddp_backward, then w -= lr * w.grad under no_grad.
 * Prints the first and last loss and exits 0 when the last is below 1e-3 of the first.
 *
 *   cc -Iruntime/include examples/embed_linear.c -Lbuild -lddplua -Wl,-rpath,$PWD/build
 */
#include <stdio.h>

#include "ddplua.h"

/* Print the runtime's message and leave main with status 1. */
#define CHECK(call)                                                              \
  do {                                                                           \
    if ((call) != DDP_OK) {                                                      \
      fprintf(stderr, "embed_linear: %s failed: %s\n", #call, ddp_last_error()); \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

enum { N = 256, D = 8, STEPS = 200 };

int main(void) {
  ddp_generator *gen;
  CHECK(ddp_generator_new(&gen, 1234));

  /* data: X (N, D), w_true (1, D), b_true (1), y (N, 1) = X w_trueᵀ + b_true + noise */
  int64_t x_shape[2] = {N, D}, w_shape[2] = {1, D}, b_shape[1] = {1}, n_shape[2] = {N, 1};
  ddp_tensor *x, *w_true, *b_true, *noise, *y_clean, *y;
  CHECK(ddp_tensor_empty(&x, 2, x_shape, DDP_F32, DDP_DEVICE_CPU));
  CHECK(ddp_tensor_empty(&w_true, 2, w_shape, DDP_F32, DDP_DEVICE_CPU));
  CHECK(ddp_tensor_empty(&b_true, 1, b_shape, DDP_F32, DDP_DEVICE_CPU));
  CHECK(ddp_tensor_empty(&noise, 2, n_shape, DDP_F32, DDP_DEVICE_CPU));
  CHECK(ddp_normal_(x, 0, 1, gen));
  CHECK(ddp_normal_(w_true, 0, 1, gen));
  CHECK(ddp_fill_(b_true, 0.5));
  CHECK(ddp_normal_(noise, 0, 0.01, gen));
  CHECK(ddp_linear(&y_clean, x, w_true, b_true));
  CHECK(ddp_add(&y, y_clean, noise));

  /* the model: w (1, D) and b (1), leaves that require grad, starting at zero */
  ddp_tensor *w, *b;
  CHECK(ddp_tensor_zeros(&w, 2, w_shape, DDP_F32, DDP_DEVICE_CPU));
  CHECK(ddp_tensor_zeros(&b, 1, b_shape, DDP_F32, DDP_DEVICE_CPU));
  CHECK(ddp_tensor_set_requires_grad(w, 1));
  CHECK(ddp_tensor_set_requires_grad(b, 1));

  const double lr = 0.1;
  double first = 0, last = 0;
  for (int step = 0; step < STEPS; step++) {
    ddp_tensor *pred, *loss;
    CHECK(ddp_linear(&pred, x, w, b));
    CHECK(ddp_mse_loss(&loss, pred, y, DDP_REDUCTION_MEAN));
    CHECK(ddp_tensor_item(loss, &last));
    if (step == 0) first = last;
    CHECK(ddp_backward(loss, NULL, 0));
    /* SGD: p -= lr * p.grad, outside the tape; then clear the gradients */
    int prev = ddp_set_grad_enabled(0);
    ddp_tensor *params[2] = {w, b};
    for (int i = 0; i < 2; i++) {
      ddp_tensor *g = ddp_tensor_grad(params[i]);
      CHECK(ddp_add_alpha_(params[i], g, -lr));
      ddp_tensor_release(g);
      CHECK(ddp_tensor_set_grad(params[i], NULL));
    }
    ddp_set_grad_enabled(prev);
    ddp_tensor_release(pred);
    ddp_tensor_release(loss);
  }
  printf("first loss %.6g, last loss %.6g\n", first, last);

  ddp_tensor *all[] = {x, w_true, b_true, noise, y_clean, y, w, b};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ddp_tensor_release(all[i]);
  ddp_generator_free(gen);
  printf("live bytes after release: %lld\n", (long long)ddp_memory_live_bytes());
  return last < 1e-3 * first ? 0 : 1;
}
