/* test_flags.c - unit tests of the table-driven flags (common/flags.c):
 * both value forms, abbreviations refused, the errors and their wording,
 * each setter's range and format, groups with their own offsets, which
 * flags were given, parses one after another, and the --help layout. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"

typedef struct {
  int verbose;
  unsigned bits;
  const char *name;
  char path[8];
  uint32_t u32;
  uint64_t u64, size, count;
  int32_t i32;
  int64_t i64;
  double real, bounded;
} opts_t;

typedef struct {
  uint32_t depth;
  int seen_inner;
} inner_t;

typedef struct {
  opts_t o;
  inner_t in;
} both_t;

#define T opts_t
static const embps_flag_t flags[] = {
    EMBPS_FLAG_TRUE("verbose", T, verbose, "say more"),
    EMBPS_FLAG_BITS("dense", T, bits, 4u, "the dense form"),
    EMBPS_FLAG_STRING("name", "NAME", T, name, "a name"),
    EMBPS_FLAG_TEXT("path", "P", T, path, "a short path"),
    EMBPS_FLAG_NUMBER("u32", "N", embps_flag_set_uint, T, u32, 1, UINT32_MAX,
                      NULL, "an unsigned 32-bit number"),
    EMBPS_FLAG_NUMBER("u64", "N", embps_flag_set_uint, T, u64, 0, UINT64_MAX,
                      "a count", "an unsigned 64-bit number"),
    EMBPS_FLAG_NUMBER("size", "N", embps_flag_set_size, T, size, 1024,
                      1ULL << 31, NULL, "a size"),
    EMBPS_FLAG_NUMBER("count", "N", embps_flag_set_count, T, count, 0, 1e12,
                      NULL, "a count strtod reads"),
    EMBPS_FLAG_NUMBER("i32", "N", embps_flag_set_int, T, i32, -1, 100, NULL,
                      "a signed 32-bit number"),
    EMBPS_FLAG_NUMBER("i64", "N", embps_flag_set_int, T, i64, INT64_MIN,
                      INT64_MAX, "an id", "a signed 64-bit number"),
    EMBPS_FLAG_NUMBER("real", "X", embps_flag_set_double, T, real, -HUGE_VALL,
                      HUGE_VALL, "a number", "any double"),
    EMBPS_FLAG_NUMBER("bounded", "X", embps_flag_set_double, T, bounded, 0.5, 2,
                      NULL, "a double in [0.5, 2]"),
    EMBPS_FLAG_NUMBER("listen-port", "N", embps_flag_set_uint, T, u32, 0, 65535,
                      NULL, "a flag whose name starts like another's"),
    EMBPS_FLAG_END};
static const embps_flag_group_t groups[] = {{flags, 0}, {NULL, 0}};

static const embps_flag_t inner_flags[] = {
    EMBPS_FLAG_NUMBER("depth", "N", embps_flag_set_uint, inner_t, depth, 1, 16,
                      NULL, "in the nested struct"),
    EMBPS_FLAG_END};
static const embps_flag_group_t two_groups[] = {
    {flags, offsetof(both_t, o)},
    {inner_flags, offsetof(both_t, in)},
    {NULL, 0}};

static char err[256];

/* Parses the NULL-terminated arguments (after a program name) into o. */
static int parse(embps_flags_t *p, opts_t *o, ...) {
  char *argv[32] = {"prog"};
  int argc = 1;
  va_list ap;
  va_start(ap, o);
  for (char *a; (a = va_arg(ap, char *)) && argc < 31;)
    argv[argc++] = a;
  va_end(ap);
  memset(o, 0, sizeof *o);
  err[0] = 0;
  return embps_flags_parse(p, groups, o, argc, argv, "thing", err, sizeof err);
}

/* The error of parsing one argument (and its value, if any). */
static const char *error_of(const char *a, const char *v) {
  embps_flags_t p;
  opts_t o;
  if (parse(&p, &o, a, v, NULL) == 0)
    return "(accepted)";
  return err;
}

static void test_both_value_forms(void **state) {
  (void)state;
  embps_flags_t p;
  opts_t o;
  assert_int_equal(parse(&p, &o, "--name", "a", "--u32", "7", "--verbose",
                         "--dense", "--i64=-5", "--real=2.5", NULL),
                   0);
  assert_string_equal(o.name, "a");
  assert_int_equal(o.u32, 7);
  assert_int_equal(o.verbose, 1);
  assert_int_equal(o.bits, 4);
  assert_true(o.i64 == -5);
  assert_true(o.real == 2.5);
  assert_int_equal(p.next, 9);
  /* a value may start with dashes, and '=' may be in it */
  assert_int_equal(parse(&p, &o, "--name", "--verbose", "--path=a=b", NULL), 0);
  assert_string_equal(o.name, "--verbose");
  assert_string_equal(o.path, "a=b");
  assert_int_equal(o.verbose, 0);
  /* an empty value after '=' is a value */
  assert_int_equal(parse(&p, &o, "--name=", NULL), 0);
  assert_string_equal(o.name, "");
}

