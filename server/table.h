/* table.h - one embedding table inside a server: rows sharded by id hash
 * into n_shards shards, each behind its own writer-preferring
 * reader-writer lock. A push writes one shard at a time under its write
 * lock; a pull takes every shard's read lock, in shard order, and holds
 * them all while it reads its rows in request order. So pulls run
 * concurrently with each other and never see a torn row, but a pull does
 * not interleave with pushes: for pushes it is one table lock taken S
 * times. A push to a shard waits for the pulls holding it; a pull that
 * comes while a push waits for (or holds) a shard waits at that shard,
 * holding the shards before it.
 *
 * Two storages:
 *  - array: dense tables on a single server keep every row in one array
 *    reserved (not committed) with mmap, plus a bitmap of the rows a push
 *    has materialised;
 *  - hashed: dynamic tables, and dense tables of a cluster (whose ids are
 *    spread over the whole range by the cluster hash, so an array would get
 *    pages touched everywhere), keep per shard an open-addressing map to
 *    slots, and the rows by slot in chunks that never move (hstore.h).
 * Either way a pull of a row never pushed computes its initial value and
 * allocates nothing; the first push materialises the row with its initial
 * weights (rounded to the storage type) and optimizer state.
 *
 * Row record, 16-byte aligned, `row_bytes` long:
 *   [int64 id, hashed only] dim weights (f32/f16/bf16) [pad to 4]
 *   k x dim float32 optimizer state [pad to 16]
 * so row_bytes = round_up(8 h + round_up(w dim, 4) + 4 k dim, 16), with
 * w = 4/2/2 bytes per weight, k = 0 sgd, 1 adagrad, 2 adam and ftrl,
 * h = 1 for hashed storage.
 *
 * Three files implement this header (table_impl.h, private to them, holds
 * the table's layout and says which calls which): table.c the storage,
 * gather, push and write_rows; policy.c admission and eviction (policy.h);
 * table_io.c checkpoint snapshots and their restore, and export scans. */
#ifndef EMBPS_TABLE_H
#define EMBPS_TABLE_H
#include <stddef.h>
#include <stdint.h>

#include "embps/embps.h"

typedef struct embps_table embps_table_t;

/* Scratch for grouping a batch by shard and applying it; one per thread,
 * reused. */
typedef struct {
  uint32_t *order;      /* positions sorted by shard */
  uint32_t *shard;      /* shard of each position */
  unsigned char **rec;  /* apply: the record found at each order position */
  uint32_t *start;      /* n_shards + 1 bucket starts */
  uint32_t *fresh;      /* apply: new rows per shard */
  float *wide;          /* apply: a float32 row per OpenMP thread */
  float *check;         /* check_finite: a row and its state per thread */
  size_t check_floats;
  unsigned char *what;  /* apply, tables with a policy: fate of each position */
  uint32_t *slot;       /* ... and its slot */
  int raw;              /* restore: no admission, no expiry */
  int import;           /* write rows: no admission */
  size_t cap, shard_cap, wide_floats;
  /* The evictions a push's commit makes (tables with ttl or max_rows):
   * decided at prepare (policy.h), or given by a log record (replay, a
   * follower: embps_table_plan_given), never decided again. Shard k's
   * are plan_slot[plan_start[k] .. plan_start[k + 1]), its TTL reclaims
   * (the first plan_ttl[k]) then its capacity evictions. */
  uint32_t *plan_slot, *plan_start, *plan_ttl, *mark;
  size_t plan_cap, plan_n, mark_cap;
  int64_t *plan_ids; /* embps_table_planned's answer */
  size_t plan_ids_cap;
  int given; /* the next prepare plans nothing: plan_given follows */
} embps_table_scratch_t;

void embps_table_scratch_init(embps_table_scratch_t *s);
void embps_table_scratch_close(embps_table_scratch_t *s);

/* Creates an empty table for a checked spec on a server of a cluster of
 * cluster_size servers (0 or 1: a single server). A dense table of a
 * cluster (cluster_size > 1) holds only this server's share of the ids, so
 * it uses hashed storage; its semantics (ids in [0, rows)) do not change.
 * Returns 0, -ENOMEM. */
