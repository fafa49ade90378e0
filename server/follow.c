/* follow.c - see follow.h. The follower thread owns its client of the
 * primary; what the thread and the other threads share (figures, the
 * promotion asked, the batch handed to the apply thread) is under mu. A
 * batch is one reply's records, in the reply's own buffer, applied by one
 * run on the apply thread (batch_run) while the next FETCH is already
 * under way. */
#define _GNU_SOURCE
#include "follow.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "../client/internal.h"
#include "apply.h"
#include "copy.h"
#include "durable.h"
#include "feed.h"
#include "redo.h"

#define WAIT_MS 400             /* a FETCH is held at most this long */
#define CALL_TIMEOUT_MS 10000   /* a call's reply, beyond that wait */
#define MAX_BYTES (16u << 20)   /* records per reply (at least one) */
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 2000
#define JOIN_LOG_EVERY_NS (5ull * 1000000000ull)
#define JOIN_WAIT_MS 10000 /* a restart waits this long for its primary */

struct embps_follow {
  embps_server_t *srv;
  uint64_t id; /* this process, for the primary's sessions */
  char name[EMBPS_ADDR_MAX];
  pthread_t thread;
  int started;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* stop, a batch done; CLOCK_MONOTONIC */
  int stop;
  embps_request_t *promote; /* the PROMOTE waiting for the thread's end */
  /* the primary followed (mu): --follow, or what the coordinator says
   * (empty: none known yet); retarget: it changed, reconnect */
  char target[EMBPS_ADDR_MAX];
  int retarget, exited;
  uint32_t target_epoch; /* the epoch etcd granted target (0: --follow) */
  uint32_t min_epoch; /* a promotion's epoch is at least this (mu) */
  int need_copy; /* the primary lacks our next record: copy it (thread) */
  /* (mu) set when a primary answered that it no longer holds our next
   * record: this server's state is not its primary's until a copy is in
   * and a reply finds it at the primary's last LSN (or a primary that
   * still held its records fed it that far); meanwhile it may not be
   * elected (embps_follow_copying); set at start too when the data dir
   * holds the mark of a copy this server was making (copy.h) */
  int copying;
  embps_copy_t *copy; /* being installed (apply thread, in install_run) */
  /* figures (mu) */
  int connected, halted, confirmed;
  char why[EMBPS_MESSAGE_MAX + 64]; /* the last error, for stats and logs */
  uint64_t primary_last, primary_lag_ms, behind_ns, received;
  /* the batch at the apply thread (mu for done) */
  embps_request_t batch;
  const uint8_t *buf;
  size_t len;
  uint32_t n;
  int done;
  char err[EMBPS_MESSAGE_MAX];
  /* apply thread only */
  embps_redo_t redo;
  int redo_ready;
};

static embps_follow_t *of_batch(embps_request_t *req) {
  return (embps_follow_t *)((char *)req - offsetof(embps_follow_t, batch));
}

/* How long a call to the primary may take. Coordinated, it is bounded
 * by the lease: a primary frozen (SIGSTOP) holds its follower's FETCH
 * open, and a promotion waits for the follower thread to let go of it,
 * on the coordinator's thread, which must renew its lease meanwhile. */
static int call_timeout_ms(const embps_server_t *srv) {
  int ms = CALL_TIMEOUT_MS;
  if (srv->cfg.coordinator[0] && (int)srv->cfg.lease_ms / 4 < ms)
    ms = (int)srv->cfg.lease_ms / 4;
  return WAIT_MS + ms;
}

/* Sleeps ms unless stop or a new target is asked; returns stop. mu
 * held. */
static int nap_locked(embps_follow_t *fw, int ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  while (!fw->stop && !fw->retarget &&
         pthread_cond_timedwait(&fw->cv, &fw->mu, &ts) != ETIMEDOUT) {
  }
  return fw->stop;
}

/* The primary followed now ("" none). Any thread. */
static void target_copy(embps_follow_t *fw, char *out, size_t cap) {
  pthread_mutex_lock(&fw->mu);
  snprintf(out, cap, "%s", fw->target);
  pthread_mutex_unlock(&fw->mu);
}

static void set_why(embps_follow_t *fw, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_why(embps_follow_t *fw, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&fw->mu);
  vsnprintf(fw->why, sizeof fw->why, fmt, ap);
  pthread_mutex_unlock(&fw->mu);
  va_end(ap);
}

/* ------------------------------------------------------------ apply */

/* The redo state of a follower: every table it holds now, by incarnation
 * (the records after them apply to every row). Apply thread. */
static int redo_setup(embps_follow_t *fw, embps_apply_ctx_t *ctx) {
  embps_redo_init(&fw->redo, fw->srv, &fw->srv->registry, &ctx->seen);
  embps_table_t **v;
  size_t n;
  if (embps_registry_refs(&fw->srv->registry, &v, &n))
    return -1;
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    if (!rc)
      rc = embps_redo_add_table(&fw->redo, v[i],
                                embps_table_incarnation(v[i]), 0, NULL);
    embps_table_unref(v[i]); /* the registry holds them */
  }
  free(v);
  fw->redo_ready = !rc;
  if (rc)
    embps_redo_close(&fw->redo);
  return rc;
}

/* The run of a batch: each record, in order and strictly after the last
 * LSN applied, is written to this server's log (and feed) and applied
 * with redo.c. A record that does not follow, check or apply stops the
 * batch with fw->err set (the follower stops). */
