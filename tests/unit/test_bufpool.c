/* test_bufpool.c - unit tests of the buffer pool (common/bufpool.c): a
 * buffer given back is handed out again, the smallest that fits first;
 * small buffers and what would pass max_bytes are freed, not kept; the
 * pool keeps its largest buffers; and concurrent take/give from several
 * threads loses nothing (run under ASan/TSan as part of the suite). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bufpool.h"

#define KIB ((size_t)1 << 10)

static void test_reuse_smallest_fit(void **state) {
  (void)state;
  embps_bufpool_t pool;
  embps_bufpool_init(&pool, 4 * KIB, 1024 * KIB);
  size_t cap_a, cap_b, cap;
  void *a = embps_bufpool_take(&pool, 100 * KIB, &cap_a);
  void *b = embps_bufpool_take(&pool, 40 * KIB, &cap_b);
  assert_true(a && b);
  assert_int_equal(cap_a, 100 * KIB);
  assert_int_equal(cap_b, 40 * KIB);
  embps_bufpool_give(&pool, a, cap_a);
  embps_bufpool_give(&pool, b, cap_b);
  assert_int_equal(pool.kept, 140 * KIB);
  /* 30 KiB fits both: the smaller one comes back */
  assert_ptr_equal(embps_bufpool_take(&pool, 30 * KIB, &cap), b);
  assert_int_equal(cap, 40 * KIB);
  /* 60 KiB fits only a */
  assert_ptr_equal(embps_bufpool_take(&pool, 60 * KIB, &cap), a);
  assert_int_equal(cap, 100 * KIB);
  assert_int_equal(pool.kept, 0);
  /* nothing kept fits: a new buffer of exactly the size asked */
  void *c = embps_bufpool_take(&pool, 200 * KIB, &cap);
  assert_non_null(c);
  assert_int_equal(cap, 200 * KIB);
  memset(c, 1, cap);
  embps_bufpool_give(&pool, a, 100 * KIB);
  embps_bufpool_give(&pool, b, 40 * KIB);
  embps_bufpool_give(&pool, c, cap);
  embps_bufpool_close(&pool);
}

static void test_bounds(void **state) {
  (void)state;
  embps_bufpool_t pool;
  embps_bufpool_init(&pool, 4 * KIB, 100 * KIB);
  size_t cap;
  /* below min_bytes: never kept */
  void *small = embps_bufpool_take(&pool, 1 * KIB, &cap);
  embps_bufpool_give(&pool, small, cap);
  assert_int_equal(pool.kept, 0);
  /* past max_bytes: freed */
  void *huge = embps_bufpool_take(&pool, 200 * KIB, &cap);
  embps_bufpool_give(&pool, huge, cap);
  assert_int_equal(pool.kept, 0);
  /* 60 + 30 kept; another 30 would pass 100: freed */
  void *x = embps_bufpool_take(&pool, 60 * KIB, &cap);
  void *y = embps_bufpool_take(&pool, 30 * KIB, &cap);
  void *z = embps_bufpool_take(&pool, 30 * KIB, &cap);
  embps_bufpool_give(&pool, x, 60 * KIB);
  embps_bufpool_give(&pool, y, 30 * KIB);
  embps_bufpool_give(&pool, z, 30 * KIB);
  assert_int_equal(pool.kept, 90 * KIB);
  /* zero bytes: a usable buffer */
  void *zero = embps_bufpool_take(&pool, 0, &cap);
  assert_non_null(zero);
  assert_true(cap >= 1);
  embps_bufpool_give(&pool, zero, cap);
  embps_bufpool_give(&pool, NULL, 0);
  embps_bufpool_close(&pool);
}

/* With every slot taken, a larger buffer replaces the smallest kept one;
 * a smaller one is freed. */
static void test_keeps_largest(void **state) {
  (void)state;
  embps_bufpool_t pool;
  embps_bufpool_init(&pool, KIB, (size_t)1 << 30);
  void *p[EMBPS_BUFPOOL_SLOTS];
  size_t cap;
  for (size_t i = 0; i < EMBPS_BUFPOOL_SLOTS; i++)
    p[i] = embps_bufpool_take(&pool, (i + 2) * KIB, &cap);
  for (size_t i = 0; i < EMBPS_BUFPOOL_SLOTS; i++)
    embps_bufpool_give(&pool, p[i], (i + 2) * KIB);
  size_t full = pool.kept;
  void *tiny = embps_bufpool_take(&pool, KIB, &cap);
  /* the 2 KiB slot handed out: put it back before testing replacement */
  embps_bufpool_give(&pool, tiny, cap);
  assert_int_equal(pool.kept, full);
  void *one = malloc(KIB);
  embps_bufpool_give(&pool, one, KIB); /* smaller than all: freed */
  assert_int_equal(pool.kept, full);
  void *big = malloc(64 * KIB);
  embps_bufpool_give(&pool, big, 64 * KIB); /* replaces the 2 KiB one */
  assert_int_equal(pool.kept, full - 2 * KIB + 64 * KIB);
  assert_ptr_equal(embps_bufpool_take(&pool, 50 * KIB, &cap), big);
  free(big);
  embps_bufpool_close(&pool);
}

static void *churn(void *arg) {
  embps_bufpool_t *pool = arg;
  for (int i = 0; i < 20000; i++) {
    size_t cap, want = (size_t)(1 + i % 7) * 8 * KIB;
    unsigned char *b = embps_bufpool_take(pool, want, &cap);
    assert_non_null(b);
    assert_true(cap >= want);
    memset(b, i & 0xff, want); /* the buffer is ours alone */
    for (size_t k = 0; k < want; k += 4096)
      assert_int_equal(b[k], i & 0xff);
    embps_bufpool_give(pool, b, cap);
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  embps_bufpool_t pool;
  embps_bufpool_init(&pool, 4 * KIB, 200 * KIB);
  pthread_t th[4];
  for (int i = 0; i < 4; i++)
    assert_int_equal(pthread_create(&th[i], NULL, churn, &pool), 0);
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);
  assert_true(pool.kept <= 200 * KIB);
  embps_bufpool_close(&pool);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reuse_smallest_fit),
      cmocka_unit_test(test_bounds),
      cmocka_unit_test(test_keeps_largest),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
