/* test_redo.c - applying log records to tables (server/redo.c), apart from
 * any restore: records built by hand from the payload formats in redo.h
 * are applied to a bare registry, as a follower will apply shipped ones.
 *  - CREATE, PUSH (with its exactly-once pair), ALTER, ROWS (with the
 *    step) and DROP change the tables as the live server did;
 *  - a table known from a checkpoint takes a record's rows only in the
 *    shards whose snapshot is older than the record;
 *  - EVICT evicts the rows below the table's L2 threshold;
 *  - a record that does not decode, or names a table that does not exist,
 *    is refused with a message and changes nothing;
 *  - a PUSH record carries the evictions its push made (TTL reclaims and
 *    capacity, LRU and LFU): applied, a table ends row for row, state and
 *    counters equal to the one that decided them; the evictions applied
 *    are the record's, not decided again (one left out of a record stays
 *    a row; an id without a row is refused). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "le.h"
#include "redo.h"
#include "route.h"
#include "server.h"

#define SHARDS 4
#define DIM 2

typedef struct {
  embps_server_t srv;
  embps_seen_t seen;
  embps_redo_t redo;
  uint8_t buf[4096];
  char err[512];
} fixture_t;

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  f->srv.cfg.shards = SHARDS;
  f->srv.cfg.cluster_size = 1;
  embps_registry_init(&f->srv.registry);
  embps_seen_init(&f->seen);
  embps_redo_init(&f->redo, &f->srv, &f->srv.registry, &f->seen);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture_t *f = *state;
  embps_redo_close(&f->redo);
  embps_seen_close(&f->seen);
  embps_registry_close(&f->srv.registry);
  free(f);
  return 0;
}

/* Applies a record of type at lsn whose payload is f->buf[0..len). */
static int apply(fixture_t *f, uint32_t type, uint64_t lsn, size_t len) {
  embps_wal_rec_t rec = {.type = type, .lsn = lsn, .payload = f->buf,
                         .len = (uint32_t)len};
  f->err[0] = 0;
  return embps_redo_apply(&f->redo, &rec, f->err, sizeof f->err);
}

static void spec_of(embps_table_spec_t *s, const char *name) {
  embps_table_spec_init(s, name, DIM, EMBPS_OPT_SGD);
  s->rows = 64;
  s->lr = 1.0;
}

/* CREATE or ALTER: incarnation, packed spec. */
static size_t put_spec(fixture_t *f, uint64_t inc,
                       const embps_table_spec_t *spec) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_CREATE;
  m.u.spec = *spec;
  embps_put64(f->buf, inc);
  embps_msg_pack(&m, f->buf + 8);
  return 8 + embps_msg_size(&m);
}

/* PUSH of rows ids with gradient g (rows x DIM), one (client, seq) pair. */
static size_t put_push(fixture_t *f, uint64_t inc, uint64_t step,
                       uint64_t client, uint64_t seq, const int64_t *ids,
                       uint32_t rows, const float *g) {
  uint8_t *p = f->buf;
  memset(p, 0, EMBPS_REDO_PUSH_HEAD);
  embps_put64(p, inc);
  embps_put64(p + 8, step);
  embps_put32(p + 16, 1);
  embps_put32(p + 20, rows);
  embps_put32(p + 24, DIM);
  p += EMBPS_REDO_PUSH_HEAD;
  embps_put64(p, client);
  embps_put64(p + 8, seq);
  p += 16;
  memcpy(p, ids, rows * sizeof *ids);
  p += rows * sizeof *ids;
  memcpy(p, g, rows * DIM * sizeof *g);
  p += rows * DIM * sizeof *g;
  return (size_t)(p - f->buf);
}

static embps_table_t *get(fixture_t *f, const char *name) {
  return embps_registry_get(&f->srv.registry, name);
}

static void check_row(embps_table_t *t, int64_t id, float a, float b) {
  float out[DIM];
  embps_table_gather(t, &id, 1, out);
  assert_float_equal(out[0], a, 1e-6);
  assert_float_equal(out[1], b, 1e-6);
}

