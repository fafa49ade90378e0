/* client.c - libembps: connections, routing, fan-out, tickets.
 *
 * No background thread: a client owns one non-blocking socket per server
 * and makes progress only inside embps_wait() (and the blocking calls built
 * on it), with one poll() over every socket that both writes queued request
 * frames and reads replies. Reading while writing matters: a server that
 * applies backpressure stops reading until we read its replies.
 *
 * A call becomes a ticket with one part per server it involves; each part is
 * a request frame with its own request id, queued on that server's
 * connection. Replies are matched to parts by id, so many tickets may be in
 * flight on one connection. Pull parts copy their rows into the ticket's
 * unique-row buffer; once every part is in, the rows are expanded back to the
 * caller's order.
 *
 * Push atomicity across servers: everything a server could refuse (dims,
 * counts, non-finite values, ranges) is checked here first, against a cached
 * description of the table, so a push is sent to all servers or to none.
 * Every push is sent to every server, even with no rows for it, so each
 * server's step counter (Adam's t) stays the same as the table's.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "abi.h"
#include "bufpool.h"
#include "embps/embps.h"
#include "embps/nn.h"
#include "internal.h"
#include "merge.h"
#include "util.h"
#include "wire.h"

#define MAX_REPLY_BYTES (1u << 30)
#define DEFAULT_TIMEOUT_MS 30000
#define MAX_SERVERS 1024
#define DEFAULT_RETRY_MS 30000
#define BACKOFF_MIN_MS 20
#define BACKOFF_MAX_MS 1000

typedef struct part part_t;

/* A queued request frame: its part's frame and, for a bulk sent from the
 * caller's buffers, up to two borrowed segments after it. seg[] holds the
 * bytes not yet sent; cur is the first segment with bytes left. */
typedef struct out_buf {
  struct iovec seg[3];
  int n_seg, cur;
  const part_t *part; /* the part awaiting this frame's reply */
  struct out_buf *next;
} out_buf_t;

typedef struct {
  char host[256];
  int port;
  char addr[300];
  uint32_t index; /* in the cluster */
  int fd;
  uint64_t max_frame; /* the server's --max-frame-bytes, from its hello */
  out_buf_t *out_head, *out_tail;
  part_t *pending_head, *pending_tail; /* sent, awaiting a reply */
  uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
  size_t hdr_got;
  embps_frame_header_t h;
  uint8_t *body; /* reused across frames: grows, never shrinks */
  size_t body_cap, body_got;
  int in_body;
  part_t *cur;    /* the part the frame being read answers, or NULL */
  uint8_t *bulk;  /* where its bulk goes when read in place, or NULL */
  size_t bulk_off;
  /* Broken (fd < 0) with parts still pending: they are sent again, in
   * their order, once a reconnection at or after retry_at_ns succeeds. */
  uint64_t retry_at_ns;
  int backoff_ms;
  int down_code;      /* why the last connection or attempt failed */
  char down_why[1024];
} conn_t;

typedef enum { OP_HELLO, OP_SIMPLE, OP_PULL, OP_PUSH } op_t;

struct part {
  embps_ticket_t *t;
  uint32_t server;
  uint32_t req_id;
  uint16_t kind; /* the request's kind */
  /* The request frame (owned) and its borrowed bulk, kept until the reply
   * so that a retry sends the very same bytes (client id, seq, req id). */
  uint8_t *frame;
  size_t frame_len;
  struct iovec bulk[2];
  int n_bulk;
  uint32_t *pos; /* push: positions in the caller's arrays (K > 1) */
  size_t base;   /* pull: first position in the ticket's unique list */
  size_t n;
  embps_msg_t reply; /* OP_SIMPLE/OP_HELLO: the decoded reply */
  int has_reply;
  uint8_t *rbulk; /* OP_SIMPLE: the reply's bulk (malloc'd), or NULL */
  size_t rbulk_len;
  uint8_t *rdst;  /* OP_SIMPLE: where a reply's bulk up to rdst_cap goes */
  size_t rdst_cap;
  part_t *next;
};

struct embps_ticket {
  op_t op;
  int result;
  uint64_t retry_until_ns; /* 0: never retried */
  uint64_t sent_ns;        /* last (re)send of a part: one attempt's start */
  char error[EMBPS_MESSAGE_MAX + 64];
  uint32_t n_parts, n_done;
  part_t *parts;
  uint32_t dim;
  /* pull */
  float *out;
  size_t n;
  int64_t *uniq;
  uint32_t *inverse;
  float *urows; /* n_unique x dim, grouped by server; or == out */
  size_t n_unique;
  size_t uniq_cap, inverse_cap, urows_cap; /* bytes, for the pool */
  /* push: merged copies when EMBPS_PUSH_MERGE */
  int64_t *m_idx;
  float *m_vals;
};

typedef struct {
  char name[EMBPS_TABLE_NAME_MAX];
  embps_table_spec_t spec;
} cached_table_t;

struct embps_client {
  conn_t *conns;
  uint32_t n;
  char token[EMBPS_TOKEN_MAX];
  size_t token_len;
  int timeout_ms;
  int retry_ms; /* < 0: never */
  uint32_t next_req_id;
  uint64_t client_id, seq;
  char last_error[EMBPS_MESSAGE_MAX + 128];
  cached_table_t *tables;
  size_t n_tables;
  embps_dedup_t dedup;
  embps_bufpool_t pool; /* the buffers of finished pulls, for the next */
  uint32_t member; /* < n: whole-cluster requests ask this server alone */
};

/* ------------------------------------------------------------ errors */

static int set_error(embps_client_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int set_error(embps_client_t *c, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
  va_end(ap);
  return code;
}

int embps_client_set_error_(embps_client_t *c, int code, const char *msg) {
  return set_error(c, code, "%s", msg);
}

uint64_t embps_client_max_frame_(const embps_client_t *c) {
  uint64_t m = 0;
  for (uint32_t i = 0; i < c->n; i++)
    if (c->conns[i].max_frame && (!m || c->conns[i].max_frame < m))
      m = c->conns[i].max_frame;
  return m;
}

const char *embps_client_last_error(const embps_client_t *c) {
  return c ? c->last_error : "no client";
}

size_t embps_client_n_servers(const embps_client_t *c) { return c->n; }

static void ticket_fail(embps_ticket_t *t, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void ticket_fail(embps_ticket_t *t, int code, const char *fmt, ...) {
  if (t->result)
    return; /* the first error is the one reported */
  t->result = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->error, sizeof t->error, fmt, ap);
  va_end(ap);
}

/* ------------------------------------------------------------ buffers */

/* Hands a finished pull's buffers to the pool. */
static void pull_give_buffers(embps_client_t *c, embps_ticket_t *t) {
  embps_bufpool_give(&c->pool, t->uniq, t->uniq_cap);
  embps_bufpool_give(&c->pool, t->inverse, t->inverse_cap);
  if (t->urows != t->out)
    embps_bufpool_give(&c->pool, t->urows, t->urows_cap);
  t->uniq = NULL;
  t->inverse = NULL;
  t->urows = t->out;
}

/* ------------------------------------------------------------ tickets */

static embps_ticket_t *ticket_new(op_t op, uint32_t n_parts) {
  embps_ticket_t *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  t->op = op;
  t->n_parts = n_parts;
  t->parts = calloc(n_parts ? n_parts : 1, sizeof *t->parts);
  if (!t->parts) {
    free(t);
    return NULL;
  }
  for (uint32_t i = 0; i < n_parts; i++)
    t->parts[i].t = t;
  return t;
}

static void ticket_free(embps_ticket_t *t) {
  if (!t)
    return;
  for (uint32_t i = 0; i < t->n_parts; i++) {
    free(t->parts[i].pos);
    free(t->parts[i].frame);
    free(t->parts[i].rbulk);
    if (t->parts[i].has_reply)
      embps_msg_free(&t->parts[i].reply);
  }
  free(t->parts);
  free(t->uniq);
  free(t->inverse);
  if (t->urows != t->out)
    free(t->urows);
  free(t->m_idx);
  free(t->m_vals);
  free(t);
}

static void part_done(part_t *p) { p->t->n_done++; }

/* ------------------------------------------------------------ connections */

/* Connection-level failures after which a request may be sent again: the
 * server never answered it, or said it was going away. Any other code is a
 * server's answer (or ours) and final. */
static int code_retryable(int code) {
  return code == EMBPS_ECONN || code == EMBPS_ETIMEDOUT ||
         code == EMBPS_ESHUTDOWN;
}

static void pending_append(conn_t *k, part_t *p) {
  p->next = NULL;
  if (k->pending_tail)
    k->pending_tail->next = p;
  else
    k->pending_head = p;
  k->pending_tail = p;
}

/* Drops a connection. Every part waiting on it fails with code, except,
 * when may_retry, those whose ticket may still retry after a failure of
 * this kind: they stay pending, in order, to be sent again once the
 * connection is back (conn_reconnect). */
static void conn_drop(conn_t *k, int code, const char *why, int may_retry) {
  if (k->fd >= 0)
    close(k->fd);
  k->fd = -1;
  for (out_buf_t *o = k->out_head, *next; o; o = next) {
    next = o->next;
    free(o);
  }
  k->out_head = k->out_tail = NULL;
  uint64_t now = embps_now_ns();
  part_t *p = k->pending_head;
  k->pending_head = k->pending_tail = NULL;
  for (part_t *next; p; p = next) {
    next = p->next;
    if (may_retry && code_retryable(code) && p->t->retry_until_ns > now) {
      pending_append(k, p);
      continue;
    }
    p->next = NULL;
    ticket_fail(p->t, code, "server %u (%s): %s", k->index, k->addr, why);
    part_done(p);
  }
  k->down_code = code;
  snprintf(k->down_why, sizeof k->down_why, "server %u (%s): %s", k->index,
           k->addr, why);
  if (k->pending_head) {
    k->backoff_ms = k->backoff_ms ? k->backoff_ms : BACKOFF_MIN_MS;
    k->retry_at_ns = now + (uint64_t)k->backoff_ms * 1000000ULL;
  }
  free(k->body);
  k->body = NULL;
  k->body_cap = 0;
  k->in_body = 0;
  k->cur = NULL;
  k->bulk = NULL;
  k->hdr_got = k->body_got = 0;
}

static void conn_fail(conn_t *k, int code, const char *why) {
  conn_drop(k, code, why, 1);
}

static int connect_fd(conn_t *k, int timeout_ms, char *why, size_t why_len) {
  char port[16];
  snprintf(port, sizeof port, "%d", k->port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV};
  struct addrinfo *res;
  int rc = getaddrinfo(k->host, port, &hints, &res);
  if (rc) {
    snprintf(why, why_len, "cannot resolve %s: %s", k->host, gai_strerror(rc));
    return EMBPS_ECONN;
  }
  int err = ECONNREFUSED;
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 || errno == EINPROGRESS) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int n = poll(&pfd, 1, timeout_ms);
      socklen_t sl = sizeof err;
      if (n == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) == 0 &&
          err == 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        freeaddrinfo(res);
        k->fd = fd;
        return 0;
      }
      if (n == 0)
        err = ETIMEDOUT;
    } else {
      err = errno;
    }
    close(fd);
  }
  freeaddrinfo(res);
  snprintf(why, why_len, "cannot connect: %s", strerror(err));
  return EMBPS_ECONN;
}

