/* fuzz_dispatch.c - libFuzzer target: whole request sequences dispatched
 * against an in-process server core (registry, apply thread, synchronous
 * steps, body pool; no sockets), one fresh core per input.
 *
 * The input is a program. Its first byte configures the server (cluster of
 * 1 or 2, shards, a memory cap, a token); then each op byte names a
 * connection (4 of them) and a request: hello, create, drop, describe,
 * list, stats, pull, push (asynchronous or to a synchronous table), scan
 * and write rows (export and import), evict, a raw frame of any kind, or
 * closing the connection. Tables may have admission and eviction policies
 * (dynamic ones) and a step to wait for (synchronous ones). Fields come
 * from the following bytes, mostly near valid values so that requests get
 * deep.
 *
 * Invariants: every reply is a well-formed frame with the request's id,
 * whose kind is the request's reply kind or ERROR and whose meta decodes;
 * counts match the request (pull rows and dims, bulk bytes, push rows);
 * create, drop, describe, list and stats agree with a model of the table
 * set (evict too); a refused connection is closed; every deferred push is
 * completed exactly once (creates and drops, run on the apply thread,
 * before the next request), with a reply unless it was a synchronous push held for
 * its step that a later push with the same table, client id, sequence
 * and step took the place of (a retry: sync.c completes the held one
 * without a reply, so that its connection is closed, not answered twice;
 * each push takes the place of one at most); after teardown no table
 * bytes remain (and ASan's leak check finds nothing). */
#include <math.h>
#include <pthread.h>

#include "apply.h"
#include "fuzz.h"
#include "server.h"

#define N_CONNS 4
#define N_NAMES 4
#define OPS_MAX 96
#define IDS_MAX 48
#define TOKEN "fuzz-token"

typedef struct {
  int open, authed;
} vconn_t;

typedef struct {
  embps_server_t srv;
  embps_scratch_t scratch;
  pthread_mutex_t mu;
  pthread_cond_t cv;     /* signalled on every completion */
  embps_request_t *done; /* completed deferred requests */
  size_t deferred, completed, dispatched;
  vconn_t conns[N_CONNS];
  int exists[N_NAMES]; /* model: which of t0..t3 exist */
  uint32_t dims[N_NAMES];
  size_t n_tables; /* model: tables in the registry (fuzzed names too) */
  uint32_t next_id;
  /* deferred pushes in dispatch order, and which took a held one's place */
  embps_request_t *pushes[OPS_MAX];
  unsigned char took_place[OPS_MAX];
  size_t n_pushes;
} core_t;

/* req->complete: called on the apply thread. */
static void on_complete(embps_request_t *req) {
  core_t *k = req->owner;
  pthread_mutex_lock(&k->mu);
  req->next = k->done;
  k->done = req;
  k->completed++;
  pthread_cond_signal(&k->cv);
  pthread_mutex_unlock(&k->mu);
}

static void core_init(core_t *k, fuzz_in_t *in) {
  memset(k, 0, sizeof *k);
  char err[256];
  char *argv[] = {"embps-server", NULL};
  FUZZ_CHECK(embps_server_config_parse(&k->srv.cfg, 1, argv, err,
                                       sizeof err) == 0);
  uint8_t b = fuzz_u8(in);
  embps_server_config_t *cfg = &k->srv.cfg;
  cfg->cluster_size = 1 + (b & 1);
  cfg->shards = 1 + ((b >> 1) & 3);
  cfg->max_memory = (b & 8) ? 64u << 10 : 0;
  cfg->max_frame_bytes = 1u << 20;
  cfg->max_tables = 6;
  if (b & 16) {
    cfg->has_token = 1;
    cfg->token_len = strlen(TOKEN);
    memcpy(cfg->token, TOKEN, cfg->token_len);
  }
  k->srv.start_ns = embps_now_ns();
  embps_registry_init(&k->srv.registry);
  embps_bufpool_init(&k->srv.bodies, EMBPS_MMAP_THRESHOLD,
                     EMBPS_BODY_POOL_BYTES);
  embps_table_scratch_init(&k->scratch.table);
  embps_dedup_init(&k->scratch.dedup);
  pthread_mutex_init(&k->mu, NULL);
  pthread_cond_init(&k->cv, NULL);
  FUZZ_CHECK(embps_apply_start(&k->srv, &k->srv.apply) == 0);
}

