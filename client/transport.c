/* transport.c - libembps's transport: connections, frames, tickets and
 * their retries (internal.h); the API operations (client.c) are built on
 * it.
 *
 * No background thread: a client owns one non-blocking socket per server
 * and makes progress only inside embps_wait() (and the blocking calls built
 * on it), with one poll() over every socket that both writes queued request
 * frames and reads replies. Reading while writing matters: a server that
 * applies backpressure stops reading until we read its replies.
 *
 * Parts: each part of a ticket is a request frame with its own request id,
 * queued on its server's connection; a bulk sent from the caller's arrays
 * is written from there (sendmsg), not copied. Replies are matched to parts
 * by id, so many tickets may be in flight on one connection. Replies are
 * read through a framer (common/framer.h): a pull reply's rows go straight
 * into the ticket's unique-row buffer, everything else into the
 * connection's buffer.
 *
 * Retries: a connection that breaks keeps the parts whose ticket may still
 * retry (the operation allows it: reads, absolute sets, and pushes, whose
 * client id and seq make them exactly once), and sends them again, the
 * very same bytes in the same order, once a reconnection with backoff
 * succeeds; each attempt gets the client's timeout, after which the
 * connections that owe the ticket a reply are dropped, so no late reply
 * lands in a buffer the caller took back.
 *
 * Owed pushes: a push goes to every server, and one that stops answering
 * for longer than the retry time would leave it applied on the others
 * only. Its part there is not dropped: an owed copy (the whole frame, its
 * own OP_OWED ticket) takes its place in the connection's pending list,
 * so it is sent again, the same bytes (client id, seq), before anything
 * queued after it once the connection is back: the server applies it
 * exactly once (a copy it had applied already is acknowledged as a
 * duplicate), and no later push of this client can reach that server
 * first (the server would then take the owed one for an old duplicate).
 * The caller learns which servers applied the push (embps_push_outcome_)
 * and may complete it at once (embps_push_resume). A push that no server
 * can have applied owes nothing: it failed, and may be pushed again.
 *
 * Members (issue 21): a member listed as PRIMARY|FOLLOWER has its primary
 * connection, which moves to whichever of its servers says it is the
 * primary, and with reads from followers a read connection that prefers a
 * follower ("Members" below); parts carry their member (server) and the
 * connection they are on (conn).
 *
 * A server's reply is trusted only as far as the request allows: its
 * header is checked against the largest body the request can produce
 * before the body is read (a 3-row pull cannot make a 1 GiB reply
 * allocate anything), its kind and counts against the request once
 * decoded, and a server's error text is escaped (control bytes as \xNN)
 * before it reaches a message, a terminal or an exception. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "embps/embps.h"
#include "internal.h"
#include "util.h"
#include "wire.h"

#define MAX_REPLY_BYTES EMBPS_REPLY_MAX
#define SMALL_REPLY_MAX EMBPS_REPLY_META_MAX
/* LIST and STATS replies hold one table info (~500 bytes) per table: room
 * for 100,000 tables. */
#define TABLES_REPLY_MAX (64u << 20)
#define BACKOFF_MIN_MS 20
#define BACKOFF_MAX_MS 1000
/* A member listed with several servers is in a failover while none of
 * them is primary: they are asked again sooner, for the one elected
 * (automatic failover: a lease's time after the primary died) to be found
 * within this of its promotion. */
#define BACKOFF_MEMBER_MAX_MS 250
/* A request waiting on a member's primary this long, all of it sent, has
 * the member's other servers asked whether one was elected meanwhile
 * ("Members"), at most once per PROBE_EVERY_MS, each within
 * PROBE_TIMEOUT_MS (a hello is answered in a millisecond by a server that
 * runs). */
#define PROBE_AFTER_MS 1000
#define PROBE_EVERY_MS 1000
#define PROBE_TIMEOUT_MS 200

/* ------------------------------------------------------------ errors */

int embps_client_error_(embps_client_t *c, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
  va_end(ap);
  return code;
}

int embps_client_set_error_(embps_client_t *c, int code, const char *msg) {
  return embps_client_error_(c, code, "%s", msg);
}

uint64_t embps_client_max_frame_(const embps_client_t *c) {
  uint64_t m = 0;
  for (uint32_t i = 0; i < c->n_conns; i++)
    if (c->conns[i].max_frame && (!m || c->conns[i].max_frame < m))
      m = c->conns[i].max_frame;
  return m;
}

void embps_ticket_fail_(embps_ticket_t *t, int code, const char *fmt, ...) {
  if (t->result)
    return; /* the first error is the one reported */
  t->result = code;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->error, sizeof t->error, fmt, ap);
  va_end(ap);
}

/* ------------------------------------------------------------ tickets */

