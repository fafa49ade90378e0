/* snapshot.c - snapshot sessions (snapshot.h).
 *
 * A session is a slot of srv->snap: its marker's state (an embps_ckpt_t),
 * a pipe of chunks and a thread, the producer, which writes the stream
 * through ckpt.c's stream sink into the chunk being filled and queues each
 * full chunk (blocking while EMBPS_SNAPSHOT_PIPE are queued). A chunk is
 * allocated as the READ reply frame it will be: the frame header and the
 * reply's meta (fixed-size fields: one length whatever the values) go in
 * front of its bytes, so a READ hands the chunk to the connection as its
 * reply without a copy. A shard's records arrive from the table's copy in
 * blocks allocated with that room in front (put_block): each becomes a
 * chunk as it is, so the records are copied once on this side, out of the
 * table.
 *
 * Every field of a slot but the producer's own is guarded by the
 * manager's mutex; a READ waiting for its chunk is completed under it by
 * whoever changes the slot (the producer queuing a chunk or failing, END,
 * expiry, shutdown). The producer notices END and expiry in its waits (it
 * waits with a timeout while the pipe is full, and once the stream is
 * written until the session ends), cleans up (the tables let go, the log
 * and feed pins released) and marks the slot exited; the slot is joined
 * and reused by a later BEGIN, or at destroy. */
#define _GNU_SOURCE
#include "snapshot.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "apply.h"
#include "durable.h"
#include "marker.h"
#include "wal.h"

/* Slots: the sessions open, and as many ending ones (their thread still
 * letting go of what they held). */
#define SLOTS (2 * EMBPS_SNAPSHOT_SESSIONS)
#define WAIT_MS 100         /* a producer's waits, to notice expiry */
#define LOG_COPY_BYTES (1u << 20)

typedef struct {
  uint8_t *buf; /* frame header, meta, then the chunk's bytes */
  size_t len;   /* the chunk's bytes */
  uint64_t seq, offset;
  int last;
} chunk_t;

enum { FREE, BEGUN, OPEN };

typedef struct {
  struct embps_snapshots *mgr;
  int state;      /* FREE, BEGUN (marker pending), OPEN (thread started) */
  uint64_t id;
  embps_request_t *begin; /* BEGUN: its request, at the apply thread */
  int with_log;
  uint32_t chunk_bytes, idle_ms;
  /* the marker's (then the producer's) */
  embps_ckpt_t c;
  uint64_t runs;     /* the apply thread's runs at the marker */
  uint64_t log_pin;  /* embps_durable_pin's, or 0 */
  void *feed_pin;
  /* the pipe */
  chunk_t ready[EMBPS_SNAPSHOT_PIPE]; /* queued: ready[head .. head+n) */
  int head, n_ready;
  uint64_t next_seq;  /* the chunk the next READ must name */
  int all_queued;     /* the last chunk is queued */
  embps_request_t *waiting; /* a READ waiting for its chunk */
  uint64_t last_active_ns;
  int ending;         /* END, expiry, failure or shutdown: stop */
  int err_code;       /* the session failed: READs get it */
  char err[1024];
  pthread_t thread;
  int exited;         /* the thread is done; join it */
  /* the producer's own */
  chunk_t fill;       /* being filled */
  uint64_t produced;  /* stream bytes queued or in fill */
  uint64_t chunks;    /* chunks queued */
  embps_ckpt_stream_t out;
  uint8_t *copy_buf;  /* log segments' bytes on their way */
  /* the closing marker (no data dir): the apply thread's runs then */
  embps_request_t close_req;
  int closed;
  uint64_t close_runs;
} session_t;

struct embps_snapshots {
  embps_server_t *srv;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* CLOCK_MONOTONIC: a slot changed */
  session_t slot[SLOTS];
  int stopping;
  embps_snapshot_feed_t feed;
  size_t head_bytes; /* a chunk's frame header and meta */
};

/* ------------------------------------------------------------ helpers */