static void test_stops_at_first_argument(void **state) {
  (void)state;
  embps_flags_t p;
  opts_t o;
  assert_int_equal(parse(&p, &o, "--verbose", "NAME", "--u32", "3", NULL), 0);
  assert_int_equal(p.next, 2); /* argv[2] is NAME: nothing after it read */
  assert_int_equal(o.u32, 0);
  assert_int_equal(parse(&p, &o, "--verbose", "--", "--u32", NULL), 0);
  assert_int_equal(p.next, 3);
  assert_int_equal(parse(&p, &o, NULL), 0);
  assert_int_equal(p.next, 1);
}

static void test_errors_name_the_flag(void **state) {
  (void)state;
  assert_string_equal(error_of("--bogus", NULL),
                      "unknown option --bogus for thing");
  assert_string_equal(error_of("--bogus=3", NULL),
                      "unknown option --bogus for thing");
  assert_string_equal(error_of("-x", NULL), "unknown option -x for thing");
  /* abbreviations are unknown, ambiguous or not */
  assert_string_equal(error_of("--verb", NULL),
                      "unknown option --verb for thing");
  assert_string_equal(error_of("--listen", "3"),
                      "unknown option --listen for thing");
  assert_string_equal(error_of("--u", "3"), "unknown option --u for thing");
  assert_string_equal(error_of("--nam=x", NULL),
                      "unknown option --nam for thing");
  assert_string_equal(error_of("--name", NULL), "--name needs a value");
  assert_string_equal(error_of("--verbose=1", NULL),
                      "--verbose takes no value");
  assert_string_equal(error_of("--u32", "0"),
                      "--u32 \"0\" is not a number in [1, 4294967295]");
  assert_string_equal(error_of("--u64", "-1"), "--u64 \"-1\" is not a count");
  assert_string_equal(error_of("--bounded", "3"),
                      "--bounded \"3\" is not a number in [0.5, 2]");
  assert_string_equal(error_of("--path", "too-long"),
                      "--path \"too-long\" is longer than 7 bytes");
  /* no context: just the flag */
  embps_flags_t p;
  opts_t o;
  char *argv[] = {"prog", "--nope", NULL};
  assert_int_equal(
      embps_flags_parse(&p, groups, &o, 2, argv, NULL, err, sizeof err), -1);
  assert_string_equal(err, "unknown option --nope");
}

static void test_integers(void **state) {
  (void)state;
  embps_flags_t p;
  opts_t o;
  assert_int_equal(parse(&p, &o, "--u32", "4294967295", "--u64",
                         "18446744073709551615", "--i32", "-1", NULL),
                   0);
  assert_int_equal(o.u32, UINT32_MAX);
  assert_true(o.u64 == UINT64_MAX);
  assert_int_equal(o.i32, -1);
  assert_int_equal(parse(&p, &o, "--i64", "-9223372036854775808", NULL), 0);
  assert_true(o.i64 == INT64_MIN);
  const char *bad_u[] = {"",          "x",   "1x",
                         " 1",        "+1",  "-0",
                         "1.0",       "1e3", "18446744073709551616",
                         "4294967296"};
  for (size_t k = 0; k < sizeof bad_u / sizeof *bad_u; k++) {
    const char *flag = k == 9 ? "--u32" : "--u64";
    assert_string_not_equal(error_of(flag, bad_u[k]), "(accepted)");
  }
  assert_string_equal(error_of("--i32", "101"),
                      "--i32 \"101\" is not a number in [-1, 100]");
  assert_string_equal(error_of("--i32", "-2"),
                      "--i32 \"-2\" is not a number in [-1, 100]");
  assert_string_not_equal(error_of("--i64", "9223372036854775808"),
                          "(accepted)");
  assert_string_not_equal(error_of("--i64", " 5"), "(accepted)");
}

static void test_sizes(void **state) {
  (void)state;
  embps_flags_t p;
  opts_t o;
  const struct {
    const char *v;
    uint64_t want;
  } ok[] = {{"1024", 1024},    {"1K", 1024},       {"1k", 1024},
            {"64M", 64 << 20}, {"2G", 2ULL << 30}, {"2g", 2ULL << 30}};
  for (size_t k = 0; k < sizeof ok / sizeof *ok; k++) {
    assert_int_equal(parse(&p, &o, "--size", ok[k].v, NULL), 0);
    assert_true(o.size == ok[k].want);
  }
  const char *bad[] = {"1023", "3G",  "1KB",  "K",
                       "1T",   "-1K", "1.5M", "99999999999999999999G"};
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
    assert_string_not_equal(error_of("--size", bad[k]), "(accepted)");
  assert_string_equal(error_of("--size", "3G"),
                      "--size \"3G\" is not a number in [1024, 2147483648]");
}

