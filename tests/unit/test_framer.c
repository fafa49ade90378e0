/* test_framer.c - unit tests of the incremental frame reader
 * (common/framer.c), on a stream of known frames:
 *  - fed whole, a byte at a time, and in every chunk size 1..64, the same
 *    frames come out, bodies intact, an empty body included;
 *  - read in place (want/advance, as a recv into a body), the bytes land
 *    exactly where want said, mixed with feed, and body_left counts down;
 *  - two segments (a pull reply's meta and rows) are filled in order, an
 *    empty first one skipped;
 *  - the owner may skip any body at its header, an empty one too;
 *  - an oversized header reaches the owner with its header decoded, before
 *    any body is asked for: skipped, the next frame is read; stopped,
 *    nothing more is read (feed, advance, want) until a reset;
 *  - a bad magic stops, whatever the owner answers;
 *  - a limit raised by a frame callback (a hello) applies to the next
 *    header;
 *  - a frame callback's stop leaves the bytes after it unread. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "embps/embps.h"
#include "framer.h"

#define MAX_FRAMES 16

/* The owner: records what it is told, answers as set. */
typedef struct {
  embps_framer_t *f;
  int n_headers, n_frames;
  embps_frame_header_t hdr[MAX_FRAMES];
  int rc[MAX_FRAMES];
  uint8_t *body[MAX_FRAMES]; /* one exact-size buffer per frame */
  size_t split;      /* > 0: bodies go to two segments, split at this */
  uint8_t *second;   /* ...the second a buffer of its own */
  int oversized;     /* the answer to EMBPS_EFRAMESIZE */
  int bad;           /* the answer to EMBPS_EPROTO */
  int stop_at_frame; /* frame number whose callback stops, or -1 */
  uint16_t skip_kind; /* > 0: frames of this kind are skipped unread */
  size_t raise_to;   /* > 0: the first frame raises the limit to it */
} owner_t;

static int on_header(void *arg, const embps_frame_header_t *h, int rc,
                     embps_framer_seg_t seg[2]) {
  owner_t *o = arg;
  assert_true(o->n_headers < MAX_FRAMES);
  o->hdr[o->n_headers] = *h;
  o->rc[o->n_headers++] = rc;
  if (rc == EMBPS_EFRAMESIZE)
    return o->oversized;
  if (rc)
    return o->bad;
  if (o->skip_kind && h->kind == o->skip_kind)
    return EMBPS_FRAMER_SKIP;
  uint8_t *b = malloc(h->body_len ? h->body_len : 1);
  assert_non_null(b);
  o->body[o->n_frames] = b;
  if (o->split && o->split <= h->body_len) {
    free(o->second);
    o->second = malloc(h->body_len - o->split + 1);
    seg[0] = (embps_framer_seg_t){b, o->split};
    seg[1] = (embps_framer_seg_t){o->second, h->body_len - o->split};
  } else {
    seg[0] = (embps_framer_seg_t){b, h->body_len};
  }
  return EMBPS_FRAMER_READ;
}

static int on_frame(void *arg, const embps_frame_header_t *h) {
  owner_t *o = arg;
  int i = o->n_frames++;
  assert_int_equal(embps_framer_body_left(o->f), 0);
  if (o->split && o->split <= h->body_len) /* gather the second segment */
    memcpy(o->body[i] + o->split, o->second, h->body_len - o->split);
  if (o->raise_to && i == 0)
    embps_framer_set_limit(o->f, o->raise_to);
  return i == o->stop_at_frame ? EMBPS_FRAMER_STOP : EMBPS_FRAMER_READ;
}

static const embps_framer_ops_t ops = {on_header, on_frame};

static void owner_init(owner_t *o, embps_framer_t *f, size_t limit) {
  memset(o, 0, sizeof *o);
  o->f = f;
  o->oversized = EMBPS_FRAMER_SKIP;
  o->bad = EMBPS_FRAMER_STOP;
  o->stop_at_frame = -1;
  embps_framer_init(f, &ops, o, limit);
}

