/* test_wal.c - the log (server/wal.c) on real files: records come back in
 * order with their payloads; a torn tail (cut record, zero bytes) of the
 * last segment is truncated; any flipped byte of a complete record or
 * header is refused with the file and offset; an LSN gap between segments
 * is refused; rotation and deletion; acknowledgements wait for the sync;
 * embps_wal_sync writes late (unsafe-ack) records in any mode. And what
 * mutants showed untested: a segment that is not the last, cut anywhere,
 * is refused and left byte for byte as it was; embps_wal_delete_upto at
 * every boundary; records out of order inside a segment, even where the
 * checkpoint covers them. A record appended after a sync starts a new
 * page, so replay can tell the last record's pages a failed write-back
 * lost (cut) from other damage (refused, naming the command that drops
 * it). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "le.h"
#include "wal.h"

typedef struct {
  int n;
  uint64_t lsns[64];
  uint32_t sums[64];
  uint32_t epochs[64];
} seen_t;

static int visit(void *ctx, const embps_wal_rec_t *r, char *err,
                 size_t err_len) {
  seen_t *s = ctx;
  uint32_t sum = r->type;
  for (uint32_t i = 0; i < r->len; i++)
    sum = sum * 31 + r->payload[i];
  s->lsns[s->n] = r->lsn;
  s->epochs[s->n] = r->epoch;
  s->sums[s->n++] = sum;
  return 0;
}

/* The epoch the tests give record lsn. */
static uint32_t epoch_of(uint64_t lsn) { return (uint32_t)(lsn / 3 + 1); }

/* embps_wal_append of a record made by embps_wal_head. */
static int append(embps_wal_t *w, uint32_t type, uint64_t lsn,
                  const struct iovec *parts, int n, char *err,
                  size_t err_len) {
  uint8_t head[EMBPS_WAL_HEADER_BYTES];
  int rc = embps_wal_head(head, type, lsn, epoch_of(lsn), parts, n, err,
                          err_len);
  return rc ? rc : embps_wal_append(w, head, parts, n, err, err_len);
}

static int acks;
static void done(void *ctx, embps_wal_waiter_t *waiter, const char *err) {
  assert_null(err);
  acks++;
  free(waiter);
}

static void make_dir(char *dir, size_t len) {
  snprintf(dir, len, "/tmp/embps-wal-XXXXXX");
  assert_non_null(mkdtemp(dir));
}

static void remove_dir(const char *dir) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

/* Writes n records (lsn first..) of growing payloads, then waits for
 * their acknowledgements. */
static void write_log(const char *dir, uint64_t first, int n,
                      embps_fsync_t mode) {
  embps_wal_t *w;
  char err[512];
  assert_int_equal(embps_wal_open(dir, first, mode, 0, done, NULL, &w, err,
                                  sizeof err), 0);
  for (int i = 0; i < n; i++) {
    uint8_t a[16], b[40];
    for (size_t k = 0; k < sizeof a; k++)
      a[k] = (uint8_t)(i * 7 + k + 1);
    for (size_t k = 0; k < sizeof b; k++)
      b[k] = (uint8_t)(i * 3 + k * 5 + 1);
    struct iovec parts[2] = {{a, sizeof a}, {b, (size_t)i % 40}};
    assert_int_equal(append(w, EMBPS_WAL_PUSH, first + i, parts, 2,
                                      err, sizeof err), 0);
  }
  /* waited for once all are written: no sync begins between two records,
   * so the records lie back to back (a record appended after a sync began
   * would start a new page) */
  for (int i = 0; i < n; i++) {
    embps_wal_waiter_t *waiter = calloc(1, sizeof *waiter);
    embps_wal_wait(w, waiter, first + i);
  }
  embps_wal_close(w);
}

static void seg(char *path, size_t len, const char *dir, uint64_t first) {
  snprintf(path, len, "%s/%016" PRIx64 ".log", dir, first);
}

