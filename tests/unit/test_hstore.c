/* test_hstore.c - unit tests of the hashed row store (server/hstore.c)
 * alone: backward-shift removal across the wrap-around of the map, ids
 * whose hashes share the tag bits, growth through several capacities
 * (and with free slots), emptying the map, slot reuse from the free list,
 * and a seeded random run against a plain reference. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "hstore.h"

#define ROW_BYTES 48u /* 128-row first chunks: chunk levels come quickly */

typedef struct {
  embps_hstore_t hs;
  pthread_rwlock_t lock;
} store_t;

/* splitmix64: a fixed seed gives the same run everywhere */
static uint64_t rng_next(uint64_t *s) {
  return embps_mix64(*s += 0x9e3779b97f4a7c15ULL);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  assert_non_null(p);
  return p;
}

static void store_open(store_t *st) {
  embps_hstore_init(&st->hs, ROW_BYTES);
  assert_int_equal(pthread_rwlock_init(&st->lock, NULL), 0);
}

static void store_close(store_t *st) {
  embps_hstore_close(&st->hs);
  pthread_rwlock_destroy(&st->lock);
}

/* The payload a test writes after the id: checks rows never move. */
static uint64_t payload(int64_t id) {
  return (uint64_t)id * 0x9e3779b97f4a7c15ULL + 7;
}

/* Makes room for `fresh` new ids as table.c does, checking the bytes
 * reported against embps_hstore_growth_bytes. */
static void reserve(store_t *st, uint32_t fresh) {
  const uint32_t n = st->hs.n_slots + embps_hstore_new_slots(&st->hs, fresh);
  const uint64_t expect = embps_hstore_growth_bytes(&st->hs, n);
  int64_t added = -1;
  assert_int_equal(embps_hstore_reserve(&st->hs, n, &st->lock, &added), 0);
  assert_int_equal(added, (int64_t)expect);
}

/* Inserts id (absent, room reserved) with its payload; returns its slot. */
static uint32_t put(store_t *st, int64_t id) {
  uint32_t slot;
  unsigned char *rec = embps_hstore_insert_locked(&st->hs, id, &slot);
  assert_true(slot < st->hs.n_slots);
  assert_true(st->hs.n_slots <= st->hs.room);
  assert_ptr_equal(rec, embps_hstore_rec(&st->hs, slot));
  uint64_t p = payload(id);
  memcpy(rec + 8, &p, sizeof p);
  return slot;
}

static uint32_t put_one(store_t *st, int64_t id) {
  reserve(st, 1);
  return put(st, id);
}

/* id is in the store, in slot `slot` if not NONE, with its payload. */
static void expect_found(const store_t *st, int64_t id, uint32_t slot) {
  const uint32_t got = embps_hstore_find_slot(&st->hs, id);
  assert_int_not_equal(got, EMBPS_HSTORE_NONE);
  if (slot != EMBPS_HSTORE_NONE)
    assert_int_equal(got, slot);
  const unsigned char *rec = embps_hstore_find(&st->hs, id);
  assert_ptr_equal(rec, embps_hstore_rec(&st->hs, got));
  assert_int_equal(embps_hstore_rec_id(rec), id);
  uint64_t p;
  memcpy(&p, rec + 8, sizeof p);
  assert_int_equal(p, payload(id));
}

static void expect_absent(const store_t *st, int64_t id) {
  assert_int_equal(embps_hstore_find_slot(&st->hs, id), EMBPS_HSTORE_NONE);
  assert_null(embps_hstore_find(&st->hs, id));
}

/* What the reference says: absent (NONE) or in that slot. */
static void expect_ref(const store_t *st, int64_t id, uint32_t where) {
  if (where == EMBPS_HSTORE_NONE)
    expect_absent(st, id);
  else
    expect_found(st, id, where);
}

/* The map's invariants: each entry names a distinct live slot, carries
 * its id's tag and is reachable from its home with no empty entry on the
 * way; the entries count the live rows. */
