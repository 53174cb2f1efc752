/* runtime/comm/pg_address.c: which address a rank of a Gloo group binds and
 * publishes (the rules are in ddplua/pg.h at ddp_pg_new_gloo, as PyTorch's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/pg_internal.h"

void pg_pick_address(char *host, size_t cap, const char **iface) {
  *iface = NULL;
  const char *v = getenv("DDPLUA_GLOO_IFNAME");
  if (v && *v) {
    *iface = v;
    host[0] = 0;
    return;
  }
  v = getenv("DDPLUA_GLOO_HOSTNAME");
  if (v && *v) {
    snprintf(host, cap, "%s", v);
    return;
  }
  const char *m = getenv("MASTER_ADDR");
  if (!m || !*m || strncmp(m, "127.", 4) == 0 || strcmp(m, "localhost") == 0 ||
      strcmp(m, "::1") == 0) {
    snprintf(host, cap, "127.0.0.1");
    return;
  }
  if (gethostname(host, cap) != 0 || !host[0]) snprintf(host, cap, "127.0.0.1");
  host[cap - 1] = 0;
}
