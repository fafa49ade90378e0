/* table.c - a table's row storage (table.h for the design and the record;
 * table_impl.h for the locks, and how this file, policy.c and table_io.c
 * share the table).
 *
 * Array storage: the records of ids 0..rows-1 in one mmap'd array, and a
 * bitmap of the rows materialised. Hashed storage: per shard, an hstore
 * whose records are id first. Gather reads ids in request order with
 * every shard's read lock held. A push (prepare, then commit) groups its
 * ids by shard, finds or reserves room for every row before any row
 * changes, then applies each shard under its write lock, shards in
 * parallel (OpenMP) when the push is large; a table with admission or
 * eviction asks policy.c the fate of every position first, and for the
 * evictions after. write_rows (and a checkpoint's restore, table_io.c)
 * place given rows the same way. */
#include "table.h"

#include <assert.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "init.h"
#include "policy.h"
#include "route.h"
#include "table_impl.h"

#define HUGE_PAGE_BYTES (2u << 20) /* array storage: madvise from this size */
#define PARALLEL_MIN_ROWS 4096 /* below this, OpenMP costs more than it gains */
#define PARALLEL_MIN_BYTES (256u << 10) /* the same for copying rows in */
#define PREFETCH_AHEAD 16          /* rows */
#define PREFETCH_MAX 512u          /* bytes of a record prefetched */

static atomic_uint_fast64_t total_bytes;

uint64_t embps_tables_total_bytes(void) { return atomic_load(&total_bytes); }

