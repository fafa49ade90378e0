/* test_npy.c - unit tests of the .npy writer and reader (client/npy.c):
 * a streamed file's header holds the final shape and a 64-byte-aligned
 * data offset; round trips of 1-D int64 and 2-D float32; files in the
 * layout numpy writes (version 1.0 and 2.0, <f8 and <i4 converted); and
 * refusals naming the file: bad magic, big-endian, fortran order, 3-D,
 * truncated data, a header without descr. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "npy.h"

static char dir[] = "/tmp/embps-npy-XXXXXX";

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
  assert_int_equal(embps_npy_create(&w, path_of("w.npy"), EMBPS_NPY_F4, 3,
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
  assert_int_equal(embps_npy_create(&wi, path_of("i.npy"), EMBPS_NPY_I8, 0,
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
  assert_int_equal(embps_npy_open(&r, path_of("w.npy"), err, sizeof err), 0);
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

  assert_int_equal(embps_npy_open(&r, path_of("i.npy"), err, sizeof err), 0);
  assert_int_equal(r.ndim, 1);
  assert_int_equal(r.rows, 4);
  int64_t iback[4];
  assert_int_not_equal(embps_npy_read_f32(&r, (float *)iback, 4, err,
                                          sizeof err), 0);
  assert_int_equal(embps_npy_read_i64(&r, iback, 4, err, sizeof err), 0);
  assert_memory_equal(iback, ids, sizeof ids);
  embps_npy_close(&r);

  /* an empty file is a valid (0, 3) array */
  assert_int_equal(embps_npy_create(&w, path_of("e.npy"), EMBPS_NPY_F4, 3,
                                    err, sizeof err), 0);
  assert_int_equal(embps_npy_finish(&w, err, sizeof err), 0);
  assert_int_equal(embps_npy_open(&r, path_of("e.npy"), err, sizeof err), 0);
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
  assert_int_equal(embps_npy_open(&r, path_of("f8.npy"), err, sizeof err), 0);
  float f[4];
  assert_int_equal(embps_npy_read_f32(&r, f, 2, err, sizeof err), 0);
  for (int i = 0; i < 4; i++)
    assert_true(f[i] == (float)d[i]);
  embps_npy_close(&r);

  int32_t i4[3] = {-7, 0, 2147483647};
  write_raw("i4.npy", 2, "{'descr': '<i4', 'fortran_order': False, "
            "'shape': (3,), }", i4, sizeof i4);
  assert_int_equal(embps_npy_open(&r, path_of("i4.npy"), err, sizeof err), 0);
  int64_t i8[3];
  assert_int_equal(embps_npy_read_i64(&r, i8, 3, err, sizeof err), 0);
  assert_true(i8[0] == -7 && i8[1] == 0 && i8[2] == 2147483647);
  embps_npy_close(&r);
}

/* Opening name must fail with a message naming it and holding `what`. */
static void refused(const char *name, const char *what) {
  char err[512];
  embps_npy_reader_t r;
  assert_int_equal(embps_npy_open(&r, path_of(name), err, sizeof err), -1);
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

static int setup(void **state) {
  (void)state;
  return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_numpy_layouts),
      cmocka_unit_test(test_refusals),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
