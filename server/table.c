/* table.c - row storage (see table.h for the design and the record).
 *
 * Locking: every shard has a writer-preferring rwlock. A gather takes
 * every shard's read lock, in shard order, and holds them all for its
 * whole length. Only one thread applies to a table at a time, and nothing
 * else writes to it, so the applying thread reads the table's structures
 * without a lock and builds new ones (a grown map, a grown chunk index)
 * without one; it takes a shard's write lock for every change a reader
 * could see: writing rows, inserting into the map, swapping in a grown map
 * or chunk index. Rows never move. Functions named _locked expect the
 * shard's lock held (the write lock unless their contract says read).
 *
 * Hashed storage: per shard, an hstore (hstore.h: the map, the row chunks,
 * slot allocation) whose records are this file's records, id first.
 */
#include "table.h"

#include <assert.h>
#include <errno.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "admit.h"
#include "dtype.h"
#include "hstore.h"
#include "init.h"
#include "optim.h"
#include "route.h"

#define HUGE_PAGE_BYTES (2u << 20) /* array storage: madvise from this size */
#define PARALLEL_MIN_ROWS 4096 /* below this, OpenMP costs more than it gains */
#define PARALLEL_MIN_BYTES (256u << 10) /* the same for copying rows in */
#define ID_BYTES 8u                /* the id heading a hashed record */
#define PREFETCH_AHEAD 16          /* rows */
#define PREFETCH_MAX 512u          /* bytes of a record prefetched */
#define SKETCH_DEFAULT_BYTES (1u << 20) /* --admit-sketch-bytes 0 */

/* Counters of admission and eviction (issue 12), kept per shard under its
 * lock, so a shard's snapshot holds the counts of exactly the pushes it
 * holds, and the table's sum (its atomics) in step with them. */
enum { CNT_ADMITTED, CNT_PENDING, CNT_TTL, CNT_CAP, CNT_L2, N_CNT };

/* Bookkeeping of one slot of a table with eviction (issue 12). */
typedef struct {
  int64_t id;
  uint64_t last_step;  /* table step of the row's last push */
  uint32_t freq;       /* pushes since it was made; 0: the slot is free */
  uint32_t prev, next; /* recency list, slot + 1 (0: none) */
  uint32_t heap;       /* LFU: position in the shard's heap */
} row_meta_t;

typedef struct {
  pthread_rwlock_t lock;
  /* admission and eviction (issue 12), hashed storage only */
  embps_sketch_t sketch; /* admit_after > 1 */
  row_meta_t *meta;      /* meta_cap slots; NULL without eviction */
  uint32_t meta_cap;
  uint32_t lru_head, lru_tail; /* slot + 1, least recently pushed first */
  uint32_t *heap, heap_n, heap_cap; /* LFU min-heap of slots */
  uint64_t cnt[N_CNT];   /* this shard's part of the table's counters */
  embps_hstore_t hs;    /* hashed storage only */
  uint64_t lsn;        /* log position of the last push applied here */
  char pad[64];
} shard_t;

struct embps_table {
  embps_table_spec_t spec; /* alterable fields: written under spec_mu */
  pthread_mutex_t spec_mu; /* the apply thread alters, any thread reads */
  embps_optim_t optim;
  uint32_t n_shards, dim;
  embps_dtype_t dtype;
  int hashed;               /* hashed storage, else array */
  uint32_t row_bytes;       /* record size, a multiple of 16 */
  uint32_t w_off, state_off; /* byte offsets of weights and state */
  uint32_t w_bytes;         /* bytes of the stored weights */
  unsigned char *rows;      /* array: mmap'd records */
  size_t rows_len;
  _Atomic uint64_t *live;   /* array: bitmap of materialised rows */
  size_t live_words;
  shard_t *shards;
  atomic_uint_fast64_t rows_allocated, bytes, pushes, pulls, step;
  uint64_t incarnation;     /* the LSN that created it (durable.c) */
  /* admission and eviction (issue 12) */
  int policy;               /* any of them: the slow paths below */
  int has_meta;             /* per-slot row_meta_t (ttl, max_rows or l2) */
  int admit_count;          /* admit_after > 1: the sketch */
  uint64_t cap_server, cap_shard; /* max_rows shares (0: no capacity) */
  atomic_uint_fast64_t visible_step; /* step pulls judge ttl by */
  atomic_uint_fast64_t admitted, pending, ev_ttl, ev_cap, ev_l2, stall_ns;
  atomic_int refs;
};

static atomic_uint_fast64_t total_bytes;

uint64_t embps_tables_total_bytes(void) { return atomic_load(&total_bytes); }

static void add_bytes(embps_table_t *t, int64_t delta) {
  atomic_fetch_add(&t->bytes, (uint64_t)delta);
  atomic_fetch_add(&total_bytes, (uint64_t)delta);
}

/* ------------------------------------------------------------ scratch */

void embps_table_scratch_init(embps_table_scratch_t *s) {
  memset(s, 0, sizeof *s);
}

void embps_table_scratch_close(embps_table_scratch_t *s) {
  free(s->order);
  free(s->shard);
  free(s->rec);
  free(s->start);
  free(s->fresh);
  free(s->wide);
  free(s->what);
  free(s->slot);
  embps_table_scratch_init(s);
}

/* Makes room for n positions and S shards in s. 0 or -ENOMEM. */
static int scratch_reserve(embps_table_scratch_t *s, size_t n, uint32_t S) {
  if (n > s->cap) {
    uint32_t *o = malloc(n * sizeof *o), *sh = malloc(n * sizeof *sh);
    if (!o || !sh) {
      free(o);
      free(sh);
      return -ENOMEM;
    }
    free(s->order);
    free(s->shard);
    s->order = o;
    s->shard = sh;
    s->cap = n;
    free(s->rec); /* sized with cap, on demand (apply only) */
    s->rec = NULL;
    free(s->what);
    free(s->slot);
    s->what = NULL;
    s->slot = NULL;
  }
  if (S + 1 > s->shard_cap) {
    uint32_t *st = malloc((S + 1) * sizeof *st);
    uint32_t *fr = malloc((S + 1) * sizeof *fr);
    if (!st || !fr) {
      free(st);
      free(fr);
      return -ENOMEM;
    }
    free(s->start);
    free(s->fresh);
    s->start = st;
    s->fresh = fr;
    s->shard_cap = S + 1;
  }
  return 0;
}

/* Groups positions 0..n-1 by shard (a stable counting sort). */
static int group_by_shard(const embps_table_t *t, embps_table_scratch_t *s,
                          const int64_t *ids, size_t n) {
  uint32_t S = t->n_shards;
  int rc = scratch_reserve(s, n, S);
  if (rc)
    return rc;
  memset(s->start, 0, (S + 1) * sizeof *s->start);
  for (size_t i = 0; i < n; i++) {
    uint32_t k = embps_route_shard(ids[i], S);
    s->shard[i] = k;
    s->start[k + 1]++;
  }
  for (uint32_t k = 0; k < S; k++)
    s->start[k + 1] += s->start[k];
  /* fill using start[k] as a cursor, then shift back */
  for (size_t i = 0; i < n; i++)
    s->order[s->start[s->shard[i]]++] = (uint32_t)i;
  for (uint32_t k = S; k > 0; k--)
    s->start[k] = s->start[k - 1];
  s->start[0] = 0;
  return 0;
}

/* Floats of one thread's float32 row in s->wide (whole cache lines). */
static size_t wide_stride(const embps_table_t *t) {
  return ((size_t)t->dim + 15) & ~(size_t)15;
}

/* What an apply needs beyond group_by_shard: the record of each position
 * (hashed storage) and a float32 row per OpenMP thread (f16/bf16 tables),
 * allocated before any row changes. 0 or -ENOMEM. */
static int scratch_reserve_apply(const embps_table_t *t,
                                 embps_table_scratch_t *s) {
  if (t->hashed && !s->rec) {
    s->rec = malloc((s->cap ? s->cap : 1) * sizeof *s->rec);
    if (!s->rec)
      return -ENOMEM;
  }
  if (t->policy && !s->what) {
    s->what = malloc(s->cap ? s->cap : 1);
    s->slot = malloc((s->cap ? s->cap : 1) * sizeof *s->slot);
    if (!s->what || !s->slot) {
      free(s->what);
      free(s->slot);
      s->what = NULL;
      s->slot = NULL;
      return -ENOMEM;
    }
  }
  size_t wide = t->dtype == EMBPS_DTYPE_F32
                    ? 0
                    : (size_t)omp_get_max_threads() * wide_stride(t);
  if (wide > s->wide_floats) {
    float *w = aligned_alloc(64, wide * sizeof *w);
    if (!w)
      return -ENOMEM;
    free(s->wide);
    s->wide = w;
    s->wide_floats = wide;
  }
  return 0;
}

/* The calling OpenMP thread's float32 row, or NULL for f32 tables. */
static float *thread_wide(const embps_table_t *t,
                          const embps_table_scratch_t *s) {
  if (t->dtype == EMBPS_DTYPE_F32)
    return NULL;
  return s->wide + (size_t)omp_get_thread_num() * wide_stride(t);
}

/* ------------------------------------------------------------ records */

static inline int is_padding(const embps_table_t *t, int64_t id) {
  return t->spec.has_padding && id == t->spec.padding_id;
}

/* Widens the stored weights of rec into dst (float32). */
static inline void read_weights(const embps_table_t *t,
                                const unsigned char *rec, float *dst) {
  if (t->dtype == EMBPS_DTYPE_F32)
    memcpy(dst, rec + t->w_off, t->dim * sizeof *dst);
  else
    embps_dtype_to_f32(t->dtype, rec + t->w_off, dst, t->dim);
}

/* The weights a row never pushed reads as: its initial value, rounded to
 * the storage type, so a pull agrees before and after the row is
 * materialised. */