void embps_table_add_bytes(embps_table_t *t, int64_t delta) {
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
  free(s->plan_slot);
  free(s->plan_start);
  free(s->plan_ttl);
  free(s->mark);
  free(s->plan_ids);
  free(s->check);
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
    free(s->plan_start); /* sized with shard_cap, on demand (apply only) */
    free(s->plan_ttl);
    s->plan_start = s->plan_ttl = NULL;
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
  if (t->has_meta && !s->plan_start) {
    s->plan_start = calloc(s->shard_cap, sizeof *s->plan_start);
    s->plan_ttl = calloc(s->shard_cap, sizeof *s->plan_ttl);
    if (!s->plan_start || !s->plan_ttl) {
      free(s->plan_start);
      free(s->plan_ttl);
      s->plan_start = s->plan_ttl = NULL;
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

/* ------------------------------------------------------------ envelope */

/* A push can only overflow a value through large ones. While every value
 * the table holds lies inside the envelope (optim.h: weights within 2^40,
 * 256 in f16 tables, state within 2^40, FTRL's n at or above its initial
 * accumulator) and the push's gradients within EMBPS_TABLE_G_SCREEN,
 * embps_optim_bounded proves the update finite without reading a row, so
 * embps_table_check_finite needs no dry run. t->unbounded (set for good)
 * says a row may lie outside: the update kernels report each row they
 * leave outside as they write it (apply_record), and place_rows checks
 * each row it writes (note_envelope). From then on each push takes the dry
 * run (its cost, a second pass over the push's rows, is in README,
 * "Semantics"). */

static void set_unbounded(embps_table_t *t) {
  if (!atomic_load_explicit(&t->unbounded, memory_order_relaxed))
    atomic_store(&t->unbounded, 1);
}

/* 1 if some |x[i]| of x[0..n) is above bound or NaN (a compare and an
 * or per value: it vectorises). */
static int any_above(const float *x, size_t n, float bound) {
  int above = 0;
  for (size_t i = 0; i < n; i++)
    above |= !(fabsf(x[i]) <= bound);
  return above;
}

/* Notes a row written whole (float32 weights w, its state) outside the
 * envelope. */
static void note_envelope(embps_table_t *t, const float *w,
                          const float *state) {
  const uint32_t dim = t->dim, k = embps_optim_state_per_weight(t->optim.kind);
  int out = any_above(w, dim, t->optim.w_max) |
            any_above(state, (size_t)k * dim, t->optim.s_max);
  for (uint32_t j = 0; !out && t->optim.kind == EMBPS_OPT_FTRL && j < dim; j++)
    out = !(state[j] >= t->optim.initial_accumulator);
  if (out)
    set_unbounded(t);
}

/* One optimizer step on rec with gradient g, noting a row it leaves
 * outside the envelope. The f32 path runs the kernel in place; f16/bf16
 * widen the weights into wide, run the same kernel and round back to
 * nearest even. */
static inline void apply_record(embps_table_t *t, unsigned char *rec,
                                const float *g, float *wide) {
  void *w = rec + t->w_off;
  float *state = (float *)(rec + t->state_off);
  int out;
  if (t->dtype == EMBPS_DTYPE_F32) {
    out = embps_optim_apply(&t->optim, w, g, t->dim); /* state follows w */
  } else {
    embps_dtype_to_f32(t->dtype, w, wide, t->dim);
    out = embps_optim_apply_split(&t->optim, wide, state, g, t->dim);
    embps_dtype_from_f32(t->dtype, wide, w, t->dim);
  }
  if (out)
    set_unbounded(t);
}

/* ------------------------------------------------------------ array */

/* Passed as `wide` to materialise a row whose contents the caller writes
 * (restore): no initial value is computed. */
#define RAW_ROW ((float *)(uintptr_t)1)

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

/* Bytes that room for `rows` slots in sh would add (store and policy
 * bookkeeping). */
static uint64_t growth_bytes(const embps_table_t *t, const shard_t *sh,
                             uint32_t rows) {
  return embps_hstore_growth_bytes(&sh->hs, rows) +
         embps_policy_growth_bytes(t, sh, rows);
}

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
    embps_policy_on_insert_locked(t, sh, slot, id, step);
  return rec;
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
    return embps_policy_sketch_bytes(spec);
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
  embps_table_add_bytes(t, (int64_t)(t->live_words * sizeof *t->live));
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
  const double init = fabs(spec->init_value) *
                      (spec->init == EMBPS_INIT_NORMAL ? 8.66 : 1.0);
  atomic_init(&t->unbounded,
              (spec->init != EMBPS_INIT_ZEROS && init > t->optim.w_max) ||
                  spec->initial_accumulator > t->optim.s_max);
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
  int64_t policy_bytes;
  const int rc = embps_policy_setup(t, cluster_size, &policy_bytes);
  embps_table_add_bytes(t, policy_bytes); /* on failure destroy takes them */
  if (rc)
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
      embps_policy_shard_close(sh);
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
/* Takes every shard's read lock, in shard order, at a moment no change of
 * rows is under way (the writer's wseq even): a change that began waits
 * for the locks, one under way is let finish (the locks dropped, taken
 * again once it has). Returns the LSN of the last change. */
static uint64_t lock_whole(embps_table_t *t) {
  for (unsigned spins = 0;; spins++) {
    for (uint32_t k = 0; k < t->n_shards; k++)
      pthread_rwlock_rdlock(&t->shards[k].lock);
    const uint64_t seq = atomic_load(&t->wseq);
    if (!(seq & 1))
      return atomic_load(&t->lsn_at);
    for (uint32_t k = t->n_shards; k > 0; k--)
      pthread_rwlock_unlock(&t->shards[k - 1].lock);
    while (atomic_load(&t->wseq) == seq) {
      if (spins < 64) {
        sched_yield();
      } else {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
      }
    }
  }
}

/* Takes every shard's read lock, in shard order; returns the LSN of the
 * last change done (one may be under way). */
static uint64_t lock_all(embps_table_t *t) {
  for (uint32_t k = 0; k < t->n_shards; k++)
    pthread_rwlock_rdlock(&t->shards[k].lock);
  return atomic_load(&t->lsn_at);
}

uint64_t embps_table_gather(embps_table_t *t, const int64_t *ids, size_t n,
                            float *out) {
  return embps_table_gather_at(t, ids, n, out, 0);
}

uint64_t embps_table_gather_at(embps_table_t *t, const int64_t *ids,
                               size_t n, float *out, int whole) {
  const uint32_t dim = t->dim, bytes = t->w_off + t->w_bytes;
  const uint64_t lsn = whole ? lock_whole(t) : lock_all(t);
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
  return lsn;
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
      s->fresh[k] = embps_policy_find_shard(t, s, k, ids, now);
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
    embps_table_add_bytes(t, added);
    if (!rc) {
      rc = embps_policy_grow(t, sh, rows, &added);
      embps_table_add_bytes(t, added);
    }
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
 * each position's fate (embps_policy_find_shard), then the reclaiming and
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
        embps_policy_on_push_locked(t, sh, s->slot[p], now, 0);
      break;
    case W_NEW:
      rec = hashed_insert_locked(t, sh, id, wide, now);
      c->created++;
      c->admitted++;
      c->pending -= t->admit_count;
      break;
    case W_RESET:
      init_record(t, id, rec, wide);
      embps_policy_on_push_locked(t, sh, s->slot[p], now, 1);
      c->evicted[WHY_TTL]++;
      c->created++;
      c->admitted++;
      break;
    case W_DROP:
      embps_policy_evict_slot_locked(t, sh, s->slot[p]);
      c->evicted[WHY_TTL]++;
      rec = NULL;
      if (t->admit_count)
        embps_policy_count_pending_locked(sh, id, c);
      break;
    case W_PENDING:
      embps_policy_count_pending_locked(sh, id, c);
      rec = NULL;
      break;
    default:
      rec = NULL;
      break;
    }
    if (rec)
      apply_record(t, rec, g + (size_t)i * t->dim, wide);
  }
  if (t->has_meta)
    embps_policy_evict_planned_locked(t, sh, s, k, c);
}

/* The evictions of the push grouped in s (policy.h), shard by shard; or
 * none yet when they will be given (s->given). 0 or -ENOMEM. */
static int plan_evictions(const embps_table_t *t, embps_table_scratch_t *s) {
  const uint64_t now = atomic_load(&t->step) + 1; /* the push's step */
  s->plan_n = 0;
  for (uint32_t k = 0; k < t->n_shards; k++) {
    if (s->given) {
      s->plan_start[k] = 0;
      s->plan_ttl[k] = 0;
      continue;
    }
    int rc = embps_policy_plan_shard(t, s, k, now);
    if (rc)
      return rc;
  }
  s->plan_start[t->n_shards] = (uint32_t)s->plan_n;
  return 0;
}

/* ------------------------------------------------------------ finite */

/* Updates a copy of the row at order position p (tmp: weights, then state)
 * as commit would; 1 if every value written would be finite, 0 if not,
 * -1 for a position commit leaves alone. o: the optimizer at the step. */
static int row_finite(const embps_table_t *t, const embps_table_scratch_t *s,
                      const embps_optim_t *o, const int64_t *ids,
                      const float *g, uint32_t p, float *tmp) {
  const uint32_t dim = t->dim, k = embps_optim_state_per_weight(o->kind);
  const int64_t id = ids[s->order[p]];
  const unsigned char *rec = NULL;
  if (is_padding(t, id))
    return -1;
  if (t->policy) {
    const int what = s->what[p];
    if (what != W_LIVE && what != W_NEW && what != W_RESET)
      return -1;
    rec = what == W_LIVE ? s->rec[p] : NULL;
  } else if (t->hashed) {
    rec = s->rec[p];
  } else if (array_live(t, id)) {
    rec = array_rec(t, id);
  }
  float *w = tmp, *state = tmp + dim;
  if (rec) {
    read_weights(t, rec, w);
    memcpy(state, rec + t->state_off, (size_t)k * dim * sizeof *state);
  } else {
    initial_weights(t, id, w);
    embps_optim_init_state(o, state, dim);
  }
  embps_optim_apply_split(o, w, state, g + (size_t)s->order[p] * dim, dim);
  if (t->dtype != EMBPS_DTYPE_F32) /* stored rounded: f16 overflows early */
    embps_dtype_round(t->dtype, w, dim);
  int ok = 1;
  for (size_t j = 0; j < (size_t)(1 + k) * dim; j++)
    ok &= isfinite(tmp[j]) != 0;
  return ok;
}

int embps_table_check_finite(const embps_table_t *t, embps_table_scratch_t *s,
                             const int64_t *ids, const float *g, size_t n,
                             int g_small, size_t *bad) {
  embps_optim_t o = t->optim; /* commit's step: one past the table's */
  embps_optim_begin_step(&o, atomic_load(&t->step) + 1);
  if (g_small && !atomic_load(&t->unbounded)) {
    const double out = t->dtype == EMBPS_DTYPE_F16    ? 65504.0 / 2
                       : t->dtype == EMBPS_DTYPE_BF16 ? 3.38e38 / 2
                                                      : FLT_MAX / 2;
    if (embps_optim_bounded(&o, o.w_max, o.s_max, EMBPS_TABLE_G_SCREEN, out))
      return 0;
  }
  const uint32_t S = t->n_shards;
  const size_t per = ((size_t)(1 + embps_optim_state_per_weight(
                                       t->optim.kind)) * t->dim + 15) &
                     ~(size_t)15;
  const size_t need = (size_t)omp_get_max_threads() * per;
  if (need > s->check_floats) {
    float *c = aligned_alloc(64, need * sizeof *c);
    if (!c)
      return -ENOMEM;
    free(s->check);
    s->check = c;
    s->check_floats = need;
  }
  size_t first = n; /* the first position found, in request order */
#pragma omp parallel for schedule(dynamic, 1) reduction(min : first) \
    if (n >= PARALLEL_MIN_ROWS && S > 1)
  for (uint32_t k = 0; k < S; k++) {
    float *tmp = s->check + (size_t)omp_get_thread_num() * per;
    const uint32_t b = s->start[k + 1];
    for (uint32_t p = s->start[k]; p < b; p++) {
      if (p + PREFETCH_AHEAD < b)
        prefetch_known(t, s, ids, p + PREFETCH_AHEAD);
      if (row_finite(t, s, &o, ids, g, p, tmp) == 0 && s->order[p] < first)
        first = s->order[p];
    }
  }
  if (first == n)
    return 0;
  *bad = first;
  return EMBPS_ENONFINITE;
}

int embps_table_prepare(embps_table_t *t, embps_table_scratch_t *s,
                        const int64_t *ids, size_t n, uint64_t max_bytes) {
  int rc = group_by_shard(t, s, ids, n);
  if (!rc)
    rc = scratch_reserve_apply(t, s);
  if (!rc)
    rc = t->hashed ? reserve_hashed(t, s, ids, n, max_bytes)
                   : reserve_array(t, ids, n, max_bytes);
  if (!rc && t->has_meta && !s->import) /* an import evicts nothing */
    rc = plan_evictions(t, s);
  return rc;
}

int embps_table_planned(const embps_table_t *t, embps_table_scratch_t *s,
                        const int64_t **ids, uint32_t *n_ttl,
                        uint32_t *n_cap) {
  *ids = NULL;
  *n_ttl = *n_cap = 0;
  if (!t->has_meta || !s->plan_n)
    return 0;
  if (s->plan_n > s->plan_ids_cap) {
    int64_t *v = malloc(s->plan_n * sizeof *v);
    if (!v)
      return -ENOMEM;
    free(s->plan_ids);
    s->plan_ids = v;
    s->plan_ids_cap = s->plan_n;
  }
  size_t at = 0;
  for (int pass = 0; pass < 2; pass++) /* TTL reclaims, then capacity */
    for (uint32_t k = 0; k < t->n_shards; k++) {
      const shard_t *sh = &t->shards[k];
      const uint32_t a = s->plan_start[k], b = s->plan_start[k + 1];
      const uint32_t mid = a + s->plan_ttl[k];
      for (uint32_t i = pass ? mid : a; i < (pass ? b : mid); i++)
        s->plan_ids[at++] = sh->meta[s->plan_slot[i]].id;
      if (!pass)
        *n_ttl = (uint32_t)at;
    }
  *n_cap = (uint32_t)(at - *n_ttl);
  *ids = s->plan_ids;
  return 0;
}

int embps_table_plan_given(embps_table_t *t, embps_table_scratch_t *s,
                           const int64_t *ttl, size_t n_ttl,
                           const int64_t *cap, size_t n_cap, int64_t *bad) {
  const uint32_t S = t->n_shards;
  if (!t->has_meta || !s->plan_start)
    return n_ttl + n_cap ? EMBPS_EINVAL : 0;
  const size_t n = n_ttl + n_cap;
  if (n > s->plan_cap) {
    uint32_t *v = realloc(s->plan_slot, n * sizeof *v);
    if (!v)
      return -ENOMEM;
    s->plan_slot = v;
    s->plan_cap = n;
  }
  /* counted per shard, then placed: each shard's TTL ids first */
  memset(s->plan_start, 0, (S + 1) * sizeof *s->plan_start);
  memset(s->plan_ttl, 0, S * sizeof *s->plan_ttl);
  for (size_t i = 0; i < n; i++) {
    const int64_t id = i < n_ttl ? ttl[i] : cap[i - n_ttl];
    const uint32_t k = embps_route_shard(id, S);
    s->plan_start[k + 1]++;
    s->plan_ttl[k] += i < n_ttl;
  }
  for (uint32_t k = 0; k < S; k++)
    s->plan_start[k + 1] += s->plan_start[k];
  uint32_t *fill = malloc(S * sizeof *fill);
  if (!fill)
    return -ENOMEM;
  for (uint32_t k = 0; k < S; k++)
    fill[k] = s->plan_start[k];
  for (size_t i = 0; i < n; i++) {
    const int64_t id = i < n_ttl ? ttl[i] : cap[i - n_ttl];
    const uint32_t k = embps_route_shard(id, S);
    const shard_t *sh = &t->shards[k];
    const uint32_t slot = embps_hstore_find_slot(&sh->hs, id);
    if (slot == EMBPS_HSTORE_NONE || !slot_live(t, sh, slot)) {
      *bad = id;
      s->plan_n = 0;
      memset(s->plan_start, 0, (S + 1) * sizeof *s->plan_start);
      free(fill);
      return EMBPS_EINVAL;
    }
    s->plan_slot[fill[k]++] = slot;
  }
  free(fill);
  s->plan_n = n;
  return 0;
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
    embps_policy_add_counts_locked(t, sh, &c);
    if (lsn)
      sh->lsn = lsn;
    pthread_rwlock_unlock(&sh->lock);
    atomic_fetch_add(&t->rows_allocated, c.created);
  }
  atomic_store(&t->visible_step, t_step);
  atomic_fetch_add(&t->pushes, 1);
}