static void test_roundtrip_and_ack(void **state) {
  char dir[64], err[512];
  make_dir(dir, sizeof dir);
  acks = 0;
  write_log(dir, 1, 5, EMBPS_FSYNC_ALWAYS);
  assert_int_equal(acks, 5);
  seen_t s = {0};
  uint64_t last;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(s.n, 5);
  assert_int_equal(last, 5);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(s.lsns[i], i + 1);
    assert_int_equal(s.epochs[i], epoch_of(i + 1));
  }
  seen_t t = {0};
  assert_int_equal(embps_wal_replay(dir, 3, visit, &t, &last, err,
                                    sizeof err), 0);
  assert_int_equal(t.n, 2);
  assert_int_equal(t.sums[0], s.sums[3]);
  remove_dir(dir);
}

static void test_torn_tail_truncated(void **state) {
  char dir[64], path[128], err[512];
  make_dir(dir, sizeof dir);
  write_log(dir, 1, 4, EMBPS_FSYNC_NEVER);
  seg(path, sizeof path, dir, 1);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  off_t full = st.st_size;
  seen_t s = {0};
  uint64_t last;
  /* the last record cut short */
  assert_int_equal(truncate(path, full - 3), 0);
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(s.n, 3);
  assert_int_equal(last, 3);
  assert_int_equal(stat(path, &st), 0);
  off_t cut = st.st_size;
  assert_true(cut < full - 3);
  /* zeros after the last record */
  FILE *f = fopen(path, "a");
  for (int i = 0; i < 100; i++)
    fputc(0, f);
  fclose(f);
  s.n = 0;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(s.n, 3);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_size, cut);
  remove_dir(dir);
}

static void test_every_flipped_byte_refused(void **state) {
  char dir[64], path[128], err[512];
  make_dir(dir, sizeof dir);
  write_log(dir, 1, 3, EMBPS_FSYNC_NEVER);
  seg(path, sizeof path, dir, 1);
  FILE *f = fopen(path, "rb");
  uint8_t buf[4096];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  for (size_t off = 0; off < len; off++) {
    buf[off] ^= 0x20;
    f = fopen(path, "wb");
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
    buf[off] ^= 0x20;
    seen_t s = {0};
    uint64_t last;
    err[0] = 0;
    int rc = embps_wal_replay(dir, 0, visit, &s, &last, err, sizeof err);
    if (rc != -1)
      fprintf(stderr, "flip at %zu not detected\n", off);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "offset"));
  }
  remove_dir(dir);
}

static void test_gap_refused_rotation_deletes(void **state) {
  char dir[64], err[512];
  make_dir(dir, sizeof dir);
  write_log(dir, 1, 2, EMBPS_FSYNC_EVERYSEC);
  write_log(dir, 5, 1, EMBPS_FSYNC_EVERYSEC); /* 3 and 4 missing */
  seen_t s = {0};
  uint64_t last;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), -1);
  assert_non_null(strstr(err, "missing"));
  remove_dir(dir);

  make_dir(dir, sizeof dir);
  embps_wal_t *w;
  assert_int_equal(embps_wal_open(dir, 1, EMBPS_FSYNC_ALWAYS, 0, done, NULL,
                                  &w, err, sizeof err), 0);
  uint64_t x = 7;
  struct iovec p = {&x, 8};
  assert_int_equal(append(w, EMBPS_WAL_DROP, 1, &p, 1, err,
                                    sizeof err), 0);
  assert_int_equal(embps_wal_rotate(w, 2, err, sizeof err), 0);
  assert_int_equal(embps_wal_rotate(w, 2, err, sizeof err), 0); /* no-op */
  assert_int_equal(append(w, EMBPS_WAL_DROP, 2, &p, 1, err,
                                    sizeof err), 0);
  embps_wal_close(w);
  s.n = 0;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(s.n, 2);
  uint64_t before = embps_wal_bytes(dir);
  embps_wal_delete_upto(dir, 1);
  assert_true(embps_wal_bytes(dir) < before);
  s.n = 0;
  assert_int_equal(embps_wal_replay(dir, 1, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(s.n, 1);
  assert_int_equal(s.lsns[0], 2);
  /* the checkpoint covers LSN 1 but the log starts at 2: fine; covering
   * 0 with the first segment gone is a gap */
  s.n = 0;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), -1);
  remove_dir(dir);
}

