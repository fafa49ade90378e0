/* durable.c - see durable.h: the data dir's lock, restore (the newest
 * checkpoint, then the log replayed through redo.c), the log records
 * written (payloads in redo.h), acknowledgements after the log, and the
 * checkpoint thread with its marker. */
#define _GNU_SOURCE
#include "durable.h"

#include <assert.h>
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "failpoint.h"
#include "feed.h"
#include "marker.h"
#include "optim.h"
#include "redo.h"
#include "space.h"

typedef struct {
  uint64_t unix_s, bytes, ms, lsn;
} ckpt_info_t;

struct embps_durable {
  embps_server_t *srv;
  embps_durable_hooks_t hooks;
  char dir[1024], log_dir[1100];
  int lock_fd;
  int unsafe_ack;
  embps_wal_t *wal;
  /* the checkpoint thread */
  pthread_t thread;
  int thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;        /* CLOCK_MONOTONIC */
  embps_request_t *pending; /* CHECKPOINT requests for the next one */
  int stopping;
  embps_request_t marker;   /* goes through the apply FIFO */
  int marker_done;
  embps_ckpt_t snap;        /* filled by the apply thread at the marker */
  char marker_err[1024];
  ckpt_info_t last;
  uint64_t next_due_ns;     /* periodic checkpoints; 0: none */
  /* space.h: checkpoints for the log's size and for room, retried after a
   * failure no sooner than retry_ns (the wait doubling up to a minute) */
  embps_space_t space;
  int space_ready;
  uint64_t retry_ns, backoff_ns;
  const char *why;          /* what the checkpoint being taken is for */
  embps_log_limit_t refusals; /* one ERROR line a second for refused logs */
  /* snapshot sessions keep the records after their marker (mu) */
  struct {
    uint64_t id, lsn; /* id 0: a free slot */
  } pins[EMBPS_DURABLE_PINS];
  uint64_t next_pin;
};

/* ------------------------------------------------------------ helpers */

static const char *fsync_name(embps_fsync_t m) {
  return m == EMBPS_FSYNC_ALWAYS ? "always"
         : m == EMBPS_FSYNC_NEVER ? "never" : "everysec";
}

/* ------------------------------------------------------------ records */

const char *embps_durable_failed(embps_durable_t *d) {
  return d ? embps_wal_failed(d->wal) : NULL;
}

int embps_durable_syncs(const embps_durable_t *d) {
  return d && d->srv->cfg.fsync == EMBPS_FSYNC_ALWAYS && !d->unsafe_ack;
}

uint64_t embps_durable_lsn(embps_durable_t *d) {
  return embps_durable_syncs(d) ? embps_wal_synced(d->wal)
                                : embps_wal_written(d->wal);
}

int embps_durable_wait(embps_durable_t *d, uint64_t lsn, char *err,
                       size_t err_len) {
  return embps_wal_sync(d->wal, lsn, err, err_len);
}

/* Whether a record must be built: for the log or for the feed. Otherwise
 * the mutation only takes its LSN (no copy, no checksum). */
static int record_wanted(const embps_apply_ctx_t *ctx) {
  return ctx->srv->dur || embps_feed_active(ctx->srv->feed);
}

/* Wakes the checkpoint thread: a checkpoint may be due (space.h). */
static void wake_checkpoints(embps_durable_t *d) {
  pthread_mutex_lock(&d->mu);
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
}

/* A log write was refused (msg): logged at ERROR, one line a second. */
static void log_refusal(embps_durable_t *d, const char *msg) {
  uint64_t skipped;
  if (embps_log_limit_pass(&d->refusals, 1000, &skipped))
    LOG_ERROR("%s (%" PRIu64 " more refused since the last such line)", msg,
              skipped);
}

/* Appends one record of header head (type: its type) to d's log; records
 * that make rows (pushes, imports) only into the room the next checkpoint
 * leaves (space.h). 0, or EMBPS_EIO with msg. */
static int log_record(embps_durable_t *d, uint32_t type,
                      const uint8_t head[EMBPS_WAL_HEADER_BYTES],
                      const struct iovec *parts, int n, char *msg,
                      size_t msg_len) {
  const char *failed = embps_wal_failed(d->wal);
  if (failed) {
    snprintf(msg, msg_len, "%s", failed);
    return EMBPS_EIO;
  }
  const int rows = type == EMBPS_WAL_PUSH || type == EMBPS_WAL_ROWS;
  uint64_t bytes = EMBPS_WAL_HEADER_BYTES;
  for (int i = 0; i < n; i++)
    bytes += parts[i].iov_len;
  if (rows && embps_space_admit(&d->space, bytes, msg, msg_len)) {
    log_refusal(d, msg);
    wake_checkpoints(d);
    return EMBPS_EIO;
  }
  int rc = embps_wal_append(d->wal, head, parts, n, msg, msg_len);
  if (rc) {
    if (embps_space_write_failed(&d->space, -rc))
      wake_checkpoints(d);
    log_refusal(d, msg);
    return EMBPS_EIO;
  }
  if (embps_space_logged(&d->space, bytes, rows))
    wake_checkpoints(d);
  return 0;
}

/* Makes the record of type and payload parts at ctx->lsn + 1: the log,
 * the feed, then ctx->lsn. 0, or EMBPS_EIO with msg. */
