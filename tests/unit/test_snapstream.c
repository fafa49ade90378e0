/* test_snapstream.c - a checkpoint as a snapshot stream (common/
 * snapstream.c, server/ckpt.c's stream sink and stream loader): the
 * stream's files are byte for byte the files embps_ckpt_write puts in a
 * directory (a dense Adam f16 table, a dynamic FTRL bf16 one, an LRU+TTL
 * table with shard state over several blocks, a table of several 16 MiB
 * chunks); loaded as it arrives, in pieces of 1 byte to the whole stream,
 * into 1, 7 and 16 shards, it gives exactly what loading the directory
 * gives (rows, optimizer state probed by one more step, steps, counters,
 * recency and shard state, the exactly-once table, shard LSNs); every
 * flipped byte and every cut of the stream is refused with the stream
 * named; the framing reader refuses what does not follow the format; a
 * head naming a newer checkpoint format is refused as a newer version's. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "le.h"
#include "snapstream.h"
#include "table.h"
#include "util.h"

#define DIM 5
#define ROWS 40

/* ------------------------------------------------------------ fixture */

typedef struct {
  uint8_t *p;
  size_t n, cap;
} mem_t;

static int mem_put(void *ctx, const void *p, size_t n, char *err,
                   size_t err_len) {
  mem_t *m = ctx;
  (void)err;
  (void)err_len;
  if (m->n + n > m->cap) {
    m->cap = (m->n + n) * 2;
    m->p = realloc(m->p, m->cap);
    assert_non_null(m->p);
  }
  memcpy(m->p + m->n, p, n);
  m->n += n;
  return 0;
}

/* put_block: the block's bytes appended, its buffer freed. */
static int mem_put_block(void *ctx, uint8_t *buf, size_t off, size_t n,
                         char *err, size_t err_len) {
  assert_true(off >= EMBPS_CKPT_BLOCK_ROOM - 24);
  int rc = mem_put(ctx, buf + off, n, err, err_len);
  free(buf);
  return rc;
}

/* Reads a stream held in memory, piece bytes at a time. */
typedef struct {
  const uint8_t *p;
  size_t n, off, piece;
} src_t;

static int src_next(void *ctx, const uint8_t **p, size_t *n, char *err,
                    size_t err_len) {
  src_t *s = ctx;
  (void)err;
  (void)err_len;
  size_t k = s->n - s->off < s->piece ? s->n - s->off : s->piece;
  *p = s->p + s->off;
  *n = k;
  s->off += k;
  return 0;
}

typedef struct {
  char dir[64];
  embps_table_t *t[4];
  size_t n;
  embps_ckpt_table_t tables[4];
  embps_ckpt_seen_t seen[3];
  embps_ckpt_t c;
  mem_t stream, blocks; /* written with put, and with put_block too */
} fx_t;

static void push_rows(embps_table_t *t, const int64_t *ids, size_t n,
                      uint32_t dim, int seed, uint64_t lsn) {
  embps_table_scratch_t s;
  embps_table_scratch_init(&s);
  float *g = malloc(n * dim * sizeof *g);
  assert_non_null(g);
  for (size_t k = 0; k < n * dim; k++)
    g[k] = (float)((k * 7 + (size_t)seed) % 13) / 6.0f - 1.0f;
  assert_int_equal(embps_table_prepare(t, &s, ids, n, 0), 0);
  embps_table_commit(t, &s, ids, g, n, lsn);
  free(g);
  embps_table_scratch_close(&s);
}

static int64_t dyn_id(int k) { return (int64_t)k * 1000003 - 7000; }

/* Table i of the fixture: 0 dense Adam f16, 1 dynamic FTRL bf16, 2 LRU
 * with TTL (shard state, several blocks a shard), 3 (big only) dense
 * Adagrad of several 16 MiB chunks. */