/* A crash right after a rotation: the old segment's tail may be torn and
 * the new one empty (the log thread syncs the old one after the switch).
 * Forgiven only while no later segment holds a record. */
static void test_torn_tail_before_empty_segment(void **state) {
  char dir[64], path[128], err[512];
  make_dir(dir, sizeof dir);
  write_log(dir, 1, 4, EMBPS_FSYNC_NEVER);
  write_log(dir, 5, 0, EMBPS_FSYNC_NEVER);
  seg(path, sizeof path, dir, 1);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(truncate(path, st.st_size - 3), 0);
  seen_t s = {0};
  uint64_t last;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(last, 3);
  seg(path, sizeof path, dir, 5);
  assert_int_not_equal(stat(path, &st), 0); /* removed: 4 comes next */
  /* the same with a record in the later segment: refused */
  write_log(dir, 4, 1, EMBPS_FSYNC_NEVER);
  write_log(dir, 5, 1, EMBPS_FSYNC_NEVER);
  seg(path, sizeof path, dir, 4);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(truncate(path, st.st_size - 3), 0);
  s.n = 0;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), -1);
  remove_dir(dir);
}

/* embps_wal_sync in mode never with late writes (the test-only unsafe
 * ack): the records are not in the file until the sync asks for them, and
 * are all there, readable, when it returns. (That it also fdatasyncs, in
 * every mode, is observed through tests/fault/faultfs.c by
 * durability.fsync.) */
static void test_sync_writes_queued_records(void **state) {
  char dir[64], err[512], path[128];
  make_dir(dir, sizeof dir);
  embps_wal_t *w;
  assert_int_equal(embps_wal_open(dir, 1, EMBPS_FSYNC_NEVER, 1, done, NULL,
                                  &w, err, sizeof err), 0);
  uint8_t a[64] = {1, 2, 3};
  struct iovec part = {a, sizeof a};
  for (uint64_t lsn = 1; lsn <= 3; lsn++)
    assert_int_equal(append(w, EMBPS_WAL_PUSH, lsn, &part, 1, err,
                                      sizeof err), 0);
  seg(path, sizeof path, dir, 1);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_true(st.st_size < 3 * 64); /* queued, not written yet */
  assert_int_equal(embps_wal_sync(w, 3, err, sizeof err), 0);
  seen_t s = {0};
  uint64_t last;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(s.n, 3);
  assert_int_equal(last, 3);
  assert_int_equal(embps_wal_sync(w, 2, err, sizeof err), 0); /* done */
  embps_wal_close(w);
  remove_dir(dir);
}

/* Reads n bytes of path at off into buf. */
static void pread_at(const char *path, long off, uint8_t *buf, size_t n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  assert_int_equal(fseek(f, off, SEEK_SET), 0);
  assert_int_equal(fread(buf, 1, n, f), n);
  fclose(f);
}

static void pwrite_at(const char *path, long off, const uint8_t *buf,
                      size_t n) {
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, off, SEEK_SET), 0);
  assert_int_equal(fwrite(buf, 1, n, f), n);
  fclose(f);
}

/* embps_wal_parse takes what embps_wal_head made and refuses any flipped
 * byte or a cut. */
static void test_parse(void **state) {
  uint8_t buf[32 + 40], payload[40], err[256];
  for (size_t i = 0; i < sizeof payload; i++)
    payload[i] = (uint8_t)(i * 7 + 3);
  struct iovec parts[2] = {{payload, 16}, {payload + 16, 24}};
  assert_int_equal(embps_wal_head(buf, EMBPS_WAL_ROWS, 42, 9, parts, 2,
                                  (char *)err, sizeof err), 0);
  memcpy(buf + 32, payload, sizeof payload);
  embps_wal_rec_t r;
  assert_int_equal(embps_wal_parse(buf, sizeof buf, 0, &r, (char *)err,
                                   sizeof err), sizeof buf);
  assert_int_equal(r.lsn, 42);
  assert_int_equal(r.epoch, 9);
  assert_int_equal(r.type, EMBPS_WAL_ROWS);
  assert_int_equal(r.len, 40);
  assert_memory_equal(r.payload, payload, 40);
  assert_int_equal(embps_wal_parse(buf, sizeof buf - 1, 0, &r, (char *)err,
                                   sizeof err), 0);
  for (size_t i = 0; i < sizeof buf; i++) {
    buf[i] ^= 0x10;
    assert_int_equal(embps_wal_parse(buf, sizeof buf, 0, &r, (char *)err,
                                     sizeof err), 0);
    buf[i] ^= 0x10;
  }
}

