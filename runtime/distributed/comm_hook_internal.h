/* runtime/distributed/comm_hook_internal.h: the state the communication-hook files share
 * (reducer_comm_hook.c: registration, the built-in hooks' launch and wait, the front end's
 * buckets; comm_hook_powersgd.c: PowerSGD). Not part of the public API: ddplua/comm_hook.h is.
 * Note [comm hooks] there. */
#ifndef DDP_COMM_HOOK_INTERNAL_H
#define DDP_COMM_HOOK_INTERNAL_H

#include "distributed/reducer_internal.h"

/* One PowerSGD bucket between its launch and its wait (comm_hook_powersgd.c). */
typedef struct powersgd_flight powersgd_flight;

/* Per bucket, for the iteration under way. */
typedef struct {
  ddp_tensor *wire;          /* the compress wrappers' cast copy (numel,) of wrap_dtype */
  ddp_tensor *compressed;    /* fp16/bf16_compress_hook: the cast copy on the wire (numel,) */
  ddp_work *work;            /* the hook's all-reduce (ALLREDUCE, *_COMPRESS) */
  powersgd_flight *psgd;     /* POWER_SGD */
  int has_result;            /* FRONT_END: set_result gave the value */
} hook_bucket;

struct reducer_comm_hook {
  int kind;                  /* enum ddp_comm_hook_kind */
  int wrap_dtype;            /* -1, DDP_F16, DDP_BF16 (the compress wrappers) */
  ddp_pg *pg;                /* the hook's group (NULL: world size 1, no communication) */
  int world;
  ddp_powersgd_state *psgd;  /* POWER_SGD: a reference */
  int64_t bytes;             /* ddp_reducer_comm_hook_bytes */
  hook_bucket *hb;           /* cap entries; grown to the bucket count (rebuilds change it) */
  int cap;
  int next_handed;           /* FRONT_END: lowest launched bucket not handed to the front end */
};

/* PowerSGD steps (comm_hook_powersgd.c). Launch: hand bucket k's tensor t (numel,), laid out
 * as bucket k's parameter slots, to the algorithm; its first collectives are launched on pg
 * (may be NULL). Finish: wait for them, run the second round, leave the result in t. Both
 * count the bytes they launch into *bytes. Free: forget a flight (its works run out). */
int powersgd_launch(ddp_powersgd_state *st, ddp_reducer *r, int k, ddp_tensor *t, ddp_pg *pg,
                    int world, powersgd_flight **out, int64_t *bytes);
int powersgd_finish(ddp_powersgd_state *st, ddp_reducer *r, int k, ddp_tensor *t, ddp_pg *pg,
                    int world, powersgd_flight *f, int64_t *bytes);
void powersgd_flight_free(powersgd_flight *f);
void powersgd_state_retain(ddp_powersgd_state *s);
/* Called after the last bucket's wait of each iteration (PyTorch's maybe_increase_iter). */
void powersgd_state_next_iter(ddp_powersgd_state *s);

/* Wait for w (bucket k's `what`), errors naming the bucket, rank and the group's cause. */
int comm_hook_wait_work(ddp_reducer *r, ddp_pg *pg, int k, ddp_work *w, const char *what);

#endif
