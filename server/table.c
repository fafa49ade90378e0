/* table.c - row storage (see table.h for the design).
 *
 * Locking: every shard has a writer-preferring rwlock. A gather groups its
 * ids by shard and holds one shard's read lock at a time; an apply groups
 * its rows the same way and holds one shard's write lock while it updates
 * that shard's rows. Dense tables' row array never moves; a dynamic shard's
 * map may grow, but only under its write lock, and its row chunks never move.
 */
#include "table.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "init.h"
#include "optim.h"
#include "route.h"

#define CHUNK_BYTES (2u << 20)
#define PARALLEL_MIN_ROWS 4096 /* below this, OpenMP costs more than it gains */
#define EMPTY_SLOT UINT32_MAX

typedef struct {
  int64_t key;
  uint32_t slot;
} map_entry_t;

typedef struct {
  pthread_rwlock_t lock;
  /* dynamic tables only */
  map_entry_t *map;
  size_t map_cap, n_rows;
  float **chunks;
  size_t n_chunks, chunks_cap;
  char pad[64];
} shard_t;

struct embps_table {
  embps_table_spec_t spec;
  embps_optim_t optim;
  uint32_t n_shards;
  uint32_t stride;          /* floats per row record */
  uint32_t rows_per_chunk;  /* dynamic */
  uint32_t chunk_shift;
  float *rows;              /* dense: mmap'd row array */
  size_t rows_len;
  _Atomic uint64_t *live;   /* dense: bitmap of materialised rows */
  size_t live_words;
  shard_t *shards;
  atomic_uint_fast64_t rows_allocated, bytes, pushes, pulls, step;
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
  free(s->start);
  embps_table_scratch_init(s);
}

/* Groups positions 0..n-1 by shard (a stable counting sort). */
static int group_by_shard(const embps_table_t *t, embps_table_scratch_t *s,
                          const int64_t *ids, size_t n) {
  uint32_t S = t->n_shards;
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
  }
  if (S + 1 > s->shard_cap) {
    uint32_t *st = malloc((S + 1) * sizeof *st);
    if (!st)
      return -ENOMEM;
    free(s->start);
    s->start = st;
    s->shard_cap = S + 1;
  }
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

/* ------------------------------------------------------------ create */

int embps_table_create(const embps_table_spec_t *spec, uint32_t n_shards,
                       embps_table_t **out) {
  embps_table_t *t = calloc(1, sizeof *t);
  if (!t)
    return -ENOMEM;
  t->spec = *spec;
  embps_optim_from_spec(&t->optim, spec);
  t->n_shards = n_shards ? n_shards : 1;
  uint32_t floats = spec->dim * (1 + embps_optim_state_per_weight(spec->optimizer));
  t->stride = (floats + 3) & ~3u; /* 16-byte aligned records */
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

  size_t row_bytes = (size_t)t->stride * sizeof(float);
  if (spec->dynamic) {
    uint32_t rpc = 1;
    while ((size_t)rpc * 2 * row_bytes <= CHUNK_BYTES)
      rpc *= 2;
    t->rows_per_chunk = rpc;
    t->chunk_shift = (uint32_t)__builtin_ctz(rpc);
  } else {
    t->rows_len = spec->rows * row_bytes;
    void *p = mmap(NULL, t->rows_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      goto fail;
    t->rows = p;
    if (t->rows_len >= CHUNK_BYTES)
      madvise(p, t->rows_len, MADV_HUGEPAGE);
    t->live_words = (spec->rows + 63) / 64;
    t->live = calloc(t->live_words, sizeof *t->live);
    if (!t->live)
      goto fail;
    add_bytes(t, (int64_t)(t->live_words * sizeof *t->live));
  }
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
      for (size_t c = 0; c < sh->n_chunks; c++)
        free(sh->chunks[c]);
      free(sh->chunks);
      free(sh->map);
      pthread_rwlock_destroy(&sh->lock);
    }
    free(t->shards);
  }
  if (t->rows)
    munmap(t->rows, t->rows_len);
  free(t->live);
  atomic_fetch_sub(&total_bytes, atomic_load(&t->bytes));
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

size_t embps_table_row_bytes(const embps_table_t *t) {
  return (size_t)t->stride * sizeof(float);
}

void embps_table_info(embps_table_t *t, embps_table_info_t *out) {
  memset(out, 0, sizeof *out);
  out->spec = t->spec;
  out->rows_allocated = atomic_load(&t->rows_allocated);
  out->bytes_used = atomic_load(&t->bytes);
  out->pushes = atomic_load(&t->pushes);
  out->pulls = atomic_load(&t->pulls);
  out->step = atomic_load(&t->step);
}

/* ------------------------------------------------------------ lookups */

static inline int is_padding(const embps_table_t *t, int64_t id) {
  return t->spec.has_padding && id == t->spec.padding_id;
}

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