/* embps_wal_last, and embps_wal_cut_after: records above an LSN removed
 * (the segment holding the next one cut, later ones deleted), the rest
 * replaying as before; cutting at the end removes nothing. */
static void test_last_and_cut(void **state) {
  char dir[64], err[512];
  make_dir(dir, sizeof dir);
  write_log(dir, 1, 5, EMBPS_FSYNC_NEVER);
  write_log(dir, 6, 5, EMBPS_FSYNC_NEVER);
  uint64_t last, cut;
  uint32_t epoch;
  assert_int_equal(embps_wal_last(dir, &last, &epoch, err, sizeof err), 0);
  assert_int_equal(last, 10);
  assert_int_equal(epoch, epoch_of(10));
  assert_int_equal(embps_wal_cut_after(dir, 10, &cut, err, sizeof err), 0);
  assert_int_equal(cut, 0);
  assert_int_equal(embps_wal_cut_after(dir, 8, &cut, err, sizeof err), 0);
  assert_int_equal(cut, 2);
  seen_t s = {0};
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(last, 8);
  assert_int_equal(s.n, 8);
  assert_int_equal(embps_wal_cut_after(dir, 3, &cut, err, sizeof err), 0);
  assert_int_equal(cut, 5);
  s.n = 0;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(last, 3);
  assert_int_equal(s.n, 3);
  /* the log goes on from there */
  write_log(dir, 4, 2, EMBPS_FSYNC_NEVER);
  s.n = 0;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(last, 5);
  assert_int_equal(embps_wal_last(dir, &last, &epoch, err, sizeof err), 0);
  assert_int_equal(last, 5);
  remove_dir(dir);
}

/* The record starts of a segment file (offsets), skipping the zeros of
 * a gap to the next page. Returns the count. */
static int record_offsets(const char *path, long *offs, int max) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static uint8_t buf[1 << 20];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  int n = 0;
  for (size_t off = EMBPS_WAL_HEADER_BYTES;
       off + EMBPS_WAL_HEADER_BYTES <= len && n < max;) {
    if (!embps_get32(buf + off)) { /* a gap: zeros to the next page */
      off = (off / EMBPS_WAL_PAGE + 1) * EMBPS_WAL_PAGE;
      continue;
    }
    offs[n++] = (long)off;
    off += EMBPS_WAL_HEADER_BYTES + embps_get32(buf + off + 16);
  }
  return n;
}

/* Issue 18.4: a record appended after a sync began starts a new 4 KiB
 * page (the gap reads as zeros), so no write touches a page holding a
 * record that sync covered; replay skips the gaps, and a byte flipped in
 * one is damage like any other. */
static void test_page_after_sync(void **state) {
  char dir[64], path[128], err[512];
  make_dir(dir, sizeof dir);
  embps_wal_t *w;
  assert_int_equal(embps_wal_open(dir, 1, EMBPS_FSYNC_ALWAYS, 0, done, NULL,
                                  &w, err, sizeof err), 0);
  for (uint64_t lsn = 1; lsn <= 6; lsn++) { /* each durable before the next */
    uint8_t a[400];
    memset(a, (int)lsn, sizeof a);
    struct iovec part = {a, 100 + 37 * lsn};
    assert_int_equal(append(w, EMBPS_WAL_PUSH, lsn, &part, 1, err,
                                      sizeof err), 0);
    assert_int_equal(embps_wal_sync(w, lsn, err, sizeof err), 0);
  }
  embps_wal_close(w);
  seg(path, sizeof path, dir, 1);
  long offs[32];
  int n = record_offsets(path, offs, 32);
  assert_int_equal(n, 6);
  assert_int_equal(offs[0], EMBPS_WAL_HEADER_BYTES);
  for (int i = 1; i < n; i++)
    assert_int_equal(offs[i], (long)i * EMBPS_WAL_PAGE);
  seen_t s = {0};
  uint64_t last;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(s.n, 6);
  assert_int_equal(last, 6);
  for (int i = 0; i < 6; i++)
    assert_int_equal(s.lsns[i], i + 1);
  FILE *f = fopen(path, "r+b");
  fseek(f, 2 * EMBPS_WAL_PAGE - 9, SEEK_SET); /* in the second gap */
  fputc(1, f);
  fclose(f);
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), -1);
  assert_non_null(strstr(err, "checksum mismatch"));
  remove_dir(dir);
}

