/* runtime/comm/pg_recorder.c: the flight recorder ring of each process group, its
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

#include "core/profiler.h"
#include "comm/pg_recorder.h"
#include "comm/store_wire.h"

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
  /* The watcher's own (Note [stall report timing], Note [stall report store]), not under mu:
   * only the watcher reads or writes them, and pg_rec_free runs once it has let go. */
  uint64_t published;   /* id of the stalled collective whose position was published */
  uint64_t reported;    /* id of the stalled collective reported */
  ddp_store *store;     /* the watcher's connection to the group's store; NULL: none yet */
  char unreachable[400];/* why the store could not be reached for `published` ("": it could) */
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
  ddp_store_free(r->store);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

/* The name of a collective kind (flight-recorder dumps, status pages). */
static const char *kind_name(int kind) {
  return kind >= 0 && kind < PG_OP_COUNT ? pg_op_names[kind] : "?";
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
  ddp_status_collective(kind_name(w->kind), w->seq, 0); /* Note [rank status pages] */
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
  ddp_status_collective(kind_name(w->kind), w->seq, 1);
}

/* The profiler's event of a completed collective (Note [profiler events]): from its start to
 * its end on this thread, with its bytes, sequence and call site. */
static void pg_rec_profile(const pg_record *e) {
  int64_t bytes = e->dtype >= 0 ? e->numel * (int64_t)ddp_dtype_size(e->dtype) : 0;
  ddp_prof_record_span(e->kind >= 0 && e->kind < PG_OP_COUNT ? pg_op_names[e->kind] : "?",
                       DDP_PROF_COLLECTIVE, (int64_t)(e->started * 1e9),
                       (int64_t)(e->completed * 1e9), bytes, (int64_t)e->seq, e->site);
}

void pg_rec_complete(pg_recorder *r, const ddp_work *w, int status) {
  if (!r) return;
  pg_record done = {0};
  pthread_mutex_lock(&r->mu);
  pg_record *e = find(r, w->rec_id);
  if (e && !e->completed) {
    e->completed = now_s();
    if (!e->started) e->started = e->completed;
    e->status = status;
    done = *e;
  }
  pthread_mutex_unlock(&r->mu);
  ddp_status_collective_done(w->seq);
  if (DDP_PROF_ON() && done.id) pg_rec_profile(&done);
}

/* ---- dump ------------------------------------------------------------------------------ */


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

/* The oldest collective started and not finished: its record copied into *out; 0 when
 * there is none. Also the last completed one into *done (id 0: none). Under r->mu. */
static int oldest_running(pg_recorder *r, pg_record *out, pg_record *done) {
  int found = 0;
  memset(done, 0, sizeof *done);
  uint64_t last = r->next_id, first = last > PG_REC_CAP ? last - PG_REC_CAP + 1 : 1;
  for (uint64_t id = last; id >= first && id; id--) {
    const pg_record *e = find(r, id);
    if (!e) continue;
    if (e->completed && !done->id) *done = *e;
    if (e->started && !e->completed) {
      *out = *e;
      found = 1;
    }
    if (done->id && id + 64 < last) break; /* running ones are the newest */
  }
  return found;
}

/* The oldest collective enqueued and not finished (queued or running) among the newest
 * records, copied into *out; 0 when there is none. Under r->mu. */
