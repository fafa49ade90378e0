/* framer.h - the one frame reader: turns a byte stream, arriving in chunks
 * of any size, into frames (frame.h). The server reads its connections
 * with it (server/conn.c), the client its replies (client/transport.c).
 *
 * A framer gathers the 16-byte header, decodes it against its limit
 * before anything is allocated, and asks its owner where the body's bytes
 * go (the header callback: up to two segments of the owner's memory, or
 * skip the body, or stop); once the body is in, it says so (the frame
 * callback). It never allocates and never copies a body twice: bytes come
 * in either way, mixed as the owner likes,
 *   - in place: embps_framer_want() says where the next bytes go and how
 *     many belong there; the owner reads them straight there (a recv into
 *     a request's body) and calls embps_framer_advance();
 *   - from a buffer: embps_framer_feed() copies them out of the owner's
 *     staging buffer, many small frames at a time.
 * The callbacks run inside advance and feed. They may change the limit,
 * but not reset the framer: after a STOP its owner resets it when it
 * wants more frames (a new connection). */
#ifndef EMBPS_FRAMER_H
#define EMBPS_FRAMER_H
#include <stddef.h>
#include <stdint.h>

#include "frame.h"

/* Where a body goes: segments filled in order; lengths may be 0. */
typedef struct {
  uint8_t *p;
  size_t len;
} embps_framer_seg_t;

/* What the callbacks return. */
enum {
  EMBPS_FRAMER_READ = 0, /* header: read the body into the segments;
                            frame: go on with the next frame */
  EMBPS_FRAMER_SKIP = 1, /* header: discard the body's bytes unread */
  EMBPS_FRAMER_STOP = 2, /* stop here: the rest of the input is not read */
};

typedef struct {
  /* A header is in. rc 0: h is checked (body_len within the limit, the
   * padded meta inside the body); fill seg[0] and seg[1] (their lengths
   * must add up to h->body_len) and return READ, or return SKIP or STOP.
   * rc EMBPS_EFRAMESIZE: h is filled but body_len passes the limit; return
   * SKIP (the stream goes on after the body) or STOP. rc EMBPS_EPROTO: not
   * a header (bad magic, meta past the body): the stream is lost. Any
   * other answer counts as STOP. */
  int (*header)(void *owner, const embps_frame_header_t *h, int rc,
                embps_framer_seg_t seg[2]);
  /* The body of the frame whose header is h is in its segments (the
   * framer already waits for the next header). Return READ or STOP. */
  int (*frame)(void *owner, const embps_frame_header_t *h);
} embps_framer_ops_t;

typedef struct {
  const embps_framer_ops_t *ops;
  void *owner;
  size_t limit; /* largest body_len accepted */
  int phase;    /* see framer.c */
  uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
  size_t hdr_got;
  embps_frame_header_t h; /* the frame being read (phase BODY, SKIP) */
  embps_framer_seg_t seg[2];
  int seg_i;       /* the segment being filled */
  size_t seg_got;  /* bytes of it filled */
  size_t body_got; /* bytes of the body in (or skipped) */
} embps_framer_t;

/* A framer waiting for a header, bodies up to limit bytes. ops and owner
 * must outlive it. */
void embps_framer_init(embps_framer_t *f, const embps_framer_ops_t *ops,
                       void *owner, size_t limit);
/* Back to waiting for a header (a new connection), forgetting any frame
 * half read and a stop. */
void embps_framer_reset(embps_framer_t *f);
/* The limit for the headers still to come (the one being gathered
 * included). */
void embps_framer_set_limit(embps_framer_t *f, size_t limit);

/* Where the next bytes of the stream go if read in place, and how many
 * belong there (> 0). Returns 0 (*dst NULL) when they cannot be read in
 * place: while a body is skipped (feed them), or after a stop. */
size_t embps_framer_want(const embps_framer_t *f, uint8_t **dst);
/* n bytes (0 < n <= want's count) were written where want said. Runs the
 * callbacks they complete. Returns 0, or EMBPS_FRAMER_STOP once a callback
 * stopped (then, until a reset, nothing more is read). */
int embps_framer_advance(embps_framer_t *f, size_t n);
/* Reads n bytes from p (copying them where want would say), running the
 * callbacks. Returns 0 when all were taken, or EMBPS_FRAMER_STOP when a
 * callback stopped, or had stopped before (the bytes after the stop were
 * not taken). */
int embps_framer_feed(embps_framer_t *f, const uint8_t *p, size_t n);

/* Bytes of the current frame's body still to come into its segments (0
 * while a header is gathered, a body skipped, or after a stop). */
size_t embps_framer_body_left(const embps_framer_t *f);
#endif