static int emit(embps_apply_ctx_t *ctx, uint32_t type,
                const struct iovec *parts, int n, char *msg, size_t msg_len) {
  embps_server_t *srv = ctx->srv;
  embps_durable_t *d = srv->dur;
  const uint64_t lsn = ctx->lsn + 1;
  const int feed = embps_feed_active(srv->feed);
  if (d || feed) {
    uint8_t head[EMBPS_WAL_HEADER_BYTES];
    if (embps_wal_head(head, type, lsn, ctx->epoch, parts, n, msg, msg_len))
      return EMBPS_EIO;
    if (d && log_record(d, type, head, parts, n, msg, msg_len))
      return EMBPS_EIO;
    if (feed)
      embps_feed_append(srv->feed, head, parts, n);
  }
  embps_apply_logged(ctx, lsn);
  return 0;
}

/* The mutation needs no record: it only takes its LSN. (A feed made
 * active meanwhile misses it: its backlog starts after it.) */
static int emit_bare(embps_apply_ctx_t *ctx, char *msg, size_t msg_len) {
  (void)msg;
  (void)msg_len;
  embps_apply_logged(ctx, ctx->lsn + 1);
  return 0;
}

int embps_durable_log_push(embps_apply_ctx_t *ctx, embps_table_t *table,
                           uint64_t step, const embps_request_t *reqs,
                           const int64_t *idx, const float *vals, size_t n,
                           char *msg, size_t msg_len) {
  if (!record_wanted(ctx))
    return emit_bare(ctx, msg, msg_len);
  uint64_t pairs_small[2 * 8], *pairs = pairs_small;
  uint32_t n_pairs = 0;
  for (const embps_request_t *r = reqs; r; r = r->next)
    n_pairs++;
  if (n_pairs > 8 && !(pairs = malloc(n_pairs * 16))) {
    snprintf(msg, msg_len, "out of memory logging a push");
    return EMBPS_EIO;
  }
  uint32_t i = 0;
  for (const embps_request_t *r = reqs; r; r = r->next, i++) {
    pairs[2 * i] = r->msg.u.push.client_id;
    pairs[2 * i + 1] = r->msg.u.push.seq;
  }
  const embps_table_spec_t *spec = embps_table_spec(table);
  uint8_t head[EMBPS_REDO_PUSH_HEAD] = {0};
  uint64_t inc = embps_table_incarnation(table);
  uint32_t rows = (uint32_t)n, dim = spec->dim, flags = 0, ev[2] = {0, 0};
  const int64_t *evicted = NULL;
  if (spec->ttl_steps || spec->max_rows) { /* the evictions it decided */
    flags |= EMBPS_REDO_PUSH_EVICTIONS;
    if (embps_table_planned(table, &ctx->scratch, &evicted, &ev[0],
                            &ev[1])) {
      if (pairs != pairs_small)
        free(pairs);
      snprintf(msg, msg_len, "out of memory logging a push");
      return EMBPS_EIO;
    }
  }
  memcpy(head, &inc, 8);
  memcpy(head + 8, &step, 8);
  memcpy(head + 16, &n_pairs, 4);
  memcpy(head + 20, &rows, 4);
  memcpy(head + 24, &dim, 4);
  memcpy(head + 28, &flags, 4);
  struct iovec parts[6] = {
      {head, sizeof head},
      {pairs, (size_t)n_pairs * 16},
      {(void *)idx, n * sizeof *idx},
      {(void *)vals, n * dim * sizeof *vals},
      {ev, flags ? sizeof ev : 0},
      {(void *)evicted, ((size_t)ev[0] + ev[1]) * sizeof *evicted},
  };
  int rc = emit(ctx, EMBPS_WAL_PUSH, parts, 6, msg, msg_len);
  if (pairs != pairs_small)
    free(pairs);
  if (!rc && ctx->srv->dur)
    embps_failpoint("log-after-write");
  return rc;
}

int embps_durable_log_rows(embps_apply_ctx_t *ctx, embps_table_t *table,
                           const int64_t *ids, const float *w,
                           const float *state, size_t n, int set_step,
                           uint64_t step, char *msg, size_t msg_len) {
  if (!record_wanted(ctx))
    return emit_bare(ctx, msg, msg_len);
  const embps_table_spec_t *s = embps_table_spec(table);
  uint8_t head[EMBPS_REDO_ROWS_HEAD] = {0};
  uint64_t inc = embps_table_incarnation(table);
  uint32_t flags = set_step ? EMBPS_REDO_ROWS_SET_STEP : 0, rows = (uint32_t)n;
  uint32_t dim = s->dim;
  uint32_t sf = state ? embps_optim_state_per_weight(s->optimizer) : 0;
  memcpy(head, &inc, 8);
  memcpy(head + 8, &step, 8);
  memcpy(head + 16, &flags, 4);
  memcpy(head + 20, &rows, 4);
  memcpy(head + 24, &dim, 4);
  memcpy(head + 28, &sf, 4);
  struct iovec parts[4] = {
      {head, sizeof head},
      {(void *)ids, n * sizeof *ids},
      {(void *)w, n * dim * sizeof *w},
      {(void *)state, n * sf * dim * sizeof *w},
  };
  return emit(ctx, EMBPS_WAL_ROWS, parts, 4, msg, msg_len);
}

