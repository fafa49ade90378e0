/* test_abi.c - the library's promises about its public structs and its
 * version (embps.h, "Structs and the ABI"; common/abi.c), without a server:
 *  - embps_abi_size() is each struct's sizeof, 0 for any other name;
 *  - the header's version macros, the library's embps_version() and
 *    embps_version_string(), and CMake's project(VERSION) agree;
 *  - an embps_table_alter_t of an older, smaller size is read up to its
 *    size (what lies past it is never read); a bit set for a field past
 *    its size, a size of 0 or past EMBPS_STRUCT_SIZE_MAX, and unknown
 *    non-zero bytes of a newer, larger one are refused, the spec unchanged;
 *  - embps_client_create reads options the same way, and refuses a bad
 *    size before connecting anywhere;
 *  - the fixed-size structs' reserved words: embps_table_spec_init and
 *    embps_slices_init zero them, and a spec with one set is refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "abi.h"
#include "embps/embps.h"
#include "embps/nn.h"

#ifndef EMBPS_TEST_PROJECT_VERSION
#error "define EMBPS_TEST_PROJECT_VERSION as CMake's PROJECT_VERSION"
#endif

/* ------------------------------------------------------------ sizes */

static void test_abi_size(void **state) {
  (void)state;
#define SIZE_(type) assert_int_equal(embps_abi_size(#type), sizeof(type));
  SIZE_(embps_client_options_t)
  SIZE_(embps_table_spec_t)
  SIZE_(embps_table_alter_t)
  SIZE_(embps_table_info_t)
  SIZE_(embps_server_stats_t)
  SIZE_(embps_member_primary_t)
  SIZE_(embps_checkpoint_info_t)
  SIZE_(embps_scan_chunk_t)
  SIZE_(embps_slices_t)
#undef SIZE_
  assert_int_equal(embps_abi_size("embps_table_spec"), 0);
  assert_int_equal(embps_abi_size("embps_client_t"), 0); /* opaque */
  assert_int_equal(embps_abi_size(""), 0);
  assert_int_equal(embps_abi_size(NULL), 0);
}

/* ---------------------------------------------------------- version */

static void test_version(void **state) {
  (void)state;
  char v[32];
  snprintf(v, sizeof v, "%d.%d.%d", EMBPS_VERSION_MAJOR, EMBPS_VERSION_MINOR,
           EMBPS_VERSION_PATCH);
  assert_string_equal(v, EMBPS_VERSION_STRING);
  assert_string_equal(EMBPS_VERSION_STRING, EMBPS_TEST_PROJECT_VERSION);
  assert_string_equal(embps_version_string(), EMBPS_VERSION_STRING);
  assert_int_equal(embps_version(), EMBPS_VERSION_HEX);
  assert_int_equal(EMBPS_VERSION_HEX, (EMBPS_VERSION_MAJOR << 16) |
                                          (EMBPS_VERSION_MINOR << 8) |
                                          EMBPS_VERSION_PATCH);
}

/* ------------------------------------------------------------ alter */

/* A caller's alter struct: the library's fields, then room for fields a
 * newer header might have added. */
typedef struct {
  embps_table_alter_t a;
  unsigned char newer[64];
} big_alter_t;

static embps_table_spec_t adam_spec(void) {
  embps_table_spec_t s;
  embps_table_spec_init(&s, "t", 4, EMBPS_OPT_ADAM);
  s.rows = 10;
  return s;
}

/* An alter compiled when the struct ended after lr: lr is read; eps, past
 * its size, is not (a bogus value there changes nothing). */
static void test_alter_older_size(void **state) {
  (void)state;
  embps_table_spec_t s = adam_spec(), want = s;
  embps_table_alter_t a;
  memset(&a, 0xff, sizeof a); /* garbage past the old size */
  a.size = offsetof(embps_table_alter_t, eps);
  a.set = EMBPS_ALTER_LR;
  a.lr = 0.25;
  char why[256] = "";
  assert_int_equal(embps_table_spec_alter(&s, &a, why, sizeof why), 0);
  want.lr = 0.25;
  assert_memory_equal(&s, &want, sizeof s);

  /* the same caller setting eps: it has no such field */
  a.set = EMBPS_ALTER_LR | EMBPS_ALTER_EPS;
  assert_int_equal(embps_table_spec_alter(&s, &a, why, sizeof why),
                   EMBPS_EINVAL);
  assert_non_null(strstr(why, "sets eps"));
  assert_memory_equal(&s, &want, sizeof s);

  /* a struct that ends before `set` sets nothing */
  a.size = offsetof(embps_table_alter_t, set);
  assert_int_equal(embps_table_spec_alter(&s, &a, why, sizeof why),
                   EMBPS_EPARAM);
  assert_non_null(strstr(why, "nothing to alter"));
}

static void test_alter_bad_sizes(void **state) {
  (void)state;
  embps_table_spec_t s = adam_spec(), want = s;
  embps_table_alter_t a;
  embps_table_alter_init(&a);
  assert_int_equal(a.size, sizeof a);
  a.set = EMBPS_ALTER_LR;
  a.lr = 0.5;
  char why[256] = "";
  const size_t bad[] = {0, sizeof(size_t) - 1, EMBPS_STRUCT_SIZE_MAX + 1,
                        SIZE_MAX};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    a.size = bad[i];
    assert_int_equal(embps_table_spec_alter(&s, &a, why, sizeof why),
                     EMBPS_EINVAL);
    assert_non_null(strstr(why, "embps_table_alter_init()"));
    assert_memory_equal(&s, &want, sizeof s);
  }
}