static void batch_run(embps_apply_ctx_t *ctx, embps_request_t *req) {
  embps_follow_t *fw = of_batch(req);
  char err[EMBPS_MESSAGE_MAX] = "";
  if (!fw->redo_ready && redo_setup(fw, ctx))
    snprintf(err, sizeof err, "out of memory");
  size_t off = 0;
  for (uint32_t i = 0; !err[0] && i < fw->n; i++) {
    embps_wal_rec_t rec;
    char why[256];
    /* checked when it came (check_reply) */
    size_t k = embps_wal_parse(fw->buf + off, fw->len - off, 1, &rec, why,
                               sizeof why);
    if (!k) {
      snprintf(err, sizeof err, "record %u of the batch: %s", i, why);
    } else if (rec.lsn != ctx->lsn + 1) {
      snprintf(err, sizeof err, "record LSN %" PRIu64 " where %" PRIu64
               " was expected", rec.lsn, ctx->lsn + 1);
    } else if (rec.epoch < ctx->epoch) {
      snprintf(err, sizeof err, "record LSN %" PRIu64 " of epoch %u after "
               "epoch %u", rec.lsn, rec.epoch, ctx->epoch);
    } else if (embps_durable_log_copy(ctx, &rec, fw->buf + off, why,
                                      sizeof why)) {
      snprintf(err, sizeof err, "LSN %" PRIu64 " not logged: %s", rec.lsn,
               why);
    } else if (embps_redo_apply(&fw->redo, &rec, why, sizeof why)) {
      snprintf(err, sizeof err, "LSN %" PRIu64 " does not apply: %s",
               rec.lsn, why);
    }
    off += k;
  }
  pthread_mutex_lock(&fw->mu);
  snprintf(fw->err, sizeof fw->err, "%s", err);
  fw->done = 1;
  pthread_cond_broadcast(&fw->cv);
  pthread_mutex_unlock(&fw->mu);
}

/* The run of an install: the copy replaces the tables, and the redo
 * state of the old ones goes. */
static void install_run(embps_apply_ctx_t *ctx, embps_request_t *req) {
  embps_follow_t *fw = of_batch(req);
  char err[EMBPS_MESSAGE_MAX] = "";
  if (fw->redo_ready) {
    embps_redo_close(&fw->redo);
    fw->redo_ready = 0;
  }
  if (embps_copy_install(fw->copy, ctx, err, sizeof err) && !err[0])
    snprintf(err, sizeof err, "install failed");
  pthread_mutex_lock(&fw->mu);
  snprintf(fw->err, sizeof fw->err, "%s", err);
  fw->done = 1;
  pthread_cond_broadcast(&fw->cv);
  pthread_mutex_unlock(&fw->mu);
}

/* Runs run (batch_run or install_run) on the apply thread and waits for
 * it. 0, or -1 with fw->err. */
static int on_apply(embps_follow_t *fw,
                    void (*run)(embps_apply_ctx_t *, embps_request_t *)) {
  pthread_mutex_lock(&fw->mu);
  fw->done = 0;
  fw->err[0] = 0;
  pthread_mutex_unlock(&fw->mu);
  memset(&fw->batch, 0, sizeof fw->batch);
  fw->batch.run = run;
  embps_apply_submit(fw->srv->apply, &fw->batch);
  pthread_mutex_lock(&fw->mu);
  while (!fw->done) /* not on stop: the apply thread runs it anyway */
    pthread_cond_wait(&fw->cv, &fw->mu);
  int rc = fw->err[0] ? -1 : 0;
  pthread_mutex_unlock(&fw->mu);
  return rc;
}

/* Applies n records of buf (len bytes) on the apply thread and waits for
 * them. 0, or -1 with fw->err. */
static int apply_batch(embps_follow_t *fw, const uint8_t *buf, size_t len,
                       uint32_t n) {
  pthread_mutex_lock(&fw->mu);
  fw->buf = buf;
  fw->len = len;
  fw->n = n;
  pthread_mutex_unlock(&fw->mu);
  return on_apply(fw, batch_run);
}

/* ------------------------------------------------------------ fetching */

/* A FETCH of the stream: from (0: after the previous one), acknowledging
 * what is applied and durable here. */
static int send_fetch(embps_follow_t *fw, embps_client_t *c, uint64_t stream,
                      uint64_t from, const embps_history_t *h,
                      uint64_t max_bytes, embps_ticket_t **t) {
  embps_server_t *srv = fw->srv;
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_FETCH;
  embps_fetch_t *q = &m.u.fetch;
  q->from_lsn = from;
  q->stream = stream;
  q->follower_id = fw->id;
  snprintf(q->name, sizeof q->name, "%s", fw->name);
  q->applied_lsn = embps_apply_lsn(srv->apply);
  q->durable_lsn = srv->dur ? embps_durable_lsn(srv->dur) : q->applied_lsn;
  q->max_bytes = max_bytes;
  q->wait_ms = WAIT_MS;
  if (h) {
    q->history = h->v;
    q->n_history = h->n;
  }
  return embps_client_send_(c, &m, t);
}

/* Adopts the primary's history when it says more than ours (a new epoch):
 * written to DIR/HISTORY before any record of it. 0, or -1 (logged). */
