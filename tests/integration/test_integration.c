/* test_integration.c - integration tests: real embps-server processes on
 * 127.0.0.1 port 0 (started by harness.c), driven over the wire through
 * libembps and, for what the library never sends, raw frames written by hand
 * with common/frame.h and common/wire.h.
 *
 * Every test starts its own server(s) in its setup and stops them in its
 * teardown with SIGTERM, which must end each server with exit status 0.
 * Expected tables are computed here by a small reference model (duplicates
 * summed in order of first appearance, then one optimizer step per push);
 * gradients are small multiples of 1/64, so every sum is exact in float and
 * SGD results must match bit for bit. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "embps/embps.h"
#include "frame.h"
#include "harness.h"
#include "wire.h"

#define TIMEOUT_MS 15000
#define MAX_SRV 4

/* ================================================================ fixture */

typedef struct {
  it_server_t srv[MAX_SRV];
  embps_client_t *c;
  char token_file[128];
} fx_t;

static const char *const default_args[] = {"--io-threads", "2", "--shards",
                                           "4", NULL};

static void start_server(fx_t *f, int slot, const char *const *args) {
  if (it_server_start(&f->srv[slot], args ? args : default_args))
    fail_msg("cannot start embps-server (slot %d)", slot);
}

static embps_client_t *try_connect(const char *servers, const char *token,
                                   int *rc_out, char *err, size_t err_len) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = servers;
  o.token = token;
  o.timeout_ms = TIMEOUT_MS;
  embps_client_t *c = NULL;
  *rc_out = embps_client_create(&o, &c, err, err_len);
  return c;
}

static embps_client_t *connect_ok(const char *servers, const char *token) {
  char err[512];
  int rc;
  embps_client_t *c = try_connect(servers, token, &rc, err, sizeof err);
  if (rc || !c)
    fail_msg("connect to %s: %s (%s)", servers, err, embps_err_name(rc));
  return c;
}

static int setup_with(void **state, const char *const *args, int connect) {
  fx_t *f = calloc(1, sizeof *f);
  if (!f)
    return -1;
  *state = f;
  if (it_server_start(&f->srv[0], args))
    return -1;
  if (connect) {
    char err[512];
    int rc;
    f->c = try_connect(f->srv[0].addr, NULL, &rc, err, sizeof err);
    if (rc) {
      fprintf(stderr, "connect: %s\n", err);
      return -1;
    }
  }
  return 0;
}

static int setup_one(void **state) { return setup_with(state, default_args, 1); }

static int setup_small_frames(void **state) {
  static const char *const args[] = {"--max-frame-bytes", "4096", NULL};
  return setup_with(state, args, 1);
}

static int setup_auth(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  if (!f)
    return -1;
  *state = f;
  snprintf(f->token_file, sizeof f->token_file, "/tmp/embps-it-token-XXXXXX");
  int fd = mkstemp(f->token_file);
  if (fd < 0)
    return -1;
  static const char tok[] = "s3cret-Token_42\n";
  if (write(fd, tok, sizeof tok - 1) != (ssize_t)(sizeof tok - 1)) {
    close(fd);
    return -1;
  }
  close(fd);
  const char *args[] = {"--auth-token-file", f->token_file, NULL};
  return it_server_start(&f->srv[0], args) ? -1 : 0;
}

static int setup_two(void **state) {
  fx_t *f = calloc(1, sizeof *f);
  if (!f)
    return -1;
  *state = f;
  static const char *const a0[] = {"--cluster-size", "2", "--cluster-index",
                                   "0", "--shards", "3", NULL};
  static const char *const a1[] = {"--cluster-size", "2", "--cluster-index",
                                   "1", "--shards", "5", NULL};
  if (it_server_start(&f->srv[0], a0) || it_server_start(&f->srv[1], a1))
    return -1;
  char servers[80], err[512];
  snprintf(servers, sizeof servers, "%s,%s", f->srv[0].addr, f->srv[1].addr);
  int rc;
  f->c = try_connect(servers, NULL, &rc, err, sizeof err);
  if (rc) {
    fprintf(stderr, "connect: %s\n", err);
    return -1;
  }
  return 0;
}

/* Stops every server still running; each must exit 0 on SIGTERM. */
static int teardown(void **state) {
  fx_t *f = *state;
  if (!f)
    return 0;
  embps_client_destroy(f->c);
  int bad = 0;
  for (int i = 0; i < MAX_SRV; i++) {
    if (!f->srv[i].pid)
      continue;
    char addr[32];
    snprintf(addr, sizeof addr, "%s", f->srv[i].addr);
    int st = it_server_stop(&f->srv[i]);
    if (st != 0) {
      fprintf(stderr, "embps-server %s: exit status %d after SIGTERM, "
              "expected 0\n", addr, st);
      bad = 1;
    }
  }
  if (f->token_file[0])
    unlink(f->token_file);
  free(f);
  return bad ? -1 : 0;
}

/* ================================================================ helpers */

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* A gradient value: a multiple of 1/64 in [-4, 4], never 0. */
static float grad_value(uint64_t h) {
  int k = (int)(h % 512) - 256;
  return (float)(k ? k : 1) / 64.0f;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  assert_non_null(p);
  return p;
}

#define assert_rc(expr, c)                                                     \
  do {                                                                         \
    int rc_ = (expr);                                                          \
    if (rc_ != 0)                                                              \
      fail_msg("%s failed: %s (%d): %s", #expr, embps_err_name(rc_), rc_,      \
               embps_client_last_error(c));                                    \
  } while (0)

/* The call must fail with `code` and a message containing `substr`. */
#define assert_err(expr, c, code, substr)                                      \
  do {                                                                         \
    int rc_ = (expr);                                                          \
    const char *msg_ = embps_client_last_error(c);                             \
    if (rc_ != (code))                                                         \
      fail_msg("%s: got %s (%d), want %s; message: %s", #expr,                 \
               embps_err_name(rc_), rc_, embps_err_name(code), msg_);          \
    if (!strstr(msg_, (substr)))                                               \
      fail_msg("%s: message \"%s\" does not name the problem (\"%s\")",       \
               #expr, msg_, (substr));                                         \
  } while (0)

static embps_table_spec_t spec_of(const char *name, uint32_t dim,
                                  uint64_t rows, embps_optimizer_t opt,
                                  double lr, embps_init_t init, double init_v,
                                  uint64_t seed) {
  embps_table_spec_t s;
  embps_table_spec_init(&s, name, dim, opt);
  if (rows)
    s.rows = rows;
  else
    s.dynamic = 1;
  s.lr = lr;
  s.init = init;
  s.init_value = init_v;
  s.seed = seed;
  return s;
}

static void create(embps_client_t *c, const embps_table_spec_t *s) {
  assert_rc(embps_create_table(c, s), c);
}

static float *pull_ids(embps_client_t *c, const char *table, const int64_t *ids,
                       size_t n, uint32_t dim) {
  float *out = xmalloc(n * dim * sizeof *out);
  assert_rc(embps_pull(c, table, ids, n, out, dim), c);
  return out;
}

static float *pull_all(embps_client_t *c, const char *table, uint64_t rows,
                       uint32_t dim) {
  int64_t *ids = xmalloc(rows * sizeof *ids);
  for (uint64_t i = 0; i < rows; i++)
    ids[i] = (int64_t)i;
  float *out = pull_ids(c, table, ids, rows, dim);
  free(ids);
  return out;
}

static uint64_t rows_allocated(embps_client_t *c, const char *table) {
  embps_table_info_t info;
  assert_rc(embps_describe_table(c, table, &info), c);
  return info.rows_allocated;
}

/* Compares n floats; tol 0 means bit-for-bit. */
static void assert_floats(const float *got, const float *want, size_t n,
                          double rel_tol, const char *what) {
  for (size_t i = 0; i < n; i++) {
    int same = rel_tol == 0 ? memcmp(&got[i], &want[i], sizeof(float)) == 0
                            : fabs((double)got[i] - (double)want[i]) <=
                                  rel_tol * fmax(1.0, fabs((double)want[i]));
    if (!same)
      fail_msg("%s: element %zu is %.9g, expected %.9g", what, i,
               (double)got[i], (double)want[i]);
  }
}

/* ================================================================ reference */

typedef struct {
  uint32_t dim;
  embps_optimizer_t opt;
  float lr, eps, acc0;
  int has_padding;
  int64_t padding_id;
  size_t n, cap;
  int64_t *ids;
  float *w, *acc;
  unsigned char *touched;
} ref_t;

static void ref_init(ref_t *r, const embps_table_spec_t *s) {
  memset(r, 0, sizeof *r);
  r->dim = s->dim;
  r->opt = s->optimizer;
  r->lr = (float)s->lr;
  r->eps = (float)s->eps;
  r->acc0 = (float)s->initial_accumulator;
  r->has_padding = s->has_padding;
  r->padding_id = s->padding_id;
  assert_true(r->opt == EMBPS_OPT_SGD || r->opt == EMBPS_OPT_ADAGRAD);
}

static void ref_free(ref_t *r) {
  free(r->ids);
  free(r->w);
  free(r->acc);
  free(r->touched);
  memset(r, 0, sizeof *r);
}

static size_t ref_find(const ref_t *r, int64_t id) {
  for (size_t i = 0; i < r->n; i++)
    if (r->ids[i] == id)
      return i;
  return r->n;
}

/* Learns the current rows of ids not yet known (e.g. initial rows). */
static void ref_learn(ref_t *r, const int64_t *ids, size_t n,
                      const float *rows) {
  for (size_t i = 0; i < n; i++) {
    if (ref_find(r, ids[i]) < r->n)
      continue;
    if (r->n == r->cap) {
      r->cap = r->cap ? 2 * r->cap : 64;
      r->ids = realloc(r->ids, r->cap * sizeof *r->ids);
      r->w = realloc(r->w, r->cap * r->dim * sizeof *r->w);
      r->acc = realloc(r->acc, r->cap * r->dim * sizeof *r->acc);
      r->touched = realloc(r->touched, r->cap);
      assert_true(r->ids && r->w && r->acc && r->touched);
    }
    r->ids[r->n] = ids[i];
    memcpy(r->w + r->n * r->dim, rows + i * r->dim, r->dim * sizeof(float));
    for (uint32_t j = 0; j < r->dim; j++)
      r->acc[r->n * r->dim + j] = r->acc0;
    r->touched[r->n] = 0;
    r->n++;
  }
}

static void ref_learn_from(ref_t *r, embps_client_t *c, const char *table,
                           const int64_t *ids, size_t n) {
  float *rows = pull_ids(c, table, ids, n, r->dim);
  ref_learn(r, ids, n, rows);
  free(rows);
}

/* Duplicates summed in order of first appearance, then one step. */
static void ref_push(ref_t *r, const int64_t *idx, size_t n,
                     const float *vals) {
  uint32_t dim = r->dim;
  int64_t *u = xmalloc(n * sizeof *u);
  float *g = xmalloc(n * dim * sizeof *g);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    size_t s = 0;
    while (s < k && u[s] != idx[i])
      s++;
    if (s == k) {
      u[k++] = idx[i];
      memcpy(g + s * dim, vals + i * dim, dim * sizeof *g);
    } else {
      for (uint32_t j = 0; j < dim; j++)
        g[s * dim + j] += vals[i * dim + j];
    }
  }
  for (size_t s = 0; s < k; s++) {
    if (r->has_padding && u[s] == r->padding_id)
      continue;
    size_t at = ref_find(r, u[s]);
    if (at == r->n)
      fail_msg("reference: row %lld was never learnt", (long long)u[s]);
    float *w = r->w + at * dim, *acc = r->acc + at * dim;
    const float *gr = g + s * dim;
    r->touched[at] = 1;
    for (uint32_t j = 0; j < dim; j++) {
      if (r->opt == EMBPS_OPT_SGD) {
        w[j] -= r->lr * gr[j];
      } else {
        float a = acc[j] + gr[j] * gr[j];
        acc[j] = a;
        w[j] -= r->lr * gr[j] / (sqrtf(a) + r->eps);
      }
    }
  }
  free(u);
  free(g);
}