embps_ticket_t *embps_ticket_new_(op_t op, uint32_t n_parts) {
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

void embps_ticket_free_(embps_ticket_t *t) {
  if (!t)
    return;
  for (uint32_t i = 0; i < t->n_parts; i++) {
    if (t->parts[i].orphan) /* the owed copy lives on without it */
      t->parts[i].orphan->origin = NULL;
    if (t->parts[i].origin)
      t->parts[i].origin->orphan = NULL;
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

/* ------------------------------------------------------------ connections */

/* Connection-level failures after which a request may be sent again: the
 * server never answered it, or said it was going away. Any other code is a
 * server's answer (or ours) and final. */
static int code_retryable(int code) {
  return code == EMBPS_ECONN || code == EMBPS_ETIMEDOUT ||
         code == EMBPS_ESHUTDOWN || code == EMBPS_ENOREPLICAS ||
         code == EMBPS_ENOTPRIMARY;
}

static void pending_append(conn_t *k, part_t *p) {
  p->next = NULL;
  if (k->pending_tail)
    k->pending_tail->next = p;
  else
    k->pending_head = p;
  k->pending_tail = p;
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

/* Replaces part p by q at p's place in k's pending list. */
static void replace_part(conn_t *k, part_t *p, part_t *q) {
  part_t *prev = NULL;
  for (part_t *x = k->pending_head; x && x != p; x = x->next)
    prev = x;
  q->next = p->next;
  if (prev)
    prev->next = q;
  else
    k->pending_head = q;
  if (k->pending_tail == p)
    k->pending_tail = q;
  p->next = NULL;
}

/* ------------------------------------------------------------ owed */

/* Whether push part p, failing with code, leaves an owed copy: a push
 * (it carries client id and seq) given up on a connection failure. */
static int owes(const part_t *p, int code) {
  return p->t->op == OP_PUSH && p->kind == EMBPS_KIND_PUSH &&
         code_retryable(code);
}

/* The owed copy of push part p, given up on k: its whole frame (header,
 * meta, bulk) in a ticket of its own that retries for ever, linked last
 * in the client's list. NULL when out of memory (p then just fails). */
static part_t *owed_new(conn_t *k, part_t *p) {
  embps_client_t *c = k->client;
  size_t len = p->frame_len;
  for (int i = 0; i < p->n_bulk; i++)
    len += p->bulk[i].iov_len;
  embps_ticket_t *o = embps_ticket_new_(OP_OWED, 1);
  uint8_t *frame = o ? malloc(len) : NULL;
  if (!frame) {
    embps_ticket_free_(o);
    return NULL;
  }
  size_t off = p->frame_len;
  memcpy(frame, p->frame, p->frame_len);
  for (int i = 0; i < p->n_bulk; i++) {
    memcpy(frame + off, p->bulk[i].iov_base, p->bulk[i].iov_len);
    off += p->bulk[i].iov_len;
  }
  o->retry_until_ns = UINT64_MAX;
  o->seq = p->t->seq;
  part_t *q = &o->parts[0];
  q->server = p->server;
  q->conn = p->conn;
  q->req_id = p->req_id;
  q->kind = p->kind;
  q->n = p->n;
  q->frame = frame;
  q->frame_len = len;
  q->written = p->written;
  q->origin = p;
  p->orphan = q;
  o->owed_prev = c->owed_tail;
  if (c->owed_tail)
    c->owed_tail->owed_next = o;
  else
    c->owed_head = o;
  c->owed_tail = o;
  c->n_owed++;
  c->owed_bytes += len;
  k->n_owed++;
  return q;
}

/* Frees owed copy q, taken off k's pending list: the push is complete
 * there (done 1), refused there (-1), or owed no more (0). */
static void owed_free(conn_t *k, part_t *q, int done) {
  embps_client_t *c = k->client;
  embps_ticket_t *o = q->t;
  if (q->origin) {
    q->origin->owed_done = done;
    q->origin->orphan = NULL;
    q->origin = NULL;
  }
  if (o->owed_prev)
    o->owed_prev->owed_next = o->owed_next;
  else
    c->owed_head = o->owed_next;
  if (o->owed_next)
    o->owed_next->owed_prev = o->owed_prev;
  else
    c->owed_tail = o->owed_prev;
  c->n_owed--;
  c->owed_bytes -= q->frame_len;
  k->n_owed--;
  embps_ticket_free_(o);
}

/* Owed copy q (taken off k's pending list) cannot be completed: the
 * server refused it, or the client is going away. Noted for the next
 * embps_push_resume. */
static void owed_lost(conn_t *k, part_t *q, int code, const char *why) {
  embps_client_t *c = k->client;
  c->owed_lost_code = code;
  snprintf(c->owed_lost, sizeof c->owed_lost, "push seq %llu could not be "
           "completed on server %u (%.80s): %.300s; it stays applied on the "
           "other servers only", (unsigned long long)q->t->seq, k->index,
           k->addr, why);
  owed_free(k, q, -1);
}

/* Part p fails with code and why (its place in k's pending list is the
 * caller's); a push given up, when may_owe, leaves its owed copy,
 * returned to take p's place (or NULL). */
static part_t *part_give_up(conn_t *k, part_t *p, int code, const char *why,
                            int may_owe) {
  part_t *q = may_owe && owes(p, code) ? owed_new(k, p) : NULL;
  embps_ticket_fail_(p->t, code, "%s", why);
  embps_part_done_(p);
  return q;
}

void embps_owed_free_all_(embps_client_t *c) {
  while (c->owed_head) {
    part_t *q = &c->owed_head->parts[0];
    conn_t *k = &c->conns[q->conn];
    for (part_t *x = k->pending_head; x; x = x->next)
      if (x == q) {
        unlink_part(k, q);
        break;
      }
    owed_free(k, q, 0);
  }
}

/* Drops a connection. Every part waiting on it fails with code, except,
 * when may_retry, those whose ticket may still retry after a failure of
 * this kind: they stay pending, in order, to be sent again once the
 * connection is back (embps_client_connect_); a push given up leaves its
 * owed copy in its place, and owed copies stay (they retry for ever). */
void embps_conn_drop_(conn_t *k, int code, const char *why, int may_retry) {
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
  char msg[EMBPS_MESSAGE_MAX + 64];
  snprintf(msg, sizeof msg, "server %u (%s): %s", k->index, k->addr, why);
  for (part_t *next; p; p = next) {
    next = p->next;
    if (may_retry && code_retryable(code) && p->t->retry_until_ns > now) {
      pending_append(k, p);
      continue;
    }
    p->next = NULL;
    if (p->t->op == OP_OWED) {
      owed_lost(k, p, code, why);
      continue;
    }
    part_t *q = part_give_up(k, p, code, msg, may_retry);
    if (q)
      pending_append(k, q);
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
  k->cur = NULL; /* the framer starts afresh on the next connection */
  k->in_place = 0;
}

static void conn_fail(conn_t *k, int code, const char *why) {
  embps_conn_drop_(k, code, why, 1);
}

static int connect_fd(conn_t *k, int timeout_ms, char *why, size_t why_len) {
  int fd = embps_dial_(k->host, k->port, timeout_ms, why, why_len);
  if (fd < 0)
    return EMBPS_ECONN;
  k->fd = fd;
  return 0;
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
    embps_ticket_fail_(p->t, -ENOMEM, "out of memory");
    embps_part_done_(p);
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
        o->part->written = 1;
        k->out_head = o->next;
        if (!k->out_head)
          k->out_tail = NULL;
        free(o);
      }
    }
  }
}

/* Whether a table name a server sent can be shown: printable ASCII, no
 * space (the server's names are [A-Za-z0-9_.-]). */
static int name_printable(const char *name) {
  for (const unsigned char *c = (const unsigned char *)name; *c; c++)
    if (*c <= 0x20 || *c >= 0x7f)
      return 0;
  return 1;
}

/* Whether every table info of a reply has a printable name. */
static int infos_printable(const embps_table_info_t *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!name_printable(v[i].spec.name))
      return 0;
  return 1;
}

/* Checks a decoded reply m against the request of part p: its kind must be
 * the request's kind | EMBPS_KIND_REPLY (or ERROR), its counts those
 * asked for, the table names it holds printable, a stats reply's server
 * the one asked (any place in its cluster for a peer, whose hello says
 * nothing of it). in_place: its bulk went straight to the part's
 * destination (pull rows). Returns NULL, or what is wrong. */
static const char *reply_mismatch(const part_t *p, const embps_msg_t *m,
                                  int in_place, int peer) {
  static const char *const bad_name =
      "reply names a table with a control, space or non-ASCII byte";
  if (m->kind == EMBPS_KIND_ERROR)
    return NULL;
  if (m->kind != (p->kind | EMBPS_KIND_REPLY))
    return "reply of the wrong kind";
  switch (p->kind) {
  case EMBPS_KIND_DESCRIBE:
  case EMBPS_KIND_ALTER:
    if (!infos_printable(&m->u.info, 1))
      return bad_name;
    break;
  case EMBPS_KIND_LIST:
    if (!infos_printable(m->u.list.v, m->u.list.n))
      return bad_name;
    break;
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
    if (!peer && m->u.stats.cluster_index != p->server)
      return "stats reply from another cluster index";
    if (!infos_printable(m->u.stats.tables, m->u.stats.n_tables))
      return bad_name;
    break;
  default:
    break;
  }
  return NULL;
}

/* A server's text, escaped in place: control bytes and invalid UTF-8
 * become \xNN, so what a server says cannot drive a terminal or forge
 * lines of a message (cut to fit). */
static void escape_server_text(char *text, size_t cap) {
  char raw[EMBPS_MESSAGE_MAX];
  snprintf(raw, sizeof raw, "%s", text);
  embps_escape(raw, text, cap);
}

/* Hands a checked reply m (taken) to part p; a read's LSN is its
 * member's latest. */
static void deliver(conn_t *k, part_t *p, embps_msg_t *m) {
  embps_ticket_t *t = p->t;
  if (m->kind == (EMBPS_KIND_PULL | EMBPS_KIND_REPLY) && m->u.pull_reply.lsn)
    k->m->read_lsn = m->u.pull_reply.lsn;
  else if (m->kind == (EMBPS_KIND_SCAN | EMBPS_KIND_REPLY) &&
           m->u.scan_reply.lsn)
    k->m->read_lsn = m->u.scan_reply.lsn;
  if (m->kind == EMBPS_KIND_ERROR) {
    escape_server_text(m->u.error.message, sizeof m->u.error.message);
    embps_ticket_fail_(t, m->u.error.code, "server %u (%s): %s", k->index,
                       k->addr, m->u.error.message);
  }
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

/* The largest reply body the request of part p can produce: its rows for
 * a pull (and the meta), its max_reply when its builder set one (a scan),
 * one table info per table for a list or stats, the meta alone for the
 * other kinds this file knows; a kind it does not know sets max_reply. */
static size_t reply_max(const part_t *p) {
  if (p->max_reply)
    return p->max_reply;
  switch (p->kind) {
  case EMBPS_KIND_PULL:
    return SMALL_REPLY_MAX + p->n * p->t->dim * sizeof(float);
  case EMBPS_KIND_LIST:
  case EMBPS_KIND_STATS:
    return TABLES_REPLY_MAX;
  case EMBPS_KIND_HELLO:
  case EMBPS_KIND_CREATE:
  case EMBPS_KIND_DROP:
  case EMBPS_KIND_DESCRIBE:
  case EMBPS_KIND_PUSH:
  case EMBPS_KIND_CHECKPOINT:
  case EMBPS_KIND_WRITE_ROWS:
  case EMBPS_KIND_ALTER:
  case EMBPS_KIND_EVICT:
    return SMALL_REPLY_MAX;
  default:
    return MAX_REPLY_BYTES;
  }
}

/* Where the body of a reply goes (the framer's header callback): finds
 * its part and checks the body's size against what the request can
 * produce (an error's against an error's) before anything is read or
 * allocated; a pull reply of the expected size has its rows read straight
 * into the ticket's row buffer, everything else is read into the
 * connection's buffer. A header that is not one, answers no request, or
 * announces more than its request can produce fails the connection. */
static int on_reply_header(void *owner, const embps_frame_header_t *h,
                           int rc, embps_framer_seg_t seg[2]) {
  conn_t *k = owner;
  if (rc) {
    conn_fail(k, EMBPS_EPROTO, "malformed reply frame");
    return EMBPS_FRAMER_STOP;
  }
  part_t *p = find_part(k, h->req_id);
  size_t off = embps_bulk_offset(h->meta_len);
  size_t buffered = h->body_len;
  const int error = h->kind == EMBPS_KIND_ERROR;
  const size_t max = error ? SMALL_REPLY_MAX : p ? reply_max(p) : 0;
  if (!p && !(error && h->req_id == 0)) {
    char why[96];
    snprintf(why, sizeof why, "reply to request %u, which was not sent "
             "on this connection", h->req_id);
    conn_fail(k, EMBPS_EPROTO, why);
    return EMBPS_FRAMER_STOP;
  }
  if (h->body_len > max) {
    char why[160];
    snprintf(why, sizeof why, "reply of kind %u announces %u bytes, more "
             "than its request can produce (%zu)", h->kind, h->body_len, max);
    conn_fail(k, EMBPS_EPROTO, why);
    return EMBPS_FRAMER_STOP;
  }
  k->cur = p;
  k->in_place = 0;
  if (p && p->t->op == OP_PULL &&
      h->kind == (EMBPS_KIND_PULL | EMBPS_KIND_REPLY) &&
      h->body_len == off + p->n * p->t->dim * sizeof(float)) {
    seg[1] = (embps_framer_seg_t){
        (uint8_t *)(p->t->urows + p->base * p->t->dim), h->body_len - off};
    k->in_place = 1;
    buffered = off;
  } else if (p && p->rdst && h->kind == (p->kind | EMBPS_KIND_REPLY) &&
             h->body_len > off && h->body_len - off <= p->rdst_cap) {
    seg[1] = (embps_framer_seg_t){p->rdst, h->body_len - off};
    k->in_place = 1; /* embps_client_request_'s destination */
    buffered = off;
  }
  if (buffered > k->body_cap) {
    free(k->body);
    k->body_cap = 0;
    k->body = malloc(buffered);
    if (!k->body) {
      conn_fail(k, -ENOMEM, "out of memory for a reply");
      return EMBPS_FRAMER_STOP;
    }
    k->body_cap = buffered;
  }
  seg[0] = (embps_framer_seg_t){k->body, buffered};
  return EMBPS_FRAMER_READ;
}

/* A whole reply is in (the framer's frame callback): hands it to its
 * part. Stops when the connection was failed. */
static int on_reply(void *owner, const embps_frame_header_t *h) {
  conn_t *k = owner;
  part_t *p = k->cur;
  int in_place = k->in_place;
  k->cur = NULL;
  k->in_place = 0;
  if (p) {
    /* A server replies once it has read the whole request. A reply that
     * comes earlier would let embps_wait() return while the queue still
     * points into the caller's buffers: treat it as the protocol error it
     * is. */
    for (const out_buf_t *o = k->out_head; o; o = o->next) {
      if (o->part == p && o->n_seg > 1) {
        conn_fail(k, EMBPS_EPROTO,
                  "server replied before reading the whole request");
        return EMBPS_FRAMER_STOP;
      }
    }
    embps_msg_t m;
    if (embps_msg_unpack(h->kind, k->body, h->meta_len, &m)) {
      char why[64];
      snprintf(why, sizeof why, "reply of kind %u does not decode", h->kind);
      conn_fail(k, EMBPS_EPROTO, why);
      return EMBPS_FRAMER_STOP;
    }
    const char *bad = reply_mismatch(p, &m, in_place, k->client->peer);
    if (!bad && m.kind == EMBPS_KIND_ERROR &&
        m.u.error.code == EMBPS_ENOREPLICAS && m.u.error.lsn &&
        p->kind == EMBPS_KIND_PUSH)
      p->applied = 1; /* applied there, at that LSN, not acknowledged */
    if (bad || (m.kind == EMBPS_KIND_ERROR &&
                (m.u.error.code == EMBPS_ESHUTDOWN ||
                 (m.u.error.code == EMBPS_ENOTPRIMARY &&
                  k->want == CONN_PRIMARY) ||
                 (m.u.error.code == EMBPS_ENOREPLICAS &&
                  (p->t->retry_until_ns > embps_now_ns() || p->applied))))) {
      /* a lying server is dropped; one going away is retried elsewhere,
       * as is a write it could not get enough followers for (the same
       * bytes: exactly once, whether it was applied or not), and one a
       * follower refused, at the member's primary ("Members"). A push
       * a server applied without enough followers, once its retry time is
       * over, is given up as on a connection failure: it stays owed there
       * (sent again first, the same bytes), never refused, so it is
       * neither lost from the caller's view nor pushed twice */
      char why[EMBPS_MESSAGE_MAX + 64];
      if (!bad)
        escape_server_text(m.u.error.message, sizeof m.u.error.message);
      snprintf(why, sizeof why, "%s", bad ? bad : m.u.error.message);
      embps_msg_free(&m);
      conn_fail(k, bad ? EMBPS_EPROTO : m.u.error.code, why);
      return EMBPS_FRAMER_STOP;
    }
    unlink_part(k, p);
    if (p->t->op == OP_OWED) { /* complete there, or refused */
      if (m.kind == EMBPS_KIND_ERROR) {
        escape_server_text(m.u.error.message, sizeof m.u.error.message);
        owed_lost(k, p, m.u.error.code, m.u.error.message);
      } else {
        owed_free(k, p, 1);
      }
      embps_msg_free(&m);
      return EMBPS_FRAMER_READ;
    }
    if (m.kind != EMBPS_KIND_ERROR)
      p->acked = 1;
    size_t off = embps_bulk_offset(h->meta_len);
    if (p->t->op == OP_SIMPLE && in_place) {
      p->rbulk_len = h->body_len - off; /* in p->rdst */
    } else if (p->t->op == OP_SIMPLE && h->body_len > off && !p->rbulk &&
               (p->rbulk = malloc(h->body_len - off)) != NULL) {
      memcpy(p->rbulk, k->body + off, h->body_len - off);
      p->rbulk_len = h->body_len - off;
    }
    deliver(k, p, &m);
    embps_part_done_(p);
  } else if (h->kind == EMBPS_KIND_ERROR && h->req_id == 0) {
    /* a connection-level refusal (e.g. --max-connections) */
    embps_msg_t m;
    char why[EMBPS_MESSAGE_MAX] = "connection refused by server";
    int code = EMBPS_ECONN;
    if (embps_msg_unpack(h->kind, k->body, h->meta_len, &m) == 0) {
      escape_server_text(m.u.error.message, sizeof m.u.error.message);
      snprintf(why, sizeof why, "%s", m.u.error.message);
      code = m.u.error.code;
    }
    conn_fail(k, code, why);
    return EMBPS_FRAMER_STOP;
  } /* else: a reply nobody waits for any more */
  return EMBPS_FRAMER_READ;
}

static const embps_framer_ops_t reply_ops = {on_reply_header, on_reply};

/* Reads whatever is available on k and delivers complete frames. Each
 * read goes where the framer says: a header, the connection's buffer or
 * a pull's rows. (The framer never stops while k is open: every stop
 * fails the connection first.) */
static void conn_read(conn_t *k) {
  for (;;) {
    uint8_t *dst;
    size_t want = embps_framer_want(&k->framer, &dst);
    ssize_t r = read(k->fd, dst, want);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        conn_fail(k, EMBPS_ECONN, strerror(errno));
      return;
    }
    if (r == 0) {
      conn_fail(k, EMBPS_ECONN, "server closed the connection");
      return;
    }
    if (embps_framer_advance(&k->framer, (size_t)r))
      return;
  }
}

/* One round of I/O on every connection; waits at most timeout_ms, and not
 * at all once ticket t (may be NULL) is complete. */
static int progress(embps_client_t *c, const embps_ticket_t *t,
                    int timeout_ms) {
  struct pollfd stack[16];
  struct pollfd *pfd =
      c->n_conns <= 16 ? stack : malloc(c->n_conns * sizeof *pfd);
  if (!pfd)
    return -ENOMEM;
  uint32_t nf = 0;
  for (uint32_t i = 0; i < c->n_conns; i++) {
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
  if (t && t->n_done == t->n_parts) /* e.g. a write failed */
    timeout_ms = 0;
  int n = poll(pfd, nf, timeout_ms); /* none: sleeps until a retry */
  if (n > 0) {
    for (uint32_t j = 0; j < nf; j++) {
      if (!pfd[j].revents)
        continue;
      conn_t *k = NULL;
      for (uint32_t i = 0; i < c->n_conns; i++)
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
  for (uint32_t i = 0; i < c->n_conns; i++) {
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
  for (uint32_t i = 0; i < c->n_conns; i++) {
    conn_t *k = &c->conns[i];
    while (conn_holds(k, t)) {
      part_t *p = k->pending_head;
      while (p->t != t)
        p = p->next;
      char why[sizeof k->down_why + 64];
      snprintf(why, sizeof why, "%s (gave up after retrying for %d ms)",
               k->down_why, c->retry_ms);
      part_t *q =
          part_give_up(k, p, k->down_code ? k->down_code : EMBPS_ECONN, why,
                       1);
      if (q)
        replace_part(k, p, q); /* the owed copy keeps p's place */
      else
        unlink_part(k, p);
    }
  }
}

/* Ends t's retries: its parts still pending anywhere fail with code (or
 * their connection's reason), so none stays linked once t is freed. */
void embps_ticket_cancel_(embps_client_t *c, embps_ticket_t *t, int code) {
  t->retry_until_ns = 0;
  ticket_abandon(c, t, code);
  ticket_expire(c, t);
}

/* Reconnects the broken connections that hold parts of t and whose
 * backoff is over; returns the earliest time another attempt is due
 * (UINT64_MAX: none). */
static uint64_t reconnect_due(embps_client_t *c, embps_ticket_t *t) {
  uint64_t next = UINT64_MAX;
  for (uint32_t i = 0; i < c->n_conns; i++) {
    conn_t *k = &c->conns[i];
    if (!conn_holds(k, t))
      continue;
    if (embps_now_ns() >= k->retry_at_ns)
      embps_client_connect_(c, i);
    if (conn_holds(k, t) && k->retry_at_ns < next)
      next = k->retry_at_ns;
  }
  return next;
}

static uint64_t member_probe(embps_client_t *c, const embps_ticket_t *t,
                             uint64_t now);

/* Runs I/O until t completes. Each attempt (from t's last send) may take
 * the client's timeout; while t may retry, a timed-out attempt or a broken
 * connection leads to another. After the retry time a broken connection
 * is final, but an attempt under way still gets its whole timeout. */
int embps_ticket_run_(embps_client_t *c, embps_ticket_t *t) {
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
        embps_ticket_fail_(t, EMBPS_ETIMEDOUT, "no reply within %d ms%s",
                           c->timeout_ms,
                           t->retry_until_ns ? " (retries over)" : "");
        embps_ticket_cancel_(c, t, EMBPS_ETIMEDOUT);
        break;
      }
      ticket_abandon(c, t, EMBPS_ETIMEDOUT); /* and try again */
      t->sent_ns = now;
      continue;
    }
    if (retrying) {
      uint64_t probe = member_probe(c, t, now);
      uint64_t due = reconnect_due(c, t);
      now = embps_now_ns();
      if (probe < due)
        due = probe;
      if (due < until)
        until = due > now ? due : now;
      if (t->retry_until_ns < until)
        until = t->retry_until_ns;
    }
    int ms = until > now ? (int)((until - now + 999999) / 1000000) : 0;
    int rc = progress(c, t, ms);
    if (rc) {
      embps_ticket_fail_(t, rc, "%s", embps_strerror(rc));
      embps_ticket_cancel_(c, t, rc);
      break;
    }
  }
  return t->result;
}

/* Lets t's parts be sent again after a connection failure, until the
 * client's retry time from now is over. */
void embps_ticket_allow_retry_(const embps_client_t *c, embps_ticket_t *t) {
  if (c->retry_ms >= 0)
    t->retry_until_ns = embps_now_ns() + (uint64_t)c->retry_ms * 1000000ULL;
}

/* Says hello on k, just connected as connection ki: sets k's frame limit
 * and the role of the server it reached, and *primary (EMBPS_ADDR_MAX
 * bytes, may be NULL) to the primary a follower names. A server of
 * another place in the cluster is EMBPS_EWRONGSERVER. */
static int hello(embps_client_t *c, conn_t *k, uint32_t ki, char *primary) {
  embps_ticket_t *t = embps_ticket_new_(OP_HELLO, 1);
  if (!t)
    return -ENOMEM;
  embps_msg_t m;
  embps_hello_msg_(c, &m);
  part_t *p = &t->parts[0];
  p->server = k->index;
  p->conn = ki;
  p->kind = m.kind;
  p->req_id = ++c->next_req_id;
  int rc = embps_frame_build(&m, p->req_id, 0, &p->frame, &p->frame_len, NULL);
  if (!rc) {
    conn_send(k, p);
    rc = embps_ticket_run_(c, t);
  }
  if (!rc) {
    const embps_hello_reply_t *r = &p->reply.u.hello_reply;
    k->max_frame = r->max_frame_bytes;
    k->role = r->role == EMBPS_ROLE_FOLLOWER ? EMBPS_ROLE_FOLLOWER
                                             : EMBPS_ROLE_PRIMARY;
    k->epoch = r->epoch;
    if (primary) {
      snprintf(primary, EMBPS_ADDR_MAX, "%s", r->primary);
      escape_server_text(primary, EMBPS_ADDR_MAX);
    }
    if (!c->peer &&
        (r->cluster_size != c->n || r->cluster_index != k->index)) {
      rc = EMBPS_EWRONGSERVER;
      snprintf(t->error, sizeof t->error, "%s is server %u of a cluster of "
               "%u, but the client lists it as server %u of %u", k->addr,
               r->cluster_index, r->cluster_size, k->index, c->n);
    }
  }
  if (rc)
    embps_client_error_(c, rc, "%s",
                        t->error[0] ? t->error : embps_strerror(rc));
  embps_ticket_free_(t);
  return rc;
}

/* One attempt at k's current server: connects and says hello. 0, or an
 * error with k's down_code and down_why set. */
static int conn_attempt(embps_client_t *c, conn_t *k, uint32_t ki,
                        char *primary) {
  char why[400];
  int rc = connect_fd(k, c->timeout_ms, why, sizeof why);
  if (rc) {
    k->down_code = rc;
    snprintf(k->down_why, sizeof k->down_why, "server %u (%s): %s", k->index,
             k->addr, why);
    return rc;
  }
  embps_framer_init(&k->framer, &reply_ops, k, MAX_REPLY_BYTES);
  rc = hello(c, k, ki, primary);
  if (rc && k->fd >= 0)
    conn_fail(k, rc, "hello failed");
  if (rc) {
    k->down_code = rc;
    snprintf(k->down_why, sizeof k->down_why, "%s", c->last_error);
  }
  return rc;
}

/* ------------------------------------------------------------ members
 *
 * A member listed with several servers (servers.c) is reached through
 * connections that each want a role: its primary connection takes the
 * first server whose hello says primary, its read connection (reads from
 * followers) the first whose hello says follower, else the primary. One
 * connection attempt tries the member's servers in turn from the one it
 * is at, at most once each (and once more for a primary a follower names:
 * it is tried next, listed or not, as hello still checks its place in the
 * cluster; if it cannot be reached, by a name only the servers resolve,
 * the attempt goes on with the server listed after the one that named
 * it); when none will do, the attempt fails like a connection that
 * cannot be made, with every server's reason (EMBPS_ENOTPRIMARY when any
 * server answered: the member is between primaries), and is made again
 * after the backoff while the requests waiting on it may retry. A write a
 * server refuses with EMBPS_ENOTPRIMARY (it became a follower after the
 * hello) drops the connection the same way, keeping the write for the
 * member's primary: a follower refuses a write before doing anything.
 *
 * A primary that stops answering without closing its connections (frozen
 * by SIGSTOP or a stalled VM, cut off) is replaced by an election after
 * its lease, but a request already sent to it would wait for it to wake
 * (and refuse: it is fenced) or for the client's timeout. So while a
 * request that may retry has waited PROBE_AFTER_MS on a member's primary
 * connection, whole, the member's other servers are asked (a one-off
 * hello, dial.c); one that is primary of a later epoch than the server
 * the connection reached means that server was replaced: the connection
 * is dropped, moved to the new primary, and its requests are sent there
 * again (the same bytes: a push the old primary applied either reached
 * the new one, which answers it as a duplicate, or is cut from the old
 * one when it rejoins). */

/* Points k at server a of its member. */
static void conn_move(conn_t *k, uint32_t a) {
  const embps_server_addr_t *x = &k->m->alt[a];
  k->alt = a;
  snprintf(k->host, sizeof k->host, "%s", x->host);
  k->port = x->port;
  snprintf(k->addr, sizeof k->addr, "%s", x->addr);
}

/* The index in m of the server at addr (a primary some follower named),
 * put in m's spare slot when m does not list it; UINT32_MAX when addr is
 * no HOST:PORT. */
static uint32_t member_learn(member_t *m, const char *addr) {
  for (uint32_t i = 0; i < m->n_alt; i++)
    if (strcmp(m->alt[i].addr, addr) == 0)
      return i;
  embps_server_addr_t *x = &m->alt[m->n_listed];
  if (strlen(addr) >= sizeof x->addr ||
      embps_parse_hostport(addr, x->host, sizeof x->host, &x->port))
    return UINT32_MAX;
  snprintf(x->addr, sizeof x->addr, "%s", addr);
  m->n_alt = m->n_listed + 1;
  return m->n_listed;
}

/* Closes k after a hello from a server of the wrong role: what waits on
 * k stays for the member's next server. */
static void conn_close_quiet(conn_t *k) {
  close(k->fd);
  k->fd = -1;
  for (out_buf_t *o = k->out_head, *next; o; o = next) {
    next = o->next;
    free(o);
  }
  k->out_head = k->out_tail = NULL;
  free(k->body);
  k->body = NULL;
  k->body_cap = 0;
  k->cur = NULL;
  k->in_place = 0;
}

/* Appends "; <what>" to the reasons in buf (cut to fit). */
static void reason_add(char *buf, size_t cap, const char *what) {
  size_t used = strlen(buf);
  if (used + 3 >= cap)
    return;
  if (used) {
    memcpy(buf + used, "; ", 3);
    used += 2;
  }
  size_t n = strlen(what);
  if (n > cap - used - 1)
    n = cap - used - 1;
  memcpy(buf + used, what, n);
  buf[used + n] = 0;
}

/* One attempt at connection ki of a member listing several servers (see
 * above). 0, or an error with k's down_code and down_why set. */
static int member_connect(embps_client_t *c, conn_t *k, uint32_t ki) {
  member_t *m = k->m;
  const int want_follower = k->want == CONN_FOLLOWER;
  const conn_t *primary_conn = &c->conns[k->index];
  if (want_follower && k->alt == primary_conn->alt &&
      primary_conn->fd >= 0 && primary_conn->role == EMBPS_ROLE_PRIMARY)
    conn_move(k, (k->alt + 1) % m->n_alt); /* not the primary first */
  char reasons[sizeof k->down_why] = "";
  int rc = EMBPS_ECONN, last = EMBPS_ECONN;
  uint32_t fallback = UINT32_MAX; /* a primary, for reads */
  uint32_t resume = UINT32_MAX; /* where to go on if a named primary fails */
  for (uint32_t i = 0; i <= m->n_alt; i++) {
    char named[EMBPS_ADDR_MAX] = "";
    rc = conn_attempt(c, k, ki, named);
    if (!rc && (k->role == EMBPS_ROLE_FOLLOWER) == want_follower)
      return 0;
    uint32_t next = (k->alt + 1) % m->n_alt;
    char what[EMBPS_ADDR_MAX + 400];
    if (rc) {
      snprintf(what, sizeof what, "%.600s", k->down_why);
      if (last != EMBPS_ENOTPRIMARY) /* a server answered: an election */
        last = rc;
      if (resume != UINT32_MAX) { /* a primary named by an address this */
        next = resume;            /* client cannot reach: the next listed */
        resume = UINT32_MAX;
      }
    } else if (want_follower) {
      conn_close_quiet(k);
      fallback = k->alt;
      snprintf(what, sizeof what, "%s is the primary", k->addr);
    } else {
      conn_close_quiet(k);
      snprintf(what, sizeof what, "%s follows %s", k->addr,
               named[0] ? named : "(no primary named)");
      uint32_t a = named[0] ? member_learn(m, named) : UINT32_MAX;
      if (a != UINT32_MAX && a != k->alt) {
        if (resume == UINT32_MAX)
          resume = next;
        next = a;
      }
      last = EMBPS_ENOTPRIMARY;
    }
    reason_add(reasons, sizeof reasons, what);
    conn_move(k, next);
  }
  if (fallback != UINT32_MAX) { /* no follower answered: the primary */
    conn_move(k, fallback);
    char named[EMBPS_ADDR_MAX];
    if ((rc = conn_attempt(c, k, ki, named)) == 0)
      return 0;
    reason_add(reasons, sizeof reasons, k->down_why);
    last = rc;
  }
  k->down_code = last;
  snprintf(k->down_why, sizeof k->down_why, "server %u: no %s among its "
           "servers: %s", k->index, want_follower ? "server" : "primary",
           reasons);
  return last;
}

/* Whether parts of t wait on k: 0 none, 1 some still being sent, 2 all
 * sent, waiting for their replies. */
static int conn_awaits(const conn_t *k, const embps_ticket_t *t) {
  int state = 0;
  for (const part_t *p = k->pending_head; p; p = p->next)
    if (p->t == t) {
      if (!p->written)
        return 1;
      state = 2;
    }
  return state;
}

/* The replaced-primary check above, for every member's primary connection
 * t has waited on for PROBE_AFTER_MS; returns when it is next due
 * (UINT64_MAX: not while t waits as it does now). */
static uint64_t member_probe(embps_client_t *c, const embps_ticket_t *t,
                             uint64_t now) {
  uint64_t next = UINT64_MAX;
  for (uint32_t i = 0; i < c->n_conns; i++) {
    conn_t *k = &c->conns[i];
    const int awaits = k->want == CONN_PRIMARY && k->fd >= 0 &&
                               k->m->n_alt > 1
                           ? conn_awaits(k, t)
                           : 0;
    if (!awaits)
      continue;
    uint64_t due = t->sent_ns + PROBE_AFTER_MS * 1000000ULL;
    if (k->probe_at_ns > due)
      due = k->probe_at_ns;
    if (now < due || awaits == 1) { /* a frame still going out: later */
      due = now < due ? due : now + PROBE_EVERY_MS * 1000000ULL;
      next = due < next ? due : next;
      continue;
    }
    k->probe_at_ns = now + PROBE_EVERY_MS * 1000000ULL;
    next = k->probe_at_ns < next ? k->probe_at_ns : next;
    for (uint32_t a = 0; a < k->m->n_alt; a++) {
      const embps_server_addr_t *x = &k->m->alt[a];
      embps_hello_reply_t r;
      if (a == k->alt ||
          embps_dial_hello_(c, x->host, x->port, PROBE_TIMEOUT_MS, &r) ||
          r.role == EMBPS_ROLE_FOLLOWER || r.epoch <= k->epoch)
        continue;
      char why[sizeof x->addr + 160];
      snprintf(why, sizeof why, "replaced: %s is primary of epoch %u (this "
               "server's was %u); requests sent there again", x->addr,
               r.epoch, k->epoch);
      conn_fail(k, EMBPS_ENOTPRIMARY, why);
      conn_move(k, a);
      next = k->retry_at_ns < next ? k->retry_at_ns : next;
      break;
    }
  }
  return next;
}

/* Makes sure connection ki is connected (reconnecting after a failure);
 * a new connection first sends again, in their order, the requests still
 * pending from the broken one. A failure schedules the next attempt. */
int embps_client_connect_(embps_client_t *c, uint32_t ki) {
  conn_t *k = &c->conns[ki];
  if (k->fd >= 0)
    return 0;
  int rc = k->want == CONN_ANY ? conn_attempt(c, k, ki, NULL)
                               : member_connect(c, k, ki);
  if (rc) {
    const int cap = k->want == CONN_ANY ? BACKOFF_MAX_MS : BACKOFF_MEMBER_MAX_MS;
    k->backoff_ms = k->backoff_ms < BACKOFF_MIN_MS ? BACKOFF_MIN_MS
                    : 2 * k->backoff_ms > cap    ? cap
                                                 : 2 * k->backoff_ms;
    k->retry_at_ns = embps_now_ns() + (uint64_t)k->backoff_ms * 1000000ULL;
    return embps_client_error_(c, rc, "%s", k->down_why);
  }
  k->backoff_ms = 0;
  for (part_t *p = k->pending_head; p; p = p->next) {
    if (out_queue(k, p)) {
      embps_conn_drop_(k, -ENOMEM, "out of memory", 0);
      return embps_client_error_(c, -ENOMEM, "out of memory");
    }
  }
  return 0;
}

/* ------------------------------------------------------------ owed */

/* Whether owed copy q is in k's write queue (its frame being sent). */
static int owed_queued(const conn_t *k, const part_t *q) {
  for (const out_buf_t *o = k->out_head; o; o = o->next)
    if (o->part == q)
      return 1;
  return 0;
}

enum { APPLIED, OWED, NOT_APPLIED };

/* Where push part p stands: applied there (acknowledged, or its owed copy
 * completed), owed there, or not applied (refused, or never sent). */
static int part_state(const part_t *p) {
  if (p->acked || p->owed_done == 1)
    return APPLIED;
  return p->orphan ? OWED : NOT_APPLIED;
}

/* "server 0 (H:P), server 2 (H:P)" for t's parts in state `state`, into
 * buf: at most 4 by name, then how many more. */
static void name_parts(const embps_client_t *c, const embps_ticket_t *t,
                       int state, char *buf, size_t len) {
  size_t used = 0;
  uint32_t named = 0, more = 0;
  buf[0] = 0;
  for (uint32_t i = 0; i < t->n_parts; i++) {
    const part_t *p = &t->parts[i];
    if (part_state(p) != state)
      continue;
    if (named == 4) {
      more++;
      continue;
    }
    int w = snprintf(buf + used, len - used, "%sserver %u (%.64s)",
                     named++ ? ", " : "", p->server, c->conns[p->conn].addr);
    if (w > 0 && (size_t)w < len - used)
      used += (size_t)w;
  }
  if (more && used < len)
    snprintf(buf + used, len - used, " and %u more", more);
}

int embps_push_outcome_(embps_client_t *c, embps_ticket_t *t, int rc) {
  if (!rc)
    return 0;
  uint32_t n[3] = {0, 0, 0};
  int maybe = 0; /* an owed copy the server may have acted on */
  for (uint32_t i = 0; i < t->n_parts; i++) {
    const part_t *p = &t->parts[i];
    n[part_state(p)]++;
    if (p->orphan && (p->orphan->written ||
                      owed_queued(&c->conns[p->conn], p->orphan)))
      maybe = 1;
  }
  if (!n[OWED] && !n[NOT_APPLIED])
    return 0; /* its owed copies completed meanwhile: applied everywhere */
  if (n[OWED] && !n[APPLIED] && !maybe) { /* no server can have it */
    for (uint32_t i = 0; i < t->n_parts; i++) {
      part_t *q = t->parts[i].orphan;
      if (q) {
        conn_t *k = &c->conns[q->conn];
        unlink_part(k, q);
        owed_free(k, q, 0);
      }
    }
    n[NOT_APPLIED] += n[OWED];
    n[OWED] = 0;
  }
  /* EMBPS_ENOREPLICAS: the server's message says whether it applied it */
  if (!n[APPLIED] && !n[OWED])
    return code_retryable(rc) && rc != EMBPS_ENOREPLICAS
               ? embps_client_error_(c, rc, "%s; no server applied push seq "
                                     "%llu (pushing it again applies it "
                                     "once)", t->error,
                                     (unsigned long long)t->seq)
               : embps_client_error_(c, rc, "%s", t->error);
  char applied[240], owed[240], refused[240];
  name_parts(c, t, APPLIED, applied, sizeof applied);
  name_parts(c, t, OWED, owed, sizeof owed);
  name_parts(c, t, NOT_APPLIED, refused, sizeof refused);
  char tail[512] = "";
  if (n[OWED])
    snprintf(tail, sizeof tail, "; owed to %s: the client sends it there "
             "again under the same sequence, exactly once, before anything "
             "else it sends there (or at embps_push_resume()): do not push "
             "it again", owed);
  int unreplicated = 0; /* a server applied it, too few followers had it */
  for (uint32_t i = 0; i < t->n_parts; i++)
    unreplicated |= t->parts[i].applied && part_state(&t->parts[i]) == OWED;
  if (!n[APPLIED])
    return embps_client_error_(c, rc, "push seq %llu %s: %.200s%s",
                               (unsigned long long)t->seq,
                               unreplicated
                                   ? "was applied but not acknowledged by "
                                     "enough followers in time"
                                   : "may have been applied (sent whole, "
                                     "not acknowledged)",
                               t->error, tail);
  return embps_client_error_(c, EMBPS_EPARTIAL, "push seq %llu applied on "
                             "%s%s%s only: %.200s%s",
                             (unsigned long long)t->seq, applied,
                             n[NOT_APPLIED] ? ", not on " : "",
                             n[NOT_APPLIED] ? refused : "", t->error, tail);
}

/* The oldest time an owed copy on connected k was sent, or UINT64_MAX. */
static uint64_t owed_sent_ns(const conn_t *k) {
  uint64_t t = UINT64_MAX;
  for (const part_t *p = k->pending_head; p; p = p->next)
    if (p->t->op == OP_OWED && p->t->sent_ns < t)
      t = p->t->sent_ns;
  return t;
}

int embps_push_resume(embps_client_t *c) {
  const uint64_t attempt_ns = (uint64_t)c->timeout_ms * 1000000ULL;
  const uint64_t give_up =
      embps_now_ns() +
      (c->retry_ms > 0 ? (uint64_t)c->retry_ms * 1000000ULL : 0);
  for (int first = 1; c->n_owed; first = 0) {
    uint64_t now = embps_now_ns(), wake = UINT64_MAX;
    for (uint32_t i = 0; i < c->n_conns; i++) {
      conn_t *k = &c->conns[i];
      if (!k->n_owed)
        continue;
      if (k->fd < 0 && (first || (now < give_up && now >= k->retry_at_ns)))
        embps_client_connect_(c, i); /* sends the owed copies first */
      if (k->fd >= 0) {
        uint64_t until = owed_sent_ns(k) + attempt_ns;
        if (now >= until)
          conn_fail(k, EMBPS_ETIMEDOUT, "no reply in time; connection "
                    "dropped");
        else if (until < wake)
          wake = until;
      }
      if (k->fd < 0 && now < give_up) {
        uint64_t at = k->retry_at_ns > now ? k->retry_at_ns : now;
        if (at < wake)
          wake = at;
      }
    }
    if (wake == UINT64_MAX)
      break; /* every owed server down, and the retry time over */
    int ms = wake > now ? (int)((wake - now + 999999) / 1000000) : 0;
    int rc = progress(c, NULL, ms);
    if (rc)
      return embps_client_error_(c, rc, "%s", embps_strerror(rc));
  }
  if (c->n_owed) {
    const part_t *q = &c->owed_head->parts[0];
    const conn_t *k = &c->conns[q->conn];
    return embps_client_error_(c, k->down_code ? k->down_code : EMBPS_ECONN,
                               "%u push(es) still owed; the oldest, seq "
                               "%llu, to %.400s: each is sent again before "
                               "anything else the client sends to its "
                               "server, or at the next embps_push_resume()",
                               c->n_owed, (unsigned long long)q->t->seq,
                               k->down_why);
  }
  if (c->owed_lost_code) {
    c->owed_lost_code = 0;
    return embps_client_error_(c, EMBPS_EPARTIAL, "%s", c->owed_lost);
  }
  return 0;
}

size_t embps_push_owed(const embps_client_t *c) { return c ? c->n_owed : 0; }

/* Refuses a frame larger than server s accepts, before sending it. */
int embps_client_frame_fits_(embps_client_t *c, uint32_t s,
                             size_t frame_len) {
  const conn_t *k = &c->conns[s];
  size_t body = frame_len - EMBPS_FRAME_HEADER_LEN;
  if (!k->max_frame || body <= k->max_frame)
    return 0;
  return embps_client_error_(c, EMBPS_EFRAMESIZE, "server %u (%s): frame of "
                             "%zu bytes exceeds --max-frame-bytes %llu; split "
                             "the request", k->index, k->addr, body,
                             (unsigned long long)k->max_frame);
}

/* Sends part p, its frame built, to member s (on its read connection for
 * a read when c reads from followers): now when connected (or it
 * connects), later when the connection is down and p's ticket may retry;
 * otherwise p fails. */
void embps_part_submit_(embps_client_t *c, uint32_t s, part_t *p) {
  const uint32_t ki = embps_client_conn_for_(c, s, p->t);
  conn_t *k = &c->conns[ki];
  int rc = 0;
  int waiting = k->fd < 0 && k->pending_head && p->t->retry_until_ns &&
                embps_now_ns() < k->retry_at_ns;
  p->server = s;
  p->conn = ki;
  if (k->fd < 0 && !waiting)
    rc = embps_client_connect_(c, ki);
  if (k->fd >= 0) {
    conn_send(k, p);
  } else if (p->t->retry_until_ns &&
             code_retryable(rc ? rc : k->down_code)) {
    pending_append(k, p);
  } else {
    part_t *q = part_give_up(k, p, rc ? rc : k->down_code, c->last_error, 1);
    if (q)
      pending_append(k, q);
  }
}

/* Builds the frame for message m (no bulk) into p and sends it to server
 * s. Returns 0 (a failure to send is p's ticket's) or the build error. */
int embps_part_send_msg_(embps_client_t *c, uint32_t s, part_t *p,
                         const embps_msg_t *m) {
  p->server = s;
  p->kind = m->kind;
  p->req_id = ++c->next_req_id;
  int rc = embps_frame_build(m, p->req_id, 0, &p->frame, &p->frame_len, NULL);
  if (rc)
    return embps_client_error_(c, rc, "%s", embps_strerror(rc));
  rc = embps_client_frame_fits_(c, s, p->frame_len);
  if (rc)
    return rc;
  embps_part_submit_(c, s, p);
  return 0;
}

/* ------------------------------------------------- a request of any kind */

int embps_client_request_(embps_client_t *c, uint32_t server,
                          const embps_msg_t *m, uint8_t *dst, size_t dst_cap,
                          embps_ticket_t **out) {
  *out = NULL;
  if (server >= c->n)
    return embps_client_error_(c, EMBPS_EINVAL, "server %u of a cluster of "
                               "%u", server, c->n);
  embps_ticket_t *t = embps_ticket_new_(OP_SIMPLE, 1);
  if (!t)
    return embps_client_error_(c, -ENOMEM, "out of memory");
  t->parts[0].rdst = dst;
  t->parts[0].rdst_cap = dst ? dst_cap : 0;
  /* no reply larger than its meta and the room the caller gave */
  t->parts[0].max_reply = SMALL_REPLY_MAX + t->parts[0].rdst_cap;
  int rc = embps_part_send_msg_(c, server, &t->parts[0], m);
  if (rc) {
    embps_ticket_free_(t);
    return rc;
  }
  *out = t;
  return 0;
}

int embps_client_reply_(embps_client_t *c, embps_ticket_t *t,
                        embps_msg_t *reply, size_t *bulk_len) {
  memset(reply, 0, sizeof *reply);
  *bulk_len = 0;
  int rc = embps_ticket_run_(c, t);
  part_t *p = &t->parts[0];
  if (!rc && (!p->has_reply || p->rbulk))
    rc = embps_client_error_(c, EMBPS_EPROTO, "server %u (%s): a reply of "
                             "%zu bulk bytes where at most %zu were asked "
                             "for", p->server, c->conns[p->conn].addr,
                             p->rbulk_len, p->rdst_cap);
  else if (rc)
    embps_client_error_(c, rc, "%s",
                        t->error[0] ? t->error : embps_strerror(rc));
  if (!rc) {
    *reply = p->reply;
    p->has_reply = 0;
    *bulk_len = p->rbulk_len;
  }
  embps_ticket_free_(t);
  return rc;
}
