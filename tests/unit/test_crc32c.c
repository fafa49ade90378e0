/* test_crc32c.c - CRC-32C against published vectors (RFC 3720 B.4 and the
 * "123456789" check value), hardware against table at every length and
 * alignment (short buffers and the three-stream path of long ones), and
 * chaining. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "crc32c.h"

static void test_vectors(void **state) {
  unsigned char buf[32];
  assert_int_equal(embps_crc32c(0, "123456789", 9), 0xe3069283u);
  assert_int_equal(embps_crc32c_sw(0, "123456789", 9), 0xe3069283u);
  memset(buf, 0, sizeof buf);
  assert_int_equal(embps_crc32c(0, buf, 32), 0x8a9136aau);
  memset(buf, 0xff, sizeof buf);
  assert_int_equal(embps_crc32c(0, buf, 32), 0x62a8ab43u);
  for (int i = 0; i < 32; i++)
    buf[i] = (unsigned char)i;
  assert_int_equal(embps_crc32c(0, buf, 32), 0x46dd794eu);
  for (int i = 0; i < 32; i++)
    buf[i] = (unsigned char)(31 - i);
  assert_int_equal(embps_crc32c(0, buf, 32), 0x113fdb5cu);
  assert_int_equal(embps_crc32c(0, "", 0), 0);
}

static void test_hw_matches_table(void **state) {
  unsigned char buf[300];
  for (size_t i = 0; i < sizeof buf; i++)
    buf[i] = (unsigned char)(i * 131 + 7);
  for (size_t off = 0; off < 9; off++)
    for (size_t n = 0; n + off <= sizeof buf; n += 7)
      assert_int_equal(embps_crc32c(0, buf + off, n),
                       embps_crc32c_sw(0, buf + off, n));
}

/* Long buffers take the three-stream path: every length around its round
 * size (3 x 4096) and several rounds, at every alignment. */
static void test_hw_long_matches_table(void **state) {
  static unsigned char buf[5 * 12288 + 64];
  for (size_t i = 0; i < sizeof buf; i++)
    buf[i] = (unsigned char)((i * 2654435761u) >> 13);
  const size_t lens[] = {12287, 12288, 12289, 12288 + 7, 2 * 12288 - 1,
                         2 * 12288, 3 * 12288 + 13, 5 * 12288};
  for (size_t off = 0; off < 9; off++)
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
      assert_int_equal(embps_crc32c(0, buf + off, lens[i]),
                       embps_crc32c_sw(0, buf + off, lens[i]));
      assert_int_equal(embps_crc32c(0x12345678u, buf + off, lens[i]),
                       embps_crc32c_sw(0x12345678u, buf + off, lens[i]));
    }
}

static void test_chaining(void **state) {
  const char *s = "the quick brown fox jumps over the lazy dog";
  size_t n = strlen(s);
  uint32_t whole = embps_crc32c(0, s, n);
  for (size_t cut = 0; cut <= n; cut++)
    assert_int_equal(embps_crc32c(embps_crc32c(0, s, cut), s + cut, n - cut),
                     whole);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vectors),
      cmocka_unit_test(test_hw_matches_table),
      cmocka_unit_test(test_hw_long_matches_table),
      cmocka_unit_test(test_chaining),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
