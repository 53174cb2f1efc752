/* runtime/comm/pg_queue.c: the ordered communication thread of a process group
 * (Note [collective order] in ddplua/pg.h) and the thread that finishes posted
 * point-to-point messages. Every collective of a host-side backend, blocking or not, goes
 * through the one FIFO queue; the backend's `run` executes an item (returning 1 when it only
 * posted a message) and its `complete` finishes posted items, in posting order, on the
 * second thread, so the queue never blocks on a peer that has not posted its side yet.
 *
 * Note [inline collectives]: a blocking collective submitted while the queue is empty and
 * no item runs (`busy` clear), and which the backend accepts (can_inline: gloo's collectives
 * through shared memory), runs on the calling thread instead, with `busy` set so that the
 * communication thread starts nothing meanwhile. The order of Note [collective order] holds
 * (nothing was ahead of it, nothing starts beside it) and the two thread hand-offs (wake the
 * communication thread, wake the caller) leave a small collective's latency. The item runs
 * with autograd off, as on the communication thread. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "comm/pg_internal.h"

static struct timespec deadline_after(double seconds) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double whole = (double)(long long)seconds;
  ts.tv_sec += (time_t)whole;
  ts.tv_nsec += (long)((seconds - whole) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* Run one item; returns 1 when it was posted (the point-to-point thread then owns the
 * queue's reference). An aborted group fails every later item with its first failure
 * (Note [group abort] in pg.c). */
static int run_item(ddp_pg *pg, ddp_work *w) {
  char msg[PG_MSG_CAP];
  pthread_mutex_lock(&pg->lock);
  int failed = pg->failed;
  if (failed) snprintf(msg, sizeof msg, "%s on rank %d: the process group was aborted: %s",
                       pg_op_names[w->kind], pg->global[pg->rank], pg->failure);
  pthread_mutex_unlock(&pg->lock);
  if (failed) {
    pg_work_finish(w, failed, msg);
    return 0;
  }
  return pg->run(pg, w);
}

static void *comm_thread(void *arg) {
  ddp_pg *pg = arg;
  ddp_set_grad_enabled(0); /* collectives move data; they never record autograd */
  for (;;) {
    pthread_mutex_lock(&pg->lock);
    while (pg->busy || (!pg->head && !pg->stop)) pthread_cond_wait(&pg->cv, &pg->lock);
    ddp_work *w = pg->head;
    if (!w) { /* stop, and the queue is drained */
      pthread_mutex_unlock(&pg->lock);
      return NULL;
    }
    pg->head = w->next;
    if (!pg->head) pg->tail = NULL;
    pg->busy = 1;
    pthread_mutex_unlock(&pg->lock);
    if (!run_item(pg, w)) pg_work_unref(w);
    pthread_mutex_lock(&pg->lock);
    pg->busy = 0;
    pthread_mutex_unlock(&pg->lock);
  }
}

/* Finish the posted messages in posting order. */
static void *p2p_thread(void *arg) {
  ddp_pg *pg = arg;
  ddp_set_grad_enabled(0);
  for (;;) {
    pthread_mutex_lock(&pg->lock);
    while (!pg->p2p_head && !pg->p2p_stop) pthread_cond_wait(&pg->p2p_cv, &pg->lock);
    ddp_work *w = pg->p2p_head;
    if (!w) {
      pthread_mutex_unlock(&pg->lock);
      return NULL;
    }
    pg->p2p_head = w->next;
    if (!pg->p2p_head) pg->p2p_tail = NULL;
    pthread_mutex_unlock(&pg->lock);
    pg->complete(pg, w);
    pg_work_unref(w);
  }
}

void pg_queue_post(ddp_pg *pg, ddp_work *w) {
  pthread_mutex_lock(&pg->lock);
  w->next = NULL;
  if (pg->p2p_tail) pg->p2p_tail->next = w;
  else pg->p2p_head = w;
  pg->p2p_tail = w;
  pthread_cond_signal(&pg->p2p_cv);
  pthread_mutex_unlock(&pg->lock);
}

static void stop_p2p(ddp_pg *pg) {
  pthread_mutex_lock(&pg->lock);
  pg->p2p_stop = 1;
  pthread_cond_signal(&pg->p2p_cv);
  pthread_mutex_unlock(&pg->lock);
  pthread_join(pg->p2p_thread, NULL);
}