static int adopt_history(embps_follow_t *fw, const embps_fetch_reply_t *r,
                         const char *target) {
  embps_history_t mine, theirs = {.v = r->history, .n = r->n_history,
                                  .cap = r->n_history};
  if (embps_feed_history(fw->srv->feed, &mine))
    return -1;
  int same = mine.n == theirs.n;
  for (size_t i = 0; same && i < mine.n; i++)
    same = mine.v[i].epoch == theirs.v[i].epoch &&
           mine.v[i].start == theirs.v[i].start;
  embps_history_close(&mine);
  if (same)
    return 0;
  char err[1200];
  if (embps_durable_save_history(fw->srv->dur, &theirs, err, sizeof err) ||
      embps_feed_set_history(fw->srv->feed, &theirs)) {
    LOG_ERROR("follower: cannot keep the primary's history: %s", err);
    return -1;
  }
  LOG_INFO("follower: primary %s is in epoch %u", target,
           embps_history_epoch(&theirs));
  return 0;
}

/* Checks a reply against what was asked: its records start at `expect`
 * and fill its bulk exactly; the primary's layout is ours. 0, or -1 with
 * why (halt: another layout, this server cannot follow it at all). */
static int check_reply(embps_follow_t *fw, const embps_fetch_reply_t *r,
                       const uint8_t *bulk, size_t len, uint64_t expect,
                       int *halt, char *why, size_t why_len) {
  *halt = 0;
  if (embps_copy_check_layout(&fw->srv->cfg, r->shards, r->cluster_size,
                              r->cluster_index, why, why_len)) {
    *halt = 1;
    return -1;
  }
  if (r->first_lsn != expect) {
    snprintf(why, why_len, "reply starts at LSN %" PRIu64 " where %" PRIu64
             " was expected", r->first_lsn, expect);
    return -1;
  }
  size_t off = 0;
  for (uint32_t i = 0; i < r->n_records; i++) {
    embps_wal_rec_t rec;
    char e[256];
    size_t k = embps_wal_parse(bulk + off, len - off, 0, &rec, e, sizeof e);
    if (!k || rec.lsn != expect + i) {
      snprintf(why, why_len, "record %u of a reply from LSN %" PRIu64 ": %s",
               i, expect, k ? "out of sequence" : e);
      return -1;
    }
    off += k;
  }
  if (off != len) {
    snprintf(why, why_len, "reply of %u records carries %zu bytes more",
             r->n_records, len - off);
    return -1;
  }
  return 0;
}

/* Notes what a reply says of the primary (last LSN, our lag); ours: the
 * reply's records went to this server's state (not to a copy aside),
 * which is then the primary's once at its last LSN. */
static void note_primary(embps_follow_t *fw, const embps_fetch_reply_t *r,
                         size_t bytes, int ours) {
  uint64_t applied = embps_apply_lsn(fw->srv->apply), now = embps_now_ns();
  pthread_mutex_lock(&fw->mu);
  fw->confirmed = 1;
  const int caught_up = ours && applied >= r->last_lsn && fw->copying;
  if (caught_up) {
    fw->copying = 0;
    LOG_INFO("follower: caught up with primary at LSN %" PRIu64 " after "
             "its copy: eligible again", applied);
  }
  fw->primary_last = r->last_lsn;
  fw->primary_lag_ms = r->lag_ms;
  fw->received += bytes;
  if (applied >= r->last_lsn)
    fw->behind_ns = 0;
  else if (!fw->behind_ns)
    fw->behind_ns = now;
  pthread_mutex_unlock(&fw->mu);
  if (caught_up)
    embps_copy_unmark(fw->srv);
}

/* What a connection's stream ends with (MISFIT: the primary's layout is
 * not this server's, a configuration error). */
enum { RECONNECT = 0, HALT = -1, COPY = 1, MISFIT = -2 };

/* Installs the copy once it may go in: written (--data-dir), then
 * swapped in on the apply thread. 0 (done or not yet), or -1 with
 * fw->why set (following must stop: the state may be the copy's). */
static int install_if_ready(embps_follow_t *fw, embps_copy_t **cp) {
  if (!*cp || !embps_copy_ready(*cp))
    return 0;
  char err[EMBPS_MESSAGE_MAX];
  if (embps_copy_prepare(*cp, err, sizeof err)) {
    set_why(fw, "cannot keep the copy of the primary: %s", err);
    return -1;
  }
  fw->copy = *cp;
  int rc = on_apply(fw, install_run);
  fw->copy = NULL;
  if (rc) {
    set_why(fw, "the copy of the primary did not go in: %s", fw->err);
    return -1;
  }
  *cp = NULL; /* the caller frees it (the old tables) */
  return 0;
}

/* One connection's stream: FETCHes two in flight, each reply applied
 * before the next is asked for; with cp, to the copy first, until it is
 * installed. Returns RECONNECT when the connection fails (or on stop, or
 * a new target), COPY when the primary no longer holds our next record,
 * HALT when following must stop (fw->why). */
