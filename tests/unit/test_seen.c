/* test_seen.c - the exactly-once table (server/seen.c): a seq at or below
 * its client's highest is applied, client or seq 0 never is; note keeps
 * the highest; the table grows (rehashing every entry) and copies out
 * every client once; move empties its source; past EMBPS_SEEN_MAX clients
 * it starts again. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "log.h"
#include "seen.h"

static void test_applied(void **state) {
  (void)state;
  embps_seen_t s;
  embps_seen_init(&s);
  assert_false(embps_seen_applied(&s, 7, 1)); /* empty */
  embps_seen_record(&s, 7, 5);
  assert_true(embps_seen_applied(&s, 7, 5));
  assert_true(embps_seen_applied(&s, 7, 1));
  assert_false(embps_seen_applied(&s, 7, 6));
  assert_false(embps_seen_applied(&s, 8, 1));
  assert_false(embps_seen_applied(&s, 7, 0)); /* no seq: not exactly once */
  embps_seen_record(&s, 0, 9);                /* client 0 is never kept */
  assert_false(embps_seen_applied(&s, 0, 1));
  assert_int_equal(s.n, 1);
  embps_seen_note(&s, 7, 3); /* restore: an older seq keeps the highest */
  assert_true(embps_seen_applied(&s, 7, 5));
  embps_seen_note(&s, 7, 8);
  assert_true(embps_seen_applied(&s, 7, 8));
  embps_seen_close(&s);
}

static int by_client(const void *a, const void *b) {
  const embps_ckpt_seen_t *x = a, *y = b;
  return (x->client > y->client) - (x->client < y->client);
}

static void test_grow_copy_move(void **state) {
  (void)state;
  enum { N = 5000 };
  embps_seen_t s, t;
  embps_seen_init(&s);
  embps_seen_init(&t);
  for (uint64_t c = 1; c <= N; c++)
    embps_seen_record(&s, c * 0x9e3779b97f4a7c15ull, c);
  for (uint64_t c = 1; c <= N; c++) /* every one found after the rehashes */
    assert_true(embps_seen_applied(&s, c * 0x9e3779b97f4a7c15ull, c));
  assert_true(s.n == N && s.cap >= 2 * N);
  size_t n;
  embps_ckpt_seen_t *v = embps_seen_copy(&s, &n);
  assert_non_null(v);
  assert_int_equal(n, N);
  qsort(v, n, sizeof *v, by_client);
  for (size_t i = 1; i < n; i++)
    assert_true(v[i].client != v[i - 1].client);
  free(v);
  embps_seen_record(&t, 1, 1);
  embps_seen_move(&t, &s);
  assert_int_equal(t.n, N);
  assert_false(embps_seen_applied(&t, 1, 1)); /* t's own went */
  assert_int_equal(s.n, 0);
  assert_false(embps_seen_applied(&s, 0x9e3779b97f4a7c15ull, 1));
  v = embps_seen_copy(&s, &n); /* an empty copy is not a failure */
  assert_non_null(v);
  assert_int_equal(n, 0);
  free(v);
  embps_seen_close(&s);
  embps_seen_close(&t);
}

static void test_reset_when_full(void **state) {
  (void)state;
  embps_seen_t s;
  embps_seen_init(&s);
  for (uint64_t c = 1; c <= EMBPS_SEEN_MAX; c++)
    embps_seen_record(&s, c, 1);
  assert_int_equal(s.n, EMBPS_SEEN_MAX);
  assert_true(embps_seen_applied(&s, 1, 1));
  uint64_t c = EMBPS_SEEN_MAX + 1;
  while (s.n > 1000) /* the next growth resets the table */
    embps_seen_record(&s, c++, 1);
  assert_true(embps_seen_applied(&s, c - 1, 1));
  assert_false(embps_seen_applied(&s, 1, 1)); /* forgotten */
  embps_seen_close(&s);
}

int main(void) {
  embps_log_set_level(EMBPS_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_applied),
      cmocka_unit_test(test_grow_copy_move),
      cmocka_unit_test(test_reset_when_full),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