static uint64_t step_of(embps_table_t *t) {
  embps_table_info_t info;
  embps_table_info(t, &info);
  return info.step;
}

static void test_create_push_alter_rows_drop(void **state) {
  fixture_t *f = *state;
  embps_table_spec_t spec;
  spec_of(&spec, "emb");
  assert_int_equal(apply(f, EMBPS_WAL_CREATE, 1, put_spec(f, 1, &spec)), 0);
  embps_table_t *t = get(f, "emb");
  assert_non_null(t);
  assert_int_equal(embps_table_incarnation(t), 1);

  const int64_t ids[] = {3, 5};
  const float g[] = {0.5f, -1, 2, 0.25f};
  assert_int_equal(
      apply(f, EMBPS_WAL_PUSH, 2, put_push(f, 1, 1, 7, 3, ids, 2, g)), 0);
  check_row(t, 3, -0.5f, 1); /* SGD, lr 1, from zeros */
  check_row(t, 5, -2, -0.25f);
  check_row(t, 4, 0, 0);
  assert_int_equal(step_of(t), 1);
  assert_true(embps_seen_applied(&f->seen, 7, 3));
  assert_false(embps_seen_applied(&f->seen, 7, 4));

  spec.lr = 0.5; /* ALTER: the next push uses it */
  assert_int_equal(apply(f, EMBPS_WAL_ALTER, 3, put_spec(f, 1, &spec)), 0);
  assert_int_equal(
      apply(f, EMBPS_WAL_PUSH, 4, put_push(f, 1, 2, 7, 4, ids, 2, g)), 0);
  check_row(t, 3, -0.75f, 1.5f);
  assert_int_equal(step_of(t), 2);

  /* ROWS: row 9 set to {1, 2} (initial state), the step set to 10 */
  uint8_t *p = f->buf;
  memset(p, 0, EMBPS_REDO_ROWS_HEAD);
  embps_put64(p, 1);
  embps_put64(p + 8, 10);
  embps_put32(p + 16, EMBPS_REDO_ROWS_SET_STEP);
  embps_put32(p + 20, 1);
  embps_put32(p + 24, DIM);
  const int64_t row = 9;
  const float w[DIM] = {1, 2};
  memcpy(p + EMBPS_REDO_ROWS_HEAD, &row, 8);
  memcpy(p + EMBPS_REDO_ROWS_HEAD + 8, w, sizeof w);
  assert_int_equal(apply(f, EMBPS_WAL_ROWS, 5,
                         EMBPS_REDO_ROWS_HEAD + 8 + sizeof w), 0);
  check_row(t, 9, 1, 2);
  assert_int_equal(step_of(t), 10);

  embps_put64(f->buf, 1);
  assert_int_equal(apply(f, EMBPS_WAL_DROP, 6, 8), 0);
  embps_table_t *gone = get(f, "emb");
  assert_null(gone);
  check_row(t, 9, 1, 2); /* a dropped table's rows are left alone */
  embps_table_unref(t);

  /* the name again: another incarnation, a new table */
  assert_int_equal(apply(f, EMBPS_WAL_CREATE, 7, put_spec(f, 7, &spec)), 0);
  t = get(f, "emb");
  check_row(t, 3, 0, 0);
  embps_table_unref(t);
}

/* A table restored from a checkpoint whose shards were copied at LSNs 5,
 * 10, 5, 10: a record at LSN 10 changes only the rows of shards 0 and 2
 * (shards 1 and 3 were copied with it applied). */