/* The rows a pull of ids should return. */
static void ref_expect(const ref_t *r, const int64_t *ids, size_t n,
                       float *out) {
  for (size_t i = 0; i < n; i++) {
    if (r->has_padding && ids[i] == r->padding_id) {
      memset(out + i * r->dim, 0, r->dim * sizeof(float));
      continue;
    }
    size_t at = ref_find(r, ids[i]);
    if (at == r->n)
      fail_msg("reference: row %lld unknown", (long long)ids[i]);
    memcpy(out + i * r->dim, r->w + at * r->dim, r->dim * sizeof(float));
  }
}

static size_t ref_touched(const ref_t *r) {
  size_t k = 0;
  for (size_t i = 0; i < r->n; i++)
    k += r->touched[i];
  return k;
}

/* Pulls ids and compares with the reference. */
static void check_rows(embps_client_t *c, const char *table, const ref_t *r,
                       const int64_t *ids, size_t n, double tol,
                       const char *what) {
  float *got = pull_ids(c, table, ids, n, r->dim);
  float *want = xmalloc(n * r->dim * sizeof *want);
  ref_expect(r, ids, n, want);
  assert_floats(got, want, n * r->dim, tol, what);
  free(got);
  free(want);
}

static void check_dense(embps_client_t *c, const char *table, const ref_t *r,
                        uint64_t rows, double tol, const char *what) {
  int64_t *ids = xmalloc(rows * sizeof *ids);
  for (uint64_t i = 0; i < rows; i++)
    ids[i] = (int64_t)i;
  check_rows(c, table, r, ids, rows, tol, what);
  free(ids);
}

/* ================================================================ raw wire */

static int raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
    fail_msg("raw connect to port %d: %s", port, strerror(errno));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static void raw_send(int fd, uint16_t kind, embps_msg_t *m, uint32_t req_id,
                     const void *bulk, size_t bulk_len) {
  uint8_t *frame;
  size_t len, off;
  m->kind = kind;
  assert_int_equal(embps_frame_build(m, req_id, bulk_len, &frame, &len, &off),
                   0);
  if (bulk_len)
    memcpy(frame + off, bulk, bulk_len);
  int rc = it_send_full(fd, frame, len);
  free(frame);
  if (rc)
    fail_msg("raw send of kind %u: %s", kind, strerror(errno));
}

/* 0: n bytes read; 1: EOF or reset; -1: timeout. */
static int raw_read(int fd, void *p, size_t n, int timeout_ms) {
  return it_recv_full(fd, p, n, timeout_ms);
}

typedef struct {
  embps_frame_header_t h;
  uint8_t *body;
  embps_msg_t m;
  int has_msg;
} raw_reply_t;

static void raw_recv(int fd, raw_reply_t *r) {
  memset(r, 0, sizeof *r);
  uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
  int rc = raw_read(fd, hdr, sizeof hdr, 5000);
  if (rc)
    fail_msg("raw reply: %s", rc > 0 ? "connection closed" : "timed out");
  assert_int_equal(embps_frame_header_decode(hdr, 1u << 30, &r->h), 0);
  r->body = xmalloc(r->h.body_len);
  if (raw_read(fd, r->body, r->h.body_len, 5000))
    fail_msg("raw reply body of %u bytes not received", r->h.body_len);
  if (embps_msg_unpack(r->h.kind, r->body, r->h.meta_len, &r->m))
    fail_msg("raw reply of kind %u does not decode", r->h.kind);
  r->has_msg = 1;
}

static void raw_reply_free(raw_reply_t *r) {
  if (r->has_msg)
    embps_msg_free(&r->m);
  free(r->body);
  memset(r, 0, sizeof *r);
}

/* Expects an error frame with `code` (req_id checked unless UINT32_MAX). */
static void raw_expect_error(int fd, uint32_t req_id, int code,
                             const char *substr) {
  raw_reply_t r;
  raw_recv(fd, &r);
  if (r.h.kind != EMBPS_KIND_ERROR)
    fail_msg("expected an error frame (%s), got kind 0x%x",
             embps_err_name(code), r.h.kind);
  if (r.m.u.error.code != code)
    fail_msg("expected %s, got %s: %s", embps_err_name(code),
             embps_err_name(r.m.u.error.code), r.m.u.error.message);
  if (!strstr(r.m.u.error.message, substr))
    fail_msg("error message \"%s\" does not name the problem (\"%s\")",
             r.m.u.error.message, substr);
  if (req_id != UINT32_MAX)
    assert_int_equal(r.h.req_id, req_id);
  raw_reply_free(&r);
}

/* 1 if the server closes the connection within timeout_ms (whatever it
 * sends first is discarded). */
static int raw_closed(int fd, int timeout_ms) {
  double deadline = it_now_ms() + timeout_ms;
  uint8_t buf[4096];
  for (;;) {
    int left = (int)(deadline - it_now_ms());
    if (left <= 0)
      return 0;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, left) <= 0)
      continue;
    ssize_t r = recv(fd, buf, sizeof buf, 0);
    if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN))
      return 1;
  }
}

static void raw_hello(int fd, const char *token, uint32_t req_id) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.u.hello.version = EMBPS_PROTOCOL_VERSION;
  if (token) {
    m.u.hello.token_len = strlen(token);
    memcpy(m.u.hello.token, token, m.u.hello.token_len);
  }
  raw_send(fd, EMBPS_KIND_HELLO, &m, req_id, NULL, 0);
  raw_reply_t r;
  raw_recv(fd, &r);
  if (r.h.kind != (EMBPS_KIND_HELLO | EMBPS_KIND_REPLY))
    fail_msg("hello refused: %s",
             r.h.kind == EMBPS_KIND_ERROR ? r.m.u.error.message : "?");
  assert_int_equal(r.h.req_id, req_id);
  assert_int_equal(r.m.u.hello_reply.version, EMBPS_PROTOCOL_VERSION);
  raw_reply_free(&r);
}

static void raw_push(int fd, uint32_t req_id, const char *table, uint32_t n,
                     uint32_t dim, const void *bulk, size_t bulk_len) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  snprintf(m.u.push.table, sizeof m.u.push.table, "%s", table);
  m.u.push.n = n;
  m.u.push.dim = dim;
  raw_send(fd, EMBPS_KIND_PUSH, &m, req_id, bulk, bulk_len);
}

static void raw_pull(int fd, uint32_t req_id, const char *table,
                     uint32_t n_ids, uint32_t dim, const int64_t *ids,
                     size_t n_sent) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  snprintf(m.u.pull.table, sizeof m.u.pull.table, "%s", table);
  m.u.pull.n_ids = n_ids;
  m.u.pull.dim = dim;
  raw_send(fd, EMBPS_KIND_PULL, &m, req_id, ids, n_sent * sizeof *ids);
}

/* A raw pull that must succeed; checks rows against the reference. */
static void raw_pull_check(int fd, uint32_t req_id, const char *table,
                           const ref_t *ref, const int64_t *ids, size_t n) {
  raw_pull(fd, req_id, table, (uint32_t)n, ref->dim, ids, n);
  raw_reply_t r;
  raw_recv(fd, &r);
  if (r.h.kind != (EMBPS_KIND_PULL | EMBPS_KIND_REPLY))
    fail_msg("raw pull refused: %s",
             r.h.kind == EMBPS_KIND_ERROR ? r.m.u.error.message : "?");
  assert_int_equal(r.h.req_id, req_id);
  assert_int_equal(r.m.u.pull_reply.n_rows, n);
  size_t off = embps_bulk_offset(r.h.meta_len);
  assert_int_equal(r.h.body_len - off, n * ref->dim * sizeof(float));
  float *want = xmalloc(n * ref->dim * sizeof *want);
  ref_expect(ref, ids, n, want);
  assert_memory_equal(r.body + off, want, n * ref->dim * sizeof(float));
  free(want);
  raw_reply_free(&r);
}

/* ================================================================ exact values */

/* Three identical tables get the same gradients three ways: with duplicates
 * (merged by the server), with EMBPS_PUSH_MERGE (merged by the client) and
 * pre-merged by the test. All three must be identical, and equal to the
 * reference. */