int pg_queue_start(ddp_pg *pg, int (*run)(ddp_pg *, ddp_work *),
                   void (*complete)(ddp_pg *, ddp_work *)) {
  pg->run = run;
  pg->complete = complete;
  if (pthread_create(&pg->p2p_thread, NULL, p2p_thread, pg) != 0)
    DDP_FAIL(DDP_ERR_MEMORY, "init_process_group: cannot start the point-to-point thread");
  if (pthread_create(&pg->thread, NULL, comm_thread, pg) != 0) {
    stop_p2p(pg);
    DDP_FAIL(DDP_ERR_MEMORY, "init_process_group: cannot start the communication thread");
  }
  return DDP_OK;
}

void pg_queue_stop(ddp_pg *pg) {
  pthread_mutex_lock(&pg->lock);
  pg->stop = 1;
  pthread_cond_signal(&pg->cv);
  pthread_mutex_unlock(&pg->lock);
  pthread_join(pg->thread, NULL);
  /* The communication thread posted its last message: now drain the point-to-point ones. */
  stop_p2p(pg);
}

int pg_queue_submit(ddp_work **handle, ddp_pg *pg, ddp_work *w) {
  pthread_mutex_lock(&pg->lock);
  int failed = pg->failed, stopped = pg->stop;
  char first[PG_MSG_CAP];
  if (failed) snprintf(first, sizeof first, "%s", pg->failure);
  int ahead = 0;
  /* Note [inline collectives] */
  int run_here = !failed && !stopped && !handle && !pg->head && !pg->busy &&
                 pg->backend->can_inline && pg->backend->can_inline(pg, w);
  if (run_here) {
    w->timeout_s = pg->timeout_s + 10.0;
    pg->busy = 1;
  } else if (!failed && !stopped) {
    for (ddp_work *q = pg->head; q; q = q->next) ahead++;
    w->timeout_s = pg->timeout_s * (ahead + 1) + 10.0;
    if (pg->tail) pg->tail->next = w;
    else pg->head = w;
    pg->tail = w;
    pthread_cond_signal(&pg->cv);
  }
  pthread_mutex_unlock(&pg->lock);
  if (failed || stopped) {
    const char *op = pg_op_names[w->kind];
    int me = pg->global[pg->rank];
    w->refs = 1;
    pg_work_unref(w);
    if (failed)
      DDP_FAIL(failed, "%s on rank %d: the process group was aborted: %s", op, me, first);
    DDP_FAIL(DDP_ERR_STATE, "%s on rank %d: the process group is being destroyed", op, me);
  }
  if (run_here) {
    int grad = ddp_set_grad_enabled(0);
    if (!run_item(pg, w)) pg_work_unref(w); /* the queue's reference */
    ddp_set_grad_enabled(grad);
    pthread_mutex_lock(&pg->lock);
    pg->busy = 0;
    if (pg->head) pthread_cond_signal(&pg->cv); /* submitted by another thread meanwhile */
    pthread_mutex_unlock(&pg->lock);
  }
  if (handle) {
    *handle = w;
    return DDP_OK;
  }
  int status = ddp_work_wait(w, 0);
  ddp_work_free(w);
  return status;
}

int pg_queue_wait(ddp_work *w, double timeout_s) {
  if (timeout_s <= 0) timeout_s = w->timeout_s;
  struct timespec until = deadline_after(timeout_s);
  pthread_mutex_lock(&w->mu);
  int rc = 0;
  while (!w->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&w->cv, &w->mu, &until);
  int done = w->done, status = w->status;
  char msg[PG_MSG_CAP];
  if (done && status) snprintf(msg, sizeof msg, "%s", w->msg);
  pthread_mutex_unlock(&w->mu);
  if (!done)
    DDP_FAIL(DDP_ERR_TIMEOUT, "wait: %s did not complete within %g s (the work goes on)",
             pg_op_names[w->kind], timeout_s);
  if (status) DDP_FAIL(status, "%s", msg);
  return DDP_OK;
}

int pg_queue_is_completed(ddp_work *w) {
  pthread_mutex_lock(&w->mu);
  int done = w->done;
  pthread_mutex_unlock(&w->mu);
  return done;
}
