/* wal.h - the log of acknowledged mutations (DURABILITY.md, "Log").
 *
 * DIR/log/<first LSN %016llx>.log segments: a 32-byte segment header, then
 * records of a 32-byte header {u32 magic, u32 type, u64 lsn, u32
 * payload_len, u32 payload_crc, u32 epoch, u32 header_crc} and payload.
 * The epoch (issue 21) is the primary's term the record was made in
 * (history.h); formats 1 and 2 wrote 0 there, read as epoch 1. A record
 * is the same bytes in the log, in the primary's replication feed and in
 * a follower's log.
 * The apply thread appends (writev straight from the caller's arrays); a
 * log thread fdatasyncs: once per batch of waiting acknowledgements
 * (always, group commit), every second (everysec) or only at rotation and
 * close (never). The apply thread never waits for an fsync except when it
 * rotates the log at a checkpoint marker. LSNs are appended one after the
 * other, without a gap (asserted).
 *
 * The log knows nothing of requests: whoever waits for a record to be
 * durable hands it an embps_wal_waiter_t (embedded in its own object, so
 * waiting costs no allocation) and gets it back through the done callback
 * given to embps_wal_open. */
#ifndef EMBPS_WAL_H
#define EMBPS_WAL_H
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

typedef enum {
  EMBPS_FSYNC_ALWAYS = 0,
  EMBPS_FSYNC_EVERYSEC = 1,
  EMBPS_FSYNC_NEVER = 2,
} embps_fsync_t;

enum { EMBPS_WAL_PUSH = 1, EMBPS_WAL_CREATE = 2, EMBPS_WAL_DROP = 3 };
enum { EMBPS_WAL_ROWS = 4 }; /* an import (WRITE_ROWS) */
/* ALTER {incarnation, packed TableSpec: the table's spec after the alter} */
enum { EMBPS_WAL_ALTER = 5 };
/* issue 12: {u64 incarnation, u64 table step}: embps_table_evict with the
 * table's evict_l2_below at that step */
enum { EMBPS_WAL_EVICT = 6 };

/* A record appended after a sync began starts at the next page (4 KiB)
 * of the segment, the file extended over the gap (which reads as zeros;
 * replay skips zeros up to a page boundary): no write ever touches a page
 * holding a record a sync may have made durable (and acknowledged), so a
 * failed write-back of a page (ext4 then reads it back as zeros) cannot
 * take an acknowledged record with it. */
#define EMBPS_WAL_PAGE 4096

/* A sync or write in progress longer than this: the log is stalled
 * (/readyz says so). */
#define EMBPS_WAL_STALL_MS 5000

/* The format of the log segments written, and the oldest one still read
 * (--version prints them); replay reads each by its segment's version: 1,
 * records one after the other; 2, a record after a sync starts a new
 * page; 3, the same with epochs. */
#define EMBPS_WAL_FORMAT 3u
#define EMBPS_WAL_FORMAT_OLDEST 1u

/* How a file of the data dir whose header says a format newer than this
 * binary reads is refused (the format found, then the newest read). Every
 * format keeps its magic, its version word and its header's checksum
 * where format 1 has them, so an older binary tells a newer file (magic
 * and checksum right, version above its own) from a damaged one. */
#define EMBPS_FORMAT_NEWER                                                     \
  "written by a newer version of embps (format %u; this binary reads up to "  \
  "%u)"

#define EMBPS_WAL_HEADER_BYTES 32

typedef struct embps_wal embps_wal_t;

/* One wait for durability; owned by the caller, linked by the log while it
 * waits (from embps_wal_wait until its done call). */
typedef struct embps_wal_waiter {
  struct embps_wal_waiter *next;
} embps_wal_waiter_t;

/* Called for each waiter handed to embps_wal_wait once the log is durable
 * up to its LSN, with err NULL, or with the failure's message if the log
 * can no longer be made durable: on the log thread, or at once on the
 * waiting thread when nothing had to be waited for. */
typedef void (*embps_wal_done_fn)(void *ctx, embps_wal_waiter_t *waiter,
                                  const char *err);

