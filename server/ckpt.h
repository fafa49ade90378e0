/* ckpt.h - checkpoint directories (README "Durability"; the file formats
 * at the top of ckpt.c), and the same files as a snapshot stream.
 *
 * DIR/ckpt-<S %016llx>/ holds a MANIFEST and one table-<incarnation>.dat
 * per table; it covers every mutation with LSN <= S. It is written as
 * ckpt-S.tmp, every file fsynced, then renamed and DIR fsynced, so a
 * reader sees a whole checkpoint or none. Every header and block carries a
 * CRC-32C; a mismatch is reported with the file and byte offset.
 *
 * One writer and one reader serve both forms: the writer emits the files
 * into a sink (a directory, or the snapshot stream of snapstream.h), and
 * the table-file and MANIFEST parsers read from a file or from a stream's
 * entry. A stream is loaded as it arrives, without a copy on disk. */
#ifndef EMBPS_CKPT_H
#define EMBPS_CKPT_H
#include <stddef.h>
#include <stdint.h>

#include "snapstream.h"
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
  uint64_t max_lsn;         /* the highest shard LSN copied (>= S or 0) */
} embps_ckpt_result_t;

/* Bytes free in front of the records of a block handed to write_block. */
#define EMBPS_CKPT_BLOCK_ROOM 64

/* Where a checkpoint's files go. The writer calls begin, write...
 * (write_block...), end for each table file in c's order, then for the
 * MANIFEST. */
typedef struct embps_ckpt_sink embps_ckpt_sink_t;
struct embps_ckpt_sink {
  /* Begins ct's table file (ct NULL: the MANIFEST), expected to hold
   * about size_guess bytes. 0, or -1 with err. */
  int (*begin)(embps_ckpt_sink_t *s, const embps_ckpt_table_t *ct,
               uint64_t size_guess, char *err, size_t err_len);
  /* Appends n bytes to the file begun. 0, or -1 with err. */
  int (*write)(embps_ckpt_sink_t *s, const void *p, size_t n, char *err,
               size_t err_len);
  /* Optional (NULL: write twice, then free): appends head (head_len
   * bytes), then the body_len bytes at buf + room, taking buf (malloc'd,
   * its first room bytes free for the sink's use): a block of records
   * sent without a copy. 0, or -1 with err (buf taken either way). */
  int (*write_block)(embps_ckpt_sink_t *s, const void *head,
                     size_t head_len, uint8_t *buf, size_t room,
                     size_t body_len, char *err, size_t err_len);
  /* Ends it: rc 0 completes it (durably, for a directory); rc -1 only
   * lets go of it after an error. Returns rc, or -1 with err. */
  int (*end)(embps_ckpt_sink_t *s, int rc, char *err, size_t err_len);
  char path[1200]; /* set by begin: names the file in messages */
};

/* Writes c's table files, then (once the log is durable up to the highest
 * shard LSN copied, c->log_sync) its MANIFEST into sink. Copies each shard
 * under its read lock when its turn comes. 0 with *res, or -1 with err. */
int embps_ckpt_emit(embps_ckpt_sink_t *sink, const embps_ckpt_t *c,
                    embps_ckpt_result_t *res, char *err, size_t err_len);

/* The stream form (snapstream.h): a sink whose files become entries of a
 * snapshot stream, its bytes handed in order to put (which may block, and
 * fails the file with its err), and with put_block (may be NULL) each
 * block of records as the malloc'd buffer it was copied into: the stream's
 * next n bytes are at buf + off (off >= EMBPS_CKPT_BLOCK_ROOM - 24; the
 * bytes before are free), buf taken. Write head, emit, any LOG entries,
 * end. */
typedef struct {
  embps_ckpt_sink_t base;
  int (*put)(void *ctx, const void *p, size_t n, char *err, size_t err_len);
  int (*put_block)(void *ctx, uint8_t *buf, size_t off, size_t n, char *err,
                   size_t err_len);
  void *ctx;
  uint64_t file_bytes;
  uint32_t entries;
} embps_ckpt_stream_t;

void embps_ckpt_stream_init(embps_ckpt_stream_t *s,
                            int (*put)(void *ctx, const void *p, size_t n,
                                       char *err, size_t err_len),
                            int (*put_block)(void *ctx, uint8_t *buf,
                                             size_t off, size_t n, char *err,
                                             size_t err_len),
                            void *ctx);
/* The stream's head for c; flags EMBPS_SNAPSTREAM_WITH_LOG when LOG
 * entries will follow the MANIFEST. 0, or -1 with err. */
int embps_ckpt_stream_head(embps_ckpt_stream_t *s, const embps_ckpt_t *c,
                           uint32_t flags, char *err, size_t err_len);
/* Begins a LOG entry: the segment starting at first_lsn (then base.write
 * and base.end). 0, or -1 with err. */
int embps_ckpt_stream_log(embps_ckpt_stream_t *s, uint64_t first_lsn,
                          char *err, size_t err_len);
/* The stream's end: replaying its LOG entries gives the state at lsn. */
int embps_ckpt_stream_end(embps_ckpt_stream_t *s, uint64_t lsn, char *err,
                          size_t err_len);

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
/* Loads a snapshot stream's checkpoint into c as its entries arrive, as
 * embps_ckpt_load does a directory's (tables of `shards` shards for a
 * cluster of cluster_size; c->shards etc. from its MANIFEST), checking
 * that its MANIFEST matches the files that came. The stream must end
 * after the MANIFEST: one carrying LOG entries (a backup's) is refused.
 * 0, or -1 with err naming the entry and offset. Release with
 * embps_ckpt_free. */
int embps_ckpt_load_stream(embps_snapstream_reader_t *s, uint32_t shards,
                           uint32_t cluster_size, embps_ckpt_t *c, char *err,
                           size_t err_len);
/* Unreferences the tables and frees what c holds. */
void embps_ckpt_free(embps_ckpt_t *c);
/* Deletes the checkpoints older than lsn. */
void embps_ckpt_delete_older(const char *dir, uint64_t lsn);
#endif