/* Queues part p's frame (p->frame, then its borrowed bulk segments, which
 * must stay unchanged until the reply) for writing on connection k.
 * Returns 0 or -ENOMEM. */
static int out_queue(conn_t *k, part_t *p) {
  out_buf_t *o = malloc(sizeof *o);
  if (!o)
    return -ENOMEM;
  o->seg[0] = (struct iovec){.iov_base = p->frame, .iov_len = p->frame_len};
  o->n_seg = 1;
  for (int i = 0; i < p->n_bulk; i++)
    if (p->bulk[i].iov_len)
      o->seg[o->n_seg++] = p->bulk[i];
  o->cur = 0;
  o->part = p;
  o->next = NULL;
  if (k->out_tail)
    k->out_tail->next = o;
  else
    k->out_head = o;
  k->out_tail = o;
  p->t->sent_ns = embps_now_ns();
  return 0;
}

/* Queues p's request on connected k, with p awaiting its reply. */
static void conn_send(conn_t *k, part_t *p) {
  if (out_queue(k, p)) {
    ticket_fail(p->t, -ENOMEM, "out of memory");
    part_done(p);
    return;
  }
  pending_append(k, p);
}

/* Writes as much of k's queue as the socket takes. */
static void conn_write(conn_t *k) {
  while (k->out_head) {
    struct iovec iov[16];
    int n = 0;
    for (out_buf_t *o = k->out_head; o && n < 16; o = o->next)
      for (int j = o->cur; j < o->n_seg && n < 16; j++)
        iov[n++] = o->seg[j];
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t w = sendmsg(k->fd, &mh, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        conn_fail(k, EMBPS_ECONN, strerror(errno));
      return;
    }
    size_t left = (size_t)w;
    while (left && k->out_head) {
      out_buf_t *o = k->out_head;
      struct iovec *v = &o->seg[o->cur];
      size_t take = v->iov_len < left ? v->iov_len : left;
      v->iov_base = (uint8_t *)v->iov_base + take;
      v->iov_len -= take;
      left -= take;
      if (!v->iov_len)
        o->cur++;
      if (o->cur == o->n_seg) {
        k->out_head = o->next;
        if (!k->out_head)
          k->out_tail = NULL;
        free(o);
      }
    }
  }
}

/* Checks a decoded reply m against the request of part p: its kind must be
 * the request's kind | EMBPS_KIND_REPLY (or ERROR) and its counts those
 * asked for. in_place: its bulk went straight to the part's destination
 * (pull rows). Returns NULL, or what is wrong. */
static const char *reply_mismatch(const part_t *p, const embps_msg_t *m,
                                  int in_place) {
  if (m->kind == EMBPS_KIND_ERROR)
    return NULL;
  if (m->kind != (p->kind | EMBPS_KIND_REPLY))
    return "reply of the wrong kind";
  switch (p->kind) {
  case EMBPS_KIND_PULL:
    if (!in_place || m->u.pull_reply.n_rows != p->n ||
        m->u.pull_reply.dim != p->t->dim)
      return "pull reply does not match the request";
    break;
  case EMBPS_KIND_PUSH:
    if (m->u.push_reply.n_unique > p->n)
      return "push reply counts more rows than were sent";
    break;
  case EMBPS_KIND_STATS:
    if (m->u.stats.cluster_index != p->server)
      return "stats reply from another cluster index";
    break;
  default:
    break;
  }
  return NULL;
}

/* Hands a checked reply m (taken) to part p. */
static void deliver(conn_t *k, part_t *p, embps_msg_t *m) {
  embps_ticket_t *t = p->t;
  if (m->kind == EMBPS_KIND_ERROR)
    ticket_fail(t, m->u.error.code, "server %u (%s): %s", k->index, k->addr,
                m->u.error.message);
  if (t->op == OP_SIMPLE || t->op == OP_HELLO) {
    p->reply = *m;
    p->has_reply = 1;
    return; /* kept, an error too: the caller reads it */
  }
  embps_msg_free(m);
}

/* The pending part answered by request id `req_id`, or NULL. Replies
 * mostly come in order, so this usually looks at the head only. */
static part_t *find_part(conn_t *k, uint32_t req_id) {
  part_t *p = k->pending_head;
  while (p && p->req_id != req_id)
    p = p->next;
  return p;
}

static void unlink_part(conn_t *k, part_t *p) {
  part_t *prev = NULL;
  for (part_t *q = k->pending_head; q && q != p; q = q->next)
    prev = q;
  if (prev)
    prev->next = p->next;
  else
    k->pending_head = p->next;
  if (k->pending_tail == p)
    k->pending_tail = prev;
  p->next = NULL;
}

/* A header is in: finds its part and decides where the body goes. A pull
 * reply of the expected size has its rows read straight into the ticket's
 * row buffer; everything else is read into the connection's buffer. */
static int begin_body(conn_t *k) {
  const embps_frame_header_t *h = &k->h;
  part_t *p = find_part(k, h->req_id);
  size_t off = embps_bulk_offset(h->meta_len);
  size_t buffered = h->body_len;
  k->cur = p;
  k->bulk = NULL;
  if (p && p->t->op == OP_PULL &&
      h->kind == (EMBPS_KIND_PULL | EMBPS_KIND_REPLY) &&
      h->body_len == off + p->n * p->t->dim * sizeof(float)) {
    k->bulk = (uint8_t *)(p->t->urows + p->base * p->t->dim);
    k->bulk_off = off;
    buffered = off;
  } else if (p && p->rdst && h->kind == (p->kind | EMBPS_KIND_REPLY) &&
             h->body_len > off && h->body_len - off <= p->rdst_cap) {
    k->bulk = p->rdst; /* embps_client_request_'s destination */
    k->bulk_off = off;
    buffered = off;
  }
  if (buffered > k->body_cap) {
    free(k->body);
    k->body_cap = 0;
    k->body = malloc(buffered);
    if (!k->body)
      return -ENOMEM;
    k->body_cap = buffered;
  }
  k->in_body = 1;
  k->body_got = 0;
  return 0;
}

/* A whole frame is in: hands it to its part. Returns 0, or -1 when the
 * connection was failed. */
static int end_body(conn_t *k) {
  part_t *p = k->cur;
  int in_place = k->bulk != NULL;
  k->in_body = 0;
  k->hdr_got = k->body_got = 0;
  k->cur = NULL;
  k->bulk = NULL;
  if (p) {
    /* A server replies once it has read the whole request. A reply that
     * comes earlier would let embps_wait() return while the queue still
     * points into the caller's buffers: treat it as the protocol error it
     * is. */
    for (const out_buf_t *o = k->out_head; o; o = o->next) {
      if (o->part == p && o->n_seg > 1) {
        conn_fail(k, EMBPS_EPROTO,
                  "server replied before reading the whole request");
        return -1;
      }
    }
    embps_msg_t m;
    if (embps_msg_unpack(k->h.kind, k->body, k->h.meta_len, &m)) {
      char why[64];
      snprintf(why, sizeof why, "reply of kind %u does not decode", k->h.kind);
      conn_fail(k, EMBPS_EPROTO, why);
      return -1;
    }
    const char *bad = reply_mismatch(p, &m, in_place);
    if (bad || (m.kind == EMBPS_KIND_ERROR &&
                m.u.error.code == EMBPS_ESHUTDOWN)) {
      /* a lying server is dropped; one going away is retried elsewhere */
      char why[EMBPS_MESSAGE_MAX + 64];
      snprintf(why, sizeof why, "%s", bad ? bad : m.u.error.message);
      embps_msg_free(&m);
      conn_fail(k, bad ? EMBPS_EPROTO : EMBPS_ESHUTDOWN, why);
      return -1;
    }
    unlink_part(k, p);
    size_t off = embps_bulk_offset(k->h.meta_len);
    if (p->t->op == OP_SIMPLE && in_place) {
      p->rbulk_len = k->h.body_len - off; /* in p->rdst */
    } else if (p->t->op == OP_SIMPLE && k->h.body_len > off && !p->rbulk &&
               (p->rbulk = malloc(k->h.body_len - off)) != NULL) {
      memcpy(p->rbulk, k->body + off, k->h.body_len - off);
      p->rbulk_len = k->h.body_len - off;
    }
    deliver(k, p, &m);
    part_done(p);
  } else if (k->h.kind == EMBPS_KIND_ERROR && k->h.req_id == 0) {
    /* a connection-level refusal (e.g. --max-connections) */
    embps_msg_t m;
    char why[EMBPS_MESSAGE_MAX] = "connection refused by server";
    int code = EMBPS_ECONN;
    if (embps_msg_unpack(k->h.kind, k->body, k->h.meta_len, &m) == 0) {
      snprintf(why, sizeof why, "%s", m.u.error.message);
      code = m.u.error.code;
    }
    conn_fail(k, code, why);
    return -1;
  } /* else: a reply nobody waits for any more */
  return 0;
}

