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
#include <stddef.h>
#include <stdlib.h>
#include <time.h>

#include "server.h"
#include "watchdog.h"

struct embps_apply {
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC: parked runs' deadlines */
  embps_request_t *head, *tail; /* both NULL, or head..tail linked */
  int stopping;
  int draining; /* 1: asked, 2: done (the thread failed the held pushes) */
  int kicked;   /* embps_apply_kick since the parked runs last ran */
  int drained;  /* the thread's copy of draining == 2, for its runs */
  embps_apply_ctx_t ctx;
};

/* The marker next_locked returns to have the parked runs run again. */
static embps_request_t rerun_marker;

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

/* Whether the parked runs must run again now: kicked, the first one's
 * deadline passed, or shutdown (they refuse then). mu held. */
static int parked_due_locked(const embps_apply_t *a) {
  const embps_request_t *p = a->ctx.parked_head;
  return p && (a->kicked || a->drained || a->stopping ||
               embps_now_ns() >= p->deadline_ns);
}

/* The next request, unlinked (&rerun_marker: run the parked ones again);
 * NULL once stopping and drained. Waits for one otherwise (until the
 * first parked run's deadline), failing the held synchronous pushes on
 * the way when a drain was asked. mu held. */
static embps_request_t *next_locked(embps_apply_t *a) {
  for (;;) {
    while (!a->head && !a->stopping && a->draining != 1 &&
           !parked_due_locked(a)) {
      if (!a->ctx.parked_head) {
        pthread_cond_wait(&a->cv, &a->mu);
        continue;
      }
      uint64_t at = a->ctx.parked_head->deadline_ns;
      struct timespec ts = {(time_t)(at / 1000000000u),
                            (long)(at % 1000000000u)};
      pthread_cond_timedwait(&a->cv, &a->mu, &ts);
    }
    if (a->draining == 1) {
      a->draining = 2;
      a->drained = 1;
      pthread_mutex_unlock(&a->mu);
      embps_sync_drain(&a->ctx.sync, a->ctx.srv);
      pthread_mutex_lock(&a->mu);
      continue;
    }
    if (parked_due_locked(a)) {
      a->kicked = 0;
      if (a->stopping)
        a->drained = 1; /* the parked runs refuse, as at a drain */
      return &rerun_marker;
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

/* Runs every parked request again, in order; each finishes or parks
 * again (behind the ones before it that did). */
static void rerun_parked(embps_apply_ctx_t *ctx) {
  embps_request_t *req = ctx->parked_head;
  ctx->parked_head = ctx->parked_tail = NULL;
  while (req) {
    embps_request_t *next = req->next;
    req->next = NULL;
    req->run(ctx, req);
    req = next;
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
    if (req == &rerun_marker) {
      rerun_parked(&a->ctx);
    } else {
      embps_metrics_queue(-1);
      a->ctx.runs++;
      req->run(&a->ctx, req);
    }
    embps_watch_busy(watch, 0);
    atomic_store_explicit(&a->ctx.applied, a->ctx.lsn, memory_order_release);
    pthread_mutex_lock(&a->mu);
  }
  pthread_mutex_unlock(&a->mu);
  assert(!a->ctx.parked_head); /* stopping reran them: they refused */
  embps_watch_stop(watch);
  return NULL;
}

void embps_apply_park(embps_apply_ctx_t *ctx, embps_request_t *req,
                      uint64_t deadline_ns) {
  req->deadline_ns = deadline_ns;
  req->next = NULL;
  if (ctx->parked_tail)
    ctx->parked_tail->next = req;
  else
    ctx->parked_head = req;
  ctx->parked_tail = req;
}

void embps_apply_kick(embps_apply_t *a) {
  pthread_mutex_lock(&a->mu);
  a->kicked = 1;
  pthread_cond_signal(&a->cv);
  pthread_mutex_unlock(&a->mu);
}

int embps_apply_draining(const embps_apply_ctx_t *ctx) {
  const embps_apply_t *a =
      (const embps_apply_t *)((const char *)ctx - offsetof(embps_apply_t, ctx));
  return a->drained; /* written by this thread only */
}

uint64_t embps_apply_lsn(const embps_apply_t *a) {
  return atomic_load_explicit(&a->ctx.applied, memory_order_acquire);
}

int embps_apply_start(embps_server_t *srv, embps_apply_t **out) {
  embps_apply_t *a = calloc(1, sizeof *a);
  if (!a)
    return -ENOMEM;
  a->ctx.srv = srv;
  pthread_mutex_init(&a->mu, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&a->cv, &attr);
  pthread_condattr_destroy(&attr);
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

void embps_apply_restore(embps_apply_t *a, uint64_t lsn, uint32_t epoch,
                         embps_seen_t *seen) {
  pthread_mutex_lock(&a->mu);
  assert(!a->head && !a->ctx.lsn);
  a->ctx.lsn = lsn;
  a->ctx.epoch = epoch;
  atomic_store(&a->ctx.applied, lsn);
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