static inline float *dense_row(const embps_table_t *t, int64_t id) {
  return t->rows + (size_t)id * t->stride;
}

static inline int dense_live(const embps_table_t *t, int64_t id) {
  uint64_t w = atomic_load_explicit(&t->live[(uint64_t)id >> 6],
                                    memory_order_relaxed);
  return (int)((w >> ((uint64_t)id & 63)) & 1);
}

static inline float *chunk_row(const embps_table_t *t, const shard_t *sh,
                               uint32_t slot) {
  return sh->chunks[slot >> t->chunk_shift] +
         (size_t)(slot & (t->rows_per_chunk - 1)) * t->stride;
}

/* The map slot holding id, or the empty slot where it would go. */
static inline map_entry_t *map_find(const shard_t *sh, int64_t id) {
  size_t mask = sh->map_cap - 1;
  size_t h = embps_mix64((uint64_t)id) & mask;
  for (;;) {
    map_entry_t *e = &sh->map[h];
    if (e->slot == EMPTY_SLOT || e->key == id)
      return e;
    h = (h + 1) & mask;
  }
}

/* The stored row of id in shard sh, or NULL if never pushed. */
static inline float *find_row(const embps_table_t *t, const shard_t *sh,
                              int64_t id) {
  if (!t->spec.dynamic)
    return dense_live(t, id) ? dense_row(t, id) : NULL;
  if (!sh->map_cap)
    return NULL;
  map_entry_t *e = map_find(sh, id);
  return e->slot == EMPTY_SLOT ? NULL : chunk_row(t, sh, e->slot);
}

int embps_table_gather(embps_table_t *t, embps_table_scratch_t *s,
                       const int64_t *ids, size_t n, float *out) {
  int rc = group_by_shard(t, s, ids, n);
  if (rc)
    return rc;
  const uint32_t dim = t->spec.dim;
  const size_t row_len = dim * sizeof(float);
  for (uint32_t k = 0; k < t->n_shards; k++) {
    uint32_t a = s->start[k], b = s->start[k + 1];
    if (a == b)
      continue;
    shard_t *sh = &t->shards[k];
    pthread_rwlock_rdlock(&sh->lock);
    for (uint32_t p = a; p < b; p++) {
      uint32_t i = s->order[p];
      if (p + 8 < b && !t->spec.dynamic)
        __builtin_prefetch(dense_row(t, ids[s->order[p + 8]]));
      float *dst = out + (size_t)i * dim;
      float *row = is_padding(t, ids[i]) ? NULL : find_row(t, sh, ids[i]);
      if (row)
        memcpy(dst, row, row_len);
      else if (is_padding(t, ids[i]))
        memset(dst, 0, row_len);
      else
        embps_init_row(&t->spec, ids[i], dst);
    }
    pthread_rwlock_unlock(&sh->lock);
  }
  atomic_fetch_add(&t->pulls, 1);
  return 0;
}

/* ------------------------------------------------------------ apply */

/* Makes room in a dynamic shard for `more` new rows (an upper bound): map
 * at load <= 1/2 and row chunks. Called with the shard's write lock held.
 * Contents are unchanged whatever happens. */
static int reserve_locked(embps_table_t *t, shard_t *sh, size_t more,
                          uint64_t max_bytes) {
  size_t need = sh->n_rows + more;
  if (!more)
    return 0;
  size_t row_bytes = embps_table_row_bytes(t);
  size_t chunks_needed = (need + t->rows_per_chunk - 1) >> t->chunk_shift;
  size_t new_map_cap = sh->map_cap ? sh->map_cap : 16;
  while (new_map_cap < 2 * need)
    new_map_cap *= 2;
  uint64_t extra = (chunks_needed > sh->n_chunks
                        ? (chunks_needed - sh->n_chunks) * t->rows_per_chunk *
                              row_bytes
                        : 0) +
                   (new_map_cap > sh->map_cap
                        ? (new_map_cap - sh->map_cap) * sizeof(map_entry_t)
                        : 0);
  if (max_bytes && extra && embps_tables_total_bytes() + extra > max_bytes)
    return EMBPS_ELIMIT;
  if (chunks_needed > sh->chunks_cap) {
    size_t cap = sh->chunks_cap ? sh->chunks_cap : 4;
    while (cap < chunks_needed)
      cap *= 2;
    float **c = realloc(sh->chunks, cap * sizeof *c);
    if (!c)
      return -ENOMEM;
    sh->chunks = c;
    sh->chunks_cap = cap;
  }
  while (sh->n_chunks < chunks_needed) {
    float *c = aligned_alloc(64, (size_t)t->rows_per_chunk * row_bytes);
    if (!c)
      return -ENOMEM;
    sh->chunks[sh->n_chunks++] = c;
    add_bytes(t, (int64_t)((size_t)t->rows_per_chunk * row_bytes));
  }
  if (new_map_cap > sh->map_cap) {
    map_entry_t *m = malloc(new_map_cap * sizeof *m);
    if (!m)
      return -ENOMEM;
    for (size_t i = 0; i < new_map_cap; i++)
      m[i].slot = EMPTY_SLOT;
    shard_t grown = *sh;
    grown.map = m;
    grown.map_cap = new_map_cap;
    for (size_t i = 0; i < sh->map_cap; i++) {
      if (sh->map[i].slot != EMPTY_SLOT)
        *map_find(&grown, sh->map[i].key) = sh->map[i];
    }
    add_bytes(t, (int64_t)((new_map_cap - sh->map_cap) * sizeof *m));
    free(sh->map);
    sh->map = m;
    sh->map_cap = new_map_cap;
  }
  return 0;
}

