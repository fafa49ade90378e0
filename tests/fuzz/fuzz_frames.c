/* fuzz_frames.c - libFuzzer target: a byte stream read as a server reads a
 * connection. Headers are decoded with the frame limit; an oversized frame
 * is skipped (as for an authenticated peer) and a bad header ends the
 * stream; each whole frame's body is copied to a buffer of exactly its size
 * and its meta decoded for its kind, reply kinds included.
 *
 * Invariants: a header that decodes encodes back to the same 16 bytes; an
 * accepted frame's bulk starts inside its body (the bulk length cannot
 * wrap); a decoded message has the header's kind and frees cleanly. */
#include "fuzz.h"
#include "wire.h"

#define MAX_BODY (64u << 10)

/* Decodes one body; returns nothing, checks everything. */
static void decode_body(const embps_frame_header_t *h, const uint8_t *src) {
  uint8_t *body = malloc(h->body_len ? h->body_len : 1);
  FUZZ_CHECK(body);
  memcpy(body, src, h->body_len);
  embps_msg_t m;
  int rc = embps_msg_unpack(h->kind, body, h->meta_len, &m);
  FUZZ_CHECK(rc == 0 || rc == EMBPS_EPROTO || rc == EMBPS_EKIND);
  if (rc == 0) {
    FUZZ_CHECK(m.kind == h->kind);
    embps_msg_free(&m);
  }
  free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t pos = 0;
  while (size - pos >= EMBPS_FRAME_HEADER_LEN) {
    embps_frame_header_t h;
    int rc = embps_frame_header_decode(data + pos, MAX_BODY, &h);
    if (rc == EMBPS_EFRAMESIZE) {
      FUZZ_CHECK(h.body_len > MAX_BODY);
      pos += EMBPS_FRAME_HEADER_LEN;
      pos += h.body_len < size - pos ? h.body_len : size - pos;
      continue;
    }
    if (rc) {
      FUZZ_CHECK(rc == EMBPS_EPROTO);
      break; /* the server answers and closes */
    }
    uint8_t again[EMBPS_FRAME_HEADER_LEN];
    embps_frame_header_encode(&h, again);
    FUZZ_CHECK(memcmp(again, data + pos, sizeof again) == 0);
    FUZZ_CHECK(h.body_len <= MAX_BODY);
    FUZZ_CHECK(h.meta_len <= h.body_len);
    FUZZ_CHECK(embps_bulk_offset(h.meta_len) <= h.body_len);
    pos += EMBPS_FRAME_HEADER_LEN;
    if (size - pos < h.body_len)
      break; /* truncated: a reader waits for the rest */
    decode_body(&h, data + pos);
    pos += h.body_len;
  }
  return 0;
}