/* A request carrying frame bytes: header, then body_len bytes. */
static embps_request_t *request_from_frame(core_t *k, const uint8_t *frame) {
  embps_frame_header_t h;
  FUZZ_CHECK(embps_frame_header_decode(frame, UINT32_MAX, &h) == 0);
  embps_request_t *req = calloc(1, sizeof *req);
  FUZZ_CHECK(req);
  req->hdr = h;
  req->bodies = &k->srv.bodies;
  req->body = embps_bufpool_take(req->bodies, h.body_len, &req->body_cap);
  FUZZ_CHECK(req->body);
  memcpy(req->body, frame + EMBPS_FRAME_HEADER_LEN, h.body_len);
  req->complete = on_complete;
  req->owner = k;
  return req;
}

static embps_request_t *request_build(core_t *k, const embps_msg_t *m,
                                      const void *bulk, size_t bulk_len) {
  uint8_t *frame;
  size_t len, off;
  FUZZ_CHECK(embps_frame_build(m, ++k->next_id, bulk_len, &frame, &len,
                               &off) == 0);
  if (bulk_len)
    memcpy(frame + off, bulk, bulk_len);
  embps_request_t *req = request_from_frame(k, frame);
  free(frame);
  return req;
}

/* ------------------------------------------------------------ checks */

static int model_index(const char *name) {
  if (name[0] == 't' && name[1] >= '0' && name[1] < '0' + N_NAMES &&
      !name[2])
    return name[1] - '0';
  return -1;
}

/* Checks req's reply against the request and the model; updates the model
 * for creates and drops. */