/* One record as the reader hands it out (payload valid during the call). */
typedef struct {
  uint32_t type;
  uint32_t epoch;
  uint64_t lsn;
  const uint8_t *payload;
  uint32_t len;
} embps_wal_rec_t;
typedef int (*embps_wal_visit_fn)(void *ctx, const embps_wal_rec_t *r,
                                  char *err, size_t err_len);

/* Reads every segment of log_dir in LSN order and calls visit (may be
 * NULL: the log is only checked) for each record with lsn > after
 * (records must follow after + 1 without a gap).
 * A torn tail of the last segment (a record cut short, or zeros to the
 * end, or in a format-2 segment the last record failing its checksum
 * with zeros from a page inside it to the end) is cut off with a WARN.
 * Anything
 * else wrong fails with a message naming the file and offset (for a
 * damaged record at the end of the log, also the command that drops it,
 * should it be the unacknowledged tail of a write or fsync error).
 * *last = the last LSN read (or after). 0, or -1 with err. */
int embps_wal_replay(const char *log_dir, uint64_t after,
                     embps_wal_visit_fn visit, void *ctx, uint64_t *last,
                     char *err, size_t err_len);

/* Starts a segment at next_lsn in log_dir and the log thread. unsafe_ack:
 * records are queued and written later by the log thread (test only). */
int embps_wal_open(const char *log_dir, uint64_t next_lsn, embps_fsync_t mode,
                   int unsafe_ack, embps_wal_done_fn done, void *done_ctx,
                   embps_wal_t **out, char *err, size_t err_len);
/* Syncs, stops the log thread (completing every waiter) and closes. */
void embps_wal_close(embps_wal_t *w);

/* Fills head with the header of a record of type at lsn in epoch whose
 * payload is the concatenation of parts (at most EMBPS_WAL_PARTS_MAX).
 * 0, or -EFBIG / -EINVAL with err. */
#define EMBPS_WAL_PARTS_MAX 7
int embps_wal_head(uint8_t head[EMBPS_WAL_HEADER_BYTES], uint32_t type,
                   uint64_t lsn, uint32_t epoch, const struct iovec *parts,
                   int n_parts, char *err, size_t err_len);
/* Checks the record at p (avail bytes there): magic, header checksum,
 * length and, unless `trusted` (checked before), the payload's checksum.
 * Returns its size (header and payload), with *r pointing into p, or 0
 * with err. Any thread. */
size_t embps_wal_parse(const uint8_t *p, size_t avail, int trusted,
                       embps_wal_rec_t *r, char *err, size_t err_len);
/* Appends the record of header head (embps_wal_head's, or one parsed from
 * a primary's feed) and payload parts (apply thread); its LSN must follow
 * the last one appended (or next_lsn - 1) by one. On a write error the
 * segment is cut back to the record's start: returns -errno with a
 * message and nothing was logged; if even that fails the log is failed for
 * good (embps_wal_failed). */
int embps_wal_append(embps_wal_t *w, const uint8_t head[EMBPS_WAL_HEADER_BYTES],
                     const struct iovec *parts, int n_parts, char *err,
                     size_t err_len);
/* Hands waiter to the done callback once the log is durable up to lsn
 * (immediately if it already is). */
void embps_wal_wait(embps_wal_t *w, embps_wal_waiter_t *waiter, uint64_t lsn);
/* Blocks until the log is durable up to lsn (the log thread syncs for
 * it, in every fsync mode). 0, or -1 with err if the log failed. Any
 * thread but the apply thread (which must have appended lsn already). */
int embps_wal_sync(embps_wal_t *w, uint64_t lsn, char *err, size_t err_len);
/* Closes the current segment (fdatasync) and starts one at next_lsn (the
 * LSN after the last one appended), unless the current one has no record
 * yet. 0, or -1 with err. Apply thread. */
int embps_wal_rotate(embps_wal_t *w, uint64_t next_lsn, char *err,
                     size_t err_len);
