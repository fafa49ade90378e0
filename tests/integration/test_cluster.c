/* test_cluster.c - a cluster of two real servers (integration.cluster):
 * ids route to their owner (embps_route), initial rows do not depend on
 * the server count, pushes of many ids with repeats equal the reference
 * model, each server holds only its own rows, a client's reused pull
 * buffers read what a fresh client reads, a client with a wrong view of
 * the cluster is refused, a server refuses rows it does not own, and a
 * push one server would refuse is refused by the whole cluster. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness_raw.h"

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
  int64_t *ids_b = it_xmalloc(NB * sizeof *ids_b);
  int64_t *ids_a = it_xmalloc(3 * NB * sizeof *ids_a);
  for (size_t i = 0; i < NB; i++)
    ids_b[i] = (int64_t)(rng_mix(i + 777) % 2000000000000ULL) - 1000000000000LL;
  for (size_t i = 0; i < 3 * NB; i++)
    ids_a[i] = ids_b[rng_mix(i) % FEW];
  float *want = it_pull_ids(fresh, table, ids_b, NB, dim);
  for (int round = 0; round < 3; round++) {
    float *a = it_pull_ids(c, table, ids_a, 3 * NB, dim);
    for (size_t i = 0; i < 3 * NB; i++)
      assert_memory_equal(a + i * dim, want + (rng_mix(i) % FEW) * dim,
                          dim * sizeof *a);
    free(a);
    float *b = it_pull_ids(c, table, ids_b, NB, dim);
    assert_memory_equal(b, want, (size_t)NB * dim * sizeof *b);
    free(b);
  }
  free(want);
  free(ids_a);
  free(ids_b);
}

static void test_two_servers(void **state) {
  it_fx_t *f = *state;
  assert_int_equal(embps_client_n_servers(f->c), 2);
  const uint32_t dim = 4;
  embps_table_spec_t s = it_spec("c", dim, 0, EMBPS_OPT_SGD, 0.5,
                                 EMBPS_INIT_UNIFORM, 0.5, 31);
  it_create(f->c, &s);
  enum { POOL = 2000 };
  int64_t *pool = it_xmalloc(POOL * sizeof *pool);
  for (int i = 0; i < POOL; i++)
    pool[i] = (int64_t)(rng_mix((uint64_t)i + 4242) % 2000000000000ULL) -
              1000000000000LL;
  it_ref_t ref;
  it_ref_init(&ref, &s);
  it_ref_learn_from(&ref, f->c, "c", pool, POOL);
  /* both servers own some of the pool */
  int owned[2] = {0, 0};
  for (int i = 0; i < POOL; i++)
    owned[embps_route(pool[i], 2)]++;
  assert_true(owned[0] > 500 && owned[1] > 500);
  /* initial rows do not depend on the server count */
  embps_client_t *solo_c;
  it_server_t *solo = &f->srv[2];
  it_fx_start(f, 2, NULL);
  solo_c = it_client_ok(solo->addr, NULL);
  it_create(solo_c, &s);
  float *solo_rows = it_pull_ids(solo_c, "c", pool, POOL, dim);
  assert_memory_equal(solo_rows, ref.w, POOL * dim * sizeof(float));
  free(solo_rows);
  embps_client_destroy(solo_c);
  /* pushes of many ids, with repeats; only ids from the first 1500 of the
   * pool are pushed */
  size_t bn = 2500;
  int64_t *bi = it_xmalloc(bn * sizeof *bi);
  float *bv = it_xmalloc(bn * dim * sizeof *bv);
  for (int b = 0; b < 3; b++) {
    for (size_t i = 0; i < bn; i++) {
      bi[i] = pool[rng_mix(i * 3 + (uint64_t)b * 100003) % 1500];
      for (uint32_t j = 0; j < dim; j++)
        bv[i * dim + j] = it_grad_value(rng_mix(i + j * 7 + (uint64_t)b));
    }
    assert_rc(embps_push(f->c, "c", bi, bn, bv, dim,
                         b == 1 ? EMBPS_PUSH_MERGE : 0), f->c);
    it_ref_push(&ref, bi, bn, bv);
  }
  it_check_rows(f->c, "c", &ref, pool, POOL, 0,
                "two servers: pull of the pool");
  {
    char both[80];
    snprintf(both, sizeof both, "%s,%s", f->srv[0].addr, f->srv[1].addr);
    embps_client_t *c2 = it_client_ok(both, NULL);
    embps_client_t *fresh = it_client_ok(both, NULL);
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
  assert_int_equal(r0 + r1, it_ref_touched(&ref));
  assert_int_equal(it_rows_allocated(f->c, "c"), it_ref_touched(&ref));

  /* a client that takes server 1 for a 1-server cluster is refused */
  char err[512];
  int rc;
  embps_client_t *bad =
      it_client_try(f->srv[1].addr, NULL, &rc, err, sizeof err);
  assert_null(bad);
  if (rc != EMBPS_EWRONGSERVER)
    fail_msg("1-server view of server 1: got %s: %s", embps_err_name(rc), err);
  char swapped[80];
  snprintf(swapped, sizeof swapped, "%s,%s", f->srv[1].addr, f->srv[0].addr);
  bad = it_client_try(swapped, NULL, &rc, err, sizeof err);
  assert_null(bad);
  assert_int_equal(rc, EMBPS_EWRONGSERVER);

  /* a raw push to server 0 of an id server 1 owns is refused */
  int64_t foreign = 0;
  for (int i = 0; i < 1500; i++)
    if (embps_route(pool[i], 2) == 1) {
      foreign = pool[i];
      break;
    }
  int fd = it_raw_connect(f->srv[0].port);
  it_raw_hello(fd, NULL, 1);
  uint8_t bulk[8 + 4 * 4];
  memcpy(bulk, &foreign, 8);
  float g[4] = {1, 1, 1, 1};
  memcpy(bulk + 8, g, sizeof g);
  it_raw_push(fd, 2, "c", 1, dim, bulk, sizeof bulk);
  it_raw_expect_error(fd, 2, EMBPS_EWRONGSERVER, "belongs to server 1");
  it_raw_pull(fd, 3, "c", 1, dim, &foreign, 1);
  it_raw_expect_error(fd, 3, EMBPS_EWRONGSERVER, "belongs to server 1");
  close(fd);
  it_check_rows(f->c, "c", &ref, &foreign, 1, 0, "row refused by server 0");
  assert_int_equal(it_rows_allocated(f->c, "c"), it_ref_touched(&ref));

  /* a push with one bad index is refused by the whole cluster */
  embps_table_spec_t sd = it_spec("cd", dim, 100, EMBPS_OPT_SGD, 1,
                                  EMBPS_INIT_CONSTANT, 1, 0);
  it_create(f->c, &sd);
  int64_t idx[101];
  float *v = it_xmalloc(101 * dim * sizeof *v);
  for (int i = 0; i < 101; i++)
    idx[i] = i;
  it_fill_values(v, 101 * dim, 9);
  assert_err(embps_push(f->c, "cd", idx, 101, v, dim, 0), f->c, EMBPS_ERANGE,
             "index 100 out of range [0, 100)");
  v[50 * dim] = NAN;
  assert_err(embps_push(f->c, "cd", idx, 100, v, dim, 0), f->c,
             EMBPS_ENONFINITE, "non-finite");
  assert_int_equal(it_rows_allocated(f->c, "cd"), 0);
  float *rows = it_pull_all(f->c, "cd", 100, dim);
  for (size_t i = 0; i < 100 * dim; i++)
    assert_true(rows[i] == 1.0f);
  free(rows);
  free(v);
  free(bi);
  free(bv);
  free(pool);
  it_ref_free(&ref);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  unsetenv("EMBPS_SERVERS");
  unsetenv("EMBPS_TOKEN_FILE");
#define T(f) cmocka_unit_test_setup_teardown(f, it_fx_setup_one, it_fx_teardown)
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_two_servers, it_fx_setup_two,
                                      it_fx_teardown),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