static void check_reply(core_t *k, const embps_request_t *req) {
  FUZZ_CHECK(req->reply && req->reply_len >= EMBPS_FRAME_HEADER_LEN);
  embps_frame_header_t h;
  FUZZ_CHECK(embps_frame_header_decode(req->reply, UINT32_MAX, &h) == 0);
  FUZZ_CHECK(EMBPS_FRAME_HEADER_LEN + (size_t)h.body_len == req->reply_len);
  FUZZ_CHECK(h.req_id == req->hdr.req_id);
  FUZZ_CHECK(h.kind == EMBPS_KIND_ERROR ||
             h.kind == (req->hdr.kind | EMBPS_KIND_REPLY));
  FUZZ_CHECK(embps_bulk_offset(h.meta_len) <= h.body_len);
  size_t bulk_len = h.body_len - embps_bulk_offset(h.meta_len);
  embps_msg_t r;
  FUZZ_CHECK(embps_msg_unpack(h.kind, req->reply + EMBPS_FRAME_HEADER_LEN,
                              h.meta_len, &r) == 0);
  const embps_msg_t *q = &req->msg;
  int ti = -1;
  if (h.kind == EMBPS_KIND_ERROR) {
    FUZZ_CHECK(r.u.error.code < 0 && r.u.error.message[0]);
    FUZZ_CHECK(bulk_len == 0);
    int code = r.u.error.code;
    if (q->kind == EMBPS_KIND_CREATE && code == EMBPS_EEXIST &&
        (ti = model_index(q->u.spec.name)) >= 0)
      FUZZ_CHECK(k->exists[ti]);
    if ((q->kind == EMBPS_KIND_DROP || q->kind == EMBPS_KIND_EVICT) &&
        (ti = model_index(q->u.name)) >= 0)
      FUZZ_CHECK(code != EMBPS_ENOTABLE || !k->exists[ti]);
    embps_msg_free(&r);
    return;
  }
  switch (req->hdr.kind) {
  case EMBPS_KIND_CREATE:
    FUZZ_CHECK(bulk_len == 0);
    ti = model_index(q->u.spec.name);
    if (ti >= 0) {
      FUZZ_CHECK(!k->exists[ti]);
      k->exists[ti] = 1;
      k->dims[ti] = q->u.spec.dim;
    }
    k->n_tables++;
    FUZZ_CHECK(k->n_tables <= k->srv.cfg.max_tables);
    break;
  case EMBPS_KIND_DROP:
    FUZZ_CHECK(bulk_len == 0);
    ti = model_index(q->u.name);
    if (ti >= 0) {
      FUZZ_CHECK(k->exists[ti]);
      k->exists[ti] = 0;
    }
    FUZZ_CHECK(k->n_tables > 0);
    k->n_tables--;
    break;
  case EMBPS_KIND_ALTER:
    FUZZ_CHECK(bulk_len == 0);
    FUZZ_CHECK(strcmp(r.u.info.spec.name, q->u.alter.name) == 0);
    ti = model_index(q->u.alter.name);
    FUZZ_CHECK(ti < 0 || (k->exists[ti] && r.u.info.spec.dim == k->dims[ti]));
    FUZZ_CHECK(!(q->u.alter.set.set & EMBPS_ALTER_LR) ||
               r.u.info.spec.lr == q->u.alter.set.lr);
    break;
  case EMBPS_KIND_EVICT:
    FUZZ_CHECK(bulk_len == 0);
    ti = model_index(q->u.name);
    FUZZ_CHECK(ti < 0 || k->exists[ti]);
    break;
  case EMBPS_KIND_DESCRIBE:
    FUZZ_CHECK(strcmp(r.u.info.spec.name, q->u.name) == 0);
    ti = model_index(q->u.name);
    FUZZ_CHECK(ti < 0 || (k->exists[ti] && r.u.info.spec.dim == k->dims[ti]));
    break;
  case EMBPS_KIND_LIST:
    FUZZ_CHECK(r.u.list.n == k->n_tables);
    for (size_t i = 1; i < r.u.list.n; i++)
      FUZZ_CHECK(strcmp(r.u.list.v[i - 1].spec.name,
                        r.u.list.v[i].spec.name) < 0);
    for (size_t i = 0; i < r.u.list.n; i++)
      if ((ti = model_index(r.u.list.v[i].spec.name)) >= 0)
        FUZZ_CHECK(k->exists[ti]);
    break;
  case EMBPS_KIND_STATS:
    FUZZ_CHECK(r.u.stats.n_tables == k->n_tables);
    FUZZ_CHECK(r.u.stats.requests <= k->dispatched);
    break;
  case EMBPS_KIND_PULL:
    FUZZ_CHECK(r.u.pull_reply.n_rows == q->u.pull.n_ids);
    FUZZ_CHECK(r.u.pull_reply.dim == q->u.pull.dim);
    FUZZ_CHECK(bulk_len ==
               (size_t)q->u.pull.n_ids * q->u.pull.dim * sizeof(float));
    break;
  case EMBPS_KIND_PUSH:
    FUZZ_CHECK(r.u.push_reply.applied);
    FUZZ_CHECK(r.u.push_reply.n_unique <= q->u.push.n);
    FUZZ_CHECK(r.u.push_reply.duplicate || q->u.push.n == 0 ||
               r.u.push_reply.n_unique > 0);
    FUZZ_CHECK(bulk_len == 0);
    break;
  case EMBPS_KIND_SCAN: {
    const embps_scan_reply_t *sr = &r.u.scan_reply;
    ti = model_index(q->u.scan.table);
    FUZZ_CHECK(ti < 0 || (k->exists[ti] && sr->dim == k->dims[ti]));
    FUZZ_CHECK(!q->u.scan.max_rows || sr->n_rows <= q->u.scan.max_rows);
    FUZZ_CHECK(sr->state_floats <= 2 &&
               (q->u.scan.with_state || !sr->state_floats));
    FUZZ_CHECK(bulk_len == (size_t)sr->n_rows *
                               (8 + 4 * (size_t)sr->dim *
                                        (1 + sr->state_floats)));
    break;
  }
  case EMBPS_KIND_WRITE_ROWS:
    FUZZ_CHECK(bulk_len == 0);
    ti = model_index(q->u.write_rows.table);
    FUZZ_CHECK(ti < 0 || (k->exists[ti] &&
                          q->u.write_rows.dim == k->dims[ti]));
    break;
  case EMBPS_KIND_HELLO:
    FUZZ_CHECK(r.u.hello_reply.version == EMBPS_PROTOCOL_VERSION);
    FUZZ_CHECK(r.u.hello_reply.max_frame_bytes ==
               k->srv.cfg.max_frame_bytes);
    break;
  default:
    FUZZ_CHECK(!"a reply to a kind that is not a request");
  }
  embps_msg_free(&r);
}