/* Reads whatever is available on k and delivers complete frames. */
static void conn_read(conn_t *k) {
  for (;;) {
    uint8_t *dst;
    size_t want;
    if (!k->in_body) {
      dst = k->hdr + k->hdr_got;
      want = EMBPS_FRAME_HEADER_LEN - k->hdr_got;
    } else if (k->bulk && k->body_got >= k->bulk_off) {
      dst = k->bulk + (k->body_got - k->bulk_off);
      want = k->h.body_len - k->body_got;
    } else {
      dst = k->body + k->body_got;
      want = (k->bulk ? k->bulk_off : k->h.body_len) - k->body_got;
    }
    ssize_t r = want ? read(k->fd, dst, want) : 0;
    if (want && r < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        conn_fail(k, EMBPS_ECONN, strerror(errno));
      return;
    }
    if (want && r == 0) {
      conn_fail(k, EMBPS_ECONN, "server closed the connection");
      return;
    }
    if (!k->in_body) {
      k->hdr_got += (size_t)r;
      if (k->hdr_got < EMBPS_FRAME_HEADER_LEN)
        continue;
      if (embps_frame_header_decode(k->hdr, MAX_REPLY_BYTES, &k->h)) {
        conn_fail(k, EMBPS_EPROTO, "malformed reply frame");
        return;
      }
      if (begin_body(k)) {
        conn_fail(k, -ENOMEM, "out of memory for a reply");
        return;
      }
    } else {
      k->body_got += (size_t)r;
    }
    if (k->body_got == k->h.body_len && end_body(k))
      return;
  }
}

/* One round of I/O on every connection; waits at most timeout_ms, and not
 * at all once ticket t is complete. */
static int progress(embps_client_t *c, const embps_ticket_t *t,
                    int timeout_ms) {
  struct pollfd stack[16];
  struct pollfd *pfd = c->n <= 16 ? stack : malloc(c->n * sizeof *pfd);
  if (!pfd)
    return -ENOMEM;
  uint32_t nf = 0;
  for (uint32_t i = 0; i < c->n; i++) {
    conn_t *k = &c->conns[i];
    if (k->fd < 0 || (!k->out_head && !k->pending_head))
      continue;
    if (k->out_head)
      conn_write(k); /* optimistic: usually the socket takes it all */
    if (k->fd < 0)
      continue;
    pfd[nf].fd = k->fd;
    pfd[nf].events = POLLIN | (k->out_head ? POLLOUT : 0);
    pfd[nf].revents = 0;
    nf++;
  }
  if (t->n_done == t->n_parts) /* e.g. a write failed */
    timeout_ms = 0;
  int n = poll(pfd, nf, timeout_ms); /* none: sleeps until a retry */
  if (n > 0) {
    for (uint32_t j = 0; j < nf; j++) {
      if (!pfd[j].revents)
        continue;
      conn_t *k = NULL;
      for (uint32_t i = 0; i < c->n; i++)
        if (c->conns[i].fd == pfd[j].fd)
          k = &c->conns[i];
      if (!k)
        continue;
      if (pfd[j].revents & (POLLIN | POLLHUP | POLLERR))
        conn_read(k);
      if (k->fd >= 0 && (pfd[j].revents & POLLOUT))
        conn_write(k);
    }
  }
  if (pfd != stack)
    free(pfd);
  return 0;
}

/* After a timeout: drops the connections that still owe t a reply, so no
 * late reply can land in a buffer the caller has taken back. Their other
 * requests, and t's own while it may still retry, are sent again once the
 * connection is back. */
static void ticket_abandon(embps_client_t *c, embps_ticket_t *t, int code) {
  for (uint32_t i = 0; i < c->n; i++) {
    conn_t *k = &c->conns[i];
    if (k->fd < 0)
      continue;
    for (part_t *p = k->pending_head; p; p = p->next) {
      if (p->t == t) {
        conn_fail(k, code, "no reply in time; connection dropped");
        break;
      }
    }
  }
}

/* Whether a part of t waits on broken connection k (not yet sent again). */
static int conn_holds(const conn_t *k, const embps_ticket_t *t) {
  if (k->fd >= 0)
    return 0;
  for (const part_t *p = k->pending_head; p; p = p->next)
    if (p->t == t)
      return 1;
  return 0;
}

/* t's retries are over: its parts waiting on broken connections fail with
 * the reason the connection is down. */
static void ticket_expire(embps_client_t *c, embps_ticket_t *t) {
  for (uint32_t i = 0; i < c->n; i++) {
    conn_t *k = &c->conns[i];
    while (conn_holds(k, t)) {
      part_t *p = k->pending_head;
      while (p->t != t)
        p = p->next;
      unlink_part(k, p);
      ticket_fail(t, k->down_code ? k->down_code : EMBPS_ECONN,
                  "%s (gave up after retrying for %d ms)", k->down_why,
                  c->retry_ms);
      part_done(p);
    }
  }
}

/* Ends t's retries: its parts still pending anywhere fail with code (or
 * their connection's reason), so none stays linked once t is freed. */
static void ticket_cancel(embps_client_t *c, embps_ticket_t *t, int code) {
  t->retry_until_ns = 0;
  ticket_abandon(c, t, code);
  ticket_expire(c, t);
}

static int ensure_conn(embps_client_t *c, uint32_t s);

/* Reconnects the broken connections that hold parts of t and whose
 * backoff is over; returns the earliest time another attempt is due
 * (UINT64_MAX: none). */
static uint64_t reconnect_due(embps_client_t *c, embps_ticket_t *t) {
  uint64_t next = UINT64_MAX;
  for (uint32_t i = 0; i < c->n; i++) {
    conn_t *k = &c->conns[i];
    if (!conn_holds(k, t))
      continue;
    if (embps_now_ns() >= k->retry_at_ns)
      ensure_conn(c, i);
    if (conn_holds(k, t) && k->retry_at_ns < next)
      next = k->retry_at_ns;
  }
  return next;
}

/* Runs I/O until t completes. Each attempt (from t's last send) may take
 * the client's timeout; while t may retry, a timed-out attempt or a broken
 * connection leads to another. After the retry time a broken connection
 * is final, but an attempt under way still gets its whole timeout. */
static int ticket_run(embps_client_t *c, embps_ticket_t *t) {
  const uint64_t attempt_ns = (uint64_t)c->timeout_ms * 1000000ULL;
  if (!t->sent_ns)
    t->sent_ns = embps_now_ns();
  while (t->n_done < t->n_parts) {
    uint64_t now = embps_now_ns();
    int retrying = t->retry_until_ns && now < t->retry_until_ns;
    if (t->retry_until_ns && !retrying) {
      ticket_expire(c, t);
      if (t->n_done == t->n_parts)
        break;
    }
    uint64_t until = t->sent_ns + attempt_ns;
    if (now >= until) {
      if (!retrying) {
        ticket_fail(t, EMBPS_ETIMEDOUT, "no reply within %d ms%s",
                    c->timeout_ms, t->retry_until_ns ? " (retries over)" : "");
        ticket_cancel(c, t, EMBPS_ETIMEDOUT);
        break;
      }
      ticket_abandon(c, t, EMBPS_ETIMEDOUT); /* and try again */
      t->sent_ns = now;
      continue;
    }
    if (retrying) {
      uint64_t due = reconnect_due(c, t);
      now = embps_now_ns();
      if (due < until)
        until = due > now ? due : now;
      if (t->retry_until_ns < until)
        until = t->retry_until_ns;
    }
    int ms = until > now ? (int)((until - now + 999999) / 1000000) : 0;
    int rc = progress(c, t, ms);
    if (rc) {
      ticket_fail(t, rc, "%s", embps_strerror(rc));
      ticket_cancel(c, t, rc);
      break;
    }
  }
  return t->result;
}

/* Lets t's parts be sent again after a connection failure, until the
 * client's retry time from now is over. */
static void ticket_allow_retry(const embps_client_t *c, embps_ticket_t *t) {
  if (c->retry_ms >= 0)
    t->retry_until_ns = embps_now_ns() + (uint64_t)c->retry_ms * 1000000ULL;
}

