/* ddplua/status.h: part of the public API, included by ddplua.h only.
 *
 * Rank status pages (runtime/core/status.c): what the launcher's live view shows of each of
 * its workers while they run (Note [rank status pages]).
 * ------------------------------------------------------------------------------------- */

/* What a worker last published; times are CLOCK_MONOTONIC seconds (shared by the processes
 * of a host). A page is one of these at the start of a shared memory object. */
typedef struct ddp_rank_status {
  uint64_t version;       /* seqlock: odd while a writer is inside (Note [rank status pages]) */
  int64_t step;           /* the last step published (ddp_status_progress), -1: none yet */
  double loss;            /* its loss */
  double samples_per_s;   /* its throughput */
  double progress_at;     /* when it was published, 0: never */
  char collective[24];    /* the collective the rank waits for or runs ("" when none) */
  uint64_t collective_seq;/* its sequence number in its group */
  int32_t collective_running; /* 1: started on the wire; 0: queued, waiting for its turn */
  int32_t unused;
  double collective_since;/* when it was queued */
} ddp_rank_status;

/* In a worker the launcher started: map the page whose descriptor DDPLUA_STATUS_FD names
 * (once; the variable is removed so the worker's own children do not inherit it). Nothing
 * happens without the variable. Called by the ddplua executable at start. */
void ddp_status_adopt(void);

/* Publish a training step: step number, its loss and the samples per second, stamped now.
 * Does nothing when no page is mapped (a process not started by the launcher). Cheap: a
 * few stores, no system call. */
void ddp_status_progress(int64_t step, double loss, double samples_per_s);

/* Publish that a collective named `name` with sequence number seq was queued (running 0)
 * or started (running 1); ddp_status_collective_done(seq) clears it when seq is the one
 * shown. Used by the process groups' flight recorder; thread-safe. */
void ddp_status_collective(const char *name, uint64_t seq, int running);
void ddp_status_collective_done(uint64_t seq);

/* A consistent copy of the page at p (the launcher's read; retries while a writer is inside,
 * at most ~1 ms, then returns the last copy). */
void ddp_status_read(const ddp_rank_status *p, ddp_rank_status *out);
