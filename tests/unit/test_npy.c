/* test_npy.c - unit tests of the .npy writer and reader (client/npy.c):
 * a streamed file's header holds the final shape and a 64-byte-aligned
 * data offset; round trips of 1-D int64 and 2-D float32; files in the
 * layout numpy writes (version 1.0 and 2.0, <f8 and <i4 converted); files
 * numpy itself wrote (tests/fixtures/npy: versions 1.0, 2.0, 3.0, every
 * dtype read; and those it must refuse); the header dict parsed as the
 * Python literal it is: key order, whitespace, quotes, trailing commas,
 * Python 2 longs taken; duplicate and unknown keys, (5), (), negative and
 * huge sizes, escapes, text after the dict refused by name; refusals
 * naming the file: bad magic, versions, big-endian, fortran order, 3-D,
 * truncated data, a header without descr, a FIFO (without hanging), a
 * symbolic link, a directory. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "npy.h"

static char dir[] = "/tmp/embps-npy-XXXXXX";
static int dfd = -1; /* dir, open */

static const char *path_of(const char *name) {
  static char p[256];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return p;
}

/* Writes a .npy file by hand: version major.0, header dict padded so the
 * data starts at a multiple of 64, then data. */
static void write_raw(const char *name, int major, const char *dict,
                      const void *data, size_t len) {
  FILE *f = fopen(path_of(name), "wb");
  assert_non_null(f);
  size_t pre = major == 1 ? 10 : 12;
  size_t hlen = strlen(dict) + 1;
  hlen += (64 - (pre + hlen) % 64) % 64;
  unsigned char head[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)major,
                            0, (unsigned char)(hlen & 0xff),
                            (unsigned char)(hlen >> 8), 0, 0};
  fwrite(head, 1, pre, f);
  fputs(dict, f);
  for (size_t i = strlen(dict); i + 1 < hlen; i++)
    fputc(' ', f);
  fputc('\n', f);
  fwrite(data, 1, len, f);
  fclose(f);
}

static void test_round_trip(void **state) {
  (void)state;
  char err[512];
  embps_npy_writer_t w;
  assert_int_equal(embps_npy_create(&w, dfd, dir, "w.npy", EMBPS_NPY_F4, 3,
                                    err, sizeof err), 0);
  float rows[5][3];
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 3; j++)
      rows[i][j] = (float)i * 10.5f + (float)j;
  assert_int_equal(embps_npy_append(&w, rows, 2, err, sizeof err), 0);
  assert_int_equal(embps_npy_append(&w, rows[2], 3, err, sizeof err), 0);
  assert_int_equal(embps_npy_finish(&w, err, sizeof err), 0);
  embps_npy_writer_t wi;
  int64_t ids[4] = {-1, 0, INT64_MAX, INT64_MIN};
  assert_int_equal(embps_npy_create(&wi, dfd, dir, "i.npy", EMBPS_NPY_I8, 0,
                                    err, sizeof err), 0);
  assert_int_equal(embps_npy_append(&wi, ids, 4, err, sizeof err), 0);
  assert_int_equal(embps_npy_finish(&wi, err, sizeof err), 0);

  /* the header as numpy wants it */
  FILE *f = fopen(path_of("w.npy"), "rb");
  char head[129] = {0};
  assert_int_equal(fread(head, 1, 128, f), 128);
  fclose(f);
  assert_memory_equal(head, "\x93NUMPY\x01\x00", 8);
  assert_int_equal((unsigned char)head[8] | (unsigned char)head[9] << 8, 118);
  assert_non_null(strstr(head + 10, "'shape': (5, 3)"));
  assert_non_null(strstr(head + 10, "'descr': '<f4'"));
  assert_int_equal(head[127], '\n');

  embps_npy_reader_t r;
  assert_int_equal(embps_npy_open(&r, dfd, dir, "w.npy", err, sizeof err), 0);
  assert_int_equal(r.rows, 5);
  assert_int_equal(r.cols, 3);
  assert_int_equal(r.ndim, 2);
  assert_int_equal(r.data_off % 64, 0);
  float back[5][3];
  assert_int_equal(embps_npy_read_f32(&r, back[0], 4, err, sizeof err), 0);
  assert_int_equal(embps_npy_read_f32(&r, back[4], 1, err, sizeof err), 0);
  assert_memory_equal(back, rows, sizeof rows);
  assert_int_not_equal(embps_npy_read_f32(&r, back[0], 1, err, sizeof err), 0);
  assert_int_equal(embps_npy_rewind(&r), 0);
  assert_int_equal(embps_npy_read_f32(&r, back[0], 5, err, sizeof err), 0);
  assert_memory_equal(back, rows, sizeof rows);
  embps_npy_close(&r);

  assert_int_equal(embps_npy_open(&r, dfd, dir, "i.npy", err, sizeof err), 0);
  assert_int_equal(r.ndim, 1);
  assert_int_equal(r.rows, 4);
  int64_t iback[4];
  assert_int_not_equal(embps_npy_read_f32(&r, (float *)iback, 4, err,
                                          sizeof err), 0);
  assert_int_equal(embps_npy_read_i64(&r, iback, 4, err, sizeof err), 0);
  assert_memory_equal(iback, ids, sizeof ids);
  embps_npy_close(&r);

  /* an empty file is a valid (0, 3) array */
  assert_int_equal(embps_npy_create(&w, dfd, dir, "e.npy", EMBPS_NPY_F4, 3,
                                    err, sizeof err), 0);
  assert_int_equal(embps_npy_finish(&w, err, sizeof err), 0);
  assert_int_equal(embps_npy_open(&r, dfd, dir, "e.npy", err, sizeof err), 0);
  assert_int_equal(r.rows, 0);
  embps_npy_close(&r);
}