static int stream(embps_follow_t *fw, embps_client_t *c, const char *target,
                  embps_copy_t *cp) {
  embps_server_t *srv = fw->srv;
  uint64_t id;
  if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
    id = embps_now_ns();
  uint64_t expect = (cp ? embps_copy_lsn(cp) : embps_apply_lsn(srv->apply)) +
                    1;
  embps_history_t h;
  embps_history_init(&h);
  int rc = cp ? embps_history_copy(&h, embps_copy_history(cp))
              : embps_feed_history(srv->feed, &h);
  if (rc)
    return RECONNECT;
  embps_ticket_t *t[2] = {NULL, NULL};
  rc = send_fetch(fw, c, id, expect, &h, MAX_BYTES, &t[0]);
  if (!rc)
    rc = send_fetch(fw, c, id, 0, NULL, MAX_BYTES, &t[1]);
  embps_history_close(&h);
  int result = RECONNECT;
  if (!rc && install_if_ready(fw, &cp)) /* nothing after its LSN S */
    rc = result = HALT;
  while (!rc) {
    pthread_mutex_lock(&fw->mu);
    int stop = fw->stop || fw->retarget;
    const uint32_t min_epoch = fw->target_epoch;
    pthread_mutex_unlock(&fw->mu);
    if (stop)
      break;
    embps_msg_t m;
    uint8_t *bulk;
    size_t len;
    uint64_t err_lsn;
    rc = embps_client_wait_(c, t[0], &m, &bulk, &len, &err_lsn);
    t[0] = t[1];
    t[1] = NULL;
    if (rc == EMBPS_ESNAPSHOT) {
      set_why(fw, "%s", embps_client_last_error(c));
      (void)embps_copy_mark(srv, target); /* kept across a restart */
      pthread_mutex_lock(&fw->mu);
      fw->copying = 1;
      pthread_mutex_unlock(&fw->mu);
      result = cp ? RECONNECT : COPY; /* a copy's records gone: again */
      break;
    }
    if (rc == EMBPS_EDIVERGED || rc == EMBPS_ENOTPRIMARY) {
      set_why(fw, "%s", embps_client_last_error(c));
      /* coordinated: a server that is not primary (yet, or any more) is
         asked again until the coordinator names another */
      result = rc == EMBPS_ENOTPRIMARY && srv->cfg.coordinator[0] ? RECONNECT
                                                                  : HALT;
      break;
    }
    if (rc) {
      set_why(fw, "%s", embps_client_last_error(c));
      break;
    }
    const embps_fetch_reply_t *r = &m.u.fetch_reply;
    char why[EMBPS_MESSAGE_MAX];
    int halt;
    if (check_reply(fw, r, bulk, len, expect, &halt, why, sizeof why)) {
      set_why(fw, "primary %s: %s", target, why);
      result = halt ? MISFIT : RECONNECT;
      rc = -1;
    } else if (r->epoch < min_epoch) {
      /* a deposed primary (frozen, cut off) still answering: none of its
         records is taken once a newer epoch was granted */
      set_why(fw, "%s answers in epoch %u, older than the epoch %u granted "
              "to it or since: its records are refused", target, r->epoch,
              min_epoch);
      rc = -1;
    } else if (cp) { /* to the copy, which may then go in */
      if (r->n_records &&
          embps_copy_apply(cp, bulk, len, r->n_records, why, sizeof why)) {
        set_why(fw, "primary %s: %s", target, why);
        rc = -1;
      } else if (install_if_ready(fw, &cp)) {
        result = HALT;
        rc = -1;
      } else {
        expect += r->n_records;
        note_primary(fw, r, len, 0);
        rc = send_fetch(fw, c, id, 0, NULL, MAX_BYTES, &t[1]);
      }
    } else if (adopt_history(fw, r, target)) {
      result = HALT;
      set_why(fw, "cannot record the primary's history");
      rc = -1;
    } else if (r->n_records && apply_batch(fw, bulk, len, r->n_records)) {
      set_why(fw, "primary %s: %s", target, fw->err);
      result = HALT;
      rc = -1;
    } else {
      expect += r->n_records;
      if (r->n_records && embps_durable_syncs(srv->dur)) {
        char e[512]; /* acknowledged only once durable here */
        (void)embps_durable_wait(srv->dur, expect - 1, e, sizeof e);
      }
      note_primary(fw, r, len, 1);
      rc = send_fetch(fw, c, id, 0, NULL, MAX_BYTES, &t[1]);
    }
    embps_msg_free(&m);
    free(bulk);
  }
  embps_client_cancel_(c, t[0]);
  embps_client_cancel_(c, t[1]);
  return result;
}

/* Whether the thread must stop (embps_copy_load's question). */
static int stopping(void *ctx) {
  embps_follow_t *fw = ctx;
  pthread_mutex_lock(&fw->mu);
  int stop = fw->stop || fw->retarget; /* a new primary: copy that one */
  pthread_mutex_unlock(&fw->mu);
  return stop;
}

/* A connection to a primary that no longer holds our next record: its
 * history asked (a probe), a copy of its state made (copy.h), then the
 * stream from the copy's LSN. Returns as stream does. */
static int copy_and_stream(embps_follow_t *fw, embps_client_t *c,
                           const char *target) {
  embps_ticket_t *t;
  embps_msg_t m;
  uint8_t *bulk = NULL;
  size_t len;
  int rc = send_fetch(fw, c, 0, 0, NULL, 0, &t);
  if (!rc)
    rc = embps_client_wait_(c, t, &m, &bulk, &len, NULL);
  free(bulk);
  if (rc) {
    set_why(fw, "%s", embps_client_last_error(c));
    return rc == EMBPS_ENOTPRIMARY && !fw->srv->cfg.coordinator[0]
               ? HALT
               : RECONNECT;
  }
  embps_history_t h = {.v = m.u.fetch_reply.history,
                       .n = m.u.fetch_reply.n_history,
                       .cap = m.u.fetch_reply.n_history};
  embps_copy_t *cp;
  int halt;
  char err[EMBPS_MESSAGE_MAX];
  rc = embps_copy_load(fw->srv, target, &h, stopping, fw, &cp, &halt, err,
                       sizeof err);
  embps_msg_free(&m);
  if (rc) {
    set_why(fw, "primary %s: %s", target, err);
    return halt ? MISFIT : RECONNECT;
  }
  int result = stream(fw, c, target, cp);
  embps_copy_free(cp);
  return result == COPY ? RECONNECT : result;
}

