/* policy.c - admission and eviction bookkeeping of a table's shards (see
 * policy.h for what is decided, table_impl.h for the locks).
 *
 * A table with eviction (ttl, max_rows or l2) keeps a row_meta_t per slot
 * of each shard: the row's id, last push step and push count, its links in
 * the shard's recency list (slot + 1, 0: none; least recently pushed at the
 * head) and, for LFU capacity eviction, its place in the shard's min-heap
 * of slots. A table with admit_after > 1 keeps an admission sketch per
 * shard (admit.h). Pulls read the meta (a row's last step, for ttl) under
 * the read lock; everything else here runs on the applying thread. */
#include "policy.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define SKETCH_DEFAULT_BYTES (1u << 20) /* --admit-sketch-bytes 0 */
#define LIST_NONE 0u
#define SWEEP_MIN 8u /* expired rows reclaimed per push and shard, at least */
#define EVICT_BATCH 4096u /* rows embps_table_evict examines per lock hold */

/* ------------------------------------------------------------ set-up */

size_t embps_policy_sketch_bytes(const embps_table_spec_t *spec) {
  return (size_t)(spec->admit_sketch_bytes ? spec->admit_sketch_bytes
                                           : SKETCH_DEFAULT_BYTES);
}

int embps_policy_setup(embps_table_t *t, uint32_t cluster_size,
                       int64_t *added) {
  const embps_table_spec_t *sp = &t->spec;
  const uint64_t servers = cluster_size > 1 ? cluster_size : 1;
  *added = 0;
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
    if (embps_sketch_init(&t->shards[k].sketch, embps_policy_sketch_bytes(sp),
                          sp->seed, k, t->n_shards))
      return -ENOMEM;
    *added += (int64_t)embps_sketch_bytes(&t->shards[k].sketch);
  }
  return 0;
}

void embps_policy_shard_close(shard_t *sh) {
  free(sh->meta);
  free(sh->heap);
  embps_sketch_free(&sh->sketch);
}

static inline int uses_heap(const embps_table_t *t) {
  return t->spec.max_rows && t->spec.evict == EMBPS_EVICT_LFU;
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
  return sizeof(row_meta_t) + (uses_heap(t) ? sizeof(uint32_t) : 0);
}

uint64_t embps_policy_growth_bytes(const embps_table_t *t, const shard_t *sh,
                                   uint32_t rows) {
  if (!t->has_meta || rows <= sh->meta_cap)
    return 0;
  return (uint64_t)(meta_cap_for(sh->meta_cap, rows) - sh->meta_cap) *
         meta_slot_bytes(t);
}

