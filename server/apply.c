/* apply.c - the apply thread (apply.h): a FIFO of requests from every
 * thread, run one at a time in arrival order by req->run.
 *
 * A single writer makes the step counter, the LSN order of the log and
 * the exactly-once bookkeeping trivially consistent, and leaves the I/O
 * threads free for pulls; a large push still updates its shards in
 * parallel, with this thread's OpenMP team (table.c). */
#include "apply.h"

#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>

#include "server.h"
#include "watchdog.h"

struct embps_apply {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  embps_request_t *head, *tail; /* both NULL, or head..tail linked */
  int stopping;
  int draining; /* 1: asked, 2: done (the thread failed the held pushes) */
  embps_apply_ctx_t ctx;
};

/* OpenMP's thread count is a per-thread setting: set it here, on the
 * thread whose parallel regions apply pushes, and log the team it gets. */
static void omp_team_setup(const embps_server_config_t *cfg) {
  if (cfg->omp_threads)
    omp_set_num_threads((int)cfg->omp_threads);
  int team = 0;
#pragma omp parallel
  {
#pragma omp single
    team = omp_get_num_threads();
  }
  LOG_INFO("apply thread: OpenMP team of %d threads", team);
}

/* The next request, unlinked; NULL once stopping and drained. Waits for
 * one otherwise, failing the held synchronous pushes on the way when a
 * drain was asked. mu held. */
static embps_request_t *next_locked(embps_apply_t *a) {
  for (;;) {
    while (!a->head && !a->stopping && a->draining != 1)
      pthread_cond_wait(&a->cv, &a->mu);
    if (a->draining == 1) {
      a->draining = 2;
      pthread_mutex_unlock(&a->mu);
      embps_sync_drain(&a->ctx.sync, a->ctx.srv);
      pthread_mutex_lock(&a->mu);
      continue;
    }
    embps_request_t *req = a->head;
    assert(!a->head == !a->tail);
    if (!req)
      return NULL;
    a->head = req->next;
    if (!a->head)
      a->tail = NULL;
    else
      assert(req != a->tail);
    req->next = NULL; /* runs follow next: this is one request */
    return req;
  }
}

static void *apply_main(void *arg) {
  embps_apply_t *a = arg;
  omp_team_setup(&a->ctx.srv->cfg);
  embps_watch_t *watch = embps_watch_start("apply", 0); /* /healthz */
  pthread_mutex_lock(&a->mu);
  for (embps_request_t *req; (req = next_locked(a));) {
    pthread_mutex_unlock(&a->mu);
    embps_watch_busy(watch, 1);
    embps_metrics_queue(-1);
    a->ctx.runs++;
    req->run(&a->ctx, req);
    embps_watch_busy(watch, 0);
    pthread_mutex_lock(&a->mu);
  }
  pthread_mutex_unlock(&a->mu);
  embps_watch_stop(watch);
  return NULL;
}

int embps_apply_start(embps_server_t *srv, embps_apply_t **out) {
  embps_apply_t *a = calloc(1, sizeof *a);
  if (!a)
    return -ENOMEM;
  a->ctx.srv = srv;
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  embps_table_scratch_init(&a->ctx.scratch);
  embps_seen_init(&a->ctx.seen);
  embps_sync_init(&a->ctx.sync);
  int rc = pthread_create(&a->thread, NULL, apply_main, a);
  if (rc) {
    embps_sync_close(&a->ctx.sync, srv);
    embps_table_scratch_close(&a->ctx.scratch);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
    return -rc;
  }
  *out = a;
  return 0;
}

void embps_apply_restore(embps_apply_t *a, uint64_t lsn, embps_seen_t *seen) {
  pthread_mutex_lock(&a->mu);
  assert(!a->head && !a->ctx.lsn);
  a->ctx.lsn = lsn;
  embps_seen_move(&a->ctx.seen, seen);
  pthread_mutex_unlock(&a->mu);
}

void embps_apply_submit(embps_apply_t *a, embps_request_t *req) {
  assert(req->run);
  req->next = NULL;
  pthread_mutex_lock(&a->mu);
  assert(!a->head == !a->tail && (!a->tail || !a->tail->next));
  if (a->tail)
    a->tail->next = req;
  else
    a->head = req;
  a->tail = req;
  pthread_cond_signal(&a->cv);
  pthread_mutex_unlock(&a->mu);
  embps_metrics_queue(1);
}

void embps_apply_drain(embps_apply_t *a) {
  pthread_mutex_lock(&a->mu);
  if (!a->draining)
    a->draining = 1;
  pthread_cond_signal(&a->cv);
  pthread_mutex_unlock(&a->mu);
}

void embps_apply_stop(embps_apply_t *a) {
  if (!a)
    return;
  pthread_mutex_lock(&a->mu);
  a->stopping = 1;
  pthread_cond_signal(&a->cv);
  pthread_mutex_unlock(&a->mu);
  pthread_join(a->thread, NULL);
  embps_sync_close(&a->ctx.sync, a->ctx.srv);
  embps_table_scratch_close(&a->ctx.scratch);
  embps_seen_close(&a->ctx.seen);
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->cv);
  free(a);
}