static void exact_duplicates(fx_t *f, embps_optimizer_t opt, double lr,
                             double tol) {
  const uint32_t dim = 8;
  const uint64_t rows = 64;
  const char *names[3] = {"dup", "merged", "premerged"};
  embps_table_spec_t s[3];
  for (int t = 0; t < 3; t++) {
    s[t] = spec_of(names[t], dim, rows, opt, lr, EMBPS_INIT_UNIFORM, 0.5, 99);
    if (opt == EMBPS_OPT_ADAGRAD)
      s[t].initial_accumulator = 0.1;
    create(f->c, &s[t]);
  }
  ref_t ref;
  ref_init(&ref, &s[0]);
  float *init0 = pull_all(f->c, "dup", rows, dim);
  for (int t = 1; t < 3; t++) {
    float *x = pull_all(f->c, names[t], rows, dim);
    assert_memory_equal(x, init0, rows * dim * sizeof(float));
    free(x);
  }
  int64_t *all = xmalloc(rows * sizeof *all);
  for (uint64_t i = 0; i < rows; i++)
    all[i] = (int64_t)i;
  ref_learn(&ref, all, rows, init0);
  assert_int_equal(rows_allocated(f->c, "dup"), 0);

  enum { N = 48 };
  int64_t idx[N], midx[N];
  float vals[N * 8], mvals[N * 8];
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < N; i++) {
      uint64_t h = mix((uint64_t)(round * 1000 + i));
      idx[i] = (int64_t)(h % 20); /* 48 draws over 20 rows: many repeats */
      if (i % 7 == 3)
        idx[i] = 5; /* row 5 appears many times */
      for (uint32_t j = 0; j < dim; j++)
        vals[i * dim + j] = grad_value(mix(h + j));
    }
    idx[N - 1] = 63; /* and a row that appears once */
    /* pre-merged by hand */
    size_t k = 0;
    for (int i = 0; i < N; i++) {
      size_t at = 0;
      while (at < k && midx[at] != idx[i])
        at++;
      if (at == k) {
        midx[k++] = idx[i];
        memcpy(mvals + at * dim, vals + i * dim, dim * sizeof(float));
      } else {
        for (uint32_t j = 0; j < dim; j++)
          mvals[at * dim + j] += vals[i * dim + j];
      }
    }
    assert_true(k < N);
    assert_rc(embps_push(f->c, "dup", idx, N, vals, dim, 0), f->c);
    assert_rc(embps_push(f->c, "merged", idx, N, vals, dim, EMBPS_PUSH_MERGE),
              f->c);
    assert_rc(embps_push(f->c, "premerged", midx, k, mvals, dim, 0), f->c);
    ref_push(&ref, idx, N, vals);
  }
  float *got[3];
  for (int t = 0; t < 3; t++)
    got[t] = pull_all(f->c, names[t], rows, dim);
  assert_floats(got[1], got[0], rows * dim, 0,
                "EMBPS_PUSH_MERGE push vs push with duplicates");
  assert_floats(got[2], got[0], rows * dim, 0,
                "pre-merged push vs push with duplicates");
  assert_floats(got[0], ref.w, rows * dim, tol,
                "table vs reference (duplicates summed, one step per push)");
  /* something really changed, and rows never pushed kept their init */
  assert_true(memcmp(got[0], init0, rows * dim * sizeof(float)) != 0);
  assert_memory_equal(got[0] + 40 * dim, init0 + 40 * dim,
                      dim * sizeof(float));
  for (int t = 0; t < 3; t++) {
    assert_int_equal(rows_allocated(f->c, names[t]), ref_touched(&ref));
    free(got[t]);
  }
  free(init0);
  free(all);
  ref_free(&ref);
}

static void test_exact_duplicates_sgd(void **state) {
  exact_duplicates(*state, EMBPS_OPT_SGD, 0.25, 0);
}

static void test_exact_duplicates_adagrad(void **state) {
  /* sqrt and division: the same float expression as the contract, so equal
   * up to float rounding (PyTorch's formula, relative 1e-6). */
  exact_duplicates(*state, EMBPS_OPT_ADAGRAD, 0.1, 1e-6);
}

/* ================================================================ pulls and init */

static void test_pull_order_and_init(void **state) {
  fx_t *f = *state;
  static const char *const one_shard[] = {"--shards", "1", NULL};
  static const char *const seven[] = {"--shards", "7", "--io-threads", "1",
                                      NULL};
  start_server(f, 1, one_shard);
  start_server(f, 2, seven);
  embps_client_t *c1 = connect_ok(f->srv[1].addr, NULL);
  embps_client_t *c2 = connect_ok(f->srv[2].addr, NULL);
  embps_client_t *cs[3] = {f->c, c1, c2};
  const uint32_t dim = 16;
  embps_table_spec_t su = spec_of("u", dim, 1000, EMBPS_OPT_SGD, 0.5,
                                  EMBPS_INIT_UNIFORM, 0.1, 1234);
  embps_table_spec_t sn = spec_of("n", dim, 0, EMBPS_OPT_SGD, 0.5,
                                  EMBPS_INIT_NORMAL, 1.0, 77);
  for (int i = 0; i < 3; i++) {
    create(cs[i], &su);
    create(cs[i], &sn);
  }
  static const int64_t uid[] = {999, 0, 5, 5, 123, 0, 999, 500, 5};
  static const int64_t nid[] = {INT64_MIN, -5, 0, 7, 7, 1LL << 40, INT64_MAX,
                                -5};
  const size_t nu = sizeof uid / sizeof *uid, nn = sizeof nid / sizeof *nid;
  float *u[3], *n[3];
  for (int i = 0; i < 3; i++) {
    u[i] = pull_ids(cs[i], "u", uid, nu, dim);
    n[i] = pull_ids(cs[i], "n", nid, nn, dim);
  }
  /* the same on 4, 1 and 7 shards */
  for (int i = 1; i < 3; i++) {
    assert_memory_equal(u[i], u[0], nu * dim * sizeof(float));
    assert_memory_equal(n[i], n[0], nn * dim * sizeof(float));
  }
  /* request order, duplicates expanded: each row is the row of its id */
  for (size_t k = 0; k < nu; k++) {
    float *one = pull_ids(f->c, "u", &uid[k], 1, dim);
    assert_memory_equal(u[0] + k * dim, one, dim * sizeof(float));
    free(one);
    for (uint32_t j = 0; j < dim; j++)
      assert_true(fabsf(u[0][k * dim + j]) <= 0.1f);
  }
  for (size_t k = 0; k < nn; k++) {
    float *one = pull_ids(f->c, "n", &nid[k], 1, dim);
    assert_memory_equal(n[0] + k * dim, one, dim * sizeof(float));
    free(one);
  }
  /* distinct ids have distinct rows; the init is not all zeros */
  assert_true(memcmp(u[0], u[0] + 1 * dim, dim * sizeof(float)) != 0);
  assert_true(memcmp(u[0] + 2 * dim, u[0] + 3 * dim, dim * sizeof(float)) ==
              0);
  assert_true(memcmp(n[0], n[0] + 1 * dim, dim * sizeof(float)) != 0);
  /* a different seed gives different rows */
  embps_table_spec_t su2 = su;
  snprintf(su2.name, sizeof su2.name, "u2");
  su2.seed = 1235;
  create(f->c, &su2);
  float *u2 = pull_ids(f->c, "u2", uid, nu, dim);
  assert_true(memcmp(u2, u[0], nu * dim * sizeof(float)) != 0);
  free(u2);
  /* pulls allocate nothing */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(rows_allocated(cs[i], "u"), 0);
    assert_int_equal(rows_allocated(cs[i], "n"), 0);
  }
  /* after a restart, the same rows */
  embps_client_destroy(c1);
  assert_int_equal(it_server_stop(&f->srv[1]), 0);
  start_server(f, 1, one_shard);
  c1 = connect_ok(f->srv[1].addr, NULL);
  create(c1, &su);
  create(c1, &sn);
  float *ur = pull_ids(c1, "u", uid, nu, dim);
  float *nr = pull_ids(c1, "n", nid, nn, dim);
  assert_memory_equal(ur, u[0], nu * dim * sizeof(float));
  assert_memory_equal(nr, n[0], nn * dim * sizeof(float));
  free(ur);
  free(nr);
  /* a push allocates: exactly the distinct rows pushed */
  int64_t pidx[] = {5, 123, 5};
  float pv[3 * 16];
  for (size_t i = 0; i < 3 * dim; i++)
    pv[i] = 1.0f;
  assert_rc(embps_push(f->c, "u", pidx, 3, pv, dim, 0), f->c);
  assert_int_equal(rows_allocated(f->c, "u"), 2);
  int64_t nidx[] = {-5, INT64_MAX};
  assert_rc(embps_push(f->c, "n", nidx, 2, pv, dim, 0), f->c);
  assert_int_equal(rows_allocated(f->c, "n"), 2);
  embps_server_stats_t *st;
  size_t ns;
  assert_rc(embps_stats(f->c, &st, &ns), f->c);
  assert_int_equal(ns, 1);
  uint64_t from_stats = 0;
  for (size_t t = 0; t < st[0].n_tables; t++)
    if (!strcmp(st[0].tables[t].spec.name, "u"))
      from_stats = st[0].tables[t].rows_allocated;
  embps_stats_free(st, ns);
  assert_int_equal(from_stats, 2);
  /* pushed rows moved (5 twice: w -= 0.5 * 2), the others did not */
  float *after = pull_ids(f->c, "u", uid, nu, dim);
  for (size_t k = 0; k < nu; k++) {
    for (uint32_t j = 0; j < dim; j++) {
      float want = u[0][k * dim + j];
      if (uid[k] == 5)
        want -= 0.5f * 2.0f;
      else if (uid[k] == 123)
        want -= 0.5f;
      assert_true(after[k * dim + j] == want);
    }
  }
  free(after);
  for (int i = 0; i < 3; i++) {
    free(u[i]);
    free(n[i]);
  }
  embps_client_destroy(c1);
  embps_client_destroy(c2);
}

/* ================================================================ padding */

static void test_padding_id(void **state) {
  fx_t *f = *state;
  const uint32_t dim = 4;
  embps_table_spec_t s = spec_of("p", dim, 20, EMBPS_OPT_SGD, 1.0,
                                 EMBPS_INIT_CONSTANT, 0.5, 1);
  s.has_padding = 1;
  s.padding_id = 7;
  create(f->c, &s);
  int64_t ids[] = {7, 1, 7, 3};
  float *r = pull_ids(f->c, "p", ids, 4, dim);
  for (uint32_t j = 0; j < dim; j++) {
    assert_true(r[0 * dim + j] == 0.0f);
    assert_true(r[1 * dim + j] == 0.5f);
    assert_true(r[2 * dim + j] == 0.0f);
    assert_true(r[3 * dim + j] == 0.5f);
  }
  free(r);
  int64_t pidx[] = {7, 1, 7, 7};
  float pv[4 * 4];
  for (size_t i = 0; i < 4 * dim; i++)
    pv[i] = 1.0f;
  assert_rc(embps_push(f->c, "p", pidx, 4, pv, dim, 0), f->c);
  int64_t only_pad[] = {7};
  assert_rc(embps_push(f->c, "p", only_pad, 1, pv, dim, 0), f->c);
  r = pull_ids(f->c, "p", ids, 4, dim);
  for (uint32_t j = 0; j < dim; j++) {
    assert_true(r[0 * dim + j] == 0.0f);
    assert_true(r[1 * dim + j] == -0.5f);
    assert_true(r[2 * dim + j] == 0.0f);
    assert_true(r[3 * dim + j] == 0.5f);
  }
  free(r);
  assert_int_equal(rows_allocated(f->c, "p"), 1);

  /* dynamic table, negative padding id */
  embps_table_spec_t d = spec_of("pd", dim, 0, EMBPS_OPT_SGD, 1.0,
                                 EMBPS_INIT_UNIFORM, 1.0, 3);
  d.has_padding = 1;
  d.padding_id = -1;
  create(f->c, &d);
  int64_t dids[] = {-1, 42};
  r = pull_ids(f->c, "pd", dids, 2, dim);
  int nonzero = 0;
  for (uint32_t j = 0; j < dim; j++) {
    assert_true(r[j] == 0.0f);
    nonzero += r[dim + j] != 0.0f;
  }
  assert_true(nonzero > 0);
  free(r);
  int64_t pads[] = {-1, -1};
  assert_rc(embps_push(f->c, "pd", pads, 2, pv, dim, 0), f->c);
  assert_int_equal(rows_allocated(f->c, "pd"), 0);
  r = pull_ids(f->c, "pd", pads, 1, dim);
  for (uint32_t j = 0; j < dim; j++)
    assert_true(r[j] == 0.0f);
  free(r);
}