/* req, a deferred push completed without a reply, was held for a
 * synchronous step until a later push took its place: the first such push
 * with its table, client id, nonzero sequence and step that took no other
 * one's place. */
static void check_replaced(core_t *k, const embps_request_t *req) {
  FUZZ_CHECK(req->hdr.kind == EMBPS_KIND_PUSH && !req->reply_len);
  size_t i = 0;
  while (i < k->n_pushes && k->pushes[i] != req)
    i++;
  FUZZ_CHECK(i < k->n_pushes);
  const embps_push_t *p = &req->msg.u.push;
  FUZZ_CHECK(p->seq != 0);
  for (size_t j = i + 1; j < k->n_pushes; j++) {
    const embps_push_t *q = &k->pushes[j]->msg.u.push;
    if (!k->took_place[j] && q->client_id == p->client_id &&
        q->seq == p->seq && q->step == p->step &&
        !strcmp(q->table, p->table)) {
      k->took_place[j] = 1;
      return;
    }
  }
  FUZZ_CHECK(!"a push completed without a reply that no later push replaced");
}

/* ------------------------------------------------------------ running */

/* Waits until the apply thread completed req and takes it off k->done (a
 * connection runs nothing after a CREATE or DROP until its reply). */
static void wait_done(core_t *k, embps_request_t *req) {
  pthread_mutex_lock(&k->mu);
  for (;;) {
    embps_request_t **p = &k->done;
    while (*p && *p != req)
      p = &(*p)->next;
    if (*p) {
      *p = req->next;
      break;
    }
    pthread_cond_wait(&k->cv, &k->mu);
  }
  pthread_mutex_unlock(&k->mu);
}

static void run(core_t *k, int ci, embps_request_t *req) {
  vconn_t *c = &k->conns[ci];
  if (!c->open) {
    c->open = 1;
    c->authed = 0;
  }
  int was_authed = c->authed;
  k->dispatched++;
  embps_dispatch_t d = embps_dispatch(&k->srv, req, &c->authed, &k->scratch);
  switch (d) {
  case EMBPS_DISPATCH_DEFERRED:
    FUZZ_CHECK(was_authed && (req->hdr.kind == EMBPS_KIND_PUSH ||
                              req->hdr.kind == EMBPS_KIND_CREATE ||
                              req->hdr.kind == EMBPS_KIND_DROP ||
                              req->hdr.kind == EMBPS_KIND_ALTER ||
                              req->hdr.kind == EMBPS_KIND_EVICT ||
                              req->hdr.kind == EMBPS_KIND_WRITE_ROWS));
    k->deferred++; /* req belongs to the apply thread now */
    if (req->hdr.kind == EMBPS_KIND_PUSH) {
      FUZZ_CHECK(k->n_pushes < OPS_MAX);
      k->pushes[k->n_pushes++] = req;
      return;
    }
    wait_done(k, req);
    check_reply(k, req);
    break;
  case EMBPS_DISPATCH_CLOSE:
    check_reply(k, req);
    c->open = 0;
    c->authed = 0;
    break;
  case EMBPS_DISPATCH_REPLY:
    check_reply(k, req);
    FUZZ_CHECK(c->authed);
    break;
  }
  embps_request_free(req);
}

static void take_name(fuzz_in_t *in, char *name, size_t cap) {
  uint8_t b = fuzz_u8(in);
  if (b < 0xf0) {
    snprintf(name, cap, "t%u", b % N_NAMES);
    return;
  }
  size_t len = fuzz_u8(in) % cap; /* any bytes: bad names, empty names */
  fuzz_take(in, name, len);
  name[len] = 0;
}

static float take_value(fuzz_in_t *in) {
  uint8_t b = fuzz_u8(in);
  switch (b) {
  case 0xfc:
    return NAN;
  case 0xfd:
    return INFINITY;
  case 0xfe:
    return -1e30f;
  case 0xff: {
    float f;
    fuzz_take(in, &f, sizeof f);
    return f;
  }
  default:
    return (float)(int8_t)b / 16.0f;
  }
}

