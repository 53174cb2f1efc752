/* rendezvous.c: the elastic rendezvous of `ddplua --nnodes=MIN:MAX --rdzv_endpoint=H:P`, on
 * the job's authenticated TCP store (ddplua/store.h), as torchrun's c10d rendezvous
 * (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py) in its semantics, not its
 * code.
 *
 * Note [elastic rendezvous]: every node runs one agent (the launcher). The agent whose
 * machine owns the endpoint's address hosts the store there (the first to bind it); the
 * others are its clients. All keys live under "rdzv/<run_id>/":
 *
 *   R/count      tickets handed out in round R (ddp_store_add): a node's ticket is its place
 *                in the join order, which becomes its node rank (GROUP_RANK)
 *   R/node/<t>   "name (address)" of ticket t, for messages
 *   R/closed     the round's node count N, set once (compare_set on a missing key): tickets
 *                0 .. N-1 train in round R, later ones wait for round R+1
 *   R/master     "address port" chosen by ticket 0 (its own address and a free port): where
 *                worker rank 0 of the round hosts the workers' store (MASTER_ADDR/PORT)
 *   R/changed    why round R must end (a node waits to join, a node's workers failed); the
 *                agents of round R poll it while their workers run ("membership changed")
 *   R/done       how many nodes' workers of round R all succeeded
 *   end          why the whole job ended (no restarts left, a node gave up)
 *
 * A round closes when MAX nodes hold tickets, or when at least MIN do and last_call_s has
 * passed since this agent first saw MIN of them (torchrun's last-call timeout); whoever sees
 * the condition first closes it. A node arriving while round R runs takes a ticket in round
 * R+1 and sets R/changed: the running agents stop their workers and join R+1 too, where the
 * newcomer, having come first, gets node rank 0. A node that leaves (its agent killed, its
 * workers failed) makes the other nodes' workers fail in their next collective; their agents
 * set R/changed and join R+1 without it. The round number is the job's restart count
 * (TORCHELASTIC_RESTART_COUNT), the same on every node; a round past --max_restarts is not
 * started: membership changes count as restarts, as failures do (torchrun counts failures
 * only). A round that has fewer than MIN tickets after join_timeout_s fails, naming the
 * nodes that joined and those of the previous round that did not come back.
 *
 * Limits: the endpoint's node must live through the job (it holds the store, as with
 * torchrun's c10d backend); a node that dies after taking a ticket but before its round
 * closes is counted in that round, whose workers then fail at init_process_group's timeout
 * and start one more round without it.
 */
#define _GNU_SOURCE
#include "rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ddplua.h"

#define POLL_S 0.05        /* how often a waiting agent looks at the round */
#define REQUEST_S 30.0     /* the store's timeout for one request */

struct ddp_rdzv {
  ddp_rdzv_config cfg;
  char host[256];
  char run_id[160];
  ddp_store *store;
  int is_host;
  int round;            /* the round this agent joins next (a hint: closed rounds are skipped) */
  int64_t ticket;       /* its ticket in that round, -1 before ddp_rdzv_join took one */
  char name[256];       /* "hostname (address)" */
  char addr[INET6_ADDRSTRLEN];
  char err[2048];
};

const char *ddp_rdzv_error(const ddp_rdzv *z) { return z->err; }
int ddp_rdzv_is_host(const ddp_rdzv *z) { return z->is_host; }

/* The store key "rdzv/<run_id>/<round>/<what>" (round < 0: "rdzv/<run_id>/<what>"). */
static void key(const ddp_rdzv *z, char *out, size_t size, int round, const char *what) {
  if (round < 0) snprintf(out, size, "rdzv/%s/%s", z->run_id, what);
  else snprintf(out, size, "rdzv/%s/%d/%s", z->run_id, round, what);
}

/* The store lost or refusing: the message names the endpoint. */
static int store_failed(ddp_rdzv *z, const char *doing) {
  snprintf(z->err, sizeof z->err, "rendezvous store at %s:%d: %s: %s", z->host, z->cfg.port, doing,
           ddp_last_error());
  return -1;
}

/* *present = whether key (round, what) is set now. */
static int has(ddp_rdzv *z, int round, const char *what, int *present) {
  char k[512];
  key(z, k, sizeof k, round, what);
  const char *keys[1] = {k};
  if (ddp_store_check(z->store, keys, 1, present) != DDP_OK) return store_failed(z, "check");
  return 0;
}

/* The value of (round, what) into out (NUL-terminated, cut to size), waiting for it. */
static int get(ddp_rdzv *z, int round, const char *what, char *out, size_t size) {
  char k[512];
  key(z, k, sizeof k, round, what);
  void *v = NULL;
  size_t n = 0;
  if (ddp_store_get(z->store, k, &v, &n) != DDP_OK) return store_failed(z, "get");
  snprintf(out, size, "%.*s", (int)n, (const char *)v);
  ddp_store_free_value(v);
  return 0;
}

