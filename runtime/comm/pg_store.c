/* runtime/comm/pg_store.c: the process groups' rendezvous through the store: our
 * store behind the Gloo shim's callbacks (gloo_shim.cc puts them behind Gloo's Store), and
 * the world-size check every backend runs before connecting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/gloo_shim.h"
#include "comm/pg_internal.h"

static int store_set_cb(void *ctx, const char *key, const void *data, size_t len, char *err) {
  int st = ddp_store_set((ddp_store *)ctx, key, data, len);
  if (st) snprintf(err, DDP_GLOO_ERR_CAP, "%s", ddp_last_error());
  return st;
}

static int store_get_cb(void *ctx, const char *key, void **data, size_t *len, char *err) {
  void *v = NULL;
  size_t n = 0;
  int st = ddp_store_get((ddp_store *)ctx, key, &v, &n);
  if (st) {
    snprintf(err, DDP_GLOO_ERR_CAP, "%s", ddp_last_error());
    return st;
  }
  *data = malloc(n ? n : 1); /* the shim frees with free() */
  if (!*data) {
    ddp_store_free_value(v);
    snprintf(err, DDP_GLOO_ERR_CAP, "out of memory reading store key '%s'", key);
    return DDP_ERR_MEMORY;
  }
  if (n) memcpy(*data, v, n);
  *len = n;
  ddp_store_free_value(v);
  return DDP_OK;
}

static int store_wait_cb(void *ctx, const char *const *keys, int n, double timeout_s, char *err) {
  int st = ddp_store_wait((ddp_store *)ctx, keys, n, timeout_s > 0 ? timeout_s : -1);
  if (st) snprintf(err, DDP_GLOO_ERR_CAP, "%s", ddp_last_error());
  return st;
}

void pg_store_callbacks(ddp_gloo_store *ops, ddp_store *store) {
  ops->ctx = store;
  ops->set = store_set_cb;
  ops->get = store_get_cb;
  ops->wait = store_wait_cb;
}

/* Every rank publishes its world size; ranks other than 0 compare theirs with rank 0's, so
 * a rank started with another world size fails loudly instead of waiting for ranks that
 * will never come. */
int pg_check_world_size(ddp_store *store, const char *prefix, int rank, int size, int me) {
  char key[600], val[32];
  snprintf(val, sizeof val, "%d", size);
  snprintf(key, sizeof key, "%s/ddp_world_size/%d", prefix, rank);
  if (ddp_store_set(store, key, val, strlen(val))) {
    ddp_error_prefix("init_process_group: rank %d", me);
    return ddp_last_status();
  }
  if (rank == 0) return DDP_OK;
  snprintf(key, sizeof key, "%s/ddp_world_size/0", prefix);
  void *v = NULL;
  size_t n = 0;
  if (ddp_store_get(store, key, &v, &n)) {
    ddp_error_prefix("init_process_group: rank %d waiting for rank 0", me);
    return ddp_last_status();
  }
  int theirs = atoi((const char *)v); /* NUL-terminated by the store */
  ddp_store_free_value(v);
  if (theirs != size)
    DDP_FAIL(DDP_ERR_ARG, "init_process_group: rank %d was started with world size %d but "
             "rank 0 with %d: every rank must get the same world size", me, size, theirs);
  return DDP_OK;
}
