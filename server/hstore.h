/* hstore.h - the hashed row store: the rows of one shard of a table with
 * hashed storage (table.h), found by id.
 *
 * Records of row_bytes bytes, each beginning with its int64 id, live in
 * slots 0..n_slots-1, held in chunks that never move (so a record's
 * address stays valid while its row lives):
 *  - the chunks grow geometrically: level 0 is 2G chunks of R0 rows (R0 x
 *    row_bytes about 4 KiB), level L >= 1 is G chunks of R0 << L rows, up
 *    to R_max rows (2 MiB) a chunk, which then repeats. A new chunk is
 *    never more than 1/G of the rows before it, or R0 rows: chunks hold at
 *    most ~3% (G = 32) more than the rows.
 *  - the map is a linear-probing array of uint32 at load <= 0.8, grown by
 *    1.5x: 5 to 7.5 bytes a row. Entry 0 is empty; otherwise its low bits
 *    are slot + 1 and its high bits a tag from the id's hash (as many bits
 *    as the capacity leaves free). A probe reads a record (for its id) only
 *    when the tag matches - at most one record in ~64 probes at capacities
 *    below 2^26. Removal shifts the later entries of the probe run back,
 *    so there are no tombstones and a lookup stops at the first empty
 *    entry.
 *  - removed rows' slots go on a free list (linked through the dead
 *    records' first bytes), and inserts take them before new slots.
 *
 * Threads: the store has no lock of its own. One thread (the writer)
 * changes it; the caller's reader-writer lock (a shard's, in table.c)
 * guards what readers see:
 *  - lookups (embps_hstore_find*, _rec, _prefetch*): with the read lock
 *    held, or by the writer without it;
 *  - embps_hstore_*_locked: the writer, with the write lock held;
 *  - embps_hstore_reserve: the writer without the lock: it builds a grown
 *    map or chunk index aside and takes the lock for writing only to swap
 *    it in.
 *
 * Invariants: n_slots <= room <= 0.8 cap (every slot + 1 fits below the
 * tag bits); the chunks cover slots 0..room-1; every live slot has exactly
 * one map entry, a free slot none; n_free slots are on the free list. */
#ifndef EMBPS_HSTORE_H
#define EMBPS_HSTORE_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "route.h"

#define EMBPS_HSTORE_MAX_SLOTS (1u << 31) /* slot + 1 must fit 32 bits */
#define EMBPS_HSTORE_NONE UINT32_MAX      /* no slot, no map position */
#define EMBPS_HSTORE_LEVEL_SHIFT 5        /* G = 32 chunks per size level */
#define EMBPS_HSTORE_SEED 0x2545f4914f6cdd1dULL /* != shard and server hash */

/* One store. Users read the fields, never write them. Zeroed: empty, and
 * fine to close (a store of an array table is never initialised). */
typedef struct {
  /* what a lookup reads, together */
  uint32_t *map;           /* cap entries: 0, or tag | (slot + 1) */
  unsigned char **chunks;  /* n_chunks of chunks_cap pointers in use */
  uint32_t cap, tag_mask;  /* cap 0: no map yet */
  uint32_t row_bytes;      /* record size, at least 8 */
  uint32_t r0_shift;       /* log2 of R0, rows of a level-0 chunk */
  uint32_t max_level;      /* log2 of R_max / R0 */
  /* the writer's */
  uint32_t n_slots;        /* slots handed out, live or free */
  uint32_t room;           /* slots reserved: n_slots <= room */
  uint32_t free_head;      /* free list: slot + 1 (0: empty) */
  uint32_t n_free;         /* slots on the free list */
  uint32_t n_chunks, chunks_cap;
} embps_hstore_t;

/* An empty store of records of row_bytes (>= 8) bytes; allocates nothing. */
void embps_hstore_init(embps_hstore_t *hs, uint32_t row_bytes);
/* Frees the map and the chunks; hs is then zeroed. */
void embps_hstore_close(embps_hstore_t *hs);

/* Rows held (slots not on the free list). */
static inline uint32_t embps_hstore_n_live(const embps_hstore_t *hs) {
  return hs->n_slots - hs->n_free;
}

/* Slots that `fresh` new rows take beyond the free list. */
static inline uint32_t embps_hstore_new_slots(const embps_hstore_t *hs,
                                              uint32_t fresh) {
  return fresh > hs->n_free ? fresh - hs->n_free : 0;
}

/* Bytes that room for n_slots slots would add (chunks and map). */
uint64_t embps_hstore_growth_bytes(const embps_hstore_t *hs,
                                   uint32_t n_slots);

/* Makes room for n_slots (<= EMBPS_HSTORE_MAX_SLOTS) slots: chunks for
 * them and a map they fit at load <= 0.8. Writer, lock not held; takes
 * `lock` for writing around each swap of a grown map or chunk index.
 * *bytes_added = the bytes allocated, also on failure (what was grown
 * stays). 0 or -ENOMEM; the rows are unchanged either way. */
int embps_hstore_reserve(embps_hstore_t *hs, uint32_t n_slots,
                         pthread_rwlock_t *lock, int64_t *bytes_added);

/* Inserts id, which must not be in the store, into a free slot or the
 * next new one (room reserved), and writes id at the head of its record.
 * Returns the record, *slot its slot; the rest of the record is the
 * caller's to write. */