static void *follow_main(void *arg) {
  embps_follow_t *fw = arg;
  embps_server_t *srv = fw->srv;
  int backoff = BACKOFF_MIN_MS;
  uint64_t logged_ns = 0;
  pthread_mutex_lock(&fw->mu);
  while (!fw->stop) {
    char target[EMBPS_ADDR_MAX];
    snprintf(target, sizeof target, "%s", fw->target);
    fw->retarget = 0;
    if (!target[0]) { /* coordinated, no primary known yet */
      snprintf(fw->why, sizeof fw->why, "no primary elected yet");
      nap_locked(fw, 1000);
      continue;
    }
    pthread_mutex_unlock(&fw->mu);
    char err[EMBPS_MESSAGE_MAX + 64] = "";
    embps_client_t *c = NULL;
    int rc = embps_copy_connect(srv, target, call_timeout_ms(srv), &c, err,
                                sizeof err);
    int halt = 0, misfit = 0;
    if (rc) {
      set_why(fw, "cannot reach primary %s: %s", target, err);
    } else {
      pthread_mutex_lock(&fw->mu);
      fw->connected = 1;
      pthread_mutex_unlock(&fw->mu);
      LOG_INFO("follower: following %s from LSN %" PRIu64, target,
               embps_apply_lsn(srv->apply) + 1);
      uint64_t before = embps_apply_lsn(srv->apply);
      int r = fw->need_copy ? copy_and_stream(fw, c, target)
                            : stream(fw, c, target, NULL);
      if (r == MISFIT) { /* no restart can mend it: the server stops */
        LOG_ERROR("follower: cannot follow %s: %s; stopping (exit status "
                  "%d)", target, fw->why, EMBPS_SERVER_EXIT_CONFIG);
        atomic_store(&srv->exit_status, EMBPS_SERVER_EXIT_CONFIG);
        srv->stop(srv);
        r = HALT;
        misfit = 1;
      }
      halt = r == HALT;
      fw->need_copy = r == COPY;
      if (embps_apply_lsn(srv->apply) > before || r == COPY)
        backoff = BACKOFF_MIN_MS; /* it made progress, or copies now */
      embps_client_destroy(c);
    }
    pthread_mutex_lock(&fw->mu);
    fw->connected = 0;
    if (halt) {
      fw->halted = 1;
      if (!misfit)
        LOG_ERROR("follower: stopped following %s: %s (reads go on from "
                  "LSN %" PRIu64 ")", target, fw->why,
                  embps_apply_lsn(srv->apply));
      if (srv->rejoin && !fw->stop && !misfit) { /* coordinated: again */
        char why[sizeof fw->why];
        snprintf(why, sizeof why, "%s", fw->why);
        pthread_mutex_unlock(&fw->mu);
        srv->rejoin(srv, why);
        pthread_mutex_lock(&fw->mu);
      }
      while (!fw->stop && !fw->retarget)
        pthread_cond_wait(&fw->cv, &fw->mu);
      if (fw->stop)
        break;
      fw->halted = 0;
      continue;
    }
    if (fw->stop)
      break;
    if (fw->retarget) { /* the new primary may hold our next record */
      fw->need_copy = 0;
      continue;
    }
    if (fw->need_copy) { /* at once, on a connection of its own */
      LOG_INFO("follower: %s", fw->why);
      continue;
    }
    uint64_t now = embps_now_ns();
    if (now - logged_ns > JOIN_LOG_EVERY_NS) {
      LOG_WARN("follower: %s; again in %d ms", fw->why, backoff);
      logged_ns = now;
    }
    nap_locked(fw, backoff);
    backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
  }
  embps_request_t *promote = fw->promote;
  fw->exited = 1;
  pthread_mutex_unlock(&fw->mu);
  if (promote) /* after every batch handed over: the FIFO keeps order */
    embps_apply_submit(srv->apply, promote);
  return NULL;
}

/* ------------------------------------------------------------ promote */

/* The run of a PROMOTE, on the apply thread after every record the
 * follower applied: epoch + 1 from the next LSN, recorded, then writes
 * are taken. */