/* Set (round, what) to the string value. */
static int set(ddp_rdzv *z, int round, const char *what, const char *value) {
  char k[512];
  key(z, k, sizeof k, round, what);
  if (ddp_store_set(z->store, k, value, strlen(value)) != DDP_OK) return store_failed(z, "set");
  return 0;
}

/* Set (round, what) unless it is set already (the first reason wins). */
static int set_once(ddp_rdzv *z, int round, const char *what, const char *value) {
  char k[512];
  key(z, k, sizeof k, round, what);
  void *res = NULL;
  size_t rlen = 0;
  if (ddp_store_compare_set(z->store, k, "", 0, value, strlen(value), &res, &rlen) != DDP_OK)
    return store_failed(z, "compare_set");
  ddp_store_free_value(res);
  return 0;
}

/* Add delta to the counter (round, what); *out = its new value (delta 0: read it). */
static int add(ddp_rdzv *z, int round, const char *what, int64_t delta, int64_t *out) {
  char k[512];
  key(z, k, sizeof k, round, what);
  if (ddp_store_add(z->store, k, delta, out) != DDP_OK) return store_failed(z, "add");
  return 0;
}

/* This machine's address on the way to the endpoint (a UDP socket "connected" there sends
 * nothing; getsockname gives the source address the kernel would use), and its name. */
static void own_address(ddp_rdzv *z) {
  snprintf(z->addr, sizeof z->addr, "127.0.0.1");
  struct addrinfo hints, *ai = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_socktype = SOCK_DGRAM;
  char port[16];
  snprintf(port, sizeof port, "%d", z->cfg.port);
  if (getaddrinfo(z->host, port, &hints, &ai) == 0 && ai) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
      getnameinfo((struct sockaddr *)&sa, sl, z->addr, sizeof z->addr, NULL, 0, NI_NUMERICHOST);
    if (fd >= 0) close(fd);
    freeaddrinfo(ai);
  }
  char hn[200] = "?";
  gethostname(hn, sizeof hn - 1);
  snprintf(z->name, sizeof z->name, "%s (%s)", hn, z->addr);
}

int ddp_rdzv_open(ddp_rdzv **out, const ddp_rdzv_config *cfg, const char **err) {
  *out = NULL;
  ddp_rdzv *z = calloc(1, sizeof *z);
  if (!z) {
    *err = "out of memory";
    return -1;
  }
  z->cfg = *cfg;
  snprintf(z->host, sizeof z->host, "%s", cfg->host);
  snprintf(z->run_id, sizeof z->run_id, "%s", cfg->run_id);
  z->cfg.host = z->host;
  z->cfg.run_id = z->run_id;
  z->ticket = -1;
  own_address(z);
  /* Host the store when the endpoint's address is ours and free; else be a client (the
   * host may start later: the client retries until join_timeout). */
  ddp_store_tcp_options o = {.is_server = 1, .timeout_s = REQUEST_S, .rank = -1};
  if (ddp_store_tcp_open(&z->store, z->host, cfg->port, &o) == DDP_OK) {
    z->is_host = 1;
  } else {
    o.is_server = 0;
    o.timeout_s = cfg->join_timeout_s;
    if (ddp_store_tcp_open(&z->store, z->host, cfg->port, &o) != DDP_OK) {
      static char msg[1024];
      snprintf(msg, sizeof msg, "cannot reach the rendezvous store at %s:%d: %s", z->host,
               cfg->port, ddp_last_error());
      *err = msg;
      free(z);
      return -1;
    }
    ddp_store_set_timeout(z->store, REQUEST_S);
  }
  *out = z;
  return 0;
}

void ddp_rdzv_free(ddp_rdzv *z) {
  if (!z) return;
  ddp_store_free(z->store);
  free(z);
}

/* "name (address), ..." of tickets 0 .. n-1 of `round` (those set) into out. */
static void node_list(ddp_rdzv *z, int round, int n, char *out, size_t size) {
  out[0] = '\0';
  size_t used = 0;
  for (int t = 0; t < n && used + 4 < size; t++) {
    char what[32], v[300] = "?";
    snprintf(what, sizeof what, "node/%d", t);
    int present = 0;
    if (has(z, round, what, &present) != 0) return;
    if (present && get(z, round, what, v, sizeof v) != 0) return;
    used += (size_t)snprintf(out + used, size - used, "%s%s", t ? ", " : "", v);
    if (used >= size) used = size - 1;
  }
}

