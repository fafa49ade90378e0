/* redo.h - the log's records: their payloads, and applying one of them to
 * the tables. durable.c writes the records; restore replays the log
 * through embps_redo_apply, and a follower (issue 21) applies the records
 * it is shipped with the same code.
 *
 * Payloads (little-endian; the record types are wal.h's):
 *   PUSH   u64 incarnation, u64 step after the push, u32 pairs, u32 rows,
 *          u32 dim, u32 flags, pairs x {u64 client, u64 seq}, rows x int64
 *          id, rows x dim x float32 (the merged gradient, sync: averaged);
 *          with flags & EVICTIONS (every push to a table with ttl_steps or
 *          max_rows, since log format 2): u32 n_ttl, u32 n_cap, then
 *          n_ttl + n_cap int64 ids, the rows the push's commit evicted
 *          (TTL reclaims, then capacity), evicted again exactly so.
 *          Without the flag (older logs) the replay decides them again.
 *   CREATE u64 incarnation, packed TableSpec
 *   ALTER  u64 incarnation, packed TableSpec (the spec after the alter)
 *   DROP   u64 incarnation
 *   ROWS   u64 incarnation, u64 step, u32 flags (1: set the step), u32 rows,
 *          u32 dim, u32 state slots k (0: initial state), rows x int64 id,
 *          rows x dim x float32 weights, rows x k x dim x float32 state
 *   EVICT  u64 incarnation, u64 the table's step
 *
 * A record names its table by incarnation (the LSN of its CREATE), so a
 * table dropped and created again under its name is another table. The
 * tables a redo knows are those of the checkpoint it starts from
 * (embps_redo_add_table) and those its CREATE records make. A record
 * changes a row only when its LSN is above its shard's snapshot LSN in
 * that checkpoint: a shard copied after the record already holds it. */
#ifndef EMBPS_REDO_H
#define EMBPS_REDO_H
#include <stddef.h>
#include <stdint.h>

#include "registry.h"
#include "seen.h"
#include "table.h"
#include "wal.h"

#define EMBPS_REDO_PUSH_HEAD 32
#define EMBPS_REDO_PUSH_EVICTIONS 1u
#define EMBPS_REDO_ROWS_HEAD 32
#define EMBPS_REDO_ROWS_SET_STEP 1u

struct embps_server;

typedef struct {
  embps_table_t *table; /* NULL once dropped */
  uint64_t incarnation;
  uint32_t file_shards; /* 0: created after the checkpoint */
  const uint64_t *shard_lsn;
} embps_redo_table_t;

typedef struct {
  struct embps_server *srv; /* its shards and cluster */
  embps_registry_t *registry; /* the tables CREATE and DROP records change */
  embps_seen_t *seen;       /* gets the (client, seq) pairs of pushes */
  embps_redo_table_t *v;
  size_t n, cap;
  embps_table_scratch_t scratch;
  int64_t *ids; /* the rows of one record a shard does not hold yet */
  float *g;
  size_t rows_cap, floats_cap; /* of ids and g: rows x floats a row */
} embps_redo_t;

/* Applies records to the tables of registry (srv's, or a follower's
 * copy being made: follow.c) for a server of srv's shards and cluster
 * slot, recording the exactly-once pairs of pushes in seen. The applying
 * thread only. */
void embps_redo_init(embps_redo_t *r, struct embps_server *srv,
                     embps_registry_t *registry, embps_seen_t *seen);
void embps_redo_close(embps_redo_t *r);
/* A table restored from a checkpoint (in the registry already): records of
 * incarnation apply to it, a row only when their LSN is above
 * shard_lsn[its shard of file_shards] (kept by the caller until close).
 * 0, or -1 out of memory. */
int embps_redo_add_table(embps_redo_t *r, embps_table_t *t,
                         uint64_t incarnation, uint32_t file_shards,
                         const uint64_t *shard_lsn);
/* Applies one record (the next LSN after the last one applied). 0, or -1
 * with err: the record does not decode, names a table that does not
 * exist, holds ids this server cannot hold, or memory ran out. */
int embps_redo_apply(embps_redo_t *r, const embps_wal_rec_t *rec, char *err,
                     size_t err_len);
#endif
