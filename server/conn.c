/* conn.c - connection I/O: the I/O threads and the connections they own,
 * within budgets (conn.h; the threading model is in server.h).
 *
 * I/O threads: each runs one libuv loop and owns the connections the
 * listener (server.c) deals it, for life. Other threads reach a loop only
 * through its queues (sockets handed over, requests the apply thread has
 * finished, strangers to close) and one async wake-up.
 *
 * Reading: every connection reads through a framer (common/framer.h).
 * Small frames are parsed out of a per-connection staging buffer; once a
 * frame's header is known, its body gets an exact-size buffer from the
 * server's body pool, and when most of a body is still to come libuv reads
 * straight into it, so bulk arrays are copied once, by the kernel.
 *
 * Ordering: replies may leave out of order (each carries its request id),
 * but a connection's requests take effect in order: pushes enter the apply
 * FIFO as they arrive, and any other request waits until the connection's
 * earlier pushes are applied, so a pull sees the pushes sent before it.
 *
 * Budgets (bytes): every request body a connection holds (being read,
 * waiting, being served, at the apply thread, held for a synchronous step)
 * and every reply byte not yet sent counts against the connection's budget
 * (--max-conn-buffer-bytes) and the server's (--max-buffer-bytes). A request
 * runs only if its cost (its body, plus its reply for a pull) fits what is
 * left of its connection's budget, or if the connection holds nothing else
 * (so one large request always makes progress); otherwise it waits in its
 * connection's queue. A connection stops being read while its bytes or the
 * server's are spent, or while it has more than INFLIGHT_MAX requests
 * unanswered. So a server holds at most about --max-buffer-bytes plus, per
 * connection with queued requests, its budget and one reply. Stopped
 * connections are retried whenever bytes of theirs are freed and on every
 * sweep (the server's bytes are freed by other threads).
 *
 * Strangers: before a valid hello only a frame of EMBPS_PREAUTH_FRAME_MAX
 * bytes is accepted, and a connection has --hello-timeout seconds to
 * complete its hello, however it trickles; at --max-connections the
 * listener asks the thread with the most of them to close its oldest.
 *
 * Draining (shutdown): stop reading, finish every request already read,
 * flush the replies, close; the loop ends once no push of a closed
 * connection is still at the apply thread. */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "conn.h"
#include "failover.h"
#include "framer.h"
#include "server.h"
#include "watchdog.h"

#define STAGE_LEN (32u << 10)
#define INFLIGHT_MAX 1024u
#define SWEEP_MS 200

struct embps_conn {
  uv_tcp_t tcp;
  embps_io_t *io;
  embps_conn_t *prev, *next;
  embps_framer_t framer;
  embps_request_t *cur; /* frame being read, body allocated */
  uint8_t *stage;
  int authed, reading, closing, close_after_write, dead;
  int stranger; /* counted in io->n_strangers: open, no hello yet */
  size_t write_pending;
  size_t run_bytes;    /* bodies of requests being served or applied */
  size_t queued_bytes; /* bodies being read or waiting in the queue */
  uint32_t in_flight; /* pushes at the apply thread */
  uint32_t barriers;  /* of them, CREATE/DROP: everything after waits */
  uint32_t n_waiting;
  embps_request_t *wait_head, *wait_tail;
  uint64_t last_active_ns, opened_ns;
};

struct embps_io {
  embps_server_t *srv;
  embps_io_shared_t *shared;
  uv_loop_t loop;
  uv_async_t wake;
  uv_timer_t sweep;
  pthread_t tid;
  pthread_mutex_t mu;
  int *fds;
  size_t n_fds, cap_fds;
  embps_request_t *done_head, *done_tail;
  atomic_int draining; /* set by the main thread at shutdown */
  int stopped;
  uint32_t in_flight; /* pushes at the apply thread, closed connections too */
  atomic_uint n_strangers; /* connections without a hello */
  atomic_uint evict;       /* strangers the main thread asks to close */
  embps_conn_t *conns;
  embps_scratch_t scratch;
  embps_watch_t *watch; /* the loop's heartbeat, stamped at each sweep */
};

typedef struct {
  uv_write_t w;
  uint8_t *buf;
  size_t len;
} write_req_t;

static void conn_close(embps_conn_t *c);
static void conn_read_stop(embps_conn_t *c);
static void conn_resume_maybe(embps_conn_t *c);
static void run_waiting(embps_conn_t *c);
static void io_complete(embps_request_t *req);

