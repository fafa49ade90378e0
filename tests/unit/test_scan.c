/* test_scan.c - unit tests of export and import in row storage
 * (embps_table_scan in server/table_io.c, embps_table_write_rows in
 * server/table.c): a scan in small chunks visits every materialised row
 * exactly once, dense (array) and dynamic (hashed), 1 and 7 shards, with
 * the weights gather gives and the optimizer state; f16 rows widen
 * exactly and write back unchanged; written rows and state read back, and
 * without state the state is the initial one; a cursor the table never
 * gave is refused; a dense table's shard snapshot (table_io.c's batched
 * walk of the row bitmap) holds exactly the shard's rows in id order, as
 * a naive walk of every id finds them. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "embps/embps.h"
#include "route.h"
#include "table.h"

#define DIM 5
#define N 300

static embps_table_t *make(int dynamic, uint32_t shards, embps_dtype_t dt) {
  embps_table_spec_t s;
  embps_table_spec_init(&s, "t", DIM, EMBPS_OPT_ADAM);
  s.init = EMBPS_INIT_UNIFORM;
  s.init_value = 0.5;
  s.dtype = dt;
  if (dynamic)
    s.dynamic = 1;
  else
    s.rows = 100000;
  assert_int_equal(embps_table_spec_check(&s, NULL, 0), 0);
  embps_table_t *t;
  assert_int_equal(embps_table_create(&s, shards, 1, &t), 0);
  return t;
}

/* Pushes N distinct ids (dense: in range) twice; fills ids. */
static void train(embps_table_t *t, int64_t *ids, int dynamic) {
  embps_table_scratch_t s;
  embps_table_scratch_init(&s);
  float *g = malloc(N * DIM * sizeof *g);
  for (int i = 0; i < N; i++) {
    ids[i] = dynamic ? (int64_t)(i * 0x9e3779b97f4a7c15ULL) : i * 311;
    for (int j = 0; j < DIM; j++)
      g[i * DIM + j] = (float)(i % 7) - 3.0f + 0.25f * (float)j;
  }
  assert_int_equal(embps_table_apply(t, &s, ids, g, N, 0), 0);
  assert_int_equal(embps_table_apply(t, &s, ids, g, N / 2, 0), 0);
  free(g);
  embps_table_scratch_close(&s);
}

/* Scans the whole table in chunks of `chunk` rows. */
static size_t scan_all(embps_table_t *t, size_t chunk, int64_t *ids,
                       float *w, float *st) {
  uint64_t cursor = 0;
  size_t total = 0;
  int done = 0, calls = 0;
  while (!done) {
    size_t n;
    assert_int_equal(embps_table_scan(t, &cursor, chunk, ids + total,
                                      w + total * DIM,
                                      st ? st + total * 2 * DIM : NULL, &n,
                                      &done), 0);
    assert_true(n <= chunk);
    total += n;
    assert_true(total <= N);
    assert_true(++calls < 10 * N);
  }
  return total;
}

static int cmp64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static void check_scan(int dynamic, uint32_t shards, embps_dtype_t dt) {
  embps_table_t *t = make(dynamic, shards, dt);
  int64_t ids[N], got[N], sorted[N];
  float *w = malloc(N * DIM * sizeof *w), *pw = malloc(N * DIM * sizeof *pw);
  float *st = malloc(N * 2 * DIM * sizeof *st);
  train(t, ids, dynamic);
  size_t n = scan_all(t, 7, got, w, st);
  assert_int_equal(n, N);
  memcpy(sorted, got, sizeof got);
  qsort(sorted, N, sizeof *sorted, cmp64);
  int64_t want[N];
  memcpy(want, ids, sizeof ids);
  qsort(want, N, sizeof *want, cmp64);
  assert_memory_equal(sorted, want, sizeof want); /* each row once */
  embps_table_gather(t, got, N, pw);
  assert_memory_equal(w, pw, N * DIM * sizeof *w);
  for (size_t i = 0; i < N; i++) /* adam m and v moved (g[1] != 0) */
    assert_true(st[i * 2 * DIM + 1] != 0 && st[i * 2 * DIM + DIM + 1] > 0);

  /* write the scanned rows into a fresh table of another shard count:
   * it scans to the same rows and state */
  embps_table_t *u = make(dynamic, shards == 1 ? 7 : 1, dt);
  embps_table_scratch_t s;
  embps_table_scratch_init(&s);
  assert_int_equal(embps_table_prepare(u, &s, got, N, 0), 0);
  embps_table_write_rows(u, &s, got, w, st, 0, NULL);
  float *w2 = malloc(N * DIM * sizeof *w2), *st2 = malloc(N * 2 * DIM * 4);
  int64_t got2[N];
  embps_table_gather(u, got, N, w2);
  assert_memory_equal(w2, w, N * DIM * sizeof *w);
  assert_int_equal(scan_all(u, 1000, got2, w2, st2), N);
  for (size_t i = 0; i < N; i++) {
    size_t j = 0;
    while (got[j] != got2[i])
      j++;
    assert_memory_equal(st2 + i * 2 * DIM, st + j * 2 * DIM, 2 * DIM * 4);
  }
  /* without state: the initial state (adam: zeros), weights as given */
  assert_int_equal(embps_table_prepare(u, &s, got, 10, 0), 0);
  embps_table_write_rows(u, &s, got, w, NULL, 0, NULL);
  assert_int_equal(scan_all(u, 1000, got2, w2, st2), N);
  for (size_t i = 0; i < N; i++) {
    int reset = 0;
    for (size_t j = 0; j < 10; j++)
      reset |= got[j] == got2[i];
    if (reset)
      for (size_t k = 0; k < 2 * DIM; k++)
        assert_true(st2[i * 2 * DIM + k] == 0);
  }
  uint64_t bad = (uint64_t)(shards + 1) << 48;
  size_t m;
  int done;
  assert_int_equal(embps_table_scan(t, &bad, 1, got, w, NULL, &m, &done),
                   EMBPS_EINVAL);
  embps_table_scratch_close(&s);
  embps_table_unref(t);
  embps_table_unref(u);
  free(w);
  free(pw);
  free(st);
  free(w2);
  free(st2);
}

