/* frame.h - the wire's framing: a fixed 16-byte little-endian header, then
 * `meta_len` bytes of protobuf, zero padding to a multiple of 8, then the
 * bulk arrays (body_len bytes in all after the header).
 *
 *   u32 body_len | u32 meta_len | u32 req_id | u16 kind | u16 magic 'E','P'
 *
 * A reader bounds body_len by its frame limit before it allocates. */
#ifndef EMBPS_FRAME_H
#define EMBPS_FRAME_H
#include <stddef.h>
#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "embps reads bulk arrays in place and needs a little-endian machine"
#endif

#define EMBPS_FRAME_HEADER_LEN 16
#define EMBPS_FRAME_MAGIC 0x5045u /* "EP" */
#define EMBPS_DEFAULT_MAX_FRAME (64u << 20)

enum embps_kind {
  EMBPS_KIND_HELLO = 1,
  EMBPS_KIND_CREATE = 2,
  EMBPS_KIND_DROP = 3,
  EMBPS_KIND_DESCRIBE = 4,
  EMBPS_KIND_LIST = 5,
  EMBPS_KIND_PULL = 6,
  EMBPS_KIND_PUSH = 7,
  EMBPS_KIND_STATS = 8,
  EMBPS_KIND_CHECKPOINT = 9,
  EMBPS_KIND_SCAN = 10,       /* export: a chunk of a table's rows */
  EMBPS_KIND_WRITE_ROWS = 11, /* import: set rows (and state) */
  EMBPS_KIND_ALTER = 12,
  EMBPS_KIND_EVICT = 13, /* issue 12: a table's TTL and L2-norm eviction */
  EMBPS_KIND_FETCH = 14,   /* issue 21: a follower's fetch of log records */
  EMBPS_KIND_PROMOTE = 15, /* issue 21: a follower becomes a primary */
  /* snapshot sessions (server/snapshot.h): a copy of the tables */
  EMBPS_KIND_SNAPSHOT_BEGIN = 20,
  EMBPS_KIND_SNAPSHOT_READ = 21,
  EMBPS_KIND_SNAPSHOT_END = 22,
  EMBPS_KIND_REPLY = 0x80, /* reply kind = request kind | EMBPS_KIND_REPLY */
  EMBPS_KIND_ERROR = 0xff,
};

/* A request kind's name as /metrics labels it (its enum name in lower
 * case: "hello", ..., "write_rows", "evict"), or NULL for a kind this
 * build does not know. Static text. */
const char *embps_kind_name(unsigned kind);

typedef struct {
  uint32_t body_len;
  uint32_t meta_len;
  uint32_t req_id;
  uint16_t kind;
} embps_frame_header_t;

void embps_frame_header_encode(const embps_frame_header_t *h,
                               uint8_t out[EMBPS_FRAME_HEADER_LEN]);
/* Decodes and checks a header: returns 0, EMBPS_EPROTO (bad magic, or
 * meta_len rounded up to 8 > body_len) or EMBPS_EFRAMESIZE (body_len > max_body). */
int embps_frame_header_decode(const uint8_t in[EMBPS_FRAME_HEADER_LEN],
                              size_t max_body, embps_frame_header_t *h);

/* Offset of the bulk arrays in the body: meta rounded up to 8 bytes. */
static inline size_t embps_bulk_offset(size_t meta_len) {
  return (meta_len + 7) & ~(size_t)7;
}
#endif