/* ------------------------------------------------------------ budgets */

/* Moves n bytes into (add) or out of one of c's counters and the server's
 * matching one. Neither ever goes below zero: what is taken out was put in
 * by the same connection. */
static void budget_add(size_t *mine, atomic_size_t *all, size_t n) {
  *mine += n;
  atomic_fetch_add_explicit(all, n, memory_order_relaxed);
}
static void budget_sub(size_t *mine, atomic_size_t *all, size_t n) {
  assert(*mine >= n);
  *mine -= n;
  size_t was = atomic_fetch_sub_explicit(all, n, memory_order_relaxed);
  assert(was >= n);
  (void)was;
}

static size_t conn_held(const embps_conn_t *c) {
  return c->run_bytes + c->write_pending;
}

static size_t server_bytes(const embps_io_shared_t *s) {
  return atomic_load_explicit(&s->run_bytes, memory_order_relaxed) +
         atomic_load_explicit(&s->queued_bytes, memory_order_relaxed);
}

/* Bytes a request will hold while it runs: its body, and for a pull its
 * reply (the meta is decoded here only to learn n_ids x dim). */
static size_t request_cost(const embps_request_t *req) {
  size_t cost = req->body_cap;
  embps_msg_t m;
  if (req->hdr.kind == EMBPS_KIND_PULL &&
      embps_msg_unpack(req->hdr.kind, req->body, req->hdr.meta_len, &m) == 0) {
    cost += (size_t)m.u.pull.n_ids * m.u.pull.dim * sizeof(float);
    embps_msg_free(&m);
  }
  return cost;
}

/* May req (c's next request) run now without overdrawing c's budget? The
 * server's budget only stops reading: gating runs on it too would let
 * connections whose client reads them one after the other wait for each
 * other for ever. */
static int budget_allows(const embps_conn_t *c, const embps_request_t *req) {
  size_t held = conn_held(c);
  return !held ||
         held + request_cost(req) <= c->io->srv->cfg.max_conn_buffer_bytes;
}

/* Must c stop being read? */
static int conn_over_budget(const embps_conn_t *c) {
  const embps_server_config_t *cfg = &c->io->srv->cfg;
  return conn_held(c) + c->queued_bytes >= cfg->max_conn_buffer_bytes ||
         server_bytes(c->io->shared) >= cfg->max_buffer_bytes ||
         c->in_flight + c->n_waiting > INFLIGHT_MAX;
}

/* Frees a request that was running on c (or never held a body). */
static void run_free(embps_conn_t *c, embps_request_t *req) {
  budget_sub(&c->run_bytes, &c->io->shared->run_bytes, req->body_cap);
  embps_request_free(req);
}

/* A connection with no hello yet stops counting as a stranger. */
static void stranger_done(embps_conn_t *c) {
  if (c->stranger) {
    c->stranger = 0;
    atomic_fetch_sub(&c->io->n_strangers, 1);
  }
}

/* ------------------------------------------------------------ writing */

static void on_write(uv_write_t *w, int status) {
  write_req_t *wr = (write_req_t *)w;
  embps_conn_t *c = w->data;
  budget_sub(&c->write_pending, &c->io->shared->run_bytes, wr->len);
  free(wr->buf);
  free(wr);
  if (status < 0 && !c->closing) {
    LOG_DEBUG("write failed: %s", uv_strerror(status));
    conn_close(c);
    return;
  }
  if (c->close_after_write && c->write_pending == 0) {
    conn_close(c);
  } else {
    run_waiting(c);
    conn_resume_maybe(c);
  }
}

/* Sends req's reply (taking it) and frees req. */
static void send_reply(embps_conn_t *c, embps_request_t *req) {
  embps_failover_check_reply(c->io->srv, req); /* a fence that just ended */
  uint8_t *buf = req->reply;
  size_t len = req->reply_len;
  req->reply = NULL;
  run_free(c, req);
  if (c->closing) {
    free(buf);
    return;
  }
  if (!buf || !len) { /* could not even build an error frame */
    free(buf);
    conn_close(c);
    return;
  }
  write_req_t *wr = malloc(sizeof *wr);
  if (!wr) {
    free(buf);
    conn_close(c);
    return;
  }
  wr->buf = buf;
  wr->len = len;
  wr->w.data = c;
  uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
  budget_add(&c->write_pending, &c->io->shared->run_bytes, len);
  atomic_fetch_add_explicit(&c->io->srv->counters.bytes_out, len,
                            memory_order_relaxed);
  int rc = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &b, 1, on_write);
  if (rc) {
    budget_sub(&c->write_pending, &c->io->shared->run_bytes, len);
    free(buf);
    free(wr);
    conn_close(c);
  }
}