static int oldest_pending(pg_recorder *r, pg_record *out) {
  int found = 0;
  uint64_t last = r->next_id, first = last > PG_REC_CAP ? last - PG_REC_CAP + 1 : 1;
  for (uint64_t id = last; id >= first && id && id + 256 > last; id--) {
    const pg_record *e = find(r, id);
    if (e && !e->completed) {
      *out = *e;
      found = 1;
    }
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

/* Note [stall report store]: the watcher talks to the store over its own connection
 * (store_tcp_client_like), opened at the first stall and kept, with a short timeout
 * (stall_report_s / 2, within 0.2 .. 5 s). On the group's own connection its requests
 * would queue behind the program's (a store wait holds it) and, on a store that does not
 * answer (its machine cut off, its process stopped), wait the job's whole timeout: the rank
 * cut off from the store, which most needs to say so, printed nothing. Now a failed or
 * unanswered request marks the store unreachable for this stall (the connection is dropped
 * and made anew at the next one), and the report says so instead of reading the other
 * ranks' positions. A file store is used as it is (no connection to wait on). */
static ddp_store *watch_store(ddp_pg *pg, double timeout_s) {
  pg_recorder *r = pg->rec;
  if (!pg->store) {
    snprintf(r->unreachable, sizeof r->unreachable, "the group has no store");
    return NULL;
  }
  if (pg->store->kind != STORE_KIND_TCP) return pg->store;
  if (!r->store && store_tcp_client_like(&r->store, pg->store, timeout_s)) {
    snprintf(r->unreachable, sizeof r->unreachable, "%s", ddp_last_error());
    ddp_clear_error();
    return NULL;
  }
  if (r->store) ddp_store_set_timeout(r->store, timeout_s);
  return r->store;
}

/* After a failed request on the watcher's store: remember why, drop the connection. A
 * missing key (check says no) is not a failure; this is for errors only. */
static void store_failed(pg_recorder *r) {
  snprintf(r->unreachable, sizeof r->unreachable, "%s", ddp_last_error());
  ddp_clear_error();
  ddp_store_free(r->store);
  r->store = NULL;
}

/* The value of key into a malloc'd string (*v; caller frees with ddp_store_free_value),
 * 1 when found, 0 when not set, -1 when the store failed (store_failed done). */
static int read_key(pg_recorder *r, ddp_store *st, const char *key, void **v, size_t *n) {
  const char *keys[1] = {key};
  int have = 0;
  if (ddp_store_check(st, keys, 1, &have) || (have && ddp_store_get(st, key, v, n))) {
    if (st == r->store) store_failed(r);
    else ddp_clear_error(); /* a file store: report without this key */
    return st == r->store ? -1 : 0;
  }
  return have;
}

/* "[host <name>] " for group rank g (Note [stall report hosts]), or "" when not published.
 * Returns -1 when the store failed. */
static int host_tag(ddp_pg *pg, ddp_store *st, int g, char *out, size_t cap) {
  char key[600];
  snprintf(key, sizeof key, "%s/stall_host/%d", pg->prefix, g);
  void *v = NULL;
  size_t n = 0;
  out[0] = 0;
  int got = read_key(pg->rec, st, key, &v, &n);
  if (got > 0) {
    snprintf(out, cap, "[host %.*s] ", (int)(n < 200 ? n : 200), (const char *)v);
    ddp_store_free_value(v);
  }
  return got < 0 ? -1 : 0;
}

/* Step 1 of Note [stall report timing]: this rank's position under
 * "<prefix>/stall/<group rank>" ("<seq> <last completed seq> <call site>"). */
static void publish(ddp_pg *pg, const pg_record *cur, const pg_record *done, double io_s) {
  pg_recorder *r = pg->rec;
  r->published = cur->id;
  r->unreachable[0] = 0;
  ddp_store *st = watch_store(pg, io_s);
  if (!st) return;
  char key[600], val[256];
  snprintf(key, sizeof key, "%s/stall/%d", pg->prefix, pg->rank);
  int n = snprintf(val, sizeof val, "%llu %lld %s", (unsigned long long)cur->seq,
                   done->id ? (long long)done->seq : -1LL, cur->site[0] ? cur->site : "?");
  int status = ddp_store_set(st, key, val, (size_t)n);
  if (status == DDP_ERR_PEER && st == r->store) {
    /* a connection kept since an earlier stall may have been closed meanwhile: once more on
     * a new one (a timeout is not retried: the store did not answer) */
    store_failed(r);
    r->unreachable[0] = 0;
    if (!(st = watch_store(pg, io_s))) return;
    status = ddp_store_set(st, key, val, (size_t)n);
  }
  if (status) {
    if (st == r->store) store_failed(r);
    else ddp_clear_error();
  }
}

/* Step 2 of Note [stall report timing]: the report, on stderr. */
static void report(ddp_pg *pg, const pg_record *cur, const pg_record *done, double stall_s,
                   double io_s) {
  pg_recorder *r = pg->rec;
  int me = pg->global[pg->rank];
  char msg[4096], key[600];
  size_t used = (size_t)snprintf(
      msg, sizeof msg, "ddplua: stall report (rank %d, group '%s'): %s #%llu called at %s has "
      "waited %.1f s for its peers (stall_report_s %g; the job's timeout still applies); the "
      "last collective this rank completed: %s%s #%lld at %s\n", me, pg->prefix,
      kind_name(cur->kind), (unsigned long long)cur->seq, cur->site[0] ? cur->site : "?",
      now_s() - cur->started, stall_s, done->id ? "" : "none", done->id ? kind_name(done->kind) : "",
      done->id ? (long long)done->seq : -1LL, done->id && done->site[0] ? done->site : "?");
  ddp_store *st = r->unreachable[0] ? NULL : watch_store(pg, io_s);
  for (int g = 0; g < pg->size && used < sizeof msg - 512; g++) {
    if (g == pg->rank) continue;
    char host[224] = "";
    void *v = NULL;
    size_t vn = 0;
    int got = -1;
    if (st && host_tag(pg, st, g, host, sizeof host) == 0) {
      snprintf(key, sizeof key, "%s/stall/%d", pg->prefix, g);
      got = read_key(r, st, key, &v, &vn);
    }
    if (got < 0) { /* the store failed now or before: nothing more to read from it */
      st = NULL;
      if (!r->unreachable[0]) snprintf(r->unreachable, sizeof r->unreachable, "no answer");
      used += (size_t)snprintf(msg + used, sizeof msg - used, "  %sthe position of rank %d is "
                               "unknown: this rank cannot reach the store: %s\n", host,
                               pg->global[g], r->unreachable);
      continue;
    }
    if (!got) {
      used += (size_t)snprintf(msg + used, sizeof msg - used, "  %srank %d is BEHIND: it has not "
                               "reached %s #%llu (no position published: stopped, dead, or busy "
                               "outside collectives)\n", host, pg->global[g], kind_name(cur->kind),
                               (unsigned long long)cur->seq);
      continue;
    }
    unsigned long long seq = 0;
    long long last = -1;
    char site[PG_SITE_CAP] = "?";
    sscanf((const char *)v, "%llu %lld %79[^\n]", &seq, &last, site);
    ddp_store_free_value(v);
    if (seq < cur->seq)
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

/* Note [stall report timing]: a collective that has waited stall_report_s / 2 publishes
 * this rank's position (step 1); at stall_report_s the report is printed (step 2), reading
 * the positions the other waiting ranks published meanwhile. The watcher sleeps until the
 * next step is due (not a fixed tick: with a 1 s tick and the two steps a tick apart,
 * stall_report_s = 3 reported at 4 to 5 s), and at most stall_report_s / 4 (and 1 s), so a
 * collective started while it sleeps is seen well before its first step. Returns the time
 * of this group's next step (0: none due) and its stall_report_s in *stall_out. */
static double stall_check(ddp_pg *pg, double *stall_out) {
  pg_recorder *r = pg->rec;
  pthread_mutex_lock(&pg->lock);
  double stall_s = pg->stall_report_s;
  pthread_mutex_unlock(&pg->lock);
  *stall_out = stall_s;
  if (!r) return 0;
  double io_s = stall_s / 2 < 0.2 ? 0.2 : stall_s / 2 > 5 ? 5 : stall_s / 2;
  pg_record cur, done;
  pthread_mutex_lock(&r->mu);
  int running = oldest_running(r, &cur, &done);
  pthread_mutex_unlock(&r->mu);
  if (!running) return 0;
  if (cur.id != r->published) {
    if (now_s() - cur.started < stall_s / 2) return cur.started + stall_s / 2;
    publish(pg, &cur, &done, io_s);
  }
  if (cur.id != r->reported) {
    if (now_s() - cur.started < stall_s) return cur.started + stall_s;
    r->reported = cur.id;
    report(pg, &cur, &done, stall_s, io_s);
  }
  return 0;
}

static void *watcher(void *arg) {
  (void)arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals go to the program's threads */
  int wait_ms = 1000;
  for (;;) {
    struct pollfd p = {wake_pipe[0], POLLIN, 0};
    int n = poll(&p, 1, wait_ms);
    int dump = 0;
    if (n > 0) {
      char buf[64];
      while (read(wake_pipe[0], buf, sizeof buf) > 0) dump = 1;
    }
    /* Note [group abort] (pg.c): every live group's abort key, every PG_ABORT_POLL_S */
    double next = 0, cap = PG_ABORT_POLL_S;
    pthread_mutex_lock(&watch_mu);
    for (ddp_pg *pg = watch_head; pg; pg = pg->watch_next) {
      if (dump) ddp_pg_dump_flight_recorder(pg, 2);
      pg_abort_poll(pg);
      double stall_s;
      double due = stall_check(pg, &stall_s);
      if (due > 0 && (next == 0 || due < next)) next = due;
      if (stall_s / 4 < cap) cap = stall_s / 4;
    }
    pthread_mutex_unlock(&watch_mu);
    double wait = cap;
    if (next > 0 && next - now_s() < wait) wait = next - now_s();
    if (wait < 0.005) wait = 0.005;
    wait_ms = (int)(wait * 1000 + 0.999); /* rounded up: never wake before the step is due */
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

int ddp_pg_abort_pending(const char *reason) {
  int n = 0;
  pthread_mutex_lock(&watch_mu);
  for (ddp_pg *pg = watch_head; pg; pg = pg->watch_next) {
    pg_record cur;
    int pending = 0;
    if (pg->rec) {
      pthread_mutex_lock(&pg->rec->mu);
      pending = oldest_pending(pg->rec, &cur);
      pthread_mutex_unlock(&pg->rec->mu);
    }
    if (!pending) continue;
    char msg[PG_MSG_CAP];
    snprintf(msg, sizeof msg, "%s on rank %d while %s #%llu (called at %s) was pending",
             reason && *reason ? reason : "interrupted", pg->global[pg->rank], kind_name(cur.kind),
             (unsigned long long)cur.seq, cur.site[0] ? cur.site : "?");
    pg_abort(pg, DDP_ERR_STATE, msg, NULL);
    n++;
  }
  pthread_mutex_unlock(&watch_mu);
  return n;
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
