/* test_frame.c - unit tests of the frame header codec (common/frame.c):
 * encode/decode round trip and byte layout, refusal of a bad magic, of
 * meta_len (padded to 8) > body_len and of body_len above the reader's
 * limit, and the 8-byte alignment of embps_bulk_offset(). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "embps/embps.h"
#include "frame.h"

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static void test_round_trip(void **state) {
  (void)state;
  const embps_frame_header_t cases[] = {
      {0, 0, 0, EMBPS_KIND_HELLO},
      {16, 16, 1, EMBPS_KIND_PULL},
      {1000, 37, 0xdeadbeef, EMBPS_KIND_PUSH | EMBPS_KIND_REPLY},
      {EMBPS_DEFAULT_MAX_FRAME, 12, UINT32_MAX, EMBPS_KIND_ERROR},
      {UINT32_MAX, UINT32_MAX & ~7u, 7, 0xffff},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    uint8_t buf[EMBPS_FRAME_HEADER_LEN];
    embps_frame_header_t h;
    memset(&h, 0xa5, sizeof h);
    embps_frame_header_encode(&cases[c], buf);
    assert_int_equal(embps_frame_header_decode(buf, SIZE_MAX, &h), 0);
    assert_int_equal(h.body_len, cases[c].body_len);
    assert_int_equal(h.meta_len, cases[c].meta_len);
    assert_int_equal(h.req_id, cases[c].req_id);
    assert_int_equal(h.kind, cases[c].kind);
  }
  /* random headers */
  uint64_t s = 1;
  for (int i = 0; i < 10000; i++) {
    embps_frame_header_t in, out;
    in.body_len = (uint32_t)rng_next(&s);
    in.meta_len = (uint32_t)(rng_next(&s) % ((uint64_t)in.body_len + 1));
    if (embps_bulk_offset(in.meta_len) > in.body_len)
      in.meta_len = in.body_len & ~7u;
    in.req_id = (uint32_t)rng_next(&s);
    in.kind = (uint16_t)rng_next(&s);
    uint8_t buf[EMBPS_FRAME_HEADER_LEN];
    embps_frame_header_encode(&in, buf);
    assert_int_equal(embps_frame_header_decode(buf, UINT32_MAX, &out), 0);
    assert_int_equal(out.body_len, in.body_len);
    assert_int_equal(out.meta_len, in.meta_len);
    assert_int_equal(out.req_id, in.req_id);
    assert_int_equal(out.kind, in.kind);
  }
}

/* The documented layout: u32 body_len | u32 meta_len | u32 req_id |
 * u16 kind | 'E' 'P', little-endian. */
static void test_byte_layout(void **state) {
  (void)state;
  embps_frame_header_t h = {0x04030201u, 0x08070605u, 0x0c0b0a09u, 0x0e0du};
  uint8_t buf[EMBPS_FRAME_HEADER_LEN];
  embps_frame_header_encode(&h, buf);
  for (int i = 0; i < 14; i++)
    assert_int_equal(buf[i], i + 1);
  assert_int_equal(buf[14], 'E');
  assert_int_equal(buf[15], 'P');
  assert_int_equal(le32(buf), 0x04030201u);
}

static void test_bad_magic(void **state) {
  (void)state;
  embps_frame_header_t h = {64, 8, 3, EMBPS_KIND_PULL}, out;
  uint8_t buf[EMBPS_FRAME_HEADER_LEN];
  for (int byte = 14; byte < 16; byte++) {
    for (int bit = 0; bit < 8; bit++) {
      embps_frame_header_encode(&h, buf);
      buf[byte] ^= (uint8_t)(1u << bit);
      assert_int_equal(embps_frame_header_decode(buf, 1024, &out),
                       EMBPS_EPROTO);
    }
  }
  /* byte-swapped magic ("PE") and all zeros */
  embps_frame_header_encode(&h, buf);
  buf[14] = 'P';
  buf[15] = 'E';
  assert_int_equal(embps_frame_header_decode(buf, 1024, &out), EMBPS_EPROTO);
  memset(buf, 0, sizeof buf);
  assert_int_equal(embps_frame_header_decode(buf, 1024, &out), EMBPS_EPROTO);
  /* the untouched header decodes */
  embps_frame_header_encode(&h, buf);
  assert_int_equal(embps_frame_header_decode(buf, 1024, &out), 0);
}