/* ================================================================ dynamic */

static void test_dynamic_int64_range(void **state) {
  fx_t *f = *state;
  const uint32_t dim = 4;
  embps_table_spec_t s = spec_of("d", dim, 0, EMBPS_OPT_SGD, 0.5,
                                 EMBPS_INIT_UNIFORM, 0.25, 5);
  create(f->c, &s);
  enum { NSPECIAL = 11, NRAND = 3000 };
  static const int64_t special[NSPECIAL] = {
      INT64_MIN, INT64_MIN + 1, -4294967296LL, -65536, -1, 0, 1,
      4294967296LL, 1LL << 62, INT64_MAX - 1, INT64_MAX};
  size_t n = NSPECIAL + NRAND;
  int64_t *ids = xmalloc(n * sizeof *ids);
  memcpy(ids, special, sizeof special);
  for (size_t i = 0; i < NRAND; i++)
    ids[NSPECIAL + i] = (int64_t)mix(0xabcdef + i);
  ref_t ref;
  ref_init(&ref, &s);
  ref_learn_from(&ref, f->c, "d", ids, n);
  assert_int_equal(rows_allocated(f->c, "d"), 0);
  /* the special ids, each three times, in one push */
  int64_t sp[3 * NSPECIAL];
  float spv[3 * NSPECIAL * 4];
  for (size_t i = 0; i < 3 * NSPECIAL; i++) {
    sp[i] = special[(i * 5) % NSPECIAL];
    for (uint32_t j = 0; j < dim; j++)
      spv[i * dim + j] = grad_value(mix(i * 31 + j));
  }
  assert_rc(embps_push(f->c, "d", sp, 3 * NSPECIAL, spv, dim, 0), f->c);
  ref_push(&ref, sp, 3 * NSPECIAL, spv);
  /* the random ids in three pushes, with repeats */
  size_t bn = 1500;
  int64_t *bi = xmalloc(bn * sizeof *bi);
  float *bv = xmalloc(bn * dim * sizeof *bv);
  for (int b = 0; b < 3; b++) {
    for (size_t i = 0; i < bn; i++) {
      bi[i] = ids[NSPECIAL + (mix((uint64_t)b * 7919 + i) % NRAND)];
      for (uint32_t j = 0; j < dim; j++)
        bv[i * dim + j] = grad_value(mix(i * 131 + j + (uint64_t)b));
    }
    assert_rc(embps_push(f->c, "d", bi, bn, bv, dim, 0), f->c);
    ref_push(&ref, bi, bn, bv);
  }
  /* pull everything, reversed */
  for (size_t i = 0; i < n / 2; i++) {
    int64_t t = ids[i];
    ids[i] = ids[n - 1 - i];
    ids[n - 1 - i] = t;
  }
  check_rows(f->c, "d", &ref, ids, n, 0, "dynamic table across int64");
  assert_int_equal(rows_allocated(f->c, "d"), ref_touched(&ref));
  assert_true(ref_touched(&ref) > NSPECIAL + 1000);
  free(bi);
  free(bv);
  free(ids);
  ref_free(&ref);
}

/* ================================================================ refusals */

/* Dense table "t": dim 4, 10 rows, SGD, uniform init, two pushes applied. */
enum { T_DIM = 4, T_ROWS = 10 };

static void err_prepare(fx_t *f, ref_t *ref) {
  embps_table_spec_t s = spec_of("t", T_DIM, T_ROWS, EMBPS_OPT_SGD, 0.5,
                                 EMBPS_INIT_UNIFORM, 0.5, 8);
  create(f->c, &s);
  ref_init(ref, &s);
  int64_t all[T_ROWS];
  for (int i = 0; i < T_ROWS; i++)
    all[i] = i;
  ref_learn_from(ref, f->c, "t", all, T_ROWS);
  int64_t idx[] = {1, 2, 2, 9, 0, 1};
  float v[6 * T_DIM];
  for (int p = 0; p < 2; p++) {
    for (size_t i = 0; i < 6 * T_DIM; i++)
      v[i] = grad_value(mix(i + (uint64_t)p * 100));
    assert_rc(embps_push(f->c, "t", idx, 6, v, T_DIM, 0), f->c);
    ref_push(ref, idx, 6, v);
  }
  check_dense(f->c, "t", ref, T_ROWS, 0, "table before the refusals");
}

/* The table is exactly what the valid pushes made it, and the server (and
 * this client) still serve: a valid push applies exactly. */
static void err_check_unchanged(fx_t *f, ref_t *ref, const float *before) {
  float *now = pull_all(f->c, "t", T_ROWS, T_DIM);
  assert_memory_equal(now, before, T_ROWS * T_DIM * sizeof(float));
  free(now);
  check_dense(f->c, "t", ref, T_ROWS, 0, "table after the refusals");
  int64_t idx[] = {3, 3, 4};
  float v[3 * T_DIM];
  for (size_t i = 0; i < 3 * T_DIM; i++)
    v[i] = grad_value(mix(i + 555));
  assert_rc(embps_push(f->c, "t", idx, 3, v, T_DIM, 0), f->c);
  ref_push(ref, idx, 3, v);
  check_dense(f->c, "t", ref, T_ROWS, 0, "a valid push after the refusals");
  embps_client_t *c2 = connect_ok(f->srv[0].addr, NULL);
  check_dense(c2, "t", ref, T_ROWS, 0, "a new client after the refusals");
  embps_client_destroy(c2);
}

static void fill_values(float *v, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++)
    v[i] = grad_value(mix(seed + i));
}

static void test_refuse_unknown_table(void **state) {
  fx_t *f = *state;
  ref_t ref;
  err_prepare(f, &ref);
  float *before = pull_all(f->c, "t", T_ROWS, T_DIM);
  int64_t idx[] = {1, 2};
  float v[2 * T_DIM], out[2 * T_DIM];
  fill_values(v, 2 * T_DIM, 1);
  assert_err(embps_push(f->c, "nope", idx, 2, v, T_DIM, 0), f->c,
             EMBPS_ENOTABLE, "unknown table \"nope\"");
  assert_err(embps_pull(f->c, "nope", idx, 2, out, T_DIM), f->c,
             EMBPS_ENOTABLE, "unknown table \"nope\"");
  embps_table_info_t info;
  assert_err(embps_describe_table(f->c, "nope", &info), f->c, EMBPS_ENOTABLE,
             "unknown table \"nope\"");
  assert_err(embps_drop_table(f->c, "nope"), f->c, EMBPS_ENOTABLE,
             "unknown table \"nope\"");
  err_check_unchanged(f, &ref, before);
  free(before);
  ref_free(&ref);
}

static void test_refuse_wrong_dim(void **state) {
  fx_t *f = *state;
  ref_t ref;
  err_prepare(f, &ref);
  float *before = pull_all(f->c, "t", T_ROWS, T_DIM);
  int64_t idx[] = {1, 2};
  float v[2 * 5], out[2 * 5];
  fill_values(v, 2 * 5, 2);
  assert_err(embps_push(f->c, "t", idx, 2, v, 5, 0), f->c, EMBPS_EDIM,
             "dim 4");
  assert_err(embps_push(f->c, "t", idx, 1, v, 3, 0), f->c, EMBPS_EDIM,
             "dim 3");
  assert_err(embps_pull(f->c, "t", idx, 2, out, 5), f->c, EMBPS_EDIM,
             "dim 5");
  err_check_unchanged(f, &ref, before);
  free(before);
  ref_free(&ref);
}

static void test_refuse_out_of_range(void **state) {
  fx_t *f = *state;
  ref_t ref;
  err_prepare(f, &ref);
  float *before = pull_all(f->c, "t", T_ROWS, T_DIM);
  /* every index valid except the very last */
  int64_t idx[11];
  float v[11 * T_DIM], out[2 * T_DIM];
  for (int i = 0; i < 11; i++)
    idx[i] = i;
  fill_values(v, 11 * T_DIM, 3);
  assert_err(embps_push(f->c, "t", idx, 11, v, T_DIM, 0), f->c, EMBPS_ERANGE,
             "index 10 out of range [0, 10)");
  int64_t neg[] = {2, 3, -1};
  assert_err(embps_push(f->c, "t", neg, 3, v, T_DIM, EMBPS_PUSH_MERGE), f->c,
             EMBPS_ERANGE, "index -1 out of range");
  int64_t big[] = {2, 2, 1000000, 4};
  assert_err(embps_push(f->c, "t", big, 4, v, T_DIM, 0), f->c, EMBPS_ERANGE,
             "index 1000000 out of range");
  int64_t pbad[] = {0, 10};
  assert_err(embps_pull(f->c, "t", pbad, 2, out, T_DIM), f->c, EMBPS_ERANGE,
             "index 10 out of range [0, 10)");
  int64_t pmin[] = {INT64_MIN};
  assert_err(embps_pull(f->c, "t", pmin, 1, out, T_DIM), f->c, EMBPS_ERANGE,
             "out of range");
  err_check_unchanged(f, &ref, before);
  free(before);
  ref_free(&ref);
}

static void test_refuse_count_mismatch(void **state) {
  fx_t *f = *state;
  ref_t ref;
  err_prepare(f, &ref);
  float *before = pull_all(f->c, "t", T_ROWS, T_DIM);
  int fd = raw_connect(f->srv[0].port);
  raw_hello(fd, NULL, 1);
  uint8_t bulk[3 * 8 + 13 * 4];
  int64_t idx[3] = {1, 2, 3};
  memcpy(bulk, idx, sizeof idx);
  fill_values((float *)(bulk + sizeof idx), 13, 4);
  /* 3 indices, dim 4: 12 values needed; send 11, then 13, then none */
  raw_push(fd, 2, "t", 3, T_DIM, bulk, 3 * 8 + 11 * 4);
  raw_expect_error(fd, 2, EMBPS_ECOUNT, "3 indices");
  raw_push(fd, 3, "t", 3, T_DIM, bulk, 3 * 8 + 13 * 4);
  raw_expect_error(fd, 3, EMBPS_ECOUNT, "3 indices");
  raw_push(fd, 4, "t", 3, T_DIM, bulk, 2 * 8);
  raw_expect_error(fd, 4, EMBPS_ECOUNT, "indices");
  /* a pull that says 3 ids but carries 2 */
  raw_pull(fd, 5, "t", 3, T_DIM, idx, 2);
  raw_expect_error(fd, 5, EMBPS_ECOUNT, "3 ids");
  /* the same connection still serves */
  int64_t ok[] = {9, 1, 1};
  raw_pull_check(fd, 6, "t", &ref, ok, 3);
  close(fd);
  err_check_unchanged(f, &ref, before);
  free(before);
  ref_free(&ref);
}