/* ------------------------------------------------------------ requests */

/* Kinds after which everything of the connection waits until they are
 * applied (a push finds its table at dispatch): 1 or 0. */
static uint32_t barrier_kind(uint16_t kind) {
  return kind == EMBPS_KIND_CREATE || kind == EMBPS_KIND_DROP;
}

/* Runs req, whose body c holds in queued_bytes. */
static void run_request(embps_conn_t *c, embps_request_t *req) {
  embps_server_t *srv = c->io->srv;
  budget_sub(&c->queued_bytes, &c->io->shared->queued_bytes, req->body_cap);
  budget_add(&c->run_bytes, &c->io->shared->run_bytes, req->body_cap);
  embps_dispatch_t d = embps_dispatch(srv, req, &c->authed, &c->io->scratch);
  if (c->authed) { /* its hello succeeded: frames up to the full limit */
    stranger_done(c);
    embps_framer_set_limit(&c->framer, srv->cfg.max_frame_bytes);
  }
  switch (d) {
  case EMBPS_DISPATCH_DEFERRED:
    c->in_flight++;
    c->barriers += barrier_kind(req->hdr.kind);
    c->io->in_flight++;
    break;
  case EMBPS_DISPATCH_CLOSE:
    c->close_after_write = 1;
    conn_read_stop(c);
    send_reply(c, req);
    break;
  case EMBPS_DISPATCH_REPLY:
    send_reply(c, req);
    break;
  }
}

/* Kinds handed to the apply thread or the checkpoint thread, in order. */
static int deferred_kind(uint16_t kind) {
  return kind == EMBPS_KIND_PUSH || kind == EMBPS_KIND_CREATE ||
         kind == EMBPS_KIND_DROP || kind == EMBPS_KIND_CHECKPOINT ||
         kind == EMBPS_KIND_ALTER || kind == EMBPS_KIND_WRITE_ROWS ||
         kind == EMBPS_KIND_EVICT;
}

/* Kinds that need not wait for the connection's requests in flight: the
 * deferred ones (the apply FIFO orders those) and FETCH, which reads no
 * table and whose stream the feed orders itself. A follower keeps two
 * FETCHes in flight, the first held until a record comes: the second
 * must reach the feed at once, since it carries the acknowledgement a
 * synchronous push waits for. */
static int unordered_kind(uint16_t kind) {
  return deferred_kind(kind) || kind == EMBPS_KIND_FETCH;
}

/* A request must wait while earlier requests of its connection wait, or
 * while earlier deferred requests are in flight (unless it is unordered,
 * above), or while a CREATE/DROP is (a push finds its table at
 * dispatch), or until its cost fits the budgets. */
static int must_wait(const embps_conn_t *c, const embps_request_t *req) {
  return c->wait_head || c->barriers ||
         (c->in_flight && !unordered_kind(req->hdr.kind)) ||
         !budget_allows(c, req);
}

static void handle_frame(embps_conn_t *c, embps_request_t *req) {
  req->conn = c;
  if (must_wait(c, req)) {
    req->next = NULL;
    if (c->wait_tail)
      c->wait_tail->next = req;
    else
      c->wait_head = req;
    c->wait_tail = req;
    c->n_waiting++;
    return;
  }
  run_request(c, req);
}

static void run_waiting(embps_conn_t *c) {
  while (c->wait_head && !c->closing && !c->close_after_write) {
    embps_request_t *req = c->wait_head;
    if (c->barriers || (c->in_flight && !unordered_kind(req->hdr.kind)) ||
        !budget_allows(c, req))
      return;
    c->wait_head = req->next;
    if (!c->wait_head)
      c->wait_tail = NULL;
    c->n_waiting--;
    run_request(c, req);
  }
}

/* ------------------------------------------------------------ reading */

/* Whether c is on its way out: nothing more of it is read. */
static int conn_ending(const embps_conn_t *c) {
  return c->closing || c->close_after_write;
}

/* Refuses the frame whose header is h. With keep, the connection goes on
 * (the body is skipped unread); otherwise it is closed after the reply. */
