/* runtime/distributed/pg_recorder.c: the flight recorder ring of each process group, its
 * dump, and the process's watcher thread (SIGUSR1 dumps, stall reports): Note [flight
 * recorder] in pg_recorder.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "distributed/pg_recorder.h"

const double PG_DEFAULT_STALL_REPORT_S = 30.0;

typedef struct pg_record {
  uint64_t id;          /* 1, 2, ...: the slot holds record id (id - 1) % PG_REC_CAP */
  uint64_t seq;         /* the collective's sequence number in its group */
  int32_t kind, dtype, status, pad;
  int64_t numel;
  double enqueued, started, completed; /* CLOCK_MONOTONIC seconds; 0 = not yet */
  char site[PG_SITE_CAP];
} pg_record;

struct pg_recorder {
  pthread_mutex_t mu;
  uint64_t next_id;     /* ids handed out so far */
  uint64_t reported;    /* id of the last stall reported (or published, see stall_check) */
  int published;        /* the stall of `reported` was published, the report not printed */
  pg_record ring[PG_REC_CAP];
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

pg_recorder *pg_rec_new(void) {
  pg_recorder *r = calloc(1, sizeof *r);
  if (r) pthread_mutex_init(&r->mu, NULL);
  return r;
}

void pg_rec_free(pg_recorder *r) {
  if (!r) return;
  pthread_mutex_destroy(&r->mu);
  free(r);
}

void pg_rec_enqueue(pg_recorder *r, ddp_work *w) {
  if (!r) return;
  const ddp_tensor *t = w->t ? w->t : w->out;
  pthread_mutex_lock(&r->mu);
  uint64_t id = ++r->next_id;
  pg_record *e = &r->ring[(id - 1) % PG_REC_CAP];
  memset(e, 0, sizeof *e);
  e->id = id;
  e->seq = w->seq;
  e->kind = (int32_t)w->kind;
  e->dtype = t ? t->dtype : -1;
  e->numel = t ? t->numel : 0;
  e->enqueued = now_s();
  memcpy(e->site, w->site, sizeof e->site);
  pthread_mutex_unlock(&r->mu);
  w->rec_id = id;
}

static pg_record *find(pg_recorder *r, uint64_t id) {
  pg_record *e = &r->ring[(id - 1) % PG_REC_CAP];
  return id && e->id == id ? e : NULL;
}

void pg_rec_start(pg_recorder *r, const ddp_work *w) {
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  pg_record *e = find(r, w->rec_id);
  if (e && !e->started) e->started = now_s();
  pthread_mutex_unlock(&r->mu);
}

void pg_rec_complete(pg_recorder *r, const ddp_work *w, int status) {
  if (!r) return;
  pthread_mutex_lock(&r->mu);
  pg_record *e = find(r, w->rec_id);
  if (e && !e->completed) {
    e->completed = now_s();
    if (!e->started) e->started = e->completed;
    e->status = status;
  }
  pthread_mutex_unlock(&r->mu);
}

/* ---- dump ------------------------------------------------------------------------------ */

static const char *kind_name(int kind) {
  return kind >= 0 && kind < PG_OP_COUNT ? pg_op_names[kind] : "?";
}

/* Write all of s to fd (best effort). */
static void put(int fd, const char *s, size_t n) {
  while (n) {
    ssize_t k = write(fd, s, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;
    s += k;
    n -= (size_t)k;
  }
}

int ddp_pg_dump_flight_recorder(const ddp_pg *pg, int fd) {
  if (!pg) DDP_FAIL(DDP_ERR_ARG, "dump_flight_recorder: no process group");
  pg_recorder *r = pg->rec;
  if (!r) return DDP_OK;
  char line[512];
  double now = now_s();
  pthread_mutex_lock(&r->mu);
  uint64_t last = r->next_id, first = last > PG_REC_CAP ? last - PG_REC_CAP + 1 : 1;
  int n = snprintf(line, sizeof line, "ddplua: flight recorder of rank %d, group '%s': the last "
                   "%llu of %llu collectives (times: seconds before now)\n", pg->global[pg->rank],
                   pg->prefix, (unsigned long long)(last - first + 1), (unsigned long long)last);
  put(fd, line, (size_t)n);
  for (uint64_t id = first; id <= last && last; id++) {
    const pg_record *e = find(r, id);
    if (!e) continue;
    char st[64];
    if (!e->started) snprintf(st, sizeof st, "queued");
    else if (!e->completed) snprintf(st, sizeof st, "started %.3f, running", now - e->started);
    else snprintf(st, sizeof st, "started %.3f, completed %.3f%s", now - e->started,
                  now - e->completed, e->status ? " (failed)" : "");
    const char *dt = e->dtype >= 0 ? ddp_dtype_name(e->dtype) : NULL;
    n = snprintf(line, sizeof line, "  #%llu %s %s[%lld] at %s: enqueued %.3f, %s\n",
                 (unsigned long long)e->seq, kind_name(e->kind), dt ? dt : "-",
                 (long long)e->numel, e->site[0] ? e->site : "?", now - e->enqueued, st);
    put(fd, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1));
  }
  pthread_mutex_unlock(&r->mu);
  return DDP_OK;
}

/* ---- the watcher ------------------------------------------------------------------------ */

static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;
static ddp_pg *watch_head;             /* live groups, guarded by watch_mu */
static pthread_once_t watch_once = PTHREAD_ONCE_INIT;
static int wake_pipe[2] = {-1, -1};

static void on_usr1(int sig) {
  (void)sig;
  int saved = errno;
  if (wake_pipe[1] >= 0) (void)!write(wake_pipe[1], "d", 1);
  errno = saved;
}

/* The oldest collective started more than stall_s ago and not finished: its record copied
 * into *out; 0 when there is none. Also the last completed one into *done (id 0: none). */
static int stalled(pg_recorder *r, double stall_s, double now, pg_record *out, pg_record *done) {
  int found = 0;
  memset(done, 0, sizeof *done);
  uint64_t last = r->next_id, first = last > PG_REC_CAP ? last - PG_REC_CAP + 1 : 1;
  for (uint64_t id = last; id >= first && id; id--) {
    const pg_record *e = find(r, id);
    if (!e) continue;
    if (e->completed && !done->id) *done = *e;
    if (e->started && !e->completed && now - e->started > stall_s) {
      *out = *e;
      found = 1;
    }
    if (done->id && id + 64 < last) break; /* running ones are the newest */
  }
  return found;
}

/* Note [stall report hosts]: a rank that stops answering is often a whole machine gone (a
 * cut link, a dead node), which the report should name. At group creation every rank
 * publishes its host name under "<prefix>/stall_host/<group rank>" (pg_rec_publish_host);
 * the report prefixes each other rank's line with "[host <name>] " when that key is there.
 * The key is read with a check first, so a rank that never published costs no wait. */
void pg_rec_publish_host(ddp_pg *pg) {
  char key[600], host[256] = "";
  if (!pg->store || gethostname(host, sizeof host - 1) != 0 || !host[0]) return;
  snprintf(key, sizeof key, "%s/stall_host/%d", pg->prefix, pg->rank);
  if (ddp_store_set(pg->store, key, host, strlen(host))) ddp_clear_error(); /* report without it */
}

/* "[host <name>] " for group rank g (Note [stall report hosts]), or "" when not published. */
static void host_tag(ddp_pg *pg, int g, char *out, size_t cap) {
  char key[600];
  snprintf(key, sizeof key, "%s/stall_host/%d", pg->prefix, g);
  const char *keys[1] = {key};
  int have = 0;
  void *v = NULL;
  size_t n = 0;
  out[0] = 0;
  if (ddp_store_check(pg->store, keys, 1, &have) || !have || ddp_store_get(pg->store, key, &v, &n)) {
    ddp_clear_error();
    return;
  }
  snprintf(out, cap, "[host %.*s] ", (int)(n < 200 ? n : 200), (const char *)v);
  ddp_store_free_value(v);
}

static void stall_check(ddp_pg *pg, double now) {
  pg_recorder *r = pg->rec;
  if (!r) return;
  pthread_mutex_lock(&pg->lock);
  double stall_s = pg->stall_report_s;
  pthread_mutex_unlock(&pg->lock);
  pg_record cur, done;
  pthread_mutex_lock(&r->mu);
  int st = stalled(r, stall_s, now, &cur, &done);
  int step = 0; /* 1: publish this rank's position, 2: print the report */
  if (st && cur.id != r->reported) {
    r->reported = cur.id;
    r->published = 1;
    step = 1;
  } else if (st && r->published) {
    r->published = 0;
    step = 2;
  }
  pthread_mutex_unlock(&r->mu);
  if (!step) return;
  int me = pg->global[pg->rank];
  char key[600], val[256];
  if (step == 1) {
    snprintf(key, sizeof key, "%s/stall/%d", pg->prefix, pg->rank);
    int n = snprintf(val, sizeof val, "%llu %lld %s", (unsigned long long)cur.seq,
                     done.id ? (long long)done.seq : -1LL, cur.site[0] ? cur.site : "?");
    if (ddp_store_set(pg->store, key, val, (size_t)n)) ddp_clear_error();
    return;
  }
  char msg[4096];
  size_t used = (size_t)snprintf(
      msg, sizeof msg, "ddplua: stall report (rank %d, group '%s'): %s #%llu called at %s has "
      "waited %.1f s for its peers (stall_report_s %g; the job's timeout still applies); the "
      "last collective this rank completed: %s%s #%lld at %s\n", me, pg->prefix,
      kind_name(cur.kind), (unsigned long long)cur.seq, cur.site[0] ? cur.site : "?",
      now - cur.started, stall_s, done.id ? "" : "none", done.id ? kind_name(done.kind) : "",
      done.id ? (long long)done.seq : -1LL, done.id && done.site[0] ? done.site : "?");
  for (int g = 0; g < pg->size && used < sizeof msg - 512; g++) {
    if (g == pg->rank) continue;
    char host[224];
    host_tag(pg, g, host, sizeof host);
    snprintf(key, sizeof key, "%s/stall/%d", pg->prefix, g);
    const char *keys[1] = {key};
    int have = 0;
    void *v = NULL;
    size_t vn = 0;
    if (ddp_store_check(pg->store, keys, 1, &have) || !have || ddp_store_get(pg->store, key, &v, &vn)) {
      ddp_clear_error();
      used += (size_t)snprintf(msg + used, sizeof msg - used, "  %srank %d is BEHIND: it has not "
                               "reached %s #%llu (no position published: stopped, dead, or busy "
                               "outside collectives)\n", host, pg->global[g], kind_name(cur.kind),
                               (unsigned long long)cur.seq);
      continue;
    }
    unsigned long long seq = 0;
    long long last = -1;
    char site[PG_SITE_CAP] = "?";
    sscanf((const char *)v, "%llu %lld %79[^\n]", &seq, &last, site);
    ddp_store_free_value(v);
    if (seq < cur.seq)
      used += (size_t)snprintf(msg + used, sizeof msg - used, "  %srank %d is BEHIND: waiting in "
                               "collective #%llu at %s (last completed #%lld)\n", host, pg->global[g],
                               seq, site, last);
    else
      used += (size_t)snprintf(msg + used, sizeof msg - used, "  %srank %d waits too, in collective "
                               "#%llu at %s (last completed #%lld)\n", host, pg->global[g], seq, site,
                               last);
  }
  put(2, msg, used < sizeof msg ? used : sizeof msg - 1);
}

static void *watcher(void *arg) {
  (void)arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals go to the program's threads */
  for (;;) {
    struct pollfd p = {wake_pipe[0], POLLIN, 0};
    int n = poll(&p, 1, 1000);
    int dump = 0;
    if (n > 0) {
      char buf[64];
      while (read(wake_pipe[0], buf, sizeof buf) > 0) dump = 1;
    }
    double now = now_s();
    pthread_mutex_lock(&watch_mu);
    for (ddp_pg *pg = watch_head; pg; pg = pg->watch_next) {
      if (dump) ddp_pg_dump_flight_recorder(pg, 2);
      stall_check(pg, now);
    }
    pthread_mutex_unlock(&watch_mu);
  }
  return NULL;
}

static void watch_start(void) {
  if (pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return;
  pthread_t t;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &a, watcher, NULL) != 0) {
    pthread_attr_destroy(&a);
    return;
  }
  pthread_attr_destroy(&a);
  /* Only where nobody chose an action for SIGUSR1 (its default would kill the process). */
  struct sigaction old;
  if (sigaction(SIGUSR1, NULL, &old) == 0 && old.sa_handler == SIG_DFL &&
      !(old.sa_flags & SA_SIGINFO)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
  }
}

void pg_watch_add(ddp_pg *pg) {
  pthread_once(&watch_once, watch_start);
  pthread_mutex_lock(&watch_mu);
  pg->watch_next = watch_head;
  watch_head = pg;
  pthread_mutex_unlock(&watch_mu);
}

void pg_watch_remove(ddp_pg *pg) {
  pthread_mutex_lock(&watch_mu);
  for (ddp_pg **p = &watch_head; *p; p = &(*p)->watch_next)
    if (*p == pg) {
      *p = pg->watch_next;
      break;
    }
  pthread_mutex_unlock(&watch_mu);
}
