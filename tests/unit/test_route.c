/* test_route.c - unit tests of routing (common/route.c, embps_route):
 * jump hash range and agreement with Lamping and Veach's published code,
 * determinism, balance over servers and shards, and the consistent-hash
 * property (K -> K+1 servers moves ~1/(K+1) of the ids, all to server K). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "embps/embps.h"
#include "route.h"
#include "rng.h"

#define N_IDS 200000

/* The paper's reference implementation ("A Fast, Minimal Memory, Consistent
 * Hash Algorithm", Lamping and Veach 2014, figure 1). */
static int32_t ref_jump(uint64_t key, int32_t num_buckets) {
  int64_t b = -1, j = 0;
  while (j < num_buckets) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = (int64_t)((double)(b + 1) *
                  ((double)(1LL << 31) / (double)((key >> 33) + 1)));
  }
  return (int32_t)b;
}

/* Ids of several shapes: sequential, random, negative, extremes. */
static int64_t *make_ids(void) {
  int64_t *ids = malloc(N_IDS * sizeof *ids);
  assert_non_null(ids);
  uint64_t s = 2024;
  for (size_t i = 0; i < N_IDS; i++) {
    switch (i % 4) {
    case 0:
      ids[i] = (int64_t)(i / 4); /* dense small ids */
      break;
    case 1:
      ids[i] = -(int64_t)(i / 4) - 1;
      break;
    default:
      ids[i] = (int64_t)rng_next(&s);
      break;
    }
  }
  ids[2] = INT64_MIN;
  ids[3] = INT64_MAX;
  return ids;
}

/* Counts must each be within tol * N/K of N/K. */
static void check_balance(const size_t *count, uint32_t k, size_t n,
                          double tol) {
  double expect = (double)n / k;
  size_t total = 0;
  for (uint32_t b = 0; b < k; b++) {
    total += count[b];
    if (fabs((double)count[b] - expect) > tol * expect) {
      print_error("bucket %u of %u has %zu ids, expected %.0f +- %.0f%%\n", b,
                  k, count[b], expect, tol * 100);
      fail();
    }
  }
  assert_int_equal(total, n);
}

static void test_jump_range_and_reference(void **state) {
  (void)state;
  uint64_t s = 1;
  for (int i = 0; i < 20000; i++) {
    uint64_t key = rng_next(&s);
    uint32_t n = 1 + (uint32_t)(rng_next(&s) % 1000);
    uint32_t b = embps_jump_hash(key, n);
    assert_true(b < n);
    assert_int_equal(b, (uint32_t)ref_jump(key, (int32_t)n));
  }
  /* large bucket counts and edge keys */
  const uint64_t keys[] = {0, 1, UINT64_MAX, 0x8000000000000000ULL};
  const uint32_t ns[] = {1, 2, 3, 1u << 16, 1u << 30, INT32_MAX};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    for (size_t j = 0; j < sizeof ns / sizeof *ns; j++) {
      uint32_t b = embps_jump_hash(keys[i], ns[j]);
      assert_true(b < ns[j]);
      assert_int_equal(b, (uint32_t)ref_jump(keys[i], (int32_t)ns[j]));
    }
    assert_int_equal(embps_jump_hash(keys[i], 1), 0);
  }
}

static void test_route_range_and_determinism(void **state) {
  (void)state;
  int64_t *ids = make_ids();
  /* one server (or none) owns everything */
  for (size_t i = 0; i < 1000; i++) {
    assert_int_equal(embps_route(ids[i], 0), 0);
    assert_int_equal(embps_route(ids[i], 1), 0);
  }
  uint32_t *first = malloc(N_IDS * sizeof *first);
  assert_non_null(first);
  for (uint32_t k = 2; k <= 64; k += 7) {
    for (size_t i = 0; i < N_IDS; i++) {
      first[i] = embps_route(ids[i], k);
      assert_true(first[i] < k);
    }
    /* the same answer again, and for a copy of the id */
    for (size_t i = 0; i < N_IDS; i += 3) {
      int64_t copy = ids[i];
      assert_int_equal(embps_route(copy, k), first[i]);
    }
  }
  /* a fixed route is a function of (id, K) alone: jump hash of the mix */
  for (size_t i = 0; i < 10000; i++)
    assert_int_equal(embps_route(ids[i], 5),
                     embps_jump_hash(embps_mix64((uint64_t)ids[i]), 5));
  free(first);
  free(ids);
}