/* 1 with the reason in z->err when "end" is set. */
static int job_ended(ddp_rdzv *z, int *ended) {
  if (has(z, -1, "end", ended) != 0) return -1;
  if (*ended) {
    char why[1024];
    if (get(z, -1, "end", why, sizeof why) != 0) return -1;
    snprintf(z->err, sizeof z->err, "the job was ended: %s", why);
  }
  return 0;
}

/* Round `round` has too few nodes after join_timeout: name who came and who did not. */
static int join_timed_out(ddp_rdzv *z, int round, int64_t count) {
  char came[1024], before[1024] = "";
  node_list(z, round, (int)count, came, sizeof came);
  int prev_closed = 0;
  if (round > 0 && has(z, round - 1, "closed", &prev_closed) == 0 && prev_closed) {
    char v[32];
    if (get(z, round - 1, "closed", v, sizeof v) == 0) node_list(z, round - 1, atoi(v), before, sizeof before);
  }
  snprintf(z->err, sizeof z->err,
           "rendezvous of job '%s' at %s:%d: round %d waited %.0f s (join_timeout) for at least "
           "%d nodes; %lld joined (%s)",
           z->run_id, z->host, z->cfg.port, round, z->cfg.join_timeout_s, z->cfg.min_nodes,
           (long long)count, count ? came : "none");
  if (*before) { /* who was there before: the ones missing now are the dead peers */
    size_t n = strlen(z->err);
    snprintf(z->err + n, sizeof z->err - n, "; round %d had: %s", round - 1, before);
  }
  return -1;
}

/* Take a ticket in the first round that is not closed (z->round or later). Returns 0, 1
 * when the job has ended, -1 on failure (no restarts left, the store lost). */
static int take_ticket(ddp_rdzv *z) {
  int ended = 0;
  for (;;) { /* skip closed rounds */
    int closed = 0;
    if (job_ended(z, &ended) != 0) return -1;
    if (ended) return 1;
    if (has(z, z->round, "closed", &closed) != 0) return -1;
    if (!closed) break;
    z->round++;
  }
  if (z->round > z->cfg.max_restarts) {
    snprintf(z->err, sizeof z->err,
             "no restarts left: round %d of job '%s' would be restart %d, over --max_restarts=%d "
             "(membership changes and failures both count)",
             z->round, z->run_id, z->round, z->cfg.max_restarts);
    return -1;
  }
  if (z->round > 0) { /* the running round (if any) learns that a node waits */
    char why[600];
    snprintf(why, sizeof why, "node %s waits to join round %d", z->name, z->round);
    if (set_once(z, z->round - 1, "changed", why) != 0) return -1;
  }
  int64_t ticket;
  if (add(z, z->round, "count", 1, &ticket) != 0) return -1;
  char what[32];
  snprintf(what, sizeof what, "node/%lld", (long long)(ticket - 1));
  if (set(z, z->round, what, z->name) != 0) return -1;
  z->ticket = ticket - 1;
  return 0;
}

int ddp_rdzv_join(ddp_rdzv *z) {
  if (z->ticket >= 0) return 0;
  return take_ticket(z);
}

/* r->gone: the nodes of the previous closed round that are not in round r (the ones that
 * died or left), "" when none. */