static inline void initial_weights(const embps_table_t *t, int64_t id,
                                   float *dst) {
  embps_init_row(&t->spec, id, dst);
  if (t->dtype != EMBPS_DTYPE_F32)
    embps_dtype_round(t->dtype, dst, t->dim);
}

/* Writes a fresh row's initial weights and optimizer state into rec (not
 * the id). wide: a float32 row of scratch for f16/bf16 tables. */
static void init_record(const embps_table_t *t, int64_t id,
                        unsigned char *rec, float *wide) {
  if (t->dtype == EMBPS_DTYPE_F32) {
    embps_init_row(&t->spec, id, (float *)(rec + t->w_off));
  } else {
    embps_init_row(&t->spec, id, wide);
    embps_dtype_from_f32(t->dtype, wide, rec + t->w_off, t->dim);
  }
  embps_optim_init_state(&t->optim, (float *)(rec + t->state_off), t->dim);
}

/* One optimizer step on rec with gradient g. The f32 path runs the kernel
 * in place; f16/bf16 widen the weights into wide, run the same kernel and
 * round back to nearest even. */
static inline void apply_record(const embps_table_t *t, unsigned char *rec,
                                const float *g, float *wide) {
  void *w = rec + t->w_off;
  if (t->dtype == EMBPS_DTYPE_F32) {
    embps_optim_apply(&t->optim, w, g, t->dim); /* state follows w */
    return;
  }
  embps_dtype_to_f32(t->dtype, w, wide, t->dim);
  embps_optim_apply_split(&t->optim, wide, (float *)(rec + t->state_off), g,
                          t->dim);
  embps_dtype_from_f32(t->dtype, wide, w, t->dim);
}

/* ------------------------------------------------------------ array */

/* Passed as `wide` to materialise a row whose contents the caller writes
 * (restore): no initial value is computed. */
#define RAW_ROW ((float *)(uintptr_t)1)

static inline unsigned char *array_rec(const embps_table_t *t, int64_t id) {
  return t->rows + (size_t)id * t->row_bytes;
}

static inline int array_live(const embps_table_t *t, int64_t id) {
  uint64_t w = atomic_load_explicit(&t->live[(uint64_t)id >> 6],
                                    memory_order_relaxed);
  return (int)((w >> ((uint64_t)id & 63)) & 1);
}

/* The record of id, materialised if new (counted in *created). Write lock
 * held. */
static unsigned char *array_materialise(const embps_table_t *t, int64_t id,
                                        float *wide, uint64_t *created) {
  unsigned char *rec = array_rec(t, id);
  if (array_live(t, id))
    return rec;
  if (wide != RAW_ROW)
    init_record(t, id, rec, wide);
  atomic_fetch_or_explicit(&t->live[(uint64_t)id >> 6],
                           1ULL << ((uint64_t)id & 63), memory_order_relaxed);
  (*created)++;
  return rec;
}

/* Whether slot of sh holds a row (evicted slots wait on the free list). */
static inline int slot_live(const embps_table_t *t, const shard_t *sh,
                            uint32_t slot) {
  return !t->has_meta || sh->meta[slot].freq != 0;
}

/* Slot bookkeeping capacity for `rows` slots (doubling). */
static uint32_t meta_cap_for(uint32_t cap, uint32_t rows) {
  uint64_t c = cap ? cap : 64;
  while (c < rows)
    c *= 2;
  return c > EMBPS_HSTORE_MAX_SLOTS ? EMBPS_HSTORE_MAX_SLOTS : (uint32_t)c;
}

/* Bytes of bookkeeping a slot costs: meta, and the LFU heap entry. */
static size_t meta_slot_bytes(const embps_table_t *t) {
  return sizeof(row_meta_t) +
         (t->spec.max_rows && t->spec.evict == EMBPS_EVICT_LFU
              ? sizeof(uint32_t)
              : 0);
}

/* Bytes that room for `rows` slots in sh would add (store and meta). */
static uint64_t growth_bytes(const embps_table_t *t, const shard_t *sh,
                             uint32_t rows) {
  uint64_t bytes = embps_hstore_growth_bytes(&sh->hs, rows);
  if (t->has_meta && rows > sh->meta_cap)
    bytes += (uint64_t)(meta_cap_for(sh->meta_cap, rows) - sh->meta_cap) *
             meta_slot_bytes(t);
  return bytes;
}

/* Grows sh's slot bookkeeping (and LFU heap) to hold `rows` slots; the
 * meta array is swapped under the write lock (pulls read it). 0, -ENOMEM. */
static int grow_meta(embps_table_t *t, shard_t *sh, uint32_t rows) {
  if (!t->has_meta || rows <= sh->meta_cap)
    return 0;
  const uint32_t cap = meta_cap_for(sh->meta_cap, rows);
  row_meta_t *m = malloc((size_t)cap * sizeof *m);
  if (!m)
    return -ENOMEM;
  if (meta_slot_bytes(t) > sizeof *m) {
    uint32_t *h = realloc(sh->heap, (size_t)cap * sizeof *h);
    if (!h) {
      free(m);
      return -ENOMEM;
    }
    sh->heap = h;
    sh->heap_cap = cap;
  }
  if (sh->meta_cap)
    memcpy(m, sh->meta, (size_t)sh->meta_cap * sizeof *m);
  row_meta_t *old = sh->meta;
  pthread_rwlock_wrlock(&sh->lock);
  sh->meta = m;
  pthread_rwlock_unlock(&sh->lock);
  free(old);
  add_bytes(t, (int64_t)((cap - sh->meta_cap) * meta_slot_bytes(t)));
  sh->meta_cap = cap;
  return 0;
}

static void meta_on_insert(const embps_table_t *t, shard_t *sh, uint32_t slot,
                           int64_t id, uint64_t step);

/* The record of a new id in sh (a free slot or the next one): id, initial
 * row, and for tables with eviction its bookkeeping (pushed at `step`,
 * once). Write lock held; room reserved. */
static unsigned char *hashed_insert_locked(const embps_table_t *t,
                                           shard_t *sh, int64_t id,
                                           float *wide, uint64_t step) {
  uint32_t slot;
  unsigned char *rec = embps_hstore_insert_locked(&sh->hs, id, &slot);
  assert(!t->has_meta || slot < sh->meta_cap); /* meta room reserved */
  if (wide != RAW_ROW)
    init_record(t, id, rec, wide);
  if (t->has_meta)
    meta_on_insert(t, sh, slot, id, step);
  return rec;
}

/* ------------------------------------------------ admission and eviction
 *
 * Per shard, under its write lock, for dynamic tables (issue 12):
 *  - admission: a count-min sketch (admit.c) counts pushes of ids without a
 *    row; the push that brings an id's count to admit_after makes the row
 *    (initial value) and applies that push's gradient only. Earlier
 *    gradients are counted, never applied (DeepRec's counter filter does
 *    the same). --admit-probability admits by a hash of (seed, id).
 *  - recency: a doubly linked list of slots, least recently pushed first,
 *    in push order (rows of one push in the order the push lists them);
 *    TTL expiry and LRU eviction take its head. LFU keeps a min-heap keyed
 *    (pushes, last step, id).
 *  - ttl: a row whose last push is ttl_steps or more steps old reads as
 *    its initial value at once (pulls and pushes check its step); its
 *    memory is reclaimed from the list head by later pushes to the shard
 *    (a bounded number per push), or all at once by embps_table_evict.
 *  - capacity: each shard holds at most cap_shard = ceil(max_rows /
 *    servers / shards) rows; a push that passes it evicts after applying,
 *    never a row of the push itself.
 * Evicted slots go on the shard's free list; the next new rows reuse them,
 * so memory stays at the capacity plus one push. Every decision depends
 * only on the table's state and the order of pushes, so replaying the log
 * from a checkpoint decides the same way. */

#define LIST_NONE 0u
#define SWEEP_MIN 8u /* expired rows reclaimed per push and shard, at least */

enum {
  W_SKIP,    /* padding */
  W_LIVE,    /* a row: apply */
  W_NEW,     /* admitted now: make the row, apply */
  W_RESET,   /* an expired row admitted again: reinitialise, apply */
  W_PENDING, /* not admitted yet: count it */
  W_DROP,    /* an expired row not admitted again: evict, count it */
  W_REFUSED, /* refused by --admit-probability */
};

enum { WHY_TTL, WHY_CAP, WHY_L2 };

static inline row_meta_t *meta_of(const shard_t *sh, uint32_t slot) {
  return &sh->meta[slot];
}

static void list_unlink(shard_t *sh, uint32_t slot) {
  row_meta_t *m = meta_of(sh, slot);
  if (m->prev)
    sh->meta[m->prev - 1].next = m->next;
  else
    sh->lru_head = m->next;
  if (m->next)
    sh->meta[m->next - 1].prev = m->prev;
  else
    sh->lru_tail = m->prev;
  m->prev = m->next = LIST_NONE;
}

static void list_append(shard_t *sh, uint32_t slot) {
  row_meta_t *m = meta_of(sh, slot);
  m->prev = sh->lru_tail;
  m->next = LIST_NONE;
  if (sh->lru_tail)
    sh->meta[sh->lru_tail - 1].next = slot + 1;
  else
    sh->lru_head = slot + 1;
  sh->lru_tail = slot + 1;
}

static inline int uses_heap(const embps_table_t *t) {
  return t->spec.max_rows && t->spec.evict == EMBPS_EVICT_LFU;
}

/* LFU order: fewer pushes, then older, then smaller id. */
static inline int lfu_less(const shard_t *sh, uint32_t a, uint32_t b) {
  const row_meta_t *x = meta_of(sh, a), *y = meta_of(sh, b);
  if (x->freq != y->freq)
    return x->freq < y->freq;
  if (x->last_step != y->last_step)
    return x->last_step < y->last_step;
  return x->id < y->id;
}