static void wait_ms(embps_snapshots_t *m, unsigned ms) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_nsec += (long)ms * 1000000L;
  ts.tv_sec += ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  pthread_cond_timedwait(&m->cv, &m->mu, &ts);
}

/* The session named id (open), or NULL. mu held. */
static session_t *find_locked(embps_snapshots_t *m, uint64_t id) {
  for (int i = 0; i < SLOTS; i++)
    if (m->slot[i].state == OPEN && m->slot[i].id == id && id)
      return &m->slot[i];
  return NULL;
}

/* Turns chunk c into the READ reply frame of req and hands it over. */
static void reply_chunk(embps_snapshots_t *m, embps_request_t *req,
                        chunk_t *c) {
  embps_msg_t msg;
  memset(&msg, 0, sizeof msg);
  msg.kind = EMBPS_KIND_SNAPSHOT_READ | EMBPS_KIND_REPLY;
  msg.u.snap_read_reply.seq = c->seq;
  msg.u.snap_read_reply.offset = c->offset;
  msg.u.snap_read_reply.done = c->last;
  const size_t meta = embps_msg_size(&msg);
  const size_t off = embps_bulk_offset(meta);
  assert(EMBPS_FRAME_HEADER_LEN + off == m->head_bytes);
  const embps_frame_header_t h = {.body_len = (uint32_t)(off + c->len),
                                  .meta_len = (uint32_t)meta,
                                  .req_id = req->hdr.req_id,
                                  .kind = msg.kind};
  embps_frame_header_encode(&h, c->buf);
  embps_msg_pack(&msg, c->buf + EMBPS_FRAME_HEADER_LEN);
  memset(c->buf + EMBPS_FRAME_HEADER_LEN + meta, 0, off - meta);
  free(req->reply);
  req->reply = c->buf;
  req->reply_len = m->head_bytes + c->len;
  c->buf = NULL;
}

/* Answers s's waiting READ with its chunk or its failure, if it can. mu
 * held. */
static void serve_waiting_locked(embps_snapshots_t *m, session_t *s) {
  embps_request_t *req = s->waiting;
  if (!req)
    return;
  if (s->n_ready) {
    chunk_t *c = &s->ready[s->head];
    reply_chunk(m, req, c);
    s->head = (s->head + 1) % EMBPS_SNAPSHOT_PIPE;
    s->n_ready--;
    s->next_seq++;
    s->last_active_ns = embps_now_ns();
  } else if (s->err_code) {
    embps_request_fail(m->srv, req, s->err_code, "%s", s->err);
  } else {
    return;
  }
  s->waiting = NULL;
  pthread_cond_broadcast(&m->cv);
  req->complete(req);
}

/* s fails (the first reason stays): its READs get code and the message.
 * mu held. */
static void fail_locked(embps_snapshots_t *m, session_t *s, int code,
                        const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fail_locked(embps_snapshots_t *m, session_t *s, int code,
                        const char *fmt, ...) {
  if (!s->err_code) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    s->err_code = code;
  }
  s->ending = 1;
  serve_waiting_locked(m, s);
  pthread_cond_broadcast(&m->cv);
}

/* Fails s if it saw no READ for its idle time and none is waiting. mu
 * held. */
static void expire_locked(embps_snapshots_t *m, session_t *s) {
  if (!s->waiting && !s->ending &&
      embps_now_ns() - s->last_active_ns > (uint64_t)s->idle_ms * 1000000u) {
    LOG_INFO("snapshot session %016" PRIx64 " expired after %u ms without "
             "a READ", s->id, s->idle_ms);
    fail_locked(m, s, EMBPS_EINVAL, "snapshot session %016" PRIx64 " expired "
                "after %u ms without a READ", s->id, s->idle_ms);
  }
}

/* ------------------------------------------------------------ producer */

/* Queues the filled chunk (last: the stream's final one), waiting while
 * the pipe is full. 0, or -1 with err once the session ends. */
