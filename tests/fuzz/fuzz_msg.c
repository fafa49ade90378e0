/* fuzz_msg.c - libFuzzer target: the message decoder, for every kind,
 * reply kinds and ERROR included. Input: a little-endian u16 kind, then the
 * meta bytes.
 *
 * Invariants, for a message that decodes: it packs to bytes that decode to
 * the same message, and packing that again gives the same bytes (one
 * round trip reaches a fixed point: unknown fields and duplicates are gone);
 * built into a whole frame, its header says the right kind, meta and body
 * lengths, and its meta decodes to the same message again. */
#include "fuzz.h"
#include "wire.h"

/* Compares two decoded messages of the same kind field by field (the
 * structs are zeroed before decoding, so memcmp is exact except for the
 * malloc'd arrays of LIST and STATS replies, compared element-wise). */
static int same_msg(const embps_msg_t *a, const embps_msg_t *b) {
  const embps_table_info_t *va = NULL, *vb = NULL;
  size_t n = 0;
  embps_msg_t ca = *a, cb = *b;
  if (a->kind == (EMBPS_KIND_LIST | EMBPS_KIND_REPLY)) {
    if (a->u.list.n != b->u.list.n)
      return 0;
    va = a->u.list.v, vb = b->u.list.v, n = a->u.list.n;
    ca.u.list.v = cb.u.list.v = NULL;
  } else if (a->kind == (EMBPS_KIND_STATS | EMBPS_KIND_REPLY)) {
    if (a->u.stats.n_tables != b->u.stats.n_tables)
      return 0;
    va = a->u.stats.tables, vb = b->u.stats.tables, n = a->u.stats.n_tables;
    ca.u.stats.tables = cb.u.stats.tables = NULL;
  }
  if (memcmp(&ca, &cb, sizeof ca) != 0)
    return 0;
  return n == 0 || memcmp(va, vb, n * sizeof *va) == 0;
}

static uint8_t *pack(const embps_msg_t *m, size_t *len) {
  *len = embps_msg_size(m);
  uint8_t *b = malloc(*len ? *len : 1);
  FUZZ_CHECK(b);
  embps_msg_pack(m, b);
  return b;
}

static void check_frame(const embps_msg_t *m, size_t meta_len) {
  const size_t bulk_len = 24;
  uint8_t *f;
  size_t flen, off;
  FUZZ_CHECK(embps_frame_build(m, 77, bulk_len, &f, &flen, &off) == 0);
  embps_frame_header_t h;
  FUZZ_CHECK(embps_frame_header_decode(f, UINT32_MAX, &h) == 0);
  FUZZ_CHECK(h.kind == m->kind && h.req_id == 77);
  FUZZ_CHECK(h.meta_len == meta_len);
  FUZZ_CHECK(h.body_len == embps_bulk_offset(meta_len) + bulk_len);
  FUZZ_CHECK(flen == EMBPS_FRAME_HEADER_LEN + h.body_len);
  FUZZ_CHECK(off == EMBPS_FRAME_HEADER_LEN + embps_bulk_offset(meta_len));
  for (size_t i = EMBPS_FRAME_HEADER_LEN + meta_len; i < off; i++)
    FUZZ_CHECK(f[i] == 0); /* padding */
  embps_msg_t m3;
  FUZZ_CHECK(embps_msg_unpack(h.kind, f + EMBPS_FRAME_HEADER_LEN, h.meta_len,
                              &m3) == 0);
  FUZZ_CHECK(same_msg(m, &m3));
  embps_msg_free(&m3);
  free(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  uint16_t kind;
  memcpy(&kind, data, 2);
  embps_msg_t m1;
  int rc = embps_msg_unpack(kind, data + 2, size - 2, &m1);
  FUZZ_CHECK(rc == 0 || rc == EMBPS_EPROTO || rc == EMBPS_EKIND);
  if (rc)
    return 0;
  FUZZ_CHECK(m1.kind == kind);
  size_t n1, n2;
  uint8_t *b1 = pack(&m1, &n1);
  embps_msg_t m2;
  FUZZ_CHECK(embps_msg_unpack(kind, b1, n1, &m2) == 0);
  FUZZ_CHECK(same_msg(&m1, &m2));
  uint8_t *b2 = pack(&m2, &n2);
  FUZZ_CHECK(n1 == n2 && memcmp(b1, b2, n1) == 0);
  check_frame(&m2, n2);
  free(b1);
  free(b2);
  embps_msg_free(&m1);
  embps_msg_free(&m2);
  return 0;
}