static void test_dense(void **state) {
  (void)state;
  check_scan(0, 1, EMBPS_DTYPE_F32);
  check_scan(0, 7, EMBPS_DTYPE_F32);
}

static void test_dynamic(void **state) {
  (void)state;
  check_scan(1, 1, EMBPS_DTYPE_F32);
  check_scan(1, 7, EMBPS_DTYPE_F32);
}

static void test_f16(void **state) {
  (void)state;
  check_scan(1, 3, EMBPS_DTYPE_F16);
  check_scan(0, 3, EMBPS_DTYPE_BF16);
}

/* Every shard's snapshot of dense table t (blocks of 37 records) against
 * a naive walk over every id: exactly the ids live[] marks of the shard,
 * in id order, each record the id then the weights gather gives. */
static void check_dense_shards(embps_table_t *t, const char *live,
                               uint64_t rows) {
  const size_t fr = embps_table_file_record_bytes(t);
  const uint32_t S = embps_table_n_shards(t);
  for (uint32_t k = 0; k < S; k++) {
    int64_t *want = malloc(rows * sizeof *want);
    size_t n_want = 0, at = 0;
    for (uint64_t id = 0; id < rows; id++)
      if (live[id] && embps_route_shard((int64_t)id, S) == k)
        want[n_want++] = (int64_t)id;
    embps_table_blocks_t b = {.per = 37, .room = 16};
    uint64_t lsn, held;
    size_t state_bytes = 0;
    assert_int_equal(embps_table_snapshot_shard(t, k, &b, &lsn, NULL,
                                                &state_bytes, &held), 0);
    for (size_t i = 0; i < b.n; i++) {
      assert_true(b.rows[i] == b.per || i + 1 == b.n);
      for (size_t r = 0; r < b.rows[i]; r++, at++) {
        const unsigned char *rec = b.buf[i] + b.room + r * fr;
        int64_t id;
        float w[DIM];
        memcpy(&id, rec, sizeof id);
        assert_true(at < n_want);
        assert_int_equal(id, want[at]);
        embps_table_gather(t, &id, 1, w);
        assert_memory_equal(rec + 8, w, sizeof w);
      }
    }
    assert_int_equal(at, n_want);
    embps_table_blocks_close(&b);
    free(want);
  }
}

static void test_dense_snapshot(void **state) {
  (void)state;
  for (uint32_t shards = 1; shards <= 7; shards += 6) {
    embps_table_t *t = make(0, shards, EMBPS_DTYPE_F32);
    char *live = calloc(100000, 1);
    int64_t ids[N];
    train(t, ids, 0); /* scattered rows: at most one per bitmap word */
    for (int i = 0; i < N; i++)
      live[ids[i]] = 1;
    /* and a run of consecutive rows: many per word, so the walk's
     * batches fill inside one word */
    int64_t run[2000];
    float *g = calloc(2000 * DIM, sizeof *g);
    for (int i = 0; i < 2000; i++)
      live[run[i] = 40000 + i] = 1;
    embps_table_scratch_t s;
    embps_table_scratch_init(&s);
    assert_int_equal(embps_table_apply(t, &s, run, g, 2000, 0), 0);
    embps_table_scratch_close(&s);
    check_dense_shards(t, live, 100000);
    free(g);
    free(live);
    embps_table_unref(t);
  }
}

static void test_empty(void **state) {
  (void)state;
  embps_table_t *t = make(1, 4, EMBPS_DTYPE_F32);
  uint64_t cursor = 0;
  int64_t id;
  float w[DIM];
  size_t n = 1;
  int done = 0;
  assert_int_equal(embps_table_scan(t, &cursor, 1, &id, w, NULL, &n, &done),
                   0);
  assert_int_equal(n, 0);
  assert_true(done);
  embps_table_unref(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dense),
      cmocka_unit_test(test_dynamic),
      cmocka_unit_test(test_f16),
      cmocka_unit_test(test_dense_snapshot),
      cmocka_unit_test(test_empty),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