static int hello(embps_client_t *c, conn_t *k, uint32_t index) {
  embps_ticket_t *t = ticket_new(OP_HELLO, 1);
  if (!t)
    return -ENOMEM;
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_HELLO;
  m.u.hello.version = EMBPS_PROTOCOL_VERSION;
  memcpy(m.u.hello.token, c->token, c->token_len);
  m.u.hello.token_len = c->token_len;
  part_t *p = &t->parts[0];
  p->server = index;
  p->kind = m.kind;
  p->req_id = ++c->next_req_id;
  int rc = embps_frame_build(&m, p->req_id, 0, &p->frame, &p->frame_len, NULL);
  if (!rc) {
    conn_send(k, p);
    rc = ticket_run(c, t);
  }
  if (!rc) {
    const embps_hello_reply_t *r = &p->reply.u.hello_reply;
    k->max_frame = r->max_frame_bytes;
    if (r->cluster_size != c->n || r->cluster_index != index) {
      rc = EMBPS_EWRONGSERVER;
      snprintf(t->error, sizeof t->error, "%s is server %u of a cluster of "
               "%u, but the client lists it as server %u of %u", k->addr,
               r->cluster_index, r->cluster_size, index, c->n);
    }
  }
  if (rc)
    set_error(c, rc, "%s", t->error[0] ? t->error : embps_strerror(rc));
  ticket_free(t);
  return rc;
}

/* Makes sure server s is connected (reconnecting after a failure); a new
 * connection first sends again, in their order, the requests still
 * pending from the broken one. A failure schedules the next attempt. */
static int ensure_conn(embps_client_t *c, uint32_t s) {
  conn_t *k = &c->conns[s];
  if (k->fd >= 0)
    return 0;
  char why[400];
  int rc = connect_fd(k, c->timeout_ms, why, sizeof why);
  if (rc) {
    k->down_code = rc;
    snprintf(k->down_why, sizeof k->down_why, "server %u (%s): %s", k->index,
             k->addr, why);
  } else {
    rc = hello(c, k, s);
    if (rc && k->fd >= 0)
      conn_fail(k, rc, "hello failed");
    if (rc) {
      k->down_code = rc;
      snprintf(k->down_why, sizeof k->down_why, "%s", c->last_error);
    }
  }
  if (rc) {
    k->backoff_ms = k->backoff_ms < BACKOFF_MIN_MS ? BACKOFF_MIN_MS
                    : 2 * k->backoff_ms > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
                                                         : 2 * k->backoff_ms;
    k->retry_at_ns = embps_now_ns() + (uint64_t)k->backoff_ms * 1000000ULL;
    return set_error(c, rc, "%s", k->down_why);
  }
  k->backoff_ms = 0;
  for (part_t *p = k->pending_head; p; p = p->next) {
    if (out_queue(k, p)) {
      conn_drop(k, -ENOMEM, "out of memory", 0);
      return set_error(c, -ENOMEM, "out of memory");
    }
  }
  return 0;
}

/* Refuses a frame larger than server s accepts, before sending it. */
static int frame_fits(embps_client_t *c, uint32_t s, size_t frame_len) {
  const conn_t *k = &c->conns[s];
  size_t body = frame_len - EMBPS_FRAME_HEADER_LEN;
  if (!k->max_frame || body <= k->max_frame)
    return 0;
  return set_error(c, EMBPS_EFRAMESIZE, "server %u (%s): frame of %zu bytes "
                   "exceeds --max-frame-bytes %llu; split the request",
                   k->index, k->addr, body, (unsigned long long)k->max_frame);
}

/* Sends part p, its frame built, to server s: now when connected (or it
 * connects), later when the connection is down and p's ticket may retry;
 * otherwise p fails. */
static void part_submit(embps_client_t *c, uint32_t s, part_t *p) {
  conn_t *k = &c->conns[s];
  int rc = 0;
  int waiting = k->fd < 0 && k->pending_head && p->t->retry_until_ns &&
                embps_now_ns() < k->retry_at_ns;
  if (k->fd < 0 && !waiting)
    rc = ensure_conn(c, s);
  if (k->fd >= 0) {
    conn_send(k, p);
  } else if (p->t->retry_until_ns &&
             code_retryable(rc ? rc : k->down_code)) {
    pending_append(k, p);
  } else {
    ticket_fail(p->t, rc ? rc : k->down_code, "%s", c->last_error);
    part_done(p);
  }
}

/* Builds the frame for message m (no bulk) into p and sends it to server
 * s. Returns 0 (a failure to send is p's ticket's) or the build error. */
static int send_msg(embps_client_t *c, uint32_t s, part_t *p,
                    const embps_msg_t *m) {
  p->server = s;
  p->kind = m->kind;
  p->req_id = ++c->next_req_id;
  int rc = embps_frame_build(m, p->req_id, 0, &p->frame, &p->frame_len, NULL);
  if (rc)
    return set_error(c, rc, "%s", embps_strerror(rc));
  rc = frame_fits(c, s, p->frame_len);
  if (rc)
    return rc;
  part_submit(c, s, p);
  return 0;
}

/* ---- a request of its own kind (internal.h: client/snapshot.c) ---- */

int embps_client_request_(embps_client_t *c, uint32_t server,
                          const embps_msg_t *m, uint8_t *dst, size_t dst_cap,
                          embps_ticket_t **out) {
  *out = NULL;
  if (server >= c->n)
    return set_error(c, EMBPS_EINVAL, "server %u of a cluster of %u", server,
                     c->n);
  embps_ticket_t *t = ticket_new(OP_SIMPLE, 1);
  if (!t)
    return set_error(c, -ENOMEM, "out of memory");
  t->parts[0].rdst = dst;
  t->parts[0].rdst_cap = dst ? dst_cap : 0;
  int rc = send_msg(c, server, &t->parts[0], m);
  if (rc) {
    ticket_free(t);
    return rc;
  }
  *out = t;
  return 0;
}

int embps_client_reply_(embps_client_t *c, embps_ticket_t *t,
                        embps_msg_t *reply, size_t *bulk_len) {
  memset(reply, 0, sizeof *reply);
  *bulk_len = 0;
  int rc = ticket_run(c, t);
  part_t *p = &t->parts[0];
  if (!rc && (!p->has_reply || p->rbulk))
    rc = set_error(c, EMBPS_EPROTO, "server %u (%s): a reply of %zu bulk "
                   "bytes where at most %zu were asked for", p->server,
                   c->conns[p->server].addr, p->rbulk_len, p->rdst_cap);
  else if (rc)
    set_error(c, rc, "%s", t->error[0] ? t->error : embps_strerror(rc));
  if (!rc) {
    *reply = p->reply;
    p->has_reply = 0;
    *bulk_len = p->rbulk_len;
  }
  ticket_free(t);
  return rc;
}

/* ------------------------------------------------------------ create */

static int parse_servers(embps_client_t *c, const char *list, char *err,
                         size_t err_len) {
  uint32_t n = 1;
  for (const char *p = list; *p; p++)
    n += *p == ',';
  if (n > MAX_SERVERS) {
    snprintf(err, err_len, "more than %d servers", MAX_SERVERS);
    return EMBPS_EINVAL;
  }
  c->conns = calloc(n, sizeof *c->conns);
  if (!c->conns)
    return -ENOMEM;
  const char *p = list;
  for (uint32_t i = 0; i < n; i++) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    char item[300];
    conn_t *k = &c->conns[i];
    k->fd = -1;
    if (len == 0 || len >= sizeof item) {
      snprintf(err, err_len, "bad server list \"%s\"", list);
      return EMBPS_EINVAL;
    }
    memcpy(item, p, len);
    item[len] = 0;
    if (embps_parse_hostport(item, k->host, sizeof k->host, &k->port)) {
      snprintf(err, err_len, "\"%s\" is not HOST:PORT", item);
      return EMBPS_EINVAL;
    }
    snprintf(k->addr, sizeof k->addr, "%s", item);
    k->index = i;
    c->n++;
    p = end ? end + 1 : p + len;
  }
  return 0;
}

static int load_token(embps_client_t *c, const char *token, char *err,
                      size_t err_len) {
  if (token) {
    size_t n = strlen(token);
    if (n > EMBPS_TOKEN_MAX) {
      snprintf(err, err_len, "token longer than %d bytes", EMBPS_TOKEN_MAX);
      return EMBPS_EINVAL;
    }
    memcpy(c->token, token, n);
    c->token_len = n;
    return 0;
  }
  const char *path = getenv("EMBPS_TOKEN_FILE");
  if (!path || !*path)
    return 0;
  char *data;
  size_t len;
  int rc = embps_read_file(path, &data, &len);
  if (rc) {
    snprintf(err, err_len, "EMBPS_TOKEN_FILE %s: %s", path, strerror(-rc));
    return rc;
  }
  while (len && (data[len - 1] == '\n' || data[len - 1] == '\r'))
    len--;
  if (len > EMBPS_TOKEN_MAX) {
    free(data);
    snprintf(err, err_len, "token in %s longer than %d bytes", path,
             EMBPS_TOKEN_MAX);
    return EMBPS_EINVAL;
  }
  memcpy(c->token, data, len);
  c->token_len = len;
  free(data);
  return 0;
}

int embps_client_create(const embps_client_options_t *opts,
                        embps_client_t **out, char *errbuf,
                        size_t errbuf_len) {
  return embps_client_create_member(opts, UINT32_MAX, out, errbuf,
                                    errbuf_len);
}