/* Zeros bytes [from, to) of path (to < 0: to the end): pages a failed
 * write-back lost. */
static void zero_range(const char *path, long from, long to) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  if (to < 0)
    to = st.st_size;
  FILE *f = fopen(path, "r+b");
  fseek(f, from, SEEK_SET);
  for (long i = from; i < to; i++)
    fputc(0, f);
  fclose(f);
}

/* A log of 5 records, each synced before the next (so each starts a
 * page); record `big` (1-based) of 9000 bytes, three pages. Returns the
 * record offsets in offs (and the segment path in path). */
static void paged_log(const char *dir, int big, char *path, size_t len,
                      long *offs) {
  embps_wal_t *w;
  char err[512];
  assert_int_equal(embps_wal_open(dir, 1, EMBPS_FSYNC_NEVER, 0, done, NULL,
                                  &w, err, sizeof err), 0);
  static uint8_t a[9000];
  memset(a, 7, sizeof a);
  for (uint64_t lsn = 1; lsn <= 5; lsn++) {
    struct iovec part = {a, lsn == (uint64_t)big ? sizeof a : 300};
    assert_int_equal(append(w, EMBPS_WAL_PUSH, lsn, &part, 1, err,
                                      sizeof err), 0);
    assert_int_equal(embps_wal_sync(w, lsn, err, sizeof err), 0);
  }
  embps_wal_close(w);
  seg(path, len, dir, 1);
  assert_int_equal(record_offsets(path, offs, 32), 5);
}

/* Makes the segment at path one of format `version` (1 or 2: no epochs,
 * the word 0): its header's version, each record's epoch word zeroed. */
static void downgrade(const char *path, uint32_t version) {
  long offs[32];
  int n = record_offsets(path, offs, 32);
  uint8_t h[EMBPS_WAL_HEADER_BYTES];
  pread_at(path, 0, h, sizeof h);
  embps_put32(h + 8, version);
  embps_put32(h + 28, embps_crc32c(0, h, 28));
  pwrite_at(path, 0, h, sizeof h);
  for (int i = 0; i < n; i++) {
    pread_at(path, offs[i], h, sizeof h);
    embps_put32(h + 24, 0);
    embps_put32(h + 28, embps_crc32c(0, h, 28));
    pwrite_at(path, offs[i], h, sizeof h);
  }
}

/* Segments of formats 1 (records back to back) and 2 (a record after a
 * sync on a new page) wrote no epochs: they still replay, their records
 * as epoch 1's, beside a format-3 segment written after them (a server
 * upgraded over its data dir); a version past this build's is refused. */