static void owner_close(owner_t *o) {
  for (int i = 0; i < o->n_frames; i++)
    free(o->body[i]);
  free(o->second);
}

/* ------------------------------------------------------------ the stream */

typedef struct {
  uint8_t buf[4096];
  size_t len;
  int n;
  embps_frame_header_t h[MAX_FRAMES];
  size_t at[MAX_FRAMES]; /* where each body starts in buf */
} stream_t;

/* Appends a frame of body_len bytes (meta_len of them meta), its body
 * bytes a function of (req_id, position). */
static void put_frame(stream_t *s, uint32_t body_len, uint32_t meta_len,
                      uint16_t kind) {
  embps_frame_header_t h = {body_len, meta_len, 100u + (uint32_t)s->n, kind};
  assert_true(s->len + EMBPS_FRAME_HEADER_LEN + body_len <= sizeof s->buf);
  embps_frame_header_encode(&h, s->buf + s->len);
  s->len += EMBPS_FRAME_HEADER_LEN;
  s->h[s->n] = h;
  s->at[s->n++] = s->len;
  for (uint32_t i = 0; i < body_len; i++)
    s->buf[s->len++] = (uint8_t)(h.req_id * 7 + i * 13);
}

/* Five frames: small, empty, a pull reply with rows, one byte, large. */
static void five_frames(stream_t *s) {
  memset(s, 0, sizeof *s);
  put_frame(s, 24, 20, EMBPS_KIND_HELLO);
  put_frame(s, 0, 0, EMBPS_KIND_LIST);
  put_frame(s, 8 + 3 * 16, 5, EMBPS_KIND_PULL | EMBPS_KIND_REPLY);
  put_frame(s, 1, 0, EMBPS_KIND_DROP);
  put_frame(s, 1500, 40, EMBPS_KIND_PUSH);
}

/* o saw frames [0, n) of s, whole and in order. */
static void saw_frames(const owner_t *o, const stream_t *s, int n) {
  assert_int_equal(o->n_frames, n);
  for (int i = 0; i < n; i++) {
    assert_int_equal(o->rc[i], 0);
    assert_int_equal(o->hdr[i].req_id, s->h[i].req_id);
    assert_int_equal(o->hdr[i].kind, s->h[i].kind);
    assert_int_equal(o->hdr[i].body_len, s->h[i].body_len);
    assert_int_equal(o->hdr[i].meta_len, s->h[i].meta_len);
    assert_memory_equal(o->body[i], s->buf + s->at[i], s->h[i].body_len);
  }
}

/* ------------------------------------------------------------ tests */

static void test_any_chunking(void **state) {
  (void)state;
  stream_t s;
  five_frames(&s);
  for (size_t step = 1; step <= 64; step++) {
    embps_framer_t f;
    owner_t o;
    owner_init(&o, &f, 1u << 20);
    for (size_t pos = 0; pos < s.len; pos += step) {
      size_t k = s.len - pos < step ? s.len - pos : step;
      assert_int_equal(embps_framer_feed(&f, s.buf + pos, k), 0);
    }
    saw_frames(&o, &s, s.n);
    assert_int_equal(o.n_headers, s.n);
    owner_close(&o);
  }
  embps_framer_t f; /* all at once */
  owner_t o;
  owner_init(&o, &f, 1u << 20);
  assert_int_equal(embps_framer_feed(&f, s.buf, s.len), 0);
  saw_frames(&o, &s, s.n);
  owner_close(&o);
}

static void test_in_place(void **state) {
  (void)state;
  stream_t s;
  five_frames(&s);
  for (size_t cap = 1; cap <= 40; cap += 3) {
    embps_framer_t f;
    owner_t o;
    owner_init(&o, &f, 1u << 20);
    size_t pos = 0;
    int turn = 0;
    while (pos < s.len) {
      uint8_t *dst;
      size_t want = embps_framer_want(&f, &dst);
      assert_true(want > 0 && dst != NULL);
      size_t left = embps_framer_body_left(&f);
      size_t k = want < cap ? want : cap;
      if (k > s.len - pos)
        k = s.len - pos;
      if (turn++ % 3 == 2) { /* now and then, a copy */
        assert_int_equal(embps_framer_feed(&f, s.buf + pos, k), 0);
      } else {
        memcpy(dst, s.buf + pos, k);
        assert_int_equal(embps_framer_advance(&f, k), 0);
      }
      if (left) /* in a body: it lacks k bytes fewer */
        assert_int_equal(embps_framer_body_left(&f), left - k);
      pos += k;
    }
    saw_frames(&o, &s, s.n);
    owner_close(&o);
  }
}

