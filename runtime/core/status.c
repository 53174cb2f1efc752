/* runtime/core/status.c: rank status pages, the worker's side and the reader.
 *
 * Note [rank status pages]: the launcher gives each worker it starts a page of shared
 * memory of its own (a memfd: no name in any file system, mode 0600, reachable only through
 * the descriptor the launcher hands the worker at exec, DDPLUA_STATUS_FD) holding one
 * ddp_rank_status. The worker writes it, the launcher reads it for the live view
 * (runtime/cli/launcher.c): the training loop publishes each step (ddp_status_progress,
 * from Lua through train.lua's progress), the flight recorder each collective queued,
 * started and done (runtime/comm/pg_recorder.c), so a rank blocked in an all-reduce still
 * shows which one and for how long. Writers are the training thread and the communication
 * threads: a process-local mutex orders them, and `version` is a seqlock for the reader in
 * the other process (odd while a write is under way; the reader copies and retries when the
 * version moved). Nothing here blocks on the reader, and a worker without a page does
 * nothing. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"

static ddp_rank_status *page;
static pthread_mutex_t page_lock = PTHREAD_MUTEX_INITIALIZER;

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void ddp_status_adopt(void) {
  const char *v = getenv("DDPLUA_STATUS_FD");
  if (!v || page) return;
  char *end = NULL;
  long fd = strtol(v, &end, 10);
  unsetenv("DDPLUA_STATUS_FD");
  if (!end || *end || fd < 3 || fd > INT_MAX) return;
  void *p = mmap(NULL, sizeof(ddp_rank_status), PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
  close((int)fd); /* the mapping keeps the memory */
  if (p == MAP_FAILED) return;
  page = p;
}

/* Enter / leave a write (Note [rank status pages]). */
static void begin_write(void) {
  pthread_mutex_lock(&page_lock);
  __atomic_add_fetch(&page->version, 1, __ATOMIC_RELEASE);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

static void end_write(void) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  __atomic_add_fetch(&page->version, 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&page_lock);
}

void ddp_status_progress(int64_t step, double loss, double samples_per_s) {
  if (!page) return;
  begin_write();
  page->step = step;
  page->loss = loss;
  page->samples_per_s = samples_per_s;
  page->progress_at = mono_s();
  end_write();
}

void ddp_status_collective(const char *name, uint64_t seq, int running) {
  if (!page) return;
  begin_write();
  /* the oldest unfinished collective is the one shown: a later one waits for it anyway */
  if (!page->collective[0]) {
    snprintf(page->collective, sizeof page->collective, "%s", name ? name : "?");
    page->collective_seq = seq;
    page->collective_running = 0;
    page->collective_since = mono_s();
  }
  if (running && page->collective_seq == seq) page->collective_running = 1;
  end_write();
}

void ddp_status_collective_done(uint64_t seq) {
  if (!page) return;
  begin_write();
  if (page->collective_seq == seq) page->collective[0] = '\0';
  end_write();
}

void ddp_status_read(const ddp_rank_status *p, ddp_rank_status *out) {
  for (int tries = 0; tries < 1000; tries++) {
    uint64_t v0 = __atomic_load_n(&p->version, __ATOMIC_ACQUIRE);
    memcpy(out, (const void *)p, sizeof *out);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    uint64_t v1 = __atomic_load_n(&p->version, __ATOMIC_ACQUIRE);
    if (v0 == v1 && !(v0 & 1)) return;
    struct timespec ts = {0, 1000};
    nanosleep(&ts, NULL);
  }
}