static void fail_frame(embps_conn_t *c, const embps_frame_header_t *h,
                       int code, const char *msg, int keep) {
  embps_request_t *req = calloc(1, sizeof *req);
  if (!req) {
    conn_close(c);
    return;
  }
  req->conn = c;
  if (h)
    req->hdr = *h;
  embps_request_fail(c->io->srv, req, code, "%s", msg);
  if (!keep) {
    c->close_after_write = 1;
    conn_read_stop(c);
  }
  send_reply(c, req); /* replies carry their request id: no order needed */
}

/* The framer's header callback (framer.h): refuses a bad or oversized
 * header, else gives the body an exact-size buffer (c->cur, counted in
 * queued_bytes). The framer's limit is the pre-hello one until c's hello
 * succeeds (run_request). */
static int on_header(void *owner, const embps_frame_header_t *h, int rc,
                     embps_framer_seg_t seg[2]) {
  embps_conn_t *c = owner;
  embps_server_t *srv = c->io->srv;
  if (rc == EMBPS_EFRAMESIZE && !c->authed) { /* a stranger: nothing held */
    char msg[160];
    snprintf(msg, sizeof msg, "frame of %u bytes before a hello (at most %u "
             "bytes until a hello succeeds)", h->body_len,
             EMBPS_PREAUTH_FRAME_MAX);
    fail_frame(c, h, rc, msg, 0);
    return EMBPS_FRAMER_STOP;
  }
  if (rc == EMBPS_EFRAMESIZE) { /* well framed, too big: skip it, go on */
    char msg[128];
    snprintf(msg, sizeof msg, "frame of %u bytes exceeds --max-frame-bytes "
             "%llu", h->body_len,
             (unsigned long long)srv->cfg.max_frame_bytes);
    fail_frame(c, h, rc, msg, 1);
    return conn_ending(c) ? EMBPS_FRAMER_STOP : EMBPS_FRAMER_SKIP;
  }
  if (rc) {
    fail_frame(c, NULL, rc, "malformed frame header (not the embps "
               "protocol?)", 0);
    return EMBPS_FRAMER_STOP;
  }
  embps_request_t *req = calloc(1, sizeof *req);
  embps_bufpool_t *bodies = &srv->bodies;
  uint8_t *body =
      req ? embps_bufpool_take(bodies, h->body_len, &req->body_cap) : NULL;
  if (!body) {
    free(req);
    fail_frame(c, h, EMBPS_ENOMEM, "out of memory for a request", 0);
    return EMBPS_FRAMER_STOP;
  }
  req->hdr = *h;
  req->body = body;
  req->bodies = bodies;
  req->complete = io_complete;
  budget_add(&c->queued_bytes, &c->io->shared->queued_bytes, req->body_cap);
  c->cur = req;
  seg[0] = (embps_framer_seg_t){body, h->body_len};
  return EMBPS_FRAMER_READ;
}

/* The framer's frame callback: c->cur's body is in. */
static int on_frame(void *owner, const embps_frame_header_t *h) {
  embps_conn_t *c = owner;
  embps_request_t *req = c->cur;
  (void)h;
  c->cur = NULL;
  handle_frame(c, req);
  return conn_ending(c) ? EMBPS_FRAMER_STOP : EMBPS_FRAMER_READ;
}

static const embps_framer_ops_t framer_ops = {on_header, on_frame};

/* Over budget, a connection is read only to the end of the frame whose
 * body is allocated (and counted) already, then stopped (on_read): stopping
 * inside it could hold its bytes for ever. */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  embps_conn_t *c = h->data;
  uint8_t *dst;
  size_t want = embps_framer_want(&c->framer, &dst);
  (void)suggested;
  if (c->cur && want >= STAGE_LEN) { /* the body's own buffer */
    buf->base = (char *)dst;
    buf->len = want;
  } else {
    buf->base = (char *)c->stage;
    buf->len = c->cur && conn_over_budget(c)
                   ? embps_framer_body_left(&c->framer)
                   : STAGE_LEN;
  }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  embps_conn_t *c = s->data;
  if (nread < 0) {
    if (nread != UV_EOF)
      LOG_DEBUG("read failed: %s", uv_strerror((int)nread));
    /* the peer is gone: nobody can read the replies still owed */
    conn_close(c);
    return;
  }
  if (nread == 0)
    return;
  c->last_active_ns = embps_now_ns();
  atomic_fetch_add_explicit(&c->io->srv->counters.bytes_in, (uint64_t)nread,
                            memory_order_relaxed);
  /* a stop means c is ending: the bytes after it are not wanted */
  if ((uint8_t *)buf->base == c->stage)
    (void)embps_framer_feed(&c->framer, c->stage, (size_t)nread);
  else
    (void)embps_framer_advance(&c->framer, (size_t)nread);
  if (c->reading && !c->cur && conn_over_budget(c))
    conn_read_stop(c);
}