/* Reading in place: want points into the owner's segment, the header
 * buffer before that. */
static void test_want_points_into_segments(void **state) {
  (void)state;
  stream_t s;
  memset(&s, 0, sizeof s);
  put_frame(&s, 8 + 2 * 16, 8, EMBPS_KIND_PULL | EMBPS_KIND_REPLY);
  embps_framer_t f;
  owner_t o;
  owner_init(&o, &f, 1u << 20);
  o.split = 8; /* meta, then the rows */
  uint8_t *dst;
  assert_int_equal(embps_framer_want(&f, &dst), EMBPS_FRAME_HEADER_LEN);
  assert_int_equal(embps_framer_body_left(&f), 0);
  assert_int_equal(embps_framer_feed(&f, s.buf, EMBPS_FRAME_HEADER_LEN), 0);
  assert_int_equal(o.n_headers, 1);
  assert_int_equal(embps_framer_want(&f, &dst), 8);
  assert_ptr_equal(dst, o.body[0]);
  assert_int_equal(embps_framer_body_left(&f), 40);
  memcpy(dst, s.buf + s.at[0], 8);
  assert_int_equal(embps_framer_advance(&f, 8), 0);
  assert_int_equal(embps_framer_body_left(&f), 32); /* the whole body's */
  assert_int_equal(embps_framer_want(&f, &dst), 32);
  assert_ptr_equal(dst, o.second);
  memcpy(dst, s.buf + s.at[0] + 8, 32);
  assert_int_equal(embps_framer_advance(&f, 32), 0);
  saw_frames(&o, &s, 1);
  owner_close(&o);
}

/* seg[0] empty, all of the body in seg[1]. */
static int header_second_only(void *arg, const embps_frame_header_t *h,
                              int rc, embps_framer_seg_t seg[2]) {
  uint8_t *b = arg;
  assert_int_equal(rc, 0);
  seg[0] = (embps_framer_seg_t){NULL, 0};
  seg[1] = (embps_framer_seg_t){b, h->body_len};
  return EMBPS_FRAMER_READ;
}

static int frame_count(void *arg, const embps_frame_header_t *h) {
  (void)h;
  ((uint8_t *)arg)[63]++;
  return EMBPS_FRAMER_READ;
}

static void test_empty_first_segment(void **state) {
  (void)state;
  stream_t s;
  memset(&s, 0, sizeof s);
  put_frame(&s, 16, 0, EMBPS_KIND_PULL | EMBPS_KIND_REPLY);
  uint8_t b[64] = {0};
  const embps_framer_ops_t o2 = {header_second_only, frame_count};
  embps_framer_t f;
  embps_framer_init(&f, &o2, b, 1u << 20);
  assert_int_equal(embps_framer_feed(&f, s.buf, EMBPS_FRAME_HEADER_LEN), 0);
  uint8_t *dst;
  assert_int_equal(embps_framer_want(&f, &dst), 16);
  assert_ptr_equal(dst, b);
  assert_int_equal(embps_framer_feed(&f, s.buf + s.at[0], 16), 0);
  assert_memory_equal(b, s.buf + s.at[0], 16);
  assert_int_equal(b[63], 1);
}

/* A 300-byte frame between two small ones, with a 100-byte limit. */
static void oversized_stream(stream_t *s) {
  memset(s, 0, sizeof *s);
  put_frame(s, 10, 2, EMBPS_KIND_HELLO);
  put_frame(s, 300, 4, EMBPS_KIND_PUSH);
  put_frame(s, 20, 3, EMBPS_KIND_LIST);
}

