/* test_coord_sync.c - the election's rule for degraded epochs
 * (coord.h "Degraded epochs", embps_coord_sync_eligible): P/sync saying
 * epoch E was degraded admits only E's primary to the election after E;
 * any other state, or an older epoch, binds nothing; a P/sync that did not
 * parse admits no one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "coord.h"

static embps_coord_sync_t sync_of(int degraded, uint32_t epoch,
                                  const char *addr) {
  embps_coord_sync_t s;
  memset(&s, 0, sizeof s);
  s.present = 1;
  s.degraded = degraded;
  s.epoch = epoch;
  strcpy(s.addr, addr);
  return s;
}

static void test_absent_or_strict_binds_nothing(void **state) {
  (void)state;
  embps_coord_sync_t none;
  memset(&none, 0, sizeof none);
  assert_true(embps_coord_sync_eligible(&none, 0, "f:1"));
  assert_true(embps_coord_sync_eligible(&none, 7, "f:1"));
  embps_coord_sync_t strict = sync_of(0, 7, "p:1");
  assert_true(embps_coord_sync_eligible(&strict, 7, "f:1"));
  assert_true(embps_coord_sync_eligible(&strict, 7, "p:1"));
}

static void test_degraded_epoch_admits_its_primary_only(void **state) {
  (void)state;
  embps_coord_sync_t s = sync_of(1, 7, "10.0.0.1:7070");
  assert_false(embps_coord_sync_eligible(&s, 7, "10.0.0.2:7070"));
  assert_false(embps_coord_sync_eligible(&s, 7, "10.0.0.1:70"));
  assert_true(embps_coord_sync_eligible(&s, 7, "10.0.0.1:7070"));
  /* a later epoch (its primary re-elected) starts strict: P/sync of
     epoch 7 binds only the election after 7 */
  assert_true(embps_coord_sync_eligible(&s, 8, "10.0.0.2:7070"));
  /* nor an earlier one (cannot happen: epochs only grow) */
  assert_true(embps_coord_sync_eligible(&s, 6, "10.0.0.2:7070"));
  /* no address recorded: no one */
  embps_coord_sync_t anon = sync_of(1, 7, "");
  assert_false(embps_coord_sync_eligible(&anon, 7, ""));
  assert_false(embps_coord_sync_eligible(&anon, 7, "10.0.0.1:7070"));
}

static void test_unreadable_admits_no_one(void **state) {
  (void)state;
  embps_coord_sync_t s;
  memset(&s, 0, sizeof s);
  s.present = s.degraded = s.any_epoch = 1;
  for (uint32_t e = 0; e < 4; e++)
    assert_false(embps_coord_sync_eligible(&s, e, "10.0.0.1:7070"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_absent_or_strict_binds_nothing),
      cmocka_unit_test(test_degraded_epoch_admits_its_primary_only),
      cmocka_unit_test(test_unreadable_admits_no_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
