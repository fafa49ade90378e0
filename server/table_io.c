/* table_io.c - a table's rows in bulk, in and out (table.h): checkpoint
 * snapshots of a shard and their restore, export scans.
 *
 * A snapshot copies one shard under its read lock into file records (the
 * hashed record whatever the storage: id, weights, state; table.h) and,
 * for a table with admission or eviction, the shard's policy state (the
 * format below: counters, each row's last step and pushes, the sketch).
 * Rows of a table with eviction are copied least recently pushed first,
 * so a restore that replays them in file order rebuilds the recency list
 * as it was. A restore writes the records back through table.c's
 * embps_table_place_rows (any shard count), then the policy state. An
 * export scan widens rows to float32 shard by shard, one read lock at a
 * time, from a cursor naming a shard and a position in it. */
#include "table.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "route.h"
#include "table_impl.h"
#include "util.h"

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

/* Where a memory record's parts go in a file record: computed once per
 * shard copy, not per row. */
typedef struct {
  size_t fr;       /* file record bytes */
  size_t w_bytes;  /* stored weights */
  size_t state_at; /* the state's offset in the file record */
  size_t state;    /* its bytes */
  int joined;      /* no pad between weights and state: one copy */
} rec_layout_t;

static void rec_layout(const embps_table_t *t, rec_layout_t *l) {
  l->fr = embps_table_file_record_bytes(t);
  l->w_bytes = t->w_bytes;
  l->state = body_bytes(t) - (t->state_off - t->w_off);
  l->state_at = ID_BYTES + (t->state_off - t->w_off);
  l->joined = t->state_off == t->w_off + t->w_bytes;
}

/* Writes the file record of id from the memory record rec into out. */
static void to_file_record(const embps_table_t *t, const rec_layout_t *l,
                           int64_t id, const unsigned char *rec,
                           unsigned char *out) {
  memcpy(out, &id, sizeof id);
  if (l->joined) {
    memcpy(out + ID_BYTES, rec + t->w_off, l->w_bytes + l->state);
  } else {
    memcpy(out + ID_BYTES, rec + t->w_off, l->w_bytes);
    memset(out + ID_BYTES + l->w_bytes, 0, l->state_at - ID_BYTES -
                                               l->w_bytes);
    memcpy(out + l->state_at, rec + t->state_off, l->state);
  }
  memset(out + l->state_at + l->state, 0, l->fr - l->state_at - l->state);
}

/* Called for each row a shard walk visits; non-zero stops the walk. */
typedef int (*visit_fn)(void *ctx, const embps_table_t *t, int64_t id,
                        const unsigned char *rec);

#define WALK_BATCH 64 /* array storage: ids found before their rows' visits */
#define WALK_AHEAD 8  /* rows whose loads are under way during a visit */

/* Starts loading the record of id (array storage), all of its lines. */
static inline __attribute__((always_inline)) void
prefetch_row(const embps_table_t *t, int64_t id) {
  const unsigned char *rec = array_rec(t, id);
  for (uint32_t off = 0; off < t->row_bytes; off += 64)
    __builtin_prefetch(rec + off);
}

/* Visits ids[0..n) (array storage), each row's loads started WALK_AHEAD
 * visits ahead: a shard's rows lie scattered over the array, one every
 * n_shards on average, and a copy that waits for each row in turn runs at
 * the memory's latency. Returns visit's first non-zero result, or 0. */
static int visit_batch(const embps_table_t *t, const int64_t *ids, size_t n,
                       visit_fn visit, void *ctx) {
  for (size_t i = 0; i < n && i < WALK_AHEAD; i++)
    prefetch_row(t, ids[i]);
  for (size_t i = 0; i < n; i++) {
    if (i + WALK_AHEAD < n)
      prefetch_row(t, ids[i + WALK_AHEAD]);
    int rc = visit(ctx, t, ids[i], array_rec(t, ids[i]));
    if (rc)
      return rc;
  }
  return 0;
}

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
  /* the shard's ids from the bitmap, a batch at a time, then their rows */
  int64_t batch[WALK_BATCH];
  size_t n = 0;
  int end = 1, rc;
  for (uint64_t w = *pos >> 6; w < t->live_words; w++) {
    if (max_words-- == 0) {
      *pos = w << 6;
      end = 0;
      goto out;
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
        end = 0;
        goto out;
      }
      batch[n++] = id;
      if (n == WALK_BATCH) {
        if ((rc = visit_batch(t, batch, n, visit, ctx)))
          return rc;
        n = 0;
      }
    }
  }
  *pos = (uint64_t)t->live_words << 6;
out:
  rc = visit_batch(t, batch, n, visit, ctx);
  return rc ? rc : end;
}

void embps_table_blocks_close(embps_table_blocks_t *b) {
  for (size_t i = 0; i < b->n; i++)
    free(b->buf[i]);
  free(b->buf);
  free(b->rows);
  b->buf = NULL;
  b->rows = NULL;
  b->n = b->cap = 0;
}

