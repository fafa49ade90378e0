/* framer.c - the incremental frame reader (see framer.h).
 *
 * A framer is in one of four phases:
 *   HEADER   gathering the 16 header bytes in hdr (hdr_got of them);
 *   BODY     filling the owner's segments: seg[seg_i] has seg_got bytes,
 *            the body body_got in all (always < h.body_len here);
 *   SKIP     discarding a body: body_got of h.body_len bytes gone;
 *   STOPPED  a callback said stop: nothing is read until a reset.
 * Every byte goes through step(), whether it was read in place (advance)
 * or copied (feed), so the two ways cannot disagree. */
#include "framer.h"

#include <assert.h>
#include <string.h>

#include "embps/embps.h"

enum { HEADER, BODY, SKIP, STOPPED };

void embps_framer_init(embps_framer_t *f, const embps_framer_ops_t *ops,
                       void *owner, size_t limit) {
  memset(f, 0, sizeof *f);
  f->ops = ops;
  f->owner = owner;
  f->limit = limit;
  f->phase = HEADER;
}

void embps_framer_reset(embps_framer_t *f) {
  embps_framer_init(f, f->ops, f->owner, f->limit);
}

void embps_framer_set_limit(embps_framer_t *f, size_t limit) {
  f->limit = limit;
}

/* The first segment from i on with bytes to fill, or 2. */
static int next_seg(const embps_framer_t *f, int i) {
  while (i < 2 && f->seg[i].len == 0)
    i++;
  return i;
}

/* The body is in (or skipped): back to a header, then tell the owner. */
static int body_done(embps_framer_t *f, int told) {
  f->phase = HEADER;
  f->hdr_got = 0;
  if (!told)
    return 0;
  if (f->ops->frame(f->owner, &f->h) == EMBPS_FRAMER_READ)
    return 0;
  f->phase = STOPPED;
  return EMBPS_FRAMER_STOP;
}

/* The header is in: decode it and ask the owner where the body goes. */
static int header_done(embps_framer_t *f) {
  memset(&f->h, 0, sizeof f->h);
  int rc = embps_frame_header_decode(f->hdr, f->limit, &f->h);
  memset(f->seg, 0, sizeof f->seg);
  int next = f->ops->header(f->owner, &f->h, rc, f->seg);
  f->body_got = 0;
  if (next == EMBPS_FRAMER_READ && rc == 0) {
    assert(f->seg[0].len + f->seg[1].len == f->h.body_len);
    if (f->h.body_len == 0)
      return body_done(f, 1);
    f->phase = BODY;
    f->seg_i = next_seg(f, 0);
    f->seg_got = 0;
    return 0;
  }
  if (next == EMBPS_FRAMER_SKIP && rc != EMBPS_EPROTO) {
    if (f->h.body_len == 0)
      return body_done(f, 0);
    f->phase = SKIP;
    return 0;
  }
  f->phase = STOPPED;
  return EMBPS_FRAMER_STOP;
}

/* n bytes of the stream (0 < n <= what the phase still takes) are where
 * they belong. */
static int step(embps_framer_t *f, size_t n) {
  switch (f->phase) {
  case HEADER:
    f->hdr_got += n;
    return f->hdr_got == EMBPS_FRAME_HEADER_LEN ? header_done(f) : 0;
  case BODY:
    f->body_got += n;
    f->seg_got += n;
    if (f->seg_got == f->seg[f->seg_i].len) {
      f->seg_i = next_seg(f, f->seg_i + 1);
      f->seg_got = 0;
    }
    return f->body_got == f->h.body_len ? body_done(f, 1) : 0;
  case SKIP:
    f->body_got += n;
    return f->body_got == f->h.body_len ? body_done(f, 0) : 0;
  default:
    return EMBPS_FRAMER_STOP;
  }
}

/* How many bytes the current phase still takes (0 once stopped). */
static size_t phase_left(const embps_framer_t *f) {
  switch (f->phase) {
  case HEADER:
    return EMBPS_FRAME_HEADER_LEN - f->hdr_got;
  case BODY:
    return f->seg[f->seg_i].len - f->seg_got;
  case SKIP:
    return f->h.body_len - f->body_got;
  default:
    return 0;
  }
}

size_t embps_framer_want(const embps_framer_t *f, uint8_t **dst) {
  switch (f->phase) {
  case HEADER:
    *dst = (uint8_t *)f->hdr + f->hdr_got;
    return phase_left(f);
  case BODY:
    *dst = f->seg[f->seg_i].p + f->seg_got;
    return phase_left(f);
  default:
    *dst = NULL;
    return 0;
  }
}

int embps_framer_advance(embps_framer_t *f, size_t n) {
  if (f->phase == STOPPED)
    return EMBPS_FRAMER_STOP;
  assert(n > 0 && n <= phase_left(f) && f->phase != SKIP);
  return step(f, n);
}

int embps_framer_feed(embps_framer_t *f, const uint8_t *p, size_t n) {
  while (n) {
    size_t take = phase_left(f);
    if (!take)
      return EMBPS_FRAMER_STOP;
    if (take > n)
      take = n;
    uint8_t *dst;
    if (embps_framer_want(f, &dst))
      memcpy(dst, p, take);
    p += take;
    n -= take;
    int rc = step(f, take);
    if (rc)
      return rc;
  }
  return 0;
}

size_t embps_framer_body_left(const embps_framer_t *f) {
  return f->phase == BODY ? f->h.body_len - f->body_got : 0;
}
