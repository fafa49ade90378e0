/* ckpt.h - checkpoint directories (README "Durability"; the file formats
 * at the top of ckpt.c).
 *
 * DIR/ckpt-<S %016llx>/ holds a MANIFEST and one table-<incarnation>.dat
 * per table; it covers every mutation with LSN <= S. It is written as
 * ckpt-S.tmp, every file fsynced, then renamed and DIR fsynced, so a
 * reader sees a whole checkpoint or none. Every header and block carries a
 * CRC-32C; a mismatch is reported with the file and byte offset. */
#ifndef EMBPS_CKPT_H
#define EMBPS_CKPT_H
#include <stddef.h>
#include <stdint.h>

#include "table.h"

/* The format of the checkpoints written (table files and MANIFEST), and
 * the oldest one still read (--version prints them). */
#define EMBPS_CKPT_FORMAT 3u
#define EMBPS_CKPT_FORMAT_OLDEST 1u

typedef struct {
  uint64_t client, seq;
} embps_ckpt_seen_t;

typedef struct {
  embps_table_t *table; /* referenced (write: to copy; load: created) */
  uint64_t incarnation, step;
  /* load: the shard count at write time and each shard's snapshot LSN */
  uint32_t file_shards;
  uint64_t *shard_lsn;
  /* the spec at the marker (write: the table may be altered since) */
  embps_table_spec_t spec;
} embps_ckpt_table_t;

typedef struct {
  uint64_t lsn; /* S */
  uint32_t cluster_size, cluster_index, shards;
  embps_ckpt_seen_t *seen;
  size_t n_seen;
  embps_ckpt_table_t *tables;
  size_t n_tables;
  /* write: makes the log durable up to an LSN before the checkpoint is
   * published (NULL: no log). 0, or -1 with err. */
  int (*log_sync)(void *ctx, uint64_t lsn, char *err, size_t err_len);
  void *log_ctx;
} embps_ckpt_t;

/* Table files of at least `bytes` bytes (default 64 MiB; a write guesses
 * from the rows) are written and read around the page cache (O_DIRECT,
 * where the file system allows). 0: every file; UINT64_MAX: none. For
 * tests; not thread-safe. */
void embps_ckpt_direct_min(uint64_t bytes);

typedef struct {
  uint64_t bytes;           /* written (0: ckpt-S existed) */
  uint64_t longest_copy_ns; /* the longest a shard was held for its copy */
} embps_ckpt_result_t;

/* Writes c as DIR/ckpt-S. Copies each shard under its read lock. Returns 0
 * with *res, or -1 with err. An existing ckpt-S is kept (it holds the same
 * state). */
int embps_ckpt_write(const char *dir, const embps_ckpt_t *c,
                     embps_ckpt_result_t *res, char *err, size_t err_len);
/* Finds the newest complete checkpoint: 1 with *lsn, 0 if none, and
 * deletes leftover ckpt-*.tmp directories. -1 with err on I/O errors. */
int embps_ckpt_latest(const char *dir, uint64_t *lsn, char *err,
                      size_t err_len);
/* Loads DIR/ckpt-S into c: tables created with `shards` shards for a
 * cluster of cluster_size and filled. 0, or -1 with err naming the file
 * and offset. Release with embps_ckpt_free. */
int embps_ckpt_load(const char *dir, uint64_t lsn, uint32_t shards,
                    uint32_t cluster_size, embps_ckpt_t *c, char *err,
                    size_t err_len);
/* Unreferences the tables and frees what c holds. */
void embps_ckpt_free(embps_ckpt_t *c);
/* Deletes the checkpoints older than lsn. */
void embps_ckpt_delete_older(const char *dir, uint64_t lsn);
#endif
