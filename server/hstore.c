/* hstore.c - the hashed row store (hstore.h): chunk geometry and growth,
 * map growth, insertion into free or new slots, removal by backward
 * shift. Lookups are inline in hstore.h. */
#include "hstore.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#define CHUNK_BYTES (2u << 20)  /* largest row chunk */
#define FIRST_CHUNK_BYTES 4096u /* smallest row chunk, rounded up to rows */
#define MAP_MIN_CAP 32u

/* ------------------------------------------------------------ chunks */

void embps_hstore_init(embps_hstore_t *hs, uint32_t row_bytes) {
  assert(row_bytes >= sizeof(int64_t));
  memset(hs, 0, sizeof *hs);
  hs->row_bytes = row_bytes;
  /* R_max the largest power of two of rows within CHUNK_BYTES, R0 the
   * smallest reaching FIRST_CHUNK_BYTES (both >= 1) */
  uint32_t max_shift = 0, r0_shift = 0;
  while (((size_t)2 << max_shift) * row_bytes <= CHUNK_BYTES)
    max_shift++;
  while (r0_shift < max_shift &&
         ((size_t)1 << r0_shift) * row_bytes < FIRST_CHUNK_BYTES)
    r0_shift++;
  hs->r0_shift = r0_shift;
  hs->max_level = max_shift - r0_shift;
}

void embps_hstore_close(embps_hstore_t *hs) {
  for (uint32_t c = 0; c < hs->n_chunks; c++)
    free(hs->chunks[c]);
  free(hs->chunks);
  free(hs->map);
  memset(hs, 0, sizeof *hs);
}

/* Chunks holding slots 0..n_slots-1. */
static uint32_t chunks_for(const embps_hstore_t *hs, uint32_t n_slots) {
  if (!n_slots)
    return 0;
  uint32_t last = n_slots - 1, level = embps_hstore_level(hs, last);
  return (level << EMBPS_HSTORE_LEVEL_SHIFT) + (last >> (hs->r0_shift + level)) +
         1;
}

/* Bytes of chunk c: level 0 is chunks [0, 2G), level L >= 1 chunks
 * [G (L + 1), G (L + 2)). */
static size_t chunk_bytes(const embps_hstore_t *hs, uint32_t c) {
  uint32_t level = c < (2u << EMBPS_HSTORE_LEVEL_SHIFT)
                       ? 0
                       : (c >> EMBPS_HSTORE_LEVEL_SHIFT) - 1;
  if (level > hs->max_level)
    level = hs->max_level;
  return ((size_t)1 << (hs->r0_shift + level)) * hs->row_bytes;
}

/* Gives hs chunks up to index want - 1. A grown chunk index is swapped in
 * under the write lock; new chunk pointers go past every index a map entry
 * names, so readers never see them until a row there is inserted (under
 * the write lock). Adds the bytes allocated to *added. 0 or -ENOMEM. */
static int add_chunks(embps_hstore_t *hs, uint32_t want,
                      pthread_rwlock_t *lock, int64_t *added) {
  if (want > hs->chunks_cap) {
    uint32_t cap = hs->chunks_cap ? hs->chunks_cap : 16;
    while (cap < want)
      cap *= 2;
    unsigned char **index = malloc(cap * sizeof *index), **old = hs->chunks;
    if (!index)
      return -ENOMEM;
    if (hs->n_chunks)
      memcpy(index, old, hs->n_chunks * sizeof *index);
    pthread_rwlock_wrlock(lock);
    hs->chunks = index;
    pthread_rwlock_unlock(lock);
    free(old);
    hs->chunks_cap = cap;
  }
  while (hs->n_chunks < want) {
    size_t bytes = chunk_bytes(hs, hs->n_chunks);
    unsigned char *c = malloc(bytes);
    if (!c)
      return -ENOMEM;
    hs->chunks[hs->n_chunks++] = c;
    *added += (int64_t)bytes;
  }
  return 0;
}

/* ------------------------------------------------------------ map */

/* Slots a map of cap entries may hold: load <= 0.8. */
static inline uint32_t max_slots(uint32_t cap) {
  return (uint32_t)((uint64_t)cap * 4 / 5);
}

/* The tag bits of an entry: those above the ones slot + 1 needs. */
static uint32_t tag_mask_for(uint32_t cap) {
  uint32_t bits = 32 - (uint32_t)__builtin_clz(max_slots(cap));
  return bits >= 32 ? 0 : ~0u << bits;
}

/* The smallest capacity of the growth sequence (x1.5 from cap, at least
 * MAP_MIN_CAP) that holds n_slots. n_slots <= EMBPS_HSTORE_MAX_SLOTS, so
 * it fits 32 bits. */
static uint32_t cap_for(uint32_t cap, uint32_t n_slots) {
  uint64_t c = cap > MAP_MIN_CAP ? cap : MAP_MIN_CAP;
  while (max_slots((uint32_t)c) < n_slots)
    c += c / 2;
  return (uint32_t)c;
}