static void test_refuse_nonfinite(void **state) {
  fx_t *f = *state;
  ref_t ref;
  err_prepare(f, &ref);
  float *before = pull_all(f->c, "t", T_ROWS, T_DIM);
  int64_t idx[] = {0, 1, 2, 3, 4, 5};
  float v[6 * T_DIM];
  fill_values(v, 6 * T_DIM, 5);
  v[2 * T_DIM + 1] = NAN;
  assert_err(embps_push(f->c, "t", idx, 6, v, T_DIM, 0), f->c,
             EMBPS_ENONFINITE, "non-finite");
  fill_values(v, 6 * T_DIM, 5);
  v[3 * T_DIM + 2] = INFINITY;
  assert_err(embps_push(f->c, "t", idx, 6, v, T_DIM, 0), f->c,
             EMBPS_ENONFINITE, "non-finite");
  fill_values(v, 6 * T_DIM, 5);
  v[5 * T_DIM + 3] = -INFINITY;
  assert_err(embps_push(f->c, "t", idx, 6, v, T_DIM, EMBPS_PUSH_MERGE), f->c,
             EMBPS_ENONFINITE, "non-finite");
  err_check_unchanged(f, &ref, before);
  free(before);
  ref_free(&ref);
}

static void test_refuse_table_exists(void **state) {
  fx_t *f = *state;
  ref_t ref;
  err_prepare(f, &ref);
  float *before = pull_all(f->c, "t", T_ROWS, T_DIM);
  embps_table_spec_t s = spec_of("t", T_DIM, T_ROWS, EMBPS_OPT_SGD, 0.5,
                                 EMBPS_INIT_UNIFORM, 0.5, 8);
  assert_err(embps_create_table(f->c, &s), f->c, EMBPS_EEXIST,
             "table \"t\" already exists");
  s.dim = 8;
  s.optimizer = EMBPS_OPT_ADAGRAD;
  assert_err(embps_create_table(f->c, &s), f->c, EMBPS_EEXIST,
             "already exists");
  embps_table_info_t info;
  assert_rc(embps_describe_table(f->c, "t", &info), f->c);
  assert_int_equal(info.spec.dim, T_DIM);
  assert_int_equal(info.spec.optimizer, EMBPS_OPT_SGD);
  err_check_unchanged(f, &ref, before);
  free(before);
  ref_free(&ref);
}

/* Server started with --max-frame-bytes 4096. */
static void test_refuse_oversized_frame(void **state) {
  fx_t *f = *state;
  const uint32_t dim = 16;
  embps_table_spec_t s = spec_of("big", dim, 1000, EMBPS_OPT_SGD, 0.5,
                                 EMBPS_INIT_UNIFORM, 0.5, 4);
  create(f->c, &s);
  ref_t ref;
  ref_init(&ref, &s);
  int64_t *all = xmalloc(1000 * sizeof *all);
  for (int i = 0; i < 1000; i++)
    all[i] = i;
  /* pull in pieces: the reply may be up to 4x the frame limit */
  for (int i = 0; i < 1000; i += 50)
    ref_learn_from(&ref, f->c, "big", all + i, 50);
  int64_t idx[100];
  float v[100 * 16];
  for (int i = 0; i < 100; i++)
    idx[i] = (i * 7) % 1000;
  fill_values(v, 100 * dim, 6);
  /* a small push (about 1.4 KB) goes through */
  assert_rc(embps_push(f->c, "big", idx, 20, v, dim, 0), f->c);
  ref_push(&ref, idx, 20, v);
  /* about 7 KB: refused before sending (the hello announced the limit) */
  assert_err(embps_push(f->c, "big", idx + 10, 90, v, dim, 0), f->c,
             EMBPS_EFRAMESIZE, "max-frame-bytes");
  /* the same client reconnects and serves; nothing was applied */
  for (int i = 0; i < 1000; i += 50)
    check_rows(f->c, "big", &ref, all + i, 50, 0, "after an oversized push");
  assert_rc(embps_push(f->c, "big", idx + 50, 10, v, dim, 0), f->c);
  ref_push(&ref, idx + 50, 10, v);
  embps_client_t *c2 = connect_ok(f->srv[0].addr, NULL);
  check_rows(c2, "big", &ref, idx, 50, 0, "a new client after the refusal");
  embps_client_destroy(c2);
  /* a raw header announcing 1 GiB: refused before any allocation, with
   * the error addressed to that request */
  int fd = raw_connect(f->srv[0].port);
  raw_hello(fd, NULL, 1);
  embps_frame_header_t h = {.body_len = 1u << 30, .meta_len = 16,
                            .req_id = 2, .kind = EMBPS_KIND_PUSH};
  uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
  embps_frame_header_encode(&h, hdr);
  assert_int_equal(it_send_full(fd, hdr, sizeof hdr), 0);
  raw_expect_error(fd, 2, EMBPS_EFRAMESIZE, "max-frame-bytes");
  close(fd);
  /* a well-framed oversized frame is skipped unread: the connection goes
   * on serving the requests after it */
  fd = raw_connect(f->srv[0].port);
  raw_hello(fd, NULL, 1);
  h.body_len = 8192;
  h.req_id = 3;
  embps_frame_header_encode(&h, hdr);
  uint8_t *junk = xmalloc(8192);
  memset(junk, 0xab, 8192);
  assert_int_equal(it_send_full(fd, hdr, sizeof hdr), 0);
  assert_int_equal(it_send_full(fd, junk, 8192), 0);
  free(junk);
  raw_expect_error(fd, 3, EMBPS_EFRAMESIZE, "max-frame-bytes");
  raw_hello(fd, NULL, 4);
  close(fd);
  check_rows(f->c, "big", &ref, idx, 50, 0, "after a raw oversized frame");
  free(all);
  ref_free(&ref);
}

/* A push far above the limit (4 MB, more than the socket buffers hold) must
 * be refused with the same code, not lost in a connection reset. */
static void test_refuse_oversized_frame_large(void **state) {
  fx_t *f = *state;
  const uint32_t dim = 64;
  embps_table_spec_t s = spec_of("dd", dim, 0, EMBPS_OPT_SGD, 0.5,
                                 EMBPS_INIT_ZEROS, 0, 4);
  create(f->c, &s);
  size_t n = 16000; /* 4.2 MB */
  int64_t *idx = xmalloc(n * sizeof *idx);
  float *v = xmalloc(n * dim * sizeof *v);
  for (size_t i = 0; i < n; i++)
    idx[i] = (int64_t)i;
  fill_values(v, n * dim, 7);
  int push_of_4mb = embps_push(f->c, "dd", idx, n, v, dim, 0);
  free(idx);
  free(v);
  assert_err(push_of_4mb, f->c, EMBPS_EFRAMESIZE, "max-frame-bytes");
  /* nothing applied, and the server still serves this client */
  assert_int_equal(rows_allocated(f->c, "dd"), 0);
}

static void test_refuse_garbage(void **state) {
  fx_t *f = *state;
  ref_t ref;
  err_prepare(f, &ref);
  float *before = pull_all(f->c, "t", T_ROWS, T_DIM);
  /* random junk, not starting with a valid header */
  uint8_t junk[4096];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (uint8_t)mix(i * 3 + 17);
  junk[14] = 0; /* no "EP" magic */
  int fd = raw_connect(f->srv[0].port);
  it_send_full(fd, junk, sizeof junk); /* may fail once the server closes */
  assert_true(raw_closed(fd, 5000));
  close(fd);
  /* junk after a hello */
  fd = raw_connect(f->srv[0].port);
  raw_hello(fd, NULL, 1);
  it_send_full(fd, junk, 64);
  assert_true(raw_closed(fd, 5000));
  close(fd);
  /* a valid header around a meta that does not decode */
  fd = raw_connect(f->srv[0].port);
  uint8_t frame[EMBPS_FRAME_HEADER_LEN + 64];
  embps_frame_header_t h = {.body_len = 64, .meta_len = 64, .req_id = 9,
                            .kind = EMBPS_KIND_HELLO};
  embps_frame_header_encode(&h, frame);
  memset(frame + EMBPS_FRAME_HEADER_LEN, 0xff, 64);
  assert_int_equal(it_send_full(fd, frame, sizeof frame), 0);
  raw_expect_error(fd, 9, EMBPS_EPROTO, "decode");
  assert_true(raw_closed(fd, 5000));
  close(fd);
  /* after a hello, an unknown kind is refused and the connection serves */
  fd = raw_connect(f->srv[0].port);
  raw_hello(fd, NULL, 1);
  h.kind = 77;
  h.body_len = h.meta_len = 0;
  h.req_id = 2;
  embps_frame_header_encode(&h, frame);
  assert_int_equal(it_send_full(fd, frame, EMBPS_FRAME_HEADER_LEN), 0);
  raw_expect_error(fd, 2, EMBPS_EKIND, "kind 77");
  int64_t ids[] = {4, 0};
  raw_pull_check(fd, 3, "t", &ref, ids, 2);
  close(fd);
  err_check_unchanged(f, &ref, before);
  free(before);
  ref_free(&ref);
}

static void test_refuse_protocol_version(void **state) {
  fx_t *f = *state;
  int fd = raw_connect(f->srv[0].port);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.u.hello.version = 99;
  raw_send(fd, EMBPS_KIND_HELLO, &m, 41, NULL, 0);
  raw_expect_error(fd, 41, EMBPS_EVERSION, "99");
  assert_true(raw_closed(fd, 5000));
  close(fd);
  /* the server still serves */
  embps_table_spec_t s = spec_of("v", 2, 4, EMBPS_OPT_SGD, 1, EMBPS_INIT_ZEROS,
                                 0, 0);
  create(f->c, &s);
  embps_client_t *c2 = connect_ok(f->srv[0].addr, NULL);
  assert_int_equal(rows_allocated(c2, "v"), 0);
  embps_client_destroy(c2);
}