static void test_oversized_skipped(void **state) {
  (void)state;
  stream_t s;
  oversized_stream(&s);
  for (size_t step = 1; step <= s.len; step += 37) {
    embps_framer_t f;
    owner_t o;
    owner_init(&o, &f, 100);
    for (size_t pos = 0; pos < s.len; pos += step) {
      size_t k = s.len - pos < step ? s.len - pos : step;
      uint8_t *dst;
      if (pos >= s.at[1] && pos < s.at[1] + 300) { /* skipping */
        assert_int_equal(embps_framer_want(&f, &dst), 0);
        assert_null(dst);
        assert_int_equal(embps_framer_body_left(&f), 0);
      }
      assert_int_equal(embps_framer_feed(&f, s.buf + pos, k), 0);
    }
    assert_int_equal(o.n_headers, 3);
    assert_int_equal(o.rc[1], EMBPS_EFRAMESIZE);
    assert_int_equal(o.hdr[1].body_len, 300); /* decoded for the error */
    assert_int_equal(o.hdr[1].req_id, s.h[1].req_id);
    assert_int_equal(o.n_frames, 2); /* no body was asked for */
    assert_int_equal(o.hdr[2].req_id, s.h[2].req_id);
    assert_memory_equal(o.body[1], s.buf + s.at[2], 20);
    owner_close(&o);
  }
}

/* The owner may skip any frame at its header, an empty one too. */
static void test_skip_at_header(void **state) {
  (void)state;
  stream_t s;
  five_frames(&s);
  const uint16_t kinds[] = {EMBPS_KIND_LIST, EMBPS_KIND_PUSH,
                            EMBPS_KIND_HELLO};
  for (int i = 0; i < 3; i++) {
    for (size_t step = 1; step <= 301; step += 100) {
      embps_framer_t f;
      owner_t o;
      owner_init(&o, &f, 1u << 20);
      o.skip_kind = kinds[i];
      for (size_t pos = 0; pos < s.len; pos += step) {
        size_t k = s.len - pos < step ? s.len - pos : step;
        assert_int_equal(embps_framer_feed(&f, s.buf + pos, k), 0);
      }
      assert_int_equal(o.n_headers, s.n);
      assert_int_equal(o.n_frames, s.n - 1);
      for (int j = 0, b = 0; j < s.n; j++) {
        if (s.h[j].kind == kinds[i])
          continue;
        assert_int_equal(o.hdr[j].req_id, s.h[j].req_id);
        assert_memory_equal(o.body[b++], s.buf + s.at[j], s.h[j].body_len);
      }
      owner_close(&o);
    }
  }
}

static void test_oversized_stopped_and_reset(void **state) {
  (void)state;
  stream_t s;
  oversized_stream(&s);
  embps_framer_t f;
  owner_t o;
  owner_init(&o, &f, 100);
  o.oversized = EMBPS_FRAMER_STOP;
  assert_int_equal(embps_framer_feed(&f, s.buf, s.len), EMBPS_FRAMER_STOP);
  assert_int_equal(o.n_headers, 2);
  assert_int_equal(o.n_frames, 1);
  /* stopped: nothing more is taken, whatever the way */
  uint8_t *dst = (uint8_t *)&s;
  assert_int_equal(embps_framer_want(&f, &dst), 0);
  assert_null(dst);
  assert_int_equal(embps_framer_body_left(&f), 0);
  assert_int_equal(embps_framer_feed(&f, s.buf, s.len), EMBPS_FRAMER_STOP);
  assert_int_equal(embps_framer_advance(&f, 1), EMBPS_FRAMER_STOP);
  assert_int_equal(o.n_headers, 2);
  /* a reset starts over (a new connection), the limit kept */
  embps_framer_reset(&f);
  assert_int_equal(embps_framer_want(&f, &dst), EMBPS_FRAME_HEADER_LEN);
  assert_int_equal(embps_framer_feed(&f, s.buf, s.at[1]), EMBPS_FRAMER_STOP);
  assert_int_equal(o.n_frames, 2);
  assert_int_equal(o.rc[3], EMBPS_EFRAMESIZE);
  owner_close(&o);
}