static embps_table_t *make_table(int i, uint32_t *dim) {
  embps_table_spec_t s;
  static const char *const names[] = {"dense", "dyn", "lru", "big"};
  static const embps_optimizer_t opts[] = {EMBPS_OPT_ADAM, EMBPS_OPT_FTRL,
                                           EMBPS_OPT_ADAGRAD,
                                           EMBPS_OPT_ADAGRAD};
  *dim = i == 3 ? 128 : i == 2 ? 8 : DIM;
  embps_table_spec_init(&s, names[i], *dim, opts[i]);
  s.init = EMBPS_INIT_UNIFORM;
  s.init_value = 0.2;
  if (i == 0)
    s.dtype = EMBPS_DTYPE_F16;
  if (i == 1)
    s.dtype = EMBPS_DTYPE_BF16;
  if (i == 0)
    s.rows = ROWS;
  else if (i == 3)
    s.rows = 40000;
  else
    s.dynamic = 1;
  if (i == 2) {
    s.ttl_steps = 3;
    s.max_rows = 90000;
    s.evict = EMBPS_EVICT_LRU;
  }
  embps_table_t *t;
  assert_int_equal(embps_table_create(&s, i == 3 ? 3 : i == 2 ? 4 : 16, 1,
                                      &t), 0);
  embps_table_set_incarnation(t, 1 + (uint64_t)i);
  const size_t n = i == 3 ? 40000 : i == 2 ? 60000 : ROWS / 2;
  int64_t *ids = malloc(n * sizeof *ids);
  assert_non_null(ids);
  for (int round = 0; round < (i == 2 ? 6 : 4); round++) {
    for (size_t k = 0; k < n; k++) {
      size_t j = i == 2 ? k + (size_t)round * n / 3 : (k * 3 + (size_t)round) % (i == 3 ? n : ROWS);
      ids[k] = i == 1 || i == 2 ? dyn_id((int)j) : (int64_t)j;
    }
    push_rows(t, ids, n, *dim, round, 3 + (uint64_t)round * 2 + (uint64_t)i);
  }
  free(ids);
  return t;
}

/* The fixture's checkpoint (3 tables, or 4 with the big one), written to
 * a directory at LSN 10 and to a stream. */
static void fx_make(fx_t *f, int big) {
  memset(f, 0, sizeof *f);
  snprintf(f->dir, sizeof f->dir, "/tmp/embps-snaps-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  f->n = big ? 4 : 3;
  for (size_t i = 0; i < f->n; i++) {
    uint32_t dim;
    f->t[i] = make_table((int)i, &dim);
    embps_table_info_t info;
    embps_table_info(f->t[i], &info);
    f->tables[i] = (embps_ckpt_table_t){f->t[i], 1 + (uint64_t)i, info.step,
                                        0, NULL, info.spec};
  }
  for (int i = 0; i < 3; i++)
    f->seen[i] = (embps_ckpt_seen_t){100 + (uint64_t)i, 7 * (uint64_t)i + 1};
  f->c = (embps_ckpt_t){.lsn = 10, .cluster_size = 1, .shards = 16,
                        .seen = f->seen, .n_seen = 3, .tables = f->tables,
                        .n_tables = f->n};
  char err[1024];
  embps_ckpt_result_t res, sres;
  assert_int_equal(embps_ckpt_write(f->dir, &f->c, &res, err, sizeof err),
                   0);
  for (int with_blocks = 0; with_blocks < 2; with_blocks++) {
    embps_ckpt_stream_t s;
    mem_t *m = with_blocks ? &f->blocks : &f->stream;
    embps_ckpt_stream_init(&s, mem_put, with_blocks ? mem_put_block : NULL,
                           m);
    if (embps_ckpt_stream_head(&s, &f->c, 0, err, sizeof err) ||
        embps_ckpt_emit(&s.base, &f->c, &sres, err, sizeof err) ||
        embps_ckpt_stream_end(&s, f->c.lsn, err, sizeof err))
      fail_msg("%s", err);
  }
  /* the blocks' framing differs (a block's header and records in one DATA
   * piece), not the files: both streams are checked below */
  assert_true(f->blocks.n < f->stream.n);
  assert_int_equal(res.bytes, sres.bytes);
  assert_int_equal(sres.max_lsn, res.max_lsn);
  assert_int_equal(sres.max_lsn, 3 + 2 * 5 + 2); /* the LRU table's last */
}

static void fx_free(fx_t *f) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
  assert_int_equal(system(cmd), 0);
  for (size_t i = 0; i < f->n; i++)
    embps_table_unref(f->t[i]);
  free(f->stream.p);
  free(f->blocks.p);
}

