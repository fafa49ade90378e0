/* wire.h - the messages of the embps protocol as plain C structs, and their
 * protobuf encoding. This is the only module that names protobuf-c's
 * generated symbols; everything else speaks embps_msg_t.
 *
 * A frame = header (frame.h) + packed message + padding + bulk. Bulk layouts:
 *   PULL        n_ids x int64 ids
 *   PULL reply  n_rows x dim x float32
 *   PUSH        n x int64 indices, then n x dim x float32 values
 *   SCAN reply  n x int64 ids, n x dim x float32, n x k x dim float32 state
 *   WRITE_ROWS  the same as a SCAN reply
 *   FETCH reply log records, each a 32-byte header and its payload
 *   SNAPSHOT_READ reply  the chunk's bytes of the snapshot stream
 */
#ifndef EMBPS_WIRE_H
#define EMBPS_WIRE_H
#include <stddef.h>
#include <stdint.h>

#include "embps/embps.h"
#include "frame.h"

#define EMBPS_TOKEN_MAX 256
#define EMBPS_MESSAGE_MAX 512
#define EMBPS_ADDR_MAX 300 /* "HOST:PORT", host up to 255 bytes */
/* Epochs a FETCH or its reply may carry (history.h keeps as many). */
#define EMBPS_EPOCHS_MAX 65536

/* Replication roles (issue 21). */
enum { EMBPS_ROLE_PRIMARY = 0, EMBPS_ROLE_FOLLOWER = 1 };

/* An epoch of a log and the first LSN made in it (server/history.h). */
typedef struct {
  uint32_t epoch;
  uint64_t start;
} embps_epoch_t;

typedef struct {
  uint32_t version;
  size_t token_len;
  char token[EMBPS_TOKEN_MAX];
} embps_hello_t;

typedef struct {
  uint32_t version, cluster_size, cluster_index;
  uint64_t max_frame_bytes;
  char server_version[32];
  uint32_t role, epoch; /* issue 21: EMBPS_ROLE_*, the log's epoch */
  uint64_t applied_lsn;
  char primary[EMBPS_ADDR_MAX]; /* a follower's primary, else empty */
} embps_hello_reply_t;

typedef struct {
  int32_t code;
  char message[EMBPS_MESSAGE_MAX];
  uint64_t lsn; /* the LSN the error is about (EMBPS_EDIVERGED), or 0 */
} embps_error_t;

typedef struct {
  char table[EMBPS_TABLE_NAME_MAX];
  uint32_t n_ids, dim;
} embps_pull_t;

typedef struct {
  uint32_t n_rows, dim;
  uint64_t lsn;
} embps_pull_reply_t;

typedef struct {
  char table[EMBPS_TABLE_NAME_MAX];
  uint32_t n, dim;
  uint64_t dense_rows, client_id, seq, step;
} embps_push_t;

typedef struct {
  int applied, duplicate;
  uint32_t n_unique;
} embps_push_reply_t;

typedef struct {
  char table[EMBPS_TABLE_NAME_MAX];
  uint64_t cursor;
  uint32_t max_rows;
  int with_state;
} embps_scan_t;

typedef struct {
  uint32_t n_rows, dim, state_floats;
  uint64_t next_cursor, step, lsn;
  int done;
} embps_scan_reply_t;

/* FETCH (issue 21); history malloc'd (freed by embps_msg_free), or NULL. */
typedef struct {
  uint64_t from_lsn, stream, follower_id, applied_lsn, durable_lsn,
      max_bytes;
  uint32_t wait_ms;
  char name[EMBPS_ADDR_MAX];
  embps_epoch_t *history;
  size_t n_history;
} embps_fetch_t;

/* FETCH | REPLY; bulk: n_records log records (wal.h). */
typedef struct {
  uint64_t first_lsn, last_lsn, lag_ms;
  uint32_t n_records, epoch, shards, cluster_size, cluster_index;
  embps_epoch_t *history;
  size_t n_history;
} embps_fetch_reply_t;

typedef struct {
  uint32_t epoch;
  uint64_t lsn;
} embps_promote_reply_t;

typedef struct {
  char table[EMBPS_TABLE_NAME_MAX];
  uint32_t n, dim, state_floats;
  int has_step;
  uint64_t step;
} embps_write_rows_t;

typedef struct {
  int with_log;
  uint32_t max_chunk_bytes, idle_ms;
} embps_snapshot_begin_t;

typedef struct {
  uint64_t session, lsn;
  uint32_t chunk_bytes, cluster_size, cluster_index, shards, tables, idle_ms;
} embps_snapshot_begin_reply_t;