static void test_refuse_request_before_hello(void **state) {
  fx_t *f = *state;
  embps_table_spec_t s = spec_of("h", 2, 4, EMBPS_OPT_SGD, 1, EMBPS_INIT_ZEROS,
                                 0, 0);
  create(f->c, &s);
  int fd = raw_connect(f->srv[0].port);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  raw_send(fd, EMBPS_KIND_STATS, &m, 5, NULL, 0);
  raw_expect_error(fd, 5, EMBPS_EAUTH, "hello");
  assert_true(raw_closed(fd, 5000));
  close(fd);
  /* a push before hello changes nothing */
  fd = raw_connect(f->srv[0].port);
  uint8_t bulk[8 + 2 * 4];
  int64_t one = 1;
  float g[2] = {1, 1};
  memcpy(bulk, &one, 8);
  memcpy(bulk + 8, g, sizeof g);
  raw_push(fd, 6, "h", 1, 2, bulk, sizeof bulk);
  raw_expect_error(fd, 6, EMBPS_EAUTH, "hello");
  assert_true(raw_closed(fd, 5000));
  close(fd);
  assert_int_equal(rows_allocated(f->c, "h"), 0);
}

/* Server started with --auth-token-file. */
static void test_auth_token(void **state) {
  fx_t *f = *state;
  const char *addr = f->srv[0].addr;
  char err[512];
  int rc;
  embps_client_t *c = try_connect(addr, NULL, &rc, err, sizeof err);
  assert_null(c);
  if (rc != EMBPS_EAUTH)
    fail_msg("no token: got %s: %s", embps_err_name(rc), err);
  assert_non_null(strstr(err, "auth"));
  c = try_connect(addr, "s3cret-Token_41", &rc, err, sizeof err);
  assert_null(c);
  if (rc != EMBPS_EAUTH)
    fail_msg("wrong token: got %s: %s", embps_err_name(rc), err);
  c = try_connect(addr, "s3cret-Token_42x", &rc, err, sizeof err);
  assert_null(c);
  assert_int_equal(rc, EMBPS_EAUTH);
  /* raw: wrong token refused, then the right one works */
  int fd = raw_connect(f->srv[0].port);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.u.hello.version = EMBPS_PROTOCOL_VERSION;
  m.u.hello.token_len = 3;
  memcpy(m.u.hello.token, "bad", 3);
  raw_send(fd, EMBPS_KIND_HELLO, &m, 1, NULL, 0);
  raw_expect_error(fd, 1, EMBPS_EAUTH, "token");
  assert_true(raw_closed(fd, 5000));
  close(fd);
  fd = raw_connect(f->srv[0].port);
  raw_hello(fd, "s3cret-Token_42", 1);
  close(fd);
  /* the right token: everything works */
  c = connect_ok(addr, "s3cret-Token_42");
  embps_table_spec_t s = spec_of("a", 2, 8, EMBPS_OPT_SGD, 1, EMBPS_INIT_ZEROS,
                                 0, 0);
  create(c, &s);
  int64_t idx[] = {3, 3};
  float v[] = {-1, -2, -3, -4};
  assert_rc(embps_push(c, "a", idx, 2, v, 2, 0), c);
  float out[2];
  assert_rc(embps_pull(c, "a", idx, 1, out, 2), c);
  assert_true(out[0] == 4.0f && out[1] == 6.0f);
  embps_client_destroy(c);
}

/* ================================================================ cluster */

static uint64_t server_rows(const embps_server_stats_t *s, const char *table) {
  for (size_t t = 0; t < s->n_tables; t++)
    if (!strcmp(s->tables[t].spec.name, table))
      return s->tables[t].rows_allocated;
  fail_msg("server %s has no table %s", s->address, table);
  return 0;
}

/* Pulls through client c alternate between 3 x NB ids drawn from 50 and
 * NB distinct ids, so c's reused buffers (client.c, common/bufpool.c) keep
 * changing hands between sizes (the distinct pull needs more room than the
 * duplicated one kept); every pull must read what a fresh client (fresh)
 * reads. */
static void check_pull_buffer_reuse(embps_client_t *c, embps_client_t *fresh,
                                    const char *table, uint32_t dim) {
  enum { NB = 12000, FEW = 50 };
  int64_t *ids_b = xmalloc(NB * sizeof *ids_b);
  int64_t *ids_a = xmalloc(3 * NB * sizeof *ids_a);
  for (size_t i = 0; i < NB; i++)
    ids_b[i] = (int64_t)(mix(i + 777) % 2000000000000ULL) - 1000000000000LL;
  for (size_t i = 0; i < 3 * NB; i++)
    ids_a[i] = ids_b[mix(i) % FEW];
  float *want = pull_ids(fresh, table, ids_b, NB, dim);
  for (int round = 0; round < 3; round++) {
    float *a = pull_ids(c, table, ids_a, 3 * NB, dim);
    for (size_t i = 0; i < 3 * NB; i++)
      assert_memory_equal(a + i * dim, want + (mix(i) % FEW) * dim,
                          dim * sizeof *a);
    free(a);
    float *b = pull_ids(c, table, ids_b, NB, dim);
    assert_memory_equal(b, want, (size_t)NB * dim * sizeof *b);
    free(b);
  }
  free(want);
  free(ids_a);
  free(ids_b);
}

static void test_two_servers(void **state) {
  fx_t *f = *state;
  assert_int_equal(embps_client_n_servers(f->c), 2);
  const uint32_t dim = 4;
  embps_table_spec_t s = spec_of("c", dim, 0, EMBPS_OPT_SGD, 0.5,
                                 EMBPS_INIT_UNIFORM, 0.5, 31);
  create(f->c, &s);
  enum { POOL = 2000 };
  int64_t *pool = xmalloc(POOL * sizeof *pool);
  for (int i = 0; i < POOL; i++)
    pool[i] = (int64_t)(mix((uint64_t)i + 4242) % 2000000000000ULL) -
              1000000000000LL;
  ref_t ref;
  ref_init(&ref, &s);
  ref_learn_from(&ref, f->c, "c", pool, POOL);
  /* both servers own some of the pool */
  int owned[2] = {0, 0};
  for (int i = 0; i < POOL; i++)
    owned[embps_route(pool[i], 2)]++;
  assert_true(owned[0] > 500 && owned[1] > 500);
  /* initial rows do not depend on the server count */
  embps_client_t *solo_c;
  it_server_t *solo = &f->srv[2];
  start_server(f, 2, NULL);
  solo_c = connect_ok(solo->addr, NULL);
  create(solo_c, &s);
  float *solo_rows = pull_ids(solo_c, "c", pool, POOL, dim);
  assert_memory_equal(solo_rows, ref.w, POOL * dim * sizeof(float));
  free(solo_rows);
  embps_client_destroy(solo_c);
  /* pushes of many ids, with repeats; only ids from the first 1500 of the
   * pool are pushed */
  size_t bn = 2500;
  int64_t *bi = xmalloc(bn * sizeof *bi);
  float *bv = xmalloc(bn * dim * sizeof *bv);
  for (int b = 0; b < 3; b++) {
    for (size_t i = 0; i < bn; i++) {
      bi[i] = pool[mix(i * 3 + (uint64_t)b * 100003) % 1500];
      for (uint32_t j = 0; j < dim; j++)
        bv[i * dim + j] = grad_value(mix(i + j * 7 + (uint64_t)b));
    }
    assert_rc(embps_push(f->c, "c", bi, bn, bv, dim,
                         b == 1 ? EMBPS_PUSH_MERGE : 0), f->c);
    ref_push(&ref, bi, bn, bv);
  }
  check_rows(f->c, "c", &ref, pool, POOL, 0, "two servers: pull of the pool");
  {
    char both[80];
    snprintf(both, sizeof both, "%s,%s", f->srv[0].addr, f->srv[1].addr);
    embps_client_t *c2 = connect_ok(both, NULL);
    embps_client_t *fresh = connect_ok(both, NULL);
    check_pull_buffer_reuse(c2, fresh, "c", dim);
    embps_client_destroy(fresh);
    embps_client_destroy(c2);
  }
  /* each server holds only its own rows */
  size_t want[2] = {0, 0};
  for (size_t i = 0; i < ref.n; i++)
    if (ref.touched[i])
      want[embps_route(ref.ids[i], 2)]++;
  embps_server_stats_t *st;
  size_t ns;
  assert_rc(embps_stats(f->c, &st, &ns), f->c);
  assert_int_equal(ns, 2);
  assert_int_equal(st[0].cluster_index, 0);
  assert_int_equal(st[1].cluster_index, 1);
  assert_int_equal(st[0].cluster_size, 2);
  uint64_t r0 = server_rows(&st[0], "c"), r1 = server_rows(&st[1], "c");
  embps_stats_free(st, ns);
  assert_int_equal(r0, want[0]);
  assert_int_equal(r1, want[1]);
  assert_int_equal(r0 + r1, ref_touched(&ref));
  assert_int_equal(rows_allocated(f->c, "c"), ref_touched(&ref));

  /* a client that takes server 1 for a 1-server cluster is refused */
  char err[512];
  int rc;
  embps_client_t *bad = try_connect(f->srv[1].addr, NULL, &rc, err,
                                    sizeof err);
  assert_null(bad);
  if (rc != EMBPS_EWRONGSERVER)
    fail_msg("1-server view of server 1: got %s: %s", embps_err_name(rc), err);
  char swapped[80];
  snprintf(swapped, sizeof swapped, "%s,%s", f->srv[1].addr, f->srv[0].addr);
  bad = try_connect(swapped, NULL, &rc, err, sizeof err);
  assert_null(bad);
  assert_int_equal(rc, EMBPS_EWRONGSERVER);

  /* a raw push to server 0 of an id server 1 owns is refused */
  int64_t foreign = 0;
  for (int i = 0; i < 1500; i++)
    if (embps_route(pool[i], 2) == 1) {
      foreign = pool[i];
      break;
    }
  int fd = raw_connect(f->srv[0].port);
  raw_hello(fd, NULL, 1);
  uint8_t bulk[8 + 4 * 4];
  memcpy(bulk, &foreign, 8);
  float g[4] = {1, 1, 1, 1};
  memcpy(bulk + 8, g, sizeof g);
  raw_push(fd, 2, "c", 1, dim, bulk, sizeof bulk);
  raw_expect_error(fd, 2, EMBPS_EWRONGSERVER, "belongs to server 1");
  raw_pull(fd, 3, "c", 1, dim, &foreign, 1);
  raw_expect_error(fd, 3, EMBPS_EWRONGSERVER, "belongs to server 1");
  close(fd);
  check_rows(f->c, "c", &ref, &foreign, 1, 0, "row refused by server 0");
  assert_int_equal(rows_allocated(f->c, "c"), ref_touched(&ref));

  /* a push with one bad index is refused by the whole cluster */
  embps_table_spec_t sd = spec_of("cd", dim, 100, EMBPS_OPT_SGD, 1,
                                  EMBPS_INIT_CONSTANT, 1, 0);
  create(f->c, &sd);
  int64_t idx[101];
  float *v = xmalloc(101 * dim * sizeof *v);
  for (int i = 0; i < 101; i++)
    idx[i] = i;
  fill_values(v, 101 * dim, 9);
  assert_err(embps_push(f->c, "cd", idx, 101, v, dim, 0), f->c, EMBPS_ERANGE,
             "index 100 out of range [0, 100)");
  v[50 * dim] = NAN;
  assert_err(embps_push(f->c, "cd", idx, 100, v, dim, 0), f->c,
             EMBPS_ENONFINITE, "non-finite");
  assert_int_equal(rows_allocated(f->c, "cd"), 0);
  float *rows = pull_all(f->c, "cd", 100, dim);
  for (size_t i = 0; i < 100 * dim; i++)
    assert_true(rows[i] == 1.0f);
  free(rows);
  free(v);
  free(bi);
  free(bv);
  free(pool);
  ref_free(&ref);
}