static void test_reals_and_counts(void **state) {
  (void)state;
  embps_flags_t p;
  opts_t o;
  /* unbounded: whatever strtod reads, NaN and infinity too */
  assert_int_equal(parse(&p, &o, "--real", "nan", NULL), 0);
  assert_true(isnan(o.real));
  assert_int_equal(parse(&p, &o, "--real", "-inf", NULL), 0);
  assert_true(isinf(o.real) && o.real < 0);
  assert_string_equal(error_of("--real", "1x"),
                      "--real \"1x\" is not a number");
  assert_string_equal(error_of("--real", "1e999"),
                      "--real \"1e999\" is not a number");
  /* bounded: the range, NaN refused */
  assert_int_equal(parse(&p, &o, "--bounded", "0.5", NULL), 0);
  assert_true(o.bounded == 0.5);
  assert_string_not_equal(error_of("--bounded", "nan"), "(accepted)");
  assert_string_not_equal(error_of("--bounded", "0.49"), "(accepted)");
  /* counts: whole numbers, written as strtod reads them */
  assert_int_equal(parse(&p, &o, "--count", "1e7", NULL), 0);
  assert_true(o.count == 10000000);
  assert_int_equal(parse(&p, &o, "--count", "0", NULL), 0);
  assert_string_equal(error_of("--count", "1.5"),
                      "--count \"1.5\" is not a number in [0, 1000000000000]");
  assert_string_not_equal(error_of("--count", "-1"), "(accepted)");
  assert_string_not_equal(error_of("--count", "2e12"), "(accepted)");
  assert_string_not_equal(error_of("--count", "nan"), "(accepted)");
}

static void test_groups_and_given(void **state) {
  (void)state;
  both_t b;
  memset(&b, 0, sizeof b);
  embps_flags_t p;
  char *argv[] = {"cmd", "--depth", "4", "--u32=9", "--dense", NULL};
  assert_int_equal(
      embps_flags_parse(&p, two_groups, &b, 5, argv, NULL, err, sizeof err), 0);
  assert_int_equal(b.in.depth, 4);
  assert_int_equal(b.o.u32, 9);
  assert_int_equal(b.o.bits, 4);
  assert_true(embps_flags_given(&p, "depth"));
  assert_true(embps_flags_given(&p, "u32"));
  assert_false(embps_flags_given(&p, "u64"));
  assert_false(embps_flags_given(&p, "nonexistent"));
  assert_true(p.seen[1] == 1); /* depth: the second group's first flag */
  assert_true(p.seen[0] != 0);
  /* a flag given with its default value is still given */
  opts_t o;
  assert_int_equal(parse(&p, &o, "--i32", "0", NULL), 0);
  assert_true(embps_flags_given(&p, "i32"));
  assert_false(embps_flags_given(&p, "u32"));
}

/* getopt keeps state between calls: every parse starts over, even after
 * one stopped in the middle of a failed line. */
static void test_parses_follow_each_other(void **state) {
  (void)state;
  embps_flags_t p;
  opts_t o;
  assert_int_equal(parse(&p, &o, "--u32", "1", "--bogus", "--u64", "2", NULL),
                   -1);
  /* stopped inside a cluster of short options: getopt's cursor is left
   * there */
  assert_int_equal(parse(&p, &o, "-xyz", NULL), -1);
  assert_string_equal(err, "unknown option -xyz for thing");
  for (int k = 0; k < 3; k++) {
    assert_int_equal(parse(&p, &o, "--u64", "2", "--u32", "5", NULL), 0);
    assert_int_equal(o.u32, 5);
    assert_true(o.u64 == 2);
    assert_int_equal(p.next, 5);
  }
}

static void test_help_lists_every_flag(void **state) {
  (void)state;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  assert_non_null(f);
  fputc('\n', f);
  embps_flags_print(f, two_groups, 4, 24);
  fclose(f);
  /* one line per flag, "--name ARG" 4 columns in */
  for (const embps_flag_t *fl = flags; fl->name; fl++) {
    char line[64];
    snprintf(line, sizeof line, "\n    --%s%s%s ", fl->name, fl->arg ? " " : "",
             fl->arg ? fl->arg : "");
    assert_non_null(strstr(text, line));
  }
  const char *depth = strstr(text, "\n    --depth N ");
  assert_non_null(depth);
  assert_memory_equal(depth + 1 + 22, "  in the nested struct\n", 23);
  /* every line fits in 79 columns */
  for (char *line = text + 1, *nl; *line; line = nl + 1) {
    nl = strchr(line, '\n');
    assert_non_null(nl);
    assert_true(nl - line <= 79);
    assert_true(line[0] == ' ');
  }
  free(text);
  /* a flag wider than the column: its help starts two spaces after it, on
   * its line (a line of its own would read as more of the flag), and
   * wraps at spaces to lines from the column */
  f = open_memstream(&text, &len);
  assert_non_null(f);
  embps_flags_print_wrapped(f,
                            "one two three four five six seven eight "
                            "nine ten eleven twelve thirteen fourteen",
                            40, 30);
  fclose(f);
  assert_string_equal(text,
                      "  one two three four five six seven\n"
                      "                              eight nine ten eleven "
                      "twelve thirteen fourteen\n");
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_both_value_forms),
      cmocka_unit_test(test_stops_at_first_argument),
      cmocka_unit_test(test_errors_name_the_flag),
      cmocka_unit_test(test_integers),
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_reals_and_counts),
      cmocka_unit_test(test_groups_and_given),
      cmocka_unit_test(test_parses_follow_each_other),
      cmocka_unit_test(test_help_lists_every_flag),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