int embps_table_create(const embps_table_spec_t *spec, uint32_t n_shards,
                       uint32_t cluster_size, embps_table_t **out);
void embps_table_destroy(embps_table_t *t);

/* The spec. Its alterable fields (embps_table_alter_t) change under the
 * apply thread: other threads read those through embps_table_info. */
const embps_table_spec_t *embps_table_spec(const embps_table_t *t);
/* Takes the alterable hyperparameters (embps_table_alter_t's fields) of
 * spec, a checked spec of this table; the next commit uses them. Applying
 * thread only. */
void embps_table_alter(embps_table_t *t, const embps_table_spec_t *spec);
/* Spec plus counters. bytes_used is the memory the table holds: array
 * storage, materialised rows x row_bytes plus the bitmap; hashed storage,
 * the row chunks allocated plus the maps. */
void embps_table_info(embps_table_t *t, embps_table_info_t *out);
/* Bytes of one row record (the formula above). */
size_t embps_table_row_bytes(const embps_table_t *t);

/* Checks that every id may be used with this table and this server:
 * in range for dense tables, owned by cluster slot `index` of `size`.
 * Returns 0 or EMBPS_ERANGE / EMBPS_EWRONGSERVER with *bad = the position
 * of the first offending id. */
int embps_table_check_ids(const embps_table_t *t, const int64_t *ids,
                          size_t n, uint32_t cluster_size,
                          uint32_t cluster_index, size_t *bad);

/* Copies the weights of ids[i] into out[i*dim..] (checked ids). Padding
 * ids read as zeros, rows never pushed as their initial value. Returns
 * the LSN of the table's last change of rows (0: none). Each row is read
 * whole, but a change under way (a push's commit goes shard by shard)
 * may be seen in part. */
uint64_t embps_table_gather(embps_table_t *t, const int64_t *ids, size_t n,
                            float *out);
/* The same; with `whole`, the read never sees part of a change (commit,
 * write_rows, evict: it lets one under way finish first, and blocks the
 * next while it reads), so every row is the table's at one LSN: the one
 * returned, or any later one up to the table's next change. A follower's
 * reads (issue 21): they say the LSN they saw. */
uint64_t embps_table_gather_at(embps_table_t *t, const int64_t *ids,
                               size_t n, float *out, int whole);

/* Applies one optimizer step to n distinct, checked rows with merged
 * gradients g (n x dim). Padding ids are skipped. All memory the step
 * needs is reserved before any row changes, so a failure (-ENOMEM, or
 * EMBPS_ELIMIT past max_bytes; 0 = no limit) leaves the table unchanged.
 * Shards are updated in parallel (OpenMP) when the batch is large enough.
 * Only one thread may apply to a table at a time. */
int embps_table_apply(embps_table_t *t, embps_table_scratch_t *s,
                      const int64_t *ids, const float *g, size_t n,
                      uint64_t max_bytes);

/* The same in two steps, so a step can be logged in between (durable.c):
 * prepare groups the ids and reserves all memory (0, EMBPS_ELIMIT or
 * -ENOMEM; nothing changed either way); commit, with the same scratch, ids
 * and n, applies the step and cannot fail. lsn != 0 becomes the log
 * position of every shard it writes (set under the shard's write lock). */
int embps_table_prepare(embps_table_t *t, embps_table_scratch_t *s,
                        const int64_t *ids, size_t n, uint64_t max_bytes);
void embps_table_commit(embps_table_t *t, embps_table_scratch_t *s,
                        const int64_t *ids, const float *g, size_t n,
                        uint64_t lsn);
/* After embps_table_prepare (a table with eviction): the evictions its
 * commit will make, as row ids in *ids (scratch memory, valid until the
 * next prepare): *n_ttl TTL reclaims, then *n_cap capacity evictions.
 * Other tables: 0 and 0. 0 or -ENOMEM. */
int embps_table_planned(const embps_table_t *t, embps_table_scratch_t *s,
                        const int64_t **ids, uint32_t *n_ttl,
                        uint32_t *n_cap);