/* ------------------------------------------------------------ tests */

/* Every entry of the stream holds the bytes of the directory's file of its
 * name, and the entries are the directory's files, tables first. */
static void files_equal_directory(int big) {
  fx_t f;
  fx_make(&f, big);
  static const size_t pieces[] = {1, 7, 4096, 1 << 20, SIZE_MAX};
  for (size_t pi = 0; pi < 2 * sizeof pieces / sizeof *pieces; pi++) {
    const mem_t *m = pi % 2 ? &f.blocks : &f.stream;
    if (big && pieces[pi / 2] < 4096)
      continue;
    src_t src = {m->p, m->n, 0, pieces[pi / 2]};
    embps_snapstream_reader_t r;
    embps_snapstream_reader_init(&r, src_next, &src);
    embps_snapstream_head_t h;
    char err[512];
    assert_int_equal(embps_snapstream_head(&r, &h, err, sizeof err), 0);
    assert_int_equal(h.lsn, 10);
    assert_int_equal(h.shards, 16);
    assert_int_equal(h.ckpt_format, EMBPS_CKPT_FORMAT);
    size_t files = 0;
    embps_snapstream_entry_t e;
    int got;
    while ((got = embps_snapstream_entry(&r, &e, err, sizeof err)) == 1) {
      char name[64], path[256];
      embps_snapstream_entry_name(&e, name, sizeof name);
      assert_int_equal(e.type, files < f.n ? EMBPS_SNAPSTREAM_TABLE
                                           : EMBPS_SNAPSTREAM_MANIFEST);
      snprintf(path, sizeof path, "%s/ckpt-%016x/%s", f.dir, 10, name);
      char *want;
      size_t want_len;
      assert_int_equal(embps_read_file(path, &want, &want_len), 0);
      uint8_t *have = malloc(want_len + 1);
      size_t have_len = 0;
      const uint8_t *p;
      size_t n;
      for (;;) {
        assert_int_equal(embps_snapstream_piece(&r, &p, &n, err, sizeof err),
                         0);
        if (!n)
          break;
        assert_true(have_len + n <= want_len);
        memcpy(have + have_len, p, n);
        have_len += n;
      }
      assert_int_equal(have_len, want_len);
      if (memcmp(have, want, want_len))
        fail_msg("%s differs from the directory's", name);
      free(have);
      free(want);
      free(e.info);
      files++;
    }
    assert_int_equal(got, 0);
    assert_int_equal(files, f.n + 1);
    assert_int_equal(r.end.lsn, 10);
  }
  fx_free(&f);
}

static void test_files_equal_directory(void **state) {
  (void)state;
  files_equal_directory(0);
}

static void test_big_files_equal_directory(void **state) {
  (void)state;
  files_equal_directory(1);
}

/* Shard k of a and b: the same records (file form, recency order) and
 * shard state (but its longest stall, a time, at bytes 72..79). */