static int64_t take_id(fuzz_in_t *in) {
  uint8_t b = fuzz_u8(in);
  if (b == 0xff)
    return (int64_t)fuzz_u64(in);
  if (b >= 0xf0)
    return -(int64_t)(b - 0xef);
  return (int64_t)b * 3;
}

static void op_hello(core_t *k, int ci, fuzz_in_t *in) {
  uint8_t f = fuzz_u8(in);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_HELLO;
  m.u.hello.version = (f & 1) ? fuzz_u32(in) : EMBPS_PROTOCOL_VERSION;
  if (f & 2) {
    m.u.hello.token_len = fuzz_u8(in) % 40;
    fuzz_take(in, m.u.hello.token, m.u.hello.token_len);
  } else {
    m.u.hello.token_len = strlen(TOKEN);
    memcpy(m.u.hello.token, TOKEN, m.u.hello.token_len);
  }
  run(k, ci, request_build(k, &m, NULL, 0));
}

static void op_create(core_t *k, int ci, fuzz_in_t *in) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_CREATE;
  embps_table_spec_t *s = &m.u.spec;
  uint8_t f = fuzz_u8(in);
  embps_table_spec_init(s, NULL, 1 + fuzz_u8(in) % 8,
                        (embps_optimizer_t)(f % 5));
  take_name(in, s->name, sizeof s->name);
  if (f & 8) {
    s->dynamic = 1;
  } else {
    s->rows = fuzz_u16(in) % 600; /* 0: refused */
  }
  uint8_t g = fuzz_u8(in);
  s->sync_workers = (g & 3) == 3 ? 1 + (g >> 2) % 3 : 0;
  s->dtype = (embps_dtype_t)((g >> 4) % 4); /* 3: refused */
  s->init = (embps_init_t)((g >> 6) % 4);
  s->init_value = 0.05;
  if (f & 16)
    s->lr = take_value(in);
  if (f & 32) {
    s->has_padding = 1;
    s->padding_id = take_id(in);
  }
  if (f & 64) { /* admission and eviction: refused unless dynamic */
    uint8_t h = fuzz_u8(in);
    s->admit_after = h & 3;
    s->admit_sketch_bytes = 1024;
    s->ttl_steps = (h >> 2) & 3;
    s->max_rows = 8 * (uint64_t)((h >> 4) & 3);
    s->evict = (h >> 6) & 1;
    s->evict_l2_below = h & 0x80 ? 0.5 : 0;
  }
  s->seed = f;
  run(k, ci, request_build(k, &m, NULL, 0));
}

static void op_name(core_t *k, int ci, fuzz_in_t *in, uint16_t kind) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = kind;
  take_name(in, m.u.name, sizeof m.u.name);
  if (!m.u.name[0]) /* the packer needs a name; raw ops cover empty ones */
    m.u.name[0] = 'x';
  run(k, ci, request_build(k, &m, NULL, 0));
}

static void op_empty(core_t *k, int ci, uint16_t kind) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = kind;
  run(k, ci, request_build(k, &m, NULL, 0));
}

/* The dim a request uses: usually its table's. */
static uint32_t take_dim(core_t *k, fuzz_in_t *in, const char *name) {
  uint8_t b = fuzz_u8(in);
  int ti = model_index(name);
  if (b < 0xe0 && ti >= 0 && k->dims[ti])
    return k->dims[ti];
  return b % 9;
}

/* The bytes of a bulk made `skew` 8-byte words longer or shorter. */
static size_t skewed(size_t len, uint8_t skew) {
  if (skew == 1)
    return len + 8;
  if (skew == 2 && len >= 8)
    return len - 8;
  return len;
}

static void op_pull(core_t *k, int ci, fuzz_in_t *in) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_PULL;
  take_name(in, m.u.pull.table, sizeof m.u.pull.table);
  if (!m.u.pull.table[0])
    m.u.pull.table[0] = 'x';
  m.u.pull.dim = take_dim(k, in, m.u.pull.table);
  uint8_t f = fuzz_u8(in);
  m.u.pull.n_ids = f % (IDS_MAX + 1);
  int64_t ids[IDS_MAX + 1] = {0}; /* one spare for a skewed bulk */
  for (uint32_t i = 0; i < m.u.pull.n_ids; i++)
    ids[i] = take_id(in);
  size_t len = skewed(m.u.pull.n_ids * sizeof *ids, fuzz_u8(in) % 8);
  run(k, ci, request_build(k, &m, ids, len));
}