/* Records slot under hash h in map m (its id must not be there yet). */
static inline void map_put(uint32_t *m, uint32_t cap, uint32_t tag_mask,
                           uint64_t h, uint32_t slot) {
  uint32_t i = embps_hstore_home(h, cap);
  while (m[i])
    if (++i == cap)
      i = 0;
  m[i] = ((uint32_t)h & tag_mask) | (slot + 1);
}

/* Replaces the map with one of cap entries holding every live slot, built
 * aside (ids read from the records: in slot order when no slot is free,
 * else by the old map's entries), then swapped in under the write lock.
 * Adds the bytes to *added. 0 or -ENOMEM (map unchanged). */
static int grow_map(embps_hstore_t *hs, uint32_t cap, pthread_rwlock_t *lock,
                    int64_t *added) {
  uint32_t *m = calloc(cap, sizeof *m), *old = hs->map;
  if (!m)
    return -ENOMEM;
  const uint32_t tag_mask = tag_mask_for(cap), old_cap = hs->cap;
  const int by_map = hs->n_free != 0; /* else every slot is live */
  const uint32_t end = by_map ? old_cap : hs->n_slots;
  for (uint32_t i = 0; i < end; i++) {
    if (by_map && !old[i])
      continue;
    const uint32_t slot = by_map ? embps_hstore_entry_slot(hs, old[i]) : i;
    const int64_t id = embps_hstore_rec_id(embps_hstore_rec(hs, slot));
    map_put(m, cap, tag_mask, embps_hstore_hash(id), slot);
  }
  pthread_rwlock_wrlock(lock);
  hs->map = m;
  hs->cap = cap;
  hs->tag_mask = tag_mask;
  pthread_rwlock_unlock(lock);
  free(old);
  *added += ((int64_t)cap - old_cap) * (int64_t)sizeof *m;
  return 0;
}

uint64_t embps_hstore_growth_bytes(const embps_hstore_t *hs,
                                   uint32_t n_slots) {
  uint64_t bytes = 0;
  const uint32_t want = chunks_for(hs, n_slots);
  for (uint32_t c = hs->n_chunks; c < want; c++)
    bytes += chunk_bytes(hs, c);
  if (n_slots > max_slots(hs->cap))
    bytes += (uint64_t)(cap_for(hs->cap, n_slots) - hs->cap) * sizeof *hs->map;
  return bytes;
}

int embps_hstore_reserve(embps_hstore_t *hs, uint32_t n_slots,
                         pthread_rwlock_t *lock, int64_t *bytes_added) {
  assert(n_slots <= EMBPS_HSTORE_MAX_SLOTS);
  *bytes_added = 0;
  int rc = add_chunks(hs, chunks_for(hs, n_slots), lock, bytes_added);
  if (!rc && n_slots > max_slots(hs->cap))
    rc = grow_map(hs, cap_for(hs->cap, n_slots), lock, bytes_added);
  if (!rc && n_slots > hs->room)
    hs->room = n_slots;
  assert(rc || (hs->room <= max_slots(hs->cap) &&
                chunks_for(hs, hs->room) <= hs->n_chunks));
  return rc;
}

/* ------------------------------------------------------------ rows */

unsigned char *embps_hstore_insert_locked(embps_hstore_t *hs, int64_t id,
                                          uint32_t *slot) {
  unsigned char *rec;
  if (hs->free_head) {
    *slot = hs->free_head - 1;
    rec = embps_hstore_rec(hs, *slot);
    memcpy(&hs->free_head, rec, sizeof hs->free_head);
    hs->n_free--;
  } else {
    assert(hs->n_slots < hs->room);
    *slot = hs->n_slots++;
    rec = embps_hstore_rec(hs, *slot);
  }
  memcpy(rec, &id, sizeof id);
  map_put(hs->map, hs->cap, hs->tag_mask, embps_hstore_hash(id), *slot);
  return rec;
}

uint32_t embps_hstore_remove_locked(embps_hstore_t *hs, int64_t id,
                                    const int64_t *ids, size_t stride) {
  const uint32_t cap = hs->cap;
  uint32_t hole = embps_hstore_find_pos(hs, id);
  assert(hole != EMBPS_HSTORE_NONE);
  const uint32_t slot = embps_hstore_entry_slot(hs, hs->map[hole]);
  /* every later entry of the probe run that may move into the hole does */
  for (uint32_t j = hole;;) {
    if (++j == cap)
      j = 0;
    const uint32_t e = hs->map[j];
    if (!e)
      break;
    const uint32_t es = embps_hstore_entry_slot(hs, e);
    const int64_t eid =
        ids ? *(const int64_t *)(const void *)((const char *)ids + es * stride)
            : embps_hstore_rec_id(embps_hstore_rec(hs, es));
    const uint32_t home = embps_hstore_home(embps_hstore_hash(eid), cap);
    /* e stays if its home lies cyclically in (hole, j] */
    const int stays = hole <= j ? (home > hole && home <= j)
                                : (home > hole || home <= j);
    if (!stays) {
      hs->map[hole] = e;
      hole = j;
    }
  }
  hs->map[hole] = 0;
  memcpy(embps_hstore_rec(hs, slot), &hs->free_head, sizeof hs->free_head);
  hs->free_head = slot + 1;
  hs->n_free++;
  return slot;
}