/* ================================================================ concurrency */

enum { CC_CHILDREN = 8, CC_PUSHES = 200, CC_ROWS = 40, CC_DIM = 4, CC_N = 6 };

static void cc_batch(int child, int p, int64_t *idx) {
  uint64_t h = mix((uint64_t)child * 100000 + (uint64_t)p);
  idx[0] = (int64_t)(h % CC_ROWS);
  idx[1] = (int64_t)((h >> 8) % CC_ROWS);
  idx[2] = idx[0];
  idx[3] = (int64_t)((h >> 16) % CC_ROWS);
  idx[4] = CC_ROWS - 1; /* every push touches the last row */
  idx[5] = idx[3];
}

static int cc_child(const char *addr, int child) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = addr;
  o.timeout_ms = TIMEOUT_MS;
  embps_client_t *c;
  if (embps_client_create(&o, &c, NULL, 0))
    return 2;
  float v[CC_N * CC_DIM];
  for (size_t i = 0; i < CC_N * CC_DIM; i++)
    v[i] = -1.0f;
  for (int p = 0; p < CC_PUSHES; p++) {
    int64_t idx[CC_N];
    cc_batch(child, p, idx);
    if (embps_push(c, "cc", idx, CC_N, v, CC_DIM,
                   child % 2 ? EMBPS_PUSH_MERGE : 0)) {
      embps_client_destroy(c);
      return 3;
    }
  }
  embps_client_destroy(c);
  return 0;
}

static void test_concurrent_clients(void **state) {
  fx_t *f = *state;
  embps_table_spec_t s = spec_of("cc", CC_DIM, CC_ROWS, EMBPS_OPT_SGD, 1.0,
                                 EMBPS_INIT_ZEROS, 0, 0);
  create(f->c, &s);
  pid_t kids[CC_CHILDREN];
  for (int k = 0; k < CC_CHILDREN; k++) {
    kids[k] = fork();
    assert_true(kids[k] >= 0);
    if (kids[k] == 0)
      _exit(cc_child(f->srv[0].addr, k));
  }
  int failed = 0;
  for (int k = 0; k < CC_CHILDREN; k++) {
    int st;
    while (waitpid(kids[k], &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "client process %d failed (status 0x%x)\n", k, st);
      failed++;
    }
  }
  assert_int_equal(failed, 0);
  double want[CC_ROWS] = {0};
  for (int k = 0; k < CC_CHILDREN; k++)
    for (int p = 0; p < CC_PUSHES; p++) {
      int64_t idx[CC_N];
      cc_batch(k, p, idx);
      for (int i = 0; i < CC_N; i++)
        want[idx[i]] += 1.0;
    }
  assert_true(want[CC_ROWS - 1] >= CC_CHILDREN * CC_PUSHES);
  float *rows = pull_all(f->c, "cc", CC_ROWS, CC_DIM);
  for (int r = 0; r < CC_ROWS; r++)
    for (int j = 0; j < CC_DIM; j++)
      if ((double)rows[r * CC_DIM + j] != want[r])
        fail_msg("row %d: %.9g, expected %.0f (every push applied once)", r,
                 (double)rows[r * CC_DIM + j], want[r]);
  free(rows);
  embps_server_stats_t *st;
  size_t ns;
  assert_rc(embps_stats(f->c, &st, &ns), f->c);
  assert_true(st[0].pushes >= CC_CHILDREN * CC_PUSHES);
  embps_stats_free(st, ns);
}

/* Pushers add 1 to every element of every row, again and again, while
 * pullers read: every row read must be a state the row really had (all its
 * elements equal, never lower than before). */
enum { TR_ROWS = 16, TR_DIM = 512, TR_ROUNDS = 150 };

static int tr_child(const char *addr, int role) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = addr;
  o.timeout_ms = TIMEOUT_MS;
  embps_client_t *c;
  if (embps_client_create(&o, &c, NULL, 0))
    return 2;
  int64_t ids[TR_ROWS];
  for (int i = 0; i < TR_ROWS; i++)
    ids[i] = role < 2 ? i : TR_ROWS - 1 - i;
  float *buf = malloc(TR_ROWS * TR_DIM * sizeof *buf);
  float last[TR_ROWS] = {0};
  int rc = buf ? 0 : 2;
  if (role < 2) { /* pusher */
    for (size_t i = 0; buf && i < TR_ROWS * TR_DIM; i++)
      buf[i] = -1.0f;
    for (int p = 0; !rc && p < TR_ROUNDS; p++)
      if (embps_push(c, "tr", ids, TR_ROWS, buf, TR_DIM,
                     role ? EMBPS_PUSH_MERGE : 0))
        rc = 3;
  } else { /* puller */
    for (int p = 0; !rc && p < 2 * TR_ROUNDS; p++) {
      if (embps_pull(c, "tr", ids, TR_ROWS, buf, TR_DIM)) {
        rc = 3;
        break;
      }
      for (int r = 0; r < TR_ROWS && !rc; r++) {
        const float *row = buf + r * TR_DIM;
        for (int j = 1; j < TR_DIM; j++)
          if (row[j] != row[0])
            rc = 4; /* torn row */
        if (row[0] < last[r])
          rc = 5; /* went back in time */
        last[r] = row[0];
      }
    }
  }
  free(buf);
  embps_client_destroy(c);
  return rc;
}

static void test_no_torn_rows(void **state) {
  fx_t *f = *state;
  embps_table_spec_t s = spec_of("tr", TR_DIM, TR_ROWS, EMBPS_OPT_SGD, 1.0,
                                 EMBPS_INIT_ZEROS, 0, 0);
  create(f->c, &s);
  pid_t kids[4];
  for (int k = 0; k < 4; k++) {
    kids[k] = fork();
    assert_true(kids[k] >= 0);
    if (kids[k] == 0)
      _exit(tr_child(f->srv[0].addr, k));
  }
  int failed = 0;
  for (int k = 0; k < 4; k++) {
    int st;
    while (waitpid(kids[k], &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "%s process %d failed: %s\n", k < 2 ? "push" : "pull",
              k, WIFEXITED(st) && WEXITSTATUS(st) == 4   ? "torn row"
                 : WIFEXITED(st) && WEXITSTATUS(st) == 5 ? "row went back"
                                                         : "error");
      failed++;
    }
  }
  assert_int_equal(failed, 0);
  float *rows = pull_all(f->c, "tr", TR_ROWS, TR_DIM);
  for (size_t i = 0; i < TR_ROWS * TR_DIM; i++)
    if (rows[i] != 2.0f * TR_ROUNDS)
      fail_msg("element %zu is %.9g, expected %d", i, (double)rows[i],
               2 * TR_ROUNDS);
  free(rows);
}

/* ================================================================ async */

enum { AS_ROWS = 64, AS_DIM = 8, AS_STEPS = 12, AS_N = 30, AS_PULL = 80 };