static void test_numpy_layouts(void **state) {
  (void)state;
  char err[512];
  embps_npy_reader_t r;
  double d[4] = {0.5, -1.25, 1e-3, 3.0};
  write_raw("f8.npy", 1, "{'descr': '<f8', 'fortran_order': False, "
            "'shape': (2, 2), }", d, sizeof d);
  assert_int_equal(embps_npy_open(&r, dfd, dir, "f8.npy", err, sizeof err), 0);
  float f[4];
  assert_int_equal(embps_npy_read_f32(&r, f, 2, err, sizeof err), 0);
  for (int i = 0; i < 4; i++)
    assert_true(f[i] == (float)d[i]);
  embps_npy_close(&r);

  int32_t i4[3] = {-7, 0, 2147483647};
  write_raw("i4.npy", 2, "{'descr': '<i4', 'fortran_order': False, "
            "'shape': (3,), }", i4, sizeof i4);
  assert_int_equal(embps_npy_open(&r, dfd, dir, "i4.npy", err, sizeof err), 0);
  int64_t i8[3];
  assert_int_equal(embps_npy_read_i64(&r, i8, 3, err, sizeof err), 0);
  assert_true(i8[0] == -7 && i8[1] == 0 && i8[2] == 2147483647);
  embps_npy_close(&r);
}

/* Opening name must fail with a message naming it and holding `what`. */
static void refused(const char *name, const char *what) {
  char err[512];
  embps_npy_reader_t r;
  assert_int_not_equal(embps_npy_open(&r, dfd, dir, name, err, sizeof err),
                       0);
  assert_non_null(strstr(err, name));
  if (!strstr(err, what))
    fail_msg("%s: \"%s\" lacks \"%s\"", name, err, what);
}

static void test_refusals(void **state) {
  (void)state;
  float f[6] = {0};
  write_raw("be.npy", 1, "{'descr': '>f4', 'fortran_order': False, "
            "'shape': (2, 3), }", f, sizeof f);
  refused("be.npy", "dtype");
  write_raw("fo.npy", 1, "{'descr': '<f4', 'fortran_order': True, "
            "'shape': (2, 3), }", f, sizeof f);
  refused("fo.npy", "fortran_order");
  write_raw("3d.npy", 1, "{'descr': '<f4', 'fortran_order': False, "
            "'shape': (1, 2, 3), }", f, sizeof f);
  refused("3d.npy", "dimensions");
  write_raw("short.npy", 1, "{'descr': '<f4', 'fortran_order': False, "
            "'shape': (2, 3), }", f, sizeof f - 1);
  refused("short.npy", "size");
  write_raw("nodescr.npy", 1, "{'fortran_order': False, 'shape': (2, 3), }",
            f, sizeof f);
  refused("nodescr.npy", "descr");
  FILE *x = fopen(path_of("magic.npy"), "wb");
  fputs("PK\x03\x04 a zip, not an npy", x);
  fclose(x);
  refused("magic.npy", "magic");
  refused("missing.npy", "No such file");
}

