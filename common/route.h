/* route.h - where a row lives: which server (jump consistent hash over the
 * cluster) and which shard inside a server. Client and server share it. */
#ifndef EMBPS_ROUTE_H
#define EMBPS_ROUTE_H
#include <stdint.h>

/* splitmix64's finaliser: a bijective 64-bit mix. */
static inline uint64_t embps_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

/* Lamping and Veach's jump consistent hash: bucket in [0, n_buckets). */
uint32_t embps_jump_hash(uint64_t key, uint32_t n_buckets);

/* The shard (0..n_shards-1) of id inside one server. Independent of the
 * server route (a different mix), so one server's ids spread evenly. */
static inline uint32_t embps_route_shard(int64_t id, uint32_t n_shards) {
  uint64_t h = embps_mix64((uint64_t)id ^ 0x5bd1e9955bd1e995ULL);
  return (uint32_t)(((h >> 32) * (uint64_t)n_shards) >> 32);
}
#endif