static void test_async_tickets(void **state) {
  fx_t *f = *state;
  embps_table_spec_t s = spec_of("as", AS_DIM, AS_ROWS, EMBPS_OPT_SGD, 0.25,
                                 EMBPS_INIT_UNIFORM, 0.5, 21);
  create(f->c, &s);
  ref_t ref;
  ref_init(&ref, &s);
  int64_t all[AS_ROWS];
  for (int i = 0; i < AS_ROWS; i++)
    all[i] = i;
  ref_learn_from(&ref, f->c, "as", all, AS_ROWS);
  int64_t pull_ids_[AS_PULL];
  for (int k = 0; k < AS_PULL; k++)
    pull_ids_[k] = (AS_ROWS - 1 - k % AS_ROWS);
  static int64_t idx[AS_STEPS][AS_N];
  static float vals[AS_STEPS][AS_N * AS_DIM];
  static float outs[AS_STEPS][AS_PULL * AS_DIM];
  static float want[AS_STEPS][AS_PULL * AS_DIM];
  embps_ticket_t *tickets[2 * AS_STEPS];
  for (int i = 0; i < AS_STEPS; i++) {
    for (int k = 0; k < AS_N; k++) {
      idx[i][k] = (int64_t)(mix((uint64_t)(i * 100 + k)) % 24);
      for (int j = 0; j < AS_DIM; j++)
        vals[i][k * AS_DIM + j] = grad_value(mix((uint64_t)(i * 977 + k * 13 + j)));
    }
    assert_rc(embps_push_async(f->c, "as", idx[i], AS_N, vals[i], AS_DIM,
                               i % 3 == 0 ? EMBPS_PUSH_MERGE : 0,
                               &tickets[2 * i]),
              f->c);
    ref_push(&ref, idx[i], AS_N, vals[i]);
    ref_expect(&ref, pull_ids_, AS_PULL, want[i]);
    assert_rc(embps_pull_async(f->c, "as", pull_ids_, AS_PULL, outs[i], AS_DIM,
                               &tickets[2 * i + 1]),
              f->c);
  }
  /* wait in an order unrelated to the issue order */
  int order[2 * AS_STEPS];
  for (int i = 0; i < 2 * AS_STEPS; i++)
    order[i] = i;
  for (int i = 2 * AS_STEPS - 1; i > 0; i--) {
    int j = (int)(mix((uint64_t)i + 5) % (uint64_t)(i + 1));
    int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  if (order[0] == 0) { /* make sure the first wait is not the first ticket */
    order[0] = order[1];
    order[1] = 0;
  }
  for (int i = 0; i < 2 * AS_STEPS; i++)
    assert_rc(embps_wait(f->c, tickets[order[i]]), f->c);
  for (int i = 0; i < AS_STEPS; i++) {
    char what[64];
    snprintf(what, sizeof what, "pull issued after push %d", i);
    assert_floats(outs[i], want[i], AS_PULL * AS_DIM, 0, what);
  }
  /* pipelined push then pull: waiting for the pull first, it sees the push */
  int64_t pidx[] = {40, 41, 40};
  float pv[3 * AS_DIM];
  fill_values(pv, 3 * AS_DIM, 77);
  float pout[3 * AS_DIM], pwant[3 * AS_DIM];
  embps_ticket_t *tp, *tq;
  assert_rc(embps_push_async(f->c, "as", pidx, 3, pv, AS_DIM, 0, &tp), f->c);
  assert_rc(embps_pull_async(f->c, "as", pidx, 3, pout, AS_DIM, &tq), f->c);
  ref_push(&ref, pidx, 3, pv);
  ref_expect(&ref, pidx, 3, pwant);
  assert_rc(embps_wait(f->c, tq), f->c);
  assert_rc(embps_wait(f->c, tp), f->c);
  assert_floats(pout, pwant, 3 * AS_DIM, 0, "pull pipelined after a push");
  check_dense(f->c, "as", &ref, AS_ROWS, 0, "table after the async pushes");
  ref_free(&ref);
}

/* ================================================================ shutdown */

/* SIGTERM while a big push is on its way: the ticket completes (applied or
 * a connection error, never a hang or a timeout) and the server exits 0. */
static void sigterm_during_push(fx_t *f, int slot, int delay_us) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = f->srv[slot].addr;
  o.timeout_ms = TIMEOUT_MS;
  o.retry_ms = -1; /* the server is not coming back: see the failure */
  embps_client_t *c = NULL;
  assert_int_equal(embps_client_create(&o, &c, NULL, 0), 0);
  const uint32_t dim = 64;
  const size_t n = 150000;
  embps_table_spec_t s = spec_of("big", dim, n, EMBPS_OPT_SGD, 1,
                                 EMBPS_INIT_ZEROS, 0, 0);
  create(c, &s);
  int64_t *idx = xmalloc(n * sizeof *idx);
  float *v = xmalloc(n * dim * sizeof *v);
  for (size_t i = 0; i < n; i++)
    idx[i] = (int64_t)i;
  for (size_t i = 0; i < n * dim; i++)
    v[i] = 0.5f;
  /* a small push first, so the connection is in use */
  assert_rc(embps_push(c, "big", idx, 10, v, dim, 0), c);
  embps_ticket_t *t;
  assert_rc(embps_push_async(c, "big", idx, n, v, dim, 0, &t), c);
  pid_t server = f->srv[slot].pid;
  pid_t killer = -1;
  if (delay_us < 0) {
    kill(server, SIGTERM); /* before a byte of the push is sent */
  } else {
    killer = fork();
    assert_true(killer >= 0);
    if (killer == 0) {
      usleep((useconds_t)delay_us);
      kill(server, SIGTERM);
      _exit(0);
    }
  }
  double t0 = it_now_ms();
  int rc = embps_wait(c, t);
  double waited = it_now_ms() - t0;
  if (killer > 0) {
    int st;
    waitpid(killer, &st, 0);
  }
  if (rc != 0 && rc != EMBPS_ECONN && rc != EMBPS_ESHUTDOWN)
    fail_msg("push in flight at SIGTERM: %s (%s) after %.0f ms",
             embps_err_name(rc), embps_client_last_error(c), waited);
  assert_true(waited < 10000);
  if (getenv("IT_VERBOSE"))
    fprintf(stderr, "  sigterm (delay %d us): push %s after %.1f ms\n",
            delay_us, rc ? embps_err_name(rc) : "applied", waited);
  int code = it_server_wait(&f->srv[slot], 10000);
  if (code != 0)
    fail_msg("server exit status %d after SIGTERM with a request in flight "
             "(push result: %s)", code, embps_err_name(rc));
  embps_client_destroy(c);
  free(idx);
  free(v);
}

/* A fake server, forked: answers the hello, then replies to the next
 * request after reading only its header, and reads nothing more until it
 * is killed, so the client cannot finish sending that request. */
static void fake_early_replier(int lfd) {
  int fd = accept(lfd, NULL, NULL);
  if (fd < 0)
    _exit(2);
  uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
  embps_frame_header_t h;
  if (raw_read(fd, hdr, sizeof hdr, 10000) ||
      embps_frame_header_decode(hdr, 1u << 20, &h))
    _exit(3);
  uint8_t *body = malloc(h.body_len ? h.body_len : 1);
  if (!body || raw_read(fd, body, h.body_len, 10000))
    _exit(4);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.u.hello_reply.version = EMBPS_PROTOCOL_VERSION;
  m.u.hello_reply.cluster_size = 1;
  m.u.hello_reply.max_frame_bytes = 1u << 30;
  m.kind = EMBPS_KIND_HELLO | EMBPS_KIND_REPLY;
  uint8_t *frame;
  size_t len;
  if (embps_frame_build(&m, h.req_id, 0, &frame, &len, NULL) ||
      it_send_full(fd, frame, len))
    _exit(5);
  free(frame);
  if (raw_read(fd, hdr, sizeof hdr, 10000) ||
      embps_frame_header_decode(hdr, 1u << 30, &h))
    _exit(6);
  memset(&m, 0, sizeof m);
  m.kind = (uint16_t)(h.kind | EMBPS_KIND_REPLY);
  if (embps_frame_build(&m, h.req_id, 0, &frame, &len, NULL) ||
      it_send_full(fd, frame, len))
    _exit(7);
  free(frame);
  for (;;)
    pause();
}

/* A push goes out from the caller's arrays; a server that replies before
 * it has read the whole request must not let embps_push() return while
 * the client still has the rest of those arrays queued: the connection
 * fails with EMBPS_EPROTO instead. */
static void test_early_reply_fails_connection(void **state) {
  (void)state;
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(lfd >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(lfd, 1), 0);
  socklen_t al = sizeof a;
  assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    fake_early_replier(lfd);
  close(lfd);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
  embps_client_t *c = connect_ok(addr, NULL);
  /* 72 MB: far more than the socket buffers hold */
  enum { N = 2 << 20, DIM = 7 };
  int64_t *idx = xmalloc((size_t)N * sizeof *idx);
  float *vals = xmalloc((size_t)N * DIM * sizeof *vals);
  for (size_t i = 0; i < N; i++)
    idx[i] = (int64_t)i;
  for (size_t i = 0; i < (size_t)N * DIM; i++)
    vals[i] = 0.25f;
  int rc = embps_push(c, "t", idx, N, vals, DIM, 0);
  if (rc != EMBPS_EPROTO)
    fail_msg("push answered early: got %s: %s", embps_err_name(rc),
             embps_client_last_error(c));
  assert_non_null(strstr(embps_client_last_error(c), "before reading"));
  free(idx);
  free(vals);
  embps_client_destroy(c);
  /* the fake server got as far as its pause(), or it exited with the step
   * that failed */
  int status;
  assert_int_equal(waitpid(pid, &status, WNOHANG), 0);
  kill(pid, SIGKILL);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status));
}

static void test_sigterm_in_flight(void **state) {
  fx_t *f = *state;
  embps_client_destroy(f->c);
  f->c = NULL;
  sigterm_during_push(f, 0, 2000); /* while the frame is being sent */
  start_server(f, 1, NULL);
  sigterm_during_push(f, 1, -1);   /* before it is sent */
  start_server(f, 2, NULL);
  sigterm_during_push(f, 2, 30000); /* probably while it is applied */
}

/* ================================================================ CLI */

static void test_cli_via_harness(void **state) {
  fx_t *f = *state;
  const char *a = f->srv[0].addr;
  it_cli_result_t r;
  const char *create_args[] = {"--servers", a, "create-table", "k", "--dim",
                               "3", "--rows", "10", "--init", "uniform:0.5",
                               "--seed", "3", "--lr", "0.5", NULL};
  if (it_cli_run(&r, create_args) != 0)
    fail_msg("create-table: status %d: %s", r.status, r.err);
  it_cli_result_free(&r);
  const char *push_args[] = {"--servers", a, "push", "k", "--indices", "1,2,1",
                             "--values", "1,2,3,0.5,0.25,-1,1,1,1", NULL};
  if (it_cli_run(&r, push_args) != 0)
    fail_msg("push: status %d: %s", r.status, r.err);
  it_cli_result_free(&r);
  int64_t ids[] = {2, 1, 7, 1};
  float *rows = pull_ids(f->c, "k", ids, 4, 3);
  char want[1024];
  size_t off = 0;
  for (int i = 0; i < 4; i++)
    off += (size_t)snprintf(want + off, sizeof want - off,
                            "%lld\t%.9g %.9g %.9g\n", (long long)ids[i],
                            (double)rows[i * 3], (double)rows[i * 3 + 1],
                            (double)rows[i * 3 + 2]);
  free(rows);
  const char *pull_args[] = {"--servers", a, "pull", "k", "--ids", "2,1,7,1",
                             NULL};
  if (it_cli_run(&r, pull_args) != 0)
    fail_msg("pull: status %d: %s", r.status, r.err);
  assert_string_equal(r.out, want);
  it_cli_result_free(&r);
  const char *bad_args[] = {"--servers", a, "pull", "zz", "--ids", "1", NULL};
  assert_int_not_equal(it_cli_run(&r, bad_args), 0);
  assert_non_null(strstr(r.err, "unknown table \"zz\""));
  assert_non_null(strchr(r.err, '\n'));
  assert_true(strchr(r.err, '\n')[1] == 0); /* one line */
  assert_string_equal(r.out, "");
  it_cli_result_free(&r);
}

/* ================================================================ main */

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  unsetenv("EMBPS_SERVERS");
  unsetenv("EMBPS_TOKEN_FILE");
#define T(f) cmocka_unit_test_setup_teardown(f, setup_one, teardown)
  const struct CMUnitTest tests[] = {
      T(test_exact_duplicates_sgd),
      T(test_exact_duplicates_adagrad),
      T(test_pull_order_and_init),
      T(test_padding_id),
      T(test_dynamic_int64_range),
      T(test_refuse_unknown_table),
      T(test_refuse_wrong_dim),
      T(test_refuse_out_of_range),
      T(test_refuse_count_mismatch),
      T(test_refuse_nonfinite),
      T(test_refuse_table_exists),
      cmocka_unit_test_setup_teardown(test_refuse_oversized_frame,
                                      setup_small_frames, teardown),
      cmocka_unit_test_setup_teardown(test_refuse_oversized_frame_large,
                                      setup_small_frames, teardown),
      T(test_refuse_garbage),
      T(test_refuse_protocol_version),
      T(test_refuse_request_before_hello),
      cmocka_unit_test_setup_teardown(test_auth_token, setup_auth, teardown),
      cmocka_unit_test_setup_teardown(test_two_servers, setup_two, teardown),
      T(test_concurrent_clients),
      T(test_no_torn_rows),
      T(test_async_tickets),
      cmocka_unit_test(test_early_reply_fails_connection),
      T(test_sigterm_in_flight),
      T(test_cli_via_harness),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