int embps_client_create_member(const embps_client_options_t *opts,
                               uint32_t member, embps_client_t **out,
                               char *errbuf, size_t errbuf_len) {
  char local[512];
  if (!errbuf) {
    errbuf = local;
    errbuf_len = sizeof local;
  }
  errbuf[0] = 0;
  *out = NULL;
  embps_client_options_t o; /* the caller's, at this library's size */
  embps_client_options_init(&o);
  if (opts) {
    int rc = embps_struct_read(&o, sizeof o, opts, "embps_client_options_t",
                               "embps_client_options_init()", errbuf,
                               errbuf_len);
    if (rc)
      return rc;
  }
  opts = &o;
  embps_client_t *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(errbuf, errbuf_len, "out of memory");
    return -ENOMEM;
  }
  embps_dedup_init(&c->dedup);
  embps_bufpool_init(&c->pool, 64 << 10, (size_t)256 << 20);
  const char *servers = opts->servers;
  if (!servers)
    servers = getenv("EMBPS_SERVERS");
  if (!servers || !*servers)
    servers = "127.0.0.1:7070";
  c->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
  c->retry_ms = !opts->retry_ms     ? DEFAULT_RETRY_MS
                : opts->retry_ms < 0 ? -1
                                     : opts->retry_ms;
  int rc = parse_servers(c, servers, errbuf, errbuf_len);
  c->member = member;
  if (!rc && member != UINT32_MAX && member >= c->n) {
    snprintf(errbuf, errbuf_len, "member %u: the server list has %u "
             "entries", member, c->n);
    rc = EMBPS_EINVAL;
  }
  if (!rc)
    rc = load_token(c, opts->token, errbuf, errbuf_len);
  if (!rc && getrandom(&c->client_id, sizeof c->client_id, 0) !=
                 (ssize_t)sizeof c->client_id)
    c->client_id = embps_now_ns() ^ ((uint64_t)getpid() << 32);
  c->client_id |= 1; /* 0 means "no exactly-once" on the wire */
  for (uint32_t i = 0; !rc && i < c->n; i++) {
    rc = member < c->n && i != member ? 0 : ensure_conn(c, i);
    if (rc)
      snprintf(errbuf, errbuf_len, "%s", c->last_error);
  }
  if (rc) {
    embps_client_destroy(c);
    return rc;
  }
  *out = c;
  return 0;
}

void embps_client_destroy(embps_client_t *c) {
  if (!c)
    return;
  for (uint32_t i = 0; i < c->n; i++)
    conn_drop(&c->conns[i], EMBPS_ECONN, "client destroyed", 0);
  free(c->conns);
  free(c->tables);
  embps_dedup_close(&c->dedup);
  embps_bufpool_close(&c->pool);
  free(c);
}

/* ------------------------------------------------------------ simple ops */

/* Sends m to every server (or only server `only` if < n) and waits. *out
 * is the ticket (caller frees; NULL only when out of memory): part i holds
 * server i's reply, an ERROR reply included, or none after a connection
 * failure. Returns the first error. */
static int broadcast_each(embps_client_t *c, const embps_msg_t *m,
                          uint32_t only, embps_ticket_t **out) {
  if (only >= c->n && c->member < c->n) /* embps_client_create_member */
    only = c->member;
  uint32_t n = only < c->n ? 1 : c->n;
  embps_ticket_t *t = ticket_new(OP_SIMPLE, n);
  *out = t;
  if (!t)
    return set_error(c, -ENOMEM, "out of memory");
  if (m->kind == EMBPS_KIND_DESCRIBE || m->kind == EMBPS_KIND_LIST ||
      m->kind == EMBPS_KIND_STATS ||
      m->kind == EMBPS_KIND_ALTER ||
      m->kind == EMBPS_KIND_SCAN) /* reads, or sets absolute values */
    ticket_allow_retry(c, t);
  int rc = 0;
  for (uint32_t i = 0; i < n && !rc; i++) {
    rc = send_msg(c, only < c->n ? only : i, &t->parts[i], m);
    if (rc) /* parts never sent count as done */
      t->n_done += n - i;
  }
  int run = ticket_run(c, t);
  if (!rc)
    rc = run;
  if (rc && t->error[0])
    set_error(c, rc, "%s", t->error);
  return rc;
}

/* broadcast_each; on success *out is the ticket, holding one reply per
 * part (caller frees). */
static int broadcast(embps_client_t *c, const embps_msg_t *m, uint32_t only,
                     embps_ticket_t **out) {
  int rc = broadcast_each(c, m, only, out);
  if (rc) {
    ticket_free(*out);
    *out = NULL;
  }
  return rc;
}

static void forget_table(embps_client_t *c, const char *name) {
  for (size_t i = 0; i < c->n_tables; i++) {
    if (strcmp(c->tables[i].name, name) == 0) {
      c->tables[i] = c->tables[--c->n_tables];
      return;
    }
  }
}

/* Writes the first field in which `have` (a server's) differs from `want`
 * as "lr 0.1, not 0.01" into buf; returns 0 when the specs are the same. */
static int spec_diff(const embps_table_spec_t *have,
                     const embps_table_spec_t *want, char *buf, size_t len) {
  if (have->optimizer != want->optimizer)
    return snprintf(buf, len, "optimizer %s, not %s",
                    embps_optimizer_name(have->optimizer),
                    embps_optimizer_name(want->optimizer)), 1;
  if (have->dtype != want->dtype)
    return snprintf(buf, len, "dtype %s, not %s", embps_dtype_name(have->dtype),
                    embps_dtype_name(want->dtype)), 1;
#define DIFF_INT_(f)                                                           \
  if (have->f != want->f)                                                      \
    return snprintf(buf, len, #f " %lld, not %lld", (long long)have->f,        \
                    (long long)want->f), 1;
#define DIFF_NUM_ DIFF_INT_
#define DIFF_FLAG_ DIFF_INT_
#define DIFF_ENUM_ DIFF_INT_
#define DIFF_REAL_(f)                                                          \
  if (have->f != want->f)                                                      \
    return snprintf(buf, len, #f " %.9g, not %.9g", have->f, want->f), 1;
#define DIFF_(type, f, kind, doc) DIFF_##kind##_(f)
  if (have->dim != want->dim)
    return snprintf(buf, len, "dim %u, not %u", have->dim, want->dim), 1;
  EMBPS_TABLE_SPEC_FIELDS(DIFF_)
#undef DIFF_
#undef DIFF_INT_
#undef DIFF_NUM_
#undef DIFF_FLAG_
#undef DIFF_ENUM_
#undef DIFF_REAL_
  return 0;
}

/* Which servers lack table spec->name: describes it on every server and
 * sets lack[s] for those answering EMBPS_ENOTABLE. A server holding it with
 * another spec, or any other failure, is an error naming the server. */
static int find_lacking(embps_client_t *c, const embps_table_spec_t *spec,
                        uint8_t *lack, uint32_t *n_lack) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_DESCRIBE;
  strcpy(m.u.name, spec->name);
  embps_ticket_t *t;
  int rc = broadcast_each(c, &m, UINT32_MAX, &t);
  if (!t)
    return rc;
  rc = 0;
  *n_lack = 0;
  for (uint32_t i = 0; i < t->n_parts && !rc; i++) {
    const part_t *p = &t->parts[i];
    uint32_t s = p->server;
    const conn_t *k = &c->conns[s];
    char why[160];
    if (!p->has_reply)
      rc = set_error(c, t->result ? t->result : EMBPS_ECONN, "%s", t->error);
    else if (p->reply.kind == EMBPS_KIND_ERROR &&
             p->reply.u.error.code == EMBPS_ENOTABLE)
      *n_lack += lack[s] = 1;
    else if (p->reply.kind == EMBPS_KIND_ERROR)
      rc = set_error(c, p->reply.u.error.code, "server %u (%s): %s", s,
                     k->addr, p->reply.u.error.message);
    else if (spec_diff(&p->reply.u.info.spec, spec, why, sizeof why))
      rc = set_error(c, EMBPS_EEXIST, "table \"%s\" already exists on server "
                     "%u (%s) with %s", spec->name, s, k->addr, why);
  }
  ticket_free(t);
  return rc;
}

int embps_create_table_ex(embps_client_t *c, const embps_table_spec_t *spec,
                          unsigned flags) {
  char why[256];
  int rc = embps_table_spec_check(spec, why, sizeof why);
  if (rc)
    return set_error(c, rc, "%s", why);
  uint8_t *lack = calloc(c->n, 1);
  if (!lack)
    return set_error(c, -ENOMEM, "out of memory");
  uint32_t n_lack = 0;
  rc = find_lacking(c, spec, lack, &n_lack);
  if (!rc && !n_lack && !(flags & EMBPS_CREATE_EXIST_OK)) {
    if (c->n == 1)
      rc = set_error(c, EMBPS_EEXIST, "server 0 (%s): table \"%s\" already "
                     "exists", c->conns[0].addr, spec->name);
    else
      rc = set_error(c, EMBPS_EEXIST, "table \"%s\" already exists on all %u "
                     "servers", spec->name, c->n);
  }
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_CREATE;
  m.u.spec = *spec;
  for (uint32_t s = 0; s < c->n && !rc; s++) {
    embps_ticket_t *t;
    if (lack[s] && (rc = broadcast(c, &m, s, &t)) == 0)
      ticket_free(t);
  }
  free(lack);
  forget_table(c, spec->name);
  return rc;
}

int embps_create_table(embps_client_t *c, const embps_table_spec_t *spec) {
  return embps_create_table_ex(c, spec, 0);
}

int embps_drop_table(embps_client_t *c, const char *name) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_DROP;
  if (!name || strlen(name) >= sizeof m.u.name || !*name)
    return set_error(c, EMBPS_EINVAL, "bad table name");
  strcpy(m.u.name, name);
  forget_table(c, name);
  embps_ticket_t *t;
  int rc = broadcast(c, &m, UINT32_MAX, &t);
  if (!rc)
    ticket_free(t);
  return rc;
}

