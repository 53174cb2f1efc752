/* runtime/comm/pg_recorder.h: the flight recorder of the process groups and its
 * watcher thread (internal; Note [flight recorder]).
 *
 * Note [flight recorder]: every group keeps its last PG_REC_CAP collectives in a ring
 * (sequence, collective, dtype and element count, Lua call site, times enqueued, started
 * and completed, status): pg.c records the submission, the backends the start and the
 * end. One watcher thread per process (started with the first group) serves two things:
 *  - SIGUSR1: the handler (installed only where SIGUSR1 still has its default action)
 *    writes one byte into a pipe; the watcher then dumps every live group's records to
 *    stderr (ddp_pg_dump_flight_recorder);
 *  - stall reports: for a collective started and not finished, once it has waited half
 *    the group's stall_report_s (default 30 s) it publishes this rank's position under
 *    "<prefix>/stall/<group rank>" in the store ("<seq> <last completed seq> <call
 *    site>"), and at stall_report_s prints a report to stderr (Note [stall report timing]
 *    in pg_recorder.c): the collective, how long it has waited, the last one this rank
 *    completed, and for every other rank its published position, naming the ranks that
 *    are behind (a lower sequence, or no position at all: stopped, dead, or busy outside
 *    collectives), each line tagged with that rank's host (Note [stall report hosts]). It
 *    talks to the store over its own connection with a short timeout (Note [stall report
 *    store]): a rank that cannot reach the store reports too, saying so. The job keeps its
 *    own timeout: the report changes nothing. */
#ifndef DDP_PG_RECORDER_H
#define DDP_PG_RECORDER_H

#include <stdint.h>

#include "comm/pg_internal.h"

enum { PG_REC_CAP = 2000 };
extern const double PG_DEFAULT_STALL_REPORT_S;

typedef struct pg_recorder pg_recorder;

/* A recorder for group pg (NULL when out of memory: recording is then skipped). */
pg_recorder *pg_rec_new(void);
void pg_rec_free(pg_recorder *r);

/* Record w's submission (its kind, tensors, site, w->seq); sets w->rec_id. */
void pg_rec_enqueue(pg_recorder *r, ddp_work *w);
/* w started moving data / finished with status. Ids that left the ring are ignored. */
void pg_rec_start(pg_recorder *r, const ddp_work *w);
void pg_rec_complete(pg_recorder *r, const ddp_work *w, int status);

/* Publish this rank's host name for the group's stall reports (Note [stall report hosts]
 * in pg_recorder.c). A store failure is ignored: the report then names no host. */
void pg_rec_publish_host(ddp_pg *pg);

/* Register / unregister a live group with the watcher (starting it on the first call). */
void pg_watch_add(ddp_pg *pg);
void pg_watch_remove(ddp_pg *pg);

#endif /* DDP_PG_RECORDER_H */
