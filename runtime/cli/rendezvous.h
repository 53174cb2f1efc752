/* rendezvous.h: the elastic rendezvous of `ddplua --nnodes=MIN:MAX` (rendezvous.c), internal
 * to the ddplua executable. One agent (launcher) per node joins rounds on a TCP store; each
 * round fixes the nodes that train together and their ranks (Note [elastic rendezvous] in
 * rendezvous.c). Errors are returned as -1 with the message in ddp_rdzv_error(). */
#ifndef DDPLUA_RDZV_H
#define DDPLUA_RDZV_H

#include <stddef.h>

typedef struct ddp_rdzv ddp_rdzv;

/* What an agent needs to reach the rendezvous. */
typedef struct ddp_rdzv_config {
  const char *host;      /* the endpoint's host: the agent whose address this is hosts the store */
  int port;              /* the endpoint's port */
  const char *run_id;    /* the job id (--rdzv_id): keys live under "rdzv/<run_id>/" */
  int min_nodes, max_nodes; /* --nnodes=MIN:MAX, 1 <= MIN <= MAX */
  int max_restarts;      /* rounds after the first that the job may start (--max_restarts) */
  double last_call_s;    /* once MIN nodes joined a round, wait this long for more */
  double join_timeout_s; /* a round without MIN nodes after this long fails */
} ddp_rdzv_config;

/* One closed round, as this node takes part in it. */
typedef struct ddp_rdzv_round {
  int round;             /* 0, 1, ...: TORCHELASTIC_RESTART_COUNT */
  int node_rank;         /* this node's place in the join order: GROUP_RANK */
  int nnodes;            /* nodes of the round: GROUP_WORLD_SIZE */
  char master_addr[256]; /* node rank 0's address, where worker rank 0 hosts its store */
  int master_port;       /* a free port on that node */
  char nodes[1024];      /* "name (address), ..." of the round's nodes in rank order */
  char gone[1024];       /* the nodes of the round before that are not in this one, or "" */
} ddp_rdzv_round;

/* Connect to the rendezvous store (hosting it when cfg->host is an address of this machine
 * and the port is free). Returns 0, or -1 with *err (a static message) on failure. */
int ddp_rdzv_open(ddp_rdzv **out, const ddp_rdzv_config *cfg, const char **err);

/* Join the next round and wait until it closes with this node in it. Returns 0 with *r
 * filled; 1 when the job has ended while waiting (ddp_rdzv_error says why: another node
 * ended it, or the job succeeded); -1 on failure (too few nodes within join_timeout, no
 * restarts left, the store lost), with the message in ddp_rdzv_error. */
int ddp_rdzv_next_round(ddp_rdzv *z, ddp_rdzv_round *r);

/* Take this node's ticket in the next round now (a node that must leave the running round
 * does so before stopping its workers, so that a newcomer's last call cannot close the next
 * round without it); ddp_rdzv_next_round then waits with it. Returns as
 * ddp_rdzv_next_round (0, 1 the job ended, -1 failure). */
int ddp_rdzv_join(ddp_rdzv *z);

/* While round r runs: 1 when it must stop (a node waits to join, another node's workers
 * failed or the job was ended), with the reason in ddp_rdzv_error; 0 when not; -1 when the
 * store is lost. Cheap: one store request; call it every fraction of a second. */
int ddp_rdzv_should_stop(ddp_rdzv *z, const ddp_rdzv_round *r);

/* This node's workers of round r failed: tell the other nodes (`why`, one line). */
void ddp_rdzv_mark_changed(ddp_rdzv *z, const ddp_rdzv_round *r, const char *why);

/* End the job for every node (no restarts left, a signal): `why`, one line. */
void ddp_rdzv_end_job(ddp_rdzv *z, const char *why);

/* This node's workers of round r all succeeded. The agent hosting the store waits (up to
 * join_timeout) until every node of the round said so before it returns, so that no node
 * loses the store early. Returns 0, or -1 after the wait timed out (the message names the
 * nodes that did not finish). */
int ddp_rdzv_finish(ddp_rdzv *z, const ddp_rdzv_round *r);

/* The last error or reason. */
const char *ddp_rdzv_error(const ddp_rdzv *z);

/* Whether this agent hosts the store. */
int ddp_rdzv_is_host(const ddp_rdzv *z);

/* Close the store (stopping the server when hosted) and free; NULL is ignored. */
void ddp_rdzv_free(ddp_rdzv *z);

#endif /* DDPLUA_RDZV_H */