/* Replay of a push whose record carries its evictions: after
 * embps_table_prepare with s->given set, the commit evicts exactly these
 * rows (ttl[n_ttl] as TTL reclaims, cap[n_cap] as capacity evictions:
 * rows this table holds, not of the push) and decides nothing. 0,
 * EMBPS_EINVAL (*bad: an id without a row here) or -ENOMEM. */
int embps_table_plan_given(embps_table_t *t, embps_table_scratch_t *s,
                           const int64_t *ttl, size_t n_ttl,
                           const int64_t *cap, size_t n_cap, int64_t *bad);
/* After prepare, before commit: whether commit would leave every value it
 * writes finite (weights rounded to the table's dtype, and the optimizer
 * state). Proved from bounds when the table's values and the gradients
 * are moderate (g_small: every |g| is within EMBPS_TABLE_G_SCREEN, as
 * embps_merge_rows_checked tells; table.c, "envelope"), else each row the
 * push updates is updated in a scratch copy, nothing written. 0,
 * EMBPS_ENONFINITE with *bad the position in ids of the first row that
 * would not be, or -ENOMEM. */
int embps_table_check_finite(const embps_table_t *t, embps_table_scratch_t *s,
                             const int64_t *ids, const float *g, size_t n,
                             int g_small, size_t *bad);
#define EMBPS_TABLE_G_SCREEN 0x1p20f
/* Replay: the table's step counter (the next commit makes it step + 1). */
void embps_table_set_step(embps_table_t *t, uint64_t step);
/* A number naming this table's life across restarts (its CREATE's LSN). */
uint64_t embps_table_incarnation(const embps_table_t *t);
void embps_table_set_incarnation(embps_table_t *t, uint64_t incarnation);
/* The table's rows are its state at lsn (a follower's copy of its primary
 * going in, copy.h): the LSN the next gather returns, until a change. */
void embps_table_set_lsn(embps_table_t *t, uint64_t lsn);
uint32_t embps_table_n_shards(const embps_table_t *t);

/* Checkpoints. A file record is the hashed record whatever the storage:
 * int64 id, weights, zeros to 4 bytes, float32 state, zeros to 16 bytes;
 * this is its size. */
size_t embps_table_file_record_bytes(const embps_table_t *t);
/* A shard's snapshot: its file records in blocks of `per` records (every
 * block full but the last), each block a malloc'd buffer with `room` bytes
 * free in front of its records, for whoever takes it (a checkpoint sink may
 * send it as it is). The caller sets per and room, takes or frees each
 * buf[i] (i < n), and reuses the struct shard after shard; release the
 * arrays with embps_table_blocks_close. */
typedef struct {
  size_t per, room;
  unsigned char **buf; /* n blocks holding rows[i] records each */
  size_t *rows;
  size_t n, cap;
} embps_table_blocks_t;

void embps_table_blocks_close(embps_table_blocks_t *b);
/* Copies the rows of shard k as file records into b (emptied first: its
 * earlier blocks must have been taken), under the shard's read lock, with
 * the shard's log position in *lsn; state != NULL: the shard's admission
 * and eviction state too, under the same lock, into *state (malloc'd;
 * NULL and 0 for a table without a policy): each record's recency and
 * pushes, in the order of the records (least recently pushed first), and
 * the admission sketch. The blocks are allocated, and their pages touched,
 * before the lock, from the shard's share of the rows. *held_ns = how long
 * the lock was held. Pulls go on until a push to that shard comes: the
 * push waits for the copy, and pulls that come after it wait for the push.
 * 0, -ENOMEM. */
int embps_table_snapshot_shard(embps_table_t *t, uint32_t k,
                               embps_table_blocks_t *b, uint64_t *lsn,
                               unsigned char **state, size_t *state_bytes,
                               uint64_t *held_ns);
/* Restore of that state, of checkpoint format `format` (2: no counters,
 * the sketch in its old layout; 3): the counters of file shard file_k
 * (added to the table's) and its admission sketch (into the same shard,
 * or merged into the shards of another shard count, admit.h; a format-2
 * sketch only into the same shard count: counts start again otherwise);
 * and, after embps_table_restore of records first..first+n-1 of the
 * section (ids), their recency and pushes. 0, -ENOMEM or EMBPS_EPROTO (the
 * state's size does not match its header). Applying thread only. */