typedef struct {
  uint64_t session, seq;
  uint32_t max_bytes;
} embps_snapshot_read_t;

typedef struct {
  uint64_t seq, offset;
  int done;
} embps_snapshot_read_reply_t;

typedef struct {
  uint16_t kind; /* enum embps_kind, with EMBPS_KIND_REPLY for replies */
  union {
    embps_hello_t hello;             /* HELLO */
    embps_hello_reply_t hello_reply; /* HELLO | REPLY */
    embps_error_t error;             /* ERROR */
    embps_table_spec_t spec;         /* CREATE */
    char name[EMBPS_TABLE_NAME_MAX]; /* DROP, DESCRIBE */
    embps_table_info_t info;         /* DESCRIBE | REPLY */
    struct {
      embps_table_info_t *v; /* malloc'd, freed by embps_msg_free */
      size_t n;
    } list;                          /* LIST | REPLY */
    embps_pull_t pull;
    embps_pull_reply_t pull_reply;
    embps_push_t push;
    embps_push_reply_t push_reply;
    embps_server_stats_t stats;      /* STATS | REPLY; tables malloc'd */
    embps_checkpoint_info_t checkpoint; /* CHECKPOINT | REPLY */
    struct {
      char name[EMBPS_TABLE_NAME_MAX];
      embps_table_alter_t set;
    } alter;                         /* ALTER; its reply is info */
    embps_scan_t scan;               /* SCAN */
    embps_scan_reply_t scan_reply;   /* SCAN | REPLY */
    embps_write_rows_t write_rows;   /* WRITE_ROWS; its reply: none */
    uint64_t evicted;                /* EVICT | REPLY (EVICT: name) */
    embps_fetch_t fetch;             /* FETCH */
    embps_fetch_reply_t fetch_reply; /* FETCH | REPLY */
    embps_promote_reply_t promote;   /* PROMOTE | REPLY (PROMOTE: none) */
    embps_snapshot_begin_t snap_begin;             /* SNAPSHOT_BEGIN */
    embps_snapshot_begin_reply_t snap_begin_reply; /* ... | REPLY */
    embps_snapshot_read_t snap_read;               /* SNAPSHOT_READ */
    embps_snapshot_read_reply_t snap_read_reply;   /* ... | REPLY */
    uint64_t snap_session; /* SNAPSHOT_END (its reply: none) */
  } u;                               /* CREATE|DROP|LIST|STATS replies: none */
} embps_msg_t;

/* Packed size of m's meta, or 0 for an unknown kind. */
size_t embps_msg_size(const embps_msg_t *m);
/* Packs m into out (embps_msg_size(m) bytes). */
void embps_msg_pack(const embps_msg_t *m, uint8_t *out);
/* Decodes the meta of a frame of `kind` into m. Returns 0, EMBPS_EKIND for a
 * kind with no message, or EMBPS_EPROTO for bytes that do not decode or
 * fields out of their bounds. On success release m with embps_msg_free. */
int embps_msg_unpack(uint16_t kind, const uint8_t *meta, size_t len,
                     embps_msg_t *m);
/* The same; on EMBPS_EPROTO why says which field is wrong when it knows
 * ("" when the bytes do not decode at all). why may be NULL. */
int embps_msg_unpack_why(uint16_t kind, const uint8_t *meta, size_t len,
                         embps_msg_t *m, char *why, size_t why_len);
void embps_msg_free(embps_msg_t *m);

/* Allocates a whole frame for m with room for bulk_len bulk bytes:
 * *frame (malloc'd, *frame_len bytes) holds the header and meta, and
 * *frame + *bulk_off is where the caller writes the bulk (8-byte aligned).
 * Returns 0 or -ENOMEM. */
int embps_frame_build(const embps_msg_t *m, uint32_t req_id, size_t bulk_len,
                      uint8_t **frame, size_t *frame_len, size_t *bulk_off);
/* The same frame, for a bulk the caller sends from its own buffers:
 * *head (malloc'd, *head_len bytes) holds the header, meta and padding, and
 * the header counts bulk_len more bytes, which must follow it on the wire.
 * Returns 0, EMBPS_EFRAMESIZE or -ENOMEM. */
int embps_frame_build_head(const embps_msg_t *m, uint32_t req_id,
                           size_t bulk_len, uint8_t **head, size_t *head_len);

/* An error frame for `code` with a printf-style message. */
int embps_frame_error(uint32_t req_id, int code, const char *message,
                      uint8_t **frame, size_t *frame_len);
#endif
