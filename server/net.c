/* net.c - a server's lifecycle, sockets and event loops (the threading
 * model and the create/run/stop/destroy contract are in server.h).
 *
 * Lifecycle: a server is a net_t whose first member is the embps_server_t
 * callers hold; every handle and thread reaches it through their data
 * pointers, so a process may hold several. embps_server_create runs
 * net_start's steps in order and, on a failure, undoes those done with
 * the same two functions destroy uses (net_stop_threads, net_free).
 *
 * Accepting: the main loop polls a non-blocking listening socket and deals
 * accepted fds round-robin to the I/O threads (Debian's libuv 1.44 has no
 * SO_REUSEPORT flag, and round-robin balances better than a shared socket).
 *
 * Reading: small frames are parsed out of a per-connection staging buffer;
 * once a frame's header is known, its body gets an exact-size buffer, and
 * when most of a body is still to come libuv reads straight into it, so
 * bulk arrays are copied once, by the kernel.
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
 * complete its hello, however it trickles; at --max-connections, the oldest
 * connection without a hello is closed to make room for a new one.
 *
 * Out of descriptors: when accept fails with EMFILE/ENFILE the listener is
 * not polled for ACCEPT_RETRY_MS (a level-triggered poll would spin), and
 * the warning is logged at most once per LOG_EVERY_MS.
 *
 * Shutdown (embps_server_stop, an async handle that keeps no loop alive;
 * the daemon's SIGTERM/SIGINT do the same): stop accepting and reading,
 * finish every request already read, flush replies, close, take the final
 * checkpoint, stop the apply thread. */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "apply.h"
#include "cluster.h"
#include "durable.h"
#include "evict.h"
#include "notify.h"
#include "server.h"
#include "snapshot.h"

#define STAGE_LEN (32u << 10)
#define INFLIGHT_MAX 1024u
#define SWEEP_MS 200
#define ACCEPT_RETRY_MS 100
#define LOG_EVERY_MS 1000
#define FD_RESERVE 64 /* descriptors beyond the connections: loops, files */

typedef struct io_thread io_thread_t;

struct embps_conn {
  uv_tcp_t tcp;
  io_thread_t *io;
  embps_conn_t *prev, *next;
  uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
  size_t hdr_got;
  embps_request_t *cur; /* frame being read, body allocated */
  size_t body_got;
  size_t skip; /* bytes of a refused (oversized) frame still to discard */
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

struct io_thread {
  embps_server_t *srv;
  struct net *net;
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
};

/* At most one log line per LOG_EVERY_MS for a repeated event. */
typedef struct {
  uint64_t next_ns, skipped;
} ratelimit_t;

/* A server: the handle callers hold is &net->srv. */
typedef struct net {
  embps_server_t srv;
  uv_loop_t loop;
  uv_poll_t listen_poll;
  uv_timer_t accept_retry;
  uv_signal_t sig_term, sig_int; /* cfg.handle_signals only */
  uv_async_t stop_async; /* embps_server_stop; open until destroy */
  int listen_fd, port, stopping;
  int loop_ready, metrics_started, cluster_started, threads_stopped;
  io_thread_t *io;
  uint32_t n_io; /* I/O threads started */
  uint32_t next_io;
  atomic_uint open_conns;
  /* bytes held by all connections (see "Budgets") */
  atomic_size_t run_bytes, queued_bytes;
  ratelimit_t accept_log;
} net_t;

typedef struct {
  uv_write_t w;
  uint8_t *buf;
  size_t len;
} write_req_t;

static void conn_close(embps_conn_t *c);
static void conn_read_stop(embps_conn_t *c);
static void conn_resume_maybe(embps_conn_t *c);
static void run_waiting(embps_conn_t *c);
static void net_complete(embps_request_t *req);

/* 1 when the event may be logged now; *skipped is how many times it was
 * not since the last line. */
static int ratelimit_pass(ratelimit_t *r, uint64_t *skipped) {
  uint64_t now = embps_now_ns();
  if (now < r->next_ns) {
    r->skipped++;
    return 0;
  }
  r->next_ns = now + (uint64_t)LOG_EVERY_MS * 1000000u;
  *skipped = r->skipped;
  r->skipped = 0;
  return 1;
}

/* ------------------------------------------------------------ budgets */

/* Moves n bytes into (add) or out of one of c's counters and the server's
 * matching one. */
static void budget_add(size_t *mine, atomic_size_t *all, size_t n) {
  *mine += n;
  atomic_fetch_add_explicit(all, n, memory_order_relaxed);
}
static void budget_sub(size_t *mine, atomic_size_t *all, size_t n) {
  *mine -= n;
  atomic_fetch_sub_explicit(all, n, memory_order_relaxed);
}

static size_t conn_held(const embps_conn_t *c) {
  return c->run_bytes + c->write_pending;
}

static size_t server_bytes(const net_t *net) {
  return atomic_load_explicit(&net->run_bytes, memory_order_relaxed) +
         atomic_load_explicit(&net->queued_bytes, memory_order_relaxed);
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
         server_bytes(c->io->net) >= cfg->max_buffer_bytes ||
         c->in_flight + c->n_waiting > INFLIGHT_MAX;
}

/* Frees a request that was running on c (or never held a body). */
static void run_free(embps_conn_t *c, embps_request_t *req) {
  budget_sub(&c->run_bytes, &c->io->net->run_bytes, req->body_cap);
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
  budget_sub(&c->write_pending, &c->io->net->run_bytes, wr->len);
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
  budget_add(&c->write_pending, &c->io->net->run_bytes, len);
  atomic_fetch_add_explicit(&c->io->srv->counters.bytes_out, len,
                            memory_order_relaxed);
  int rc = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &b, 1, on_write);
  if (rc) {
    budget_sub(&c->write_pending, &c->io->net->run_bytes, len);
    free(buf);
    free(wr);
    conn_close(c);
  }
}