static void test_old_formats_read_as_epoch_1(void **state) {
  char dir[64], path[128], err[512];
  long offs[32];
  seen_t s = {0};
  uint64_t last;
  make_dir(dir, sizeof dir);
  write_log(dir, 1, 3, EMBPS_FSYNC_NEVER);
  seg(path, sizeof path, dir, 1);
  downgrade(path, 1);
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(s.n, 3);
  for (int i = 0; i < 3; i++)
    assert_int_equal(s.epochs[i], 1);
  uint8_t h[EMBPS_WAL_HEADER_BYTES];
  pread_at(path, 0, h, sizeof h);
  embps_put32(h + 8, EMBPS_WAL_FORMAT + 1);
  embps_put32(h + 28, embps_crc32c(0, h, 28));
  pwrite_at(path, 0, h, sizeof h);
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), -1);
  assert_non_null(strstr(err, "version"));
  remove_dir(dir);

  /* format 2, its records on pages of their own, then a format-3 segment
   * from LSN 6 */
  make_dir(dir, sizeof dir);
  paged_log(dir, 3, path, sizeof path, offs);
  assert_true(offs[1] % EMBPS_WAL_PAGE == 0 && offs[4] % EMBPS_WAL_PAGE == 0);
  downgrade(path, 2);
  write_log(dir, 6, 3, EMBPS_FSYNC_NEVER);
  s.n = 0;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(s.n, 8);
  assert_int_equal(last, 8);
  for (int i = 0; i < 8; i++) {
    assert_int_equal(s.lsns[i], (uint64_t)i + 1);
    assert_int_equal(s.epochs[i], i < 5 ? 1 : epoch_of((uint64_t)i + 1));
  }
  uint32_t epoch;
  assert_int_equal(embps_wal_last(dir, &last, &epoch, err, sizeof err), 0);
  assert_int_equal(last, 8);
  assert_int_equal(epoch, epoch_of(8));
  remove_dir(dir);
}

/* Issue 18.4: what a failed write-back leaves of the log's last record,
 * which began a page (format 2): its pages from the second on lost (zeros
 * to the end) is a torn tail, cut at the end of the record before it;
 * a page lost in its middle, a torn record followed by another, or the
 * same in a format-1 segment (where a page a sync covered may have been
 * written again) is refused, the message naming the command that drops
 * the record, which works. */
static void test_damaged_tail_after_failure(void **state) {
  char dir[64], path[128], err[1024];
  long offs[32];
  seen_t s = {0};
  uint64_t last;
  make_dir(dir, sizeof dir);
  paged_log(dir, 5, path, sizeof path, offs);
  const long end4 = offs[3] + EMBPS_WAL_HEADER_BYTES + 300;
  assert_int_equal(offs[4] % EMBPS_WAL_PAGE, 0);
  zero_range(path, offs[4] + EMBPS_WAL_PAGE, -1);
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(s.n, 4);
  assert_int_equal(last, 4);
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_size, end4);
  remove_dir(dir);

  /* a page lost in the middle: refused, the command works */
  make_dir(dir, sizeof dir);
  paged_log(dir, 5, path, sizeof path, offs);
  zero_range(path, offs[4] + EMBPS_WAL_PAGE, offs[4] + 2 * EMBPS_WAL_PAGE);
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), -1);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "truncate -s %ld '%s'", end4, path);
  if (!strstr(err, cmd))
    fail_msg("no \"%s\" in: %s", cmd, err);
  assert_int_equal(system(cmd), 0);
  s.n = 0;
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(s.n, 4);
  remove_dir(dir);

  /* a torn record with a good one after it: refused */
  make_dir(dir, sizeof dir);
  paged_log(dir, 4, path, sizeof path, offs);
  zero_range(path, offs[3] + EMBPS_WAL_PAGE, offs[4]);
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), -1);
  assert_non_null(strstr(err, "checksum mismatch"));
  remove_dir(dir);

  /* format 1: a torn-looking last record is refused */
  make_dir(dir, sizeof dir);
  paged_log(dir, 5, path, sizeof path, offs);
  zero_range(path, offs[4] + EMBPS_WAL_PAGE, -1);
  FILE *f = fopen(path, "r+b");
  uint8_t h[EMBPS_WAL_HEADER_BYTES];
  assert_int_equal(fread(h, 1, sizeof h, f), sizeof h);
  embps_put32(h + 8, 1);
  embps_put32(h + 28, embps_crc32c(0, h, 28));
  fseek(f, 0, SEEK_SET);
  assert_int_equal(fwrite(h, 1, sizeof h, f), sizeof h);
  fclose(f);
  assert_int_equal(embps_wal_replay(dir, 0, visit, &s, &last, err,
                                    sizeof err), -1);
  assert_non_null(strstr(err, "truncate -s"));
  remove_dir(dir);
}

/* ------------------------------------------------ files, byte for byte */

typedef struct {
  char path[128];
  uint8_t *bytes;
  size_t len;
} file_t;