static void same_shards(embps_table_t *a, embps_table_t *b) {
  assert_int_equal(embps_table_n_shards(a), embps_table_n_shards(b));
  const size_t fr = embps_table_file_record_bytes(a);
  for (uint32_t k = 0; k < embps_table_n_shards(a); k++) {
    unsigned char *sa = NULL, *sb = NULL;
    size_t la = 0, lb = 0;
    uint64_t lsn, held;
    embps_table_blocks_t ba = {.per = 1000}, bb = {.per = 1000};
    assert_int_equal(embps_table_snapshot_shard(a, k, &ba, &lsn, &sa, &la,
                                                &held), 0);
    assert_int_equal(embps_table_snapshot_shard(b, k, &bb, &lsn, &sb, &lb,
                                                &held), 0);
    assert_int_equal(ba.n, bb.n);
    for (size_t i = 0; i < ba.n; i++) {
      assert_int_equal(ba.rows[i], bb.rows[i]);
      if (memcmp(ba.buf[i], bb.buf[i], ba.rows[i] * fr))
        fail_msg("shard %u: records differ", k);
    }
    assert_int_equal(la, lb);
    if (la && (memcmp(sa, sb, 72) || memcmp(sa + 80, sb + 80, la - 80)))
      fail_msg("shard %u: shard state differs", k);
    embps_table_blocks_close(&ba);
    embps_table_blocks_close(&bb);
    free(sa);
    free(sb);
  }
}

/* One more identical step to a and b, then their rows must be equal: the
 * optimizer state is the same (for the ids the fixture pushed). */
static void same_after_step(embps_table_t *a, embps_table_t *b, int i) {
  const size_t n = i == 3 ? 40000 : ROWS / 2;
  uint32_t dim = embps_table_spec(a)->dim;
  int64_t *ids = malloc(n * sizeof *ids);
  float *x = malloc(n * dim * sizeof *x), *y = malloc(n * dim * sizeof *y);
  assert_true(ids && x && y);
  for (size_t k = 0; k < n; k++)
    ids[k] = i == 1 || i == 2 ? dyn_id((int)k) : (int64_t)k;
  push_rows(a, ids, n, dim, 99, 0);
  push_rows(b, ids, n, dim, 99, 0);
  embps_table_gather(a, ids, n, x);
  embps_table_gather(b, ids, n, y);
  if (memcmp(x, y, n * dim * sizeof *x))
    fail_msg("table %d: rows differ after one more step", i);
  free(ids);
  free(x);
  free(y);
}

static void same_checkpoint(const embps_ckpt_t *a, const embps_ckpt_t *b) {
  assert_int_equal(a->lsn, b->lsn);
  assert_int_equal(a->cluster_size, b->cluster_size);
  assert_int_equal(a->cluster_index, b->cluster_index);
  assert_int_equal(a->shards, b->shards);
  assert_int_equal(a->n_seen, b->n_seen);
  assert_memory_equal(a->seen, b->seen, a->n_seen * sizeof *a->seen);
  assert_int_equal(a->n_tables, b->n_tables);
  for (size_t i = 0; i < a->n_tables; i++) {
    const embps_ckpt_table_t *x = &a->tables[i], *y = &b->tables[i];
    assert_int_equal(x->incarnation, y->incarnation);
    assert_int_equal(x->step, y->step);
    assert_int_equal(x->file_shards, y->file_shards);
    assert_memory_equal(x->shard_lsn, y->shard_lsn,
                        x->file_shards * sizeof *x->shard_lsn);
    assert_string_equal(x->spec.name, y->spec.name);
    embps_table_info_t u, v;
    embps_table_info(x->table, &u);
    embps_table_info(y->table, &v);
    assert_int_equal(u.step, v.step);
    assert_int_equal(u.rows_allocated, v.rows_allocated);
    assert_int_equal(u.rows_admitted, v.rows_admitted);
    assert_int_equal(u.rows_pending, v.rows_pending);
    assert_int_equal(u.evicted_ttl, v.evicted_ttl);
    assert_int_equal(u.evicted_capacity, v.evicted_capacity);
    same_shards(x->table, y->table);
  }
}

/* Loaded from the stream (in pieces of several sizes) into 1, 7 and 16
 * shards: what loading the directory gives. */