/* Files numpy wrote (tests/fixtures/npy/make.py): every version and
 * dtype read gives the array numpy saved; the rest are refused by name. */
static void test_numpy_fixtures(void **state) {
  (void)state;
  const char *fx = EMBPS_NPY_FIXTURES;
  int fd = open(fx, O_RDONLY | O_DIRECTORY);
  assert_true(fd >= 0);
  char err[512];
  embps_npy_reader_t r;
  float want[6], got[6];
  for (int i = 0; i < 6; i++)
    want[i] = (float)i * 1.5f - 2;
  const char *f4[] = {"f4_2d_v1.npy", "f4_2d_v2.npy", "f4_2d_v3.npy",
                      "f8_2d.npy"};
  for (size_t k = 0; k < 4; k++) {
    if (embps_npy_open(&r, fd, fx, f4[k], err, sizeof err))
      fail_msg("%s", err);
    assert_int_equal(r.type, k < 3 ? EMBPS_NPY_F4 : EMBPS_NPY_F8);
    assert_true(r.ndim == 2 && r.rows == 2 && r.cols == 3);
    assert_int_equal(embps_npy_read_f32(&r, got, 2, err, sizeof err), 0);
    assert_memory_equal(got, want, sizeof want);
    embps_npy_close(&r);
  }
  int64_t ids[4];
  assert_int_equal(embps_npy_open(&r, fd, fx, "i8_1d.npy", err, sizeof err),
                   0);
  assert_true(r.ndim == 1 && r.rows == 4 && r.cols == 1);
  assert_int_equal(embps_npy_read_i64(&r, ids, 4, err, sizeof err), 0);
  assert_true(ids[0] == -1 && ids[1] == 0 && ids[2] == (int64_t)1 << 62 &&
              ids[3] == INT64_MIN);
  embps_npy_close(&r);
  assert_int_equal(embps_npy_open(&r, fd, fx, "i4_1d.npy", err, sizeof err),
                   0);
  assert_int_equal(embps_npy_read_i64(&r, ids, 3, err, sizeof err), 0);
  assert_true(ids[0] == -7 && ids[1] == 0 && ids[2] == INT32_MAX);
  embps_npy_close(&r);
  assert_int_equal(embps_npy_open(&r, fd, fx, "f4_empty.npy", err,
                                  sizeof err), 0);
  assert_true(r.ndim == 2 && r.rows == 0 && r.cols == 4);
  embps_npy_close(&r);
  static const struct {
    const char *name, *what;
  } bad[] = {{"f4_fortran.npy", "fortran_order is True"},
             {"f4_big_endian.npy", "dtype is not one of"},
             {"f4_3d.npy", "more than 2 dimensions"},
             {"f4_scalar.npy", "0-d array"},
             {"u8_1d.npy", "dtype is not one of"},
             {"structured.npy", "'descr' is not a string"}};
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    assert_int_equal(embps_npy_open(&r, fd, fx, bad[k].name, err, sizeof err),
                     -EINVAL);
    if (!strstr(err, bad[k].name) || !strstr(err, bad[k].what))
      fail_msg("%s: \"%s\" lacks \"%s\"", bad[k].name, err, bad[k].what);
  }
  close(fd);
}