static int queue_chunk(session_t *s, int last, char *err, size_t err_len) {
  embps_snapshots_t *m = s->mgr;
  s->fill.seq = s->chunks++;
  s->fill.last = last;
  pthread_mutex_lock(&m->mu);
  while (s->n_ready == EMBPS_SNAPSHOT_PIPE && !s->ending) {
    wait_ms(m, WAIT_MS);
    expire_locked(m, s);
  }
  int rc = 0;
  if (s->ending) {
    snprintf(err, err_len, "snapshot session %016" PRIx64 " ended", s->id);
    rc = -1;
  } else {
    s->ready[(s->head + s->n_ready) % EMBPS_SNAPSHOT_PIPE] = s->fill;
    s->n_ready++;
    s->all_queued = last;
    memset(&s->fill, 0, sizeof s->fill);
    serve_waiting_locked(m, s);
  }
  pthread_mutex_unlock(&m->mu);
  return rc;
}

/* Makes fill a chunk of room bytes, starting at the stream's end. */
static int start_chunk(session_t *s, size_t room, char *err,
                       size_t err_len) {
  s->fill.buf = malloc(s->mgr->head_bytes + room);
  if (!s->fill.buf) {
    snprintf(err, err_len, "snapshot: out of memory for a chunk");
    return -1;
  }
  s->fill.len = 0;
  s->fill.offset = s->produced;
  return 0;
}

/* The stream sink's put: bytes copied into the chunks. */
static int pipe_put(void *ctx, const void *p, size_t n, char *err,
                    size_t err_len) {
  session_t *s = ctx;
  const uint8_t *src = p;
  const size_t head = s->mgr->head_bytes;
  while (n) {
    if (!s->fill.buf && start_chunk(s, s->chunk_bytes, err, err_len))
      return -1;
    size_t k = s->chunk_bytes - s->fill.len;
    k = k < n ? k : n;
    memcpy(s->fill.buf + head + s->fill.len, src, k);
    s->fill.len += k;
    s->produced += k;
    src += k;
    n -= k;
    if (s->fill.len == s->chunk_bytes && queue_chunk(s, 0, err, err_len))
      return -1;
  }
  return 0;
}

/* The stream sink's put_block: a block of records becomes a chunk of its
 * own, READ's reply frame built in the room in front of it (no copy);
 * the bytes before it go out first, as a chunk however short. */
static int pipe_put_block(void *ctx, uint8_t *buf, size_t off, size_t n,
                          char *err, size_t err_len) {
  session_t *s = ctx;
  if (off != s->mgr->head_bytes || n > s->chunk_bytes) { /* small chunks */
    int rc = pipe_put(s, buf + off, n, err, err_len);
    free(buf);
    return rc;
  }
  if (s->fill.buf && s->fill.len && queue_chunk(s, 0, err, err_len)) {
    free(buf);
    return -1;
  }
  free(s->fill.buf); /* an empty one */
  s->fill = (chunk_t){.buf = buf, .len = n, .offset = s->produced};
  s->produced += n;
  return queue_chunk(s, 0, err, err_len);
}

/* The stream's last chunk (perhaps empty). */
static int flush_last(session_t *s, char *err, size_t err_len) {
  if (!s->fill.buf && start_chunk(s, 0, err, err_len))
    return -1;
  return queue_chunk(s, 1, err, err_len);
}

static int log_sync(void *ctx, uint64_t lsn, char *err, size_t err_len) {
  return embps_durable_sync(ctx, lsn, err, err_len);
}

/* embps_wal_segments' visit: the segment's first `bytes` bytes as a LOG
 * entry. */