static void check_map(const store_t *st) {
  const embps_hstore_t *hs = &st->hs;
  unsigned char *seen = calloc(hs->n_slots + 1, 1);
  assert_non_null(seen);
  uint32_t entries = 0;
  for (uint32_t i = 0; i < hs->cap; i++) {
    const uint32_t e = hs->map[i];
    if (!e)
      continue;
    entries++;
    const uint32_t slot = embps_hstore_entry_slot(hs, e);
    assert_true(slot < hs->n_slots);
    assert_int_equal(seen[slot], 0);
    seen[slot] = 1;
    const int64_t id = embps_hstore_rec_id(embps_hstore_rec(hs, slot));
    const uint64_t h = embps_hstore_hash(id);
    assert_int_equal(e & hs->tag_mask, (uint32_t)h & hs->tag_mask);
    for (uint32_t j = embps_hstore_home(h, hs->cap); j != i;
         j = j + 1 == hs->cap ? 0 : j + 1)
      assert_int_not_equal(hs->map[j], 0);
    assert_int_equal(embps_hstore_find_pos(hs, id), i);
  }
  assert_int_equal(entries, embps_hstore_n_live(hs));
  free(seen);
}

/* The first ids from `from` on (counting up) whose home in a map of cap
 * entries is `home`. */
static void ids_with_home(uint32_t cap, uint32_t home, int64_t from,
                          int64_t *out, size_t n) {
  for (int64_t id = from; n; id++)
    if (embps_hstore_home(embps_hstore_hash(id), cap) == home) {
      *out++ = id;
      n--;
    }
}

/* ------------------------------------------------------------ tests */

/* A probe run that wraps from the last entry to the first: removing its
 * head shifts every later entry back one, across the wrap, and an entry
 * at its own home after a hole stays. */
static void test_remove_shifts_across_wrap(void **state) {
  (void)state;
  store_t st;
  store_open(&st);
  reserve(&st, 8);
  const uint32_t cap = st.hs.cap;
  assert_int_equal(cap, 32);
  int64_t last[3], first[1], third[1];
  ids_with_home(cap, cap - 1, 0, last, 3); /* A, B, C: home 31 */
  ids_with_home(cap, 0, 0, first, 1);      /* D: home 0 */
  ids_with_home(cap, 3, 0, third, 1);      /* E: home 3 */
  put(&st, last[0]);
  put(&st, last[1]);
  put(&st, last[2]);
  put(&st, first[0]);
  put(&st, third[0]);
  /* A at 31, B at 0, C at 1, D at 2 (home 0), E at 3 (its home) */
  const int64_t at[5] = {last[0], last[1], last[2], first[0], third[0]};
  const uint32_t pos[5] = {cap - 1, 0, 1, 2, 3};
  for (int i = 0; i < 5; i++)
    assert_int_equal(embps_hstore_find_pos(&st.hs, at[i]), pos[i]);
  check_map(&st);

  embps_hstore_remove_locked(&st.hs, last[0], NULL, 0); /* A */
  expect_absent(&st, last[0]);
  assert_int_equal(embps_hstore_find_pos(&st.hs, last[1]), cap - 1);
  assert_int_equal(embps_hstore_find_pos(&st.hs, last[2]), 0);
  assert_int_equal(embps_hstore_find_pos(&st.hs, first[0]), 1);
  assert_int_equal(embps_hstore_find_pos(&st.hs, third[0]), 3); /* stays */
  assert_int_equal(st.hs.map[2], 0);
  for (int i = 1; i < 5; i++)
    expect_found(&st, at[i], EMBPS_HSTORE_NONE);
  check_map(&st);

  embps_hstore_remove_locked(&st.hs, last[2], NULL, 0); /* C, at 0 */
  assert_int_equal(embps_hstore_find_pos(&st.hs, last[1]), cap - 1);
  assert_int_equal(embps_hstore_find_pos(&st.hs, first[0]), 0);
  assert_int_equal(st.hs.map[1], 0);
  expect_found(&st, first[0], EMBPS_HSTORE_NONE);
  expect_found(&st, third[0], EMBPS_HSTORE_NONE);
  check_map(&st);

  /* B at 31, D at 0 (its home): removing B leaves D where it is */
  embps_hstore_remove_locked(&st.hs, last[1], NULL, 0);
  assert_int_equal(st.hs.map[cap - 1], 0);
  assert_int_equal(embps_hstore_find_pos(&st.hs, first[0]), 0);
  expect_found(&st, first[0], EMBPS_HSTORE_NONE);
  check_map(&st);
  store_close(&st);

  /* P at 30 (home 30), A at 31, B at 0 (both home 31): removing P leaves
   * A and B, whose home lies after the hole, where they are */
  store_open(&st);
  reserve(&st, 8);
  int64_t p[1];
  ids_with_home(cap, cap - 2, 0, p, 1);
  put(&st, p[0]);
  put(&st, last[0]);
  put(&st, last[1]);
  assert_int_equal(embps_hstore_find_pos(&st.hs, last[1]), 0);
  embps_hstore_remove_locked(&st.hs, p[0], NULL, 0);
  assert_int_equal(st.hs.map[cap - 2], 0);
  assert_int_equal(embps_hstore_find_pos(&st.hs, last[0]), cap - 1);
  assert_int_equal(embps_hstore_find_pos(&st.hs, last[1]), 0);
  check_map(&st);
  store_close(&st);
}

