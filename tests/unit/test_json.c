/* test_json.c - the bounded JSON reader and writer (server/json.c): what
 * etcd's gateway sends (proto3 JSON: int64 as strings, bytes as base64,
 * zero values left out) read back exactly; every malformed document
 * refused with its byte offset; the bounds (tokens, nesting, writer
 * size) hold; stream framing; writer output parsed back. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static char err[256];

static int parse(embps_json_t *d, const char *s) {
  err[0] = 0;
  return embps_json_parse(d, s, strlen(s), 1024, err, sizeof err);
}

static void test_etcd_range_reply(void **state) {
  (void)state;
  const char *s =
      "{\"header\":{\"cluster_id\":\"324952591200643719\",\"revision\":\"2\"},"
      "\"kvs\":[{\"key\":\"L2VtYnBzL3gvcHJpbWFyeQ==\",\"create_revision\":\"2\","
      "\"mod_revision\":\"2\",\"version\":\"1\",\"value\":\"aGVsbG8=\","
      "\"lease\":\"2324035612959321097\"}],\"count\":\"1\"}";
  embps_json_t d;
  assert_int_equal(parse(&d, s), 0);
  int64_t v;
  int h = embps_json_get(&d, 0, "header");
  assert_true(h > 0);
  assert_int_equal(embps_json_int64(&d, embps_json_get(&d, h, "revision"), &v), 0);
  assert_int_equal(v, 2);
  assert_int_equal(embps_json_int64(&d, embps_json_get(&d, h, "cluster_id"), &v), 0);
  assert_int_equal(v, 324952591200643719LL);
  int kvs = embps_json_get(&d, 0, "kvs");
  int kv = embps_json_first(&d, kvs);
  assert_true(kv > 0);
  assert_int_equal(embps_json_next(&d, kvs, kv), -1);
  uint8_t b[64];
  size_t n;
  assert_int_equal(embps_json_base64(&d, embps_json_get(&d, kv, "key"), b, sizeof b, &n), 0);
  assert_int_equal(n, 16);
  assert_memory_equal(b, "/embps/x/primary", 16);
  assert_int_equal(embps_json_base64(&d, embps_json_get(&d, kv, "value"), b, sizeof b, &n), 0);
  assert_int_equal(n, 5);
  assert_memory_equal(b, "hello", 5);
  assert_int_equal(embps_json_int64(&d, embps_json_get(&d, kv, "lease"), &v), 0);
  assert_int_equal(v, 2324035612959321097LL);
  /* absent members (proto3 leaves zero values out) */
  assert_int_equal(embps_json_get(&d, 0, "more"), -1);
  assert_int_equal(embps_json_get(&d, kv, "nothing"), -1);
  /* the member after a container is found (skips its subtree) */
  assert_int_equal(embps_json_int64(&d, embps_json_get(&d, 0, "count"), &v), 0);
  assert_int_equal(v, 1);
  /* a getter of the wrong kind refuses */
  assert_int_equal(embps_json_int64(&d, kvs, &v), -1);
  assert_int_equal(embps_json_get(&d, kvs, "x"), -1);
  assert_int_equal(embps_json_first(&d, 0), -1);
  embps_json_free(&d);
}

static void test_arrays_walk(void **state) {
  (void)state;
  embps_json_t d;
  assert_int_equal(parse(&d, " [1, [2, {\"a\": [3]}], \"x\", true, null, [] ] "), 0);
  int n = 0;
  for (int t = embps_json_first(&d, 0); t >= 0; t = embps_json_next(&d, 0, t))
    n++;
  assert_int_equal(n, 6);
  assert_int_equal(d.tok[0].n, 6);
  int last = 0;
  for (int t = embps_json_first(&d, 0); t >= 0; t = embps_json_next(&d, 0, t))
    last = t;
  assert_int_equal(d.tok[last].type, EMBPS_JSON_ARRAY);
  assert_int_equal(embps_json_first(&d, last), -1);
  int b;
  int t4 = embps_json_first(&d, 0);
  for (int i = 0; i < 3; i++)
    t4 = embps_json_next(&d, 0, t4);
  assert_int_equal(embps_json_bool(&d, t4, &b), 0);
  assert_true(b);
  embps_json_free(&d);
  assert_int_equal(parse(&d, "{}"), 0);
  assert_int_equal(d.n_tok, 1);
  assert_int_equal(embps_json_get(&d, 0, "a"), -1);
  embps_json_free(&d);
}

