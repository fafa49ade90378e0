/* fuzz_framer.c - libFuzzer target: the incremental frame reader
 * (common/framer.c) against a naive parser of the whole buffer.
 *
 * Input: 10 bytes of set-up, then the stream.
 *   [0] bits 0-2  the limit until the first whole frame (LIMITS[]), bits
 *                 3-5 the limit after it (as a server raises it after a
 *                 hello), bit 6 an oversized frame is skipped (else the
 *                 owner stops; a header that is not one is "skipped" too,
 *                 which must stop), bit 7 bodies go to two segments (meta,
 *                 bulk) in separate buffers, as the client reads pulls
 *   [1]           k != 0: a frame whose kind's low byte is k stops the
 *                 owner after its body; one whose low byte is ~k is
 *                 skipped at its header
 *   [2..9]        seed of the chunking
 * The naive parser walks the whole buffer and lists what the owner must
 * see: each header with its decode result, and each whole frame's body.
 * The framer is then run four times, on the stream fed whole, a byte at a
 * time, and in two random chunkings mixing copies (feed) with reads in
 * place (want/advance) of random sizes; each run must show exactly that
 * list, bodies byte for byte, and stop where the parser stopped.
 *
 * Invariants besides: want never offers more than its phase takes, and
 * nothing once stopped or skipping; body_left counts what the body still
 * lacks; after a stop nothing more is taken; segments are filled exactly
 * (each body buffer has its exact size, so ASan sees any overrun). */
#include "framer.h"
#include "fuzz.h"

#include "embps/embps.h"

#define MAX_EVENTS 4096

/* Bodies are allocated whole at their header, as a server does: at most
 * a MiB, so a fuzzed header cannot exhaust memory. */
static const size_t LIMITS[8] = {0, 16, 64, 300, 4096, 65536, 1u << 18,
                                 1u << 20};

typedef struct {
  int frame; /* 0: a header callback, 1: a frame callback */
  embps_frame_header_t h;
  int rc;                /* header: the decode result */
  const uint8_t *body;   /* frame: its bytes in the input */
} event_t;

typedef struct {
  size_t limit_first, limit_after;
  int skip_oversized, split;
  uint8_t stop_kind;
} setup_t;

/* What the owner answers at a header, the naive parser and the framer's
 * owner alike. */
static int header_answer(const setup_t *su, const embps_frame_header_t *h,
                         int rc) {
  if (rc) /* a skip of a bad header (not one) must count as a stop */
    return su->skip_oversized ? EMBPS_FRAMER_SKIP : EMBPS_FRAMER_STOP;
  if (su->stop_kind && (uint8_t)h->kind == (uint8_t)~su->stop_kind)
    return EMBPS_FRAMER_SKIP;
  return EMBPS_FRAMER_READ;
}

static int frame_answer(const setup_t *su, const embps_frame_header_t *h) {
  return su->stop_kind && (uint8_t)h->kind == su->stop_kind
             ? EMBPS_FRAMER_STOP
             : EMBPS_FRAMER_READ;
}

/* The naive parser: the events the owner must see, and whether they end
 * with a stop. */
static size_t expect(const setup_t *su, const uint8_t *p, size_t n,
                     event_t *ev, int *stopped) {
  size_t pos = 0, n_ev = 0, frames = 0;
  *stopped = 0;
  while (n - pos >= EMBPS_FRAME_HEADER_LEN && n_ev + 2 <= MAX_EVENTS) {
    event_t *e = &ev[n_ev++];
    memset(e, 0, sizeof *e);
    e->rc = embps_frame_header_decode(
        p + pos, frames ? su->limit_after : su->limit_first, &e->h);
    pos += EMBPS_FRAME_HEADER_LEN;
    int answer = header_answer(su, &e->h, e->rc);
    if (answer == EMBPS_FRAMER_STOP || e->rc == EMBPS_EPROTO) {
      *stopped = 1;
      break;
    }
    size_t body = e->h.body_len;
    if (answer == EMBPS_FRAMER_SKIP) {
      pos += body < n - pos ? body : n - pos;
      continue;
    }
    if (n - pos < body)
      break; /* the body is still to come */
    ev[n_ev] = (event_t){.frame = 1, .h = e->h, .body = p + pos};
    n_ev++;
    pos += body;
    frames++;
    if (frame_answer(su, &e->h) == EMBPS_FRAMER_STOP) {
      *stopped = 1;
      break;
    }
  }
  return n_ev;
}

/* ------------------------------------------------------------ the owner */

typedef struct {
  const setup_t *su;
  const event_t *ev;
  size_t n_ev, seen, frames;
  embps_framer_t *f;
  uint8_t *buf[2]; /* the current body's segments, exact sizes */
  size_t len[2];
} owner_t;

static void drop_body(owner_t *o) {
  for (int i = 0; i < 2; i++) {
    free(o->buf[i]);
    o->buf[i] = NULL;
    o->len[i] = 0;
  }
}

static void same_header(const embps_frame_header_t *a,
                        const embps_frame_header_t *b) {
  FUZZ_CHECK(a->body_len == b->body_len && a->meta_len == b->meta_len &&
             a->req_id == b->req_id && a->kind == b->kind);
}