static int copy_segment(void *ctx, uint64_t first, const char *path,
                        uint64_t bytes, char *err, size_t err_len) {
  session_t *s = ctx;
  embps_ckpt_sink_t *b = &s->out.base;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, err_len, "log %s: %s", path, strerror(errno));
    return -1;
  }
  int rc = embps_ckpt_stream_log(&s->out, first, err, err_len);
  for (uint64_t at = 0; !rc && at < bytes;) {
    size_t want = bytes - at < LOG_COPY_BYTES ? (size_t)(bytes - at)
                                              : LOG_COPY_BYTES;
    ssize_t k = pread(fd, s->copy_buf, want, (off_t)at);
    if (k <= 0) {
      if (k < 0 && errno == EINTR)
        continue;
      snprintf(err, err_len, "log %s: read at offset %" PRIu64 ": %s", path,
               at, k ? strerror(errno) : "the file is shorter");
      rc = -1;
      break;
    }
    rc = b->write(b, s->copy_buf, (size_t)k, err, err_len);
    at += (uint64_t)k;
  }
  close(fd);
  return b->end(b, rc, err, err_len);
}

/* The closing marker's run: the apply thread's runs now. */
static void close_run(embps_apply_ctx_t *ctx, embps_request_t *req) {
  session_t *s = (session_t *)((char *)req - offsetof(session_t, close_req));
  embps_snapshots_t *m = s->mgr;
  pthread_mutex_lock(&m->mu);
  s->close_runs = ctx->runs;
  s->closed = 1;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
}

/* A with_log session of a server without a data dir: the records after S
 * come from the feed, or nothing may have run since the marker. */
static int tail_without_log(session_t *s, uint64_t upto, int *code, char *err,
                            size_t err_len) {
  embps_snapshots_t *m = s->mgr;
  if (m->feed.records && s->feed_pin)
    return m->feed.records(m->feed.ctx, s->feed_pin, s->c.lsn, upto, &s->out,
                           err, err_len);
  memset(&s->close_req, 0, sizeof s->close_req);
  s->close_req.hdr.kind = EMBPS_KIND_SNAPSHOT_BEGIN;
  s->close_req.run = close_run;
  embps_apply_submit(m->srv->apply, &s->close_req);
  pthread_mutex_lock(&m->mu);
  while (!s->closed) /* the apply thread runs it, even when draining */
    wait_ms(m, WAIT_MS);
  const uint64_t others = s->close_runs - s->runs - 1;
  pthread_mutex_unlock(&m->mu);
  if (!others)
    return 0;
  *code = EMBPS_ENODATADIR;
  snprintf(err, err_len, "%" PRIu64 " requests changed or may have changed "
           "the tables while they were copied, and this server keeps no log "
           "to complete the copy (no --data-dir): take the backup while no "
           "pushes come, or give the server a --data-dir", others);
  return -1;
}

/* Writes the whole stream. 0, or -1 with err (*code the error's). */
static int produce(session_t *s, int *code, char *err, size_t err_len) {
  embps_server_t *srv = s->mgr->srv;
  embps_ckpt_result_t res;
  *code = EMBPS_EIO;
  embps_ckpt_stream_init(&s->out, pipe_put, pipe_put_block, s);
  if (embps_ckpt_stream_head(&s->out, &s->c,
                             s->with_log ? EMBPS_SNAPSTREAM_WITH_LOG : 0, err,
                             err_len) ||
      embps_ckpt_emit(&s->out.base, &s->c, &res, err, err_len))
    return -1;
  uint64_t lsn = s->c.lsn;
  if (s->with_log && srv->dur) {
    s->copy_buf = malloc(LOG_COPY_BYTES);
    if (!s->copy_buf) {
      snprintf(err, err_len, "snapshot: out of memory");
      return -1;
    }
    if (embps_wal_segments(embps_durable_log_dir(srv->dur), s->c.lsn,
                           res.max_lsn, copy_segment, s, err, err_len))
      return -1;
    lsn = res.max_lsn;
  } else if (s->with_log) {
    if (tail_without_log(s, res.max_lsn, code, err, err_len))
      return -1;
    lsn = res.max_lsn;
  }
  if (embps_ckpt_stream_end(&s->out, lsn, err, err_len) ||
      flush_last(s, err, err_len))
    return -1;
  LOG_INFO("snapshot session %016" PRIx64 ": %" PRIu64 " bytes streamed, "
           "LSN %" PRIu64 " to %" PRIu64 ", longest shard copy %.1f ms",
           s->id, s->produced, s->c.lsn, lsn,
           (double)res.longest_copy_ns / 1e6);
  return 0;
}