static void promote_run(embps_apply_ctx_t *ctx, embps_request_t *req) {
  embps_server_t *srv = ctx->srv;
  embps_follow_t *fw = srv->follow;
  embps_history_t h;
  char err[1200] = "";
  int rc = embps_feed_history(srv->feed, &h);
  /* above every epoch it heard of, its primary's later ones included
   * (records of those may exist where it never saw them) */
  uint32_t epoch = embps_history_epoch(&h);
  if (ctx->epoch > epoch)
    epoch = ctx->epoch;
  epoch++;
  char target[EMBPS_ADDR_MAX] = "";
  if (fw) {
    pthread_mutex_lock(&fw->mu);
    if (fw->min_epoch > epoch) /* the one the coordinator was granted */
      epoch = fw->min_epoch;
    snprintf(target, sizeof target, "%s", fw->target);
    pthread_mutex_unlock(&fw->mu);
  }
  while (h.n && h.v[h.n - 1].start > ctx->lsn + 1)
    h.n--; /* epochs its log holds no record of */
  if (!rc && embps_history_add(&h, epoch, ctx->lsn + 1))
    rc = -1;
  if (!rc && embps_durable_save_history(srv->dur, &h, err, sizeof err))
    rc = -1;
  if (!rc && embps_feed_set_history(srv->feed, &h))
    rc = -1;
  embps_history_close(&h);
  if (rc) {
    embps_request_fail(srv, req, EMBPS_EIO, "not promoted: cannot record "
                       "the new epoch: %s", err[0] ? err : "out of memory");
    LOG_ERROR("promotion failed: %s; this server no longer follows",
              err[0] ? err : "out of memory");
  } else {
    ctx->epoch = epoch;
    if (fw && fw->redo_ready) {
      embps_redo_close(&fw->redo);
      fw->redo_ready = 0;
    }
    embps_feed_promoted(srv->feed);
    atomic_store(&srv->role, EMBPS_ROLE_PRIMARY);
    LOG_INFO("promoted: primary of epoch %u from LSN %" PRIu64 " (followed "
             "%s up to LSN %" PRIu64 ")", epoch, ctx->lsn + 1,
             target[0] ? target : "no one", ctx->lsn);
    embps_msg_t m;
    memset(&m, 0, sizeof m);
    m.u.promote.epoch = epoch;
    m.u.promote.lsn = ctx->lsn;
    embps_request_reply(srv, req, EMBPS_KIND_PROMOTE, &m, 0);
  }
  req->complete(req);
}

int embps_follow_promote(embps_server_t *srv, embps_request_t *req) {
  embps_follow_t *fw = srv->follow;
  if (!fw || atomic_load(&srv->role) != EMBPS_ROLE_FOLLOWER) {
    embps_request_fail(srv, req, EMBPS_EINVAL, "this server is a primary "
                       "already: only a follower is promoted");
    return 0;
  }
  pthread_mutex_lock(&fw->mu);
  if (fw->promote) {
    pthread_mutex_unlock(&fw->mu);
    embps_request_fail(srv, req, EMBPS_EINVAL, "a promotion is under way");
    return 0;
  }
  req->run = promote_run;
  fw->promote = req;
  fw->stop = 1;
  pthread_cond_broadcast(&fw->cv);
  LOG_INFO("promotion asked: stopping to follow %s",
           fw->target[0] ? fw->target : "no one");
  pthread_mutex_unlock(&fw->mu);
  return 1;
}

/* A promotion the coordinator asks for, waited for on its thread. */
typedef struct {
  embps_request_t req; /* first: complete gets it */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
} sync_promote_t;

static void sync_promote_done(embps_request_t *req) {
  sync_promote_t *p = (sync_promote_t *)req;
  pthread_mutex_lock(&p->mu);
  p->done = 1;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

int embps_follow_promote_to(embps_server_t *srv, uint32_t epoch) {
  embps_follow_t *fw = srv->follow;
  if (!fw)
    return -1;
  sync_promote_t p;
  memset(&p, 0, sizeof p);
  pthread_mutex_init(&p.mu, NULL);
  pthread_cond_init(&p.cv, NULL);
  p.req.hdr.kind = EMBPS_KIND_PROMOTE;
  p.req.run = promote_run;
  p.req.complete = sync_promote_done;
  pthread_mutex_lock(&fw->mu);
  int busy = fw->promote != NULL && !fw->exited;
  if (!busy) {
    fw->min_epoch = epoch;
    if (fw->started && !fw->exited) { /* the thread hands it over */
      fw->promote = &p.req;
      fw->stop = 1;
      pthread_cond_broadcast(&fw->cv);
    }
  }
  int direct = !busy && (!fw->started || fw->exited);
  pthread_mutex_unlock(&fw->mu);
  if (busy) {
    LOG_WARN("promotion to epoch %u: another is under way", epoch);
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.cv);
    return -1;
  }
  if (direct) /* already promoted once (a new epoch), or never started */
    embps_apply_submit(srv->apply, &p.req);
  pthread_mutex_lock(&p.mu);
  while (!p.done)
    pthread_cond_wait(&p.cv, &p.mu);
  pthread_mutex_unlock(&p.mu);
  embps_frame_header_t h;
  int rc = p.req.reply && p.req.reply_len >= EMBPS_FRAME_HEADER_LEN &&
                   !embps_frame_header_decode(p.req.reply, SIZE_MAX, &h) &&
                   h.kind != EMBPS_KIND_ERROR
               ? 0
               : -1;
  free(p.req.reply);
  pthread_mutex_destroy(&p.mu);
  pthread_cond_destroy(&p.cv);
  return rc;
}

void embps_follow_retarget(embps_server_t *srv, const char *addr,
                           uint32_t epoch) {
  embps_follow_t *fw = srv->follow;
  if (!fw)
    return;
  pthread_mutex_lock(&fw->mu);
  if (epoch > fw->target_epoch)
    fw->target_epoch = epoch;
  if (strcmp(fw->target, addr)) {
    snprintf(fw->target, sizeof fw->target, "%s", addr);
    fw->retarget = 1;
    pthread_cond_broadcast(&fw->cv);
    LOG_INFO("follower: the primary to follow is %s now (epoch %u)", addr,
             epoch);
  }
  pthread_mutex_unlock(&fw->mu);
}

