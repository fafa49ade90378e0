/* test_history.c - the epochs of a log (server/history.c): where two
 * servers' logs stop sharing records (the point a rejoining server cuts
 * back to), in every shape a promotion or a restart leaves; DIR/HISTORY
 * round trips, and any byte flipped in it, or a cut, is refused naming
 * the file and an offset. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "embps/embps.h"
#include "history.h"

/* h = the pairs (epoch, start), ended by 0. */
static void make(embps_history_t *h, const uint64_t *pairs) {
  embps_history_init(h);
  for (; pairs[0]; pairs += 2)
    assert_int_equal(embps_history_add(h, (uint32_t)pairs[0], pairs[1]), 0);
}

static void test_add_and_epoch_at(void **state) {
  embps_history_t h;
  make(&h, (const uint64_t[]){1, 1, 2, 11, 3, 11, 5, 40, 0});
  assert_int_equal(embps_history_epoch(&h), 5);
  assert_int_equal(embps_history_epoch_at(&h, 0), 0);
  assert_int_equal(embps_history_epoch_at(&h, 10), 1);
  assert_int_equal(embps_history_epoch_at(&h, 11), 3); /* 2 was empty */
  assert_int_equal(embps_history_epoch_at(&h, 39), 3);
  assert_int_equal(embps_history_epoch_at(&h, 1000), 5);
  assert_int_equal(embps_history_add(&h, 5, 50), EMBPS_EINVAL);
  assert_int_equal(embps_history_add(&h, 6, 39), EMBPS_EINVAL);
  embps_history_t c;
  embps_history_init(&c);
  assert_int_equal(embps_history_copy(&c, &h), 0);
  assert_int_equal(c.n, 4);
  assert_int_equal(c.v[3].start, 40);
  embps_history_close(&c);
  embps_history_close(&h);
}

static uint64_t common(const uint64_t *a, uint64_t a_last, const uint64_t *b,
                       uint64_t b_last) {
  embps_history_t x, y;
  make(&x, a);
  make(&y, b);
  uint64_t r = embps_history_common(&x, a_last, &y, b_last);
  assert_int_equal(embps_history_common(&y, b_last, &x, a_last), r);
  embps_history_close(&x);
  embps_history_close(&y);
  return r;
}

static void test_common(void **state) {
  const uint64_t one[] = {1, 1, 0};
  /* a follower behind its primary, the same epoch: all of it shared */
  assert_int_equal(common(one, 7, one, 20), 7);
  /* an empty follower */
  assert_int_equal(common((const uint64_t[]){0}, 0, one, 20), 0);
  /* an old primary that went on in epoch 1 to LSN 13 while its follower,
   * at 8, became the primary of epoch 2 from 9 */
  const uint64_t promoted[] = {1, 1, 2, 9, 0};
  assert_int_equal(common(one, 13, promoted, 11), 8);
  assert_int_equal(common(one, 8, promoted, 11), 8); /* nothing to cut */
  /* a primary restarted (epoch 3 from 21) whose follower held records
   * of epoch 2 past what the restarted primary kept (it lost its tail) */
  const uint64_t f[] = {1, 1, 2, 9, 0}, p[] = {1, 1, 2, 9, 3, 21, 0};
  assert_int_equal(common(f, 25, p, 30), 20);
  /* epochs of different servers from the start: nothing shared */
  assert_int_equal(common((const uint64_t[]){2, 1, 0}, 5, one, 5), 0);
  /* an empty epoch (a start without records) changes nothing */
  const uint64_t e[] = {1, 1, 2, 6, 3, 6, 0}, g[] = {1, 1, 3, 6, 0};
  assert_int_equal(common(e, 9, g, 12), 9);
}

static void test_save_load_and_damage(void **state) {
  char dir[] = "/tmp/embps-history-XXXXXX", path[64], err[512];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/HISTORY", dir);
  embps_history_t h, back;
  assert_int_equal(embps_history_load(dir, &back, err, sizeof err), 0);
  assert_int_equal(back.n, 0); /* none yet */
  make(&h, (const uint64_t[]){1, 1, 2, 11, 7, 12345678901ull, 0});
  assert_int_equal(embps_history_save(dir, &h, err, sizeof err), 0);
  assert_int_equal(embps_history_load(dir, &back, err, sizeof err), 0);
  assert_int_equal(back.n, 3);
  assert_int_equal(back.v[2].epoch, 7);
  assert_int_equal(back.v[2].start, 12345678901ull);
  embps_history_close(&back);
  FILE *f = fopen(path, "rb");
  char text[256];
  size_t len = fread(text, 1, sizeof text, f);
  fclose(f);
  for (size_t i = 0; i <= len; i++) { /* every byte flipped; every cut */
    f = fopen(path, "wb");
    if (i < len) {
      text[i] ^= 0x21;
      fwrite(text, 1, len, f);
      text[i] ^= 0x21;
    } else {
      fwrite(text, 1, len / 2, f);
    }
    fclose(f);
    err[0] = 0;
    assert_int_equal(embps_history_load(dir, &back, err, sizeof err), -1);
    assert_non_null(strstr(err, "HISTORY"));
    assert_non_null(strstr(err, "offset "));
  }
  unlink(path);
  rmdir(dir);
  embps_history_close(&h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_add_and_epoch_at),
      cmocka_unit_test(test_common),
      cmocka_unit_test(test_save_load_and_damage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