static void *session_main(void *arg) {
  session_t *s = arg;
  embps_snapshots_t *m = s->mgr;
  embps_server_t *srv = m->srv;
  char err[1024];
  int code;
  if (produce(s, &code, err, sizeof err)) {
    pthread_mutex_lock(&m->mu);
    if (!s->ending)
      LOG_WARN("snapshot session %016" PRIx64 " failed: %s", s->id, err);
    fail_locked(m, s, code, "snapshot failed: %s", err);
    pthread_mutex_unlock(&m->mu);
  }
  free(s->fill.buf);
  memset(&s->fill, 0, sizeof s->fill);
  free(s->copy_buf);
  s->copy_buf = NULL;
  embps_ckpt_free(&s->c); /* lets go of the tables */
  pthread_mutex_lock(&m->mu);
  while (!s->ending) { /* written: the reader takes the rest, then END */
    wait_ms(m, WAIT_MS);
    expire_locked(m, s);
  }
  for (; s->n_ready; s->n_ready--, s->head = (s->head + 1) %
                                               EMBPS_SNAPSHOT_PIPE)
    free(s->ready[s->head].buf);
  const uint64_t log_pin = s->log_pin;
  void *feed_pin = s->feed_pin;
  s->log_pin = 0;
  s->feed_pin = NULL;
  pthread_mutex_unlock(&m->mu);
  if (log_pin)
    embps_durable_unpin(srv->dur, log_pin);
  if (feed_pin && m->feed.unpin)
    m->feed.unpin(m->feed.ctx, feed_pin);
  pthread_mutex_lock(&m->mu);
  s->exited = 1;
  pthread_cond_broadcast(&m->cv);
  pthread_mutex_unlock(&m->mu);
  return NULL;
}

/* ------------------------------------------------------------ slots */

/* Joins the slot's thread once it exited and frees the slot. mu held. */
static void reap_locked(embps_snapshots_t *m, session_t *s) {
  if (s->state != OPEN || !s->exited)
    return;
  pthread_join(s->thread, NULL); /* it exited: at once */
  memset(s, 0, sizeof *s);
  s->mgr = m;
}

int embps_snapshots_create(embps_server_t *srv, embps_snapshots_t **out) {
  embps_snapshots_t *m = calloc(1, sizeof *m);
  if (!m)
    return -ENOMEM;
  m->srv = srv;
  pthread_mutex_init(&m->mu, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&m->cv, &attr);
  pthread_condattr_destroy(&attr);
  for (int i = 0; i < SLOTS; i++)
    m->slot[i].mgr = m;
  embps_msg_t msg;
  memset(&msg, 0, sizeof msg);
  msg.kind = EMBPS_KIND_SNAPSHOT_READ | EMBPS_KIND_REPLY;
  m->head_bytes = EMBPS_FRAME_HEADER_LEN +
                  embps_bulk_offset(embps_msg_size(&msg));
  *out = m;
  return 0;
}

void embps_snapshot_set_feed(embps_snapshots_t *s,
                             const embps_snapshot_feed_t *feed) {
  pthread_mutex_lock(&s->mu);
  s->feed = *feed;
  pthread_mutex_unlock(&s->mu);
}

void embps_snapshots_drain(embps_snapshots_t *m) {
  if (!m)
    return;
  pthread_mutex_lock(&m->mu);
  m->stopping = 1;
  for (int i = 0; i < SLOTS; i++)
    if (m->slot[i].state == OPEN)
      fail_locked(m, &m->slot[i], EMBPS_ESHUTDOWN, "server shutting down");
  pthread_mutex_unlock(&m->mu);
}

