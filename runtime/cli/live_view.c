/* runtime/cli/live_view.c: the launcher's live view, one line per worker of this node,
 * from the workers' status pages (Note [rank status pages] in runtime/core/status.c).
 *
 * Note [live view]: on a terminal the lines sit below the workers' output and are redrawn
 * in place (cursor up, clear to the end of the screen) at most every 0.5 s; when a worker's
 * output is about to be printed the launcher erases them first (the before_console hook of
 * ddplua/process.h), so output and lines never mix, and the next tick draws them again
 * below. Not on a terminal (a log file, a pipe, CI) the same lines are printed as plain
 * "[status] " lines every --status_interval seconds, and only when a rank has published
 * something since the last time or is inside a collective (a job that hangs shows where).
 * The view reads shared memory only: it never waits on a worker. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "live_view.h"

struct live_view {
  int nproc, first_rank, tty;
  double interval_s, next_at;
  int drawn;                /* lines on the terminal now */
  uint64_t *last_version;   /* (nproc) the page versions printed last (plain mode) */
};

live_view *live_view_new(int nproc, int first_rank, int tty, double interval_s) {
  live_view *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  v->last_version = calloc((size_t)nproc, sizeof *v->last_version);
  if (!v->last_version) {
    free(v);
    return NULL;
  }
  v->nproc = nproc;
  v->first_rank = first_rank;
  v->tty = tty;
  v->interval_s = tty ? 0.5 : interval_s;
  v->next_at = ddp_os_monotonic_seconds() + v->interval_s;
  return v;
}

void live_view_line(char *buf, size_t cap, int rank, const ddp_rank_status *s, double now_s) {
  size_t n = (size_t)snprintf(buf, cap, "rank %d: ", rank);
  if (n >= cap) return;
  if (s->progress_at > 0)
    n += (size_t)snprintf(buf + n, cap - n, "step %lld, %.0f samples/s, loss %.4f", (long long)s->step,
                          s->samples_per_s, s->loss);
  else
    n += (size_t)snprintf(buf + n, cap - n, "no step yet");
  if (n >= cap) return;
  if (s->collective[0]) {
    char name[sizeof s->collective + 1];
    memcpy(name, s->collective, sizeof s->collective);
    name[sizeof s->collective] = '\0';
    n += (size_t)snprintf(buf + n, cap - n, ", %s %s #%llu for %.1f s", s->collective_running ? "in" : "waiting for",
                          name, (unsigned long long)s->collective_seq, now_s - s->collective_since);
    if (n >= cap) return;
  }
  if (s->progress_at > 0) snprintf(buf + n, cap - n, ", last progress %.1f s ago", now_s - s->progress_at);
}

void live_view_clear(void *ctx) {
  live_view *v = ctx;
  if (!v || !v->tty || !v->drawn) return;
  printf("\x1b[%dA\x1b[J", v->drawn); /* up over the lines, clear to the end of the screen */
  fflush(stdout);
  v->drawn = 0;
}

void live_view_tick(live_view *v, const ddp_procs *p) {
  if (!v || v->interval_s <= 0) return;
  double now = ddp_os_monotonic_seconds();
  if (now < v->next_at) return;
  v->next_at = now + v->interval_s;
  char line[256];
  if (v->tty) {
    live_view_clear(v);
    for (int i = 0; i < v->nproc; i++) {
      ddp_rank_status s;
      if (ddp_procs_status(p, i, &s) != 0) continue;
      live_view_line(line, sizeof line, v->first_rank + i, &s, now);
      printf("%s\x1b[K\n", line);
      v->drawn++;
    }
    fflush(stdout);
    return;
  }
  for (int i = 0; i < v->nproc; i++) {
    ddp_rank_status s;
    if (ddp_procs_status(p, i, &s) != 0) continue;
    if (s.version == v->last_version[i] && !s.collective[0]) continue; /* nothing new */
    v->last_version[i] = s.version;
    live_view_line(line, sizeof line, v->first_rank + i, &s, now);
    printf("[status] %s\n", line);
  }
  fflush(stdout);
}

void live_view_free(live_view *v) {
  if (!v) return;
  live_view_clear(v);
  free(v->last_version);
  free(v);
}
