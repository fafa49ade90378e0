/* snapshot.h - reading a server's snapshot stream (server/snapshot.h,
 * common/snapstream.h) through a client: the CLI's `embps backup` and a
 * follower's initial copy. Internal to the library's users in this tree
 * (not installed): the stream's format is the checkpoint's, which only
 * the server reads.
 *
 * A snapshot is a session on one server of the client's list: BEGIN, then
 * READs of chunk 0, 1, 2, ... kept `depth` in flight on the connection,
 * each reply's bytes read straight into one of depth + 1 buffers of the
 * session's chunk size; embps_snapshot_next hands them out in order, so a
 * loader parses the stream in place (embps_snapshot_reader_next adapts it
 * to snapstream.h's reader). END frees the server's session.
 *
 * Calls on one snapshot must not interleave with other calls on its
 * client from other threads (a client is not thread-safe); other
 * requests on the same client may be made between them. */
#ifndef EMBPS_CLIENT_SNAPSHOT_H
#define EMBPS_CLIENT_SNAPSHOT_H
#include <stddef.h>
#include <stdint.h>

#include "embps/embps.h"
#include "snapstream.h"

typedef struct {
  int with_log;             /* the log records after S too (a backup) */
  uint32_t max_chunk_bytes; /* 0: the server's default (8 MiB) */
  uint32_t depth;           /* READs in flight, 1..16; 0: 4 */
  uint32_t idle_ms;         /* the server's expiry; 0: its default */
} embps_snapshot_options_t;

typedef struct {
  uint64_t session, lsn; /* lsn: S, the marker's */
  uint32_t chunk_bytes, cluster_size, cluster_index, shards, tables;
} embps_snapshot_info_t;

typedef struct embps_snapshot embps_snapshot_t;

/* Begins a session on server `server` of c (o NULL: defaults) and sends
 * its first READs. 0 with *out, or an error (c's last error says it). */
int embps_snapshot_begin(embps_client_t *c, uint32_t server,
                         const embps_snapshot_options_t *o,
                         embps_snapshot_t **out);
const embps_snapshot_info_t *embps_snapshot_info(const embps_snapshot_t *s);
/* The next bytes of the stream: 0 with *data (valid until the next call
 * or end), *len; 0 with *len 0 once the stream ended; or an error (the
 * client's last error says it; the snapshot is then failed for good). */
int embps_snapshot_next(embps_snapshot_t *s, const uint8_t **data,
                        size_t *len);
/* Stream bytes handed out so far. */
uint64_t embps_snapshot_bytes(const embps_snapshot_t *s);
/* Waits for the READs in flight, ends the session on the server and
 * frees s (NULL-safe). Returns 0, or the END's error when the stream had
 * been read whole (after a failure the session is ended best effort). */
int embps_snapshot_end(embps_snapshot_t *s);
/* snapstream.h's next for a reader over s (ctx). */
int embps_snapshot_reader_next(void *ctx, const uint8_t **p, size_t *n,
                               char *err, size_t err_len);

/* Where embps_snapshot_copy puts a stream's files. Each callback returns
 * 0, or -1 with err set. */
typedef struct {
  int (*head)(void *ctx, const embps_snapstream_head_t *h, char *err,
              size_t err_len);
  /* A file begins: e (name: embps_snapstream_entry_name's). */
  int (*file)(void *ctx, const embps_snapstream_entry_t *e, const char *name,
              char *err, size_t err_len);
  int (*write)(void *ctx, const uint8_t *p, size_t n, char *err,
               size_t err_len);
  int (*file_end)(void *ctx, uint64_t bytes, char *err, size_t err_len);
} embps_snapshot_sink_t;

/* Copies server `server`'s snapshot into sink, file by file, as it comes;
 * *end (may be NULL) gets the stream's end (its LSN L). 0, or an error
 * (c's last error says it: the stream's, the server's or the sink's). */
int embps_snapshot_copy(embps_client_t *c, uint32_t server,
                        const embps_snapshot_options_t *o,
                        const embps_snapshot_sink_t *sink, void *ctx,
                        embps_snapshot_info_t *info,
                        embps_snapstream_end_t *end);
#endif