static void commit_plain(embps_table_t *t, embps_table_scratch_t *s,
                         const int64_t *ids, const float *g, size_t n,
                         uint64_t lsn, uint64_t t_step);

void embps_table_commit(embps_table_t *t, embps_table_scratch_t *s,
                        const int64_t *ids, const float *g, size_t n,
                        uint64_t lsn) {
  uint64_t t_step = atomic_fetch_add(&t->step, 1) + 1;
  embps_optim_begin_step(&t->optim, t_step);
  change_begin(t);
  if (t->policy)
    commit_policy(t, s, ids, g, n, lsn, t_step);
  else
    commit_plain(t, s, ids, g, n, lsn, t_step);
  change_end(t, lsn);
}

/* embps_table_commit for a table without admission or eviction. */
static void commit_plain(embps_table_t *t, embps_table_scratch_t *s,
                         const int64_t *ids, const float *g, size_t n,
                         uint64_t lsn, uint64_t t_step) {
  const uint32_t S = t->n_shards;
  uint64_t created_total = 0;
  (void)t_step;
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
    embps_table_add_bytes(t, (int64_t)(created_total * t->row_bytes));
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

void embps_table_set_lsn(embps_table_t *t, uint64_t lsn) {
  atomic_store(&t->lsn_at, lsn);
}

void embps_table_set_incarnation(embps_table_t *t, uint64_t incarnation) {
  t->incarnation = incarnation;
  atomic_store(&t->lsn_at, incarnation); /* it exists from there on */
}

uint32_t embps_table_n_shards(const embps_table_t *t) { return t->n_shards; }


/* ------------------------------------------------------------ write rows */

void embps_table_place_rows(embps_table_t *t, embps_table_scratch_t *s,
                            const int64_t *ids, uint64_t lsn, uint64_t now,
                            embps_table_fill_fn fill, const void *ctx) {
  uint64_t created = 0;
  const uint32_t S = t->n_shards;
  const size_t n = s->start[S];
  change_begin(t);
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
      /* rows scattered over the table: start their lines' loads (the
       * stores that overwrite them would wait for each in turn) */
      if (p + PREFETCH_AHEAD < s->start[k + 1])
        prefetch_known(t, s, ids, p + PREFETCH_AHEAD);
      if (is_padding(t, ids[i]))
        continue;
      if (!t->hashed)
        rec = array_materialise(t, ids[i], RAW_ROW, &created);
      else if (!(rec = s->rec[p])) {
        rec = hashed_insert_locked(t, sh, ids[i], RAW_ROW, now);
        created++;
      } else if (t->has_meta) {
        embps_policy_on_push_locked(
            t, sh, s->slot[p], now,
            s->what[p] == W_RESET || s->what[p] == W_DROP);
      }
      fill(ctx, t, rec, i, wide);
      if (t->dtype == EMBPS_DTYPE_F32) {
        note_envelope(t, (const float *)(rec + t->w_off),
                      (const float *)(rec + t->state_off));
      } else {
        read_weights(t, rec, wide);
        note_envelope(t, wide, (const float *)(rec + t->state_off));
      }
    }
    if (lsn)
      sh->lsn = lsn;
    pthread_rwlock_unlock(&sh->lock);
  }
  change_end(t, lsn);
  atomic_fetch_add(&t->rows_allocated, created);
  if (!t->hashed)
    embps_table_add_bytes(t, (int64_t)(created * t->row_bytes));
}

typedef struct {
  const float *w, *state;
} rows_src_t;

/* embps_table_fill_fn: weights rounded to the storage type, state given
 * or initial. */
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
  embps_table_place_rows(t, s, ids, lsn, atomic_load(&t->step), fill_rows,
                         &src);
}