/* A CREATE or ALTER record: the incarnation, then spec packed. */
static int log_spec(embps_apply_ctx_t *ctx, uint32_t type,
                    embps_table_t *table, const embps_table_spec_t *spec,
                    char *msg, size_t msg_len) {
  if (!record_wanted(ctx))
    return emit_bare(ctx, msg, msg_len);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_CREATE;
  m.u.spec = *spec;
  size_t len = embps_msg_size(&m);
  uint8_t *buf = malloc(8 + len);
  if (!buf) {
    snprintf(msg, msg_len, "out of memory logging a table");
    return EMBPS_EIO;
  }
  uint64_t inc = embps_table_incarnation(table);
  memcpy(buf, &inc, 8);
  embps_msg_pack(&m, buf + 8);
  struct iovec part = {buf, 8 + len};
  int rc = emit(ctx, type, &part, 1, msg, msg_len);
  free(buf);
  return rc;
}

int embps_durable_log_create(embps_apply_ctx_t *ctx, embps_table_t *table,
                             char *msg, size_t msg_len) {
  return log_spec(ctx, EMBPS_WAL_CREATE, table, embps_table_spec(table), msg,
                  msg_len);
}

int embps_durable_log_alter(embps_apply_ctx_t *ctx, embps_table_t *table,
                            const embps_table_spec_t *spec, char *msg,
                            size_t msg_len) {
  return log_spec(ctx, EMBPS_WAL_ALTER, table, spec, msg, msg_len);
}

int embps_durable_log_drop(embps_apply_ctx_t *ctx, embps_table_t *table,
                           char *msg, size_t msg_len) {
  uint64_t inc = embps_table_incarnation(table);
  struct iovec part = {&inc, 8};
  return emit(ctx, EMBPS_WAL_DROP, &part, 1, msg, msg_len);
}

int embps_durable_log_evict(embps_apply_ctx_t *ctx, embps_table_t *table,
                            char *msg, size_t msg_len) {
  embps_table_info_t info;
  embps_table_info(table, &info);
  uint64_t v[2] = {embps_table_incarnation(table), info.step};
  struct iovec part = {v, sizeof v};
  return emit(ctx, EMBPS_WAL_EVICT, &part, 1, msg, msg_len);
}

int embps_durable_log_copy(embps_apply_ctx_t *ctx, const embps_wal_rec_t *rec,
                           const uint8_t head[EMBPS_WAL_HEADER_BYTES],
                           char *msg, size_t msg_len) {
  embps_server_t *srv = ctx->srv;
  embps_durable_t *d = srv->dur;
  struct iovec part = {(void *)rec->payload, rec->len};
  assert(rec->lsn == ctx->lsn + 1);
  if (d && log_record(d, rec->type, head, &part, 1, msg, msg_len))
    return EMBPS_EIO;
  if (embps_feed_active(srv->feed))
    embps_feed_append(srv->feed, head, &part, 1);
  embps_apply_logged(ctx, rec->lsn);
  ctx->epoch = rec->epoch;
  return 0;
}

/* After the log: the followers' acknowledgement, then the reply. */
static void ack_after_log(embps_server_t *srv, embps_request_t *req) {
  if (req->ack_lsn && embps_feed_syncs(srv->feed))
    embps_feed_wait(srv->feed, req, req->ack_lsn);
  else
    req->complete(req);
}

/* The log's completion of a request waiting in it (req->wal): an error
 * turns the reply into EIO. */
static void wal_done(void *ctx, embps_wal_waiter_t *waiter, const char *err) {
  embps_durable_t *d = ctx;
  embps_request_t *req =
      (embps_request_t *)((char *)waiter - offsetof(embps_request_t, wal));
  if (err) {
    embps_request_fail(d->srv, req, EMBPS_EIO, "%s", err);
    req->complete(req);
    return;
  }
  ack_after_log(d->srv, req);
}

void embps_durable_ack(embps_apply_ctx_t *ctx, embps_request_t *reqs,
                       uint64_t lsn) {
  embps_server_t *srv = ctx->srv;
  embps_durable_t *d = srv->dur;
  const int wait = lsn && embps_durable_syncs(d);
  while (reqs) {
    embps_request_t *req = reqs;
    reqs = req->next;
    req->next = NULL;
    req->ack_lsn = lsn;
    if (wait)
      embps_wal_wait(d->wal, &req->wal, lsn);
    else
      ack_after_log(srv, req);
  }
}

int embps_durable_save_history(embps_durable_t *d, const embps_history_t *h,
                               char *err, size_t err_len) {
  return d ? embps_history_save(d->dir, h, err, err_len) : 0;
}

/* ------------------------------------------------------------ checkpoints */

static int log_sync(void *ctx, uint64_t lsn, char *err, size_t err_len) {
  embps_durable_t *d = ctx;
  return embps_wal_sync(d->wal, lsn, err, err_len);
}

/* The marker's run, on the apply thread: the core's own work first
 * (hooks.at_marker: the L2 eviction), then the state at ctx->lsn for the
 * checkpoint thread: the exactly-once table copied here, the tables
 * referenced with their steps and specs (their rows are copied there,
 * shard by shard), and the log rotated so the checkpoint can delete the
 * segments it covers. */
