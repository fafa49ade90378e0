/* test_values.c - the values real servers serve (integration.values):
 * pushes with duplicate ids merged by the server, by the client
 * (EMBPS_PUSH_MERGE) and by hand give the same rows, equal to a reference
 * model (SGD bit for bit, Adagrad to float rounding); pulls come back in
 * request order with duplicates expanded, deterministic initial rows that
 * do not depend on the shard count or a restart, and allocate nothing; a
 * padding id reads zeros and is never updated; a dynamic table takes ids
 * across the whole int64 range; rows written into a table with admission
 * are all kept; the CLI prints what the library pulls.
 * Servers and helpers: harness_fixture.h, harness_model.h. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness_model.h"

/* Three identical tables get the same gradients three ways: with duplicates
 * (merged by the server), with EMBPS_PUSH_MERGE (merged by the client) and
 * pre-merged by the test. All three must be identical, and equal to the
 * reference. */
static void exact_duplicates(it_fx_t *f, embps_optimizer_t opt, double lr,
                             double tol) {
  const uint32_t dim = 8;
  const uint64_t rows = 64;
  const char *names[3] = {"dup", "merged", "premerged"};
  embps_table_spec_t s[3];
  for (int t = 0; t < 3; t++) {
    s[t] = it_spec(names[t], dim, rows, opt, lr, EMBPS_INIT_UNIFORM, 0.5, 99);
    if (opt == EMBPS_OPT_ADAGRAD)
      s[t].initial_accumulator = 0.1;
    it_create(f->c, &s[t]);
  }
  it_ref_t ref;
  it_ref_init(&ref, &s[0]);
  float *init0 = it_pull_all(f->c, "dup", rows, dim);
  for (int t = 1; t < 3; t++) {
    float *x = it_pull_all(f->c, names[t], rows, dim);
    assert_memory_equal(x, init0, rows * dim * sizeof(float));
    free(x);
  }
  int64_t *all = it_xmalloc(rows * sizeof *all);
  for (uint64_t i = 0; i < rows; i++)
    all[i] = (int64_t)i;
  it_ref_learn(&ref, all, rows, init0);
  assert_int_equal(it_rows_allocated(f->c, "dup"), 0);

  enum { N = 48 };
  int64_t idx[N], midx[N];
  float vals[N * 8], mvals[N * 8];
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < N; i++) {
      uint64_t h = rng_mix((uint64_t)(round * 1000 + i));
      idx[i] = (int64_t)(h % 20); /* 48 draws over 20 rows: many repeats */
      if (i % 7 == 3)
        idx[i] = 5; /* row 5 appears many times */
      for (uint32_t j = 0; j < dim; j++)
        vals[i * dim + j] = it_grad_value(rng_mix(h + j));
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
    it_ref_push(&ref, idx, N, vals);
  }
  float *got[3];
  for (int t = 0; t < 3; t++)
    got[t] = it_pull_all(f->c, names[t], rows, dim);
  it_assert_floats(got[1], got[0], rows * dim, 0,
                   "EMBPS_PUSH_MERGE push vs push with duplicates");
  it_assert_floats(got[2], got[0], rows * dim, 0,
                   "pre-merged push vs push with duplicates");
  it_assert_floats(got[0], ref.w, rows * dim, tol,
                   "table vs reference (duplicates summed, one step per push)");
  /* something really changed, and rows never pushed kept their init */
  assert_true(memcmp(got[0], init0, rows * dim * sizeof(float)) != 0);
  assert_memory_equal(got[0] + 40 * dim, init0 + 40 * dim,
                      dim * sizeof(float));
  for (int t = 0; t < 3; t++) {
    assert_int_equal(it_rows_allocated(f->c, names[t]), it_ref_touched(&ref));
    free(got[t]);
  }
  free(init0);
  free(all);
  it_ref_free(&ref);
}

static void test_exact_duplicates_sgd(void **state) {
  exact_duplicates(*state, EMBPS_OPT_SGD, 0.25, 0);
}

static void test_exact_duplicates_adagrad(void **state) {
  /* sqrt and division: the same float expression as the contract, so equal
   * up to float rounding (PyTorch's formula, relative 1e-6). */
  exact_duplicates(*state, EMBPS_OPT_ADAGRAD, 0.1, 1e-6);
}