static void test_checkpoint_shards(void **state) {
  fixture_t *f = *state;
  embps_table_spec_t spec;
  spec_of(&spec, "ck");
  embps_table_t *t;
  assert_int_equal(embps_table_create(&spec, SHARDS, 1, &t), 0);
  embps_table_set_incarnation(t, 2);
  assert_int_equal(embps_registry_add(&f->srv.registry, t), 0);
  const uint64_t shard_lsn[SHARDS] = {5, 10, 5, 10};
  assert_int_equal(embps_redo_add_table(&f->redo, t, 2, SHARDS, shard_lsn), 0);

  int64_t ids[16];
  float g[16 * DIM];
  for (int i = 0; i < 16; i++) {
    ids[i] = i;
    g[2 * i] = 1;
    g[2 * i + 1] = 2;
  }
  assert_int_equal(
      apply(f, EMBPS_WAL_PUSH, 10, put_push(f, 2, 1, 0, 0, ids, 16, g)), 0);
  int changed = 0, kept = 0;
  for (int i = 0; i < 16; i++) {
    float out[DIM];
    embps_table_gather(t, &ids[i], 1, out);
    if (shard_lsn[embps_route_shard(ids[i], SHARDS)] < 10) {
      assert_float_equal(out[0], -1, 1e-6);
      changed++;
    } else {
      assert_float_equal(out[0], 0, 1e-6);
      kept++;
    }
  }
  assert_true(changed > 0 && kept > 0);
}

static void test_evict(void **state) {
  fixture_t *f = *state;
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "dyn", DIM, EMBPS_OPT_SGD);
  spec.dynamic = 1;
  spec.lr = 1.0;
  spec.evict_l2_below = 0.5;
  assert_int_equal(apply(f, EMBPS_WAL_CREATE, 1, put_spec(f, 1, &spec)), 0);
  const int64_t ids[] = {100, 200, 300};
  const float g[] = {0.1f, 0, 3, 4, 0, 0.2f}; /* norms 0.1, 5, 0.2 */
  assert_int_equal(
      apply(f, EMBPS_WAL_PUSH, 2, put_push(f, 1, 1, 0, 0, ids, 3, g)), 0);
  embps_table_t *t = get(f, "dyn");
  assert_int_equal(embps_table_row_live(t, 100), 1);
  embps_put64(f->buf, 1);
  embps_put64(f->buf + 8, 1);
  assert_int_equal(apply(f, EMBPS_WAL_EVICT, 3, 16), 0);
  assert_int_equal(embps_table_row_live(t, 100), 0);
  assert_int_equal(embps_table_row_live(t, 200), 1);
  assert_int_equal(embps_table_row_live(t, 300), 0);
  embps_table_unref(t);
}

/* err must hold want; the table set must be what it was. */
static void refused(fixture_t *f, int rc, const char *want) {
  assert_int_equal(rc, -1);
  if (!strstr(f->err, want))
    fail_msg("error \"%s\" does not say \"%s\"", f->err, want);
}

static void test_refused(void **state) {
  fixture_t *f = *state;
  embps_table_spec_t spec;
  spec_of(&spec, "emb");
  const int64_t ids[] = {1};
  const float g[] = {1, 1};
  refused(f, apply(f, EMBPS_WAL_PUSH, 1, put_push(f, 9, 1, 0, 0, ids, 1, g)),
          "does not exist");
  assert_int_equal(apply(f, EMBPS_WAL_CREATE, 1, put_spec(f, 1, &spec)), 0);
  size_t len = put_push(f, 1, 1, 0, 0, ids, 1, g);
  refused(f, apply(f, EMBPS_WAL_PUSH, 2, len - 1), "does not match");
  refused(f, apply(f, EMBPS_WAL_PUSH, 2, 16), "short push record");
  embps_put32(f->buf + 24, DIM + 1); /* a dim that is not the table's */
  embps_put32(f->buf + 20, 0);       /* no rows, so the length matches */
  refused(f, apply(f, EMBPS_WAL_PUSH, 2, EMBPS_REDO_PUSH_HEAD + 16),
          "push of dim 3");
  refused(f, apply(f, EMBPS_WAL_CREATE, 2, put_spec(f, 2, &spec)),
          "created twice");
  len = put_spec(f, 3, &spec);
  memset(f->buf + 8, 0xff, len - 8);
  refused(f, apply(f, EMBPS_WAL_CREATE, 2, len), "does not decode");
  embps_put64(f->buf, 5);
  refused(f, apply(f, EMBPS_WAL_DROP, 2, 8), "does not exist");
  refused(f, apply(f, EMBPS_WAL_EVICT, 2, 8), "for no table");
  refused(f, apply(f, 99, 2, 8), "unknown record type 99");
  refused(f, apply(f, EMBPS_WAL_DROP, 2, 4), "short record");
  embps_table_t *t = get(f, "emb"); /* still there, untouched */
  assert_non_null(t);
  check_row(t, 1, 0, 0);
  assert_int_equal(step_of(t), 0);
  embps_table_unref(t);
}