static void marker_run(embps_apply_ctx_t *ctx, embps_request_t *req) {
  embps_durable_t *d =
      (embps_durable_t *)((char *)req - offsetof(embps_durable_t, marker));
  if (d->hooks.at_marker)
    d->hooks.at_marker(ctx);
  d->marker_err[0] = 0;
  if (!embps_marker_take(ctx, &d->snap, d->marker_err, sizeof d->marker_err)) {
    embps_space_marker(&d->space);
    embps_wal_rotate(d->wal, ctx->lsn + 1, d->marker_err,
                     sizeof d->marker_err);
  }
  d->snap.log_sync = log_sync;
  d->snap.log_ctx = d;
  pthread_mutex_lock(&d->mu);
  d->marker_done = 1;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
}

/* The checkpoints older than ckpt-lsn and the log segments it covers
 * go, but for the records a snapshot session pins and those a follower
 * fetching lately has not applied (feed.h). */
static void delete_covered(embps_durable_t *d, uint64_t lsn) {
  embps_ckpt_delete_older(d->dir, lsn);
  pthread_mutex_lock(&d->mu);
  uint64_t keep = lsn; /* the log's records after a pin stay */
  for (int i = 0; i < EMBPS_DURABLE_PINS; i++)
    if (d->pins[i].id && d->pins[i].lsn < keep)
      keep = d->pins[i].lsn;
  pthread_mutex_unlock(&d->mu);
  const uint64_t followers = embps_feed_retain(d->srv->feed);
  if (followers < keep && /* and those a follower fetching lately lacks, */
      atomic_load(&d->space.state) == EMBPS_SPACE_OK) /* room allowing */
    keep = followers;
  embps_wal_delete_upto(d->log_dir, keep);
}

/* Takes one checkpoint (checkpoint thread). 0, or -1 with err. */
static int checkpoint_once(embps_durable_t *d, char *err, size_t err_len) {
  uint64_t t0 = embps_now_ns();
  const char *failed = embps_wal_failed(d->wal);
  if (failed) { /* the memory holds pushes the log may not: keep the disk */
    snprintf(err, err_len, "%s", failed);
    return -1;
  }
  pthread_mutex_lock(&d->mu);
  d->marker_done = 0;
  pthread_mutex_unlock(&d->mu);
  memset(&d->marker, 0, sizeof d->marker);
  d->marker.hdr.kind = EMBPS_KIND_CHECKPOINT;
  d->marker.run = marker_run;
  d->hooks.submit(d->hooks.ctx, &d->marker);
  pthread_mutex_lock(&d->mu);
  while (!d->marker_done)
    pthread_cond_wait(&d->cv, &d->mu);
  pthread_mutex_unlock(&d->mu);
  int rc = -1;
  embps_ckpt_result_t res = {0};
  if (d->marker_err[0])
    snprintf(err, err_len, "%s", d->marker_err);
  else
    rc = embps_ckpt_write(d->dir, &d->snap, &res, err, err_len);
  const uint64_t bytes = res.bytes;
  uint64_t lsn = d->snap.lsn;
  embps_ckpt_free(&d->snap);
  if (rc) {
    embps_space_checkpointed(&d->space, 0, 0);
    LOG_ERROR("checkpoint failed: %s", err);
    return -1;
  }
  embps_failpoint("ckpt-after-rename");
  embps_failpoint("ckpt-before-delete");
  delete_covered(d, lsn);
  embps_space_checkpointed(&d->space, 1, bytes);
  uint64_t ms = (embps_now_ns() - t0) / 1000000;
  pthread_mutex_lock(&d->mu);
  d->last.unix_s = (uint64_t)time(NULL);
  if (bytes || d->last.lsn != lsn)
    d->last.bytes = bytes;
  d->last.ms = ms;
  d->last.lsn = lsn;
  pthread_mutex_unlock(&d->mu);
  LOG_INFO("checkpoint at LSN %" PRIu64 " (ckpt-%016" PRIx64 "%s%s): %"
           PRIu64 " bytes in %" PRIu64 " ms, longest shard copy %.1f ms",
           lsn, lsn, d->why ? ", for " : "", d->why ? d->why : "", bytes, ms,
           (double)res.longest_copy_ns / 1e6);
  return 0;
}

int embps_durable_adopt(embps_durable_t *d, const embps_ckpt_t *c,
                        const embps_history_t *h, char *err, size_t err_len) {
  if (embps_history_save(d->dir, h, err, err_len))
    return -1;
  embps_ckpt_result_t res;
  uint64_t t0 = embps_now_ns();
  if (embps_ckpt_write(d->dir, c, &res, err, err_len))
    return -1;
  LOG_INFO("data dir %s: the primary's copy at LSN %" PRIu64 " written as "
           "a checkpoint (%" PRIu64 " bytes in %" PRIu64 " ms)", d->dir,
           c->lsn, res.bytes, (embps_now_ns() - t0) / 1000000);
  return 0;
}

int embps_durable_adopted(embps_apply_ctx_t *ctx, uint64_t lsn, char *err,
                          size_t err_len) {
  embps_durable_t *d = ctx->srv->dur;
  if (embps_wal_restart_at(d->wal, lsn + 1, err, err_len))
    return -1;
  delete_covered(d, lsn);
  pthread_mutex_lock(&d->mu);
  d->last.lsn = lsn;
  d->last.unix_s = (uint64_t)time(NULL);
  pthread_mutex_unlock(&d->mu);
  return 0;
}