int embps_table_restore_state(embps_table_t *t, uint32_t format,
                              uint32_t file_k, uint32_t file_shards,
                              const unsigned char *state, size_t bytes);
int embps_table_restore_meta(embps_table_t *t, uint32_t format,
                             const unsigned char *state, size_t bytes,
                             const int64_t *ids, size_t first, size_t n);
/* Inserts (or overwrites) n file records, by id, into a table of any shard
 * count; ids is scratch for n ids. Applying thread only. 0, EMBPS_ERANGE
 * (an id outside a dense table), -ENOMEM. */
int embps_table_restore(embps_table_t *t, embps_table_scratch_t *s,
                        const unsigned char *recs, size_t n, int64_t *ids);

/* Export: copies up to max_rows rows from *cursor on (0: the start; the
 * cursor names a shard and a position in it) into ids[i], w[i*dim..]
 * (float32, widened) and, unless state is NULL, state[i*k*dim..] (the k
 * optimizer slots of the row in turn), holding one shard's read lock at a
 * time. *cursor = where the next call goes on; *done = 1 when no row is
 * left. A table being pushed to is read shard by shard: each row is one a
 * push left whole. Rows are visited in storage order, so rows a push
 * creates in a shard already passed are not seen. 0, or EMBPS_EINVAL for
 * a cursor this table never gave. */
int embps_table_scan(embps_table_t *t, uint64_t *cursor, size_t max_rows,
                     int64_t *ids, float *w, float *state, size_t *n,
                     int *done);
/* embps_table_prepare for embps_table_write_rows: every row not stored is
 * made, whatever admission says (an import is not a push; a restore does
 * the same), so room is reserved for all of them. */
int embps_table_prepare_rows(embps_table_t *t, embps_table_scratch_t *s,
                             const int64_t *ids, size_t n,
                             uint64_t max_bytes);
/* Import: after embps_table_prepare_rows with the same scratch, ids and n,
 * sets those distinct, checked rows to weights w (n x dim float32, rounded
 * to the storage type) and optimizer state (n x k x dim float32; NULL: the
 * initial state). Cannot fail; padding ids are skipped. lsn as in
 * embps_table_commit. step: NULL, the step counter is not changed; else it
 * is set to *step first. For TTL and LRU/LFU each row written counts as
 * pushed at the (new) step: a row that had expired is fresh again. */
void embps_table_write_rows(embps_table_t *t, embps_table_scratch_t *s,
                            const int64_t *ids, const float *w,
                            const float *state, uint64_t lsn,
                            const uint64_t *step);
/* Admission and eviction (issue 12; policy.h says how they decide).
 * Whether id has a row now (pushed, admitted, not evicted or expired): the
 * one test of row liveness, for readers outside the table. */
int embps_table_row_live(embps_table_t *t, int64_t id);
/* Evicts every expired row and, if l2_below > 0, every row whose weights'
 * L2 norm is below it, a batch of rows per write-lock hold; lsn != 0
 * becomes every shard's log position. Replay passes the snapshot LSN of
 * each shard (same shard count) in shard_lsn: shards whose snapshot
 * covers lsn are skipped. Applying thread only; cannot fail. *evicted =
 * rows evicted. */
void embps_table_evict(embps_table_t *t, double l2_below, uint64_t lsn,
                       const uint64_t *shard_lsn, uint64_t *evicted);

/* Bytes used by all tables of the process (for --max-memory). */
uint64_t embps_tables_total_bytes(void);
/* Bytes a table of this spec takes as soon as it is created (what counts
 * against --max-memory before any row exists). */
uint64_t embps_table_fixed_bytes(const embps_table_spec_t *spec,
                                 uint32_t cluster_size);

/* Table reference counts, for the registry: a table lives while referenced. */
void embps_table_ref(embps_table_t *t);
void embps_table_unref(embps_table_t *t);
#endif