static void test_int64_bounds(void **state) {
  (void)state;
  embps_json_t d;
  int64_t v;
  assert_int_equal(parse(&d, "[\"9223372036854775807\", -9223372036854775808, "
                             "\"9223372036854775808\", 1.5, 1e3, \"\", \"-\", "
                             "\"12a\", \"00012\", 0, -0]"), 0);
  int t = embps_json_first(&d, 0);
  assert_int_equal(embps_json_int64(&d, t, &v), 0);
  assert_true(v == INT64_MAX);
  t = embps_json_next(&d, 0, t);
  assert_int_equal(embps_json_int64(&d, t, &v), 0);
  assert_true(v == INT64_MIN);
  for (int i = 0; i < 6; i++) { /* overflow, fraction, exponent, empty, -, junk */
    t = embps_json_next(&d, 0, t);
    assert_int_equal(embps_json_int64(&d, t, &v), -1);
  }
  t = embps_json_next(&d, 0, t); /* leading zeros in a string: still digits */
  assert_int_equal(embps_json_int64(&d, t, &v), 0);
  assert_int_equal(v, 12);
  t = embps_json_next(&d, 0, t);
  assert_int_equal(embps_json_int64(&d, t, &v), 0);
  assert_int_equal(v, 0);
  assert_int_equal(embps_json_int64(&d, -1, &v), -1);
  embps_json_free(&d);
}