static void file_read(file_t *f, const char *path) {
  snprintf(f->path, sizeof f->path, "%s", path);
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  assert_int_equal(fseek(fp, 0, SEEK_END), 0);
  long n = ftell(fp);
  assert_true(n >= 0);
  rewind(fp);
  f->len = (size_t)n;
  f->bytes = malloc(f->len + 1);
  assert_non_null(f->bytes);
  assert_int_equal(fread(f->bytes, 1, f->len, fp), f->len);
  fclose(fp);
}

static void file_write(const file_t *f, const char *path) {
  FILE *fp = fopen(path, "wb");
  assert_non_null(fp);
  assert_int_equal(fwrite(f->bytes, 1, f->len, fp), f->len);
  fclose(fp);
}

/* The file at f->path still holds exactly f's bytes. */
static void file_unchanged(const file_t *f) {
  file_t now;
  file_read(&now, f->path);
  if (now.len != f->len || memcmp(now.bytes, f->bytes, f->len))
    fail_msg("%s was modified (%zu bytes, were %zu)", f->path, now.len,
             f->len);
  free(now.bytes);
}

/* Record i of write_log (lsn first + i) has a payload of 16 + i % 40
 * bytes: its offset in a segment holding records 0.. of that log. */
static size_t rec_offset(int i) {
  size_t off = EMBPS_WAL_HEADER_BYTES;
  for (int k = 0; k < i; k++)
    off += EMBPS_WAL_HEADER_BYTES + 16 + (size_t)k % 40;
  return off;
}

/* A segment that is not the last, cut inside its last record (its payload
 * or its header) or with zeros after it, is refused, naming the file and
 * the offset, and no file of the log is changed: only the last segment's
 * tail may be cut off. */
static void test_cut_middle_segment_refused_unmodified(void **state) {
  char dir[64], first[128], second[128], err[512];
  for (int how = 0; how < 3; how++) {
    make_dir(dir, sizeof dir);
    write_log(dir, 1, 4, EMBPS_FSYNC_NEVER);
    write_log(dir, 5, 2, EMBPS_FSYNC_NEVER);
    seg(first, sizeof first, dir, 1);
    seg(second, sizeof second, dir, 5);
    file_t f;
    file_read(&f, first);
    assert_int_equal(f.len, rec_offset(4));
    const char *what;
    if (how == 0) { /* the payload of record 4 cut short */
      f.len -= 3;
      what = "payload runs past the end";
    } else if (how == 1) { /* inside the header of record 4 */
      f.len = rec_offset(3) + 10;
      what = "short header";
    } else { /* zeros after record 4 */
      f.bytes = realloc(f.bytes, f.len + 100);
      assert_non_null(f.bytes);
      memset(f.bytes + f.len, 0, 100);
      f.len += 100;
      what = "zeros";
    }
    file_write(&f, first);
    file_t g;
    file_read(&g, second);
    seen_t s = {0};
    uint64_t last;
    err[0] = 0;
    int rc = embps_wal_replay(dir, 0, visit, &s, &last, err, sizeof err);
    file_unchanged(&f);
    file_unchanged(&g);
    assert_int_equal(rc, -1);
    if (!strstr(err, first) || !strstr(err, "offset") || !strstr(err, what) ||
        !strstr(err, "not the last"))
      fail_msg("cut %d: the error \"%s\" does not say where and what", how,
               err);
    free(f.bytes);
    free(g.bytes);
    remove_dir(dir);
  }
}

/* embps_wal_delete_upto(lsn) deletes exactly the segments whose records
 * are all <= lsn, never the last one, and leaves the others as they were:
 * segments 1 (records 1-3), 4 (4-6) and 7 (7-9), every lsn from 0 to 10. */