static void op_push(core_t *k, int ci, fuzz_in_t *in) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_PUSH;
  embps_push_t *p = &m.u.push;
  take_name(in, p->table, sizeof p->table);
  if (!p->table[0])
    p->table[0] = 'x';
  p->dim = take_dim(k, in, p->table);
  uint8_t f = fuzz_u8(in);
  p->n = f % (IDS_MAX + 1);
  uint8_t g = fuzz_u8(in);
  p->client_id = (g & 3) == 3 ? fuzz_u64(in) : (g & 1 ? 0 : 1 + (uint64_t)ci);
  p->seq = (g >> 2) & 3;
  p->step = (g >> 4) & 3;
  if (g & 0x40)
    p->dense_rows = fuzz_u16(in);
  size_t dim = p->dim ? p->dim : 1;
  size_t len = p->n * (sizeof(int64_t) + dim * sizeof(float));
  uint8_t *bulk = calloc(1, len + 8);
  FUZZ_CHECK(bulk);
  int64_t *idx = (int64_t *)bulk;
  float *vals = (float *)(bulk + p->n * sizeof *idx);
  for (uint32_t i = 0; i < p->n; i++)
    idx[i] = take_id(in);
  /* a few values from the input, the rest a pattern: inputs stay short */
  for (size_t i = 0; i < p->n * p->dim; i++)
    vals[i] = i < 16 ? take_value(in) : (float)(i % 7) / 8.0f;
  len = p->n * (sizeof(int64_t) + p->dim * sizeof(float));
  run(k, ci, request_build(k, &m, bulk, skewed(len, (g >> 7) + (f >> 7))));
  free(bulk);
}

/* Export: a chunk of rows from a cursor (usually the start). */
static void op_scan(core_t *k, int ci, fuzz_in_t *in) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_SCAN;
  take_name(in, m.u.scan.table, sizeof m.u.scan.table);
  if (!m.u.scan.table[0])
    m.u.scan.table[0] = 'x';
  uint8_t f = fuzz_u8(in);
  m.u.scan.with_state = f & 1;
  m.u.scan.max_rows = (f >> 1) & 7;
  if (f & 0x10)
    m.u.scan.cursor = fuzz_u64(in);
  else if (f & 0x20)
    m.u.scan.cursor = (uint64_t)fuzz_u8(in) << 48 | fuzz_u8(in);
  run(k, ci, request_build(k, &m, NULL, 0));
}

/* Import: rows and maybe state, mostly well-formed. */
static void op_write_rows(core_t *k, int ci, fuzz_in_t *in) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_WRITE_ROWS;
  embps_write_rows_t *w = &m.u.write_rows;
  take_name(in, w->table, sizeof w->table);
  if (!w->table[0])
    w->table[0] = 'x';
  w->dim = take_dim(k, in, w->table);
  uint8_t f = fuzz_u8(in), g = fuzz_u8(in);
  w->n = f % (IDS_MAX + 1);
  w->state_floats = g & 3;
  w->has_step = (g >> 2) & 1;
  w->step = (g >> 3) & 7;
  size_t per_row = (size_t)(w->dim ? w->dim : 1) * (1 + w->state_floats);
  size_t len = w->n * (sizeof(int64_t) + per_row * sizeof(float));
  uint8_t *bulk = calloc(1, len + 8);
  FUZZ_CHECK(bulk);
  int64_t *idx = (int64_t *)bulk;
  float *vals = (float *)(bulk + w->n * sizeof *idx);
  for (uint32_t i = 0; i < w->n; i++)
    idx[i] = take_id(in);
  for (size_t i = 0; i < w->n * w->dim * (1 + w->state_floats); i++)
    vals[i] = i < 16 ? take_value(in) : (float)(i % 5) / 4.0f;
  len = w->n * (sizeof(int64_t) +
                (size_t)w->dim * (1 + w->state_floats) * sizeof(float));
  run(k, ci, request_build(k, &m, bulk, skewed(len, f >> 6)));
  free(bulk);
}