static void test_strings(void **state) {
  (void)state;
  embps_json_t d;
  assert_int_equal(parse(&d, "[\"a\\\"b\\\\c\\/d\\n\\t\", \"\\u00e9\\u20ac\\ud83d\\ude00\", "
                             "\"\\ud83d\", \"\\udc00x\", \"\\u0000\", \"abcdef\"]"), 0);
  char out[64];
  size_t n;
  int t = embps_json_first(&d, 0);
  assert_int_equal(embps_json_string(&d, t, out, sizeof out, &n), 0);
  assert_string_equal(out, "a\"b\\c/d\n\t");
  t = embps_json_next(&d, 0, t);
  assert_int_equal(embps_json_string(&d, t, out, sizeof out, &n), 0);
  assert_string_equal(out, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
  assert_int_equal(n, 9);
  for (int i = 0; i < 3; i++) { /* lone high, lone low surrogate, NUL */
    t = embps_json_next(&d, 0, t);
    assert_int_equal(embps_json_string(&d, t, out, sizeof out, &n), -1);
  }
  t = embps_json_next(&d, 0, t);
  assert_int_equal(embps_json_string(&d, t, out, 7, &n), 0); /* just fits */
  assert_int_equal(embps_json_string(&d, t, out, 6, &n), -1);
  assert_true(embps_json_eq(&d, t, "abcdef"));
  assert_false(embps_json_eq(&d, t, "abcde"));
  embps_json_free(&d);
}

static void test_base64(void **state) {
  (void)state;
  embps_json_t d;
  assert_int_equal(parse(&d, "[\"\", \"YQ==\", \"YWI=\", \"YWJj\", \"YR==\", "
                             "\"YQ\", \"Y===\", \"YQ=a\", \"Y$==\", \"YWJj\\/\"]"), 0);
  uint8_t b[8];
  size_t n;
  int t = embps_json_first(&d, 0);
  const char *want[] = {"", "a", "ab", "abc"};
  for (int i = 0; i < 4; i++, t = embps_json_next(&d, 0, t)) {
    assert_int_equal(embps_json_base64(&d, t, b, sizeof b, &n), 0);
    assert_int_equal(n, strlen(want[i]));
    assert_memory_equal(b, want[i], n);
  }
  /* non-canonical padding bits, unpadded, too much padding, data after
     padding, a foreign character, an escape */
  for (int i = 0; i < 6; i++, t = embps_json_next(&d, 0, t))
    assert_int_equal(embps_json_base64(&d, t, b, sizeof b, &n), -1);
  assert_int_equal(t, -1);
  t = embps_json_first(&d, 0);
  for (int i = 0; i < 3; i++)
    t = embps_json_next(&d, 0, t);
  assert_int_equal(embps_json_base64(&d, t, b, 2, &n), -1); /* no room */
  embps_json_free(&d);
}

/* Malformed documents: refused, with the offset of the fault. */
static void test_refusals(void **state) {
  (void)state;
  static const struct {
    const char *text;
    const char *at;
  } bad[] = {
      {"", "byte 0"},           {"{", "byte 1"},
      {"{\"a\" 1}", "byte 5"},  {"{\"a\":}", "byte 5"},
      {"[1,]", "byte 3"},       {"[1 2]", "byte 3"},
      {"{a:1}", "byte 1"},      {"\"abc", "byte 4"},
      {"\"a\x01\"", "byte 2"},  {"\"\\x\"", "byte 1"},
      {"\"\\u12g4\"", "byte 1"}, {"tru", "byte 0"},
      {"01", "byte 1"},         {"-", "byte 0"},
      {"1.", "byte 0"},         {"1e", "byte 0"},
      {"{} {}", "byte 3"},      {"[1]x", "byte 3"},
      {"nul", "byte 0"},        {"{\"a\":1,}", "byte 7"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    embps_json_t d;
    if (parse(&d, bad[i].text) != -1 || !strstr(err, bad[i].at))
      fail_msg("'%s': %s (want %s)", bad[i].text, err, bad[i].at);
    assert_null(d.tok);
  }
}

static void test_bounds(void **state) {
  (void)state;
  embps_json_t d;
  char deep[2 * EMBPS_JSON_DEPTH_MAX + 3];
  memset(deep, '[', EMBPS_JSON_DEPTH_MAX);
  memset(deep + EMBPS_JSON_DEPTH_MAX, ']', EMBPS_JSON_DEPTH_MAX);
  deep[2 * EMBPS_JSON_DEPTH_MAX] = 0;
  assert_int_equal(parse(&d, deep), 0);
  embps_json_free(&d);
  memset(deep, '[', EMBPS_JSON_DEPTH_MAX + 1);
  memset(deep + EMBPS_JSON_DEPTH_MAX + 1, ']', EMBPS_JSON_DEPTH_MAX + 1);
  deep[2 * EMBPS_JSON_DEPTH_MAX + 2] = 0;
  assert_int_equal(parse(&d, deep), -1);
  assert_non_null(strstr(err, "nested too deep"));
  /* tokens: a limit of 3 takes [1,2] but not [1,2,3] */
  assert_int_equal(embps_json_parse(&d, "[1,2]", 5, 3, err, sizeof err), 0);
  embps_json_free(&d);
  assert_int_equal(embps_json_parse(&d, "[1,2,3]", 7, 3, err, sizeof err), -1);
  assert_non_null(strstr(err, "limit"));
  assert_int_equal(embps_json_parse(&d, "[]", 2, 0, err, sizeof err), -1);
}

static void test_frame(void **state) {
  (void)state;
  const char *s = " {\"a\":\"}{\\\"\",\"b\":[{}]}\n{\"c\":1}";
  long n = embps_json_frame(s, strlen(s));
  assert_int_equal(n, 22);
  embps_json_t d;
  assert_int_equal(embps_json_parse(&d, s, (size_t)n, 64, err, sizeof err), 0);
  embps_json_free(&d);
  assert_int_equal(embps_json_frame(s + n, strlen(s) - (size_t)n), 8);
  for (size_t k = 0; k < 22; k++) /* every prefix: incomplete */
    assert_int_equal(embps_json_frame(s, k), 0);
  assert_int_equal(embps_json_frame("  \n", 3), 0);
  assert_int_equal(embps_json_frame("[1]", 3), -1);
  assert_int_equal(embps_json_frame("x", 1), -1);
}

static void test_writer_round_trip(void **state) {
  (void)state;
  embps_jw_t w;
  embps_jw_init(&w, 4096);
  embps_jw_obj(&w);
  embps_jw_key(&w, "compare");
  embps_jw_arr(&w);
  embps_jw_obj(&w);
  embps_jw_key(&w, "key");
  embps_jw_base64(&w, "/embps/m/0\xff", 11);
  embps_jw_key(&w, "create_revision");
  embps_jw_int64(&w, INT64_MIN);
  embps_jw_obj_end(&w);
  embps_jw_arr_end(&w);
  embps_jw_key(&w, "s");
  embps_jw_str(&w, "q\"\\\n\x01\xc3\xa9", 7);
  embps_jw_key(&w, "t");
  embps_jw_bool(&w, 1);
  embps_jw_key(&w, "e");
  embps_jw_arr(&w);
  embps_jw_arr_end(&w);
  embps_jw_obj_end(&w);
  char *out;
  size_t len;
  assert_int_equal(embps_jw_finish(&w, &out, &len), 0);
  assert_int_equal(strlen(out), len);
  embps_json_t d;
  assert_int_equal(embps_json_parse(&d, out, len, 64, err, sizeof err), 0);
  int c = embps_json_first(&d, embps_json_get(&d, 0, "compare"));
  uint8_t b[16];
  size_t n;
  assert_int_equal(embps_json_base64(&d, embps_json_get(&d, c, "key"), b, sizeof b, &n), 0);
  assert_int_equal(n, 11);
  assert_memory_equal(b, "/embps/m/0\xff", 11);
  int64_t v;
  assert_int_equal(embps_json_int64(&d, embps_json_get(&d, c, "create_revision"), &v), 0);
  assert_true(v == INT64_MIN);
  char s[32];
  assert_int_equal(embps_json_string(&d, embps_json_get(&d, 0, "s"), s, sizeof s, &n), 0);
  assert_int_equal(n, 7);
  assert_memory_equal(s, "q\"\\\n\x01\xc3\xa9", 7);
  int t;
  assert_int_equal(embps_json_bool(&d, embps_json_get(&d, 0, "t"), &t), 0);
  assert_true(t);
  assert_int_equal(d.tok[embps_json_get(&d, 0, "e")].n, 0);
  embps_json_free(&d);
  free(out);
}

static void test_writer_bounds(void **state) {
  (void)state;
  embps_jw_t w;
  char *out;
  size_t len;
  embps_jw_init(&w, 10); /* {"a":true} and its NUL: 11 bytes */
  embps_jw_obj(&w);
  embps_jw_key(&w, "a");
  embps_jw_bool(&w, 1);
  embps_jw_obj_end(&w);
  assert_int_equal(embps_jw_finish(&w, &out, &len), -1); /* "true" does not */
  embps_jw_init(&w, 10);
  embps_jw_obj(&w);
  embps_jw_key(&w, "a");
  embps_jw_str(&w, "x", 1);
  embps_jw_obj_end(&w);
  assert_int_equal(embps_jw_finish(&w, &out, &len), 0);
  assert_string_equal(out, "{\"a\":\"x\"}");
  free(out);
  /* unbalanced, a key without a value, a close without an open */
  embps_jw_init(&w, 64);
  embps_jw_obj(&w);
  assert_int_equal(embps_jw_finish(&w, &out, &len), -1);
  embps_jw_init(&w, 64);
  embps_jw_obj(&w);
  embps_jw_key(&w, "a");
  embps_jw_obj_end(&w);
  assert_int_equal(embps_jw_finish(&w, &out, &len), -1);
  embps_jw_init(&w, 64);
  embps_jw_arr_end(&w);
  assert_int_equal(embps_jw_finish(&w, &out, &len), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_etcd_range_reply),
      cmocka_unit_test(test_arrays_walk),
      cmocka_unit_test(test_int64_bounds),
      cmocka_unit_test(test_strings),
      cmocka_unit_test(test_base64),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_bounds),
      cmocka_unit_test(test_frame),
      cmocka_unit_test(test_writer_round_trip),
      cmocka_unit_test(test_writer_bounds),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