/* Adds server x's counters into sum, each as EMBPS_TABLE_INFO_FIELDS
 * says (summed, or the largest). */
static void add_counters(embps_table_info_t *sum, const embps_table_info_t *x) {
#define MERGE_SUM_(f) sum->f += x->f;
#define MERGE_MAX_(f)                                                          \
  if (x->f > sum->f)                                                           \
    sum->f = x->f;
#define MERGE_(type, f, merge, doc) MERGE_##merge##_(f)
  EMBPS_TABLE_INFO_FIELDS(MERGE_)
#undef MERGE_
#undef MERGE_SUM_
#undef MERGE_MAX_
}

/* The table infos of a broadcast's replies, counters summed. */
static void infos_sum(const embps_ticket_t *t, embps_table_info_t *out) {
  *out = t->parts[0].reply.u.info;
  for (uint32_t i = 1; i < t->n_parts; i++)
    add_counters(out, &t->parts[i].reply.u.info);
}

int embps_describe_table(embps_client_t *c, const char *name,
                         embps_table_info_t *out) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_DESCRIBE;
  if (!name || !*name || strlen(name) >= sizeof m.u.name)
    return set_error(c, EMBPS_EINVAL, "bad table name");
  strcpy(m.u.name, name);
  embps_ticket_t *t;
  int rc = broadcast(c, &m, UINT32_MAX, &t);
  if (rc)
    return rc;
  infos_sum(t, out);
  ticket_free(t);
  return 0;
}

int embps_list_tables_held(embps_client_t *c, embps_table_info_t **out,
                           size_t *n, uint8_t **held) {
  *out = NULL;
  *n = 0;
  if (held)
    *held = NULL;
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_LIST;
  embps_ticket_t *t;
  int rc = broadcast(c, &m, UINT32_MAX, &t);
  if (rc)
    return rc;
  size_t cap = 0;
  for (uint32_t s = 0; s < t->n_parts; s++)
    cap += t->parts[s].reply.u.list.n;
  const uint32_t K = c->n;
  embps_table_info_t *v = malloc((cap ? cap : 1) * sizeof *v);
  uint8_t *h = calloc((cap ? cap : 1) * K, 1);
  size_t k = 0;
  for (uint32_t s = 0; s < t->n_parts && v && h; s++) {
    const embps_msg_t *r = &t->parts[s].reply;
    for (size_t b = 0; b < r->u.list.n; b++) {
      const embps_table_info_t *x = &r->u.list.v[b];
      size_t a = 0;
      while (a < k && strcmp(v[a].spec.name, x->spec.name))
        a++;
      if (a == k) {
        v[k++] = *x;
        for (uint32_t o = 0; c->member < K && o < K; o++)
          h[a * K + o] = 1; /* a member client asks no other server */
      } else {
        add_counters(&v[a], x);
      }
      h[a * K + t->parts[s].server] = 1;
    }
  }
  ticket_free(t);
  if (!v || !h) {
    free(v);
    free(h);
    return set_error(c, -ENOMEM, "out of memory");
  }
  *out = v;
  *n = k;
  if (held)
    *held = h;
  else
    free(h);
  return 0;
}

int embps_list_tables(embps_client_t *c, embps_table_info_t **out,
                      size_t *n) {
  return embps_list_tables_held(c, out, n, NULL);
}

void embps_tables_free(embps_table_info_t *tables, uint8_t *held) {
  free(tables);
  free(held);
}

const char *embps_client_server_address(const embps_client_t *c,
                                        size_t index) {
  return c && index < c->n ? c->conns[index].addr : NULL;
}

int embps_stats(embps_client_t *c, embps_server_stats_t **out,
                size_t *n_servers) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_STATS;
  embps_ticket_t *t;
  int rc = broadcast(c, &m, UINT32_MAX, &t);
  if (rc)
    return rc;
  uint32_t n = t->n_parts; /* c->n, or 1 for a member client */
  embps_server_stats_t *v = calloc(n, sizeof *v);
  if (!v) {
    ticket_free(t);
    return set_error(c, -ENOMEM, "out of memory");
  }
  for (uint32_t i = 0; i < n; i++) {
    v[i] = t->parts[i].reply.u.stats;
    snprintf(v[i].address, sizeof v[i].address, "%.63s",
             c->conns[t->parts[i].server].addr);
    t->parts[i].reply.u.stats.tables = NULL; /* handed to the caller */
    t->parts[i].reply.u.stats.n_tables = 0;
  }
  ticket_free(t);
  *out = v;
  *n_servers = n;
  return 0;
}

void embps_stats_free(embps_server_stats_t *s, size_t n_servers) {
  if (!s)
    return;
  for (size_t i = 0; i < n_servers; i++)
    free(s[i].tables);
  free(s);
}

int embps_checkpoint(embps_client_t *c, embps_checkpoint_info_t *info) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_CHECKPOINT;
  embps_ticket_t *t;
  int rc = broadcast(c, &m, UINT32_MAX, &t);
  if (rc)
    return rc;
  for (uint32_t i = 0; info && i < t->n_parts; i++)
    info[t->parts[i].server] = t->parts[i].reply.u.checkpoint;
  ticket_free(t);
  return 0;
}

int embps_alter_table(embps_client_t *c, const char *name,
                      const embps_table_alter_t *alter,
                      embps_table_info_t *out) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_ALTER;
  if (!name || !*name || strlen(name) >= sizeof m.u.alter.name)
    return set_error(c, EMBPS_EINVAL, "bad table name");
  if (!alter)
    return set_error(c, EMBPS_EPARAM, "nothing to alter in table \"%s\"",
                     name);
  char why[256];
  int rc = embps_table_alter_read(alter, &m.u.alter.set, why, sizeof why);
  if (rc)
    return set_error(c, rc, "%s", why);
  if (!m.u.alter.set.set || (m.u.alter.set.set & ~EMBPS_ALTER_ALL))
    return set_error(c, EMBPS_EPARAM, "nothing to alter in table \"%s\"",
                     name);
  strcpy(m.u.alter.name, name);
  forget_table(c, name);
  embps_ticket_t *t;
  rc = broadcast(c, &m, UINT32_MAX, &t);
  if (rc)
    return rc;
  if (out)
    infos_sum(t, out);
  ticket_free(t);
  return 0;
}

int embps_set_lr(embps_client_t *c, const char *name, double lr) {
  embps_table_alter_t a;
  embps_table_alter_init(&a);
  a.set = EMBPS_ALTER_LR;
  a.lr = lr;
  return embps_alter_table(c, name, &a, NULL);
}

int embps_evict(embps_client_t *c, const char *table, uint64_t *evicted) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_EVICT;
  if (strlen(table) >= sizeof m.u.name)
    return EMBPS_EINVAL;
  strcpy(m.u.name, table);
  embps_ticket_t *t;
  int rc = broadcast(c, &m, UINT32_MAX, &t);
  if (rc)
    return rc;
  uint64_t sum = 0;
  for (uint32_t i = 0; i < t->n_parts; i++)
    sum += t->parts[i].reply.u.evicted;
  ticket_free(t);
  if (evicted)
    *evicted = sum;
  return 0;
}

/* The cached spec of a table (fetched once per client). */
static int table_spec(embps_client_t *c, const char *name,
                      const embps_table_spec_t **out) {
  for (size_t i = 0; i < c->n_tables; i++) {
    if (strcmp(c->tables[i].name, name) == 0) {
      *out = &c->tables[i].spec;
      return 0;
    }
  }
  embps_table_info_t info;
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_DESCRIBE;
  if (strlen(name) >= sizeof m.u.name)
    return set_error(c, EMBPS_EINVAL, "table name too long");
  strcpy(m.u.name, name);
  embps_ticket_t *t;
  int rc = broadcast(c, &m, 0, &t);
  if (rc)
    return rc;
  info = t->parts[0].reply.u.info;
  ticket_free(t);
  cached_table_t *v = realloc(c->tables, (c->n_tables + 1) * sizeof *v);
  if (!v)
    return set_error(c, -ENOMEM, "out of memory");
  c->tables = v;
  snprintf(v[c->n_tables].name, sizeof v[c->n_tables].name, "%s", name);
  v[c->n_tables].spec = info.spec;
  *out = &v[c->n_tables++].spec;
  return 0;
}

/* ------------------------------------------------------------ pull */

/* Splits positions 0..n-1 of ids by owning server into the ticket's parts
 * (pos arrays). With one server, part 0 gets them all. */
static int split_by_server(embps_client_t *c, embps_ticket_t *t,
                           const int64_t *ids, size_t n) {
  uint32_t K = c->n;
  size_t *count = calloc(K, sizeof *count);
  uint32_t *owner = K > 1 ? malloc(n * sizeof *owner) : NULL;
  if (!count || (K > 1 && n && !owner)) {
    free(count);
    free(owner);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    uint32_t s = K > 1 ? embps_route(ids[i], K) : 0;
    if (owner)
      owner[i] = s;
    count[s]++;
  }
  int rc = 0;
  for (uint32_t s = 0; s < K && !rc; s++) {
    t->parts[s].pos = malloc((count[s] ? count[s] : 1) * sizeof(uint32_t));
    if (!t->parts[s].pos)
      rc = -ENOMEM;
  }
  for (size_t i = 0; i < n && !rc; i++) {
    part_t *p = &t->parts[owner ? owner[i] : 0];
    p->pos[p->n++] = (uint32_t)i;
  }
  free(count);
  free(owner);
  return rc;
}