static void encode_decode_ok(const embps_frame_header_t *h, uint8_t *buf) {
  embps_frame_header_t out;
  embps_frame_header_encode(h, buf);
  assert_int_equal(embps_frame_header_decode(buf, 1u << 20, &out), 0);
  assert_int_equal(out.meta_len, h->meta_len);
}

static void test_meta_longer_than_body(void **state) {
  (void)state;
  uint8_t buf[EMBPS_FRAME_HEADER_LEN];
  embps_frame_header_t out;
  const uint32_t bodies[] = {0, 1, 8, 100, 4096};
  for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
    embps_frame_header_t h = {bodies[i], bodies[i] + 1, 9, EMBPS_KIND_PUSH};
    embps_frame_header_encode(&h, buf);
    assert_int_equal(embps_frame_header_decode(buf, 1u << 20, &out),
                     EMBPS_EPROTO);
    h.meta_len = bodies[i] + 1000;
    embps_frame_header_encode(&h, buf);
    assert_int_equal(embps_frame_header_decode(buf, 1u << 20, &out),
                     EMBPS_EPROTO);
    /* meta_len == body_len is a frame without bulk: fine when the meta
     * needs no padding; otherwise the padding runs past the body and the
     * bulk length (body_len - padded meta) would wrap (found by
     * fuzz_frames) */
    h.meta_len = bodies[i];
    embps_frame_header_encode(&h, buf);
    assert_int_equal(embps_frame_header_decode(buf, 1u << 20, &out),
                     bodies[i] % 8 ? EMBPS_EPROTO : 0);
    if (bodies[i] % 8 == 0)
      assert_int_equal(out.meta_len, bodies[i]);
    h.meta_len = bodies[i] & ~7u; /* padded meta fills the body */
    encode_decode_ok(&h, buf);
  }
  /* 122 bytes of meta pad to 128: a body of 123..127 is refused */
  for (uint32_t body = 120; body < 136; body++) {
    embps_frame_header_t h = {body, 122, 1, EMBPS_KIND_PUSH};
    embps_frame_header_encode(&h, buf);
    assert_int_equal(embps_frame_header_decode(buf, 1u << 20, &out),
                     body < 128 ? EMBPS_EPROTO : 0);
  }
}

static void test_body_too_large(void **state) {
  (void)state;
  uint8_t buf[EMBPS_FRAME_HEADER_LEN];
  embps_frame_header_t out;
  const size_t maxes[] = {0, 16, 1000, EMBPS_DEFAULT_MAX_FRAME};
  for (size_t i = 0; i < sizeof maxes / sizeof *maxes; i++) {
    size_t max = maxes[i];
    embps_frame_header_t h = {(uint32_t)max + 1, 0, 1, EMBPS_KIND_PULL};
    embps_frame_header_encode(&h, buf);
    assert_int_equal(embps_frame_header_decode(buf, max, &out),
                     EMBPS_EFRAMESIZE);
    h.body_len = UINT32_MAX;
    embps_frame_header_encode(&h, buf);
    assert_int_equal(embps_frame_header_decode(buf, max, &out),
                     EMBPS_EFRAMESIZE);
    /* exactly at the limit is allowed */
    h.body_len = (uint32_t)max;
    embps_frame_header_encode(&h, buf);
    assert_int_equal(embps_frame_header_decode(buf, max, &out), 0);
    assert_int_equal(out.body_len, (uint32_t)max);
  }
}

static void test_bulk_offset(void **state) {
  (void)state;
  assert_int_equal(embps_bulk_offset(0), 0);
  assert_int_equal(embps_bulk_offset(1), 8);
  assert_int_equal(embps_bulk_offset(8), 8);
  assert_int_equal(embps_bulk_offset(9), 16);
  for (size_t m = 0; m < 4096; m++) {
    size_t off = embps_bulk_offset(m);
    assert_int_equal(off % 8, 0);
    assert_true(off >= m);
    assert_true(off < m + 8);
  }
  size_t big = (size_t)UINT32_MAX - 3;
  assert_int_equal(embps_bulk_offset(big) % 8, 0);
  assert_true(embps_bulk_offset(big) >= big);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_byte_layout),
      cmocka_unit_test(test_bad_magic),
      cmocka_unit_test(test_meta_longer_than_body),
      cmocka_unit_test(test_body_too_large),
      cmocka_unit_test(test_bulk_offset),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