static void reply_checkpoint(embps_durable_t *d, embps_request_t *req, int rc,
                             const char *err) {
  if (rc) {
    embps_request_fail(d->srv, req, EMBPS_EIO, "checkpoint failed: %s", err);
  } else {
    embps_msg_t m;
    memset(&m, 0, sizeof m);
    m.kind = EMBPS_KIND_CHECKPOINT | EMBPS_KIND_REPLY;
    pthread_mutex_lock(&d->mu);
    m.u.checkpoint.lsn = d->last.lsn;
    m.u.checkpoint.bytes = d->last.bytes;
    m.u.checkpoint.duration_ms = d->last.ms;
    m.u.checkpoint.unix_s = d->last.unix_s;
    pthread_mutex_unlock(&d->mu);
    embps_request_reply(d->srv, req, EMBPS_KIND_CHECKPOINT, &m, 0);
  }
  req->complete(req);
}

/* Is a checkpoint due for the log's size or for room (space.h), and not
 * held back after a failed one? */
static int space_due(embps_durable_t *d) {
  return embps_now_ns() >= d->retry_ns && embps_space_due(&d->space);
}

static void *ckpt_main(void *arg) {
  embps_durable_t *d = arg;
  const uint64_t every_ns = (uint64_t)d->srv->cfg.checkpoint_every_s *
                            1000000000ULL;
  pthread_mutex_lock(&d->mu);
  for (;;) {
    while (!d->pending && !d->stopping && !space_due(d) &&
           !(every_ns && embps_now_ns() >= d->next_due_ns)) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      ts.tv_sec += 1;
      pthread_cond_timedwait(&d->cv, &d->mu, &ts);
    }
    if (d->stopping && !d->pending)
      break;
    embps_request_t *batch = d->pending;
    d->pending = NULL;
    d->why = NULL;
    if (!batch && embps_space_due(&d->space))
      d->why = embps_space_reason(&d->space);
    pthread_mutex_unlock(&d->mu);
    char err[2048];
    int rc = checkpoint_once(d, err, sizeof err);
    const uint64_t minute = 60000000000ull;
    d->backoff_ns = rc ? d->backoff_ns ? 2 * d->backoff_ns : minute / 60 : 0;
    if (d->backoff_ns > minute)
      d->backoff_ns = minute;
    d->retry_ns = rc ? embps_now_ns() + d->backoff_ns : 0;
    while (batch) {
      embps_request_t *next = batch->next;
      batch->next = NULL;
      reply_checkpoint(d, batch, rc, err);
      batch = next;
    }
    pthread_mutex_lock(&d->mu);
    if (every_ns)
      d->next_due_ns = embps_now_ns() + every_ns;
  }
  pthread_mutex_unlock(&d->mu);
  return NULL;
}

void embps_durable_checkpoint_request(embps_durable_t *d,
                                      embps_request_t *req) {
  pthread_mutex_lock(&d->mu);
  req->next = d->pending;
  d->pending = req;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
}

void embps_durable_stats(embps_durable_t *d, embps_server_stats_t *s) {
  snprintf(s->data_dir, sizeof s->data_dir, "%.255s", d->dir);
  snprintf(s->fsync, sizeof s->fsync, "%s", fsync_name(d->srv->cfg.fsync));
  pthread_mutex_lock(&d->mu);
  s->checkpoint_unix_s = d->last.unix_s;
  s->checkpoint_bytes = d->last.bytes;
  s->checkpoint_ms = d->last.ms;
  s->checkpoint_lsn = d->last.lsn;
  pthread_mutex_unlock(&d->mu);
  s->log_bytes = embps_wal_bytes(d->log_dir);
  const char *f = embps_wal_failed(d->wal);
  if (f)
    snprintf(s->durability_failed, sizeof s->durability_failed, "%.255s", f);
  else
    embps_space_refusing(&d->space, s->durability_failed,
                         sizeof s->durability_failed);
}

void embps_durable_space(embps_durable_t *d, embps_metrics_space_t *out) {
  embps_space_t *sp = &d->space;
  embps_space_stat(sp);
  out->free_bytes = atomic_load(&sp->free_bytes);
  out->size_bytes = atomic_load(&sp->size_bytes);
  out->reserve_bytes = embps_space_reserve(sp);
  out->log_limit_bytes = atomic_load(&sp->limit);
  out->refused_total = atomic_load(&sp->refused);
}

uint64_t embps_durable_stall_ms(embps_durable_t *d) {
  return embps_wal_stall_ms(d->wal);
}

/* ------------------------------------------------------------ snapshots */

uint64_t embps_durable_pin(embps_durable_t *d, uint64_t lsn, int rotate,
                           char *err, size_t err_len) {
  if (rotate && embps_wal_rotate(d->wal, lsn + 1, err, err_len))
    return 0;
  uint64_t id = 0;
  pthread_mutex_lock(&d->mu);
  for (int i = 0; i < EMBPS_DURABLE_PINS && !id; i++) {
    if (!d->pins[i].id) {
      d->pins[i].id = id = ++d->next_pin;
      d->pins[i].lsn = lsn;
    }
  }
  pthread_mutex_unlock(&d->mu);
  if (!id)
    snprintf(err, err_len, "the log has %d pins already",
             EMBPS_DURABLE_PINS);
  return id;
}

void embps_durable_unpin(embps_durable_t *d, uint64_t pin) {
  pthread_mutex_lock(&d->mu);
  for (int i = 0; i < EMBPS_DURABLE_PINS; i++)
    if (pin && d->pins[i].id == pin)
      d->pins[i].id = 0;
  pthread_mutex_unlock(&d->mu);
}

