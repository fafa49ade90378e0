/* test_formats.c - a data dir written by a newer version of embps: a
 * checkpoint's MANIFEST, a table file and a log segment whose headers say
 * a format above the one this binary reads (their checksums right, as a
 * newer binary writes them) are refused with "written by a newer version
 * of embps (format N; this binary reads up to M)" naming the file, not as
 * damage; the same word changed without its checksum is damage still.
 * The files are real ones (server/ckpt.c, server/wal.c) with the version
 * word rewritten. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "crc32c.h"
#include "table.h"
#include "wal.h"

static char dir[64];

static int setup(void **state) {
  (void)state;
  snprintf(dir, sizeof dir, "/tmp/embps-formats-XXXXXX");
  assert_non_null(mkdtemp(dir));
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
  return 0;
}

/* Writes the 32-bit word v at offset off of path; unless crc_at is 0, then
 * the CRC-32C of bytes [crc_from, crc_at) at crc_at (negative: from the
 * end of the file), as a writer of that format would. */
static void poke32(const char *path, long off, uint32_t v, long crc_from,
                   long crc_at) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  assert_int_equal(pwrite(fd, &v, 4, off), 4);
  if (crc_at != 0) {
    off_t size = lseek(fd, 0, SEEK_END);
    long at = crc_at < 0 ? (long)size + crc_at : crc_at;
    unsigned char *buf = malloc((size_t)at);
    assert_int_equal(pread(fd, buf, (size_t)(at - crc_from), crc_from),
                     at - crc_from);
    uint32_t crc = embps_crc32c(0, buf, (size_t)(at - crc_from));
    assert_int_equal(pwrite(fd, &crc, 4, at), 4);
    free(buf);
  }
  close(fd);
}

/* err must say "PATH: written by a newer version ... (format GOT; this
 * binary reads up to MAX)". */
static void expect_newer(const char *err, const char *path, unsigned got,
                         unsigned max) {
  char want[1200];
  snprintf(want, sizeof want, "%s: %s at offset 0: written by a newer "
           "version of embps (format %u; this binary reads up to %u)", path,
           strstr(path, ".log") ? "segment header" : "header", got, max);
  if (!strstr(err, want))
    fail_msg("got \"%s\", want \"%s\"", err, want);
}

/* A checkpoint at LSN 7 of one table; its paths. */
static void write_ckpt(char *manifest, char *table, size_t len) {
  embps_table_spec_t s;
  embps_table_spec_init(&s, "t", 4, EMBPS_OPT_ADAGRAD);
  s.rows = 16;
  embps_table_t *t;
  assert_int_equal(embps_table_create(&s, 4, 1, &t), 0);
  embps_table_set_incarnation(t, 3);
  embps_table_info_t info;
  embps_table_info(t, &info);
  embps_ckpt_table_t ct = {t, 3, info.step, 0, NULL, info.spec};
  embps_ckpt_t c = {.lsn = 7, .cluster_size = 1, .shards = 4, .tables = &ct,
                    .n_tables = 1};
  embps_ckpt_result_t res;
  char err[1024];
  assert_int_equal(embps_ckpt_write(dir, &c, &res, err, sizeof err), 0);
  embps_table_unref(t);
  snprintf(manifest, len, "%s/ckpt-0000000000000007/MANIFEST", dir);
  snprintf(table, len, "%s/ckpt-0000000000000007/table-0000000000000003.dat",
           dir);
}

static void test_checkpoint_newer(void **state) {
  (void)state;
  char manifest[256], table[256], err[2048];
  write_ckpt(manifest, table, sizeof manifest);
  embps_ckpt_t c;
  assert_int_equal(embps_ckpt_load(dir, 7, 4, 1, &c, err, sizeof err), 0);
  embps_ckpt_free(&c);
  /* the table file's header: "EMBPSTBL", the version, its CRC at 60 */
  poke32(table, 8, EMBPS_CKPT_FORMAT + 1, 0, 60);
  assert_int_equal(embps_ckpt_load(dir, 7, 4, 1, &c, err, sizeof err), -1);
  embps_ckpt_free(&c);
  expect_newer(err, table, EMBPS_CKPT_FORMAT + 1, EMBPS_CKPT_FORMAT);
  /* the MANIFEST's (read first): its CRC is the last word but one */
  poke32(manifest, 8, EMBPS_CKPT_FORMAT + 7, 0, -8);
  assert_int_equal(embps_ckpt_load(dir, 7, 4, 1, &c, err, sizeof err), -1);
  embps_ckpt_free(&c);
  expect_newer(err, manifest, EMBPS_CKPT_FORMAT + 7, EMBPS_CKPT_FORMAT);
  /* damage is damage: a version changed without its checksum */
  poke32(manifest, 8, EMBPS_CKPT_FORMAT + 1, 0, 0);
  assert_int_equal(embps_ckpt_load(dir, 7, 4, 1, &c, err, sizeof err), -1);
  embps_ckpt_free(&c);
  assert_null(strstr(err, "newer version"));
  assert_non_null(strstr(err, "checksum mismatch"));
}

static void done(void *ctx, embps_wal_waiter_t *waiter, const char *err) {
  (void)ctx, (void)waiter, (void)err;
}

static int visit(void *ctx, const embps_wal_rec_t *r, char *err,
                 size_t err_len) {
  (void)r, (void)err, (void)err_len;
  ++*(int *)ctx;
  return 0;
}

static void test_log_newer(void **state) {
  (void)state;
  char err[2048], path[256];
  embps_wal_t *w;
  assert_int_equal(embps_wal_open(dir, 1, EMBPS_FSYNC_ALWAYS, 0, done, NULL,
                                  &w, err, sizeof err),
                   0);
  uint64_t v = 42;
  struct iovec p = {&v, sizeof v};
  uint8_t head[EMBPS_WAL_HEADER_BYTES];
  assert_int_equal(embps_wal_head(head, EMBPS_WAL_DROP, 1, 1, &p, 1, err,
                                  sizeof err),
                   0);
  assert_int_equal(embps_wal_append(w, head, &p, 1, err, sizeof err), 0);
  embps_wal_close(w);
  uint64_t last;
  int n = 0;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &n, &last, err, sizeof err),
                   0);
  assert_int_equal(n, 1);
  /* the segment header: "EMBPSLOG", the version, its CRC at 28 */
  snprintf(path, sizeof path, "%s/0000000000000001.log", dir);
  poke32(path, 8, EMBPS_WAL_FORMAT + 5, 0, 0);
  assert_int_equal(embps_wal_replay(dir, 0, visit, &n, &last, err, sizeof err),
                   -1);
  assert_null(strstr(err, "newer version")); /* damage */
  poke32(path, 8, EMBPS_WAL_FORMAT + 1, 0, 28);
  assert_int_equal(embps_wal_replay(dir, 0, visit, &n, &last, err, sizeof err),
                   -1);
  expect_newer(err, path, EMBPS_WAL_FORMAT + 1, EMBPS_WAL_FORMAT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_checkpoint_newer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_log_newer, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