/* Every row (id, weights, state) of t, sorted by id, into rows[] (at most
 * cap of them); returns the count. */
typedef struct {
  int64_t id;
  float w[DIM], st[2 * DIM];
} row_t;

static int by_row_id(const void *a, const void *b) {
  int64_t x = ((const row_t *)a)->id, y = ((const row_t *)b)->id;
  return (x > y) - (x < y);
}

static size_t dump(embps_table_t *t, row_t *rows, size_t cap) {
  uint64_t cursor = 0;
  size_t n = 0;
  int done = 0;
  while (!done) {
    int64_t ids[64];
    float w[64 * DIM], st[64 * 2 * DIM];
    size_t got;
    assert_int_equal(embps_table_scan(t, &cursor, 64, ids, w, st, &got,
                                      &done), 0);
    for (size_t i = 0; i < got && n < cap; i++, n++) {
      rows[n].id = ids[i];
      memcpy(rows[n].w, w + i * DIM, sizeof rows[n].w);
      memcpy(rows[n].st, st + i * 2 * DIM, sizeof rows[n].st);
    }
  }
  qsort(rows, n, sizeof *rows, by_row_id);
  return n;
}

/* PUSH record with its evictions (flags EVICTIONS): ids, g, then n_ttl
 * and n_cap ids of ev. */
static size_t put_push_ev(fixture_t *f, uint64_t inc, uint64_t step,
                          const int64_t *ids, uint32_t rows, const float *g,
                          const int64_t *ev, uint32_t n_ttl,
                          uint32_t n_cap) {
  size_t len = put_push(f, inc, step, 0, 0, ids, rows, g);
  embps_put32(f->buf + 28, EMBPS_REDO_PUSH_EVICTIONS);
  assert_true(len + 8 + (n_ttl + n_cap) * 8 <= sizeof f->buf);
  embps_put32(f->buf + len, n_ttl);
  embps_put32(f->buf + len + 4, n_cap);
  if (n_ttl + n_cap)
    memcpy(f->buf + len + 8, ev, (n_ttl + n_cap) * sizeof *ev);
  return len + 8 + (n_ttl + n_cap) * 8;
}