int embps_durable_sync(embps_durable_t *d, uint64_t lsn, char *err,
                       size_t err_len) {
  return embps_wal_sync(d->wal, lsn, err, err_len);
}

const char *embps_durable_log_dir(const embps_durable_t *d) {
  return d->log_dir;
}

/* ------------------------------------------------------------ restore */

/* Loads checkpoint lsn of d into c, checks it is this server's, notes its
 * exactly-once table in seen and registers its tables, each known to r
 * with its shards' LSNs. 0, or -1 with err. */
static int restore_checkpoint(embps_durable_t *d, uint64_t lsn,
                              embps_ckpt_t *c, embps_redo_t *r,
                              embps_seen_t *seen, char *err, size_t err_len) {
  embps_server_t *srv = d->srv;
  uint64_t t0 = embps_now_ns();
  if (embps_ckpt_load(d->dir, lsn, srv->cfg.shards, srv->cfg.cluster_size, c,
                      err, err_len))
    return -1;
  if (c->cluster_size != srv->cfg.cluster_size ||
      c->cluster_index != srv->cfg.cluster_index) {
    snprintf(err, err_len, "checkpoint %s/ckpt-%016" PRIx64 " belongs to "
             "server %u of a cluster of %u, not %u of %u", d->dir, lsn,
             c->cluster_index, c->cluster_size, srv->cfg.cluster_index,
             srv->cfg.cluster_size);
    return -1;
  }
  for (size_t i = 0; i < c->n_seen; i++)
    embps_seen_note(seen, c->seen[i].client, c->seen[i].seq);
  for (size_t i = 0; i < c->n_tables; i++) {
    embps_ckpt_table_t *ct = &c->tables[i];
    embps_table_ref(ct->table);
    if (embps_registry_add(&srv->registry, ct->table)) {
      snprintf(err, err_len, "checkpoint of %s: table \"%s\" twice", d->dir,
               embps_table_spec(ct->table)->name);
      embps_table_unref(ct->table);
      return -1;
    }
    if (embps_redo_add_table(r, ct->table, ct->incarnation, ct->file_shards,
                             ct->shard_lsn)) {
      snprintf(err, err_len, "out of memory");
      return -1;
    }
  }
  LOG_INFO("restored checkpoint %s/ckpt-%016" PRIx64 ": %zu tables in %"
           PRIu64 " ms", d->dir, lsn, c->n_tables,
           (embps_now_ns() - t0) / 1000000);
  return 0;
}

static int replay_visit(void *ctx, const embps_wal_rec_t *rec, char *err,
                        size_t err_len) {
  return embps_redo_apply(ctx, rec, err, err_len);
}

/* Restores the newest checkpoint, if any, then replays the log after it
 * into srv->registry: *last = the last LSN, seen = the exactly-once table.
 * 0, or -1 with err (what was registered stays, for the caller to
 * close). */
static int restore(embps_durable_t *d, uint64_t *last, embps_seen_t *seen,
                   char *err, size_t err_len) {
  uint64_t lsn = 0;
  embps_ckpt_t c;
  memset(&c, 0, sizeof c);
  embps_redo_t r;
  embps_redo_init(&r, d->srv, &d->srv->registry, seen);
  int rc = embps_ckpt_latest(d->dir, &lsn, err, err_len);
  if (rc == 1) {
    rc = restore_checkpoint(d, lsn, &c, &r, seen, err, err_len);
    if (!rc)
      d->last.lsn = lsn;
  }
  if (!rc) {
    rc = embps_wal_replay(d->log_dir, lsn, replay_visit, &r, last, err,
                          err_len);
    if (!rc && *last > lsn)
      LOG_INFO("replayed the log: LSN %" PRIu64 " to %" PRIu64, lsn + 1,
               *last);
  }
  embps_redo_close(&r);
  embps_ckpt_free(&c); /* shard_lsn arrays freed after the replay */
  return rc ? -1 : 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path) && errno != ENOENT ? -1 : 0;
}

/* Moves the checkpoints, the log and the history of d into DIR/diverged
 * (a previous one deleted) and starts an empty log. 0, or -1 with err. */
static int set_aside(embps_durable_t *d, char *err, size_t err_len) {
  char aside[1100], from[1300], to[1400];
  snprintf(aside, sizeof aside, "%s/diverged", d->dir);
  if (nftw(aside, rm_entry, 16, FTW_DEPTH | FTW_PHYS) && errno != ENOENT) {
    snprintf(err, err_len, "data dir %s: cannot delete %s: %s", d->dir, aside,
             strerror(errno));
    return -1;
  }
  if (mkdir(aside, 0755)) {
    snprintf(err, err_len, "data dir %s: %s: %s", d->dir, aside,
             strerror(errno));
    return -1;
  }
  DIR *dir = opendir(d->dir);
  if (!dir) {
    snprintf(err, err_len, "data dir %s: %s", d->dir, strerror(errno));
    return -1;
  }
  int rc = 0;
  for (struct dirent *e; !rc && (e = readdir(dir));) {
    if (strncmp(e->d_name, "ckpt-", 5) && strcmp(e->d_name, "log") &&
        strcmp(e->d_name, "HISTORY"))
      continue;
    snprintf(from, sizeof from, "%s/%s", d->dir, e->d_name);
    snprintf(to, sizeof to, "%s/%s", aside, e->d_name);
    if (rename(from, to)) {
      snprintf(err, err_len, "data dir %s: cannot move %s to %s: %s", d->dir,
               from, to, strerror(errno));
      rc = -1;
    }
  }
  closedir(dir);
  if (!rc && mkdir(d->log_dir, 0755)) {
    snprintf(err, err_len, "data dir %s: %s", d->log_dir, strerror(errno));
    rc = -1;
  }
  if (!rc && embps_fsync_dir(d->dir)) {
    snprintf(err, err_len, "data dir %s: cannot sync the directory", d->dir);
    rc = -1;
  }
  return rc;
}