/* How many ids at order positions [a, b) of shard sh have no row yet.
 * Lock held. */
static size_t count_new_locked(const embps_table_t *t, const shard_t *sh,
                               const embps_table_scratch_t *s,
                               const int64_t *ids, uint32_t a, uint32_t b) {
  size_t fresh = 0;
  for (uint32_t p = a; p < b; p++) {
    int64_t id = ids[s->order[p]];
    fresh += !is_padding(t, id) && !find_row(t, sh, id);
  }
  return fresh;
}

/* The row of id, materialised with initial weights and state if new.
 * Write lock held; room reserved. */
static float *materialise_locked(embps_table_t *t, shard_t *sh, int64_t id,
                                 uint64_t *created) {
  float *row;
  if (!t->spec.dynamic) {
    row = dense_row(t, id);
    if (dense_live(t, id))
      return row;
    embps_init_row(&t->spec, id, row);
    embps_optim_init_state(&t->optim, row + t->spec.dim, t->spec.dim);
    atomic_fetch_or_explicit(&t->live[(uint64_t)id >> 6],
                             1ULL << ((uint64_t)id & 63),
                             memory_order_relaxed);
  } else {
    map_entry_t *e = map_find(sh, id);
    if (e->slot != EMPTY_SLOT)
      return chunk_row(t, sh, e->slot);
    e->key = id;
    e->slot = (uint32_t)sh->n_rows++;
    row = chunk_row(t, sh, e->slot);
    embps_init_row(&t->spec, id, row);
    embps_optim_init_state(&t->optim, row + t->spec.dim, t->spec.dim);
  }
  (*created)++;
  return row;
}

int embps_table_apply(embps_table_t *t, embps_table_scratch_t *s,
                      const int64_t *ids, const float *g, size_t n,
                      uint64_t max_bytes) {
  int rc = group_by_shard(t, s, ids, n);
  if (rc)
    return rc;
  const uint32_t S = t->n_shards, dim = t->spec.dim;
  if (t->spec.dynamic) {
    for (uint32_t k = 0; k < S; k++) {
      uint32_t a = s->start[k], b = s->start[k + 1];
      if (a == b)
        continue;
      shard_t *sh = &t->shards[k];
      pthread_rwlock_wrlock(&sh->lock);
      /* room for every id is an upper bound; under a memory limit, count
       * the ids really new, so pushes to existing rows always pass */
      size_t more = max_bytes ? count_new_locked(t, sh, s, ids, a, b) : b - a;
      rc = reserve_locked(t, sh, more, max_bytes);
      pthread_rwlock_unlock(&sh->lock);
      if (rc)
        return rc;
    }
  } else if (max_bytes) {
    uint64_t fresh = 0;
    for (size_t i = 0; i < n; i++)
      fresh += !is_padding(t, ids[i]) && !dense_live(t, ids[i]);
    if (fresh &&
        embps_tables_total_bytes() + fresh * embps_table_row_bytes(t) >
            max_bytes)
      return EMBPS_ELIMIT;
  }
  uint64_t t_step = atomic_fetch_add(&t->step, 1) + 1;
  embps_optim_begin_step(&t->optim, t_step);
  uint64_t created_total = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : created_total) \
    if (n >= PARALLEL_MIN_ROWS && S > 1)
  for (uint32_t k = 0; k < S; k++) {
    uint32_t a = s->start[k], b = s->start[k + 1];
    if (a == b)
      continue;
    shard_t *sh = &t->shards[k];
    uint64_t created = 0;
    pthread_rwlock_wrlock(&sh->lock);
    for (uint32_t p = a; p < b; p++) {
      uint32_t i = s->order[p];
      if (is_padding(t, ids[i]))
        continue;
      float *row = materialise_locked(t, sh, ids[i], &created);
      embps_optim_apply(&t->optim, row, g + (size_t)i * dim, dim);
    }
    pthread_rwlock_unlock(&sh->lock);
    created_total += created;
  }
  atomic_fetch_add(&t->rows_allocated, created_total);
  if (!t->spec.dynamic)
    add_bytes(t, (int64_t)(created_total * embps_table_row_bytes(t)));
  atomic_fetch_add(&t->pushes, 1);
  return 0;
}