static void evictions_shipped(fixture_t *f, embps_evict_t how) {
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "dyn", DIM, EMBPS_OPT_ADAGRAD);
  spec.dynamic = 1;
  spec.ttl_steps = 6;
  spec.max_rows = 24; /* 6 a shard */
  spec.evict = how;
  embps_table_t *a; /* the primary's: it decides */
  assert_int_equal(embps_table_create(&spec, SHARDS, 1, &a), 0);
  embps_table_set_incarnation(a, 1);
  assert_int_equal(apply(f, EMBPS_WAL_CREATE, 1, put_spec(f, 1, &spec)), 0);
  embps_table_t *b = get(f, "dyn"); /* the follower's: applies records */
  embps_table_scratch_t s;
  embps_table_scratch_init(&s);
  uint64_t rng = 12345, shipped = 0, lsn = 1;
  for (int step = 1; step <= 60; step++) {
    int64_t ids[12];
    float g[12 * DIM];
    uint32_t n = 0;
    for (int i = 0; i < 12; i++) { /* distinct ids from a skewed range */
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      int64_t id = (int64_t)((rng >> 33) % (i < 4 ? 8 : 200));
      int dup = 0;
      for (uint32_t j = 0; j < n; j++)
        dup |= ids[j] == id;
      if (dup)
        continue;
      ids[n] = id;
      g[n * DIM] = (float)((rng >> 20) & 255) / 64 - 2;
      g[n * DIM + 1] = 0.5f;
      n++;
    }
    assert_int_equal(embps_table_prepare(a, &s, ids, n, 0), 0);
    const int64_t *ev;
    uint32_t n_ttl, n_cap;
    assert_int_equal(embps_table_planned(a, &s, &ev, &n_ttl, &n_cap), 0);
    shipped += n_ttl + n_cap;
    size_t len = put_push_ev(f, 1, (uint64_t)step, ids, n, g, ev, n_ttl,
                             n_cap);
    embps_table_commit(a, &s, ids, g, n, ++lsn);
    assert_int_equal(apply(f, EMBPS_WAL_PUSH, lsn, len), 0);
  }
  assert_true(shipped > 20); /* TTL and capacity both happened */
  embps_table_info_t ia, ib;
  embps_table_info(a, &ia);
  embps_table_info(b, &ib);
  assert_true(ia.evicted_ttl > 0 && ia.evicted_capacity > 0);
  assert_int_equal(ia.evicted_ttl, ib.evicted_ttl);
  assert_int_equal(ia.evicted_capacity, ib.evicted_capacity);
  assert_int_equal(ia.rows_allocated, ib.rows_allocated);
  assert_int_equal(ia.step, ib.step);
  static row_t ra[256], rb[256];
  size_t na = dump(a, ra, 256), nb = dump(b, rb, 256);
  assert_int_equal(na, nb);
  assert_memory_equal(ra, rb, na * sizeof *ra);

  /* the follower evicts what the record says: one eviction left out of
   * a record, and that row stays */
  int64_t ids[8];
  float g[8 * DIM] = {0};
  for (int i = 0; i < 8; i++)
    ids[i] = 1000 + i; /* all new: the shards pass their capacity */
  assert_int_equal(embps_table_prepare(a, &s, ids, 8, 0), 0);
  const int64_t *ev;
  uint32_t n_ttl, n_cap;
  assert_int_equal(embps_table_planned(a, &s, &ev, &n_ttl, &n_cap), 0);
  assert_true(n_cap >= 1);
  size_t len = put_push_ev(f, 1, 61, ids, 8, g, ev, n_ttl, n_cap - 1);
  embps_table_commit(a, &s, ids, g, 8, ++lsn);
  assert_int_equal(apply(f, EMBPS_WAL_PUSH, lsn, len), 0);
  embps_table_info(a, &ia);
  embps_table_info(b, &ib);
  assert_int_equal(ib.rows_allocated, ia.rows_allocated + 1);
  assert_true(embps_table_row_live(b, ev[n_ttl + n_cap - 1]));
  assert_false(embps_table_row_live(a, ev[n_ttl + n_cap - 1]));
  /* an eviction of a row it does not hold: refused */
  int64_t ghost = 999999;
  len = put_push_ev(f, 1, 62, ids, 1, g, &ghost, 0, 1);
  assert_int_equal(apply(f, EMBPS_WAL_PUSH, ++lsn, len), -1);
  assert_non_null(strstr(f->err, "not here"));
  embps_table_scratch_close(&s);
  embps_table_unref(b);
  embps_table_unref(a);
}

static void test_evictions_shipped_lru(void **state) {
  evictions_shipped(*state, EMBPS_EVICT_LRU);
}

static void test_evictions_shipped_lfu(void **state) {
  evictions_shipped(*state, EMBPS_EVICT_LFU);
}

int main(void) {
  embps_log_set_level(EMBPS_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_create_push_alter_rows_drop, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_checkpoint_shards, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_evict, setup, teardown),
      cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_evictions_shipped_lru, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_evictions_shipped_lfu, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