/* Before the restore: DIR/HISTORY into h (a log from before epochs is
 * epoch 1's) and, for a follower (hooks.join), its log cut where it leaves
 * its primary's history, the history with it. 0, or -1 with err. */
static int prepare_history(embps_durable_t *d, embps_history_t *h, char *err,
                           size_t err_len) {
  if (embps_history_load(d->dir, h, err, err_len))
    return -1;
  uint64_t ck = 0, wlast = 0;
  uint32_t wepoch;
  int rc = embps_ckpt_latest(d->dir, &ck, err, err_len);
  if (rc < 0)
    return -1;
  if (rc == 0)
    ck = 0;
  if (embps_wal_last(d->log_dir, &wlast, &wepoch, err, err_len))
    return -1;
  const uint64_t last = wlast > ck ? wlast : ck;
  if (!h->n && last && embps_history_add(h, 1, 1)) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  if (!d->hooks.join)
    return 0;
  uint64_t keep = last, cut;
  if (d->hooks.join(d->hooks.ctx, h, last, &keep, err, err_len))
    return -1;
  if (keep >= last)
    return 0;
  if (keep < ck) { /* the whole state goes: a copy of the primary comes */
    if (set_aside(d, err, err_len))
      return -1;
    LOG_WARN("data dir %s: its checkpoint at LSN %" PRIu64 " holds records "
             "after LSN %" PRIu64 ", where its log leaves the primary's "
             "history (%" PRIu64 " records that were never acknowledged "
             "with --sync-followers >= 1): its state is set aside in "
             "%s/diverged, and the follower copies a snapshot of its "
             "primary", d->dir, ck, keep, last - keep, d->dir);
    h->n = 0;
    return 0;
  }
  if (embps_wal_cut_after(d->log_dir, keep, &cut, err, err_len))
    return -1;
  LOG_WARN("data dir %s: cut %" PRIu64 " records (LSN %" PRIu64 " to %"
           PRIu64 ") that are not on the primary's history: they were never "
           "acknowledged with --sync-followers >= 1", d->dir, cut, keep + 1,
           last);
  while (h->n && h->v[h->n - 1].start > keep)
    h->n--;
  return embps_history_save(d->dir, h, err, err_len);
}

/* After the restore up to LSN last: the epoch records are made in now. A
 * primary starts a new one at every start (recorded first), so a
 * follower can tell its log from the records this start makes; a
 * follower goes on in its last record's. 0, or -1 with err. */
static int start_epoch(embps_durable_t *d, embps_history_t *h, uint64_t last,
                       uint32_t *epoch, char *err, size_t err_len) {
  if (d->hooks.join) {
    *epoch = embps_history_epoch_at(h, last);
    return 0;
  }
  *epoch = embps_history_epoch(h) + 1;
  if (embps_history_add(h, *epoch, last + 1)) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  return embps_history_save(d->dir, h, err, err_len);
}

