/* table.h - one embedding table inside a server: rows sharded by id hash
 * into n_shards shards, each behind its own reader-writer lock, so pulls
 * read concurrently with each other and with pushes to other shards, and a
 * pull never sees a torn row. No lock covers the whole table.
 *
 * Dense tables (rows = N) keep every row in one array reserved (not
 * committed) with mmap, plus a bitmap of the rows a push has materialised.
 * Dynamic tables keep, per shard, an open-addressing map id -> slot and the
 * rows in fixed chunks that never move. Either way a pull of a row never
 * pushed computes its initial value and allocates nothing; the first push
 * materialises the row with its initial weights and optimizer state.
 *
 * Row record: dim weights, then optimizer state (optim.h). */
#ifndef EMBPS_TABLE_H
#define EMBPS_TABLE_H
#include <stddef.h>
#include <stdint.h>

#include "embps/embps.h"

typedef struct embps_table embps_table_t;

/* Scratch for grouping a batch by shard; one per thread, reused. */
typedef struct {
  uint32_t *order;   /* positions sorted by shard */
  uint32_t *shard;   /* shard of each position */
  uint32_t *start;   /* n_shards + 1 bucket starts */
  size_t cap, shard_cap;
} embps_table_scratch_t;

void embps_table_scratch_init(embps_table_scratch_t *s);
void embps_table_scratch_close(embps_table_scratch_t *s);

/* Creates an empty table for a checked spec. Returns 0, -ENOMEM. */
int embps_table_create(const embps_table_spec_t *spec, uint32_t n_shards,
                       embps_table_t **out);
void embps_table_destroy(embps_table_t *t);

const embps_table_spec_t *embps_table_spec(const embps_table_t *t);
/* Spec plus counters; bytes_used counts rows, maps and bitmaps. */
void embps_table_info(embps_table_t *t, embps_table_info_t *out);
/* Memory per materialised row, in bytes. */
size_t embps_table_row_bytes(const embps_table_t *t);

/* Checks that every id may be used with this table and this server:
 * in range for dense tables, owned by cluster slot `index` of `size`.
 * Returns 0 or EMBPS_ERANGE / EMBPS_EWRONGSERVER with *bad = the position
 * of the first offending id. */
int embps_table_check_ids(const embps_table_t *t, const int64_t *ids,
                          size_t n, uint32_t cluster_size,
                          uint32_t cluster_index, size_t *bad);

/* Copies the weights of ids[i] into out[i*dim..] (checked ids). Padding
 * ids read as zeros, rows never pushed as their initial value. */
int embps_table_gather(embps_table_t *t, embps_table_scratch_t *s,
                       const int64_t *ids, size_t n, float *out);

/* Applies one optimizer step to n distinct, checked rows with merged
 * gradients g (n x dim). Padding ids are skipped. All memory the step
 * needs is reserved before any row changes, so a failure (-ENOMEM, or
 * EMBPS_ELIMIT past max_bytes; 0 = no limit) leaves the table unchanged.
 * Shards are updated in parallel (OpenMP) when the batch is large enough.
 * Only one thread may apply to a table at a time. */
int embps_table_apply(embps_table_t *t, embps_table_scratch_t *s,
                      const int64_t *ids, const float *g, size_t n,
                      uint64_t max_bytes);

/* Bytes used by all tables of the process (for --max-memory). */
uint64_t embps_tables_total_bytes(void);

/* Table reference counts, for the registry: a table lives while referenced. */
void embps_table_ref(embps_table_t *t);
void embps_table_unref(embps_table_t *t);
#endif