static inline void heap_set(shard_t *sh, uint32_t pos, uint32_t slot) {
  sh->heap[pos] = slot;
  sh->meta[slot].heap = pos;
}

static void heap_up(shard_t *sh, uint32_t pos) {
  uint32_t slot = sh->heap[pos];
  while (pos) {
    uint32_t parent = (pos - 1) / 2;
    if (!lfu_less(sh, slot, sh->heap[parent]))
      break;
    heap_set(sh, pos, sh->heap[parent]);
    pos = parent;
  }
  heap_set(sh, pos, slot);
}

static void heap_down(shard_t *sh, uint32_t pos) {
  uint32_t slot = sh->heap[pos];
  for (;;) {
    uint32_t c = 2 * pos + 1;
    if (c >= sh->heap_n)
      break;
    if (c + 1 < sh->heap_n && lfu_less(sh, sh->heap[c + 1], sh->heap[c]))
      c++;
    if (!lfu_less(sh, sh->heap[c], slot))
      break;
    heap_set(sh, pos, sh->heap[c]);
    pos = c;
  }
  heap_set(sh, pos, slot);
}

static void heap_remove(shard_t *sh, uint32_t slot) {
  uint32_t pos = sh->meta[slot].heap, last = sh->heap[--sh->heap_n];
  if (pos == sh->heap_n)
    return;
  heap_set(sh, pos, last);
  heap_up(sh, pos);
  heap_down(sh, sh->meta[last].heap);
}

static void meta_on_insert(const embps_table_t *t, shard_t *sh, uint32_t slot,
                           int64_t id, uint64_t step) {
  row_meta_t *m = meta_of(sh, slot);
  m->id = id;
  m->last_step = step;
  m->freq = 1;
  list_append(sh, slot);
  if (uses_heap(t)) {
    heap_set(sh, sh->heap_n++, slot);
    heap_up(sh, sh->heap_n - 1);
  }
}

/* A push at `step` of the row in slot (freq 0: start again, as new). */
static void meta_on_push(const embps_table_t *t, shard_t *sh, uint32_t slot,
                         uint64_t step, int restart) {
  row_meta_t *m = meta_of(sh, slot);
  m->last_step = step;
  m->freq = restart ? 1 : m->freq + (m->freq < UINT32_MAX);
  list_unlink(sh, slot);
  list_append(sh, slot);
  if (uses_heap(t)) {
    heap_up(sh, m->heap);
    heap_down(sh, m->heap);
  }
}

/* Whether a row last pushed at last_step has expired at table step `now`
 * (a row pushed after `now`, by a push under way, has not). */
static inline int expired_at(const embps_table_t *t, uint64_t last_step,
                             uint64_t now) {
  return t->spec.ttl_steps && last_step <= now &&
         now - last_step >= t->spec.ttl_steps;
}

/* Evicts the row in slot: out of the list, the heap, the store (onto its
 * free list). Write lock held. */
static void evict_slot_locked(const embps_table_t *t, shard_t *sh,
                              uint32_t slot) {
  row_meta_t *m = meta_of(sh, slot);
  assert(m->freq != 0); /* live */
  /* the store reads the ids of the probe run from meta: denser than rows */
  const uint32_t freed =
      embps_hstore_remove_locked(&sh->hs, m->id, &sh->meta->id, sizeof *m);
  assert(freed == slot);
  (void)freed;
  list_unlink(sh, slot);
  if (uses_heap(t))
    heap_remove(sh, slot);
  m->freq = 0;
}

/* Whether a push admits id, which has no row (or an expired one). */
static int admits(const embps_table_t *t, const shard_t *sh, int64_t id) {
  const embps_table_spec_t *sp = &t->spec;
  if (sp->admit_probability != 0 &&
      !embps_admit_by_hash(sp->seed, id, sp->admit_probability))
    return 0;
  return !t->admit_count ||
         embps_sketch_estimate(&sh->sketch, id) + 1 >= sp->admit_after;
}

/* find_all for a table with a policy: the fate of every position of shard
 * k (s->what, s->slot), judged at table step `now` (before the push). The
 * applying thread, no lock (as find_all). */
static uint32_t find_shard_policy(const embps_table_t *t,
                                  embps_table_scratch_t *s, uint32_t k,
                                  const int64_t *ids, uint64_t now) {
  const shard_t *sh = &t->shards[k];
  uint32_t fresh = 0;
  for (uint32_t p = s->start[k]; p < s->start[k + 1]; p++) {
    const int64_t id = ids[s->order[p]];
    s->rec[p] = NULL;
    s->slot[p] = EMBPS_HSTORE_NONE;
    if (is_padding(t, id)) {
      s->what[p] = W_SKIP;
      continue;
    }
    uint32_t slot = embps_hstore_find_slot(&sh->hs, id);
    if (slot != EMBPS_HSTORE_NONE) {
      s->rec[p] = embps_hstore_rec(&sh->hs, slot);
      s->slot[p] = slot;
      if (s->raw || !t->has_meta ||
          !expired_at(t, sh->meta[slot].last_step, now))
        s->what[p] = W_LIVE;
      else
        s->what[p] = admits(t, sh, id) ? W_RESET : W_DROP;
    } else if (s->raw || s->import || admits(t, sh, id)) {
      s->what[p] = W_NEW;
      fresh++;
    } else {
      s->what[p] = t->admit_count ? W_PENDING : W_REFUSED;
    }
  }
  return fresh;
}

/* Counters of one shard's part of a push, added to the table's after. */
typedef struct {
  uint64_t created, admitted, evicted[3];
  int64_t pending;
} dyn_count_t;

/* Counts a push of id not admitted: the shard's pending ids go up by one
 * for an id the sketch did not know, halve when the sketch ages. */
static void count_pending(shard_t *sh, int64_t id, dyn_count_t *c) {
  const uint64_t adds = sh->sketch.adds;
  if (embps_sketch_add(&sh->sketch, id) == 0)
    c->pending++;
  if (sh->sketch.adds < adds) { /* aged: every count halved */
    int64_t now = (int64_t)sh->cnt[CNT_PENDING] + c->pending;
    c->pending -= (now > 0 ? now : 0) / 2;
  }
}

/* After a push at step `now` to shard sh: reclaims up to `budget` expired
 * rows from the list head, then evicts down to the capacity (never a row
 * pushed at `now`). Write lock held. */
