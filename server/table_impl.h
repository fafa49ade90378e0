/* table_impl.h - the inside of a table (table.h), shared by the three files
 * that implement it and included by no other:
 *   policy.c    admission and eviction bookkeeping of a shard (policy.h):
 *               the admission sketch, the slots' recency list, LFU heap
 *               and TTL steps, the policy counters;
 *   table.c     storage: create, gather, prepare/commit, write_rows;
 *   table_io.c  a table's rows in bulk: checkpoint snapshots and their
 *               restore, export scans.
 * Calls go one way only: table_io.c -> table.c -> policy.c (and table_io.c
 * -> policy.c). policy.c calls nothing of the other two, table.c nothing
 * of table_io.c; the functions at the end of this header are table.c's,
 * for table_io.c.
 *
 * Locking (every file): every shard has a writer-preferring rwlock. A
 * gather takes every shard's read lock, in shard order, and holds them all
 * for its whole length. Only one thread applies to a table at a time, and
 * nothing else writes to it, so the applying thread reads the table's
 * structures without a lock and builds new ones (a grown map, a grown
 * chunk index, a grown slot bookkeeping) without one; it takes a shard's
 * write lock for every change a reader could see: writing rows, inserting
 * into the map, swapping in a grown map, chunk index or bookkeeping.
 * Rows never move. Functions named _locked expect the shard's lock held
 * (the write lock unless their contract says read).
 *
 * Hashed storage: per shard, an hstore (hstore.h: the map, the row chunks,
 * slot allocation) whose records are table.h's records, id first. */
#ifndef EMBPS_TABLE_IMPL_H
#define EMBPS_TABLE_IMPL_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "admit.h"
#include "dtype.h"
#include "hstore.h"
#include "optim.h"
#include "table.h"

#define ID_BYTES 8u /* the id heading a hashed record */

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
  /* admission and eviction (issue 12, policy.c), hashed storage only */
  embps_sketch_t sketch; /* admit_after > 1 */
  row_meta_t *meta;      /* meta_cap slots; NULL without eviction */
  uint32_t meta_cap;
  uint32_t lru_head, lru_tail; /* slot + 1, least recently pushed first */
  uint32_t *heap, heap_n, heap_cap; /* LFU min-heap of slots */
  uint64_t cnt[N_CNT];   /* this shard's part of the table's counters */
  embps_hstore_t hs;    /* hashed storage only */
  uint64_t lsn;        /* log position of the last push applied here */
  char pad[64];        /* keeps shards' locks off each other's lines */
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
  /* admission and eviction (issue 12, policy.c) */
  int policy;               /* any of them: the slow paths */
  int has_meta;             /* per-slot row_meta_t (ttl, max_rows or l2) */
  int admit_count;          /* admit_after > 1: the sketch */
  uint64_t cap_server, cap_shard; /* max_rows shares (0: no capacity) */
  atomic_uint_fast64_t visible_step; /* step pulls judge ttl by */
  atomic_uint_fast64_t admitted, pending, ev_ttl, ev_cap, ev_l2, stall_ns;
  atomic_int refs;
  /* Whole-change reads (issue 21): wseq is odd while a change of rows
   * (commit, write_rows, evict) is under way; lsn_at is the LSN of the
   * last one done. A gather retries while wseq is odd (embps_table_gather
   * says why). */
  atomic_uint_fast64_t wseq, lsn_at;
  atomic_int unbounded; /* a stored value may lie outside the envelope
                           (table.c, "finite"): set for good */
};

/* A change of rows begins, and ends having made the table what it is at
 * lsn (0: unknown, lsn_at kept). */
static inline void change_begin(embps_table_t *t) {
  atomic_fetch_add(&t->wseq, 1);
}
static inline void change_end(embps_table_t *t, uint64_t lsn) {
  if (lsn)
    atomic_store(&t->lsn_at, lsn);
  atomic_fetch_add(&t->wseq, 1);
}

/* The fate of each position of a push to a table with a policy
 * (embps_policy_find_shard), in the scratch's `what`. */
enum {
  W_SKIP,    /* padding */
  W_LIVE,    /* a row: apply */
  W_NEW,     /* admitted now: make the row, apply */
  W_RESET,   /* an expired row admitted again: reinitialise, apply */
  W_PENDING, /* not admitted yet: count it */
  W_DROP,    /* an expired row not admitted again: evict, count it */
  W_REFUSED, /* refused by --admit-probability */
};

/* Why a row was evicted: dyn_count_t's evicted[]. */
enum { WHY_TTL, WHY_CAP, WHY_L2 };

/* Counters of one shard's part of a push (or an eviction, or a restore),
 * added to the shard's and the table's by embps_policy_add_counts_locked. */
typedef struct {
  uint64_t created, admitted, evicted[3];
  int64_t pending;
} dyn_count_t;

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

static inline unsigned char *array_rec(const embps_table_t *t, int64_t id) {
  return t->rows + (size_t)id * t->row_bytes;
}

static inline int array_live(const embps_table_t *t, int64_t id) {
  uint64_t w = atomic_load_explicit(&t->live[(uint64_t)id >> 6],
                                    memory_order_relaxed);
  return (int)((w >> ((uint64_t)id & 63)) & 1);
}

/* Whether slot of sh holds a row (evicted slots wait on the free list). */
static inline int slot_live(const embps_table_t *t, const shard_t *sh,
                            uint32_t slot) {
  return !t->has_meta || sh->meta[slot].freq != 0;
}

/* Whether a row last pushed at last_step has expired at table step `now`
 * (a row pushed after `now`, by a push under way, has not). */
static inline int expired_at(const embps_table_t *t, uint64_t last_step,
                             uint64_t now) {
  return t->spec.ttl_steps && last_step <= now &&
         now - last_step >= t->spec.ttl_steps;
}

/* ------------------------------------------ table.c's, for table_io.c */

/* Adds delta to the bytes the table holds (and the process's total). */
void embps_table_add_bytes(embps_table_t *t, int64_t delta);

/* Writes row i of a batch into rec (a row of the table, maybe new);
 * wide: a float32 row of scratch (f16/bf16 tables). */
typedef void (*embps_table_fill_fn)(const void *ctx, const embps_table_t *t,
                                    unsigned char *rec, size_t i, float *wide);

/* Writes n distinct, checked, prepared rows (embps_table_prepare with s,
 * ids and n, with s->import or s->raw set: room made for every row not
 * stored) with fill, shard by shard under the write lock, materialising
 * the new ones without an initial value, shards in parallel (OpenMP) when
 * the rows are many. Padding ids are skipped. lsn != 0 becomes the log
 * position of every shard written. Tables with eviction: every row written
 * counts as pushed at step `now` (an expired one as new). Cannot fail. */
void embps_table_place_rows(embps_table_t *t, embps_table_scratch_t *s,
                            const int64_t *ids, uint64_t lsn, uint64_t now,
                            embps_table_fill_fn fill, const void *ctx);
#endif