static void load_equals_directory(int big) {
  fx_t f;
  fx_make(&f, big);
  static const uint32_t shards[] = {1, 7, 16};
  static const size_t pieces[] = {1, 4093, SIZE_MAX};
  char err[1024];
  for (size_t si = 0; si < 3; si++) {
    embps_ckpt_t want;
    if (embps_ckpt_load(f.dir, 10, shards[si], 1, &want, err, sizeof err))
      fail_msg("%s", err);
    for (size_t pi = 0; pi < 3; pi++) {
      if (big && pieces[pi] < 4096)
        continue;
      const mem_t *m = pi % 2 ? &f.blocks : &f.stream;
      src_t src = {m->p, m->n, 0, pieces[pi]};
      embps_snapstream_reader_t r;
      embps_snapstream_reader_init(&r, src_next, &src);
      embps_ckpt_t got;
      if (embps_ckpt_load_stream(&r, shards[si], 1, &got, err, sizeof err))
        fail_msg("pieces of %zu: %s", pieces[pi], err);
      same_checkpoint(&want, &got);
      if (pi == 2)
        for (size_t i = 0; i < want.n_tables; i++)
          same_after_step(want.tables[i].table, got.tables[i].table, (int)i);
      embps_ckpt_free(&got);
    }
    embps_ckpt_free(&want);
  }
  fx_free(&f);
}

static void test_load_equals_directory(void **state) {
  (void)state;
  load_equals_directory(0);
}

static void test_big_load_equals_directory(void **state) {
  (void)state;
  load_equals_directory(1);
}

#ifdef EMBPS_TEST_SANITIZED
#define FLIP_STRIDE 17
#else
#define FLIP_STRIDE 1
#endif

/* Every flipped byte and every cut of the stream is refused, naming the
 * snapshot stream; the stream loads again once repaired. The LRU table
 * (a large stream) is left out: its flips are the same kinds. */
static void test_corruption_detected(void **state) {
  (void)state;
  fx_t f;
  fx_make(&f, 0);
  /* a stream of tables 0 and 1 only */
  mem_t m = {0};
  embps_ckpt_t c = f.c;
  c.n_tables = 2;
  embps_ckpt_stream_t s;
  embps_ckpt_stream_init(&s, mem_put, mem_put_block, &m);
  embps_ckpt_result_t res;
  char err[1024];
  if (embps_ckpt_stream_head(&s, &c, 0, err, sizeof err) ||
      embps_ckpt_emit(&s.base, &c, &res, err, sizeof err) ||
      embps_ckpt_stream_end(&s, c.lsn, err, sizeof err))
    fail_msg("%s", err);
  size_t missed = 0;
  for (size_t off = 0; off < m.n; off += FLIP_STRIDE) { /* flips */
    m.p[off] ^= 0x10;
    src_t src = {m.p, m.n, 0, 777};
    embps_snapstream_reader_t r;
    embps_snapstream_reader_init(&r, src_next, &src);
    embps_ckpt_t got;
    if (!embps_ckpt_load_stream(&r, 3, 1, &got, err, sizeof err)) {
      fprintf(stderr, "flip at %zu of %zu not detected\n", off, m.n);
      missed++;
      embps_ckpt_free(&got);
    } else if (!strstr(err, "snapshot stream")) {
      fail_msg("message without the stream: %s", err);
    }
    m.p[off] ^= 0x10;
  }
  for (size_t cut = 0; cut < m.n; cut += FLIP_STRIDE) { /* cuts */
    src_t src = {m.p, cut, 0, 777};
    embps_snapstream_reader_t r;
    embps_snapstream_reader_init(&r, src_next, &src);
    embps_ckpt_t got;
    if (!embps_ckpt_load_stream(&r, 3, 1, &got, err, sizeof err)) {
      fprintf(stderr, "cut at %zu of %zu not detected\n", cut, m.n);
      missed++;
      embps_ckpt_free(&got);
    } else if (!strstr(err, "snapshot stream")) {
      fail_msg("message without the stream: %s", err);
    }
  }
  assert_int_equal(missed, 0);
  src_t src = {m.p, m.n, 0, 777};
  embps_snapstream_reader_t r;
  embps_snapstream_reader_init(&r, src_next, &src);
  embps_ckpt_t got;
  assert_int_equal(embps_ckpt_load_stream(&r, 3, 1, &got, err, sizeof err),
                   0);
  embps_ckpt_free(&got);
  free(m.p);
  fx_free(&f);
}

