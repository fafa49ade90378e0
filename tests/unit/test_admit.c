/* test_admit.c - the admission sketch (server/admit.c): every shard's
 * groups hold the ids the shard routes; an estimate is never below the
 * true count, in the shards that counted and in the shards of any other
 * shard count the counts are merged into; a merge into the same layout is
 * a copy. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_groups_cover_the_shard),
      cmocka_unit_test(test_merge_never_underestimates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