void embps_follow_primary(embps_server_t *srv, char *out, size_t cap) {
  if (srv->follow)
    target_copy(srv->follow, out, cap);
  else
    snprintf(out, cap, "%s", srv->cfg.follow);
}

/* ------------------------------------------------------------ probe */

int embps_follow_probe(embps_server_t *srv) {
  embps_follow_t *fw = srv->follow;
  if (!fw || !srv->cfg.follow[0])
    return 0;
  char why[EMBPS_MESSAGE_MAX + 64] = "";
  embps_client_t *c = NULL;
  int rc = embps_copy_connect(srv, srv->cfg.follow, call_timeout_ms(srv), &c,
                              why, sizeof why);
  embps_msg_t m;
  if (!rc) {
    embps_ticket_t *t;
    uint8_t *bulk = NULL;
    size_t len;
    rc = send_fetch(fw, c, 0, 0, NULL, 0, &t);
    if (!rc)
      rc = embps_client_wait_(c, t, &m, &bulk, &len, NULL);
    free(bulk);
    if (rc)
      snprintf(why, sizeof why, "%s", embps_client_last_error(c));
    embps_client_destroy(c);
  }
  if (rc) {
    LOG_WARN("follower: primary %s did not answer (%s): its --shards and "
             "cluster slot are checked when it does", srv->cfg.follow, why);
    return 0;
  }
  const embps_fetch_reply_t *r = &m.u.fetch_reply;
  rc = embps_copy_check_layout(&srv->cfg, r->shards, r->cluster_size,
                               r->cluster_index, why, sizeof why);
  embps_msg_free(&m);
  if (rc) {
    LOG_ERROR("cannot follow %s: %s", srv->cfg.follow, why);
    return EMBPS_SERVER_EMISFIT;
  }
  return 0;
}

/* ------------------------------------------------------------ join */