static void test_delete_upto_boundary(void **state) {
  char dir[64], path[128], err[512];
  const uint64_t firsts[3] = {1, 4, 7};
  for (uint64_t lsn = 0; lsn <= 10; lsn++) {
    make_dir(dir, sizeof dir);
    file_t f[3];
    for (int k = 0; k < 3; k++) {
      write_log(dir, firsts[k], 3, EMBPS_FSYNC_NEVER);
      seg(path, sizeof path, dir, firsts[k]);
      file_read(&f[k], path);
    }
    embps_wal_delete_upto(dir, lsn);
    for (int k = 0; k < 3; k++) {
      int gone = k < 2 && lsn >= firsts[k] + 2;
      struct stat st;
      int exists = stat(f[k].path, &st) == 0;
      if (exists == gone)
        fail_msg("delete_upto(%" PRIu64 "): segment %" PRIu64 " (records "
                 "%" PRIu64 "-%" PRIu64 ") %s", lsn, firsts[k], firsts[k],
                 firsts[k] + 2, gone ? "kept" : "deleted");
      if (exists)
        file_unchanged(&f[k]);
      free(f[k].bytes);
    }
    /* what is left replays from lsn on */
    seen_t s = {0};
    uint64_t last;
    assert_int_equal(embps_wal_replay(dir, lsn, visit, &s, &last, err,
                                      sizeof err), 0);
    assert_int_equal(s.n, lsn < 9 ? 9 - lsn : 0);
    assert_int_equal(last, lsn < 9 ? 9 : lsn);
    remove_dir(dir);
  }
}

/* Records inside a segment must follow each other, even where the
 * checkpoint covers them (at or below `after`, so never visited): two
 * swapped, or one written twice, is a log that is not what the writer
 * wrote. Built by splicing the records of a well-formed segment. */
static void test_lsn_order_within_segment(void **state) {
  char dir[64], path[128], err[512];
  make_dir(dir, sizeof dir);
  write_log(dir, 1, 4, EMBPS_FSYNC_NEVER);
  seg(path, sizeof path, dir, 1);
  file_t f;
  file_read(&f, path);
  static const int orders[2][5] = {{0, 2, 1, 3, -1}, {0, 1, 1, 2, 3}};
  static const char *const wants[2] = {"LSN 3 where 2", "LSN 2 where 3"};
  for (int o = 0; o < 2; o++) {
    file_t g = {.len = EMBPS_WAL_HEADER_BYTES};
    g.bytes = malloc(2 * f.len);
    assert_non_null(g.bytes);
    memcpy(g.bytes, f.bytes, EMBPS_WAL_HEADER_BYTES);
    for (int k = 0; k < 5 && orders[o][k] >= 0; k++) {
      int i = orders[o][k];
      size_t n = rec_offset(i + 1) - rec_offset(i);
      memcpy(g.bytes + g.len, f.bytes + rec_offset(i), n);
      g.len += n;
    }
    file_write(&g, path);
    seen_t s = {0};
    uint64_t last;
    err[0] = 0;
    assert_int_equal(embps_wal_replay(dir, 3, visit, &s, &last, err,
                                      sizeof err), -1);
    if (!strstr(err, path) || !strstr(err, wants[o]))
      fail_msg("records in order %d: \"%s\" (want \"%s\")", o, err,
               wants[o]);
    free(g.bytes);
  }
  /* put back in order, the same segment replays */
  file_write(&f, path);
  seen_t s = {0};
  uint64_t last;
  assert_int_equal(embps_wal_replay(dir, 3, visit, &s, &last, err,
                                    sizeof err), 0);
  assert_int_equal(s.n, 1);
  assert_int_equal(s.lsns[0], 4);
  free(f.bytes);
  remove_dir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_parse),
      cmocka_unit_test(test_last_and_cut),
      cmocka_unit_test(test_roundtrip_and_ack),
      cmocka_unit_test(test_torn_tail_truncated),
      cmocka_unit_test(test_every_flipped_byte_refused),
      cmocka_unit_test(test_gap_refused_rotation_deletes),
      cmocka_unit_test(test_torn_tail_before_empty_segment),
      cmocka_unit_test(test_sync_writes_queued_records),
      cmocka_unit_test(test_cut_middle_segment_refused_unmodified),
      cmocka_unit_test(test_delete_upto_boundary),
      cmocka_unit_test(test_lsn_order_within_segment),
      cmocka_unit_test(test_page_after_sync),
      cmocka_unit_test(test_damaged_tail_after_failure),
      cmocka_unit_test(test_old_formats_read_as_epoch_1),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