/* A newer caller's larger struct: fine while its unknown fields are 0. */
static void test_alter_newer_size(void **state) {
  (void)state;
  embps_table_spec_t s = adam_spec(), want = s;
  big_alter_t b;
  memset(&b, 0, sizeof b);
  b.a.size = sizeof b;
  b.a.set = EMBPS_ALTER_BETA2;
  b.a.beta2 = 0.5;
  char why[256] = "";
  assert_int_equal(embps_table_spec_alter(&s, &b.a, why, sizeof why), 0);
  want.beta2 = 0.5;
  assert_memory_equal(&s, &want, sizeof s);

  b.newer[40] = 1; /* a field this library does not know, set */
  b.a.beta2 = 0.75;
  assert_int_equal(embps_table_spec_alter(&s, &b.a, why, sizeof why),
                   EMBPS_EINVAL);
  char byte[64];
  snprintf(byte, sizeof byte, "byte %zu of its %zu",
           offsetof(big_alter_t, newer) + 40, sizeof b);
  assert_non_null(strstr(why, byte));
  assert_memory_equal(&s, &want, sizeof s);
}

/* embps_struct_read copies what the caller's size covers, zeroes the rest
 * and records the library's size. */
static void test_struct_read(void **state) {
  (void)state;
  embps_client_options_t src, dst;
  memset(&src, 0xab, sizeof src);
  src.size = offsetof(embps_client_options_t, timeout_ms);
  src.servers = "h:1";
  src.token = "tok";
  memset(&dst, 0xcd, sizeof dst);
  assert_int_equal(embps_struct_read(&dst, sizeof dst, &src, "o", "i()", NULL,
                                     0), 0);
  assert_int_equal(dst.size, sizeof dst);
  assert_string_equal(dst.servers, "h:1");
  assert_string_equal(dst.token, "tok");
  assert_int_equal(dst.timeout_ms, 0);
  assert_int_equal(dst.retry_ms, 0);
}

/* ---------------------------------------------------------- options */

/* Options are read before anything connects: a bad size fails at once,
 * and only the fields the size covers are read (servers, past it, would
 * be refused as an address; in place of it $EMBPS_SERVERS is tried, where
 * nothing listens). */
static void test_options_sizes(void **state) {
  (void)state;
  setenv("EMBPS_SERVERS", "127.0.0.1:1", 1);
  embps_client_options_t o;
  embps_client_options_init(&o);
  assert_int_equal(o.size, sizeof o);
  o.servers = "not an address";
  embps_client_t *c = (embps_client_t *)&o;
  char err[512] = "";
  assert_int_equal(embps_client_create(&o, &c, err, sizeof err),
                   EMBPS_EINVAL);
  assert_null(c);
  assert_non_null(strstr(err, "not an address"));

  o.size = offsetof(embps_client_options_t, servers);
  int rc = embps_client_create(&o, &c, err, sizeof err);
  assert_true(rc != 0 && rc != EMBPS_EINVAL);
  assert_null(strstr(err, "not an address"));
  assert_non_null(strstr(err, "127.0.0.1:1"));

  o.size = 0;
  assert_int_equal(embps_client_create(&o, &c, err, sizeof err),
                   EMBPS_EINVAL);
  assert_non_null(strstr(err, "embps_client_options_init()"));

  struct {
    embps_client_options_t o;
    int newer[4];
  } b;
  memset(&b, 0, sizeof b);
  b.o.size = sizeof b;
  b.newer[2] = 7;
  assert_int_equal(embps_client_create(&b.o, &c, err, sizeof err),
                   EMBPS_EINVAL);
  assert_non_null(strstr(err, "does not know"));
  assert_null(c);
  unsetenv("EMBPS_SERVERS");
}

/* --------------------------------------------------------- reserved */

static void test_reserved_words(void **state) {
  (void)state;
  embps_table_spec_t s;
  memset(&s, 0xff, sizeof s);
  embps_table_spec_init(&s, "t", 4, EMBPS_OPT_SGD);
  s.rows = 10;
  for (size_t i = 0; i < sizeof s.reserved / sizeof *s.reserved; i++)
    assert_int_equal(s.reserved[i], 0);
  char why[256] = "";
  assert_int_equal(embps_table_spec_check(&s, why, sizeof why), 0);
  s.reserved[15] = 1;
  assert_int_equal(embps_table_spec_check(&s, why, sizeof why), EMBPS_EPARAM);
  assert_non_null(strstr(why, "reserved word 15"));

  embps_slices_t g;
  memset(&g, 0xff, sizeof g);
  embps_slices_init(&g, 3);
  assert_int_equal(g.n, 0);
  assert_int_equal(g.dim, 3);
  for (size_t i = 0; i < sizeof g.reserved / sizeof *g.reserved; i++)
    assert_int_equal(g.reserved[i], 0);
  embps_slices_free(&g);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_abi_size),
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_alter_older_size),
      cmocka_unit_test(test_alter_bad_sizes),
      cmocka_unit_test(test_alter_newer_size),
      cmocka_unit_test(test_struct_read),
      cmocka_unit_test(test_options_sizes),
      cmocka_unit_test(test_reserved_words),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