static void shard_evict_after_push(embps_table_t *t, shard_t *sh,
                                   uint64_t now, uint32_t budget,
                                   dyn_count_t *c) {
  while (t->spec.ttl_steps && sh->lru_head && budget--) {
    uint32_t slot = sh->lru_head - 1;
    if (!expired_at(t, sh->meta[slot].last_step, now))
      break;
    evict_slot_locked(t, sh, slot);
    c->evicted[WHY_TTL]++;
  }
  if (!t->cap_shard)
    return;
  uint32_t aside = 0; /* LFU: rows of this push popped, put back after */
  while ((uint64_t)embps_hstore_n_live(&sh->hs) > t->cap_shard) {
    uint32_t slot;
    if (uses_heap(t)) {
      if (!sh->heap_n)
        break;
      slot = sh->heap[0];
      if (sh->meta[slot].last_step == now) {
        heap_remove(sh, slot);
        sh->heap[sh->heap_cap - 1 - aside++] = slot;
        continue;
      }
    } else {
      if (!sh->lru_head)
        break;
      slot = sh->lru_head - 1;
      if (sh->meta[slot].last_step == now)
        break;
    }
    evict_slot_locked(t, sh, slot);
    c->evicted[WHY_CAP]++;
  }
  while (aside) {
    uint32_t slot = sh->heap[sh->heap_cap - aside--];
    heap_set(sh, sh->heap_n++, slot);
    heap_up(sh, sh->heap_n - 1);
  }
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void note_stall(embps_table_t *t, uint64_t ns) {
  uint64_t old = atomic_load(&t->stall_ns);
  while (ns > old && !atomic_compare_exchange_weak(&t->stall_ns, &old, ns))
    ;
}

/* Adds the counters c of a push's (or an eviction's) part in shard sh to
 * the shard's, under its write lock, and to the table's. The shard's
 * pending count stays >= 0; c->pending becomes the change made. */
static void add_counts_locked(embps_table_t *t, shard_t *sh, dyn_count_t *c) {
  uint64_t evicted = c->evicted[0] + c->evicted[1] + c->evicted[2];
  int64_t pending = (int64_t)sh->cnt[CNT_PENDING] + c->pending;
  if (pending < 0)
    pending = 0;
  c->pending = pending - (int64_t)sh->cnt[CNT_PENDING];
  sh->cnt[CNT_PENDING] = (uint64_t)pending;
  sh->cnt[CNT_ADMITTED] += c->admitted;
  sh->cnt[CNT_TTL] += c->evicted[WHY_TTL];
  sh->cnt[CNT_CAP] += c->evicted[WHY_CAP];
  sh->cnt[CNT_L2] += c->evicted[WHY_L2];
  atomic_fetch_add(&t->admitted, c->admitted);
  atomic_fetch_add(&t->pending, (uint64_t)c->pending);
  atomic_fetch_add(&t->ev_ttl, c->evicted[WHY_TTL]);
  atomic_fetch_add(&t->ev_cap, c->evicted[WHY_CAP]);
  atomic_fetch_add(&t->ev_l2, c->evicted[WHY_L2]);
  atomic_fetch_sub(&t->rows_allocated, evicted);
}

/* Squared L2 norm of the stored weights of rec (widened one by one). */
static double rec_norm2(const embps_table_t *t, const unsigned char *rec) {
  const size_t w = embps_dtype_size(t->dtype);
  double sum = 0;
  for (uint32_t j = 0; j < t->dim; j++) {
    float x;
    embps_dtype_to_f32(t->dtype, rec + t->w_off + j * w, &x, 1);
    sum += (double)x * x;
  }
  return sum;
}

#define EVICT_BATCH 4096u /* rows examined per write-lock hold */

void embps_table_evict(embps_table_t *t, double l2_below, uint64_t lsn,
                       const uint64_t *shard_lsn, uint64_t *evicted) {
  *evicted = 0;
  if (!t->has_meta)
    return;
  const uint64_t now = atomic_load(&t->step);
  const double below2 = l2_below * l2_below;
  for (uint32_t k = 0; k < t->n_shards; k++) {
    shard_t *sh = &t->shards[k];
    if (shard_lsn && lsn <= shard_lsn[k])
      continue; /* replay: already in the shard's snapshot */
    uint32_t next = sh->lru_head;
    if (lsn) {
      pthread_rwlock_wrlock(&sh->lock);
      sh->lsn = lsn;
      pthread_rwlock_unlock(&sh->lock);
    }
    while (next) {
      uint64_t t0 = now_ns();
      dyn_count_t c = {0};
      pthread_rwlock_wrlock(&sh->lock);
      for (uint32_t n = 0; next && n < EVICT_BATCH; n++) {
        uint32_t slot = next - 1;
        next = sh->meta[slot].next;
        if (expired_at(t, sh->meta[slot].last_step, now)) {
          evict_slot_locked(t, sh, slot);
          c.evicted[WHY_TTL]++;
        } else if (l2_below > 0 &&
                   rec_norm2(t, embps_hstore_rec(&sh->hs, slot)) < below2) {
          evict_slot_locked(t, sh, slot);
          c.evicted[WHY_L2]++;
        }
      }
      add_counts_locked(t, sh, &c);
      pthread_rwlock_unlock(&sh->lock);
      note_stall(t, now_ns() - t0);
      *evicted += c.evicted[WHY_TTL] + c.evicted[WHY_L2];
    }
  }
}

int embps_table_row_live(embps_table_t *t, int64_t id) {
  if (!t->hashed)
    return array_live(t, id);
  shard_t *sh = &t->shards[embps_route_shard(id, t->n_shards)];
  pthread_rwlock_rdlock(&sh->lock);
  uint32_t slot = embps_hstore_find_slot(&sh->hs, id);
  int live = slot != EMBPS_HSTORE_NONE &&
             !(t->has_meta && expired_at(t, sh->meta[slot].last_step,
                                         atomic_load(&t->visible_step)));
  pthread_rwlock_unlock(&sh->lock);
  return live;
}

/* ------------------------------------------------------------ create */

/* Record layout (table.h): weights after the id (hashed storage), state
 * 4-byte aligned after them, the record padded to 16 bytes. */
static void record_layout(embps_table_t *t) {
  uint32_t k = embps_optim_state_per_weight(t->spec.optimizer);
  t->w_bytes = (uint32_t)embps_dtype_size(t->dtype) * t->dim;
  t->w_off = t->hashed ? ID_BYTES : 0;
  t->state_off = t->w_off + ((t->w_bytes + 3) & ~3u);
  t->row_bytes = (t->state_off + 4 * k * t->dim + 15) & ~15u;
}

uint64_t embps_table_fixed_bytes(const embps_table_spec_t *spec,
                                 uint32_t cluster_size) {
  if (spec->dynamic && spec->admit_after > 1) /* the admission sketch */
    return spec->admit_sketch_bytes ? spec->admit_sketch_bytes
                                    : SKETCH_DEFAULT_BYTES;
  if (spec->dynamic || cluster_size > 1) /* hashed: rows come with use */
    return 0;
  return (spec->rows + 63) / 64 * sizeof(uint64_t); /* the live bitmap */
}

static int create_array(embps_table_t *t) {
  t->rows_len = t->spec.rows * t->row_bytes;
  void *p = mmap(NULL, t->rows_len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return -ENOMEM;
  t->rows = p;
  if (t->rows_len >= HUGE_PAGE_BYTES)
    madvise(p, t->rows_len, MADV_HUGEPAGE);
  t->live_words = (t->spec.rows + 63) / 64;
  t->live = calloc(t->live_words, sizeof *t->live);
  if (!t->live)
    return -ENOMEM;
  add_bytes(t, (int64_t)(t->live_words * sizeof *t->live));
  return 0;
}

/* Sketch bytes of a table on a server: --admit-sketch-bytes (default
 * 1 MiB), which the shards share (admit.h). */
static size_t sketch_bytes(const embps_table_spec_t *spec) {
  return (size_t)(spec->admit_sketch_bytes ? spec->admit_sketch_bytes
                                           : SKETCH_DEFAULT_BYTES);
}

/* Admission and eviction state of a new table (see "admission and
 * eviction" above). 0 or -ENOMEM. */
static int setup_policy(embps_table_t *t, uint32_t cluster_size) {
  const embps_table_spec_t *sp = &t->spec;
  const uint64_t servers = cluster_size > 1 ? cluster_size : 1;
  t->admit_count = sp->admit_after > 1;
  t->has_meta = sp->ttl_steps || sp->max_rows || sp->evict_l2_below > 0;
  t->policy = t->hashed && (t->admit_count || t->has_meta ||
                            sp->admit_probability != 0);
  if (!t->policy) {
    t->admit_count = t->has_meta = 0;
    return 0;
  }
  if (sp->max_rows) {
    t->cap_server = (sp->max_rows + servers - 1) / servers;
    t->cap_shard = (t->cap_server + t->n_shards - 1) / t->n_shards;
  }
  for (uint32_t k = 0; t->admit_count && k < t->n_shards; k++) {
    if (embps_sketch_init(&t->shards[k].sketch, sketch_bytes(sp), sp->seed,
                          k, t->n_shards))
      return -ENOMEM;
    add_bytes(t, (int64_t)embps_sketch_bytes(&t->shards[k].sketch));
  }
  return 0;
}

int embps_table_create(const embps_table_spec_t *spec, uint32_t n_shards,
                       uint32_t cluster_size, embps_table_t **out) {
  embps_table_t *t = calloc(1, sizeof *t);
  if (!t)
    return -ENOMEM;
  pthread_mutex_init(&t->spec_mu, NULL);
  t->spec = *spec;
  embps_optim_from_spec(&t->optim, spec);
  t->n_shards = n_shards ? n_shards : 1;
  t->dim = spec->dim;
  t->dtype = spec->dtype;
  t->hashed = spec->dynamic || cluster_size > 1;
  record_layout(t);
  atomic_init(&t->refs, 1);
  t->shards = calloc(t->n_shards, sizeof *t->shards);
  if (!t->shards)
    goto fail;
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  pthread_rwlockattr_setkind_np(&attr,
                                PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  for (uint32_t k = 0; k < t->n_shards; k++)
    pthread_rwlock_init(&t->shards[k].lock, &attr);
  pthread_rwlockattr_destroy(&attr);
  for (uint32_t k = 0; t->hashed && k < t->n_shards; k++)
    embps_hstore_init(&t->shards[k].hs, t->row_bytes);
  if (!t->hashed && create_array(t))
    goto fail;
  if (setup_policy(t, cluster_size))
    goto fail;
  *out = t;
  return 0;
fail:
  embps_table_destroy(t);
  return -ENOMEM;
}

void embps_table_destroy(embps_table_t *t) {
  if (!t)
    return;
  if (t->shards) {
    for (uint32_t k = 0; k < t->n_shards; k++) {
      shard_t *sh = &t->shards[k];
      embps_hstore_close(&sh->hs);
      free(sh->meta);
      free(sh->heap);
      embps_sketch_free(&sh->sketch);
      pthread_rwlock_destroy(&sh->lock);
    }
    free(t->shards);
  }
  if (t->rows)
    munmap(t->rows, t->rows_len);
  free(t->live);
  atomic_fetch_sub(&total_bytes, atomic_load(&t->bytes));
  pthread_mutex_destroy(&t->spec_mu);
  free(t);
}

void embps_table_ref(embps_table_t *t) { atomic_fetch_add(&t->refs, 1); }

void embps_table_unref(embps_table_t *t) {
  if (t && atomic_fetch_sub(&t->refs, 1) == 1)
    embps_table_destroy(t);
}

const embps_table_spec_t *embps_table_spec(const embps_table_t *t) {
  return &t->spec;
}

size_t embps_table_row_bytes(const embps_table_t *t) { return t->row_bytes; }

void embps_table_alter(embps_table_t *t, const embps_table_spec_t *spec) {
  pthread_mutex_lock(&t->spec_mu);
  t->spec.lr = spec->lr;
  t->spec.eps = spec->eps;
  t->spec.beta1 = spec->beta1;
  t->spec.beta2 = spec->beta2;
  t->spec.l1 = spec->l1;
  t->spec.l2 = spec->l2;
  t->spec.lr_power = spec->lr_power;
  t->spec.weight_decay = spec->weight_decay;
  pthread_mutex_unlock(&t->spec_mu);
  embps_optim_from_spec(&t->optim, &t->spec); /* read by commit: same thread */
}

void embps_table_info(embps_table_t *t, embps_table_info_t *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&t->spec_mu);
  out->spec = t->spec;
  pthread_mutex_unlock(&t->spec_mu);
  out->rows_allocated = atomic_load(&t->rows_allocated);
  out->bytes_used = atomic_load(&t->bytes);
  out->pushes = atomic_load(&t->pushes);
  out->pulls = atomic_load(&t->pulls);
  out->step = atomic_load(&t->step);
  out->rows_admitted = atomic_load(&t->admitted);
  out->rows_pending = atomic_load(&t->pending);
  out->evicted_ttl = atomic_load(&t->ev_ttl);
  out->evicted_capacity = atomic_load(&t->ev_cap);
  out->evicted_l2 = atomic_load(&t->ev_l2);
  out->capacity = t->cap_server;
  out->evict_stall_max_us = (atomic_load(&t->stall_ns) + 999) / 1000;
}

/* ------------------------------------------------------------ lookups */

int embps_table_check_ids(const embps_table_t *t, const int64_t *ids,
                          size_t n, uint32_t cluster_size,
                          uint32_t cluster_index, size_t *bad) {
  if (!t->spec.dynamic) {
    uint64_t rows = t->spec.rows;
    for (size_t i = 0; i < n; i++) {
      if ((uint64_t)ids[i] >= rows) { /* negative ids wrap to huge */
        *bad = i;
        return EMBPS_ERANGE;
      }
    }
  }
  if (cluster_size > 1) {
    for (size_t i = 0; i < n; i++) {
      if (embps_route(ids[i], cluster_size) != cluster_index &&
          !is_padding(t, ids[i])) {
        *bad = i;
        return EMBPS_EWRONGSERVER;
      }
    }
  }
  return 0;
}

/* The stored record of id in shard sh, or NULL if never pushed (or
 * expired at step `now`). sh's read lock held, or the applying thread. */
static inline unsigned char *find_rec(const embps_table_t *t,
                                      const shard_t *sh, int64_t id,
                                      uint64_t now) {
  if (!t->hashed)
    return array_live(t, id) ? array_rec(t, id) : NULL;
  if (!t->spec.ttl_steps)
    return embps_hstore_find(&sh->hs, id);
  uint32_t slot = embps_hstore_find_slot(&sh->hs, id);
  if (slot == EMBPS_HSTORE_NONE || expired_at(t, sh->meta[slot].last_step, now))
    return NULL;
  return embps_hstore_rec(&sh->hs, slot);
}

/* The prefetch helpers must be inlined early: gcc 12 otherwise finds them
 * free of side effects (a prefetch writes nothing) and deletes the calls. */
#define PREFETCH_HELPER static inline __attribute__((always_inline)) void

/* Starts loading the first `bytes` of rec, at most PREFETCH_MAX (the
 * hardware prefetcher takes longer rows from there). */
PREFETCH_HELPER prefetch_rec(const unsigned char *rec, uint32_t bytes) {
  if (bytes > PREFETCH_MAX)
    bytes = PREFETCH_MAX;
  for (uint32_t off = 0; off < bytes; off += 64)
    __builtin_prefetch(rec + off);
}

/* Prefetching for a loop over ids in request order: the record of `near`
 * (array storage: its address; hashed: through its home map entry, when
 * that entry is near's, which the prefetch of `far`'s entry a loop earlier
 * makes likely to be in cache). Every row in flight keeps the memory busy
 * while this one is converted. Read locks held (gather). */
PREFETCH_HELPER prefetch_ids(const embps_table_t *t, int64_t near,
                             const int64_t *far, uint32_t bytes) {
  if (!t->hashed) {
    prefetch_rec(array_rec(t, near), bytes);
    return;
  }
  if (far)
    embps_hstore_prefetch_home(
        &t->shards[embps_route_shard(*far, t->n_shards)].hs, *far);
  const unsigned char *rec = embps_hstore_home_guess(
      &t->shards[embps_route_shard(near, t->n_shards)].hs, near);
  if (rec)
    prefetch_rec(rec, bytes);
}

/* Prefetching for apply: the record at order position p, known from
 * find_all (hashed storage) or from its id (array), weights and state. */
PREFETCH_HELPER prefetch_known(const embps_table_t *t,
                               const embps_table_scratch_t *s,
                               const int64_t *ids, uint32_t p) {
  const unsigned char *rec =
      t->hashed ? s->rec[p] : array_rec(t, ids[s->order[p]]);
  if (rec)
    prefetch_rec(rec, t->row_bytes);
}

/* Reads the ids in request order, so `out` is written front to back (the
 * rows' loads get the memory's parallelism, not scattered stores), with
 * every shard's read lock held for the whole gather: each row is read
 * whole between two pushes. A push to a shard waits for the pulls holding
 * its lock (they read concurrently: about one pull's length), and pulls
 * that come meanwhile wait for the push. */
void embps_table_gather(embps_table_t *t, const int64_t *ids, size_t n,
                        float *out) {
  const uint32_t dim = t->dim, bytes = t->w_off + t->w_bytes;
  for (uint32_t k = 0; k < t->n_shards; k++)
    pthread_rwlock_rdlock(&t->shards[k].lock);
  const uint64_t now = atomic_load(&t->visible_step);
  for (size_t i = 0; i < n; i++) {
    if (i + PREFETCH_AHEAD < n)
      prefetch_ids(t, ids[i + PREFETCH_AHEAD],
                   i + 2 * PREFETCH_AHEAD < n ? &ids[i + 2 * PREFETCH_AHEAD]
                                              : NULL,
                   bytes);
    float *dst = out + i * dim;
    const int64_t id = ids[i];
    const unsigned char *rec;
    if (is_padding(t, id))
      memset(dst, 0, dim * sizeof *dst);
    else if ((rec = find_rec(t, &t->shards[embps_route_shard(id, t->n_shards)],
                             id, now)))
      read_weights(t, rec, dst);
    else
      initial_weights(t, id, dst);
  }
  for (uint32_t k = t->n_shards; k > 0; k--)
    pthread_rwlock_unlock(&t->shards[k - 1].lock);
  atomic_fetch_add(&t->pulls, 1);
}

/* ------------------------------------------------------------ apply */

/* Array storage: under a memory limit, refuses a push whose new rows
 * would pass it. */
static int reserve_array(const embps_table_t *t, const int64_t *ids,
                         size_t n, uint64_t max_bytes) {
  if (!max_bytes)
    return 0;
  uint64_t fresh = 0;
  for (size_t i = 0; i < n; i++)
    fresh += !is_padding(t, ids[i]) && !array_live(t, ids[i]);
  if (fresh && embps_tables_total_bytes() + fresh * t->row_bytes > max_bytes)
    return EMBPS_ELIMIT;
  return 0;
}

/* Hashed storage: s->rec[p] = the record of the id at order position p
 * (NULL: new or padding), s->fresh[k] = new rows of shard k. No lock: the
 * applying thread is the only writer. */
static void find_all(const embps_table_t *t, embps_table_scratch_t *s,
                     const int64_t *ids, size_t n) {
  const uint32_t S = t->n_shards;
  const uint64_t now = atomic_load(&t->step);
#pragma omp parallel for schedule(dynamic, 1) \
    if (n >= PARALLEL_MIN_ROWS && S > 1)
  for (uint32_t k = 0; k < S; k++) {
    if (t->policy) {
      s->fresh[k] = find_shard_policy(t, s, k, ids, now);
      continue;
    }
    const shard_t *sh = &t->shards[k];
    uint32_t fresh = 0;
    for (uint32_t p = s->start[k]; p < s->start[k + 1]; p++) {
      int64_t id = ids[s->order[p]];
      unsigned char *rec = is_padding(t, id) ? NULL : embps_hstore_find(&sh->hs, id);
      s->rec[p] = rec;
      fresh += !rec && !is_padding(t, id);
    }
    s->fresh[k] = fresh;
  }
}

/* Hashed storage: finds every id's record, then makes room for exactly
 * the new rows in every shard, after checking that all of it fits under
 * max_bytes (0: no limit). Returns 0, EMBPS_ELIMIT or -ENOMEM; the rows are
 * unchanged whatever happens (a failure may leave shards with more room). */
static int reserve_hashed(embps_table_t *t, embps_table_scratch_t *s,
                          const int64_t *ids, size_t n, uint64_t max_bytes) {
  find_all(t, s, ids, n);
  uint64_t extra = 0;
  for (uint32_t k = 0; k < t->n_shards; k++) {
    const shard_t *sh = &t->shards[k];
    uint64_t rows =
        (uint64_t)sh->hs.n_slots + embps_hstore_new_slots(&sh->hs, s->fresh[k]);
    if (rows > EMBPS_HSTORE_MAX_SLOTS)
      return EMBPS_ELIMIT;
    if (s->fresh[k])
      extra += growth_bytes(t, sh, (uint32_t)rows);
  }
  if (max_bytes && extra && embps_tables_total_bytes() + extra > max_bytes)
    return EMBPS_ELIMIT;
  for (uint32_t k = 0; k < t->n_shards; k++) {
    shard_t *sh = &t->shards[k];
    uint32_t rows =
        sh->hs.n_slots + embps_hstore_new_slots(&sh->hs, s->fresh[k]);
    if (!s->fresh[k])
      continue;
    int64_t added;
    int rc = embps_hstore_reserve(&sh->hs, rows, &sh->lock, &added);
    add_bytes(t, added);
    if (!rc)
      rc = grow_meta(t, sh, rows);
    if (rc)
      return rc;
  }
  return 0;
}

/* Applies the rows of shard k (its order positions), materialising the new
 * ones. Write lock held; room reserved. Returns the rows materialised. */
static uint64_t apply_shard(embps_table_t *t, const embps_table_scratch_t *s,
                            uint32_t k, const int64_t *ids, const float *g) {
  shard_t *sh = &t->shards[k];
  float *wide = thread_wide(t, s);
  uint64_t created = 0;
  const uint32_t b = s->start[k + 1];
  for (uint32_t p = s->start[k]; p < b; p++) {
    uint32_t i = s->order[p];
    int64_t id = ids[i];
    if (p + PREFETCH_AHEAD < b)
      prefetch_known(t, s, ids, p + PREFETCH_AHEAD);
    if (is_padding(t, id))
      continue;
    unsigned char *rec;
    if (!t->hashed)
      rec = array_materialise(t, id, wide, &created);
    else if (!(rec = s->rec[p])) {
      rec = hashed_insert_locked(t, sh, id, wide, 0);
      created++;
    }
    apply_record(t, rec, g + (size_t)i * t->dim, wide);
  }
  return created;
}

/* apply_shard for a table with a policy, the push being table step `now`:
 * each position's fate (find_shard_policy), then the reclaiming and
 * eviction it calls for, timed as the shard's eviction stall. Write lock
 * held; room reserved. */
static void apply_shard_policy(embps_table_t *t, const embps_table_scratch_t *s,
                               uint32_t k, const int64_t *ids, const float *g,
                               uint64_t now, dyn_count_t *c) {
  shard_t *sh = &t->shards[k];
  float *wide = thread_wide(t, s);
  const uint32_t b = s->start[k + 1];
  for (uint32_t p = s->start[k]; p < b; p++) {
    const uint32_t i = s->order[p];
    const int64_t id = ids[i];
    unsigned char *rec = s->rec[p];
    if (p + PREFETCH_AHEAD < b) {
      const uint32_t ahead = s->slot[p + PREFETCH_AHEAD];
      prefetch_known(t, s, ids, p + PREFETCH_AHEAD);
      if (t->has_meta && ahead != EMBPS_HSTORE_NONE)
        __builtin_prefetch(&sh->meta[ahead]);
    }
    switch (s->what[p]) {
    case W_LIVE:
      if (t->has_meta)
        meta_on_push(t, sh, s->slot[p], now, 0);
      break;
    case W_NEW:
      rec = hashed_insert_locked(t, sh, id, wide, now);
      c->created++;
      c->admitted++;
      c->pending -= t->admit_count;
      break;
    case W_RESET:
      init_record(t, id, rec, wide);
      meta_on_push(t, sh, s->slot[p], now, 1);
      c->evicted[WHY_TTL]++;
      c->created++;
      c->admitted++;
      break;
    case W_DROP:
      evict_slot_locked(t, sh, s->slot[p]);
      c->evicted[WHY_TTL]++;
      rec = NULL;
      if (t->admit_count)
        count_pending(sh, id, c);
      break;
    case W_PENDING:
      count_pending(sh, id, c);
      rec = NULL;
      break;
    default:
      rec = NULL;
      break;
    }
    if (rec)
      apply_record(t, rec, g + (size_t)i * t->dim, wide);
  }
  if (t->has_meta) {
    const uint64_t t0 = now_ns();
    const uint64_t evicted = c->evicted[WHY_TTL] + c->evicted[WHY_CAP];
    shard_evict_after_push(t, sh, now, SWEEP_MIN + 2 * (b - s->start[k]), c);
    if (c->evicted[WHY_TTL] + c->evicted[WHY_CAP] != evicted)
      note_stall(t, now_ns() - t0);
  }
}

int embps_table_prepare(embps_table_t *t, embps_table_scratch_t *s,
                        const int64_t *ids, size_t n, uint64_t max_bytes) {
  int rc = group_by_shard(t, s, ids, n);
  if (!rc)
    rc = scratch_reserve_apply(t, s);
  if (!rc)
    rc = t->hashed ? reserve_hashed(t, s, ids, n, max_bytes)
                   : reserve_array(t, ids, n, max_bytes);
  return rc;
}

/* embps_table_commit for a table with a policy, the push being step
 * t_step: shards in parallel as usual, each with its own counters. */
static void commit_policy(embps_table_t *t, embps_table_scratch_t *s,
                          const int64_t *ids, const float *g, size_t n,
                          uint64_t lsn, uint64_t t_step) {
  const uint32_t S = t->n_shards;
#pragma omp parallel for schedule(dynamic, 1) \
    if (n >= PARALLEL_MIN_ROWS && S > 1)
  for (uint32_t k = 0; k < S; k++) {
    if (s->start[k] == s->start[k + 1])
      continue;
    shard_t *sh = &t->shards[k];
    dyn_count_t c = {0};
    pthread_rwlock_wrlock(&sh->lock);
    apply_shard_policy(t, s, k, ids, g, t_step, &c);
    add_counts_locked(t, sh, &c);
    if (lsn)
      sh->lsn = lsn;
    pthread_rwlock_unlock(&sh->lock);
    atomic_fetch_add(&t->rows_allocated, c.created);
  }
  atomic_store(&t->visible_step, t_step);
  atomic_fetch_add(&t->pushes, 1);
}

void embps_table_commit(embps_table_t *t, embps_table_scratch_t *s,
                        const int64_t *ids, const float *g, size_t n,
                        uint64_t lsn) {
  const uint32_t S = t->n_shards;
  uint64_t t_step = atomic_fetch_add(&t->step, 1) + 1;
  embps_optim_begin_step(&t->optim, t_step);
  uint64_t created_total = 0;
  if (t->policy) {
    commit_policy(t, s, ids, g, n, lsn, t_step);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : created_total) \
    if (n >= PARALLEL_MIN_ROWS && S > 1)
  for (uint32_t k = 0; k < S; k++) {
    if (s->start[k] == s->start[k + 1])
      continue;
    shard_t *sh = &t->shards[k];
    pthread_rwlock_wrlock(&sh->lock);
    created_total += apply_shard(t, s, k, ids, g);
    if (lsn)
      sh->lsn = lsn;
    pthread_rwlock_unlock(&sh->lock);
  }
  atomic_fetch_add(&t->rows_allocated, created_total);
  if (!t->hashed)
    add_bytes(t, (int64_t)(created_total * t->row_bytes));
  atomic_fetch_add(&t->pushes, 1);
}

int embps_table_apply(embps_table_t *t, embps_table_scratch_t *s,
                      const int64_t *ids, const float *g, size_t n,
                      uint64_t max_bytes) {
  int rc = embps_table_prepare(t, s, ids, n, max_bytes);
  if (!rc)
    embps_table_commit(t, s, ids, g, n, 0);
  return rc;
}

void embps_table_set_step(embps_table_t *t, uint64_t step) {
  atomic_store(&t->step, step);
  atomic_store(&t->visible_step, step);
}

uint64_t embps_table_incarnation(const embps_table_t *t) {
  return t->incarnation;
}

void embps_table_set_incarnation(embps_table_t *t, uint64_t incarnation) {
  t->incarnation = incarnation;
}

uint32_t embps_table_n_shards(const embps_table_t *t) { return t->n_shards; }

/* ------------------------------------------------------------ snapshots */

/* Bytes of the stored weights and state, pad between them included: the
 * part of a record after the id, the same in both storages. */
static size_t body_bytes(const embps_table_t *t) {
  return t->state_off - t->w_off +
         4u * embps_optim_state_per_weight(t->spec.optimizer) * t->dim;
}

size_t embps_table_file_record_bytes(const embps_table_t *t) {
  return (ID_BYTES + body_bytes(t) + 15) & ~(size_t)15;
}

/* Writes the file record of id from the memory record rec into out. */
static void to_file_record(const embps_table_t *t, int64_t id,
                           const unsigned char *rec, unsigned char *out) {
  const size_t fr = embps_table_file_record_bytes(t);
  const size_t state = body_bytes(t) - (t->state_off - t->w_off);
  const size_t state_at = ID_BYTES + (t->state_off - t->w_off);
  memcpy(out, &id, sizeof id);
  memcpy(out + ID_BYTES, rec + t->w_off, t->w_bytes);
  memset(out + ID_BYTES + t->w_bytes, 0, state_at - ID_BYTES - t->w_bytes);
  memcpy(out + state_at, rec + t->state_off, state);
  memset(out + state_at + state, 0, fr - state_at - state); /* padding */
}

/* Grows a snapshot buffer to hold `want` file records. 0 or -ENOMEM. */
static int snap_reserve(const embps_table_t *t, unsigned char **buf,
                        size_t *cap, size_t want) {
  unsigned char *v = realloc(*buf, want * embps_table_file_record_bytes(t));
  if (!v)
    return -ENOMEM;
  *buf = v;
  *cap = want;
  return 0;
}

/* Called for each row a shard walk visits; non-zero stops the walk. */
typedef int (*visit_fn)(void *ctx, const embps_table_t *t, int64_t id,
                        const unsigned char *rec);

/* Visits the rows of shard k in storage order from position *pos (hashed:
 * slot; array: id), at most max_rows rows and, for array storage, at most
 * max_words words of the row bitmap. The shard's read lock is held.
 * *pos = the position to go on from. Returns 1 when the shard has no row
 * left, 0 when a bound was reached, or visit's non-zero result. */
static int visit_shard_locked(const embps_table_t *t, uint32_t k,
                              uint64_t *pos, size_t max_rows,
                              size_t max_words, visit_fn visit, void *ctx) {
  size_t seen = 0;
  if (t->hashed) {
    const shard_t *sh = &t->shards[k];
    const uint64_t now = atomic_load(&t->visible_step);
    for (; *pos < sh->hs.n_slots; (*pos)++) {
      if (!slot_live(t, sh, (uint32_t)*pos) ||
          (t->has_meta && expired_at(t, sh->meta[*pos].last_step, now)))
        continue; /* evicted or expired (issue 12) */
      if (seen++ == max_rows)
        return 0;
      const unsigned char *rec = embps_hstore_rec(&sh->hs, (uint32_t)*pos);
      int rc = visit(ctx, t, embps_hstore_rec_id(rec), rec);
      if (rc)
        return rc;
    }
    return 1;
  }
  for (uint64_t w = *pos >> 6; w < t->live_words; w++) {
    if (max_words-- == 0) {
      *pos = w << 6;
      return 0;
    }
    uint64_t bits = atomic_load_explicit(&t->live[w], memory_order_relaxed);
    if (w == *pos >> 6)
      bits &= ~0ULL << (*pos & 63);
    while (bits) {
      int64_t id = (int64_t)(w * 64 + (uint64_t)__builtin_ctzll(bits));
      bits &= bits - 1;
      if (embps_route_shard(id, t->n_shards) != k)
        continue;
      if (seen++ == max_rows) {
        *pos = (uint64_t)id;
        return 0;
      }
      int rc = visit(ctx, t, id, array_rec(t, id));
      if (rc)
        return rc;
    }
  }
  *pos = (uint64_t)t->live_words << 6;
  return 1;
}

typedef struct {
  unsigned char *buf;
  size_t n, cap;
} snap_t;

/* visit_fn: appends one file record to a growing buffer (-ENOMEM). */
static int snap_push(void *ctx, const embps_table_t *t, int64_t id,
                     const unsigned char *rec) {
  snap_t *b = ctx;
  const size_t fr = embps_table_file_record_bytes(t);
  if (b->n == b->cap && snap_reserve(t, &b->buf, &b->cap, 2 * b->cap + 1024))
    return -ENOMEM;
  to_file_record(t, id, rec, b->buf + b->n * fr);
  b->n++;
  return 0;
}

/* Shard state of a checkpoint (table.h), format 3: header {u32 rows
 * with meta, u32 sketch width (0: none), u64 sketch adds, u32 sketch groups
 * G (0: legacy layout), u32 first group held, u64 0, u64 counters
 * admitted, pending, evicted by ttl, capacity, l2 (the shard's), u64 the
 * table's longest eviction stall in ns}, rows x {u64 last step, u32
 * pushes, u32 0} in the order of the records, depth x width u16 counters.
 * Format 2 had only the first 16 bytes of the header. */
#define STATE_HEAD_V2 16u
#define STATE_HEAD 80u
#define STATE_ROW 16u

typedef struct {
  uint32_t rows, width, groups, g0;
  uint64_t adds, cnt[N_CNT], stall_ns;
  size_t head; /* bytes of the header */
} state_hdr_t;

/* Read lock held; *out malloc'd (NULL, 0 for tables without a policy).
 * 0 or -ENOMEM. */
static int snap_state(const embps_table_t *t, const shard_t *sh,
                      unsigned char **out, size_t *bytes) {
  *out = NULL;
  *bytes = 0;
  if (!t->policy)
    return 0;
  const uint32_t rows = t->has_meta ? embps_hstore_n_live(&sh->hs) : 0;
  const uint32_t width = t->admit_count ? sh->sketch.width : 0;
  const size_t counters = (size_t)width * EMBPS_SKETCH_DEPTH;
  const size_t len = STATE_HEAD + (size_t)rows * STATE_ROW + counters * 2;
  unsigned char *b = calloc(1, len), *p = b + STATE_HEAD;
  if (!b)
    return -ENOMEM;
  const uint64_t stall = atomic_load(&t->stall_ns);
  memcpy(b, &rows, 4);
  memcpy(b + 4, &width, 4);
  if (width) {
    memcpy(b + 8, &sh->sketch.adds, 8);
    memcpy(b + 16, &sh->sketch.groups, 4);
    memcpy(b + 20, &sh->sketch.g0, 4);
  }
  memcpy(b + 32, sh->cnt, sizeof sh->cnt);
  memcpy(b + 32 + sizeof sh->cnt, &stall, 8);
  for (uint32_t next = t->has_meta ? sh->lru_head : 0; next;
       next = sh->meta[next - 1].next, p += STATE_ROW) {
    memcpy(p, &sh->meta[next - 1].last_step, 8);
    memcpy(p + 8, &sh->meta[next - 1].freq, 4);
  }
  if (width)
    memcpy(p, sh->sketch.c, counters * 2);
  *out = b;
  *bytes = len;
  return 0;
}

int embps_table_snapshot_shard_state(embps_table_t *t, uint32_t k,
                                     unsigned char **buf, size_t *cap,
                                     size_t *rows, uint64_t *lsn,
                                     unsigned char **state,
                                     size_t *state_bytes, uint64_t *held_ns) {
  shard_t *sh = &t->shards[k];
  /* sized before the lock from the row count (dense: the shard's share,
   * plus slack), so the copy under the lock rarely grows the buffer */
  size_t want = t->hashed ? 0 : atomic_load(&t->rows_allocated) / t->n_shards;
  want += want / 8 + 1024;
  if (want > *cap) {
    const size_t fr = embps_table_file_record_bytes(t), had = *cap * fr;
    if (snap_reserve(t, buf, cap, want))
      return -ENOMEM;
    /* fault the new pages in now, not during the copy under the lock */
    for (size_t i = had; i < want * fr; i += 4096)
      (*buf)[i] = 0;
  }
  snap_t b = {*buf, 0, *cap};
  uint64_t pos = 0;
  pthread_rwlock_rdlock(&sh->lock);
  const uint64_t t0 = now_ns();
  int rc = t->hashed && sh->hs.n_slots > b.cap
               ? snap_reserve(t, &b.buf, &b.cap, sh->hs.n_slots)
               : 0;
  if (!rc && state)
    rc = snap_state(t, sh, state, state_bytes);
  if (!rc && t->has_meta) /* live rows, least recently pushed first */
    for (uint32_t next = sh->lru_head; !rc && next;
         next = sh->meta[next - 1].next)
      rc = snap_push(&b, t, sh->meta[next - 1].id, embps_hstore_rec(&sh->hs, next - 1));
  else if (!rc)
    rc = visit_shard_locked(t, k, &pos, SIZE_MAX, SIZE_MAX, snap_push, &b);
  *lsn = sh->lsn;
  *held_ns = now_ns() - t0;
  pthread_rwlock_unlock(&sh->lock);
  if (rc < 0 && state) {
    free(*state);
    *state = NULL;
  }
  *buf = b.buf;
  *cap = b.cap;
  *rows = b.n;
  return rc < 0 ? rc : 0;
}

/* ------------------------------------------------------------ export */

#define CURSOR_SHARD_SHIFT 48
#define SCAN_MAX_WORDS (1u << 16) /* bitmap words one scan may examine */

typedef struct {
  int64_t *ids;
  float *w, *state; /* state NULL: not wanted */
  size_t n;
} scan_out_t;

/* visit_fn: the row widened into the scan's arrays. */
static int scan_put(void *ctx, const embps_table_t *t, int64_t id,
                    const unsigned char *rec) {
  scan_out_t *o = ctx;
  const size_t dim = t->dim;
  const size_t sf = embps_optim_state_per_weight(t->spec.optimizer) * dim;
  o->ids[o->n] = id;
  read_weights(t, rec, o->w + o->n * dim);
  if (o->state && sf)
    memcpy(o->state + o->n * sf, rec + t->state_off, sf * sizeof(float));
  o->n++;
  return 0;
}

int embps_table_scan(embps_table_t *t, uint64_t *cursor, size_t max_rows,
                     int64_t *ids, float *w, float *state, size_t *n,
                     int *done) {
  uint64_t k = *cursor >> CURSOR_SHARD_SHIFT;
  uint64_t pos = *cursor & ((1ULL << CURSOR_SHARD_SHIFT) - 1);
  scan_out_t o = {ids, w, state, 0};
  size_t words = SCAN_MAX_WORDS;
  if (k > t->n_shards)
    return EMBPS_EINVAL;
  while (k < t->n_shards && o.n < max_rows && words) {
    shard_t *sh = &t->shards[k];
    uint64_t from = pos;
    pthread_rwlock_rdlock(&sh->lock);
    int end = visit_shard_locked(t, (uint32_t)k, &pos, max_rows - o.n, words,
                                 scan_put, &o);
    pthread_rwlock_unlock(&sh->lock);
    if (!t->hashed) { /* charge the bitmap words examined */
      uint64_t used = (pos >> 6) - (from >> 6);
      words = used >= words ? 0 : words - (size_t)used;
    }
    if (!end)
      break;
    k++;
    pos = 0;
  }
  *cursor = k << CURSOR_SHARD_SHIFT | pos;
  *n = o.n;
  *done = k >= t->n_shards;
  return 0;
}

/* ------------------------------------------------------------ import */

/* Writes row i of a batch into rec (a row of the table, maybe new). */
typedef void (*fill_fn)(const void *ctx, const embps_table_t *t,
                        unsigned char *rec, size_t i, float *wide);

/* Writes n distinct, checked, prepared rows (embps_table_prepare with s,
 * ids and n, with s->import or s->raw set: room made for every row not
 * stored) with fill, shard by shard under the write lock, materialising
 * the new ones without an initial value, shards in parallel (OpenMP) when
 * the rows are many. Padding ids are skipped. lsn != 0 becomes the log
 * position of every shard written. Tables with eviction: every row written
 * counts as pushed at step `now` (an expired one as new). */
static void place_rows(embps_table_t *t, embps_table_scratch_t *s,
                       const int64_t *ids, uint64_t lsn, uint64_t now,
                       fill_fn fill, const void *ctx) {
  uint64_t created = 0;
  const uint32_t S = t->n_shards;
  const size_t n = s->start[S];
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : created) \
    if (n * t->row_bytes >= PARALLEL_MIN_BYTES && S > 1)
  for (uint32_t k = 0; k < S; k++) {
    if (s->start[k] == s->start[k + 1])
      continue;
    float *wide = thread_wide(t, s);
    shard_t *sh = &t->shards[k];
    pthread_rwlock_wrlock(&sh->lock);
    for (uint32_t p = s->start[k]; p < s->start[k + 1]; p++) {
      const uint32_t i = s->order[p];
      unsigned char *rec;
      if (is_padding(t, ids[i]))
        continue;
      if (!t->hashed)
        rec = array_materialise(t, ids[i], RAW_ROW, &created);
      else if (!(rec = s->rec[p])) {
        rec = hashed_insert_locked(t, sh, ids[i], RAW_ROW, now);
        created++;
      } else if (t->has_meta) {
        meta_on_push(t, sh, s->slot[p], now,
                     s->what[p] == W_RESET || s->what[p] == W_DROP);
      }
      fill(ctx, t, rec, i, wide);
    }
    if (lsn)
      sh->lsn = lsn;
    pthread_rwlock_unlock(&sh->lock);
  }
  atomic_fetch_add(&t->rows_allocated, created);
  if (!t->hashed)
    add_bytes(t, (int64_t)(created * t->row_bytes));
}

typedef struct {
  const float *w, *state;
} rows_src_t;

/* fill_fn: weights rounded to the storage type, state given or initial. */
static void fill_rows(const void *ctx, const embps_table_t *t,
                      unsigned char *rec, size_t i, float *wide) {
  const rows_src_t *src = ctx;
  const size_t dim = t->dim;
  const size_t sf = embps_optim_state_per_weight(t->spec.optimizer) * dim;
  const float *w = src->w + i * dim;
  if (t->dtype == EMBPS_DTYPE_F32) {
    memcpy(rec + t->w_off, w, dim * sizeof *w);
  } else {
    memcpy(wide, w, dim * sizeof *w);
    embps_dtype_from_f32(t->dtype, wide, rec + t->w_off, t->dim);
  }
  float *state = (float *)(rec + t->state_off);
  if (src->state)
    memcpy(state, src->state + i * sf, sf * sizeof *state);
  else
    embps_optim_init_state(&t->optim, state, t->dim);
}

int embps_table_prepare_rows(embps_table_t *t, embps_table_scratch_t *s,
                             const int64_t *ids, size_t n,
                             uint64_t max_bytes) {
  s->import = 1;
  int rc = embps_table_prepare(t, s, ids, n, max_bytes);
  s->import = 0;
  return rc;
}

void embps_table_write_rows(embps_table_t *t, embps_table_scratch_t *s,
                            const int64_t *ids, const float *w,
                            const float *state, uint64_t lsn,
                            const uint64_t *step) {
  rows_src_t src = {w, state};
  if (step)
    embps_table_set_step(t, *step);
  place_rows(t, s, ids, lsn, atomic_load(&t->step), fill_rows, &src);
}

typedef struct {
  const unsigned char *recs;
  size_t fr, body;
} recs_src_t;

/* fill_fn: the body of a file record, as it is. */
static void fill_record(const void *ctx, const embps_table_t *t,
                        unsigned char *rec, size_t i, float *wide) {
  const recs_src_t *src = ctx;
  (void)wide;
  memcpy(rec + t->w_off, src->recs + i * src->fr + ID_BYTES, src->body);
}

int embps_table_restore(embps_table_t *t, embps_table_scratch_t *s,
                        const unsigned char *recs, size_t n, int64_t *ids) {
  const recs_src_t src = {recs, embps_table_file_record_bytes(t),
                          body_bytes(t)};
  for (size_t i = 0; i < n; i++)
    memcpy(&ids[i], recs + i * src.fr, sizeof *ids);
  size_t bad;
  if (embps_table_check_ids(t, ids, n, 1, 0, &bad))
    return EMBPS_ERANGE;
  s->raw = 1; /* rows as they were: no admission, no expiry */
  int rc = embps_table_prepare(t, s, ids, n, 0);
  s->raw = 0;
  if (rc)
    return rc;
  place_rows(t, s, ids, 0, atomic_load(&t->step), fill_record, &src);
  return 0;
}

/* Reads the header of a shard state of file format `format` (2 or 3);
 * 0 if its size does not match it. */
static int state_parse(const unsigned char *state, size_t bytes,
                       uint32_t format, state_hdr_t *h) {
  memset(h, 0, sizeof *h);
  h->head = format >= 3 ? STATE_HEAD : STATE_HEAD_V2;
  if (bytes < h->head)
    return 0;
  memcpy(&h->rows, state, 4);
  memcpy(&h->width, state + 4, 4);
  memcpy(&h->adds, state + 8, 8);
  if (format >= 3) {
    memcpy(&h->groups, state + 16, 4);
    memcpy(&h->g0, state + 20, 4);
    memcpy(h->cnt, state + 32, sizeof h->cnt);
    memcpy(&h->stall_ns, state + 32 + sizeof h->cnt, 8);
  }
  if (h->groups && (h->width % EMBPS_SKETCH_GROUP ||
                    (uint64_t)h->g0 + h->width / EMBPS_SKETCH_GROUP >
                        h->groups))
    return 0;
  return bytes == h->head + (uint64_t)h->rows * STATE_ROW +
                      (uint64_t)h->width * EMBPS_SKETCH_DEPTH * 2;
}

/* The width of a format-2 sketch of this table in n_shards shards. */
static uint32_t legacy_width(const embps_table_t *t, uint32_t n_shards) {
  uint64_t w = sketch_bytes(&t->spec) / n_shards /
               (EMBPS_SKETCH_DEPTH * sizeof(uint16_t));
  if (w < EMBPS_SKETCH_MIN_WIDTH)
    w = EMBPS_SKETCH_MIN_WIDTH;
  if (w > UINT32_MAX / EMBPS_SKETCH_DEPTH)
    w = UINT32_MAX / EMBPS_SKETCH_DEPTH;
  return (uint32_t)w;
}

/* The sketch of file shard file_k (header h, counters c) into the table's
 * shards: a copy into the same shard; into another shard count, a merge
 * into every shard holding one of its groups (admit.h); a format-2
 * sketch only into the same shard count, which keeps its layout. Nothing
 * (counts start again) if the layouts differ. 0 or -ENOMEM. */
static int restore_sketch(embps_table_t *t, uint32_t file_k,
                          uint32_t file_shards, const state_hdr_t *h,
                          const uint16_t *c) {
  const size_t bytes = (size_t)h->width * EMBPS_SKETCH_DEPTH * sizeof *c;
  if (!h->groups) {
    if (file_shards != t->n_shards || h->width != legacy_width(t, file_shards))
      return 0;
    shard_t *sh = &t->shards[file_k];
    embps_sketch_t s;
    if (embps_sketch_init_legacy(&s, h->width, t->spec.seed))
      return -ENOMEM;
    memcpy(s.c, c, bytes);
    s.adds = h->adds;
    add_bytes(t, (int64_t)embps_sketch_bytes(&s) -
                     (int64_t)embps_sketch_bytes(&sh->sketch));
    pthread_rwlock_wrlock(&sh->lock);
    embps_sketch_t old = sh->sketch;
    sh->sketch = s;
    pthread_rwlock_unlock(&sh->lock);
    embps_sketch_free(&old);
    return 0;
  }
  for (uint32_t k = 0; k < t->n_shards; k++) {
    shard_t *sh = &t->shards[k];
    if (sh->sketch.groups != h->groups)
      return 0;
    pthread_rwlock_wrlock(&sh->lock);
    if (file_shards == t->n_shards && k == file_k &&
        sh->sketch.g0 == h->g0 && sh->sketch.width == h->width) {
      memcpy(sh->sketch.c, c, bytes);
      sh->sketch.adds = h->adds;
    } else if (file_shards != t->n_shards) {
      embps_sketch_merge(&sh->sketch, c, h->g0,
                         h->width / EMBPS_SKETCH_GROUP, h->adds);
    }
    pthread_rwlock_unlock(&sh->lock);
  }
  return 0;
}

int embps_table_restore_state(embps_table_t *t, uint32_t format,
                              uint32_t file_k, uint32_t file_shards,
                              const unsigned char *state, size_t bytes) {
  state_hdr_t h;
  if (!state_parse(state, bytes, format, &h))
    return EMBPS_EPROTO;
  if (!t->policy)
    return 0;
  /* the counters: into the same shard, or any one (their sum is what
   * shows, and what later checkpoints carry on) */
  shard_t *sh = &t->shards[file_k % t->n_shards];
  dyn_count_t c = {.admitted = h.cnt[CNT_ADMITTED],
                   .pending = (int64_t)h.cnt[CNT_PENDING],
                   .evicted = {h.cnt[CNT_TTL], h.cnt[CNT_CAP], h.cnt[CNT_L2]}};
  pthread_rwlock_wrlock(&sh->lock);
  add_counts_locked(t, sh, &c);
  pthread_rwlock_unlock(&sh->lock);
  /* not rows evicted now: restore counts the rows it makes */
  atomic_fetch_add(&t->rows_allocated, c.evicted[0] + c.evicted[1] +
                                           c.evicted[2]);
  note_stall(t, h.stall_ns);
  if (!t->admit_count || !h.width)
    return 0;
  uint16_t *counters = malloc(h.width * (size_t)EMBPS_SKETCH_DEPTH *
                              sizeof *counters);
  if (!counters)
    return -ENOMEM;
  memcpy(counters, state + h.head + (size_t)h.rows * STATE_ROW,
         h.width * (size_t)EMBPS_SKETCH_DEPTH * sizeof *counters);
  int rc = restore_sketch(t, file_k, file_shards, &h, counters);
  free(counters);
  return rc;
}

int embps_table_restore_meta(embps_table_t *t, uint32_t format,
                             const unsigned char *state, size_t bytes,
                             const int64_t *ids, size_t first, size_t n) {
  state_hdr_t h;
  if (!state_parse(state, bytes, format, &h))
    return EMBPS_EPROTO;
  if (!t->has_meta || !h.rows)
    return 0;
  if (first + n > h.rows)
    return EMBPS_EPROTO;
  for (size_t i = 0; i < n; i++) {
    shard_t *sh = &t->shards[embps_route_shard(ids[i], t->n_shards)];
    const unsigned char *p = state + h.head + (first + i) * STATE_ROW;
    pthread_rwlock_wrlock(&sh->lock);
    uint32_t slot = embps_hstore_find_slot(&sh->hs, ids[i]);
    if (slot != EMBPS_HSTORE_NONE) {
      row_meta_t *m = meta_of(sh, slot);
      memcpy(&m->last_step, p, 8);
      memcpy(&m->freq, p + 8, 4);
      if (!m->freq)
        m->freq = 1;
      if (uses_heap(t)) {
        heap_up(sh, m->heap);
        heap_down(sh, m->heap);
      }
    }
    pthread_rwlock_unlock(&sh->lock);
  }
  return 0;
}