void embps_snapshots_destroy(embps_snapshots_t *m) {
  if (!m)
    return;
  embps_snapshots_drain(m);
  pthread_mutex_lock(&m->mu);
  for (int i = 0; i < SLOTS; i++) {
    session_t *s = &m->slot[i];
    while (s->state == OPEN && !s->exited)
      wait_ms(m, WAIT_MS);
    reap_locked(m, s);
  }
  pthread_mutex_unlock(&m->mu);
  pthread_mutex_destroy(&m->mu);
  pthread_cond_destroy(&m->cv);
  free(m);
}

/* ------------------------------------------------------------ requests */

/* BEGIN's run, on the apply thread: the marker, the pins, the thread. */
static void begin_run(embps_apply_ctx_t *ctx, embps_request_t *req) {
  embps_server_t *srv = ctx->srv;
  embps_snapshots_t *m = srv->snap;
  char err[1024];
  pthread_mutex_lock(&m->mu);
  session_t *s = NULL;
  for (int i = 0; i < SLOTS && !s; i++)
    if (m->slot[i].state == BEGUN && m->slot[i].begin == req)
      s = &m->slot[i];
  const int stopping = m->stopping;
  const embps_snapshot_feed_t feed = m->feed;
  pthread_mutex_unlock(&m->mu);
  assert(s);
  int code = EMBPS_ENOMEM;
  int rc = stopping ? -1 : embps_marker_take(ctx, &s->c, err, sizeof err);
  if (stopping) {
    code = EMBPS_ESHUTDOWN;
    snprintf(err, sizeof err, "server shutting down");
  }
  s->runs = ctx->runs;
  if (!rc && srv->dur) {
    s->log_pin = embps_durable_pin(srv->dur, ctx->lsn, s->with_log, err,
                                   sizeof err);
    if (!s->log_pin) {
      code = EMBPS_EIO;
      rc = -1;
    }
    if (s->with_log) { /* the copy waits for the records it ships */
      s->c.log_sync = log_sync;
      s->c.log_ctx = srv->dur;
    }
  }
  if (!rc && feed.pin)
    s->feed_pin = feed.pin(feed.ctx, ctx->lsn);
  const uint32_t tables = (uint32_t)s->c.n_tables; /* before the thread */
  const uint64_t lsn = s->c.lsn;
  pthread_mutex_lock(&m->mu);
  s->begin = NULL;
  s->last_active_ns = embps_now_ns();
  if (!rc) {
    s->state = OPEN;
    int e = pthread_create(&s->thread, NULL, session_main, s);
    if (e) {
      s->state = BEGUN;
      code = -e;
      snprintf(err, sizeof err, "cannot start the session's thread: %s",
               strerror(e));
      rc = -1;
    }
  }
  const uint64_t pin = s->log_pin;
  void *feed_pin = s->feed_pin;
  if (rc) {
    embps_ckpt_free(&s->c);
    memset(s, 0, sizeof *s);
    s->mgr = m;
  }
  pthread_mutex_unlock(&m->mu);
  if (rc) {
    if (pin)
      embps_durable_unpin(srv->dur, pin);
    if (feed_pin && feed.unpin)
      feed.unpin(feed.ctx, feed_pin);
    embps_request_fail(srv, req, code, "snapshot: %s", err);
  } else {
    embps_msg_t r;
    memset(&r, 0, sizeof r);
    embps_snapshot_begin_reply_t *b = &r.u.snap_begin_reply;
    b->session = s->id;
    b->lsn = lsn;
    b->chunk_bytes = s->chunk_bytes;
    b->cluster_size = srv->cfg.cluster_size;
    b->cluster_index = srv->cfg.cluster_index;
    b->shards = srv->cfg.shards;
    b->tables = tables;
    b->idle_ms = s->idle_ms;
    LOG_INFO("snapshot session %016" PRIx64 " begins at LSN %" PRIu64
             " (%u tables%s)", s->id, lsn, b->tables,
             s->with_log ? ", with the log after it" : "");
    embps_request_reply(srv, req, EMBPS_KIND_SNAPSHOT_BEGIN, &r, 0);
  }
  req->complete(req);
}