static void test_pull_order_and_init(void **state) {
  it_fx_t *f = *state;
  static const char *const one_shard[] = {"--shards", "1", NULL};
  static const char *const seven[] = {"--shards", "7", "--io-threads", "1",
                                      NULL};
  it_fx_start(f, 1, one_shard);
  it_fx_start(f, 2, seven);
  embps_client_t *c1 = it_client_ok(f->srv[1].addr, NULL);
  embps_client_t *c2 = it_client_ok(f->srv[2].addr, NULL);
  embps_client_t *cs[3] = {f->c, c1, c2};
  const uint32_t dim = 16;
  embps_table_spec_t su = it_spec("u", dim, 1000, EMBPS_OPT_SGD, 0.5,
                                  EMBPS_INIT_UNIFORM, 0.1, 1234);
  embps_table_spec_t sn = it_spec("n", dim, 0, EMBPS_OPT_SGD, 0.5,
                                  EMBPS_INIT_NORMAL, 1.0, 77);
  for (int i = 0; i < 3; i++) {
    it_create(cs[i], &su);
    it_create(cs[i], &sn);
  }
  static const int64_t uid[] = {999, 0, 5, 5, 123, 0, 999, 500, 5};
  static const int64_t nid[] = {INT64_MIN, -5, 0, 7, 7, 1LL << 40, INT64_MAX,
                                -5};
  const size_t nu = sizeof uid / sizeof *uid, nn = sizeof nid / sizeof *nid;
  float *u[3], *n[3];
  for (int i = 0; i < 3; i++) {
    u[i] = it_pull_ids(cs[i], "u", uid, nu, dim);
    n[i] = it_pull_ids(cs[i], "n", nid, nn, dim);
  }
  /* the same on 4, 1 and 7 shards */
  for (int i = 1; i < 3; i++) {
    assert_memory_equal(u[i], u[0], nu * dim * sizeof(float));
    assert_memory_equal(n[i], n[0], nn * dim * sizeof(float));
  }
  /* request order, duplicates expanded: each row is the row of its id */
  for (size_t k = 0; k < nu; k++) {
    float *one = it_pull_ids(f->c, "u", &uid[k], 1, dim);
    assert_memory_equal(u[0] + k * dim, one, dim * sizeof(float));
    free(one);
    for (uint32_t j = 0; j < dim; j++)
      assert_true(fabsf(u[0][k * dim + j]) <= 0.1f);
  }
  for (size_t k = 0; k < nn; k++) {
    float *one = it_pull_ids(f->c, "n", &nid[k], 1, dim);
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
  it_create(f->c, &su2);
  float *u2 = it_pull_ids(f->c, "u2", uid, nu, dim);
  assert_true(memcmp(u2, u[0], nu * dim * sizeof(float)) != 0);
  free(u2);
  /* pulls allocate nothing */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(it_rows_allocated(cs[i], "u"), 0);
    assert_int_equal(it_rows_allocated(cs[i], "n"), 0);
  }
  /* after a restart, the same rows */
  embps_client_destroy(c1);
  assert_int_equal(it_server_stop(&f->srv[1]), 0);
  it_fx_start(f, 1, one_shard);
  c1 = it_client_ok(f->srv[1].addr, NULL);
  it_create(c1, &su);
  it_create(c1, &sn);
  float *ur = it_pull_ids(c1, "u", uid, nu, dim);
  float *nr = it_pull_ids(c1, "n", nid, nn, dim);
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
  assert_int_equal(it_rows_allocated(f->c, "u"), 2);
  int64_t nidx[] = {-5, INT64_MAX};
  assert_rc(embps_push(f->c, "n", nidx, 2, pv, dim, 0), f->c);
  assert_int_equal(it_rows_allocated(f->c, "n"), 2);
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
  float *after = it_pull_ids(f->c, "u", uid, nu, dim);
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

static void test_padding_id(void **state) {
  it_fx_t *f = *state;
  const uint32_t dim = 4;
  embps_table_spec_t s = it_spec("p", dim, 20, EMBPS_OPT_SGD, 1.0,
                                 EMBPS_INIT_CONSTANT, 0.5, 1);
  s.has_padding = 1;
  s.padding_id = 7;
  it_create(f->c, &s);
  int64_t ids[] = {7, 1, 7, 3};
  float *r = it_pull_ids(f->c, "p", ids, 4, dim);
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
  r = it_pull_ids(f->c, "p", ids, 4, dim);
  for (uint32_t j = 0; j < dim; j++) {
    assert_true(r[0 * dim + j] == 0.0f);
    assert_true(r[1 * dim + j] == -0.5f);
    assert_true(r[2 * dim + j] == 0.0f);
    assert_true(r[3 * dim + j] == 0.5f);
  }
  free(r);
  assert_int_equal(it_rows_allocated(f->c, "p"), 1);

  /* dynamic table, negative padding id */
  embps_table_spec_t d = it_spec("pd", dim, 0, EMBPS_OPT_SGD, 1.0,
                                 EMBPS_INIT_UNIFORM, 1.0, 3);
  d.has_padding = 1;
  d.padding_id = -1;
  it_create(f->c, &d);
  int64_t dids[] = {-1, 42};
  r = it_pull_ids(f->c, "pd", dids, 2, dim);
  int nonzero = 0;
  for (uint32_t j = 0; j < dim; j++) {
    assert_true(r[j] == 0.0f);
    nonzero += r[dim + j] != 0.0f;
  }
  assert_true(nonzero > 0);
  free(r);
  int64_t pads[] = {-1, -1};
  assert_rc(embps_push(f->c, "pd", pads, 2, pv, dim, 0), f->c);
  assert_int_equal(it_rows_allocated(f->c, "pd"), 0);
  r = it_pull_ids(f->c, "pd", pads, 1, dim);
  for (uint32_t j = 0; j < dim; j++)
    assert_true(r[j] == 0.0f);
  free(r);
}

static void test_dynamic_int64_range(void **state) {
  it_fx_t *f = *state;
  const uint32_t dim = 4;
  embps_table_spec_t s = it_spec("d", dim, 0, EMBPS_OPT_SGD, 0.5,
                                 EMBPS_INIT_UNIFORM, 0.25, 5);
  it_create(f->c, &s);
  enum { NSPECIAL = 11, NRAND = 3000 };
  static const int64_t special[NSPECIAL] = {
      INT64_MIN, INT64_MIN + 1, -4294967296LL, -65536, -1, 0, 1,
      4294967296LL, 1LL << 62, INT64_MAX - 1, INT64_MAX};
  size_t n = NSPECIAL + NRAND;
  int64_t *ids = it_xmalloc(n * sizeof *ids);
  memcpy(ids, special, sizeof special);
  for (size_t i = 0; i < NRAND; i++)
    ids[NSPECIAL + i] = (int64_t)rng_mix(0xabcdef + i);
  it_ref_t ref;
  it_ref_init(&ref, &s);
  it_ref_learn_from(&ref, f->c, "d", ids, n);
  assert_int_equal(it_rows_allocated(f->c, "d"), 0);
  /* the special ids, each three times, in one push */
  int64_t sp[3 * NSPECIAL];
  float spv[3 * NSPECIAL * 4];
  for (size_t i = 0; i < 3 * NSPECIAL; i++) {
    sp[i] = special[(i * 5) % NSPECIAL];
    for (uint32_t j = 0; j < dim; j++)
      spv[i * dim + j] = it_grad_value(rng_mix(i * 31 + j));
  }
  assert_rc(embps_push(f->c, "d", sp, 3 * NSPECIAL, spv, dim, 0), f->c);
  it_ref_push(&ref, sp, 3 * NSPECIAL, spv);
  /* the random ids in three pushes, with repeats */
  size_t bn = 1500;
  int64_t *bi = it_xmalloc(bn * sizeof *bi);
  float *bv = it_xmalloc(bn * dim * sizeof *bv);
  for (int b = 0; b < 3; b++) {
    for (size_t i = 0; i < bn; i++) {
      bi[i] = ids[NSPECIAL + (rng_mix((uint64_t)b * 7919 + i) % NRAND)];
      for (uint32_t j = 0; j < dim; j++)
        bv[i * dim + j] = it_grad_value(rng_mix(i * 131 + j + (uint64_t)b));
    }
    assert_rc(embps_push(f->c, "d", bi, bn, bv, dim, 0), f->c);
    it_ref_push(&ref, bi, bn, bv);
  }
  /* pull everything, reversed */
  for (size_t i = 0; i < n / 2; i++) {
    int64_t t = ids[i];
    ids[i] = ids[n - 1 - i];
    ids[n - 1 - i] = t;
  }
  it_check_rows(f->c, "d", &ref, ids, n, 0, "dynamic table across int64");
  assert_int_equal(it_rows_allocated(f->c, "d"), it_ref_touched(&ref));
  assert_true(it_ref_touched(&ref) > NSPECIAL + 1000);
  free(bi);
  free(bv);
  free(ids);
  it_ref_free(&ref);
}

/* Writing rows (embps_write_rows, what `embps import` sends) into a
 * dynamic table with admission writes every row, admitted or not, as a
 * restore does: the rows read back as written and are allocated, a push
 * then applies to them, and with --data-dir the log replays them. (The
 * dispatch fuzz target found the server aborting here: rows not admitted
 * were inserted without room made.) */
static void test_write_rows_with_admission(void **state) {
  it_fx_t *f = *state;
  const uint32_t dim = 4;
  enum { N = 64 };
  int64_t ids[N];
  float w[N * 4], g[N * 4];
  for (size_t i = 0; i < N; i++)
    ids[i] = (int64_t)(rng_mix(i + 91) % 2000000) - 1000000;
  it_fill_values(w, N * dim, 17);
  it_fill_values(g, N * dim, 29);
  for (int k = 0; k < 2; k++) {
    const char *name = k ? "by_probability" : "after_two";
    embps_table_spec_t s = it_spec(name, dim, 0, EMBPS_OPT_SGD, 1.0,
                                   EMBPS_INIT_ZEROS, 0, 3);
    if (k)
      s.admit_probability = 0.01;
    else
      s.admit_after = 2;
    it_create(f->c, &s);
    assert_rc(embps_write_rows(f->c, name, ids, N, w, dim, NULL, 0, 0), f->c);
    assert_int_equal(it_rows_allocated(f->c, name), N);
    float *got = it_pull_ids(f->c, name, ids, N, dim);
    it_assert_floats(got, w, N * dim, 0, "rows written with admission on");
    free(got);
    assert_rc(embps_push(f->c, name, ids, N, g, dim, 0), f->c);
    got = it_pull_ids(f->c, name, ids, N, dim);
    for (size_t i = 0; i < N * dim; i++)
      if (got[i] != w[i] - g[i])
        fail_msg("%s: element %zu is %.9g after a push, expected %.9g", name,
                 i, (double)got[i], (double)(w[i] - g[i]));
    free(got);
  }
  /* with --data-dir the write is logged: replayed after kill -9 */
  char dir[] = "/tmp/embps-it-rows-XXXXXX";
  assert_non_null(mkdtemp(dir));
  const char *durable[] = {"--data-dir", dir, NULL};
  embps_table_spec_t s = it_spec("after_two", dim, 0, EMBPS_OPT_SGD, 1.0,
                                 EMBPS_INIT_ZEROS, 0, 3);
  s.admit_after = 2;
  for (int start = 0; start < 2; start++) {
    it_fx_start(f, 1, durable);
    embps_client_t *c = it_client_ok(f->srv[1].addr, NULL);
    if (!start) {
      it_create(c, &s);
      assert_rc(embps_write_rows(c, "after_two", ids, N, w, dim, NULL, 0, 0),
                c);
    }
    float *got = it_pull_ids(c, "after_two", ids, N, dim);
    it_assert_floats(got, w, N * dim, 0,
                     start ? "rows written, after kill -9 and a restart"
                           : "rows written with --data-dir");
    free(got);
    embps_client_destroy(c);
    if (start)
      assert_int_equal(it_server_stop(&f->srv[1]), 0);
    else
      it_server_kill(&f->srv[1]);
  }
  char cmd[64];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_cli_via_harness(void **state) {
  it_fx_t *f = *state;
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
  float *rows = it_pull_ids(f->c, "k", ids, 4, 3);
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

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  unsetenv("EMBPS_SERVERS");
  unsetenv("EMBPS_TOKEN_FILE");
#define T(f) cmocka_unit_test_setup_teardown(f, it_fx_setup_one, it_fx_teardown)
  const struct CMUnitTest tests[] = {
      T(test_exact_duplicates_sgd),
      T(test_exact_duplicates_adagrad),
      T(test_pull_order_and_init),
      T(test_padding_id),
      T(test_dynamic_int64_range),
      T(test_write_rows_with_admission),
      T(test_cli_via_harness),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
