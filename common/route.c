/* route.c - jump consistent hash (Lamping & Veach, 2014): moving from K to
 * K+1 servers moves only 1/(K+1) of the ids, and needs no table. */
#include "route.h"

#include "embps/embps.h"

uint32_t embps_jump_hash(uint64_t key, uint32_t n_buckets) {
  int64_t b = -1, j = 0;
  while (j < (int64_t)n_buckets) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = (int64_t)((double)(b + 1) *
                  ((double)(1LL << 31) / (double)((key >> 33) + 1)));
  }
  return (uint32_t)b;
}

uint32_t embps_route(int64_t id, uint32_t n_servers) {
  if (n_servers <= 1)
    return 0;
  return embps_jump_hash(embps_mix64((uint64_t)id), n_servers);
}