/* A frame of any kind with raw meta and bulk bytes. */
static void op_raw(core_t *k, int ci, fuzz_in_t *in) {
  uint16_t kind = fuzz_u16(in);
  size_t meta_len = fuzz_u8(in);
  size_t bulk_len = 8 * (size_t)(fuzz_u8(in) % 16);
  size_t off = embps_bulk_offset(meta_len);
  uint8_t *frame = calloc(1, EMBPS_FRAME_HEADER_LEN + off + bulk_len);
  FUZZ_CHECK(frame);
  embps_frame_header_t h = {.body_len = (uint32_t)(off + bulk_len),
                            .meta_len = (uint32_t)meta_len,
                            .req_id = ++k->next_id,
                            .kind = kind};
  embps_frame_header_encode(&h, frame);
  fuzz_take(in, frame + EMBPS_FRAME_HEADER_LEN, meta_len);
  fuzz_take(in, frame + EMBPS_FRAME_HEADER_LEN + off, bulk_len);
  /* A raw create could ask for a dense table of 2^40 rows, which the
   * server allocates (issue 9, item 7): keep raw creates small. */
  embps_msg_t m;
  if (kind == EMBPS_KIND_CREATE &&
      embps_msg_unpack(kind, frame + EMBPS_FRAME_HEADER_LEN, meta_len,
                       &m) == 0 &&
      (m.u.spec.rows > 4096 || m.u.spec.dim > 64)) {
    free(frame);
    return;
  }
  run(k, ci, request_from_frame(k, frame));
  free(frame);
}

static void core_teardown(core_t *k) {
  embps_apply_drain(k->srv.apply);
  embps_apply_stop(k->srv.apply);
  FUZZ_CHECK(k->completed == k->deferred);
  /* every push checked before any is freed: check_replaced reads later
   * ones */
  for (embps_request_t *req = k->done; req; req = req->next) {
    if (req->reply)
      check_reply(k, req);
    else
      check_replaced(k, req);
  }
  while (k->done) {
    embps_request_t *req = k->done;
    k->done = req->next;
    req->next = NULL;
    embps_request_free(req);
  }
  FUZZ_CHECK(atomic_load(&k->srv.counters.requests) == k->dispatched);
  embps_registry_close(&k->srv.registry);
  embps_bufpool_close(&k->srv.bodies);
  embps_table_scratch_close(&k->scratch.table);
  embps_dedup_close(&k->scratch.dedup);
  pthread_mutex_destroy(&k->mu);
  pthread_cond_destroy(&k->cv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int quiet;
  if (!quiet) {
    embps_log_set_level(EMBPS_LOG_ERROR);
    quiet = 1;
  }
  fuzz_in_t in = {data, size};
  uint64_t bytes_before = embps_tables_total_bytes();
  core_t *k = calloc(1, sizeof *k);
  FUZZ_CHECK(k);
  core_init(k, &in);
  for (int op = 0; op < OPS_MAX && in.n; op++) {
    uint8_t b = fuzz_u8(&in);
    int ci = b >> 6;
    switch (b & 15) {
    case 0:
      op_hello(k, ci, &in);
      break;
    case 1:
      op_create(k, ci, &in);
      break;
    case 2:
      op_name(k, ci, &in, EMBPS_KIND_DROP);
      break;
    case 3:
      op_name(k, ci, &in, EMBPS_KIND_DESCRIBE);
      break;
    case 4:
      op_empty(k, ci, EMBPS_KIND_LIST);
      break;
    case 5:
      op_empty(k, ci, EMBPS_KIND_STATS);
      break;
    case 6:
    case 7:
      op_pull(k, ci, &in);
      break;
    case 8:
    case 9:
    case 10:
      op_push(k, ci, &in);
      break;
    case 11:
      op_raw(k, ci, &in);
      break;
    case 12:
      k->conns[ci].open = 0; /* the peer hangs up; a new one takes the slot */
      break;
    case 13:
      op_scan(k, ci, &in);
      break;
    case 14:
      op_write_rows(k, ci, &in);
      break;
    default:
      op_name(k, ci, &in, EMBPS_KIND_EVICT);
    }
  }
  core_teardown(k);
  free(k);
  FUZZ_CHECK(embps_tables_total_bytes() == bytes_before);
  return 0;
}