static void test_route_balance(void **state) {
  (void)state;
  int64_t *ids = make_ids();
  const uint32_t ks[] = {2, 3, 4, 5, 7, 8, 10, 13, 16, 24, 32};
  size_t count[32];
  for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
    uint32_t k = ks[ki];
    memset(count, 0, sizeof count);
    for (size_t i = 0; i < N_IDS; i++)
      count[embps_route(ids[i], k)]++;
    check_balance(count, k, N_IDS, 0.10);
  }
  /* the dense ids 0..N-1 alone are balanced too */
  memset(count, 0, sizeof count);
  for (int64_t id = 0; id < N_IDS; id++)
    count[embps_route(id, 8)]++;
  check_balance(count, 8, N_IDS, 0.10);
  free(ids);
}

/* Going from K to K+1 servers, an id either stays or moves to the new
 * server K, and about 1/(K+1) of the ids move. */
static void test_route_consistent(void **state) {
  (void)state;
  int64_t *ids = make_ids();
  for (uint32_t k = 1; k <= 20; k++) {
    size_t moved = 0;
    for (size_t i = 0; i < N_IDS; i++) {
      uint32_t a = embps_route(ids[i], k), b = embps_route(ids[i], k + 1);
      if (a != b) {
        if (b != k) {
          print_error("id %lld moved from %u to %u going %u -> %u servers\n",
                      (long long)ids[i], a, b, k, k + 1);
          fail();
        }
        moved++;
      }
    }
    double expect = (double)N_IDS / (k + 1);
    if (fabs((double)moved - expect) > 0.10 * expect) {
      print_error("%u -> %u servers moved %zu ids, expected ~%.0f\n", k, k + 1,
                  moved, expect);
      fail();
    }
  }
  /* and over a bigger jump: 10 -> 15 servers, nothing moves between old
   * servers */
  for (size_t i = 0; i < N_IDS; i++) {
    uint32_t a = embps_route(ids[i], 10), b = embps_route(ids[i], 15);
    assert_true(a == b || b >= 10);
  }
  free(ids);
}

static void test_shard_range_and_balance(void **state) {
  (void)state;
  int64_t *ids = make_ids();
  const uint32_t ns[] = {1, 2, 3, 7, 8, 16, 31, 64};
  size_t count[64];
  for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
    uint32_t n = ns[ni];
    memset(count, 0, sizeof count);
    for (size_t i = 0; i < N_IDS; i++) {
      uint32_t sh = embps_route_shard(ids[i], n);
      assert_true(sh < n);
      assert_int_equal(embps_route_shard(ids[i], n), sh);
      count[sh]++;
    }
    check_balance(count, n, N_IDS, 0.10);
  }
  /* the ids one server of four owns still spread over its shards */
  memset(count, 0, sizeof count);
  size_t mine = 0;
  for (size_t i = 0; i < N_IDS; i++) {
    if (embps_route(ids[i], 4) != 1)
      continue;
    mine++;
    count[embps_route_shard(ids[i], 8)]++;
  }
  check_balance(count, 8, mine, 0.10);
  /* extreme shard counts stay in range */
  for (size_t i = 0; i < 1000; i++)
    assert_true(embps_route_shard(ids[i], UINT32_MAX) < UINT32_MAX);
  free(ids);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_jump_range_and_reference),
      cmocka_unit_test(test_route_range_and_determinism),
      cmocka_unit_test(test_route_balance),
      cmocka_unit_test(test_route_consistent),
      cmocka_unit_test(test_shard_range_and_balance),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