static void conn_read_stop(embps_conn_t *c) {
  if (!c->reading)
    return;
  int rc = uv_read_stop((uv_stream_t *)&c->tcp);
  if (rc)
    LOG_DEBUG("cannot stop reading: %s", uv_strerror(rc));
  c->reading = 0;
}

static void conn_resume_maybe(embps_conn_t *c) {
  if (c->reading || c->closing || c->close_after_write || c->io->draining)
    return;
  const embps_server_config_t *cfg = &c->io->srv->cfg;
  if (conn_held(c) + c->queued_bytes <= cfg->max_conn_buffer_bytes / 2 &&
      server_bytes(c->io->shared) < cfg->max_buffer_bytes &&
      c->in_flight + c->n_waiting <= INFLIGHT_MAX / 2) {
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc) {
      LOG_DEBUG("cannot resume reading: %s", uv_strerror(rc));
      conn_close(c);
      return;
    }
    c->reading = 1;
  }
}

/* ------------------------------------------------------------ connections */

static void conn_free(embps_conn_t *c) {
  free(c->stage);
  free(c);
}

static void on_close(uv_handle_t *h) {
  embps_conn_t *c = h->data;
  embps_io_t *io = c->io;
  if (c->prev)
    c->prev->next = c->next;
  else
    io->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  atomic_fetch_sub(&io->shared->open_conns, 1);
  atomic_fetch_sub(&io->srv->counters.connections, 1);
  if (c->cur) {
    budget_sub(&c->queued_bytes, &c->io->shared->queued_bytes,
               c->cur->body_cap);
    embps_request_free(c->cur);
  }
  c->cur = NULL;
  while (c->wait_head) {
    embps_request_t *r = c->wait_head;
    c->wait_head = r->next;
    budget_sub(&c->queued_bytes, &c->io->shared->queued_bytes, r->body_cap);
    embps_request_free(r);
  }
  if (c->in_flight)
    c->dead = 1; /* freed when the apply thread hands back the last one */
  else
    conn_free(c);
}

static void conn_close(embps_conn_t *c) {
  if (c->closing)
    return;
  c->closing = 1;
  c->reading = 0;
  stranger_done(c);
  uv_close((uv_handle_t *)&c->tcp, on_close);
}

/* Close callback of a handle that never became a connection. */
static void on_close_unopened(uv_handle_t *h) {
  embps_conn_t *c = h->data;
  atomic_fetch_sub(&c->io->shared->open_conns, 1);
  conn_free(c);
}

static void conn_open(embps_io_t *io, int fd) {
  embps_conn_t *c = calloc(1, sizeof *c);
  if (c) {
    c->stage = malloc(STAGE_LEN);
    embps_framer_init(&c->framer, &framer_ops, c, EMBPS_PREAUTH_FRAME_MAX);
  }
  int rc = c && c->stage ? uv_tcp_init(&io->loop, &c->tcp) : UV_ENOMEM;
  if (rc) {
    LOG_WARN("cannot set up a connection: %s", uv_strerror(rc));
    if (c)
      conn_free(c);
    close(fd);
    atomic_fetch_sub(&io->shared->open_conns, 1);
    return;
  }
  c->io = io;
  c->tcp.data = c;
  rc = uv_tcp_open(&c->tcp, fd);
  if (rc) { /* never linked: closed without touching io->conns */
    LOG_WARN("cannot open a connection: %s", uv_strerror(rc));
    close(fd);
    c->closing = 1;
    uv_close((uv_handle_t *)&c->tcp, on_close_unopened);
    return;
  }
  c->next = io->conns;
  if (io->conns)
    io->conns->prev = c;
  io->conns = c;
  atomic_fetch_add(&io->srv->counters.connections, 1);
  c->stranger = 1;
  atomic_fetch_add(&io->n_strangers, 1);
  rc = uv_tcp_nodelay(&c->tcp, 1);
  if (rc)
    LOG_DEBUG("TCP_NODELAY: %s", uv_strerror(rc));
  c->last_active_ns = c->opened_ns = embps_now_ns();
  rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
  if (rc) {
    LOG_WARN("cannot read a connection: %s", uv_strerror(rc));
    conn_close(c);
    return;
  }
  c->reading = 1;
}