static void gone_since(ddp_rdzv *z, ddp_rdzv_round *r) {
  r->gone[0] = '\0';
  int closed = 0;
  if (r->round == 0 || has(z, r->round - 1, "closed", &closed) != 0 || !closed) return;
  char v[32], before[1024];
  if (get(z, r->round - 1, "closed", v, sizeof v) != 0) return;
  node_list(z, r->round - 1, atoi(v), before, sizeof before);
  size_t used = 0;
  for (char *save = NULL, *name = strtok_r(before, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
    while (*name == ' ') name++;
    if (strstr(r->nodes, name)) continue;
    used += (size_t)snprintf(r->gone + used, sizeof r->gone - used, "%s%s", used ? ", " : "", name);
    if (used >= sizeof r->gone) break;
  }
}

int ddp_rdzv_next_round(ddp_rdzv *z, ddp_rdzv_round *r) {
  memset(r, 0, sizeof *r);
  int ended = 0;
  char why[600];
join:
  if (z->ticket < 0) {
    int s = take_ticket(z);
    if (s != 0) return s;
  }
  int64_t ticket = z->ticket;
  double t_join = ddp_os_monotonic_seconds(), t_min = -1;
  int64_t n_closed = -1;
  for (;;) {
    int closed = 0;
    if (job_ended(z, &ended) != 0) return -1;
    if (ended) return 1;
    if (has(z, z->round, "closed", &closed) != 0) return -1;
    if (closed) {
      char v[32];
      if (get(z, z->round, "closed", v, sizeof v) != 0) return -1;
      n_closed = atoll(v);
      if (ticket < n_closed) break;
      /* it closed without us: the next round, and this one must end */
      snprintf(why, sizeof why, "node %s waits to join round %d", z->name, z->round + 1);
      if (set_once(z, z->round, "changed", why) != 0) return -1;
      z->round++;
      z->ticket = -1;
      goto join;
    }
    int64_t count;
    if (add(z, z->round, "count", 0, &count) != 0) return -1;
    double now = ddp_os_monotonic_seconds();
    int64_t close_at = -1;
    if (count >= z->cfg.max_nodes) close_at = z->cfg.max_nodes;
    else if (count >= z->cfg.min_nodes) {
      if (t_min < 0) t_min = now;
      if (now - t_min >= z->cfg.last_call_s) close_at = count;
    } else if (now - t_join > z->cfg.join_timeout_s) {
      return join_timed_out(z, z->round, count);
    }
    if (close_at > 0) {
      char v[32];
      snprintf(v, sizeof v, "%lld", (long long)close_at);
      if (set_once(z, z->round, "closed", v) != 0) return -1;
      continue;
    }
    ddp_os_sleep(POLL_S);
  }
  r->round = z->round;
  r->node_rank = (int)ticket;
  r->nnodes = (int)n_closed;
  char master[320];
  if (ticket == 0) {
    int port = 0;
    if (ddp_process_free_port(&port) != DDP_OK) {
      snprintf(z->err, sizeof z->err, "cannot find a free port for the workers' store: %s", ddp_last_error());
      return -1;
    }
    snprintf(master, sizeof master, "%s %d", z->addr, port);
    if (set(z, z->round, "master", master) != 0) return -1;
  }
  if (get(z, z->round, "master", master, sizeof master) != 0) return -1;
  char *sp = strrchr(master, ' ');
  if (!sp) {
    snprintf(z->err, sizeof z->err, "round %d: malformed master '%s' in the store", z->round, master);
    return -1;
  }
  *sp = '\0';
  snprintf(r->master_addr, sizeof r->master_addr, "%s", master);
  r->master_port = atoi(sp + 1);
  node_list(z, z->round, r->nnodes, r->nodes, sizeof r->nodes);
  gone_since(z, r);
  z->round++; /* the next call joins the following round */
  z->ticket = -1;
  return 0;
}

int ddp_rdzv_should_stop(ddp_rdzv *z, const ddp_rdzv_round *r) {
  int changed = 0, ended = 0;
  if (job_ended(z, &ended) != 0) return -1;
  if (ended) return 1;
  if (has(z, r->round, "changed", &changed) != 0) return -1;
  if (!changed) return 0;
  char why[1024];
  if (get(z, r->round, "changed", why, sizeof why) != 0) return -1;
  snprintf(z->err, sizeof z->err, "membership changed: %s", why);
  return 1;
}

void ddp_rdzv_mark_changed(ddp_rdzv *z, const ddp_rdzv_round *r, const char *why) {
  char v[1024];
  snprintf(v, sizeof v, "node %s: %s", z->name, why);
  set_once(z, r->round, "changed", v);
}

void ddp_rdzv_end_job(ddp_rdzv *z, const char *why) {
  char v[1024];
  snprintf(v, sizeof v, "node %s: %s", z->name, why);
  set_once(z, -1, "end", v);
}

int ddp_rdzv_finish(ddp_rdzv *z, const ddp_rdzv_round *r) {
  int64_t done;
  if (add(z, r->round, "done", 1, &done) != 0) return -1;
  if (!z->is_host) return 0;
  double t0 = ddp_os_monotonic_seconds();
  while (done < r->nnodes) {
    if (ddp_os_monotonic_seconds() - t0 > z->cfg.join_timeout_s) {
      snprintf(z->err, sizeof z->err,
               "round %d: %lld of its %d nodes (%s) reported success within %.0f s; the store "
               "closes now",
               r->round, (long long)done, r->nnodes, r->nodes, z->cfg.join_timeout_s);
      return -1;
    }
    int changed = 0;
    if (has(z, r->round, "changed", &changed) != 0) return -1;
    if (changed) { /* a node failed after ours succeeded: it will not report success */
      char why[1024];
      if (get(z, r->round, "changed", why, sizeof why) != 0) return -1;
      snprintf(z->err, sizeof z->err,
               "round %d: this node's workers succeeded, but then %s; the store closes now",
               r->round, why);
      return -1;
    }
    ddp_os_sleep(POLL_S);
    if (add(z, r->round, "done", 0, &done) != 0) return -1;
  }
  return 0;
}
