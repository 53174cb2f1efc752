/* runtime/io/safetensors_async.c: a safetensors file written on a thread of its own, so a
 * distributed checkpoint's write overlaps training (dist.checkpoint.async_save).
 *
 * Note [async save snapshot]: the call copies everything the writer needs before it returns
 * (each tensor cloned to a contiguous CPU tensor, the names, metadata and path duplicated),
 * so training may change or free the tensors at once; the writer thread then runs
 * ddp_io_save_safetensors (atomic: temporary file, fsync, rename) on the copies and keeps its
 * status and message (errors are thread-local: the waiter gets the writer's message back).
 * The handle must be waited for or freed (free joins the thread). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "io/io_internal.h"

struct ddp_io_async_save {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t done_cond;
  int done;        /* the writer finished (under lock) */
  int joined;
  int status;      /* the writer's status once done */
  char message[1024];
  char *path;
  int n, nmeta;
  char **names, **keys, **values;
  ddp_tensor **tensors; /* (n) the contiguous CPU copies */
};

static void free_strings(char **list, int n) {
  if (!list) return;
  for (int i = 0; i < n; i++) free(list[i]);
  free(list);
}

static void release(ddp_io_async_save *h) {
  free(h->path);
  free_strings(h->names, h->n);
  free_strings(h->keys, h->nmeta);
  free_strings(h->values, h->nmeta);
  if (h->tensors)
    for (int i = 0; i < h->n; i++) ddp_tensor_release(h->tensors[i]);
  free(h->tensors);
  pthread_mutex_destroy(&h->lock);
  pthread_cond_destroy(&h->done_cond);
  free(h);
}

static void *writer_main(void *arg) {
  ddp_io_async_save *h = arg;
  int status = ddp_io_save_safetensors(h->path, h->n, (const char *const *)h->names, h->tensors, h->nmeta,
                                       (const char *const *)h->keys, (const char *const *)h->values);
  pthread_mutex_lock(&h->lock);
  h->status = status;
  if (status) snprintf(h->message, sizeof h->message, "%s", ddp_last_error());
  h->done = 1;
  pthread_cond_broadcast(&h->done_cond);
  pthread_mutex_unlock(&h->lock);
  return NULL;
}

static char **dup_strings(const char *const *src, int n) {
  char **out = calloc((size_t)(n > 0 ? n : 1), sizeof *out);
  if (!out) return NULL;
  for (int i = 0; i < n; i++) {
    out[i] = strdup(src[i] ? src[i] : "");
    if (!out[i]) {
      free_strings(out, i);
      return NULL;
    }
  }
  return out;
}

int ddp_io_save_safetensors_async(ddp_io_async_save **out, const char *path, int n, const char *const *names,
                                  ddp_tensor **tensors, int nmeta, const char *const *keys,
                                  const char *const *values) {
  const char *op = "async_save";
  *out = NULL;
  if (!path || !*path) DDP_FAIL(DDP_ERR_ARG, "%s: empty path", op);
  if (n < 0 || nmeta < 0) DDP_FAIL(DDP_ERR_ARG, "%s: %s: negative count", op, path);
  ddp_io_async_save *h = calloc(1, sizeof *h);
  if (!h) DDP_FAIL(DDP_ERR_MEMORY, "%s: %s: out of memory", op, path);
  pthread_mutex_init(&h->lock, NULL);
  pthread_cond_init(&h->done_cond, NULL);
  h->n = n;
  h->nmeta = nmeta;
  h->path = strdup(path);
  h->names = dup_strings(names, n);
  h->keys = dup_strings(keys, nmeta);
  h->values = dup_strings(values, nmeta);
  h->tensors = calloc((size_t)(n > 0 ? n : 1), sizeof *h->tensors);
  if (!h->path || !h->names || !h->keys || !h->values || !h->tensors) {
    release(h);
    DDP_FAIL(DDP_ERR_MEMORY, "%s: %s: out of memory", op, path);
  }
  int grad_was = ddp_set_grad_enabled(0); /* copies, not a step of the graph */
  for (int i = 0; i < n; i++) { /* Note [async save snapshot] */
    int status = ddp_check_alive(tensors[i], op, names[i]);
    if (!status && ddp_tensor_device(tensors[i]) != DDP_DEVICE_CPU)
      status = DDP_ERROR(DDP_ERR_ARG, "%s: %s: tensor '%s' is not on the CPU (copy it to the host first)", op, path,
                         names[i]);
    if (!status) status = ddp_clone(&h->tensors[i], tensors[i]);
    if (status) {
      ddp_set_grad_enabled(grad_was);
      ddp_error_prefix("%s: %s", op, path);
      release(h);
      return status;
    }
  }
  ddp_set_grad_enabled(grad_was);
  if (pthread_create(&h->thread, NULL, writer_main, h) != 0) {
    release(h);
    DDP_FAIL(DDP_ERR_IO, "%s: %s: cannot start the writer thread", op, path);
  }
  *out = h;
  return DDP_OK;
}

int ddp_io_async_save_done(ddp_io_async_save *h) {
  if (!h) return 1;
  pthread_mutex_lock(&h->lock);
  int d = h->done;
  pthread_mutex_unlock(&h->lock);
  return d;
}

int ddp_io_async_save_wait(ddp_io_async_save *h, double timeout_s) {
  if (!h) DDP_FAIL(DDP_ERR_ARG, "async_save wait: no handle");
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  if (timeout_s > 0) {
    double whole = (double)(int64_t)timeout_s;
    until.tv_sec += (time_t)whole;
    until.tv_nsec += (long)((timeout_s - whole) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec += 1;
      until.tv_nsec -= 1000000000L;
    }
  }
  pthread_mutex_lock(&h->lock);
  while (!h->done) {
    if (timeout_s <= 0) {
      pthread_cond_wait(&h->done_cond, &h->lock);
      continue;
    }
    if (pthread_cond_timedwait(&h->done_cond, &h->lock, &until) != 0 && !h->done) {
      pthread_mutex_unlock(&h->lock);
      DDP_FAIL(DDP_ERR_TIMEOUT, "async_save: %s: the write did not finish within %.1f s", h->path, timeout_s);
    }
  }
  int status = h->status;
  char message[sizeof h->message];
  memcpy(message, h->message, sizeof message);
  pthread_mutex_unlock(&h->lock);
  if (!h->joined) {
    pthread_join(h->thread, NULL);
    h->joined = 1;
  }
  if (status) DDP_FAIL(status, "%s", message);
  return DDP_OK;
}

void ddp_io_async_save_free(ddp_io_async_save *h) {
  if (!h) return;
  if (!h->joined) pthread_join(h->thread, NULL);
  release(h);
}
