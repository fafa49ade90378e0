/* snapshot.c - a server's snapshot stream through a client (snapshot.h).
 *
 * READ seq goes out into buffer seq % (depth + 1) once the caller has
 * given that buffer back (by asking for the next chunk), so depth READs
 * are in flight while the caller parses the chunk it holds. Each reply is
 * checked against the stream so far: its seq, its offset, bytes unless it
 * is the last one (a chunk holds at most the session's chunk size; a
 * block of records travels as a chunk of its own). READs sent past the
 * stream's end are refused by the server; end() waits for them and
 * ignores that. */
#include "snapshot.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "wire.h"

#define DEPTH_MAX 16
#define DEPTH_DEFAULT 4

typedef struct {
  uint8_t *buf;
  embps_ticket_t *t; /* the READ in flight into buf, or NULL */
} slot_t;

struct embps_snapshot {
  embps_client_t *c;
  uint32_t server;
  embps_snapshot_info_t info;
  uint32_t n_slots; /* depth + 1 */
  slot_t slot[DEPTH_MAX + 1];
  uint64_t sent, got; /* READs sent; chunks received (handed out) */
  uint64_t bytes;
  int done;     /* the last chunk came */
  int failed;   /* an error was returned */
  int err_code; /* ... this one */
};

/* s fails for good with code (the client's last error set, or msg). */
static int failed(embps_snapshot_t *s, int code) {
  s->failed = 1;
  s->err_code = code;
  return code;
}

static int fail(embps_snapshot_t *s, int code, const char *fmt, uint64_t a,
                uint64_t b) {
  char msg[256];
  snprintf(msg, sizeof msg, fmt, a, b);
  return failed(s, embps_client_set_error_(s->c, code, msg));
}

/* Sends READ s->sent into its slot. */
static int send_read(embps_snapshot_t *s) {
  slot_t *sl = &s->slot[s->sent % s->n_slots];
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_SNAPSHOT_READ;
  m.u.snap_read.session = s->info.session;
  m.u.snap_read.seq = s->sent;
  m.u.snap_read.max_bytes = s->info.chunk_bytes;
  int rc = embps_client_request_(s->c, s->server, &m, sl->buf,
                                 s->info.chunk_bytes, &sl->t);
  if (!rc)
    s->sent++;
  return rc;
}

int embps_snapshot_begin(embps_client_t *c, uint32_t server,
                         const embps_snapshot_options_t *o,
                         embps_snapshot_t **out) {
  *out = NULL;
  embps_snapshot_options_t opts = {0};
  if (o)
    opts = *o;
  if (opts.depth > DEPTH_MAX)
    return embps_client_set_error_(c, EMBPS_EINVAL, "snapshot: depth above "
                                   "16");
  embps_snapshot_t *s = calloc(1, sizeof *s);
  if (!s)
    return embps_client_set_error_(c, -ENOMEM, "out of memory");
  s->c = c;
  s->server = server;
  s->n_slots = (opts.depth ? opts.depth : DEPTH_DEFAULT) + 1;
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_SNAPSHOT_BEGIN;
  m.u.snap_begin.with_log = opts.with_log;
  m.u.snap_begin.max_chunk_bytes = opts.max_chunk_bytes;
  m.u.snap_begin.idle_ms = opts.idle_ms;
  embps_ticket_t *t;
  embps_msg_t r;
  size_t n;
  int rc = embps_client_request_(c, server, &m, NULL, 0, &t);
  if (!rc)
    rc = embps_client_reply_(c, t, &r, &n);
  if (rc) {
    free(s);
    return rc;
  }
  const embps_snapshot_begin_reply_t *b = &r.u.snap_begin_reply;
  s->info = (embps_snapshot_info_t){b->session, b->lsn, b->chunk_bytes,
                                    b->cluster_size, b->cluster_index,
                                    b->shards, b->tables};
  embps_msg_free(&r);
  if (!s->info.chunk_bytes ||
      (opts.max_chunk_bytes && s->info.chunk_bytes > opts.max_chunk_bytes)) {
    rc = embps_client_set_error_(c, EMBPS_EPROTO, "snapshot: the server "
                                 "chose chunks larger than asked for");
  }
  for (uint32_t i = 0; !rc && i < s->n_slots; i++)
    if (!(s->slot[i].buf = malloc(s->info.chunk_bytes)))
      rc = embps_client_set_error_(c, -ENOMEM, "out of memory");
  for (uint32_t i = 0; !rc && i + 1 < s->n_slots; i++)
    rc = send_read(s);
  if (rc) {
    failed(s, rc);
    embps_snapshot_end(s);
    return rc;
  }
  *out = s;
  return 0;
}

const embps_snapshot_info_t *embps_snapshot_info(const embps_snapshot_t *s) {
  return &s->info;
}

uint64_t embps_snapshot_bytes(const embps_snapshot_t *s) { return s->bytes; }

