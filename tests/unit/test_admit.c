/* test_admit.c - the admission sketch and hash (server/admit.c): every
 * shard's groups hold the ids the shard routes; adds match a model of
 * admit.h written again (conservative update: only the counters at the
 * minimum grow; every counter halved after `width` adds; saturation); an
 * estimate is never below the true count, in the shards that counted and
 * in the shards of any other shard count the counts are merged into; a
 * merge takes the largest copy of each counter and the adds in proportion
 * to the groups taken, and into the same layout is a copy; the
 * admission hash passes an id exactly for P above a fixed point of it,
 * for a share P of ids. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "admit.h"
#include "route.h"

#define BYTES (64u << 10) /* 2048 counters a row: no aging below */
#define IDS 600
#define SEED 77

static int64_t id_at(int i) { return (int64_t)embps_mix64((uint64_t)i) >> 3; }
static uint32_t count_of(int i) { return (uint32_t)(i % 5) + 1; }

/* Shards of a sketch: init all, count ids 0..IDS-1 count_of(i) times each
 * (interleaved) in their shards. */
static embps_sketch_t *counted(uint32_t shards) {
  embps_sketch_t *s = calloc(shards, sizeof *s);
  assert_non_null(s);
  for (uint32_t k = 0; k < shards; k++)
    assert_int_equal(embps_sketch_init(&s[k], BYTES, SEED, k, shards), 0);
  for (uint32_t round = 0; round < 5; round++)
    for (int i = 0; i < IDS; i++)
      if (round < count_of(i))
        embps_sketch_add(&s[embps_route_shard(id_at(i), shards)], id_at(i));
  return s;
}

static void free_all(embps_sketch_t *s, uint32_t shards) {
  for (uint32_t k = 0; k < shards; k++)
    embps_sketch_free(&s[k]);
  free(s);
}

static void test_groups_cover_the_shard(void **state) {
  (void)state;
  static const uint32_t counts[] = {1, 3, 4, 7, 16, 5000};
  for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
    const uint32_t S = counts[c];
    for (int i = 0; i < 20000; i++) {
      const int64_t id = id_at(i);
      const uint32_t k = embps_route_shard(id, S);
      embps_sketch_t s;
      if (i % 97) /* init is cheap but not free: sample the shards */
        continue;
      assert_int_equal(embps_sketch_init(&s, BYTES, SEED, k, S), 0);
      const uint32_t g = embps_route_shard(id, s.groups);
      assert_true(g >= s.g0 && g < s.g0 + s.width / EMBPS_SKETCH_GROUP);
      assert_true(embps_sketch_bytes(&s) <=
                  BYTES / S + 2 * EMBPS_SKETCH_GROUP * EMBPS_SKETCH_DEPTH * 2);
      embps_sketch_free(&s);
    }
  }
}

static void test_merge_never_underestimates(void **state) {
  (void)state;
  const uint32_t from = 4;
  embps_sketch_t *old = counted(from);
  for (int i = 0; i < IDS; i++)
    assert_true(embps_sketch_estimate(
                    &old[embps_route_shard(id_at(i), from)], id_at(i)) >=
                count_of(i));
  static const uint32_t to[] = {1, 3, 4, 7, 64};
  for (size_t c = 0; c < sizeof to / sizeof *to; c++) {
    const uint32_t S = to[c];
    embps_sketch_t *s = calloc(S, sizeof *s);
    assert_non_null(s);
    for (uint32_t k = 0; k < S; k++) {
      assert_int_equal(embps_sketch_init(&s[k], BYTES, SEED, k, S), 0);
      for (uint32_t j = 0; j < from; j++)
        embps_sketch_merge(&s[k], old[j].c, old[j].g0,
                           old[j].width / EMBPS_SKETCH_GROUP, old[j].adds);
      assert_true(s[k].adds < s[k].width);
    }
    for (int i = 0; i < IDS; i++) {
      const int64_t id = id_at(i);
      const uint32_t got =
          embps_sketch_estimate(&s[embps_route_shard(id, S)], id);
      assert_true(got >= count_of(i));
      if (S == from) /* same layout: a copy */
        assert_int_equal(got, embps_sketch_estimate(
                                  &old[embps_route_shard(id, from)], id));
    }
    free_all(s, S);
  }
  free_all(old, from);
}