/* The failure message if the log can no longer be made durable, or NULL. */
const char *embps_wal_failed(embps_wal_t *w);
/* Apply thread: the log goes on at next_lsn, past the records it holds (a
 * follower that installed a copy of its primary at next_lsn - 1, written
 * as a checkpoint first): every record appended is synced, then a new
 * segment begins at next_lsn. Fails when records wait for their sync. 0,
 * or -1 with err (the log failed, if it had begun). */
int embps_wal_restart_at(embps_wal_t *w, uint64_t next_lsn, char *err,
                         size_t err_len);
/* The last LSN known durable (synced), and the last written. Any thread. */
uint64_t embps_wal_synced(embps_wal_t *w);
uint64_t embps_wal_written(embps_wal_t *w);
/* Before the log is opened: the last LSN of log_dir and its record's
 * epoch (0 and 0 for an empty log), a torn tail cut as replay cuts it. 0,
 * or -1 with err. */
int embps_wal_last(const char *log_dir, uint64_t *lsn, uint32_t *epoch,
                   char *err, size_t err_len);
/* Before the log is opened: removes every record of log_dir above lsn
 * (cutting the segment that holds lsn + 1, deleting those after), synced.
 * *cut = records removed. 0, or -1 with err. */
int embps_wal_cut_after(const char *log_dir, uint64_t lsn, uint64_t *cut,
                        char *err, size_t err_len);
/* Milliseconds the oldest write or sync still in progress has taken (0:
 * none): past EMBPS_WAL_STALL_MS the disk is not taking writes. Any
 * thread. */
uint64_t embps_wal_stall_ms(embps_wal_t *w);
/* Deletes the segments whose records are all <= lsn (a later segment
 * starts at or below lsn + 1). */
void embps_wal_delete_upto(const char *log_dir, uint64_t lsn);
/* fsync of a directory (after a create, rename or unlink in it). 0 or
 * -errno. */
int embps_fsync_dir(const char *dir);
/* A copy of the records after..upto of a log being written (a snapshot
 * of a backup): calls visit for each segment holding some of them, in
 * order, with its first LSN, its path and the length of its prefix that
 * ends with its last record <= upto (whole records, the segment header
 * included). Reads record headers only and changes nothing; the caller
 * keeps the segments from being deleted and has the records up to upto
 * written. 0, or -1 with err (records missing, or a header that does not
 * check), or visit's -1. */
typedef int (*embps_wal_segment_fn)(void *ctx, uint64_t first,
                                    const char *path, uint64_t bytes,
                                    char *err, size_t err_len);
int embps_wal_segments(const char *log_dir, uint64_t after, uint64_t upto,
                       embps_wal_segment_fn visit, void *ctx, char *err,
                       size_t err_len);
/* The header of a segment whose first record is LSN first: what begins
 * a segment made of records kept elsewhere (a memory-only server's
 * snapshot, from its replication backlog). */
void embps_wal_segment_header(uint8_t h[EMBPS_WAL_HEADER_BYTES],
                              uint64_t first);
/* Bytes of all segments in log_dir. */
uint64_t embps_wal_bytes(const char *log_dir);

/* Where a read of the log ended (embps_wal_read): the next record's LSN
 * and offset in the segment starting at seg_first. Zeroed: none. */
typedef struct {
  uint64_t seg_first, lsn, off;
} embps_wal_cursor_t;
/* Reads the records of log_dir from LSN `from` to `upto` (written: a
 * primary's feed catching up a follower its backlog no longer serves),
 * whole records as they are in the log, their payloads checked, at most
 * max_bytes of them but at least one; the epoch word of a record of a
 * format-1 or -2 segment is made 1 (its header checksum again), as replay
 * reads it. hint (in and out) skips the records a previous read walked
 * over. 0 with *out (malloc'd), *len bytes and *n records; 1 when the log
 * no longer (or does not yet) hold `from` (its segment deleted by a
 * checkpoint); -1 with err. Any thread; the log may grow meanwhile. */
int embps_wal_read(const char *log_dir, uint64_t from, uint64_t upto,
                   size_t max_bytes, embps_wal_cursor_t *hint, uint8_t **out,
                   size_t *len, uint32_t *n, char *err, size_t err_len);
#endif