int embps_follow_join(void *ctx, const embps_history_t *h, uint64_t last,
                      uint64_t *keep, char *err, size_t err_len) {
  embps_server_t *srv = ctx;
  embps_follow_t *fw = srv->follow;
  *keep = last;
  if (!last)
    return 0;
  int backoff = BACKOFF_MIN_MS;
  const uint64_t until = embps_now_ns() + JOIN_WAIT_MS * 1000000ull;
  uint64_t logged_ns = 0;
  for (;;) {
    char why[EMBPS_MESSAGE_MAX + 64] = "";
    embps_client_t *c = NULL;
    int rc = embps_copy_connect(srv, srv->cfg.follow, call_timeout_ms(srv),
                                &c, why, sizeof why);
    if (!rc) {
      embps_ticket_t *t;
      embps_msg_t m;
      uint8_t *bulk = NULL;
      size_t len;
      uint64_t at = 0;
      rc = send_fetch(fw, c, 0, last + 1, h, 0, &t);
      if (!rc)
        rc = embps_client_wait_(c, t, &m, &bulk, &len, &at);
      if (!rc)
        embps_msg_free(&m);
      free(bulk);
      snprintf(why, sizeof why, "%s", embps_client_last_error(c));
      embps_client_destroy(c);
      if (!rc || rc == EMBPS_ESNAPSHOT) /* on its history */
        return 0;
      if (rc == EMBPS_EDIVERGED) {
        *keep = at;
        LOG_WARN("this server's log leaves the history of primary %s after "
                 "LSN %" PRIu64 " (it holds up to %" PRIu64 "): %s",
                 srv->cfg.follow, at, last, why);
        return 0;
      }
      if (rc == EMBPS_ENOTPRIMARY && srv->cfg.coordinator[0]) {
        /* what etcd said is already stale: the log as it is; following
           the one elected tells whether it must be cut (a rejoin) */
        LOG_WARN("%s is not primary any more (%s): starting from this "
                 "server's log as it is (up to LSN %" PRIu64 ")",
                 srv->cfg.follow, why, last);
        return 0;
      }
      if (rc == EMBPS_ENOTPRIMARY || rc == EMBPS_EAUTH) {
        snprintf(err, err_len, "--follow %s: %s", srv->cfg.follow, why);
        return -1;
      }
    }
    uint64_t now = embps_now_ns();
    if (now >= until) { /* it may be down for good: serve what is here */
      LOG_WARN("primary %s did not answer in %d ms (%s): starting from this "
               "server's log as it is (up to LSN %" PRIu64 "); if it left "
               "the primary's history, following stops and a restart cuts "
               "it", srv->cfg.follow, JOIN_WAIT_MS, why, last);
      return 0;
    }
    if (now - logged_ns > JOIN_LOG_EVERY_NS) {
      LOG_WARN("waiting for primary %s to say where this server's log (up "
               "to LSN %" PRIu64 ") joins its history: %s", srv->cfg.follow,
               last, why);
      logged_ns = now;
    }
    struct timespec ts = {backoff / 1000, (backoff % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
  }
}

/* ------------------------------------------------------------ lifecycle */

int embps_follow_create(embps_server_t *srv) {
  embps_follow_t *fw = calloc(1, sizeof *fw);
  if (!fw) {
    LOG_ERROR("out of memory");
    return -1;
  }
  fw->srv = srv;
  if (getrandom(&fw->id, sizeof fw->id, 0) != (ssize_t)sizeof fw->id)
    fw->id = embps_now_ns();
  snprintf(fw->name, sizeof fw->name, "%s:%d", srv->cfg.listen_host,
           srv->cfg.listen_port);
  pthread_mutex_init(&fw->mu, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&fw->cv, &attr);
  pthread_condattr_destroy(&attr);
  snprintf(fw->why, sizeof fw->why, "not connected yet");
  snprintf(fw->target, sizeof fw->target, "%s", srv->cfg.follow);
  fw->copying = embps_copy_marked(srv); /* stopped mid-copy: still not
                                           caught up */
  srv->follow = fw;
  return 0;
}

int embps_follow_run(embps_server_t *srv, int port) {
  embps_follow_t *fw = srv->follow;
  snprintf(fw->name, sizeof fw->name, "%s:%d", srv->cfg.listen_host, port);
  if (pthread_create(&fw->thread, NULL, follow_main, fw)) {
    LOG_ERROR("cannot start the follower thread");
    return -1;
  }
  fw->started = 1;
  return 0;
}

void embps_follow_destroy(embps_server_t *srv) {
  embps_follow_t *fw = srv->follow;
  if (!fw)
    return;
  pthread_mutex_lock(&fw->mu);
  fw->stop = 1;
  embps_request_t *promote = fw->started ? NULL : fw->promote;
  pthread_cond_broadcast(&fw->cv);
  pthread_mutex_unlock(&fw->mu);
  if (fw->started)
    pthread_join(fw->thread, NULL); /* it hands a promotion over */
  if (promote) {
    embps_request_fail(srv, promote, EMBPS_ESHUTDOWN, "server stopping");
    promote->complete(promote);
  }
  /* the redo state is the apply thread's: freed once nothing runs */
  srv->follow = NULL;
  if (fw->redo_ready)
    embps_redo_close(&fw->redo);
  pthread_mutex_destroy(&fw->mu);
  pthread_cond_destroy(&fw->cv);
  free(fw);
}

/* ------------------------------------------------------------ figures */

/* The lag in ms now. mu held. */
static uint64_t lag_ms_locked(const embps_follow_t *fw, uint64_t applied) {
  if (applied >= fw->primary_last)
    return 0;
  uint64_t mine = fw->behind_ns ? (embps_now_ns() - fw->behind_ns) / 1000000
                                : 0;
  return mine > fw->primary_lag_ms ? mine : fw->primary_lag_ms;
}

void embps_follow_stats(embps_server_t *srv, embps_server_stats_t *s) {
  embps_follow_t *fw = srv->follow;
  s->role = (uint32_t)atomic_load(&srv->role);
  s->epoch = embps_feed_epoch(srv->feed);
  s->applied_lsn = embps_apply_lsn(srv->apply);
  if (s->role != EMBPS_ROLE_FOLLOWER || !fw) {
    embps_feed_stats(srv->feed, s);
    return;
  }
  char target[EMBPS_ADDR_MAX];
  target_copy(fw, target, sizeof target);
  snprintf(s->primary, sizeof s->primary, "%.63s", target);
  pthread_mutex_lock(&fw->mu);
  s->lag_records =
      fw->primary_last > s->applied_lsn ? fw->primary_last - s->applied_lsn
                                        : 0;
  s->lag_ms = lag_ms_locked(fw, s->applied_lsn);
  s->bytes_shipped = fw->received;
  pthread_mutex_unlock(&fw->mu);
}

size_t embps_follow_followers(embps_server_t *srv, embps_follower_info_t *v,
                              size_t cap) {
  return embps_feed_followers(srv->feed, v, cap);
}

int embps_follow_copying(embps_server_t *srv) {
  embps_follow_t *fw = srv->follow;
  if (!fw)
    return 0;
  pthread_mutex_lock(&fw->mu);
  int copying = fw->copying;
  pthread_mutex_unlock(&fw->mu);
  return copying;
}

int embps_follow_ready(embps_server_t *srv, char *why, size_t why_len) {
  embps_follow_t *fw = srv->follow;
  if (!fw || atomic_load(&srv->role) != EMBPS_ROLE_FOLLOWER)
    return 1;
  uint64_t applied = embps_apply_lsn(srv->apply);
  pthread_mutex_lock(&fw->mu);
  int ready = 0;
  if (fw->halted)
    snprintf(why, why_len, "not following %s any more: %s", fw->target,
             fw->why);
  else if (!fw->confirmed)
    snprintf(why, why_len, "no answer from primary %s yet: %s",
             fw->target[0] ? fw->target : "(none elected)", fw->why);
  else if (fw->copying)
    snprintf(why, why_len, "copying the state of primary %s (it no longer "
             "holds the records after LSN %" PRIu64 ")", fw->target, applied);
  else if (lag_ms_locked(fw, applied) > srv->cfg.max_lag_ms)
    snprintf(why, why_len, "%" PRIu64 " ms (%" PRIu64 " records) behind "
             "primary %s, more than --max-lag-ms %u",
             lag_ms_locked(fw, applied), fw->primary_last - applied,
             fw->target, srv->cfg.max_lag_ms);
  else
    ready = 1;
  pthread_mutex_unlock(&fw->mu);
  return ready;
}