/* ------------------------------------------------- counting, reference */

/* The counters of id in sketches shaped like s, one per row: the cells an
 * add to an empty sketch of the same shape raises (there all are at the
 * minimum, 0, so any update rule raises all four). */
static void cells_of(const embps_sketch_t *s, size_t bytes, uint32_t k,
                     uint32_t shards, int64_t id,
                     size_t at[EMBPS_SKETCH_DEPTH]) {
  embps_sketch_t e;
  if (s->groups)
    assert_int_equal(embps_sketch_init(&e, bytes, s->seed, k, shards), 0);
  else
    assert_int_equal(embps_sketch_init_legacy(&e, s->width, s->seed), 0);
  assert_int_equal(e.width, s->width);
  assert_int_equal(embps_sketch_add(&e, id), 0);
  uint32_t found = 0;
  for (size_t i = 0; i < (size_t)e.width * EMBPS_SKETCH_DEPTH; i++) {
    if (!e.c[i])
      continue;
    assert_int_equal(e.c[i], 1);
    assert_int_equal(i / e.width, found); /* one a row, in row order */
    at[found++] = i;
  }
  assert_int_equal(found, EMBPS_SKETCH_DEPTH);
  embps_sketch_free(&e);
}

/* admit.h's sketch, written again: an add returns the minimum of the id's
 * counters and raises those at the minimum only (conservative update), up
 * to EMBPS_SKETCH_MAX; after `width` adds every counter is halved and the
 * count starts again. */
typedef struct {
  uint16_t *c;
  uint32_t width;
  uint64_t adds;
  unsigned partial, aged; /* adds that raised only some cells; agings */
} model_t;

static uint32_t model_add(model_t *m, const size_t at[EMBPS_SKETCH_DEPTH]) {
  uint32_t min = EMBPS_SKETCH_MAX, raised = 0;
  for (uint32_t j = 0; j < EMBPS_SKETCH_DEPTH; j++)
    min = m->c[at[j]] < min ? m->c[at[j]] : min;
  for (uint32_t j = 0; min < EMBPS_SKETCH_MAX && j < EMBPS_SKETCH_DEPTH; j++)
    if (m->c[at[j]] == min) {
      m->c[at[j]]++;
      raised++;
    }
  m->partial += raised && raised < EMBPS_SKETCH_DEPTH;
  if (++m->adds == m->width) {
    for (size_t i = 0; i < (size_t)m->width * EMBPS_SKETCH_DEPTH; i++)
      m->c[i] /= 2;
    m->adds = 0;
    m->aged++;
  }
  return min;
}

/* A skewed stream of adds over n_ids ids, checked against the model after
 * every add: returned estimate, every counter, the adds since aging. */
static void run_model(embps_sketch_t *s, size_t bytes, uint32_t k,
                      uint32_t shards, int n_ids, int n_adds) {
  size_t (*at)[EMBPS_SKETCH_DEPTH] = calloc((size_t)n_ids, sizeof *at);
  int64_t *ids = calloc((size_t)n_ids, sizeof *ids);
  model_t m = {calloc((size_t)s->width * EMBPS_SKETCH_DEPTH, 2), s->width,
               0, 0, 0};
  assert_true(at && ids && m.c);
  for (int i = 0, found = 0; found < n_ids; i++) { /* ids of shard k */
    const int64_t id = id_at(i);
    if (s->groups && embps_route_shard(id, shards) != k)
      continue;
    ids[found] = id;
    cells_of(s, bytes, k, shards, id, at[found++]);
  }
  uint64_t r = 12345;
  for (int a = 0; a < n_adds; a++) {
    r = embps_mix64(r + (uint64_t)a);
    const int i = (int)((r % (uint64_t)n_ids) * (r % 7 + 1) / 7); /* skew */
    const uint32_t want = model_add(&m, at[i]);
    assert_int_equal(embps_sketch_add(s, ids[i]), want);
    assert_int_equal(s->adds, m.adds);
    if (memcmp(s->c, m.c, (size_t)s->width * EMBPS_SKETCH_DEPTH * 2))
      fail_msg("add %d (id %lld): counters differ from the model", a,
               (long long)ids[i]);
  }
  for (int i = 0; i < n_ids; i++) {
    uint32_t min = EMBPS_SKETCH_MAX;
    for (uint32_t j = 0; j < EMBPS_SKETCH_DEPTH; j++)
      min = m.c[at[i][j]] < min ? m.c[at[i][j]] : min;
    assert_int_equal(embps_sketch_estimate(s, ids[i]), min);
  }
  /* the stream exercised what it checks: collisions and agings */
  assert_true(m.partial > 100);
  assert_true(m.aged >= 3);
  free(at);
  free(ids);
  free(m.c);
}