static embps_dispatch_t do_begin(embps_server_t *srv, embps_request_t *req) {
  embps_snapshots_t *m = srv->snap;
  const embps_snapshot_begin_t *b = &req->msg.u.snap_begin;
  const size_t frame_room = srv->cfg.max_frame_bytes > m->head_bytes
                                ? srv->cfg.max_frame_bytes - m->head_bytes
                                : 0;
  uint64_t chunk = b->max_chunk_bytes ? b->max_chunk_bytes
                                      : EMBPS_SNAPSHOT_CHUNK_DEFAULT;
  if (chunk > frame_room)
    chunk = frame_room;
  if (chunk > EMBPS_SNAPSHOT_CHUNK_MAX)
    chunk = EMBPS_SNAPSHOT_CHUNK_MAX;
  if (b->max_chunk_bytes && b->max_chunk_bytes < EMBPS_SNAPSHOT_CHUNK_MIN) {
    embps_request_fail(srv, req, EMBPS_EINVAL, "snapshot: max_chunk_bytes %u "
                       "is below %u", b->max_chunk_bytes,
                       EMBPS_SNAPSHOT_CHUNK_MIN);
    return EMBPS_DISPATCH_REPLY;
  }
  if (chunk < EMBPS_SNAPSHOT_CHUNK_MIN) {
    embps_request_fail(srv, req, EMBPS_EINVAL, "snapshot: --max-frame-bytes "
                       "%llu leaves no room for a chunk",
                       (unsigned long long)srv->cfg.max_frame_bytes);
    return EMBPS_DISPATCH_REPLY;
  }
  if (b->idle_ms && (b->idle_ms < EMBPS_SNAPSHOT_IDLE_MIN_MS ||
                     b->idle_ms > EMBPS_SNAPSHOT_IDLE_MAX_MS)) {
    embps_request_fail(srv, req, EMBPS_EINVAL, "snapshot: idle_ms %u is not "
                       "in [%u, %u]", b->idle_ms, EMBPS_SNAPSHOT_IDLE_MIN_MS,
                       EMBPS_SNAPSHOT_IDLE_MAX_MS);
    return EMBPS_DISPATCH_REPLY;
  }
  uint64_t id = 0;
  while (!id && getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
    id = embps_now_ns() ^ ((uint64_t)getpid() << 40);
  pthread_mutex_lock(&m->mu);
  int open = 0;
  session_t *s = NULL;
  for (int i = 0; i < SLOTS; i++) {
    session_t *x = &m->slot[i];
    reap_locked(m, x);
    if (x->state == BEGUN || (x->state == OPEN && !x->ending))
      open++;
    else if (x->state == FREE && !s)
      s = x;
  }
  int code = 0;
  if (m->stopping)
    code = EMBPS_ESHUTDOWN;
  else if (open >= EMBPS_SNAPSHOT_SESSIONS || !s)
    code = EMBPS_ELIMIT;
  if (!code) {
    s->state = BEGUN;
    s->id = id;
    s->begin = req;
    s->with_log = b->with_log;
    s->chunk_bytes = (uint32_t)chunk;
    s->idle_ms = b->idle_ms ? b->idle_ms : EMBPS_SNAPSHOT_IDLE_DEFAULT_MS;
  }
  pthread_mutex_unlock(&m->mu);
  if (code == EMBPS_ESHUTDOWN) {
    embps_request_fail(srv, req, code, "server shutting down");
    return EMBPS_DISPATCH_REPLY;
  }
  if (code) {
    embps_request_fail(srv, req, code, "snapshot: %d sessions are open "
                       "already (at most %d): end one, or wait for one to "
                       "expire", open, EMBPS_SNAPSHOT_SESSIONS);
    return EMBPS_DISPATCH_REPLY;
  }
  req->run = begin_run;
  embps_apply_submit(srv->apply, req);
  return EMBPS_DISPATCH_DEFERRED;
}

static embps_dispatch_t do_read(embps_server_t *srv, embps_request_t *req) {
  embps_snapshots_t *m = srv->snap;
  const embps_snapshot_read_t *r = &req->msg.u.snap_read;
  embps_dispatch_t d = EMBPS_DISPATCH_REPLY;
  pthread_mutex_lock(&m->mu);
  session_t *s = find_locked(m, r->session);
  if (!s) {
    embps_request_fail(srv, req, m->stopping ? EMBPS_ESHUTDOWN : EMBPS_EINVAL,
                       "no snapshot session %016" PRIx64 " (it ended, "
                       "expired or never began)", r->session);
  } else if (s->err_code) {
    embps_request_fail(srv, req, s->err_code, "%s", s->err);
  } else if (s->ending) {
    embps_request_fail(srv, req, EMBPS_EINVAL, "snapshot session %016"
                       PRIx64 " was ended", s->id);
  } else if (s->waiting) {
    embps_request_fail(srv, req, EMBPS_EINVAL, "snapshot session %016"
                       PRIx64 ": a READ of chunk %" PRIu64 " waits already",
                       s->id, s->next_seq);
  } else if (r->seq != s->next_seq) {
    embps_request_fail(srv, req, EMBPS_EINVAL, "snapshot session %016"
                       PRIx64 ": READ of chunk %" PRIu64 ", the next one is "
                       "%" PRIu64, s->id, r->seq, s->next_seq);
  } else if (r->max_bytes < s->chunk_bytes) {
    embps_request_fail(srv, req, EMBPS_EINVAL, "snapshot session %016"
                       PRIx64 ": READ of at most %u bytes, its chunks are %u",
                       s->id, r->max_bytes, s->chunk_bytes);
  } else if (!s->n_ready && s->all_queued) {
    embps_request_fail(srv, req, EMBPS_EINVAL, "snapshot session %016"
                       PRIx64 ": the stream ended at chunk %" PRIu64,
                       s->id, s->next_seq - 1);
  } else {
    s->last_active_ns = embps_now_ns();
    if (s->n_ready) {
      chunk_t *c = &s->ready[s->head];
      reply_chunk(m, req, c);
      s->head = (s->head + 1) % EMBPS_SNAPSHOT_PIPE;
      s->n_ready--;
      s->next_seq++;
      pthread_cond_broadcast(&m->cv);
    } else {
      s->waiting = req;
      d = EMBPS_DISPATCH_DEFERRED;
    }
  }
  pthread_mutex_unlock(&m->mu);
  return d;
}

static void do_end(embps_server_t *srv, embps_request_t *req) {
  embps_snapshots_t *m = srv->snap;
  pthread_mutex_lock(&m->mu);
  session_t *s = find_locked(m, req->msg.u.snap_session);
  const int ended = s && s->ending;
  if (ended)
    embps_request_fail(srv, req, s->err_code, "%s", s->err);
  else if (s)
    fail_locked(m, s, EMBPS_EINVAL, "snapshot session %016" PRIx64 " was "
                "ended", s->id);
  pthread_mutex_unlock(&m->mu);
  if (!s)
    embps_request_fail(srv, req, EMBPS_EINVAL, "no snapshot session %016"
                       PRIx64 " (it ended, expired or never began)",
                       req->msg.u.snap_session);
  else if (!ended)
    embps_request_reply(srv, req, EMBPS_KIND_SNAPSHOT_END, NULL, 0);
}

embps_dispatch_t embps_snapshot_dispatch(embps_server_t *srv,
                                         embps_request_t *req) {
  switch (req->hdr.kind) {
  case EMBPS_KIND_SNAPSHOT_BEGIN:
    return do_begin(srv, req);
  case EMBPS_KIND_SNAPSHOT_READ:
    return do_read(srv, req);
  default:
    do_end(srv, req);
    return EMBPS_DISPATCH_REPLY;
  }
}