unsigned char *embps_hstore_insert_locked(embps_hstore_t *hs, int64_t id,
                                          uint32_t *slot);

/* Removes id, which must be in the store: its map entry goes (backward
 * shift) and its slot onto the free list, whose link overwrites the
 * record's id. ids: NULL, or a denser copy of every live slot's id read
 * instead of the records (slot s's at (char *)ids + s * stride). Returns
 * the slot freed. */
uint32_t embps_hstore_remove_locked(embps_hstore_t *hs, int64_t id,
                                    const int64_t *ids, size_t stride);

/* ---- lookups: inline, they are the hot path of every pull and push ---- */

static inline uint64_t embps_hstore_hash(int64_t id) {
  return embps_mix64((uint64_t)id ^ EMBPS_HSTORE_SEED);
}

/* Home position of hash h: its upper half scaled to [0, cap). */
static inline uint32_t embps_hstore_home(uint64_t h, uint32_t cap) {
  return (uint32_t)(((h >> 32) * (uint64_t)cap) >> 32);
}

/* The size level of slot's chunk. */
static inline uint32_t embps_hstore_level(const embps_hstore_t *hs,
                                          uint32_t slot) {
  uint32_t q = (slot >> (hs->r0_shift + EMBPS_HSTORE_LEVEL_SHIFT)) | 1;
  uint32_t level = 31 - (uint32_t)__builtin_clz(q);
  return level < hs->max_level ? level : hs->max_level;
}

/* The record in slot (< n_slots). Level L starts at slot G R0 2^L (L >= 1)
 * and chunk G (L + 1), so slot's chunk is G L + slot / (R0 2^L) at every
 * level, level 0 included. */
static inline unsigned char *embps_hstore_rec(const embps_hstore_t *hs,
                                              uint32_t slot) {
  uint32_t level = embps_hstore_level(hs, slot), shift = hs->r0_shift + level;
  uint32_t c = (level << EMBPS_HSTORE_LEVEL_SHIFT) + (slot >> shift);
  return hs->chunks[c] + (size_t)(slot & ((1u << shift) - 1)) * hs->row_bytes;
}

/* The id at the head of a record. */
static inline int64_t embps_hstore_rec_id(const unsigned char *rec) {
  int64_t id;
  memcpy(&id, rec, sizeof id);
  return id;
}

/* The slot of a map entry (non-zero). */
static inline uint32_t embps_hstore_entry_slot(const embps_hstore_t *hs,
                                               uint32_t e) {
  return (e & ~hs->tag_mask) - 1;
}

/* The map position of id, or EMBPS_HSTORE_NONE. */
static inline uint32_t embps_hstore_find_pos(const embps_hstore_t *hs,
                                             int64_t id) {
  const uint32_t cap = hs->cap, tag_mask = hs->tag_mask;
  if (!cap)
    return EMBPS_HSTORE_NONE;
  const uint64_t h = embps_hstore_hash(id);
  const uint32_t tag = (uint32_t)h & tag_mask;
  for (uint32_t i = embps_hstore_home(h, cap);;) {
    const uint32_t e = hs->map[i];
    if (!e)
      return EMBPS_HSTORE_NONE;
    if ((e & tag_mask) == tag &&
        embps_hstore_rec_id(embps_hstore_rec(hs, (e & ~tag_mask) - 1)) == id)
      return i;
    if (++i == cap)
      i = 0;
  }
}

/* The slot of id, or EMBPS_HSTORE_NONE. */
static inline uint32_t embps_hstore_find_slot(const embps_hstore_t *hs,
                                              int64_t id) {
  const uint32_t i = embps_hstore_find_pos(hs, id);
  return i == EMBPS_HSTORE_NONE ? EMBPS_HSTORE_NONE
                                : embps_hstore_entry_slot(hs, hs->map[i]);
}

/* The record of id, or NULL. */
static inline unsigned char *embps_hstore_find(const embps_hstore_t *hs,
                                               int64_t id) {
  const uint32_t slot = embps_hstore_find_slot(hs, id);
  return slot == EMBPS_HSTORE_NONE ? NULL : embps_hstore_rec(hs, slot);
}

/* Prefetch helpers, always inlined: gcc otherwise finds them free of side
 * effects (a prefetch writes nothing) and deletes the calls. */

/* Starts loading id's home map entry. */
static inline __attribute__((always_inline)) void
embps_hstore_prefetch_home(const embps_hstore_t *hs, int64_t id) {
  if (hs->cap)
    __builtin_prefetch(&hs->map[embps_hstore_home(embps_hstore_hash(id),
                                                  hs->cap)]);
}

/* The record id's home map entry names if its tag is id's (likely id's
 * record, never read here), or NULL: a guess for prefetching. */
static inline __attribute__((always_inline)) const unsigned char *
embps_hstore_home_guess(const embps_hstore_t *hs, int64_t id) {
  if (!hs->cap)
    return NULL;
  const uint64_t h = embps_hstore_hash(id);
  const uint32_t e = hs->map[embps_hstore_home(h, hs->cap)];
  if (!e || (e & hs->tag_mask) != ((uint32_t)h & hs->tag_mask))
    return NULL;
  return embps_hstore_rec(hs, embps_hstore_entry_slot(hs, e));
}
#endif