/* A finished push from the apply thread, back on its connection's loop. */
static void push_done(embps_request_t *req) {
  embps_conn_t *c = req->conn;
  uint32_t barrier = barrier_kind(req->hdr.kind);
  assert(c->in_flight > 0 && c->io->in_flight > 0 && c->barriers >= barrier);
  c->in_flight--;
  c->barriers -= barrier;
  c->io->in_flight--;
  if (c->dead) {
    run_free(c, req);
    if (!c->in_flight)
      conn_free(c);
    return;
  }
  send_reply(c, req);
  run_waiting(c);
  conn_resume_maybe(c);
}

/* ------------------------------------------------------------ I/O thread */

static int conn_idle(const embps_conn_t *c) {
  return !c->in_flight && !c->wait_head && !c->write_pending && !c->cur;
}

static void drain_check(embps_io_t *io) {
  if (!io->draining || io->stopped)
    return;
  for (embps_conn_t *c = io->conns, *next; c; c = next) {
    next = c->next;
    conn_read_stop(c);
    if (!c->in_flight && !c->wait_head && !c->write_pending)
      conn_close(c);
  }
  /* closed connections may still have pushes at the apply thread: their
   * replies come back to this loop, which must still be running */
  if (!io->conns && !io->in_flight) {
    io->stopped = 1;
    uv_close((uv_handle_t *)&io->wake, NULL);
    uv_close((uv_handle_t *)&io->sweep, NULL);
  }
}

/* Closes io's oldest connection without a hello (the list is newest
 * first), to make room under --max-connections. */
static void evict_stranger(embps_io_t *io) {
  embps_conn_t *oldest = NULL;
  for (embps_conn_t *c = io->conns; c; c = c->next)
    if (c->stranger && !c->closing)
      oldest = c;
  if (oldest) {
    LOG_DEBUG("--max-connections reached: closing a connection that has "
              "sent no hello");
    conn_close(oldest);
  }
}

static void on_wake(uv_async_t *a) {
  embps_io_t *io = a->data;
  pthread_mutex_lock(&io->mu);
  embps_request_t *done = io->done_head;
  io->done_head = io->done_tail = NULL;
  int *fds = io->fds;
  size_t n_fds = io->n_fds;
  io->fds = NULL;
  io->n_fds = io->cap_fds = 0;
  pthread_mutex_unlock(&io->mu);
  for (size_t i = 0; i < n_fds; i++) {
    if (io->draining) {
      close(fds[i]);
      atomic_fetch_sub(&io->shared->open_conns, 1);
    } else {
      conn_open(io, fds[i]);
    }
  }
  free(fds);
  while (done) {
    embps_request_t *next = done->next;
    done->next = NULL;
    push_done(done);
    done = next;
  }
  for (unsigned n = atomic_exchange(&io->evict, 0); n; n--)
    evict_stranger(io);
  drain_check(io);
}

static void on_sweep(uv_timer_t *t) {
  embps_io_t *io = t->data;
  embps_watch_beat(io->watch);
  uint32_t idle_s = io->srv->cfg.idle_timeout_s;
  uint64_t hello_ns = (uint64_t)io->srv->cfg.hello_timeout_s * 1000000000ULL;
  uint64_t now = embps_now_ns();
  for (embps_conn_t *c = io->conns, *next; c; c = next) {
    next = c->next;
    if (c->closing)
      continue;
    if (c->stranger && now - c->opened_ns > hello_ns) {
      LOG_DEBUG("closing a connection with no hello after %us",
                io->srv->cfg.hello_timeout_s);
      conn_close(c);
    } else if (idle_s && conn_idle(c) &&
               now - c->last_active_ns > (uint64_t)idle_s * 1000000000ULL) {
      LOG_DEBUG("closing a connection idle for %us", idle_s);
      conn_close(c);
    } else { /* budgets freed by other threads */
      run_waiting(c);
      conn_resume_maybe(c);
    }
  }
  drain_check(io);
}

