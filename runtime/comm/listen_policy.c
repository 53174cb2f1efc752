/* runtime/comm/listen_policy.c: Note [no open listener without a secret].
 *
 * Note [no open listener without a secret]
 * A socket that listens beyond loopback is reachable by every host that can route to it, and
 * ddplua's listeners run code or hand out the rendezvous (the store; the distributed REPL's
 * prompt, which refuses --nnodes > 1 without a secret itself). So a listener on an address
 * that is not loopback needs the job's secret (DDPLUA_STORE_SECRET, or the store's `secret`
 * option): without one it is refused with an error that says what to set. This is what
 * stops a rank started by srun, mpirun or by hand on a cluster address with no secret in its
 * environment. On loopback only this machine's processes can connect; the job may go on, but
 * every local user could join it, so the process warns once. The launcher and spawn() make a
 * fresh secret for their one-node jobs, so only hand-made jobs see the warning. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "comm/listen_policy.h"
#include "core/core.h"

int listen_host_is_loopback(const char *host) {
  if (!host || !host[0]) return 0;
  if (strcmp(host, "localhost") == 0) return 1;
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res) return 0;
  int all = 1;
  for (struct addrinfo *a = res; a && all; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      uint32_t v = ntohl(((const struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr);
      all = (v >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      all = IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a->ai_addr)->sin6_addr);
    } else {
      all = 0;
    }
  }
  freeaddrinfo(res);
  return all;
}

int join_check_secret(const char *what, const char *host, int port, size_t secret_len) {
  if (secret_len > 0 || listen_host_is_loopback(host)) return DDP_OK;
  DDP_FAIL(DDP_ERR_ARG, "%s: refusing to join the store at %s:%d without the job's secret: a store "
           "beyond loopback never runs without one. Set DDPLUA_STORE_SECRET to the same random value "
           "on every rank (README \"Security\")", what, host, port);
}

int listen_check_secret(const char *what, const char *host, int port, size_t secret_len) {
  if (secret_len > 0) return DDP_OK;
  char where[320];
  if (port > 0) snprintf(where, sizeof where, "%s port %d", host, port);
  else snprintf(where, sizeof where, "%s (a free port)", host);
  if (!listen_host_is_loopback(host))
    DDP_FAIL(DDP_ERR_ARG, "%s: refusing to listen on %s without the job's secret: anyone who can "
             "reach that address could join the job. Set DDPLUA_STORE_SECRET to the same random "
             "value on every rank (for example `export DDPLUA_STORE_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n')` "
             "before srun or mpirun -x DDPLUA_STORE_SECRET; README \"Security\"), or listen on "
             "127.0.0.1 for a one-machine job", what, where);
  static int warned;
  if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
    fprintf(stderr, "ddplua: warning: the %s on %s has no secret (DDPLUA_STORE_SECRET is empty): "
            "any process of this machine may join the job; the launcher and spawn() set one for you "
            "(README \"Security\")\n", what, where);
  return DDP_OK;
}
