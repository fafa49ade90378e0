/* apply.c - the apply thread: the only writer of table rows.
 *
 * Validated, merged pushes arrive on a FIFO from every I/O thread and are
 * applied one at a time, in arrival order, each as one optimizer step; a
 * large push updates its shards in parallel with OpenMP (table.c). A single
 * writer makes the step counter, exactly-once bookkeeping and (later) the
 * log trivially consistent, and leaves the I/O threads free for pulls.
 *
 * Exactly once: a push may carry (client_id, seq). The highest seq applied
 * per client is remembered; a push at or below it is acknowledged as a
 * duplicate without being applied again. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "route.h"
#include "server.h"
#include "sync.h"

#define SEEN_MAX (1u << 20) /* clients remembered before the map is reset */

typedef struct {
  uint64_t client, seq;
} seen_t;

struct embps_apply {
  embps_server_t *srv;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  embps_request_t *head, *tail;
  int stopping;
  int draining; /* shutting down: no synchronous push is held any more */
  embps_scratch_t scratch;
  embps_sync_t sync;
  seen_t *seen; /* open addressing on client id; client 0 = empty */
  size_t seen_cap, seen_n;
};

static seen_t *seen_slot(embps_apply_t *a, uint64_t client) {
  size_t mask = a->seen_cap - 1;
  size_t h = embps_mix64(client) & mask;
  while (a->seen[h].client && a->seen[h].client != client)
    h = (h + 1) & mask;
  return &a->seen[h];
}

/* Records seq for client; on allocation failure exactly-once degrades to
 * at-least-once for that client, which the log says. */
static void seen_record(embps_apply_t *a, uint64_t client, uint64_t seq) {
  if (a->seen_n + 1 > a->seen_cap / 2) {
    size_t cap = a->seen_cap ? 2 * a->seen_cap : 1024;
    if (a->seen_n >= SEEN_MAX) {
      LOG_WARN("exactly-once table full (%zu clients): reset", a->seen_n);
      cap = 1024;
      a->seen_n = 0;
      free(a->seen);
      a->seen = NULL;
      a->seen_cap = 0;
    }
    seen_t *old = a->seen;
    size_t old_cap = a->seen_cap;
    seen_t *v = calloc(cap, sizeof *v);
    if (!v) {
      LOG_WARN("no memory to remember client %llx",
               (unsigned long long)client);
      return;
    }
    a->seen = v;
    a->seen_cap = cap;
    for (size_t i = 0; i < old_cap; i++)
      if (old[i].client)
        *seen_slot(a, old[i].client) = old[i];
    free(old);
  }
  seen_t *s = seen_slot(a, client);
  if (!s->client) {
    s->client = client;
    a->seen_n++;
  }
  s->seq = seq;
}

static int already_applied(embps_apply_t *a, uint64_t client, uint64_t seq) {
  if (!client || !seq || !a->seen_cap)
    return 0;
  seen_t *s = seen_slot(a, client);
  return s->client == client && seq <= s->seq;
}

static void push_reply(embps_server_t *srv, embps_request_t *req, int applied,
                       int duplicate) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_PUSH | EMBPS_KIND_REPLY;
  m.u.push_reply.applied = applied;
  m.u.push_reply.duplicate = duplicate;
  m.u.push_reply.n_unique = (uint32_t)req->n_unique;
  if (embps_frame_build(&m, req->hdr.req_id, 0, &req->reply, &req->reply_len,
                        NULL))
    embps_request_fail(srv, req, EMBPS_ENOMEM, "out of memory");
}

/* Applies one step to req->table; on success records every request's
 * (client, seq) and replies "applied" to each of `reqs` (linked list). */
static void apply_step(embps_apply_t *a, embps_request_t *reqs,
                       embps_table_t *table, const int64_t *idx,
                       const float *vals, size_t n) {
  embps_server_t *srv = a->srv;
  int rc = embps_table_apply(table, &a->scratch.table, idx, vals, n,
                             srv->cfg.max_memory);
  for (embps_request_t *req = reqs; req; req = req->next) {
    const embps_push_t *p = &req->msg.u.push;
    if (rc == EMBPS_ELIMIT) {
      embps_request_fail(srv, req, rc, "--max-memory %llu bytes reached; "
                         "push refused, nothing changed",
                         (unsigned long long)srv->cfg.max_memory);
    } else if (rc) {
      embps_request_fail(srv, req, rc, "push refused, nothing changed: %s",
                         embps_strerror(rc));
    } else {
      if (p->client_id && p->seq)
        seen_record(a, p->client_id, p->seq);
      atomic_fetch_add_explicit(&srv->counters.pushes, 1,
                                memory_order_relaxed);
      atomic_fetch_add_explicit(&srv->counters.push_rows, req->n_unique,
                                memory_order_relaxed);
      embps_metrics_pushed(req);
      push_reply(srv, req, 1, 0);
    }
  }
}