/* Where a request's bulk comes from. */
typedef struct {
  size_t (*len)(const part_t *p, uint32_t dim);
  /* The bulk as up to two segments of memory that stays unchanged until
   * the reply (the caller's buffers or the ticket's): sent from there, not
   * copied. Returns how many, or 0 when fill must gather it. */
  int (*borrow)(const embps_ticket_t *t, const part_t *p, const void *ctx,
                struct iovec seg[2]);
  /* Writes the bulk at dst. */
  void (*fill)(const embps_ticket_t *t, const part_t *p, const void *ctx,
               uint8_t *dst);
} bulk_ops_t;

/* Sends one request per part in parts [0, n_parts), with the bulk that ops
 * gives for it. Parts not sent are marked done; returns the first error. */
static int send_parts(embps_client_t *c, embps_ticket_t *t, embps_msg_t *m,
                      const bulk_ops_t *ops, const void *ctx,
                      int send_empty) {
  for (uint32_t s = 0; s < t->n_parts; s++) {
    part_t *p = &t->parts[s];
    if (t->result || (!p->n && !send_empty)) {
      part_done(p);
      continue;
    }
    if (m->kind == EMBPS_KIND_PULL)
      m->u.pull.n_ids = (uint32_t)p->n;
    else if (m->kind == EMBPS_KIND_WRITE_ROWS)
      m->u.write_rows.n = (uint32_t)p->n;
    else
      m->u.push.n = (uint32_t)p->n;
    size_t off = 0;
    const size_t bulk_len = ops->len(p, t->dim);
    struct iovec seg[2];
    const int n_seg = ops->borrow(t, p, ctx, seg);
    p->server = s;
    p->kind = m->kind;
    p->req_id = ++c->next_req_id;
    int rc = n_seg ? embps_frame_build_head(m, p->req_id, bulk_len, &p->frame,
                                            &p->frame_len)
                   : embps_frame_build(m, p->req_id, bulk_len, &p->frame,
                                       &p->frame_len, &off);
    if (rc) {
      ticket_fail(t, rc, "%s", embps_strerror(rc));
    } else if ((rc = frame_fits(c, s, n_seg ? p->frame_len + bulk_len
                                            : p->frame_len)) != 0) {
      ticket_fail(t, rc, "%s", c->last_error);
    }
    if (rc) {
      part_done(p);
      continue;
    }
    if (!n_seg)
      ops->fill(t, p, ctx, p->frame + off);
    for (int i = 0; i < n_seg; i++)
      p->bulk[i] = seg[i];
    p->n_bulk = n_seg;
    part_submit(c, s, p);
  }
  return t->result;
}

/* Orders the ticket's unique ids by owning server, so that each server's
 * ids, and so its rows, are contiguous (part s covers [base, base + n)),
 * and remaps the inverse index to match. */
static int group_unique_by_server(embps_client_t *c, embps_ticket_t *t) {
  uint32_t K = c->n;
  size_t n = t->n_unique;
  if (K == 1) {
    t->parts[0].base = 0;
    t->parts[0].n = n;
    return 0;
  }
  uint32_t *owner = malloc((n ? n : 1) * sizeof *owner);
  uint32_t *moved = malloc((n ? n : 1) * sizeof *moved);
  size_t ids_cap;
  int64_t *ids = embps_bufpool_take(&c->pool, n * sizeof *ids, &ids_cap);
  size_t *fill = calloc(K, sizeof *fill);
  int rc = owner && moved && ids && fill ? 0 : -ENOMEM;
  if (!rc) {
    for (size_t i = 0; i < n; i++) {
      owner[i] = embps_route(t->uniq[i], K);
      t->parts[owner[i]].n++;
    }
    for (uint32_t s = 1; s < K; s++)
      t->parts[s].base = t->parts[s - 1].base + t->parts[s - 1].n;
    for (size_t i = 0; i < n; i++) {
      part_t *p = &t->parts[owner[i]];
      moved[i] = (uint32_t)(p->base + fill[owner[i]]++);
      ids[moved[i]] = t->uniq[i];
    }
    for (size_t i = 0; i < t->n; i++)
      t->inverse[i] = moved[t->inverse[i]];
    embps_bufpool_give(&c->pool, t->uniq, t->uniq_cap);
    t->uniq = ids; /* with its own capacity: it goes back to the pool */
    t->uniq_cap = ids_cap;
    ids = NULL;
  }
  free(owner);
  free(moved);
  embps_bufpool_give(&c->pool, ids, ids_cap);
  free(fill);
  return rc;
}

static size_t pull_bulk_len(const part_t *p, uint32_t dim) {
  return p->n * sizeof(int64_t);
}

/* A part's ids are contiguous in the ticket's unique ids. */
static int pull_borrow(const embps_ticket_t *t, const part_t *p,
                       const void *ctx, struct iovec seg[2]) {
  seg[0] = (struct iovec){.iov_base = t->uniq + p->base,
                          .iov_len = p->n * sizeof *t->uniq};
  return 1;
}

static const bulk_ops_t pull_ops = {pull_bulk_len, pull_borrow, NULL};

static int check_name(embps_client_t *c, const char *table) {
  if (!table || !*table || strlen(table) >= EMBPS_TABLE_NAME_MAX)
    return set_error(c, EMBPS_EINVAL, "bad table name");
  return 0;
}

int embps_pull_async(embps_client_t *c, const char *table,
                     const int64_t *ids, size_t n, float *out, uint32_t dim,
                     embps_ticket_t **ticket) {
  *ticket = NULL;
  int rc = check_name(c, table);
  if (rc)
    return rc;
  if (dim == 0 || dim > EMBPS_DIM_MAX || n > UINT32_MAX)
    return set_error(c, EMBPS_EINVAL, "bad dim or count");
  embps_ticket_t *t = ticket_new(OP_PULL, c->n);
  if (!t)
    return set_error(c, -ENOMEM, "out of memory");
  ticket_allow_retry(c, t);
  t->out = out;
  t->n = n;
  t->dim = dim;
  t->uniq = embps_bufpool_take(&c->pool, n * sizeof *t->uniq, &t->uniq_cap);
  t->inverse =
      embps_bufpool_take(&c->pool, n * sizeof *t->inverse, &t->inverse_cap);
  int64_t k = t->uniq && t->inverse
                  ? embps_dedup_ids(&c->dedup, ids, n, t->uniq, t->inverse)
                  : -ENOMEM;
  if (k >= 0) {
    t->n_unique = (size_t)k;
    /* all distinct on one server: the rows land in the caller's buffer */
    t->urows = (size_t)k == n && c->n == 1
                   ? out
                   : embps_bufpool_take(&c->pool,
                                        (size_t)k * dim * sizeof(float),
                                        &t->urows_cap);
    if (!t->urows)
      k = -ENOMEM;
  }
  if (k >= 0)
    k = group_unique_by_server(c, t);
  if (k < 0) {
    ticket_free(t);
    return set_error(c, -ENOMEM, "out of memory");
  }
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_PULL;
  strcpy(m.u.pull.table, table);
  m.u.pull.dim = dim;
  send_parts(c, t, &m, &pull_ops, NULL, 0);
  *ticket = t;
  return 0;
}

int embps_pull(embps_client_t *c, const char *table, const int64_t *ids,
               size_t n, float *out, uint32_t dim) {
  embps_ticket_t *t;
  int rc = embps_pull_async(c, table, ids, n, out, dim, &t);
  return rc ? rc : embps_wait(c, t);
}

/* ------------------------------------------------------------ push */

typedef struct {
  const int64_t *idx;
  const float *vals;
} push_src_t;

static size_t push_bulk_len(const part_t *p, uint32_t dim) {
  return p->n * (sizeof(int64_t) + dim * sizeof(float));
}

/* One server: the arrays as they are. */
static int push_borrow(const embps_ticket_t *t, const part_t *p,
                       const void *ctx, struct iovec seg[2]) {
  const push_src_t *src = ctx;
  if (p->pos)
    return 0;
  seg[0] = (struct iovec){.iov_base = (void *)src->idx,
                          .iov_len = p->n * sizeof *src->idx};
  seg[1] = (struct iovec){.iov_base = (void *)src->vals,
                          .iov_len = p->n * t->dim * sizeof *src->vals};
  return 2;
}

/* Several servers: the part's rows, gathered. */
static void push_fill(const embps_ticket_t *t, const part_t *p,
                      const void *ctx, uint8_t *dst) {
  const push_src_t *src = ctx;
  uint32_t dim = t->dim;
  int64_t *idx = (int64_t *)dst;
  float *vals = (float *)(dst + p->n * sizeof(int64_t));
  for (size_t i = 0; i < p->n; i++) {
    idx[i] = src->idx[p->pos[i]];
    memcpy(vals + i * dim, src->vals + (size_t)p->pos[i] * dim,
           dim * sizeof *vals);
  }
}

/* Everything a server could refuse, checked before anything is sent. */
static int check_push(embps_client_t *c, const embps_table_spec_t *s,
                      const int64_t *idx, size_t n, const float *vals,
                      uint32_t dim) {
  if (dim != s->dim)
    return set_error(c, EMBPS_EDIM, "table \"%s\" has dim %u, the request "
                     "has dim %u", s->name, s->dim, dim);
  for (size_t i = 0; i < n; i++) {
    if (!s->dynamic && (uint64_t)idx[i] >= s->rows)
      return set_error(c, EMBPS_ERANGE, "index %lld out of range [0, %llu) "
                       "of table \"%s\"", (long long)idx[i],
                       (unsigned long long)s->rows, s->name);
    const float *r = vals + i * dim;
    for (uint32_t j = 0; j < dim; j++)
      if (!isfinite(r[j]))
        return set_error(c, EMBPS_ENONFINITE, "non-finite gradient value at "
                         "position %zu (index %lld)", i, (long long)idx[i]);
  }
  return 0;
}