int embps_policy_grow(embps_table_t *t, shard_t *sh, uint32_t rows,
                      int64_t *added) {
  *added = 0;
  if (!t->has_meta || rows <= sh->meta_cap)
    return 0;
  const uint32_t cap = meta_cap_for(sh->meta_cap, rows);
  row_meta_t *m = malloc((size_t)cap * sizeof *m);
  if (!m)
    return -ENOMEM;
  if (uses_heap(t)) {
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
  *added = (int64_t)((cap - sh->meta_cap) * meta_slot_bytes(t));
  sh->meta_cap = cap;
  return 0;
}

/* ------------------------------------------------- recency list, LFU heap */

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

/* ------------------------------------------------------------ rows */

void embps_policy_on_insert_locked(const embps_table_t *t, shard_t *sh,
                                   uint32_t slot, int64_t id, uint64_t step) {
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

void embps_policy_on_push_locked(const embps_table_t *t, shard_t *sh,
                                 uint32_t slot, uint64_t step, int restart) {
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

void embps_policy_set_row_locked(const embps_table_t *t, shard_t *sh,
                                 uint32_t slot, uint64_t last_step,
                                 uint32_t freq) {
  row_meta_t *m = meta_of(sh, slot);
  m->last_step = last_step;
  m->freq = freq ? freq : 1;
  if (uses_heap(t)) {
    heap_up(sh, m->heap);
    heap_down(sh, m->heap);
  }
}

void embps_policy_evict_slot_locked(const embps_table_t *t, shard_t *sh,
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

/* ------------------------------------------------------------ pushes */

/* Whether a push admits id, which has no row (or an expired one). */
static int admits(const embps_table_t *t, const shard_t *sh, int64_t id) {
  const embps_table_spec_t *sp = &t->spec;
  if (sp->admit_probability != 0 &&
      !embps_admit_by_hash(sp->seed, id, sp->admit_probability))
    return 0;
  return !t->admit_count ||
         embps_sketch_estimate(&sh->sketch, id) + 1 >= sp->admit_after;
}

uint32_t embps_policy_find_shard(const embps_table_t *t,
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

void embps_policy_count_pending_locked(shard_t *sh, int64_t id,
                                       dyn_count_t *c) {
  const uint64_t adds = sh->sketch.adds;
  if (embps_sketch_add(&sh->sketch, id) == 0)
    c->pending++;
  if (sh->sketch.adds < adds) { /* aged: every count halved */
    int64_t now = (int64_t)sh->cnt[CNT_PENDING] + c->pending;
    c->pending -= (now > 0 ? now : 0) / 2;
  }
}

/* ------------------------------------------------- evictions after a push
 *
 * A push's evictions are decided before the push changes anything (at
 * prepare: they go into its log record, and a replay or a follower
 * applies them as recorded), as if decided right after it: the push's
 * rows move to the tail of the recency list with the push's step (or
 * leave it: W_DROP), new rows join them there, and from the head of what
 * precedes them (the list without the push's rows, in its order) come
 * the expired rows reclaimed, at most SWEEP_MIN + 2 x the push's positions
 * in the shard, up to the first that has not expired; then, while the
 * shard holds more than its capacity, LRU takes the next rows of that
 * list, LFU the rows of fewest pushes (then oldest, then smallest id)
 * among those not of the push, by a best-first walk of its heap. A row
 * last pushed at the push's own step is never taken (a push's rows). */

/* The set of slots of a push's shard (and those planned already): open
 * addressing on slot + 1 in s->mark, sized for n at most half full. */
static int mark_reset(embps_table_scratch_t *s, size_t n) {
  size_t cap = 16;
  while (cap < 2 * n + 2)
    cap *= 2;
  if (cap > s->mark_cap) {
    uint32_t *m = malloc(cap * sizeof *m);
    if (!m)
      return -ENOMEM;
    free(s->mark);
    s->mark = m;
    s->mark_cap = cap;
  }
  memset(s->mark, 0, s->mark_cap * sizeof *s->mark);
  return 0;
}

static inline size_t mark_home(const embps_table_scratch_t *s, uint32_t slot) {
  return (size_t)((slot * 2654435761u) & (uint32_t)(s->mark_cap - 1));
}

static void mark_add(embps_table_scratch_t *s, uint32_t slot) {
  size_t i = mark_home(s, slot);
  while (s->mark[i] && s->mark[i] != slot + 1)
    i = (i + 1) & (s->mark_cap - 1);
  s->mark[i] = slot + 1;
}

static int marked(const embps_table_scratch_t *s, uint32_t slot) {
  for (size_t i = mark_home(s, slot); s->mark[i];
       i = (i + 1) & (s->mark_cap - 1))
    if (s->mark[i] == slot + 1)
      return 1;
  return 0;
}

/* Appends slot to s's plan. 0 or -ENOMEM. */
static int plan_add(embps_table_scratch_t *s, uint32_t slot) {
  if (s->plan_n == s->plan_cap) {
    size_t cap = s->plan_cap ? 2 * s->plan_cap : 256;
    uint32_t *v = realloc(s->plan_slot, cap * sizeof *v);
    if (!v)
      return -ENOMEM;
    s->plan_slot = v;
    s->plan_cap = cap;
  }
  s->plan_slot[s->plan_n++] = slot;
  return 0;
}

/* LFU: appends the `excess` least-used rows of sh not marked (nor pushed
 * at `now`) to s's plan, by a best-first walk of the heap from its root
 * (a min-heap's k smallest: each taken or skipped node opens its two
 * children). 0 or -ENOMEM. */
static int plan_lfu(const shard_t *sh, embps_table_scratch_t *s,
                    uint64_t excess, uint64_t now) {
  uint32_t *open = NULL; /* heap positions, a min-heap by their slots */
  size_t n = 0, cap = 0;
  int rc = 0;
#define LESS_(a, b) lfu_less(sh, sh->heap[open[a]], sh->heap[open[b]])
#define SWAP_(a, b)                                                            \
  do {                                                                         \
    uint32_t t_ = open[a];                                                     \
    open[a] = open[b];                                                         \
    open[b] = t_;                                                              \
  } while (0)
#define PUSH_(pos)                                                             \
  do {                                                                         \
    if (n == cap) {                                                            \
      size_t c_ = cap ? 2 * cap : 64;                                          \
      uint32_t *v_ = realloc(open, c_ * sizeof *v_);                           \
      if (!v_) {                                                               \
        rc = -ENOMEM;                                                          \
        goto out;                                                              \
      }                                                                        \
      open = v_;                                                               \
      cap = c_;                                                                \
    }                                                                          \
    size_t i_ = n++;                                                           \
    open[i_] = (pos);                                                          \
    while (i_ && LESS_(i_, (i_ - 1) / 2)) {                                    \
      SWAP_(i_, (i_ - 1) / 2);                                                 \
      i_ = (i_ - 1) / 2;                                                       \
    }                                                                          \
  } while (0)
  if (sh->heap_n)
    PUSH_(0);
  while (excess && n) {
    uint32_t pos = open[0];
    open[0] = open[--n];
    for (size_t i = 0;;) { /* sift down */
      size_t c = 2 * i + 1;
      if (c >= n)
        break;
      if (c + 1 < n && LESS_(c + 1, c))
        c++;
      if (!LESS_(c, i))
        break;
      SWAP_(c, i);
      i = c;
    }
    if (2 * pos + 1 < sh->heap_n)
      PUSH_(2 * pos + 1);
    if (2 * pos + 2 < sh->heap_n)
      PUSH_(2 * pos + 2);
    const uint32_t slot = sh->heap[pos];
    if (marked(s, slot) || sh->meta[slot].last_step == now)
      continue;
    if ((rc = plan_add(s, slot)))
      goto out;
    excess--;
  }
out:
#undef LESS_
#undef SWAP_
#undef PUSH_
  free(open);
  return rc;
}

int embps_policy_plan_shard(const embps_table_t *t, embps_table_scratch_t *s,
                            uint32_t k, uint64_t now) {
  const shard_t *sh = &t->shards[k];
  const uint32_t a = s->start[k], b = s->start[k + 1];
  s->plan_start[k] = (uint32_t)s->plan_n;
  s->plan_ttl[k] = 0;
  if (!t->has_meta || a == b || (!t->spec.ttl_steps && !t->cap_shard))
    return 0;
  uint32_t cursor = sh->lru_head, budget = SWEEP_MIN + 2 * (b - a);
  int rc = mark_reset(s, (size_t)(b - a) + budget); /* the push, the swept */
  if (rc)
    return rc;
  uint64_t live = embps_hstore_n_live(&sh->hs);
  for (uint32_t p = a; p < b; p++) {
    if (s->what[p] == W_LIVE || s->what[p] == W_RESET || s->what[p] == W_DROP)
      mark_add(s, s->slot[p]);
    live += s->what[p] == W_NEW;
    live -= s->what[p] == W_DROP;
  }
  while (t->spec.ttl_steps && cursor && budget) {
    const uint32_t slot = cursor - 1;
    cursor = sh->meta[slot].next;
    if (marked(s, slot))
      continue;
    if (!expired_at(t, sh->meta[slot].last_step, now)) {
      cursor = slot + 1; /* the first that stays: the head after */
      break;
    }
    if ((rc = plan_add(s, slot)))
      return rc;
    mark_add(s, slot);
    s->plan_ttl[k]++;
    live--;
    budget--;
  }
  if (!t->cap_shard || live <= t->cap_shard)
    return 0;
  uint64_t excess = live - t->cap_shard;
  if (uses_heap(t))
    return plan_lfu(sh, s, excess, now);
  while (excess && cursor) {
    const uint32_t slot = cursor - 1;
    cursor = sh->meta[slot].next;
    if (marked(s, slot))
      continue;
    if (sh->meta[slot].last_step == now)
      break;
    if ((rc = plan_add(s, slot)))
      return rc;
    excess--;
  }
  return 0;
}

void embps_policy_evict_planned_locked(embps_table_t *t, shard_t *sh,
                                       const embps_table_scratch_t *s,
                                       uint32_t k, dyn_count_t *c) {
  const uint32_t a = s->plan_start[k], b = s->plan_start[k + 1];
  if (a == b)
    return;
  const uint64_t t0 = embps_now_ns();
  for (uint32_t i = a; i < b; i++) {
    embps_policy_evict_slot_locked(t, sh, s->plan_slot[i]);
    c->evicted[i - a < s->plan_ttl[k] ? WHY_TTL : WHY_CAP]++;
  }
  embps_policy_note_stall(t, embps_now_ns() - t0);
}

void embps_policy_note_stall(embps_table_t *t, uint64_t ns) {
  uint64_t old = atomic_load(&t->stall_ns);
  while (ns > old && !atomic_compare_exchange_weak(&t->stall_ns, &old, ns))
    ;
}

void embps_policy_add_counts_locked(embps_table_t *t, shard_t *sh,
                                    dyn_count_t *c) {
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

/* ---------------------------------- embps_table_evict, _row_live (table.h) */

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

void embps_table_evict(embps_table_t *t, double l2_below, uint64_t lsn,
                       const uint64_t *shard_lsn, uint64_t *evicted) {
  *evicted = 0;
  if (!t->has_meta)
    return;
  const uint64_t now = atomic_load(&t->step);
  const double below2 = l2_below * l2_below;
  change_begin(t);
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
      uint64_t t0 = embps_now_ns();
      dyn_count_t c = {0};
      pthread_rwlock_wrlock(&sh->lock);
      for (uint32_t n = 0; next && n < EVICT_BATCH; n++) {
        uint32_t slot = next - 1;
        next = sh->meta[slot].next;
        if (expired_at(t, sh->meta[slot].last_step, now)) {
          embps_policy_evict_slot_locked(t, sh, slot);
          c.evicted[WHY_TTL]++;
        } else if (l2_below > 0 &&
                   rec_norm2(t, embps_hstore_rec(&sh->hs, slot)) < below2) {
          embps_policy_evict_slot_locked(t, sh, slot);
          c.evicted[WHY_L2]++;
        }
      }
      embps_policy_add_counts_locked(t, sh, &c);
      pthread_rwlock_unlock(&sh->lock);
      embps_policy_note_stall(t, embps_now_ns() - t0);
      *evicted += c.evicted[WHY_TTL] + c.evicted[WHY_L2];
    }
  }
  change_end(t, lsn);
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