int embps_snapshot_next(embps_snapshot_t *s, const uint8_t **data,
                        size_t *len) {
  *data = NULL;
  *len = 0;
  if (s->failed)
    return embps_client_set_error_(s->c, EMBPS_EINVAL, "snapshot: failed "
                                   "earlier");
  if (s->done)
    return 0;
  /* the buffer handed out last is free again: the next READ goes there */
  if (s->got && s->sent < s->got + s->n_slots - 1) {
    int rc = send_read(s);
    if (rc)
      return failed(s, rc);
  }
  slot_t *sl = &s->slot[s->got % s->n_slots];
  embps_msg_t r;
  size_t n;
  embps_ticket_t *t = sl->t;
  sl->t = NULL;
  int rc = embps_client_reply_(s->c, t, &r, &n);
  if (rc)
    return failed(s, rc);
  const embps_snapshot_read_reply_t q = r.u.snap_read_reply;
  embps_msg_free(&r);
  if (q.seq != s->got || q.offset != s->bytes)
    return fail(s, EMBPS_EPROTO, "snapshot: chunk %" PRIu64 " at stream "
                "offset %" PRIu64 " is not the one asked for", q.seq,
                q.offset);
  if (!q.done && !n)
    return fail(s, EMBPS_EPROTO, "snapshot: chunk %" PRIu64 " at stream "
                "offset %" PRIu64 " is empty and not the last", q.seq,
                q.offset);
  s->got++;
  s->bytes += n;
  s->done = q.done;
  *data = sl->buf;
  *len = n;
  return 0;
}

int embps_snapshot_reader_next(void *ctx, const uint8_t **p, size_t *n,
                               char *err, size_t err_len) {
  embps_snapshot_t *s = ctx;
  for (;;) {
    int rc = embps_snapshot_next(s, p, n);
    if (rc) {
      snprintf(err, err_len, "%s", embps_client_last_error(s->c));
      return -1;
    }
    if (*n || s->done)
      return 0; /* an empty chunk that is not the last cannot come */
  }
}

int embps_snapshot_end(embps_snapshot_t *s) {
  if (!s)
    return 0;
  /* every READ in flight answered (or refused past the end) first */
  for (uint32_t i = 0; i < s->n_slots; i++) {
    if (s->slot[i].t) {
      embps_msg_t r;
      size_t n;
      if (!embps_client_reply_(s->c, s->slot[i].t, &r, &n))
        embps_msg_free(&r);
      s->slot[i].t = NULL;
    }
  }
  int rc = 0;
  if (s->info.session) {
    embps_msg_t m;
    memset(&m, 0, sizeof m);
    m.kind = EMBPS_KIND_SNAPSHOT_END;
    m.u.snap_session = s->info.session;
    embps_ticket_t *t;
    embps_msg_t r;
    size_t n;
    rc = embps_client_request_(s->c, s->server, &m, NULL, 0, &t);
    if (!rc)
      rc = embps_client_reply_(s->c, t, &r, &n);
    if (!rc)
      embps_msg_free(&r);
    if (s->failed || !s->done)
      rc = 0; /* best effort: the error that matters came before */
  }
  for (uint32_t i = 0; i < s->n_slots; i++)
    free(s->slot[i].buf);
  free(s);
  return rc;
}

int embps_snapshot_copy(embps_client_t *c, uint32_t server,
                        const embps_snapshot_options_t *o,
                        const embps_snapshot_sink_t *sink, void *ctx,
                        embps_snapshot_info_t *info,
                        embps_snapstream_end_t *end) {
  embps_snapshot_t *s;
  int rc = embps_snapshot_begin(c, server, o, &s);
  if (rc)
    return rc;
  if (info)
    *info = s->info;
  char err[1024] = "";
  int code = EMBPS_EPROTO; /* a stream that does not parse */
  embps_snapstream_reader_t r;
  embps_snapstream_reader_init(&r, embps_snapshot_reader_next, s);
  embps_snapstream_head_t h;
  rc = embps_snapstream_head(&r, &h, err, sizeof err);
  if (!rc && (h.lsn != s->info.lsn ||
              h.cluster_index != s->info.cluster_index)) {
    snprintf(err, sizeof err, "snapshot stream: its head names another LSN "
             "or cluster slot than its session");
    rc = -1;
  }
  if (!rc && (rc = sink->head(ctx, &h, err, sizeof err)))
    code = EMBPS_EIO;
  while (!rc) {
    embps_snapstream_entry_t e;
    int got = embps_snapstream_entry(&r, &e, err, sizeof err);
    if (got <= 0) {
      rc = got;
      break;
    }
    char name[64];
    embps_snapstream_entry_name(&e, name, sizeof name);
    if (sink->file(ctx, &e, name, err, sizeof err)) {
      code = EMBPS_EIO;
      rc = -1;
    }
    free(e.info);
    for (;;) {
      const uint8_t *p;
      size_t n;
      if (rc || embps_snapstream_piece(&r, &p, &n, err, sizeof err)) {
        rc = -1;
        break;
      }
      if (!n)
        break;
      if (sink->write(ctx, p, n, err, sizeof err)) {
        code = EMBPS_EIO;
        rc = -1;
      }
    }
    uint64_t bytes = embps_snapstream_file_off(&r);
    if (!rc && sink->file_end(ctx, bytes, err, sizeof err)) {
      code = EMBPS_EIO;
      rc = -1;
    }
  }
  if (rc) {
    if (s->failed && s->err_code) /* the transport's or the server's */
      code = s->err_code;
    s->failed = 1;
    embps_snapshot_end(s);
    return embps_client_set_error_(c, code, err);
  }
  if (end)
    *end = r.end;
  return embps_snapshot_end(s);
}