/* Adds an empty block of t's records to b (its pages touched when
 * `touch`). 0 or -ENOMEM. */
static int block_add(const embps_table_t *t, embps_table_blocks_t *b,
                     int touch) {
  if (b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 16;
    unsigned char **buf = realloc(b->buf, cap * sizeof *buf);
    if (buf)
      b->buf = buf;
    size_t *rows = buf ? realloc(b->rows, cap * sizeof *rows) : NULL;
    if (!rows)
      return -ENOMEM;
    b->rows = rows;
    b->cap = cap;
  }
  const size_t bytes = b->room + b->per * embps_table_file_record_bytes(t);
  unsigned char *p = malloc(bytes);
  if (!p)
    return -ENOMEM;
  for (size_t i = 0; touch && i < bytes; i += 4096)
    p[i] = 0; /* fault it in now, not during the copy under the lock */
  b->buf[b->n] = p;
  b->rows[b->n++] = 0;
  return 0;
}

typedef struct {
  embps_table_blocks_t *b;
  size_t used; /* blocks written to (the others: spares) */
  rec_layout_t l;
} blocks_fill_t;

/* visit_fn: appends one file record to the blocks (-ENOMEM). */
static int block_push(void *ctx, const embps_table_t *t, int64_t id,
                      const unsigned char *rec) {
  blocks_fill_t *f = ctx;
  embps_table_blocks_t *b = f->b;
  if (!f->used || b->rows[f->used - 1] == b->per) {
    if (f->used == b->n && block_add(t, b, 0)) /* no spare left */
      return -ENOMEM;
    f->used++;
  }
  to_file_record(t, &f->l, id, rec,
                 b->buf[f->used - 1] + b->room +
                     b->rows[f->used - 1] * f->l.fr);
  b->rows[f->used - 1]++;
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
  unsigned char *b = calloc(1, len);
  if (!b)
    return -ENOMEM;
  unsigned char *p = b + STATE_HEAD;
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

int embps_table_snapshot_shard(embps_table_t *t, uint32_t k,
                               embps_table_blocks_t *b, uint64_t *lsn,
                               unsigned char **state, size_t *state_bytes,
                               uint64_t *held_ns) {
  shard_t *sh = &t->shards[k];
  for (size_t i = 0; i < b->n; i++)
    free(b->buf[i]); /* none, when the caller took them */
  b->n = 0;
  /* sized before the lock from the shard's share of the rows, plus slack,
   * so the copy under the lock rarely allocates */
  size_t want = atomic_load(&t->rows_allocated) / t->n_shards;
  want += want / 8 + 64;
  int rc = 0;
  for (size_t i = 0; !rc && i < (want + b->per - 1) / b->per; i++)
    rc = block_add(t, b, 1);
  blocks_fill_t f = {b, 0, {0}};
  rec_layout(t, &f.l);
  uint64_t pos = 0;
  pthread_rwlock_rdlock(&sh->lock);
  const uint64_t t0 = embps_now_ns();
  if (!rc && state)
    rc = snap_state(t, sh, state, state_bytes);
  if (!rc && t->has_meta) /* live rows, least recently pushed first */
    for (uint32_t next = sh->lru_head; !rc && next;
         next = sh->meta[next - 1].next)
      rc = block_push(&f, t, sh->meta[next - 1].id,
                      embps_hstore_rec(&sh->hs, next - 1));
  else if (!rc)
    rc = visit_shard_locked(t, k, &pos, SIZE_MAX, SIZE_MAX, block_push, &f);
  *lsn = sh->lsn;
  *held_ns = embps_now_ns() - t0;
  pthread_rwlock_unlock(&sh->lock);
  for (size_t i = f.used; i < b->n; i++) /* spares */
    free(b->buf[i]);
  b->n = f.used;
  if (rc < 0 && state) {
    free(*state);
    *state = NULL;
  }
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


/* ------------------------------------------------------------ restore */

typedef struct {
  const unsigned char *recs;
  size_t fr, body;
} recs_src_t;

/* embps_table_fill_fn: the body of a file record, as it is. */
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
  embps_table_place_rows(t, s, ids, 0, atomic_load(&t->step), fill_record,
                         &src);
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
  uint64_t w = embps_policy_sketch_bytes(&t->spec) / n_shards /
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
    embps_table_add_bytes(t, (int64_t)embps_sketch_bytes(&s) -
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
  embps_policy_add_counts_locked(t, sh, &c);
  pthread_rwlock_unlock(&sh->lock);
  /* not rows evicted now: restore counts the rows it makes */
  atomic_fetch_add(&t->rows_allocated, c.evicted[0] + c.evicted[1] +
                                           c.evicted[2]);
  embps_policy_note_stall(t, h.stall_ns);
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
      uint64_t last_step;
      uint32_t freq;
      memcpy(&last_step, p, 8);
      memcpy(&freq, p + 8, 4);
      embps_policy_set_row_locked(t, sh, slot, last_step, freq);
    }
    pthread_rwlock_unlock(&sh->lock);
  }
  return 0;
}