/* A stream whose head says a checkpoint format above this build's (a newer
 * server's) is refused as such, not as damage. */
static void test_newer_format_refused(void **state) {
  (void)state;
  fx_t f;
  fx_make(&f, 0);
  mem_t m = {0};
  embps_ckpt_t c = f.c;
  c.n_tables = 1;
  embps_ckpt_stream_t s;
  embps_ckpt_stream_init(&s, mem_put, mem_put_block, &m);
  embps_ckpt_result_t res;
  char err[1024], want[128];
  if (embps_ckpt_stream_head(&s, &c, 0, err, sizeof err) ||
      embps_ckpt_emit(&s.base, &c, &res, err, sizeof err) ||
      embps_ckpt_stream_end(&s, c.lsn, err, sizeof err))
    fail_msg("%s", err);
  embps_put32(m.p + 12, EMBPS_CKPT_FORMAT + 1); /* the checkpoint format */
  src_t src = {m.p, m.n, 0, SIZE_MAX};
  embps_snapstream_reader_t r;
  embps_snapstream_reader_init(&r, src_next, &src);
  embps_ckpt_t got;
  assert_int_equal(embps_ckpt_load_stream(&r, 3, 1, &got, err, sizeof err),
                   -1);
  snprintf(want, sizeof want, "snapshot stream: written by a newer version "
           "of embps (format %u; this binary reads up to %u)",
           EMBPS_CKPT_FORMAT + 1, EMBPS_CKPT_FORMAT);
  if (strcmp(err, want))
    fail_msg("refused with \"%s\", want \"%s\"", err, want);
  free(m.p);
  fx_free(&f);
}