/* Conservative update and aging, exactly: a grouped sketch (shard 1 of 3,
 * 4 groups of 64) and a legacy one (64 counters a row) against the
 * model, over streams that collide often and age several times. */
static void test_add_matches_the_model(void **state) {
  (void)state;
  const size_t bytes = 12 * EMBPS_SKETCH_GROUP * EMBPS_SKETCH_DEPTH * 2;
  embps_sketch_t s;
  assert_int_equal(embps_sketch_init(&s, bytes, SEED, 1, 3), 0);
  assert_int_equal(s.groups, 12);
  run_model(&s, bytes, 1, 3, 300, 4000);
  embps_sketch_free(&s);
  assert_int_equal(embps_sketch_init_legacy(&s, 64, SEED), 0);
  run_model(&s, 0, 0, 1, 100, 1000);
  embps_sketch_free(&s);
}

/* A counter stops at EMBPS_SKETCH_MAX (a sketch too wide to age first). */
static void test_counters_saturate(void **state) {
  (void)state;
  embps_sketch_t s;
  assert_int_equal(embps_sketch_init_legacy(&s, 1u << 17, SEED), 0);
  for (uint32_t n = 0; n < EMBPS_SKETCH_MAX + 50; n++)
    assert_int_equal(embps_sketch_add(&s, 42),
                     n < EMBPS_SKETCH_MAX ? n : EMBPS_SKETCH_MAX);
  assert_int_equal(embps_sketch_estimate(&s, 42), EMBPS_SKETCH_MAX);
  embps_sketch_free(&s);
}

/* ------------------------------------------------------------ merge */

/* A restore from `from` shards into `to`, exactly as admit.h says: every
 * counter of a group the new shard holds is the largest of the old
 * shards' copies of that group (0 if none held it), and the new shard's
 * adds are the old ones in proportion to the groups taken (each merge's
 * share rounded down), below its width. */
static void merge_case(uint32_t from, uint32_t to, int full) {
  embps_sketch_t *old = counted(from);
  for (uint32_t j = 0; full && j < from; j++)
    old[j].adds = old[j].width - 1; /* the most a sketch holds */
  for (uint32_t k = 0; k < to; k++) {
    embps_sketch_t s;
    assert_int_equal(embps_sketch_init(&s, BYTES, SEED, k, to), 0);
    const uint32_t n = s.width / EMBPS_SKETCH_GROUP;
    uint64_t adds = 0;
    for (uint32_t j = 0; j < from; j++) {
      const uint32_t nj = old[j].width / EMBPS_SKETCH_GROUP;
      const uint32_t lo = s.g0 > old[j].g0 ? s.g0 : old[j].g0;
      const uint32_t hi = s.g0 + n < old[j].g0 + nj ? s.g0 + n
                                                    : old[j].g0 + nj;
      embps_sketch_merge(&s, old[j].c, old[j].g0, nj, old[j].adds);
      if (lo < hi) {
        adds += old[j].adds * (hi - lo) / nj;
        if (adds >= s.width)
          adds = s.width - 1;
      }
      assert_int_equal(s.adds, adds);
    }
    for (uint32_t g = s.g0; g < s.g0 + n; g++)
      for (uint32_t r = 0; r < EMBPS_SKETCH_DEPTH; r++)
        for (uint32_t i = 0; i < EMBPS_SKETCH_GROUP; i++) {
          uint16_t want = 0;
          for (uint32_t j = 0; j < from; j++) {
            const uint32_t nj = old[j].width / EMBPS_SKETCH_GROUP;
            if (g < old[j].g0 || g >= old[j].g0 + nj)
              continue;
            const uint16_t v =
                old[j].c[(size_t)r * old[j].width +
                         (size_t)(g - old[j].g0) * EMBPS_SKETCH_GROUP + i];
            want = v > want ? v : want;
          }
          assert_int_equal(s.c[(size_t)r * s.width +
                               (size_t)(g - s.g0) * EMBPS_SKETCH_GROUP + i],
                           want);
        }
    embps_sketch_free(&s);
  }
  free_all(old, from);
}

