/* runtime/comm/listen_policy.h: who may open a listening socket without the job's
 * secret (Note [no open listener without a secret], listen_policy.c). */
#ifndef DDP_LISTEN_POLICY_H
#define DDP_LISTEN_POLICY_H

#include <stddef.h>

/* 1 when every address `host` resolves to is a loopback address (127.0.0.0/8, ::1, or the
 * name "localhost"), 0 otherwise (a wildcard such as 0.0.0.0 or ::, another interface's
 * address, or a name that does not resolve). */
int listen_host_is_loopback(const char *host);

/* The check before `what` (e.g. "store server") listens on host:port with a secret of
 * secret_len bytes: DDP_OK, with one warning per process on stderr for a loopback address
 * and an empty secret; DDP_ERR_ARG (message naming the address and DDPLUA_STORE_SECRET) for
 * any other address with an empty secret. */
int listen_check_secret(const char *what, const char *host, int port, size_t secret_len);

/* The same rule for a client joining a store at host:port: a store beyond loopback never
 * runs without a secret (listen_check_secret refuses it), so a client with an empty secret
 * and such an address stops at once with the same advice, instead of waiting out its timeout
 * for a server that cannot exist (every rank of an srun job without a secret says what to
 * set, not only rank 0). DDP_OK on loopback; DDP_ERR_ARG otherwise. */
int join_check_secret(const char *what, const char *host, int port, size_t secret_len);

#endif
