/* runtime/cli/live_view.h: the launcher's live view of its workers (live_view.c). */
#ifndef DDP_CLI_LIVE_VIEW_H
#define DDP_CLI_LIVE_VIEW_H

#include "ddplua.h"

typedef struct live_view live_view;

/* A view of the nproc workers of this node (global ranks first_rank ..), drawn in place on
 * stdout when tty (refreshed at most every 0.5 s), else as plain "[status] ..." lines on
 * stdout every interval_s seconds. NULL when out of memory. */
live_view *live_view_new(int nproc, int first_rank, int tty, double interval_s);

/* Draw what is due now from the workers' status pages (ddp_procs_status). */
void live_view_tick(live_view *v, const ddp_procs *p);

/* The console hook (ddp_procs_config.before_console): erase the drawn lines, so that a
 * worker's output is printed where they were; the next tick draws them again below it. */
void live_view_clear(void *ctx);

/* Erase the lines (on a terminal) and free. NULL is ignored. */
void live_view_free(live_view *v);

/* The line of one rank (what both modes show), written into buf (cap bytes): "rank 3: step
 * 120, 412 samples/s, loss 0.5321, in all_reduce #311 for 0.8 s, last progress 0.2 s ago".
 * now_s: CLOCK_MONOTONIC seconds. */
void live_view_line(char *buf, size_t cap, int rank, const ddp_rank_status *s, double now_s);

#endif
