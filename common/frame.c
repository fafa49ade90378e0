/* frame.c - frame header codec (see frame.h). */
#include "frame.h"

#include <string.h>

#include "embps/embps.h"

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

const char *embps_kind_name(unsigned kind) {
  static const char *const names[] = {
      [EMBPS_KIND_HELLO] = "hello",           [EMBPS_KIND_CREATE] = "create",
      [EMBPS_KIND_DROP] = "drop",             [EMBPS_KIND_DESCRIBE] = "describe",
      [EMBPS_KIND_LIST] = "list",             [EMBPS_KIND_PULL] = "pull",
      [EMBPS_KIND_PUSH] = "push",             [EMBPS_KIND_STATS] = "stats",
      [EMBPS_KIND_CHECKPOINT] = "checkpoint", [EMBPS_KIND_SCAN] = "scan",
      [EMBPS_KIND_WRITE_ROWS] = "write_rows", [EMBPS_KIND_ALTER] = "alter",
      [EMBPS_KIND_EVICT] = "evict"};
  return kind < sizeof names / sizeof *names ? names[kind] : NULL;
}

void embps_frame_header_encode(const embps_frame_header_t *h,
                               uint8_t out[EMBPS_FRAME_HEADER_LEN]) {
  uint16_t magic = EMBPS_FRAME_MAGIC;
  put32(out, h->body_len);
  put32(out + 4, h->meta_len);
  put32(out + 8, h->req_id);
  memcpy(out + 12, &h->kind, 2);
  memcpy(out + 14, &magic, 2);
}

int embps_frame_header_decode(const uint8_t in[EMBPS_FRAME_HEADER_LEN],
                              size_t max_body, embps_frame_header_t *h) {
  uint16_t magic;
  memcpy(&magic, in + 14, 2);
  if (magic != EMBPS_FRAME_MAGIC)
    return EMBPS_EPROTO;
  h->body_len = get32(in);
  h->meta_len = get32(in + 4);
  h->req_id = get32(in + 8);
  memcpy(&h->kind, in + 12, 2);
  if (h->body_len > max_body)
    return EMBPS_EFRAMESIZE;
  /* the bulk starts at meta_len rounded up to 8: that must fit too */
  if (h->meta_len > h->body_len ||
      embps_bulk_offset(h->meta_len) > h->body_len)
    return EMBPS_EPROTO;
  return 0;
}