static int on_header(void *owner, const embps_frame_header_t *h, int rc,
                     embps_framer_seg_t seg[2]) {
  owner_t *o = owner;
  FUZZ_CHECK(o->seen < o->n_ev);
  const event_t *e = &o->ev[o->seen++];
  FUZZ_CHECK(!e->frame && e->rc == rc);
  same_header(h, &e->h);
  FUZZ_CHECK(seg[0].len == 0 && seg[1].len == 0); /* nothing given yet */
  int answer = header_answer(o->su, h, rc);
  if (answer != EMBPS_FRAMER_READ)
    return answer;
  FUZZ_CHECK(h->body_len <= o->f->limit);
  size_t split = o->su->split ? embps_bulk_offset(h->meta_len) : h->body_len;
  FUZZ_CHECK(split <= h->body_len);
  o->len[0] = split;
  o->len[1] = h->body_len - split;
  for (int i = 0; i < 2; i++) {
    o->buf[i] = o->len[i] ? malloc(o->len[i]) : NULL;
    FUZZ_CHECK(!o->len[i] || o->buf[i]);
    seg[i] = (embps_framer_seg_t){o->buf[i], o->len[i]};
  }
  return EMBPS_FRAMER_READ;
}

static int on_frame(void *owner, const embps_frame_header_t *h) {
  owner_t *o = owner;
  FUZZ_CHECK(o->seen < o->n_ev);
  const event_t *e = &o->ev[o->seen++];
  FUZZ_CHECK(e->frame);
  same_header(h, &e->h);
  FUZZ_CHECK(embps_framer_body_left(o->f) == 0);
  if (o->len[0])
    FUZZ_CHECK(memcmp(o->buf[0], e->body, o->len[0]) == 0);
  if (o->len[1])
    FUZZ_CHECK(memcmp(o->buf[1], e->body + o->len[0], o->len[1]) == 0);
  drop_body(o);
  if (++o->frames == 1) /* a hello: the limit changes from the next one */
    embps_framer_set_limit(o->f, o->su->limit_after);
  return frame_answer(o->su, h);
}

static const embps_framer_ops_t ops = {on_header, on_frame};

/* ------------------------------------------------------------ the runs */

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* A chunk size: mostly small, sometimes large. */
static size_t chunk(uint64_t *rng) {
  uint64_t r = rng_next(rng);
  return 1 + (size_t)((r >> 8) % ((uint64_t)1 << (r % 13)));
}

enum { WHOLE, BYTES, RANDOM };

/* Runs the framer over p[0, n) in the given way; checks it saw ev. */
static void run(const setup_t *su, const event_t *ev, size_t n_ev,
                int stopped, const uint8_t *p, size_t n, int how,
                uint64_t seed) {
  embps_framer_t f;
  owner_t o = {.su = su, .ev = ev, .n_ev = n_ev, .f = &f};
  embps_framer_init(&f, &ops, &o, su->limit_first);
  uint64_t rng = seed;
  size_t pos = 0;
  int rc = 0;
  while (pos < n && !rc) {
    size_t k = how == WHOLE ? n - pos : how == BYTES ? 1 : chunk(&rng);
    if (k > n - pos)
      k = n - pos;
    uint8_t *dst;
    size_t want = embps_framer_want(&f, &dst);
    size_t left = embps_framer_body_left(&f);
    FUZZ_CHECK(!left || (want && want <= left));
    if (how == RANDOM && want && (rng_next(&rng) & 1)) {
      if (k > want) /* a read in place takes at most what is wanted */
        k = want;
      memcpy(dst, p + pos, k);
      size_t seen = o.seen;
      rc = embps_framer_advance(&f, k);
      pos += k;
      if (left && o.seen == seen) /* in a body that is not complete yet */
        FUZZ_CHECK(embps_framer_body_left(&f) == left - k);
    } else {
      rc = embps_framer_feed(&f, p + pos, k);
      pos += k;
    }
  }
  /* every event seen, no more; a stop exactly where the parser stopped */
  FUZZ_CHECK(o.seen == n_ev);
  FUZZ_CHECK((rc == EMBPS_FRAMER_STOP) == stopped);
  if (stopped) { /* nothing more is taken */
    uint8_t *dst;
    FUZZ_CHECK(embps_framer_want(&f, &dst) == 0 && !dst);
    FUZZ_CHECK(embps_framer_body_left(&f) == 0);
    FUZZ_CHECK(embps_framer_feed(&f, p, n) == EMBPS_FRAMER_STOP);
    FUZZ_CHECK(embps_framer_advance(&f, 1) == EMBPS_FRAMER_STOP);
    FUZZ_CHECK(o.seen == n_ev);
  }
  drop_body(&o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 10)
    return 0;
  setup_t su = {.limit_first = LIMITS[data[0] & 7],
                .limit_after = LIMITS[(data[0] >> 3) & 7],
                .skip_oversized = (data[0] >> 6) & 1,
                .split = data[0] >> 7,
                .stop_kind = data[1]};
  uint64_t seed;
  memcpy(&seed, data + 2, sizeof seed);
  const uint8_t *p = data + 10;
  size_t n = size - 10;
  static event_t ev[MAX_EVENTS];
  int stopped;
  size_t n_ev = expect(&su, p, n, ev, &stopped);
  if (n_ev + 2 > MAX_EVENTS)
    return 0; /* too many frames to list: not this input */
  run(&su, ev, n_ev, stopped, p, n, WHOLE, 0);
  run(&su, ev, n_ev, stopped, p, n, BYTES, 0);
  run(&su, ev, n_ev, stopped, p, n, RANDOM, seed);
  run(&su, ev, n_ev, stopped, p, n, RANDOM, ~seed);
  return 0;
}
