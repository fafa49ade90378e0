/* harness_fixture.c - see harness_fixture.h. */
#include "harness_fixture.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

const char *const it_fx_default_args[] = {"--io-threads", "2", "--shards",
                                          "4", NULL};

void it_fx_start(it_fx_t *f, int slot, const char *const *args) {
  if (it_server_start(&f->srv[slot], args ? args : it_fx_default_args))
    fail_msg("cannot start embps-server (slot %d)", slot);
}

embps_client_t *it_client_try(const char *servers, const char *token,
                              int *rc, char *err, size_t err_len) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = servers;
  o.token = token;
  o.timeout_ms = IT_TIMEOUT_MS;
  embps_client_t *c = NULL;
  *rc = embps_client_create(&o, &c, err, err_len);
  return c;
}

embps_client_t *it_client_ok(const char *servers, const char *token) {
  char err[512];
  int rc;
  embps_client_t *c = it_client_try(servers, token, &rc, err, sizeof err);
  if (rc || !c)
    fail_msg("connect to %s: %s (%s)", servers, err, embps_err_name(rc));
  return c;
}

/* A fixture with one server started with args, and with `connect` a
 * client on it. */
static int setup_with(void **state, const char *const *args, int connect) {
  it_fx_t *f = calloc(1, sizeof *f);
  if (!f)
    return -1;
  *state = f;
  if (it_server_start(&f->srv[0], args))
    return -1;
  if (connect) {
    char err[512];
    int rc;
    f->c = it_client_try(f->srv[0].addr, NULL, &rc, err, sizeof err);
    if (rc) {
      fprintf(stderr, "connect: %s\n", err);
      return -1;
    }
  }
  return 0;
}

int it_fx_setup_one(void **state) {
  return setup_with(state, it_fx_default_args, 1);
}

int it_fx_setup_small_frames(void **state) {
  static const char *const args[] = {"--max-frame-bytes", "4096", NULL};
  return setup_with(state, args, 1);
}

int it_fx_setup_auth(void **state) {
  it_fx_t *f = calloc(1, sizeof *f);
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

int it_fx_setup_two(void **state) {
  it_fx_t *f = calloc(1, sizeof *f);
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
  f->c = it_client_try(servers, NULL, &rc, err, sizeof err);
  if (rc) {
    fprintf(stderr, "connect: %s\n", err);
    return -1;
  }
  return 0;
}

int it_fx_teardown(void **state) {
  it_fx_t *f = *state;
  if (!f)
    return 0;
  embps_client_destroy(f->c);
  int bad = 0;
  for (int i = 0; i < IT_FX_MAX_SRV; i++) {
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

/* ------------------------------------------------------------ helpers */

void *it_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  assert_non_null(p);
  return p;
}

float it_grad_value(uint64_t h) {
  int k = (int)(h % 512) - 256;
  return (float)(k ? k : 1) / 64.0f;
}

void it_fill_values(float *v, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; i++)
    v[i] = it_grad_value(rng_mix(seed + i));
}

embps_table_spec_t it_spec(const char *name, uint32_t dim, uint64_t rows,
                           embps_optimizer_t opt, double lr,
                           embps_init_t init, double init_v, uint64_t seed) {
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

void it_create(embps_client_t *c, const embps_table_spec_t *s) {
  assert_rc(embps_create_table(c, s), c);
}

float *it_pull_ids(embps_client_t *c, const char *table, const int64_t *ids,
                   size_t n, uint32_t dim) {
  float *out = it_xmalloc(n * dim * sizeof *out);
  assert_rc(embps_pull(c, table, ids, n, out, dim), c);
  return out;
}

float *it_pull_all(embps_client_t *c, const char *table, uint64_t rows,
                   uint32_t dim) {
  int64_t *ids = it_xmalloc(rows * sizeof *ids);
  for (uint64_t i = 0; i < rows; i++)
    ids[i] = (int64_t)i;
  float *out = it_pull_ids(c, table, ids, rows, dim);
  free(ids);
  return out;
}

uint64_t it_rows_allocated(embps_client_t *c, const char *table) {
  embps_table_info_t info;
  assert_rc(embps_describe_table(c, table, &info), c);
  return info.rows_allocated;
}

void it_assert_floats(const float *got, const float *want, size_t n,
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

uint64_t it_stat(embps_client_t *c, size_t field) {
  embps_server_stats_t *st;
  size_t n;
  assert_rc(embps_stats(c, &st, &n), c);
  assert_true(n >= 1 && field + sizeof(uint64_t) <= sizeof *st);
  uint64_t v;
  memcpy(&v, (const char *)&st[0] + field, sizeof v);
  embps_stats_free(st, n);
  return v;
}

uint64_t it_stat_wait(embps_client_t *c, size_t field, uint64_t lo,
                      uint64_t hi, int timeout_ms, const char *what) {
  double deadline = it_now_ms() + timeout_ms;
  for (;;) {
    uint64_t v = it_stat(c, field);
    if (v >= lo && v <= hi)
      return v;
    if (it_now_ms() > deadline)
      fail_msg("%s: still %llu after %d ms, want [%llu, %llu]", what,
               (unsigned long long)v, timeout_ms, (unsigned long long)lo,
               (unsigned long long)hi);
    it_sleep_ms(2);
  }
}