/* Wakes io's loop (from any thread); fails only once io has stopped,
 * which nothing may outlive (drain_check waits for every push). */
static void io_wake(embps_io_t *io) {
  int rc = uv_async_send(&io->wake);
  if (rc)
    LOG_ERROR("cannot wake an I/O thread: %s", uv_strerror(rc));
}

static void *io_main(void *arg) {
  static atomic_uint started;
  embps_io_t *io = arg;
  char name[32];
  snprintf(name, sizeof name, "io-%u", atomic_fetch_add(&started, 1));
  io->watch = embps_watch_start(name, 1); /* /healthz */
  int rc = uv_run(&io->loop, UV_RUN_DEFAULT); /* until drain_check closes */
  if (rc)
    LOG_WARN("an I/O loop stopped with handles active");
  embps_watch_stop(io->watch);
  return NULL;
}

/* A deferred request's completion (req->complete), on the apply thread:
 * queues it for its connection's loop and wakes that loop. */
static void io_complete(embps_request_t *req) {
  embps_io_t *io = req->conn->io;
  pthread_mutex_lock(&io->mu);
  req->next = NULL;
  if (io->done_tail)
    io->done_tail->next = req;
  else
    io->done_head = req;
  io->done_tail = req;
  pthread_mutex_unlock(&io->mu);
  io_wake(io);
}

/* ------------------------------------------------------------ start, stop */

static void close_unclosed(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

void embps_loop_close(uv_loop_t *loop, const char *what) {
  uv_walk(loop, close_unclosed, NULL);
  if (uv_run(loop, UV_RUN_DEFAULT)) /* the close callbacks */
    LOG_WARN("%s: handles active after closing them all", what);
  int rc = uv_loop_close(loop);
  if (rc)
    LOG_WARN("%s closed with handles open: %s", what, uv_strerror(rc));
}

void embps_io_close(embps_io_t *io) {
  if (!io)
    return;
  embps_loop_close(&io->loop, "an I/O loop");
  embps_table_scratch_close(&io->scratch.table);
  embps_dedup_close(&io->scratch.dedup);
  pthread_mutex_destroy(&io->mu);
  free(io->fds);
  free(io);
}

int embps_io_start(embps_server_t *srv, embps_io_shared_t *shared,
                   embps_io_t **out) {
  *out = NULL;
  embps_io_t *io = calloc(1, sizeof *io);
  if (!io)
    return UV_ENOMEM;
  io->srv = srv;
  io->shared = shared;
  int rc = uv_loop_init(&io->loop);
  if (rc) {
    free(io);
    return rc;
  }
  pthread_mutex_init(&io->mu, NULL);
  embps_table_scratch_init(&io->scratch.table);
  embps_dedup_init(&io->scratch.dedup);
  rc = uv_async_init(&io->loop, &io->wake, on_wake);
  io->wake.data = io;
  if (!rc)
    rc = uv_timer_init(&io->loop, &io->sweep);
  io->sweep.data = io;
  if (!rc)
    rc = uv_timer_start(&io->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
  if (!rc)
    rc = -pthread_create(&io->tid, NULL, io_main, io);
  if (rc) {
    embps_io_close(io);
    return rc;
  }
  *out = io;
  return 0;
}

void embps_io_add(embps_io_t *io, int fd) {
  pthread_mutex_lock(&io->mu);
  if (io->n_fds == io->cap_fds) {
    size_t cap = io->cap_fds ? 2 * io->cap_fds : 16;
    int *v = realloc(io->fds, cap * sizeof *v);
    if (!v) {
      pthread_mutex_unlock(&io->mu);
      close(fd);
      atomic_fetch_sub(&io->shared->open_conns, 1);
      return;
    }
    io->fds = v;
    io->cap_fds = cap;
  }
  io->fds[io->n_fds++] = fd;
  pthread_mutex_unlock(&io->mu);
  io_wake(io);
}

unsigned embps_io_strangers(const embps_io_t *io) {
  unsigned n = atomic_load(&io->n_strangers), asked = atomic_load(&io->evict);
  return n > asked ? n - asked : 0;
}

void embps_io_evict(embps_io_t *io) {
  atomic_fetch_add(&io->evict, 1);
  io_wake(io);
}

void embps_io_drain(embps_io_t *io) {
  atomic_store(&io->draining, 1);
  io_wake(io);
}

void embps_io_join(embps_io_t *io) { pthread_join(io->tid, NULL); }