/* The reader's own checks: a stream's framing, given by hand. */
static void test_reader_refuses_bad_framing(void **state) {
  (void)state;
  uint8_t b[512];
  size_t n = 0;
  const embps_snapstream_head_t h = {EMBPS_SNAPSTREAM_VERSION, 3, 5, 1, 0,
                                     4, EMBPS_SNAPSTREAM_WITH_LOG};
  n += embps_snapstream_put_head(b + n, &h);
  const embps_snapstream_entry_t e = {EMBPS_SNAPSTREAM_LOG, 6, 0, 0, NULL};
  n += embps_snapstream_put_entry(b + n, &e);
  n += embps_snapstream_put_data(b + n, 3);
  memcpy(b + n, "abc", 3);
  n += 3;
  n += embps_snapstream_put_data(b + n, 2);
  memcpy(b + n, "de", 2);
  n += 2;
  n += embps_snapstream_put_fend(b + n, 5);
  const embps_snapstream_end_t end = {1, 9};
  n += embps_snapstream_put_end(b + n, &end);
  char err[512];
  /* well formed: a LOG entry of 5 bytes, read 4 then its end refused,
   * then read whole */
  for (int pass = 0; pass < 2; pass++) {
    src_t src = {b, n, 0, 3};
    embps_snapstream_reader_t r;
    embps_snapstream_reader_init(&r, src_next, &src);
    embps_snapstream_head_t hh;
    assert_int_equal(embps_snapstream_head(&r, &hh, err, sizeof err), 0);
    assert_int_equal(hh.flags, EMBPS_SNAPSTREAM_WITH_LOG);
    embps_snapstream_entry_t ee;
    assert_int_equal(embps_snapstream_entry(&r, &ee, err, sizeof err), 1);
    assert_int_equal(ee.type, EMBPS_SNAPSTREAM_LOG);
    assert_int_equal(ee.id, 6);
    char name[64];
    embps_snapstream_entry_name(&ee, name, sizeof name);
    assert_string_equal(name, "0000000000000006.log");
    uint8_t got[8];
    uint64_t bytes;
    if (!pass) {
      assert_int_equal(embps_snapstream_read(&r, got, 4, "x", err,
                                             sizeof err), 0);
      assert_memory_equal(got, "abcd", 4);
      assert_int_equal(embps_snapstream_file_end(&r, &bytes, err,
                                                 sizeof err), -1);
      assert_non_null(strstr(err, "1 more bytes"));
      continue;
    }
    assert_int_equal(embps_snapstream_read(&r, got, 6, "x", err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "the file ends at 5"));
    assert_int_equal(embps_snapstream_file_end(&r, &bytes, err, sizeof err),
                     0);
    assert_int_equal(bytes, 5);
    assert_int_equal(embps_snapstream_entry(&r, &ee, err, sizeof err), 0);
    assert_int_equal(r.end.lsn, 9);
  }
  /* bytes after the end; a wrong count; another version */
  b[n] = 0;
  src_t src = {b, n + 1, 0, 64};
  embps_snapstream_reader_t r;
  embps_snapstream_reader_init(&r, src_next, &src);
  embps_snapstream_head_t hh;
  embps_snapstream_entry_t ee;
  const uint8_t *p;
  size_t k;
  assert_int_equal(embps_snapstream_head(&r, &hh, err, sizeof err), 0);
  assert_int_equal(embps_snapstream_entry(&r, &ee, err, sizeof err), 1);
  while (!embps_snapstream_piece(&r, &p, &k, err, sizeof err) && k)
    ;
  assert_int_equal(embps_snapstream_entry(&r, &ee, err, sizeof err), -1);
  assert_non_null(strstr(err, "bytes after the stream's end"));
  b[n - 28] = 2; /* the end counts 2 entries */
  src = (src_t){b, n, 0, 64};
  embps_snapstream_reader_init(&r, src_next, &src);
  assert_int_equal(embps_snapstream_head(&r, &hh, err, sizeof err), 0);
  assert_int_equal(embps_snapstream_entry(&r, &ee, err, sizeof err), 1);
  while (!embps_snapstream_piece(&r, &p, &k, err, sizeof err) && k)
    ;
  assert_int_equal(embps_snapstream_entry(&r, &ee, err, sizeof err), -1);
  assert_non_null(strstr(err, "counts 2 files, 1 came"));
  b[8] = 9; /* stream version 9 */
  src = (src_t){b, n, 0, 64};
  embps_snapstream_reader_init(&r, src_next, &src);
  assert_int_equal(embps_snapstream_head(&r, &hh, err, sizeof err), -1);
  assert_non_null(strstr(err, "stream version 9"));
  /* a stream with LOG entries is a backup's: the loader refuses it */
  b[8] = EMBPS_SNAPSTREAM_VERSION;
  b[n - 28] = 1;
  src = (src_t){b, n, 0, 64};
  embps_snapstream_reader_init(&r, src_next, &src);
  embps_ckpt_t c;
  assert_int_equal(embps_ckpt_load_stream(&r, 4, 1, &c, err, sizeof err), -1);
  assert_non_null(strstr(err, "log segments"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_files_equal_directory),
      cmocka_unit_test(test_load_equals_directory),
      cmocka_unit_test(test_corruption_detected),
      cmocka_unit_test(test_reader_refuses_bad_framing),
      cmocka_unit_test(test_newer_format_refused),
      cmocka_unit_test(test_big_files_equal_directory),
      cmocka_unit_test(test_big_load_equals_directory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