static void test_merge_exact(void **state) {
  (void)state;
  merge_case(2, 3, 0); /* new shards take parts of old ones' groups */
  merge_case(3, 2, 0);
  merge_case(4, 1, 0);
  merge_case(1, 5, 0);
  merge_case(3, 5, 1); /* old sketches about to age */
  merge_case(5, 3, 1);
}

/* ------------------------------------------------------------ by hash */

/* --admit-probability P admits an id iff hash(seed, id) < P (embps.h):
 * each id has a fixed point u in [0, 1) and passes exactly for P > u, the
 * same on every call; P >= 1 admits every id; the points are spread
 * evenly, so a share P of ids passes; another seed gives other points. */
static void test_admit_by_hash(void **state) {
  (void)state;
  enum { N = 200000 };
  static const double ps[] = {0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99};
  unsigned pass[sizeof ps / sizeof *ps] = {0}, differ = 0;
  for (int i = 0; i < N; i++) {
    const int64_t id = id_at(i);
    assert_int_equal(embps_admit_by_hash(SEED, id, 1.0), 1);
    assert_int_equal(embps_admit_by_hash(SEED, id, 2.5), 1);
    int before = 0;
    for (size_t p = 0; p < sizeof ps / sizeof *ps; p++) {
      const int got = embps_admit_by_hash(SEED, id, ps[p]);
      assert_int_equal(got, embps_admit_by_hash(SEED, id, ps[p]));
      assert_true(got >= before); /* passes from its point on */
      before = got;
      pass[p] += (unsigned)got;
    }
    differ += (unsigned)(embps_admit_by_hash(SEED, id, 0.5) !=
                         embps_admit_by_hash(SEED + 1, id, 0.5));
  }
  for (size_t p = 0; p < sizeof ps / sizeof *ps; p++) {
    const double sd = sqrt(N * ps[p] * (1 - ps[p]));
    if (fabs(pass[p] - N * ps[p]) > 5 * sd)
      fail_msg("P = %g: %u of %d ids pass", ps[p], pass[p], N);
  }
  assert_true(fabs(differ - N * 0.5) < 5 * sqrt(N * 0.25));
  /* the point of one id, found by bisection, is where it starts to pass */
  for (int i = 0; i < 64; i++) {
    double lo = 0, hi = 1;
    for (int b = 0; b < 40; b++) {
      const double mid = (lo + hi) / 2;
      if (embps_admit_by_hash(SEED, id_at(i), mid))
        hi = mid;
      else
        lo = mid;
    }
    assert_int_equal(embps_admit_by_hash(SEED, id_at(i), hi), 1);
    assert_int_equal(embps_admit_by_hash(SEED, id_at(i), lo), 0);
    assert_int_equal(embps_admit_by_hash(SEED, id_at(i), hi + 1e-9), 1);
    if (lo > 1e-9)
      assert_int_equal(embps_admit_by_hash(SEED, id_at(i), lo - 1e-9), 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_groups_cover_the_shard),
      cmocka_unit_test(test_merge_never_underestimates),
      cmocka_unit_test(test_add_matches_the_model),
      cmocka_unit_test(test_counters_saturate),
      cmocka_unit_test(test_merge_exact),
      cmocka_unit_test(test_admit_by_hash),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
