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
 * duplicate without being applied again.
 *
 * CREATE and DROP run here too, and with --data-dir every mutation gets the
 * next LSN and is logged between table prepare and commit (durable.h); a
 * CHECKPOINT marker hands the state at its LSN to the checkpoint thread. */
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "durable.h"
#include "evict.h"
#include "route.h"
#include "rows.h"
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
  atomic_int draining; /* shutting down: no synchronous push is held any
                        * more (read by apply_one without the lock) */
  embps_scratch_t scratch;
  embps_sync_t sync;
  seen_t *seen; /* open addressing on client id; client 0 = empty */
  size_t seen_cap, seen_n;
  uint64_t lsn; /* of the last mutation logged (--data-dir) */
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

/* Applies one step to req->table (prepare, log, commit); on success
 * records every request's (client, seq) and replies "applied" to each of
 * `reqs` (linked list). Returns the LSN to acknowledge at (0: now). */
static uint64_t apply_step(embps_apply_t *a, embps_request_t *reqs,
                           embps_table_t *table, const int64_t *idx,
                           const float *vals, size_t n) {
  embps_server_t *srv = a->srv;
  embps_durable_t *dur = srv->dur;
  char msg[2048];
  uint64_t lsn = 0;
  const char *failed = dur ? embps_durable_failed(dur) : NULL;
  int rc = failed ? EMBPS_EIO : 0;
  if (failed)
    snprintf(msg, sizeof msg, "%s", failed);
  if (!rc)
    rc = embps_table_prepare(table, &a->scratch.table, idx, n,
                             srv->cfg.max_memory);
  if (!rc && dur) {
    embps_table_info_t info;
    embps_table_info(table, &info);
    rc = embps_durable_log_push(dur, a->lsn + 1, table, info.step + 1, reqs,
                                idx, vals, n, msg, sizeof msg);
    if (!rc)
      lsn = ++a->lsn;
  }
  if (!rc)
    embps_table_commit(table, &a->scratch.table, idx, vals, n, lsn);
  for (embps_request_t *req = reqs; req; req = req->next) {
    const embps_push_t *p = &req->msg.u.push;
    if (rc == EMBPS_EIO) {
      embps_request_fail(srv, req, rc, "%s", msg);
    } else if (rc == EMBPS_ELIMIT) {
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
  return lsn;
}

/* Completes every request of reqs; with --data-dir, once the log is
 * durable up to lsn (--fsync always). */
static void complete_all(embps_apply_t *a, embps_request_t *reqs,
                         uint64_t lsn) {
  while (reqs) {
    embps_request_t *next = reqs->next;
    reqs->next = NULL;
    if (a->srv->dur && lsn)
      embps_durable_ack(a->srv->dur, reqs, lsn);
    else
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

/* ---- dropped synchronous tables ---- */

/* 1 while t is the table its name designates (not dropped). */
static int table_alive(void *ctx, embps_table_t *t) {
  embps_apply_t *a = ctx;
  embps_table_t *now =
      embps_registry_get(&a->srv->registry, embps_table_spec(t)->name);
  embps_table_unref(now);
  return now == t;
}

static void fail_dropped(void *ctx, embps_request_t *req) {
  embps_apply_t *a = ctx;
  embps_request_fail(a->srv, req, EMBPS_ENOTABLE, "table \"%s\" was dropped "
                     "before synchronous step %llu completed",
                     embps_table_spec(req->table)->name,
                     (unsigned long long)req->msg.u.push.step);
  req->complete(req);
}

/* Handles one push from the queue and completes whatever it finishes: the
 * push itself, or, for a synchronous table, the whole step it completes. */
static void apply_one(embps_apply_t *a, embps_request_t *req) {
  embps_server_t *srv = a->srv;
  const embps_push_t *p = &req->msg.u.push;
  if (already_applied(a, p->client_id, p->seq)) {
    push_reply(srv, req, 1, 1); /* acknowledged once what it saw is durable */
    complete_all(a, req, a->lsn);
    return;
  }
  if (srv->dur) { /* dropped since dispatch: its pushes are not logged */
    embps_table_t *now = embps_registry_get(&srv->registry, p->table);
    embps_table_unref(now);
    if (now != req->table) {
      embps_request_fail(srv, req, EMBPS_ENOTABLE, "table \"%s\" was "
                         "dropped", p->table);
      complete_all(a, req, 0);
      return;
    }
  }
  if (!embps_table_spec(req->table)->sync_workers) {
    uint64_t lsn =
        apply_step(a, req, req->table, req->idx, req->vals, req->n_unique);
    complete_all(a, req, lsn);
    return;
  }
  if (a->draining) {
    fail_shutdown(a, req);
    return;
  }
  if (!table_alive(a, req->table)) {
    fail_dropped(a, req);
    return;
  }
  embps_request_t *ready = NULL;
  const int64_t *idx = NULL;
  const float *vals = NULL;
  size_t n = 0;
  int rc = embps_sync_offer(&a->sync, srv, req, &ready, &idx, &vals, &n);
  if (rc < 0) {
    complete_all(a, req, 0);
  } else if (rc == 1) {
    uint64_t lsn = apply_step(a, ready, req->table, idx, vals, n);
    complete_all(a, ready, lsn);
  } else if (rc == 2) {
    complete_all(a, ready, 0);
  } /* rc == 0: held until the step's other pushes arrive */
}

/* CREATE or DROP: done, then logged; a table whose record cannot be
 * logged is dropped again, so the log and the registry never disagree. */
static void apply_ddl(embps_apply_t *a, embps_request_t *req) {
  embps_server_t *srv = a->srv;
  embps_durable_t *dur = srv->dur;
  char msg[2048];
  const char *failed = dur ? embps_durable_failed(dur) : NULL;
  if (failed) {
    embps_request_fail(srv, req, EMBPS_EIO, "%s", failed);
    complete_all(a, req, 0);
    return;
  }
  if (req->hdr.kind == EMBPS_KIND_ALTER) {
    int logged = embps_dispatch_alter(srv, req, a->lsn + 1);
    complete_all(a, req, logged > 0 ? ++a->lsn : 0);
    return;
  }
  int create = req->hdr.kind == EMBPS_KIND_CREATE;
  const char *name = create ? req->msg.u.spec.name : req->msg.u.name;
  embps_table_t *t = create ? NULL : embps_registry_get(&srv->registry, name);
  int rc = create ? embps_dispatch_create(srv, req)
                  : embps_dispatch_drop(srv, req);
  if (!create && !rc) /* its held synchronous pushes fail now */
    embps_sync_forget(&a->sync, table_alive, fail_dropped, a);
  if (create && !rc)
    t = embps_registry_get(&srv->registry, name);
  uint64_t lsn = 0;
  if (!rc && dur && t) {
    if (create)
      embps_table_set_incarnation(t, a->lsn + 1);
    rc = create ? embps_durable_log_create(dur, a->lsn + 1, t, msg, sizeof msg)
                : embps_durable_log_drop(dur, a->lsn + 1, t, msg, sizeof msg);
    if (rc) {
      if (create)
        embps_registry_drop(&srv->registry, name);
      else
        LOG_ERROR("table \"%s\" dropped but not logged: it returns at the "
                  "next restart", name);
      embps_request_fail(srv, req, rc, "%s", msg);
    } else {
      lsn = ++a->lsn;
    }
  }
  embps_table_unref(t);
  complete_all(a, req, lsn);
}

/* A checkpoint marker: the state at this LSN goes to the checkpoint thread
 * (the exactly-once table copied here; tables and rows there). */
static void apply_marker(embps_apply_t *a) {
  embps_evict_at_checkpoint(a->srv, &a->lsn);
  embps_ckpt_seen_t *v = malloc((a->seen_n ? a->seen_n : 1) * sizeof *v);
  size_t n = 0;
  for (size_t i = 0; v && i < a->seen_cap; i++)
    if (a->seen[i].client)
      v[n++] = (embps_ckpt_seen_t){a->seen[i].client, a->seen[i].seq};
  if (!v)
    LOG_WARN("no memory to copy the exactly-once table: the checkpoint "
             "holds none");
  embps_durable_on_marker(a->srv->dur, a->lsn, v, n);
}

/* WRITE_ROWS (import): one mutation, logged like a push. */
static void apply_rows(embps_apply_t *a, embps_request_t *req) {
  uint64_t lsn =
      embps_rows_apply(a->srv, req, &a->scratch.table, a->lsn + 1);
  if (lsn)
    a->lsn = lsn;
  complete_all(a, req, lsn);
}

void embps_apply_seen_note(embps_apply_t *a, uint64_t client, uint64_t seq) {
  if (!already_applied(a, client, seq))
    seen_record(a, client, seq);
}

void embps_apply_set_lsn(embps_apply_t *a, uint64_t lsn) { a->lsn = lsn; }

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

static void *apply_main(void *arg) {
  embps_apply_t *a = arg;
  omp_team_setup(&a->srv->cfg);
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
    req->next = NULL; /* complete_all follows next: this is one request */
    pthread_mutex_unlock(&a->mu);
    embps_metrics_queue(-1);
    if (req->hdr.kind == EMBPS_KIND_PUSH)
      apply_one(a, req);
    else if (req->hdr.kind == EMBPS_KIND_CHECKPOINT)
      apply_marker(a);
    else if (req->hdr.kind == EMBPS_KIND_WRITE_ROWS)
      apply_rows(a, req);
    else if (req->hdr.kind == EMBPS_KIND_EVICT)
      complete_all(a, req, embps_evict_request(a->srv, req, &a->lsn));
    else
      apply_ddl(a, req);
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
