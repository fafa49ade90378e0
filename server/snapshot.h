/* snapshot.h - snapshot sessions: a copy of this server's tables, in the
 * checkpoint format, as one stream (common/snapstream.h) that a client
 * reads chunk by chunk over the ordinary request protocol: a follower's
 * initial copy (issue 21) and `embps backup` (issue 19). No file system is
 * shared and nothing is written to disk on the server's side.
 *
 *   BEGIN  {with_log, max_chunk_bytes, idle_ms} -> {session, S, chunk
 *          size, cluster slot, shards, tables}. On the apply thread, in
 *          order with the mutations, a marker takes the state at S
 *          exactly as a checkpoint's does (marker.h: the tables with
 *          their specs and steps, the exactly-once table), with or without
 *          --data-dir; a data dir's log keeps its records after S while
 *          the session lives (embps_durable_pin), and so does the record
 *          feed when one is attached (embps_snapshot_feed_t). A thread of
 *          the session's own then writes the stream: the table files, each
 *          shard copied under its read lock when the stream reaches it,
 *          with its shard LSN (at or after S), as the checkpoint writer
 *          does (embps_ckpt_emit); then the MANIFEST; with with_log the
 *          log records after S up to the highest shard LSN L as log
 *          segments, so that restoring them over the checkpoint gives the
 *          state at L; then the stream's end.
 *   READ   {session, seq, max_bytes} -> chunk seq: at most the session's
 *          chunk size (the last one marked done; a block of records goes
 *          as a chunk of its own, its reply frame built in front of it, so
 *          it is sent without a copy). READs are answered in order; one
 *          waits (deferred) while its chunk is being written. A client
 *          keeps several in flight on its connection.
 *   END    {session}: the session and its thread go; so does a session
 *          that sees no READ for idle_ms.
 *
 * Bounds: at most EMBPS_SNAPSHOT_SESSIONS sessions at once; a session
 * holds at most EMBPS_SNAPSHOT_PIPE chunks written ahead of its reader,
 * plus the checkpoint writer's two shard copies. A chunk is at most what
 * BEGIN asked, the server's --max-frame-bytes and EMBPS_SNAPSHOT_CHUNK_MAX;
 * a READ asking for less than the session's chunk size is refused. Wrong
 * session ids, sequence numbers and option values get EMBPS_EINVAL with a
 * message saying which; too many sessions EMBPS_ELIMIT.
 *
 * Without --data-dir there is no log to complete the copy: a with_log
 * session (a backup) fails with EMBPS_ENODATADIR if anything ran on the
 * apply thread while its shards were copied, unless the record feed can
 * write the records after S (its records hook); a follower's session
 * (without with_log) completes the copy itself from the feed (copy.h).
 * Every mutation has an LSN, with or without --data-dir, so every table
 * has its incarnation (its CREATE's LSN) to name its file. */
#ifndef EMBPS_SNAPSHOT_H
#define EMBPS_SNAPSHOT_H
#include <stdint.h>

#include "ckpt.h"
#include "server.h"

#define EMBPS_SNAPSHOT_SESSIONS 4
#define EMBPS_SNAPSHOT_PIPE 4
#define EMBPS_SNAPSHOT_CHUNK_DEFAULT (8u << 20)
#define EMBPS_SNAPSHOT_CHUNK_MIN 4096u
#define EMBPS_SNAPSHOT_CHUNK_MAX (256u << 20)
#define EMBPS_SNAPSHOT_IDLE_DEFAULT_MS 30000u
#define EMBPS_SNAPSHOT_IDLE_MIN_MS 100u
#define EMBPS_SNAPSHOT_IDLE_MAX_MS 3600000u

typedef struct embps_snapshots embps_snapshots_t;

/* The record feed's side of a session (the followers' work, issue 21):
 * the hook where a session tells the feed "keep every record after S".
 * Attach it with embps_snapshot_set_feed before the server serves. */
typedef struct {
  /* At the session's marker, on the apply thread: keep every record with
   * an LSN above lsn (S) until unpin. Returns the pin (NULL: nothing
   * kept). */
  void *(*pin)(void *ctx, uint64_t lsn);
  /* The session ended (END, expiry, failure or shutdown); any thread. */
  void (*unpin)(void *ctx, void *pin);
  /* Optional, for a with_log session of a server without --data-dir:
   * writes the records after..upto (kept by pin) into out as LOG entries
   * (embps_ckpt_stream_log, then base.write of the segment's bytes in the
   * log's format, wal.h, then base.end). 0, or -1 with err. On the
   * session's thread. */
  int (*records)(void *ctx, void *pin, uint64_t after, uint64_t upto,
                 embps_ckpt_stream_t *out, char *err, size_t err_len);
  void *ctx;
} embps_snapshot_feed_t;

/* The server's sessions (none yet). 0 or -ENOMEM. */
int embps_snapshots_create(embps_server_t *srv, embps_snapshots_t **out);
/* Attaches the record feed (copied); before the server serves. */
void embps_snapshot_set_feed(embps_snapshots_t *s,
                             const embps_snapshot_feed_t *feed);
/* Shutdown has begun: every session ends, waiting READs fail with
 * EMBPS_ESHUTDOWN, and so do later requests. Any thread; NULL-safe. */
void embps_snapshots_drain(embps_snapshots_t *s);
/* Once no request can come (the I/O threads stopped): ends the sessions,
 * waits for their threads and frees everything. NULL-safe. */
void embps_snapshots_destroy(embps_snapshots_t *s);

/* I/O thread: a decoded SNAPSHOT_BEGIN, _READ or _END (dispatch.c).
 * BEGIN is deferred to the apply thread; a READ whose chunk is not
 * written yet waits (deferred). */
embps_dispatch_t embps_snapshot_dispatch(embps_server_t *srv,
                                         embps_request_t *req);
#endif