/* ------------------------------------------------------------ requests */

/* Runs req, whose body c holds in queued_bytes. */
static void run_request(embps_conn_t *c, embps_request_t *req) {
  embps_server_t *srv = c->io->srv;
  budget_sub(&c->queued_bytes, &c->io->net->queued_bytes, req->body_cap);
  budget_add(&c->run_bytes, &c->io->net->run_bytes, req->body_cap);
  embps_dispatch_t d = embps_dispatch(srv, req, &c->authed, &c->io->scratch);
  if (c->authed)
    stranger_done(c);
  switch (d) {
  case EMBPS_DISPATCH_DEFERRED:
    c->in_flight++;
    if (req->hdr.kind == EMBPS_KIND_CREATE || req->hdr.kind == EMBPS_KIND_DROP)
      c->barriers++;
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

/* A request must wait while earlier requests of its connection wait, or
 * while earlier deferred requests are in flight (unless it is deferred
 * itself: the apply FIFO orders those), or while a CREATE/DROP is (a push
 * finds its table at dispatch), or until its cost fits the budgets. */
static int must_wait(const embps_conn_t *c, const embps_request_t *req) {
  return c->wait_head || c->barriers ||
         (c->in_flight && !deferred_kind(req->hdr.kind)) ||
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
    if (c->barriers || (c->in_flight && !deferred_kind(req->hdr.kind)) ||
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

static void frame_complete(embps_conn_t *c) {
  embps_request_t *req = c->cur;
  c->cur = NULL;
  c->hdr_got = 0;
  c->body_got = 0;
  handle_frame(c, req);
}

/* A header is complete: check it, then allocate the request and body. */
static int start_frame(embps_conn_t *c) {
  embps_server_t *srv = c->io->srv;
  embps_frame_header_t h;
  int rc = embps_frame_header_decode(
      c->hdr, c->authed ? srv->cfg.max_frame_bytes : EMBPS_PREAUTH_FRAME_MAX,
      &h);
  if (rc == EMBPS_EFRAMESIZE && !c->authed) { /* a stranger: nothing held */
    char msg[160];
    snprintf(msg, sizeof msg, "frame of %u bytes before a hello (at most %u "
             "bytes until a hello succeeds)", h.body_len,
             EMBPS_PREAUTH_FRAME_MAX);
    fail_frame(c, &h, rc, msg, 0);
    return -1;
  }
  if (rc == EMBPS_EFRAMESIZE) { /* well framed, too big: skip it, go on */
    char msg[128];
    snprintf(msg, sizeof msg, "frame of %u bytes exceeds --max-frame-bytes "
             "%llu", h.body_len, (unsigned long long)srv->cfg.max_frame_bytes);
    c->hdr_got = 0;
    c->skip = h.body_len;
    fail_frame(c, &h, rc, msg, c->authed);
    return c->authed ? 0 : -1;
  }
  if (rc) {
    fail_frame(c, NULL, rc, "malformed frame header (not the embps "
               "protocol?)", 0);
    return -1;
  }
  embps_request_t *req = calloc(1, sizeof *req);
  embps_bufpool_t *bodies = &c->io->srv->bodies;
  uint8_t *body =
      req ? embps_bufpool_take(bodies, h.body_len, &req->body_cap) : NULL;
  if (!body) {
    free(req);
    fail_frame(c, &h, EMBPS_ENOMEM, "out of memory for a request", 0);
    return -1;
  }
  req->hdr = h;
  req->body = body;
  req->bodies = bodies;
  req->complete = net_complete;
  budget_add(&c->queued_bytes, &c->io->net->queued_bytes, req->body_cap);
  c->cur = req;
  c->body_got = 0;
  if (h.body_len == 0)
    frame_complete(c);
  return 0;
}

/* Parses bytes read into the staging buffer. */
static void consume(embps_conn_t *c, const uint8_t *p, size_t n) {
  while (n && !c->closing && !c->close_after_write) {
    if (c->skip) {
      size_t take = c->skip < n ? c->skip : n;
      c->skip -= take;
      p += take;
      n -= take;
    } else if (!c->cur) {
      size_t take = EMBPS_FRAME_HEADER_LEN - c->hdr_got;
      if (take > n)
        take = n;
      memcpy(c->hdr + c->hdr_got, p, take);
      c->hdr_got += take;
      p += take;
      n -= take;
      if (c->hdr_got == EMBPS_FRAME_HEADER_LEN && start_frame(c))
        return;
    } else {
      size_t take = c->cur->hdr.body_len - c->body_got;
      if (take > n)
        take = n;
      memcpy(c->cur->body + c->body_got, p, take);
      c->body_got += take;
      p += take;
      n -= take;
      if (c->body_got == c->cur->hdr.body_len)
        frame_complete(c);
    }
  }
}

/* Over budget, a connection is read only to the end of the frame whose
 * body is allocated (and counted) already, then stopped (on_read): stopping
 * inside it could hold its bytes for ever. */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  embps_conn_t *c = h->data;
  size_t rest = c->cur ? c->cur->hdr.body_len - c->body_got : 0;
  (void)suggested;
  if (c->cur && rest >= STAGE_LEN) {
    buf->base = (char *)c->cur->body + c->body_got;
    buf->len = rest;
  } else {
    buf->base = (char *)c->stage;
    buf->len = c->cur && conn_over_budget(c) ? rest : STAGE_LEN;
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
  if ((uint8_t *)buf->base == c->stage) {
    consume(c, c->stage, (size_t)nread);
  } else {
    c->body_got += (size_t)nread;
    if (c->body_got == c->cur->hdr.body_len)
      frame_complete(c);
  }
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
      server_bytes(c->io->net) < cfg->max_buffer_bytes &&
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
  io_thread_t *io = c->io;
  if (c->prev)
    c->prev->next = c->next;
  else
    io->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  atomic_fetch_sub(&io->net->open_conns, 1);
  atomic_fetch_sub(&io->srv->counters.connections, 1);
  if (c->cur) {
    budget_sub(&c->queued_bytes, &c->io->net->queued_bytes, c->cur->body_cap);
    embps_request_free(c->cur);
  }
  c->cur = NULL;
  while (c->wait_head) {
    embps_request_t *r = c->wait_head;
    c->wait_head = r->next;
    budget_sub(&c->queued_bytes, &c->io->net->queued_bytes, r->body_cap);
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
  atomic_fetch_sub(&c->io->net->open_conns, 1);
  conn_free(c);
}

static void conn_open(io_thread_t *io, int fd) {
  embps_conn_t *c = calloc(1, sizeof *c);
  if (c)
    c->stage = malloc(STAGE_LEN);
  int rc = c && c->stage ? uv_tcp_init(&io->loop, &c->tcp) : UV_ENOMEM;
  if (rc) {
    LOG_WARN("cannot set up a connection: %s", uv_strerror(rc));
    if (c)
      conn_free(c);
    close(fd);
    atomic_fetch_sub(&io->net->open_conns, 1);
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
  c->in_flight--;
  if (req->hdr.kind == EMBPS_KIND_CREATE || req->hdr.kind == EMBPS_KIND_DROP)
    c->barriers--;
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

static void drain_check(io_thread_t *io) {
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
static void evict_stranger(io_thread_t *io) {
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
  io_thread_t *io = a->data;
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
      atomic_fetch_sub(&io->net->open_conns, 1);
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
  io_thread_t *io = t->data;
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
static void io_wake(io_thread_t *io) {
  int rc = uv_async_send(&io->wake);
  if (rc)
    LOG_ERROR("cannot wake an I/O thread: %s", uv_strerror(rc));
}

static void *io_main(void *arg) {
  io_thread_t *io = arg;
  int rc = uv_run(&io->loop, UV_RUN_DEFAULT); /* until drain_check closes */
  if (rc)
    LOG_WARN("an I/O loop stopped with handles active");
  return NULL;
}

/* A deferred request's completion (req->complete), on the apply thread:
 * queues it for its connection's loop and wakes that loop. */
static void net_complete(embps_request_t *req) {
  io_thread_t *io = req->conn->io;
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

/* ------------------------------------------------------------ main loop */

static void deal_fd(net_t *net, int fd) {
  io_thread_t *io = &net->io[net->next_io++ % net->srv.cfg.io_threads];
  pthread_mutex_lock(&io->mu);
  if (io->n_fds == io->cap_fds) {
    size_t cap = io->cap_fds ? 2 * io->cap_fds : 16;
    int *v = realloc(io->fds, cap * sizeof *v);
    if (!v) {
      pthread_mutex_unlock(&io->mu);
      close(fd);
      atomic_fetch_sub(&net->open_conns, 1);
      return;
    }
    io->fds = v;
    io->cap_fds = cap;
  }
  io->fds[io->n_fds++] = fd;
  pthread_mutex_unlock(&io->mu);
  io_wake(io);
}

/* Over --max-connections: say so in one error frame, then close. */
static void refuse_fd(net_t *net, int fd) {
  uint8_t *frame;
  size_t len;
  char msg[96];
  snprintf(msg, sizeof msg, "server has reached --max-connections %u",
           net->srv.cfg.max_connections);
  if (embps_frame_error(0, EMBPS_ELIMIT, msg, &frame, &len) == 0) {
    ssize_t w = send(fd, frame, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    free(frame);
  }
  close(fd);
}

/* At --max-connections: asks the I/O thread with the most connections
 * without a hello (not already asked for) to close its oldest one.
 * Returns 0 if there is none. */
static int evict_for_room(net_t *net) {
  io_thread_t *best = NULL;
  unsigned best_n = 0;
  for (uint32_t i = 0; i < net->srv.cfg.io_threads; i++) {
    io_thread_t *io = &net->io[i];
    unsigned n = atomic_load(&io->n_strangers), asked = atomic_load(&io->evict);
    if (n > asked && n - asked > best_n) {
      best = io;
      best_n = n - asked;
    }
  }
  if (!best)
    return 0;
  atomic_fetch_add(&best->evict, 1);
  io_wake(best);
  return 1;
}

static void on_listen(uv_poll_t *p, int status, int events);

static void on_accept_retry(uv_timer_t *t) {
  net_t *net = t->data;
  if (net->stopping)
    return;
  int rc = uv_poll_start(&net->listen_poll, UV_READABLE, on_listen);
  if (rc) {
    LOG_ERROR("cannot poll the listening socket: %s", uv_strerror(rc));
    rc = uv_timer_start(&net->accept_retry, on_accept_retry, ACCEPT_RETRY_MS,
                        0);
    if (rc)
      LOG_ERROR("cannot retry accepting: %s", uv_strerror(rc));
  }
}

static void on_listen(uv_poll_t *p, int status, int events) {
  net_t *net = p->data;
  uint64_t skipped;
  (void)events;
  if (status < 0) {
    LOG_WARN("polling the listening socket: %s", uv_strerror(status));
    return;
  }
  for (;;) {
    int fd = accept4(net->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EINTR || err == ECONNABORTED)
        continue;
      if (err == EAGAIN || err == EWOULDBLOCK)
        return;
      /* out of descriptors or memory: the pending connection stays in the
       * backlog and the poll would fire again at once; pause instead */
      if (ratelimit_pass(&net->accept_log, &skipped))
        LOG_WARN("accept: %s (%llu more since the last warning); pausing "
                 "new connections for %d ms", strerror(err),
                 (unsigned long long)skipped, ACCEPT_RETRY_MS);
      int rc = uv_poll_stop(&net->listen_poll);
      if (rc)
        LOG_ERROR("cannot pause the listening socket: %s", uv_strerror(rc));
      rc = uv_timer_start(&net->accept_retry, on_accept_retry,
                              ACCEPT_RETRY_MS, 0);
      if (rc)
        LOG_ERROR("cannot retry accepting: %s", uv_strerror(rc));
      return;
    }
    if (atomic_fetch_add(&net->open_conns, 1) >=
            net->srv.cfg.max_connections &&
        !evict_for_room(net)) {
      atomic_fetch_sub(&net->open_conns, 1);
      uint64_t n;
      if (embps_metrics_refused(&n)) /* one line a second at most */
        LOG_WARN("refusing connections: --max-connections %u reached (%llu "
                 "refused since the last such line)",
                 net->srv.cfg.max_connections, (unsigned long long)n);
      refuse_fd(net, fd);
      continue;
    }
    deal_fd(net, fd);
  }
}

/* ------------------------------------------------------------ stopping */

/* /readyz belongs to the server that serves it (metrics.h). */
static void set_ready(net_t *net, int ready) {
  if (net->metrics_started)
    embps_metrics_set_ready(ready);
}

/* Tells every I/O loop to finish what it holds and end (drain_check). */
static void io_drain_all(net_t *net) {
  for (uint32_t i = 0; i < net->n_io; i++) {
    atomic_store(&net->io[i].draining, 1);
    io_wake(&net->io[i]);
  }
}

/* On the main loop: stop accepting and reading. The I/O loops end once
 * every request already read is answered, the main loop once its handles
 * are closed (stop_async does not keep it alive). */
static void begin_stop(net_t *net) {
  if (net->stopping)
    return;
  net->stopping = 1;
  set_ready(net, 0);
  embps_notify_stopping();
  uv_close((uv_handle_t *)&net->listen_poll, NULL);
  uv_close((uv_handle_t *)&net->accept_retry, NULL);
  if (net->srv.cfg.handle_signals) {
    uv_close((uv_handle_t *)&net->sig_term, NULL);
    uv_close((uv_handle_t *)&net->sig_int, NULL);
  }
  embps_apply_drain(net->srv.apply);
  embps_snapshots_drain(net->srv.snap);
  io_drain_all(net);
}

static void on_signal(uv_signal_t *s, int signum) {
  LOG_INFO("signal %d: finishing in-flight requests, then exiting", signum);
  begin_stop(s->data);
}

static void on_stop(uv_async_t *a) {
  net_t *net = a->data;
  if (!net->stopping)
    LOG_INFO("stop requested: finishing in-flight requests");
  begin_stop(net);
}

/* Binds and listens; returns the fd, or a negative code with a logged
 * reason. */
static int listen_on(const embps_server_config_t *cfg, int *port_out) {
  char port[16];
  snprintf(port, sizeof port, "%d", cfg->listen_port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *res;
  int rc = getaddrinfo(cfg->listen_host, port, &hints, &res);
  if (rc) {
    LOG_ERROR("cannot resolve %s: %s", cfg->listen_host, gai_strerror(rc));
    return EMBPS_EINVAL;
  }
  int fd = -1, err = EADDRNOTAVAIL; /* never left: at least one address */
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0)
      break;
    err = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    LOG_ERROR("cannot listen on %s:%d: %s", cfg->listen_host,
              cfg->listen_port, strerror(err));
    return -err;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &sl)) {
    err = errno;
    LOG_ERROR("cannot read the port of %s:%d: %s", cfg->listen_host,
              cfg->listen_port, strerror(err));
    close(fd);
    return -err;
  }
  *port_out = ntohs(ss.ss_family == AF_INET6
                        ? ((struct sockaddr_in6 *)&ss)->sin6_port
                        : ((struct sockaddr_in *)&ss)->sin_port);
  return fd;
}

/* Writes the port to path via a temporary file and rename, so a reader
 * never sees a partial number. 0 or -errno. */
static int write_port_file(const char *path, int port) {
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f)
    return -errno;
  fprintf(f, "%d\n", port);
  if (fclose(f) != 0 || rename(tmp, path) != 0) {
    int err = errno;
    unlink(tmp);
    return -err;
  }
  return 0;
}

static void close_unclosed(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

/* Closes every handle still open on loop (not running), then loop. */
static void loop_close(uv_loop_t *loop, const char *what) {
  uv_walk(loop, close_unclosed, NULL);
  if (uv_run(loop, UV_RUN_DEFAULT)) /* the close callbacks */
    LOG_WARN("%s: handles active after closing them all", what);
  int rc = uv_loop_close(loop);
  if (rc)
    LOG_WARN("%s closed with handles open: %s", what, uv_strerror(rc));
}

/* Frees io, whose thread was joined or never started. */
static void io_close(io_thread_t *io) {
  loop_close(&io->loop, "an I/O loop");
  embps_table_scratch_close(&io->scratch.table);
  embps_dedup_close(&io->scratch.dedup);
  pthread_mutex_destroy(&io->mu);
  free(io->fds);
}

/* Sets up io's loop and starts its thread: 0, or a negative code with
 * nothing of io left set up. */
static int io_start(net_t *net, io_thread_t *io) {
  io->net = net;
  io->srv = &net->srv;
  int rc = uv_loop_init(&io->loop);
  if (rc)
    return rc;
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
  if (rc)
    io_close(io);
  return rc;
}

/* Every connection takes a descriptor: make RLIMIT_NOFILE's soft limit
 * room for --max-connections, as far as the hard limit allows. */
static void check_nofile(const embps_server_config_t *cfg) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl))
    return;
  rlim_t want = (rlim_t)cfg->max_connections + FD_RESERVE +
                4 * (rlim_t)cfg->io_threads;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want
                      ? want
                      : rl.rlim_max;
    if (rl.rlim_cur > old && setrlimit(RLIMIT_NOFILE, &rl) == 0)
      LOG_INFO("raised the open-file limit from %llu to %llu for "
               "--max-connections %u", (unsigned long long)old,
               (unsigned long long)rl.rlim_cur, cfg->max_connections);
    else
      rl.rlim_cur = old;
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want)
    LOG_WARN("open-file limit %llu (hard %llu) is below what --max-"
             "connections %u needs (%llu): past about %llu connections, "
             "new ones wait in the backlog (raise it with ulimit -n)",
             (unsigned long long)rl.rlim_cur,
             (unsigned long long)rl.rlim_max, cfg->max_connections,
             (unsigned long long)want,
             (unsigned long long)(rl.rlim_cur > FD_RESERVE
                                      ? rl.rlim_cur - FD_RESERVE
                                      : 0));
}

/* The main loop's handles: the listener, its retry timer, the stop call
 * and, for the daemon, SIGTERM and SIGINT. 0 or a negative code (the
 * handles set up are closed by loop_close). */
static int loop_start(net_t *net) {
  int rc = uv_loop_init(&net->loop);
  if (rc)
    return rc;
  net->loop_ready = 1;
  rc = uv_poll_init(&net->loop, &net->listen_poll, net->listen_fd);
  net->listen_poll.data = net;
  if (!rc)
    rc = uv_timer_init(&net->loop, &net->accept_retry);
  net->accept_retry.data = net;
  if (!rc)
    rc = uv_async_init(&net->loop, &net->stop_async, on_stop);
  net->stop_async.data = net;
  if (!rc) {
    uv_unref((uv_handle_t *)&net->stop_async);
    rc = uv_poll_start(&net->listen_poll, UV_READABLE, on_listen);
  }
  if (rc || !net->srv.cfg.handle_signals)
    return rc;
  rc = uv_signal_init(&net->loop, &net->sig_term);
  if (!rc)
    rc = uv_signal_init(&net->loop, &net->sig_int);
  net->sig_term.data = net->sig_int.data = net;
  if (!rc)
    rc = uv_signal_start(&net->sig_term, on_signal, SIGTERM);
  if (!rc)
    rc = uv_signal_start(&net->sig_int, on_signal, SIGINT);
  return rc;
}

/* ------------------------------------------------------------ lifecycle */

static net_t *net_of(embps_server_t *srv) {
  return (net_t *)((char *)srv - offsetof(net_t, srv));
}

/* What /metrics reads from the durable layer and the cluster. */
static const embps_metrics_hooks_t metrics_hooks = {
    .durable_stats = embps_durable_stats,
    .cluster_counts = embps_cluster_counts,
    .cluster_ready = embps_cluster_ready,
};

/* The durable layer's way back into the core (embps_durable_hooks_t). */
static void durable_submit(void *ctx, embps_request_t *req) {
  embps_server_t *srv = ctx;
  embps_apply_submit(srv->apply, req);
}

static void durable_restored(void *ctx, uint64_t lsn, embps_seen_t *seen) {
  embps_server_t *srv = ctx;
  embps_apply_restore(srv->apply, lsn, seen);
}

/* create's steps in order; on failure the caller undoes those done. */
static int net_start(net_t *net) {
  embps_server_t *srv = &net->srv;
  const embps_server_config_t *cfg = &srv->cfg;
  int rc = embps_apply_start(srv, &srv->apply);
  if (rc) {
    LOG_ERROR("cannot start the apply thread");
    return rc;
  }
  if ((rc = embps_snapshots_create(srv, &srv->snap)))
    return rc;
  /* before the restore: /healthz answers during it */
  if (embps_metrics_start(srv, &metrics_hooks))
    return EMBPS_EINVAL;
  net->metrics_started = cfg->metrics_host[0] != 0;
  if (cfg->data_dir[0]) { /* restored before anyone can connect */
    char err[2048];
    const embps_durable_hooks_t hooks = {
        .submit = durable_submit,
        .restored = durable_restored,
        .at_marker = embps_evict_at_checkpoint,
        .ctx = srv,
    };
    if (embps_durable_open(srv, &hooks, err, sizeof err)) {
      LOG_ERROR("%s", err);
      return EMBPS_EIO;
    }
  }
  rc = listen_on(cfg, &net->port);
  if (rc < 0)
    return rc;
  net->listen_fd = rc;
  net->io = calloc(cfg->io_threads, sizeof *net->io);
  if (!net->io)
    return EMBPS_ENOMEM;
  for (; net->n_io < cfg->io_threads; net->n_io++) {
    rc = io_start(net, &net->io[net->n_io]);
    if (rc) {
      LOG_ERROR("cannot start I/O thread %u: %s", net->n_io, uv_strerror(rc));
      return rc;
    }
  }
  rc = loop_start(net);
  if (rc) {
    LOG_ERROR("cannot set up the main loop: %s", uv_strerror(rc));
    return rc;
  }
  if (cfg->port_file[0] &&
      (rc = write_port_file(cfg->port_file, net->port))) {
    LOG_ERROR("cannot write --port-file %s: %s", cfg->port_file,
              strerror(-rc));
    return rc;
  }
  /* The one line scripts wait for; printed whatever the log level. */
  embps_log_ready("embps-server %s ready on %s:%d (io-threads %u, shards %u, "
                  "cluster %u/%u)", EMBPS_VERSION_STRING, cfg->listen_host,
                  net->port, cfg->io_threads, cfg->shards, cfg->cluster_index,
                  cfg->cluster_size);
  set_ready(net, 1);
  embps_notify_ready(cfg->listen_host, net->port); /* systemd Type=notify */
  if (embps_cluster_start(srv)) /* /readyz: the tables the others hold */
    return EMBPS_EINVAL;
  net->cluster_started = cfg->cluster_servers != NULL;
  return 0;
}

/* Stops the threads net_start started, in the reverse order, once the
 * I/O loops have drained (or telling them to, when they never served),
 * with the final checkpoint. Returns the exit status; runs once. */
static int net_stop_threads(net_t *net) {
  embps_server_t *srv = &net->srv;
  if (net->threads_stopped)
    return 0;
  net->threads_stopped = 1;
  if (net->cluster_started)
    embps_cluster_stop();
  if (!net->stopping)
    io_drain_all(net);
  for (uint32_t i = 0; i < net->n_io; i++)
    pthread_join(net->io[i].tid, NULL);
  embps_snapshots_destroy(srv->snap); /* no READ can come any more */
  srv->snap = NULL;
  int status = 0;
  if (srv->apply) {
    status = embps_durable_shutdown(srv) ? 1 : 0; /* final checkpoint */
    embps_apply_stop(srv->apply);
    srv->apply = NULL;
  }
  if (net->metrics_started)
    embps_metrics_stop(); /* before what it reads goes */
  embps_durable_close(srv);
  return status;
}

/* Frees net once its threads are stopped. */
static void net_free(net_t *net) {
  for (uint32_t i = 0; i < net->n_io; i++)
    io_close(&net->io[i]);
  free(net->io);
  if (net->loop_ready) /* before the fd its poll handle watches */
    loop_close(&net->loop, "the main loop");
  if (net->listen_fd >= 0)
    close(net->listen_fd);
  embps_registry_close(&net->srv.registry);
  embps_bufpool_close(&net->srv.bodies);
  free(net);
}

int embps_server_create(const embps_server_config_t *cfg,
                        embps_server_t **out) {
  *out = NULL;
  net_t *net = calloc(1, sizeof *net);
  if (!net)
    return EMBPS_ENOMEM;
  net->listen_fd = -1;
  embps_server_t *srv = &net->srv;
  srv->cfg = *cfg;
  srv->start_ns = embps_now_ns();
  embps_registry_init(&srv->registry);
  embps_bufpool_init(&srv->bodies, EMBPS_MMAP_THRESHOLD, EMBPS_BODY_POOL_BYTES);
  if (cfg->insecure && !cfg->has_token)
    LOG_WARN("--insecure: serving %s without an auth token; anyone who can "
             "reach it can read, change and drop every table",
             cfg->listen_host);
  check_nofile(cfg);
  int rc = net_start(net);
  if (rc) {
    net_stop_threads(net);
    net_free(net);
    return rc;
  }
  *out = srv;
  return 0;
}

int embps_server_port(const embps_server_t *srv) {
  return net_of((embps_server_t *)srv)->port;
}

int embps_server_run(embps_server_t *srv) {
  net_t *net = net_of(srv);
  for (;;) {
    if (uv_run(&net->loop, UV_RUN_DEFAULT))
      LOG_WARN("the main loop stopped with handles active");
    if (net->stopping)
      break;
    /* nothing polls the listener any more (on_accept_retry failed) */
    LOG_ERROR("cannot accept connections any more: stopping");
    begin_stop(net);
  }
  int status = net_stop_threads(net);
  LOG_INFO("stopped");
  return status;
}

void embps_server_stop(embps_server_t *srv) {
  /* 0 on a handle not closed (until destroy); nothing here may log or
   * lock: a signal handler may call this */
  (void)uv_async_send(&net_of(srv)->stop_async);
}

void embps_server_destroy(embps_server_t *srv) {
  if (!srv)
    return;
  net_t *net = net_of(srv);
  net_stop_threads(net); /* when run was never called */
  net_free(net);
}