static void complete_all(embps_request_t *reqs) {
  while (reqs) {
    embps_request_t *next = reqs->next;
    reqs->next = NULL;
    reqs->complete(reqs);
    reqs = next;
  }
}

/* A synchronous push still waiting for its step when the server stops. */
static void fail_shutdown(void *ctx, embps_request_t *req) {
  embps_apply_t *a = ctx;
  embps_request_fail(a->srv, req, EMBPS_ESHUTDOWN, "server stopping before "
                     "the synchronous step completed");
  req->complete(req);
}

/* Handles one push from the queue and completes whatever it finishes: the
 * push itself, or, for a synchronous table, the whole step it completes. */
static void apply_one(embps_apply_t *a, embps_request_t *req) {
  embps_server_t *srv = a->srv;
  const embps_push_t *p = &req->msg.u.push;
  req->next = NULL;
  if (already_applied(a, p->client_id, p->seq)) {
    push_reply(srv, req, 1, 1);
    complete_all(req);
    return;
  }
  if (!embps_table_spec(req->table)->sync_workers) {
    apply_step(a, req, req->table, req->idx, req->vals, req->n_unique);
    complete_all(req);
    return;
  }
  if (a->draining) {
    fail_shutdown(a, req);
    return;
  }
  embps_request_t *ready = NULL;
  const int64_t *idx = NULL;
  const float *vals = NULL;
  size_t n = 0;
  int rc = embps_sync_offer(&a->sync, srv, req, &ready, &idx, &vals, &n);
  if (rc < 0) {
    complete_all(req);
  } else if (rc == 1) {
    apply_step(a, ready, req->table, idx, vals, n);
    complete_all(ready);
  } else if (rc == 2) {
    complete_all(ready);
  } /* rc == 0: held until the step's other pushes arrive */
}

static void *apply_main(void *arg) {
  embps_apply_t *a = arg;
  pthread_mutex_lock(&a->mu);
  for (;;) {
    while (!a->head && !a->stopping && a->draining != 1)
      pthread_cond_wait(&a->cv, &a->mu);
    if (a->draining == 1) { /* release held synchronous pushes */
      a->draining = 2;
      pthread_mutex_unlock(&a->mu);
      embps_sync_close(&a->sync, fail_shutdown, a);
      embps_sync_init(&a->sync);
      pthread_mutex_lock(&a->mu);
      continue;
    }
    embps_request_t *req = a->head;
    if (!req)
      break; /* stopping and drained */
    a->head = req->next;
    if (!a->head)
      a->tail = NULL;
    pthread_mutex_unlock(&a->mu);
    embps_metrics_queue(-1);
    apply_one(a, req);
    pthread_mutex_lock(&a->mu);
  }
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

int embps_apply_start(embps_server_t *srv, embps_apply_t **out) {
  embps_apply_t *a = calloc(1, sizeof *a);
  if (!a)
    return -ENOMEM;
  a->srv = srv;
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cv, NULL);
  embps_table_scratch_init(&a->scratch.table);
  embps_dedup_init(&a->scratch.dedup);
  embps_sync_init(&a->sync);
  int rc = pthread_create(&a->thread, NULL, apply_main, a);
  if (rc) {
    free(a);
    return -rc;
  }
  *out = a;
  return 0;
}

void embps_apply_submit(embps_apply_t *a, embps_request_t *req) {
  req->next = NULL;
  pthread_mutex_lock(&a->mu);
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
  embps_sync_close(&a->sync, fail_shutdown, a);
  embps_table_scratch_close(&a->scratch.table);
  embps_dedup_close(&a->scratch.dedup);
  free(a->seen);
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->cv);
  free(a);
}