static void test_bad_magic_stops(void **state) {
  (void)state;
  stream_t s;
  five_frames(&s);
  s.buf[s.at[1] - 1] ^= 0x20; /* the second header's magic */
  const int answers[] = {EMBPS_FRAMER_READ, EMBPS_FRAMER_SKIP,
                         EMBPS_FRAMER_STOP};
  for (int a = 0; a < 3; a++) {
    embps_framer_t f;
    owner_t o;
    owner_init(&o, &f, 1u << 20);
    o.bad = answers[a]; /* anything counts as a stop */
    assert_int_equal(embps_framer_feed(&f, s.buf, s.len), EMBPS_FRAMER_STOP);
    assert_int_equal(o.n_headers, 2);
    assert_int_equal(o.rc[1], EMBPS_EPROTO);
    assert_int_equal(o.n_frames, 1);
    uint8_t *dst;
    assert_int_equal(embps_framer_want(&f, &dst), 0);
    owner_close(&o);
  }
}

/* The pre-hello limit: the hello raises it from its frame callback, and
 * the next header, already half in, is decoded with the new one. */
static void test_limit_raised_by_a_frame(void **state) {
  (void)state;
  stream_t s;
  oversized_stream(&s);
  embps_framer_t f;
  owner_t o;
  owner_init(&o, &f, 100);
  o.oversized = EMBPS_FRAMER_STOP;
  o.raise_to = 1000;
  /* the hello and half the next header, then the rest */
  size_t cut = s.at[1] - 7;
  assert_int_equal(embps_framer_feed(&f, s.buf, cut), 0);
  assert_int_equal(o.n_frames, 1);
  assert_int_equal(embps_framer_feed(&f, s.buf + cut, s.len - cut), 0);
  saw_frames(&o, &s, 3);
  owner_close(&o);

  owner_init(&o, &f, 100); /* without the raise: refused */
  o.oversized = EMBPS_FRAMER_STOP;
  assert_int_equal(embps_framer_feed(&f, s.buf, s.len), EMBPS_FRAMER_STOP);
  assert_int_equal(o.rc[1], EMBPS_EFRAMESIZE);
  owner_close(&o);
}

static void test_frame_stop_leaves_the_rest(void **state) {
  (void)state;
  stream_t s;
  five_frames(&s);
  embps_framer_t f;
  owner_t o;
  owner_init(&o, &f, 1u << 20);
  o.stop_at_frame = 1; /* the empty one: stopped from inside its header */
  assert_int_equal(embps_framer_feed(&f, s.buf, s.len), EMBPS_FRAMER_STOP);
  assert_int_equal(o.n_headers, 2);
  saw_frames(&o, &s, 2);
  owner_close(&o);

  owner_init(&o, &f, 1u << 20); /* in place, the last byte of a body */
  o.stop_at_frame = 0;
  uint8_t *dst;
  assert_int_equal(embps_framer_feed(&f, s.buf, s.at[0] + 23), 0);
  assert_int_equal(embps_framer_want(&f, &dst), 1);
  *dst = s.buf[s.at[0] + 23];
  assert_int_equal(embps_framer_advance(&f, 1), EMBPS_FRAMER_STOP);
  saw_frames(&o, &s, 1);
  assert_int_equal(embps_framer_feed(&f, s.buf + s.at[1] - 16, 16),
                   EMBPS_FRAMER_STOP);
  assert_int_equal(o.n_headers, 1);
  owner_close(&o);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_any_chunking),
      cmocka_unit_test(test_in_place),
      cmocka_unit_test(test_want_points_into_segments),
      cmocka_unit_test(test_empty_first_segment),
      cmocka_unit_test(test_oversized_skipped),
      cmocka_unit_test(test_skip_at_header),
      cmocka_unit_test(test_oversized_stopped_and_reset),
      cmocka_unit_test(test_bad_magic_stops),
      cmocka_unit_test(test_limit_raised_by_a_frame),
      cmocka_unit_test(test_frame_stop_leaves_the_rest),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