/* Header dicts the parser takes: what numpy's literal_eval takes. */
static void test_header_dicts_taken(void **state) {
  (void)state;
  static const struct {
    const char *dict;
    embps_npy_type_t type;
    int ndim;
    uint64_t rows, cols;
  } ok[] = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
       EMBPS_NPY_F4, 2, 2, 3},
      /* any key order, no trailing comma */
      {"{'shape': (2, 3), 'fortran_order': False, 'descr': '<i8'}",
       EMBPS_NPY_I8, 2, 2, 3},
      /* whitespace anywhere between tokens, padding and newline after */
      {"{ 'descr' :'<f8' ,\n\t'fortran_order':False,'shape':( 7 ,3 , ) }"
       "      \n", EMBPS_NPY_F8, 2, 7, 3},
      {"{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (5,)}",
       EMBPS_NPY_I4, 1, 5, 1},
      /* Python 2's longs; 3's digit groups; a native-order descr */
      {"{'descr': '=f4', 'fortran_order': False, 'shape': (2L, 1_000L), }",
       EMBPS_NPY_F4, 2, 2, 1000},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (0, 00), }",
       EMBPS_NPY_F4, 2, 0, 0},
      /* Fortran order where it is C order too */
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (9,), }",
       EMBPS_NPY_F4, 1, 9, 1},
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (1, 4), }",
       EMBPS_NPY_F4, 2, 1, 4},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': "
       "(18446744073709551615, 1)}", EMBPS_NPY_F4, 2, UINT64_MAX, 1},
  };
  for (size_t k = 0; k < sizeof ok / sizeof *ok; k++) {
    embps_npy_header_t h;
    const char *why = embps_npy_parse_header(ok[k].dict, strlen(ok[k].dict),
                                             &h);
    if (why)
      fail_msg("%s: %s", ok[k].dict, why);
    assert_int_equal(h.type, ok[k].type);
    assert_int_equal(h.ndim, ok[k].ndim);
    assert_true(h.rows == ok[k].rows && h.cols == ok[k].cols);
  }
}

/* Header dicts refused, each with the message saying why; the first ones
 * fooled a reader that took the first text match of each key. */
static void test_header_dicts_refused(void **state) {
  (void)state;
  static const struct {
    const char *dict, *what;
  } bad[] = {
      /* numpy takes the last 'shape' (2, 3); a text search the first */
      {"{'shape': (1, 1), 'descr': '<f4', 'fortran_order': False, "
       "'shape': (2, 3)}", "'shape' twice"},
      {"{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, "
       "'shape': (2, 3)}", "'descr' twice"},
      /* a key's name inside another key's value */
      {"{'x': \"'shape': (9, 9)\", 'descr': '<f4', 'fortran_order': False, "
       "'shape': (2, 3)}", "key other than"},
      {"{'descr': '<f4', 'fortran_order': False}", "no 'shape'"},
      {"{'descr': '<f4', 'shape': (2, 3)}", "no 'fortran_order'"},
      {"{'fortran_order': False, 'shape': (2, 3)}", "no 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (5)}",
       "not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}",
       "'shape' is not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': ()}", "0-d"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3)}",
       "more than 2 dimensions"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3)}",
       "negative"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': "
       "(18446744073709551616, 1)}", "past 2^64"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (05, 3)}",
       "leading zero"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2.0, 3)}",
       "not an int"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}",
       "separated by commas"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': ((2, 3),)}",
       "not an int"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)",
       "does not end"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3)}",
       "not True or False"},
      {"{'descr': '<f4', 'fortran_order': 'False', 'shape': (2, 3)}",
       "not True or False"},
      {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2, 3)}",
       "not True or False"},
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}",
       "fortran_order is True"},
      {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}",
       "'descr' is not a string"},
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3)}",
       "dtype is not one of"},
      {"{'descr': '<f4 ', 'fortran_order': False, 'shape': (2, 3)}",
       "dtype is not one of"},
      {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (2, 3)}",
       "backslash"},
      {"{'descr': '<f4\xc3\xa9', 'fortran_order': False, 'shape': (2, 3)}",
       "printable ASCII"},
      {"{'descr': '<f4", "does not end"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3)}",
       "no ','"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} # no",
       "text after"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}}",
       "text after"},
      {"{'descr'= '<f4', 'fortran_order': False, 'shape': (2, 3)}",
       "no ':'"},
      {"{1: 2}", "not a string"},
      {"{,}", "not a string"},
      {"('descr', '<f4')", "not a dict literal"},
      {"", "not a dict literal"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    embps_npy_header_t h;
    const char *why = embps_npy_parse_header(bad[k].dict,
                                             strlen(bad[k].dict), &h);
    if (!why || !strstr(why, bad[k].what))
      fail_msg("%s: \"%s\" lacks \"%s\"", bad[k].dict, why ? why : "taken",
               bad[k].what);
  }
  /* a NUL is not the end of the header: bytes after it still count */
  static const char nul[] = "{'descr': '<f4', 'fortran_order': False, "
                            "'shape': (2, 3)}\0 junk";
  embps_npy_header_t h;
  const char *why = embps_npy_parse_header(nul, sizeof nul - 1, &h);
  assert_non_null(why);
  assert_non_null(strstr(why, "text after"));
}