/* flock on DIR/LOCK; the holder's pid is in the file. */
static int lock_dir(embps_durable_t *d, char *err, size_t err_len) {
  char path[1100];
  snprintf(path, sizeof path, "%s/LOCK", d->dir);
  d->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (d->lock_fd < 0) {
    snprintf(err, err_len, "data dir %s: cannot open LOCK: %s", d->dir,
             strerror(errno));
    return -1;
  }
  if (flock(d->lock_fd, LOCK_EX | LOCK_NB)) {
    char pid[32] = "?";
    ssize_t k = pread(d->lock_fd, pid, sizeof pid - 1, 0);
    if (k > 0) {
      pid[k] = 0;
      pid[strcspn(pid, "\n")] = 0;
    }
    snprintf(err, err_len, "data dir %s is in use by pid %s", d->dir, pid);
    close(d->lock_fd);
    d->lock_fd = -1;
    return -1;
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
  if (ftruncate(d->lock_fd, 0) || pwrite(d->lock_fd, pid, (size_t)len, 0) < 0)
    LOG_WARN("data dir %s: cannot write the pid to LOCK", d->dir);
  return 0;
}

int embps_durable_open(embps_server_t *srv, const embps_durable_hooks_t *hooks,
                       char *err, size_t err_len) {
  embps_durable_t *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  d->srv = srv;
  d->hooks = *hooks;
  d->lock_fd = -1;
  snprintf(d->dir, sizeof d->dir, "%s", srv->cfg.data_dir);
  snprintf(d->log_dir, sizeof d->log_dir, "%s/log", d->dir);
  pthread_mutex_init(&d->mu, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&d->cv, &attr);
  pthread_condattr_destroy(&attr);
  embps_failpoint(NULL); /* reads EMBPS_FAILPOINT before threads start */
  const char *unsafe = getenv("EMBPS_TEST_UNSAFE_ACK");
  d->unsafe_ack = unsafe && !strcmp(unsafe, "1");
  if (d->unsafe_ack)
    LOG_WARN("EMBPS_TEST_UNSAFE_ACK=1: pushes are acknowledged BEFORE they "
             "are logged; a crash loses acknowledged pushes. Test only, "
             "never in production");
  const char *slow = getenv("EMBPS_TEST_RESTORE_DELAY_MS");
  if (slow && atoi(slow) > 0) { /* lets a test see /readyz before ready */
    LOG_WARN("EMBPS_TEST_RESTORE_DELAY_MS=%d: restore delayed. Test only",
             atoi(slow));
    struct timespec ts = {atoi(slow) / 1000, (atoi(slow) % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  uint64_t last = 0;
  if ((mkdir(d->dir, 0755) && errno != EEXIST) ||
      (mkdir(d->log_dir, 0755) && errno != EEXIST)) {
    snprintf(err, err_len, "data dir %s: %s", d->dir, strerror(errno));
    goto fail;
  }
  /* Nothing is served yet: the restore may copy rows on every core (the
   * thread's OpenMP setting, put back after it). */
  const int team = omp_get_max_threads();
  omp_set_num_threads(omp_get_num_procs());
  embps_seen_t seen;
  embps_seen_init(&seen);
  embps_history_t hist;
  embps_history_init(&hist);
  uint32_t epoch = 0;
  int restored = !lock_dir(d, err, err_len) &&
                 !prepare_history(d, &hist, err, err_len) &&
                 !restore(d, &last, &seen, err, err_len) &&
                 !start_epoch(d, &hist, last, &epoch, err, err_len);
  omp_set_num_threads(team);
  if (restored && embps_feed_set_history(srv->feed, &hist)) {
    snprintf(err, err_len, "out of memory");
    restored = 0;
  }
  if (restored)
    d->hooks.restored(d->hooks.ctx, last, epoch, &seen);
  embps_seen_close(&seen);
  embps_history_close(&hist);
  if (!restored)
    goto fail;
  if (embps_wal_open(d->log_dir, last + 1, srv->cfg.fsync, d->unsafe_ack,
                     wal_done, d, &d->wal, err, err_len))
    goto fail;
  embps_feed_set_log(srv->feed, d->log_dir, d->wal);
  char restored_dir[1200];
  snprintf(restored_dir, sizeof restored_dir, "%s/ckpt-%016" PRIx64, d->dir,
           d->last.lsn);
  embps_space_init(&d->space, d->dir, srv->cfg.checkpoint_log_bytes,
                   embps_wal_bytes(d->log_dir),
                   embps_space_dir_bytes(restored_dir));
  d->space_ready = 1;
  if (srv->cfg.checkpoint_every_s)
    d->next_due_ns = embps_now_ns() +
                     (uint64_t)srv->cfg.checkpoint_every_s * 1000000000ULL;
  srv->dur = d;
  if (pthread_create(&d->thread, NULL, ckpt_main, d)) {
    snprintf(err, err_len, "cannot start the checkpoint thread");
    srv->dur = NULL;
    goto fail;
  }
  d->thread_started = 1;
  char trigger[96] = "none for the log's size";
  uint64_t limit = atomic_load(&d->space.limit);
  if (limit)
    snprintf(trigger, sizeof trigger, "one per %" PRIu64 " bytes of log",
             limit);
  LOG_INFO("data dir %s: --fsync %s, next LSN %" PRIu64 ", epoch %u; "
           "checkpoints: %s; %" PRIu64 " of %" PRIu64 " bytes free (%" PRIu64
           " kept for the next checkpoint)", d->dir,
           fsync_name(srv->cfg.fsync), last + 1, epoch, trigger,
           (uint64_t)atomic_load(&d->space.free_bytes),
           (uint64_t)atomic_load(&d->space.size_bytes),
           (uint64_t)atomic_load(&d->space.reserve));
  return 0;
fail:
  if (d->wal)
    embps_feed_set_log(srv->feed, "", NULL);
  embps_wal_close(d->wal);
  if (d->space_ready)
    embps_space_close(&d->space);
  if (d->lock_fd >= 0)
    close(d->lock_fd);
  pthread_mutex_destroy(&d->mu);
  pthread_cond_destroy(&d->cv);
  free(d);
  return -1;
}

int embps_durable_shutdown(embps_server_t *srv) {
  embps_durable_t *d = srv->dur;
  if (!d || !d->thread_started)
    return 0;
  pthread_mutex_lock(&d->mu);
  d->stopping = 1;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  pthread_join(d->thread, NULL);
  d->thread_started = 0;
  if (embps_wal_failed(d->wal)) {
    LOG_ERROR("no final checkpoint: %s", embps_wal_failed(d->wal));
    return -1;
  }
  char err[2048];
  d->why = NULL; /* the final one: no trigger to name */
  return checkpoint_once(d, err, sizeof err);
}

void embps_durable_close(embps_server_t *srv) {
  embps_durable_t *d = srv->dur;
  if (!d)
    return;
  embps_wal_close(d->wal);
  embps_space_close(&d->space);
  close(d->lock_fd);
  pthread_mutex_destroy(&d->mu);
  pthread_cond_destroy(&d->cv);
  free(d);
  srv->dur = NULL;
}