/* The same removals reading the probe run's ids from a denser copy (as
 * policy.c passes its slot bookkeeping) instead of the records. */
static void test_remove_with_id_copy(void **state) {
  (void)state;
  store_t st;
  store_open(&st);
  enum { N = 2000 };
  struct { int64_t id; uint64_t other; } *copy = xmalloc(N * sizeof *copy);
  reserve(&st, N);
  for (int64_t i = 0; i < N; i++) {
    const int64_t id = i * 1000003 - 77;
    const uint32_t slot = put(&st, id);
    copy[slot].id = id;
    copy[slot].other = 0;
  }
  for (int64_t i = 0; i < N; i += 2)
    embps_hstore_remove_locked(&st.hs, i * 1000003 - 77, &copy->id,
                               sizeof *copy);
  for (int64_t i = 0; i < N; i++) {
    if (i % 2)
      expect_found(&st, i * 1000003 - 77, EMBPS_HSTORE_NONE);
    else
      expect_absent(&st, i * 1000003 - 77);
  }
  check_map(&st);
  free(copy);
  store_close(&st);
}

typedef struct {
  uint32_t key;
  int64_t id;
} keyed_t;

static int keyed_cmp(const void *a, const void *b) {
  const keyed_t *x = a, *y = b;
  if (x->key != y->key)
    return x->key < y->key ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* Two ids with the same tag and the same home (found by sorting hashes):
 * only the record's id tells them apart. */
static void test_tag_collisions(void **state) {
  (void)state;
  store_t st;
  store_open(&st);
  reserve(&st, 8);
  const uint32_t cap = st.hs.cap, mask = st.hs.tag_mask;
  assert_int_not_equal(mask, 0);
  assert_int_equal(mask & (cap - 1), 0); /* the tag is above slot + 1 */
  enum { N = 400000 };
  keyed_t *k = xmalloc(N * sizeof *k);
  for (int64_t i = 0; i < N; i++) {
    const uint64_t h = embps_hstore_hash(i);
    /* tag bits, then the home in the bits the tag leaves */
    k[i].key = ((uint32_t)h & mask) | embps_hstore_home(h, cap);
    k[i].id = i;
  }
  qsort(k, N, sizeof *k, keyed_cmp);
  int64_t x = -1, y = -1;
  for (size_t i = 1; i < N && x < 0; i++)
    if (k[i].key == k[i - 1].key) {
      x = k[i - 1].id;
      y = k[i].id;
    }
  assert_true(x >= 0);
  free(k);
  const uint64_t hx = embps_hstore_hash(x), hy = embps_hstore_hash(y);
  assert_int_equal((uint32_t)hx & mask, (uint32_t)hy & mask);
  assert_int_equal(embps_hstore_home(hx, cap), embps_hstore_home(hy, cap));

  const uint32_t sx = put(&st, x);
  expect_absent(&st, y); /* same tag, same home: the id decides */
  const uint32_t sy = put(&st, y);
  assert_int_not_equal(sx, sy);
  expect_found(&st, x, sx);
  expect_found(&st, y, sy);
  check_map(&st);
  embps_hstore_remove_locked(&st.hs, x, NULL, 0);
  expect_absent(&st, x);
  expect_found(&st, y, sy);
  check_map(&st);
  store_close(&st);
}

/* Inserts in push-sized batches through many map capacities and chunk
 * levels: after every growth all ids are found, in their slots, with
 * their payloads. */
static void test_growth_keeps_entries(void **state) {
  (void)state;
  store_t st;
  store_open(&st);
  enum { N = 120000, BATCH = 1000 };
  uint32_t *slot = xmalloc(N * sizeof *slot);
  uint32_t caps = 0, last_cap = 0;
  for (int64_t i = 0; i < N; i += BATCH) {
    reserve(&st, BATCH);
    for (int64_t j = i; j < i + BATCH; j++)
      slot[j] = put(&st, j * -7919 + 13); /* negative ids too */
    if (st.hs.cap != last_cap) {
      caps++;
      last_cap = st.hs.cap;
      for (int64_t j = 0; j < i + BATCH; j++)
        expect_found(&st, j * -7919 + 13, slot[j]);
    }
    assert_true(st.hs.n_slots <= (uint64_t)st.hs.cap * 4 / 5);
  }
  assert_true(caps >= 6);
  assert_true(st.hs.n_chunks > 2u << EMBPS_HSTORE_LEVEL_SHIFT); /* level 1+ */
  for (int64_t j = 0; j < N; j++)
    expect_found(&st, j * -7919 + 13, slot[j]);
  expect_absent(&st, N * -7919 + 13);
  check_map(&st);
  free(slot);
  store_close(&st);
}

/* A map that must grow while slots are free (a batch of more new rows
 * than the free list holds) keeps exactly the live rows. */
static void test_growth_with_free_slots(void **state) {
  (void)state;
  store_t st;
  store_open(&st);
  reserve(&st, 25);
  assert_int_equal(st.hs.cap, 32);
  for (int64_t id = 0; id < 25; id++)
    put(&st, id);
  for (int64_t id = 0; id < 25; id += 3)
    embps_hstore_remove_locked(&st.hs, id, NULL, 0);
  assert_int_equal(st.hs.n_free, 9);
  reserve(&st, 30);
  assert_true(st.hs.cap > 32);
  assert_int_equal(st.hs.n_free, 9); /* reserving changes no row */
  for (int64_t id = 0; id < 25; id++) {
    if (id % 3)
      expect_found(&st, id, EMBPS_HSTORE_NONE);
    else
      expect_absent(&st, id);
  }
  check_map(&st);
  for (int64_t id = 100; id < 130; id++)
    put(&st, id);
  assert_int_equal(st.hs.n_free, 0);
  assert_int_equal(st.hs.n_slots, 25 + 30 - 9);
  check_map(&st);
  store_close(&st);
}

/* Removing every row, in a shuffled order, empties the map; inserting as
 * many again takes only freed slots. */
static void test_remove_all_empties(void **state) {
  (void)state;
  store_t st;
  store_open(&st);
  enum { N = 5000 };
  int64_t *ids = xmalloc(N * sizeof *ids);
  uint64_t rng = 42;
  reserve(&st, N);
  for (int i = 0; i < N; i++) {
    ids[i] = (int64_t)rng_next(&rng);
    put(&st, ids[i]);
  }
  for (int i = N - 1; i > 0; i--) {
    const int j = (int)(rng_next(&rng) % (uint64_t)(i + 1));
    const int64_t tmp = ids[i];
    ids[i] = ids[j];
    ids[j] = tmp;
  }
  for (int i = 0; i < N; i++) {
    embps_hstore_remove_locked(&st.hs, ids[i], NULL, 0);
    if (i % 997 == 0)
      check_map(&st);
  }
  for (uint32_t i = 0; i < st.hs.cap; i++)
    assert_int_equal(st.hs.map[i], 0);
  assert_int_equal(embps_hstore_n_live(&st.hs), 0);
  assert_int_equal(st.hs.n_free, N);
  for (int i = 0; i < N; i++)
    expect_absent(&st, ids[i]);
  reserve(&st, N);
  for (int i = 0; i < N; i++)
    put(&st, ids[i] ^ 1);
  assert_int_equal(st.hs.n_slots, N);
  assert_int_equal(st.hs.n_free, 0);
  check_map(&st);
  free(ids);
  store_close(&st);
}

/* Freed slots are reused last freed first, before any new slot, and a
 * reused slot holds only its new row. */
static void test_slot_reuse(void **state) {
  (void)state;
  store_t st;
  store_open(&st);
  reserve(&st, 100);
  for (int64_t id = 0; id < 100; id++)
    assert_int_equal(put(&st, 1000 + id), (uint32_t)id);
  embps_hstore_remove_locked(&st.hs, 1010, NULL, 0);
  embps_hstore_remove_locked(&st.hs, 1020, NULL, 0);
  assert_int_equal(embps_hstore_remove_locked(&st.hs, 1030, NULL, 0), 30);
  assert_int_equal(st.hs.n_free, 3);
  assert_int_equal(embps_hstore_new_slots(&st.hs, 5), 2);
  reserve(&st, 3);
  assert_int_equal(st.hs.n_slots, 100);
  assert_int_equal(put(&st, -1), 30);
  assert_int_equal(put(&st, -2), 20);
  assert_int_equal(put(&st, -3), 10);
  assert_int_equal(st.hs.n_free, 0);
  assert_int_equal(st.hs.n_slots, 100);
  expect_found(&st, -3, 10);
  expect_absent(&st, 1010);
  expect_absent(&st, 1030);
  assert_int_equal(put_one(&st, -4), 100);
  check_map(&st);
  store_close(&st);
}

/* Seeded random batches of inserts, removals and lookups over a small
 * universe of ids, checked against a plain array of who is where. */
static void test_random_against_reference(void **state) {
  (void)state;
  store_t st;
  store_open(&st);
  enum { U = 3000, ROUNDS = 20000 };
  int64_t *ids = xmalloc(U * sizeof *ids);
  uint32_t *where = xmalloc(U * sizeof *where); /* NONE: absent */
  uint32_t *batch = xmalloc(64 * sizeof *batch);
  uint64_t rng = 20261123;
  for (int u = 0; u < U; u++) {
    ids[u] = (int64_t)rng_next(&rng);
    where[u] = EMBPS_HSTORE_NONE;
  }
  ids[0] = INT64_MIN;
  ids[1] = INT64_MAX;
  ids[2] = 0;
  ids[3] = -1;
  uint32_t live = 0;
  for (int r = 0; r < ROUNDS; r++) {
    const uint64_t op = rng_next(&rng) % 10;
    const uint32_t want = 1 + (uint32_t)(rng_next(&rng) % 48);
    if (op < 5) { /* a batch of distinct new ids, as a push makes them */
      uint32_t n = 0;
      for (uint32_t tries = 0; n < want && tries < 4 * want; tries++) {
        const uint32_t u = (uint32_t)(rng_next(&rng) % U);
        int dup = where[u] != EMBPS_HSTORE_NONE;
        for (uint32_t b = 0; b < n && !dup; b++)
          dup = batch[b] == u;
        if (!dup)
          batch[n++] = u;
      }
      reserve(&st, n);
      for (uint32_t b = 0; b < n; b++)
        where[batch[b]] = put(&st, ids[batch[b]]);
      live += n;
    } else if (op < 8) { /* removals */
      for (uint32_t b = 0; b < want && live; b++) {
        const uint32_t u = (uint32_t)(rng_next(&rng) % U);
        if (where[u] == EMBPS_HSTORE_NONE)
          continue;
        assert_int_equal(
            embps_hstore_remove_locked(&st.hs, ids[u], NULL, 0), where[u]);
        where[u] = EMBPS_HSTORE_NONE;
        live--;
      }
    } else { /* lookups */
      for (uint32_t b = 0; b < want; b++) {
        const uint32_t u = (uint32_t)(rng_next(&rng) % U);
        expect_ref(&st, ids[u], where[u]);
      }
    }
    assert_int_equal(embps_hstore_n_live(&st.hs), live);
    if (r % 2000 == 1999) {
      for (int u = 0; u < U; u++)
        expect_ref(&st, ids[u], where[u]);
      check_map(&st);
    }
  }
  assert_true(st.hs.cap > 1000); /* it grew */
  free(batch);
  free(where);
  free(ids);
  store_close(&st);
}

/* Chunk geometry: 128-row level-0 chunks of 48-byte rows, records packed
 * in them and never overlapping across chunk and level boundaries. */
static void test_chunk_layout(void **state) {
  (void)state;
  store_t st;
  store_open(&st);
  assert_int_equal(1u << st.hs.r0_shift, 128); /* 128 x 48 >= 4096 */
  const uint32_t n = (2u << EMBPS_HSTORE_LEVEL_SHIFT) * 128 + 3 * 256;
  reserve(&st, n);
  for (uint32_t s = 0; s < n; s++)
    assert_int_equal(put(&st, (int64_t)s * 3), s);
  for (uint32_t s = 1; s < n; s++) {
    const unsigned char *a = embps_hstore_rec(&st.hs, s - 1);
    const unsigned char *b = embps_hstore_rec(&st.hs, s);
    if (s % 128) /* same level-0 or level-1 chunk: adjacent */
      assert_ptr_equal(b, a + ROW_BYTES);
  }
  for (uint32_t s = 0; s < n; s++)
    expect_found(&st, (int64_t)s * 3, s);
  assert_int_equal(st.hs.n_chunks, (2u << EMBPS_HSTORE_LEVEL_SHIFT) + 3);
  store_close(&st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_remove_shifts_across_wrap),
      cmocka_unit_test(test_remove_with_id_copy),
      cmocka_unit_test(test_tag_collisions),
      cmocka_unit_test(test_growth_keeps_entries),
      cmocka_unit_test(test_growth_with_free_slots),
      cmocka_unit_test(test_remove_all_empties),
      cmocka_unit_test(test_slot_reuse),
      cmocka_unit_test(test_random_against_reference),
      cmocka_unit_test(test_chunk_layout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