/* Writes len bytes to name. */
static void write_bytes(const char *name, const void *data, size_t len) {
  FILE *f = fopen(path_of(name), "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, len, f), len);
  fclose(f);
}

/* Versions, header lengths and files that are no regular file: refused
 * at once (a FIFO does not block the open), naming the file. */
static void test_file_refusals(void **state) {
  (void)state;
  float f[6] = {0};
  char raw[256];
  const char *dict = "{'descr': '<f4', 'fortran_order': False, "
                     "'shape': (2, 3), }";
  write_raw("v11.npy", 1, dict, f, sizeof f);
  FILE *x = fopen(path_of("v11.npy"), "r+b");
  fseek(x, 7, SEEK_SET);
  fputc(1, x); /* version 1.1 */
  fclose(x);
  refused("v11.npy", "version");
  write_raw("v4.npy", 2, dict, f, sizeof f);
  x = fopen(path_of("v4.npy"), "r+b");
  fputs("\x93NUMPY\x04", x);
  fclose(x);
  refused("v4.npy", "version");
  /* a version 2.0 header length past numpy's 10000-byte limit */
  memcpy(raw, "\x93NUMPY\x02\x00\x11\x27\x00\x00{", 13);
  write_bytes("long.npy", raw, 13);
  refused("long.npy", "limit of 10000 bytes");
  /* the header length runs past the end of the file */
  memcpy(raw, "\x93NUMPY\x01\x00\x80\x00{'descr'", 18);
  write_bytes("cut.npy", raw, 18);
  refused("cut.npy", "truncated header");

  assert_int_equal(mkfifo(path_of("fifo.npy"), 0600), 0);
  alarm(20); /* a hang fails the test instead of waiting for ctest */
  refused("fifo.npy", "not a regular file (a FIFO)");
  alarm(0);
  write_raw("target.npy", 1, dict, f, sizeof f);
  char target[256];
  snprintf(target, sizeof target, "%s", path_of("target.npy"));
  assert_int_equal(symlink(target, path_of("link.npy")), 0);
  refused("link.npy", "a symbolic link");
  assert_int_equal(mkdir(path_of("dir.npy"), 0700), 0);
  refused("dir.npy", "not a regular file (a directory)");
  char err[512];
  embps_npy_reader_t r;
  assert_int_equal(embps_npy_open(&r, dfd, dir, "missing.npy", err,
                                  sizeof err), -ENOENT);
}

/* A long directory name is shown cut in the middle, with room left for
 * the file's name and what went wrong. */
static void test_show_long_dir(void **state) {
  (void)state;
  char longdir[1000], out[EMBPS_NPY_PATH_MAX];
  memset(longdir, 'a', sizeof longdir - 1);
  longdir[sizeof longdir - 1] = 0;
  memcpy(longdir + sizeof longdir - 5, "tail", 4);
  embps_file_show(out, sizeof out, longdir, "weights.npy");
  assert_true(strlen(out) < 200);
  assert_non_null(strstr(out, "..."));
  assert_non_null(strstr(out, "tail/weights.npy"));
  embps_file_show(out, sizeof out, "/short", "x.npy");
  assert_string_equal(out, "/short/x.npy");
  embps_file_show(out, sizeof out, NULL, "x.npy");
  assert_string_equal(out, "x.npy");
}

static int setup(void **state) {
  (void)state;
  if (!mkdtemp(dir))
    return -1;
  dfd = open(dir, O_RDONLY | O_DIRECTORY);
  return dfd >= 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  close(dfd);
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_numpy_layouts),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_numpy_fixtures),
      cmocka_unit_test(test_header_dicts_taken),
      cmocka_unit_test(test_header_dicts_refused),
      cmocka_unit_test(test_file_refusals),
      cmocka_unit_test(test_show_long_dir),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