static int push_async(embps_client_t *c, const char *table,
                      const int64_t *indices, size_t n, const float *values,
                      uint32_t dim, unsigned flags, uint64_t step,
                      embps_ticket_t **ticket) {
  *ticket = NULL;
  int rc = check_name(c, table);
  if (rc)
    return rc;
  if (dim == 0 || dim > EMBPS_DIM_MAX || n > UINT32_MAX)
    return set_error(c, EMBPS_EINVAL, "bad dim or count");
  if (c->n > 1) { /* cross-server atomicity needs the checks up front */
    const embps_table_spec_t *spec = NULL;
    rc = table_spec(c, table, &spec);
    if (!rc)
      rc = check_push(c, spec, indices, n, values, dim);
    if (rc)
      return rc;
  }
  embps_ticket_t *t = ticket_new(OP_PUSH, c->n);
  if (!t)
    return set_error(c, -ENOMEM, "out of memory");
  ticket_allow_retry(c, t); /* exactly once: same client id and seq */
  t->dim = dim;
  push_src_t src = {indices, values};
  if (flags & EMBPS_PUSH_MERGE) {
    t->m_idx = malloc((n ? n : 1) * sizeof *t->m_idx);
    t->m_vals = malloc((n ? n : 1) * dim * sizeof *t->m_vals);
    int64_t k = t->m_idx && t->m_vals
                    ? embps_merge_rows(&c->dedup, indices, values, n, dim,
                                       t->m_idx, t->m_vals)
                    : -ENOMEM;
    if (k < 0) {
      ticket_free(t);
      return set_error(c, -ENOMEM, "out of memory");
    }
    n = (size_t)k;
    src.idx = t->m_idx;
    src.vals = t->m_vals;
  }
  if (c->n > 1) {
    if (split_by_server(c, t, src.idx, n)) {
      ticket_free(t);
      return set_error(c, -ENOMEM, "out of memory");
    }
  } else {
    t->parts[0].n = n;
  }
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_PUSH;
  strcpy(m.u.push.table, table);
  m.u.push.dim = dim;
  m.u.push.client_id = c->client_id;
  m.u.push.seq = ++c->seq;
  m.u.push.step = step;
  static const bulk_ops_t push_ops = {push_bulk_len, push_borrow, push_fill};
  send_parts(c, t, &m, &push_ops, &src, 1);
  *ticket = t;
  return 0;
}

int embps_push_async(embps_client_t *c, const char *table,
                     const int64_t *indices, size_t n, const float *values,
                     uint32_t dim, unsigned flags, embps_ticket_t **ticket) {
  return push_async(c, table, indices, n, values, dim, flags, 0, ticket);
}

int embps_push_step_async(embps_client_t *c, const char *table,
                          const int64_t *indices, size_t n,
                          const float *values, uint32_t dim, unsigned flags,
                          uint64_t step, embps_ticket_t **ticket) {
  return push_async(c, table, indices, n, values, dim, flags, step, ticket);
}

int embps_push(embps_client_t *c, const char *table, const int64_t *indices,
               size_t n, const float *values, uint32_t dim, unsigned flags) {
  embps_ticket_t *t;
  int rc = push_async(c, table, indices, n, values, dim, flags, 0, &t);
  return rc ? rc : embps_wait(c, t);
}

int embps_push_step(embps_client_t *c, const char *table,
                    const int64_t *indices, size_t n, const float *values,
                    uint32_t dim, unsigned flags, uint64_t step) {
  embps_ticket_t *t;
  int rc = push_async(c, table, indices, n, values, dim, flags, step, &t);
  return rc ? rc : embps_wait(c, t);
}

/* ------------------------------------------------------------ wait */

int embps_wait(embps_client_t *c, embps_ticket_t *t) {
  if (!t)
    return set_error(c, EMBPS_EINVAL, "no ticket");
  int rc = ticket_run(c, t);
  if (!rc && t->op == OP_PULL && t->urows != t->out)
    embps_lookup(t->urows, t->dim, t->inverse, t->n, t->out);
  if (rc)
    set_error(c, rc, "%s", t->error[0] ? t->error : embps_strerror(rc));
  if (t->op == OP_PULL && !rc)
    pull_give_buffers(c, t);
  ticket_free(t);
  return rc;
}

/* ------------------------------------------------------------ export/import */

int embps_scan(embps_client_t *c, uint32_t server, const char *table,
               uint64_t cursor, uint32_t max_rows, unsigned flags,
               embps_scan_chunk_t *out) {
  memset(out, 0, sizeof *out);
  int rc = check_name(c, table);
  if (rc)
    return rc;
  if (server >= c->n)
    return set_error(c, EMBPS_EINVAL, "server %u of a cluster of %u", server,
                     c->n);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_SCAN;
  strcpy(m.u.scan.table, table);
  m.u.scan.cursor = cursor;
  m.u.scan.max_rows = max_rows;
  m.u.scan.with_state = (flags & EMBPS_SCAN_STATE) != 0;
  embps_ticket_t *t;
  rc = broadcast(c, &m, server, &t);
  if (rc)
    return rc;
  part_t *p = &t->parts[0];
  const embps_scan_reply_t *r = &p->reply.u.scan_reply;
  const uint64_t per_row =
      8 + 4 * (uint64_t)r->dim * (1 + (uint64_t)r->state_floats);
  if (r->dim == 0 || r->dim > EMBPS_DIM_MAX || r->state_floats > 2 ||
      (r->state_floats && !m.u.scan.with_state) ||
      (max_rows && r->n_rows > max_rows) ||
      p->rbulk_len != r->n_rows * per_row || (r->n_rows && !p->rbulk)) {
    ticket_free(t);
    return set_error(c, EMBPS_EPROTO, "server %u (%s): scan reply does not "
                     "match its counts", server, c->conns[server].addr);
  }
  out->n = r->n_rows;
  out->dim = r->dim;
  out->state_slots = r->state_floats;
  out->next_cursor = r->next_cursor;
  out->done = r->done;
  out->step = r->step;
  out->ids = (int64_t *)p->rbulk;
  out->weights = (float *)(p->rbulk + out->n * 8);
  out->state = r->state_floats ? out->weights + out->n * out->dim : NULL;
  out->priv = p->rbulk;
  p->rbulk = NULL;
  ticket_free(t);
  return 0;
}

void embps_scan_chunk_free(embps_scan_chunk_t *chunk) {
  if (!chunk)
    return;
  free(chunk->priv);
  memset(chunk, 0, sizeof *chunk);
}

typedef struct {
  const int64_t *ids;
  const float *w, *state;
  uint32_t dim, slots;
} rows_src_t;

/* The ticket's dim is the floats of a row on the wire: weights and state. */
static int rows_borrow(const embps_ticket_t *t, const part_t *p,
                       const void *ctx, struct iovec seg[2]) {
  (void)t;
  (void)p;
  (void)ctx;
  (void)seg;
  return 0; /* three arrays: always gathered */
}

static void rows_fill(const embps_ticket_t *t, const part_t *p,
                      const void *ctx, uint8_t *dst) {
  const rows_src_t *src = ctx;
  const size_t dim = src->dim, sf = (size_t)src->slots * dim;
  int64_t *ids = (int64_t *)dst;
  float *w = (float *)(dst + p->n * sizeof *ids);
  float *state = w + p->n * dim;
  (void)t;
  for (size_t i = 0; i < p->n; i++) {
    size_t j = p->pos ? p->pos[i] : i;
    ids[i] = src->ids[j];
    memcpy(w + i * dim, src->w + j * dim, dim * sizeof *w);
    if (sf)
      memcpy(state + i * sf, src->state + j * sf, sf * sizeof *state);
  }
}

int embps_write_rows(embps_client_t *c, const char *table,
                     const int64_t *ids, size_t n, const float *weights,
                     uint32_t dim, const float *state, int set_step,
                     uint64_t step) {
  int rc = check_name(c, table);
  if (rc)
    return rc;
  if (dim == 0 || dim > EMBPS_DIM_MAX || n > UINT32_MAX)
    return set_error(c, EMBPS_EINVAL, "bad dim or count");
  const embps_table_spec_t *spec = NULL;
  rc = table_spec(c, table, &spec);
  if (rc)
    return rc;
  uint32_t slots =
      state ? embps_optimizer_state_slots(spec->optimizer, NULL) : 0;
  if (c->n > 1 && (rc = check_push(c, spec, ids, n, weights, dim)) != 0)
    return rc;
  embps_ticket_t *t = ticket_new(OP_PUSH, c->n);
  if (!t)
    return set_error(c, -ENOMEM, "out of memory");
  t->dim = dim * (1 + slots);
  if (c->n > 1 ? split_by_server(c, t, ids, n) != 0 : (t->parts[0].n = n, 0)) {
    ticket_free(t);
    return set_error(c, -ENOMEM, "out of memory");
  }
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_WRITE_ROWS;
  strcpy(m.u.write_rows.table, table);
  m.u.write_rows.dim = dim;
  m.u.write_rows.state_floats = slots;
  m.u.write_rows.has_step = set_step != 0;
  m.u.write_rows.step = step;
  rows_src_t src = {ids, weights, state, dim, slots};
  static const bulk_ops_t rows_ops = {push_bulk_len, rows_borrow, rows_fill};
  send_parts(c, t, &m, &rows_ops, &src, set_step);
  return embps_wait(c, t);
}
