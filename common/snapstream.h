/* snapstream.h - the snapshot stream: a checkpoint (ckpt.c's files, byte
 * for byte) sent as one byte stream, and the records after it that a
 * backup needs (README "Backups"). A server writes it (ckpt.c's stream
 * sink, snapshot.c); a follower loads it into tables as it arrives
 * (embps_ckpt_load_stream) and `embps backup` writes its files into a
 * data dir (client/snapshot.c). Both read it with the reader below.
 *
 * Format (little-endian). Every file is framed, because a table file's
 * length is known only once its last shard is copied:
 *   head   48 B: "EMBPSSNP", u32 stream version, u32 checkpoint format,
 *                u64 S (the checkpoint's LSN), u32 cluster size, u32
 *                cluster index, u32 shards, u32 flags (1: log entries
 *                follow the MANIFEST), u64 0
 *   entries, each:
 *     entry 32 B: u32 'FILE', u32 type, u64 id, u64 step, u32 info
 *                bytes, u32 0; then info, zeros to 8 bytes
 *       TABLE    a table file: id its incarnation, step the table's,
 *                info its packed TableSpec (the stream loader creates the
 *                table from it before the file's bytes come)
 *       MANIFEST the checkpoint's MANIFEST (after the table files)
 *       LOG      a log segment: id its first LSN
 *     (fields an entry's type does not use are 0)
 *     the file's bytes in pieces: u32 'DATA', u32 n (1 .. 2^30), n bytes
 *     end 16 B: u32 'FEND', u32 0, u64 the file's bytes
 *   end    32 B: u32 'SEND', u32 entries, u64 L, u64 0, u64 0: replaying
 *                the LOG entries over the checkpoint gives the state at L
 *                (S when there are none).
 * The framing has no checksums of its own: every file it carries has
 * them (checkpoint files, log records), and its fields are checked. */
#ifndef EMBPS_SNAPSTREAM_H
#define EMBPS_SNAPSTREAM_H
#include <stddef.h>
#include <stdint.h>

#define EMBPS_SNAPSTREAM_VERSION 1u
#define EMBPS_SNAPSTREAM_HEAD_BYTES 48
#define EMBPS_SNAPSTREAM_ENTRY_BYTES 32
#define EMBPS_SNAPSTREAM_DATA_BYTES 8
#define EMBPS_SNAPSTREAM_FEND_BYTES 16
#define EMBPS_SNAPSTREAM_END_BYTES 32
#define EMBPS_SNAPSTREAM_INFO_MAX 65536u   /* an entry's info bytes */
#define EMBPS_SNAPSTREAM_DATA_MAX (1u << 30) /* one DATA piece */
#define EMBPS_SNAPSTREAM_WITH_LOG 1u

enum {
  EMBPS_SNAPSTREAM_TABLE = 1,
  EMBPS_SNAPSTREAM_MANIFEST = 2,
  EMBPS_SNAPSTREAM_LOG = 3,
};

typedef struct {
  uint32_t version, ckpt_format;
  uint64_t lsn; /* S */
  uint32_t cluster_size, cluster_index, shards, flags;
} embps_snapstream_head_t;

typedef struct {
  uint32_t type;
  uint64_t id, step;
  uint32_t info_len;
  uint8_t *info; /* reader: malloc'd (the caller frees), NULL when empty */
} embps_snapstream_entry_t;

typedef struct {
  uint32_t entries;
  uint64_t lsn; /* L */
} embps_snapstream_end_t;

/* ---- writing: each fills out with its bytes and returns their count ---- */
size_t embps_snapstream_put_head(uint8_t out[EMBPS_SNAPSTREAM_HEAD_BYTES],
                                 const embps_snapstream_head_t *h);
/* The entry header only (the info and its padding follow it). */
size_t embps_snapstream_put_entry(uint8_t out[EMBPS_SNAPSTREAM_ENTRY_BYTES],
                                  const embps_snapstream_entry_t *e);
size_t embps_snapstream_put_data(uint8_t out[EMBPS_SNAPSTREAM_DATA_BYTES],
                                 uint32_t n);
size_t embps_snapstream_put_fend(uint8_t out[EMBPS_SNAPSTREAM_FEND_BYTES],
                                 uint64_t file_bytes);
size_t embps_snapstream_put_end(uint8_t out[EMBPS_SNAPSTREAM_END_BYTES],
                                const embps_snapstream_end_t *e);
/* The file an entry is in a data dir's checkpoint or log directory:
 * "table-<id %016x>.dat", "MANIFEST", "<id %016x>.log". */
void embps_snapstream_entry_name(const embps_snapstream_entry_t *e, char *buf,
                                 size_t len);

/* ---- reading ----
 * The reader pulls the stream's bytes in pieces of any size from next:
 * 0 with the next piece in *p, *n (> 0; valid until the next call), 0
 * with *n == 0 when the bytes end, or -1 with err. A reader is used by
 * one thread. Its errors name the stream offset: "snapshot stream at
 * offset N: ...". */
typedef int (*embps_snapstream_next_fn)(void *ctx, const uint8_t **p,
                                        size_t *n, char *err, size_t err_len);

typedef struct {
  embps_snapstream_next_fn next; /* the fields are snapstream.c's */
  void *ctx;
  const uint8_t *p; /* unread bytes of the current piece */
  size_t n;
  uint64_t at;      /* stream offset of p */
  int state;        /* what comes next */
  uint64_t data_left, file_bytes;
  uint32_t entries;
  embps_snapstream_end_t end; /* callers read: once at the end */
} embps_snapstream_reader_t;

void embps_snapstream_reader_init(embps_snapstream_reader_t *r,
                                  embps_snapstream_next_fn next, void *ctx);
/* Reads and checks the head (version known). 0, or -1 with err. */
int embps_snapstream_head(embps_snapstream_reader_t *r,
                          embps_snapstream_head_t *h, char *err,
                          size_t err_len);
/* The next entry: 1 with *e (its info malloc'd), 0 at the stream's end
 * (r->end set; the bytes must end there), -1 with err. The previous
 * entry's file must have been read to its end (embps_snapstream_file_end
 * or a piece of 0 bytes). */
int embps_snapstream_entry(embps_snapstream_reader_t *r,
                           embps_snapstream_entry_t *e, char *err,
                           size_t err_len);
/* The next bytes of the current file, in place: 0 with *p, *n (> 0, valid
 * until the next call), 0 with *n == 0 once the file ended (its end read),
 * -1 with err. */
int embps_snapstream_piece(embps_snapstream_reader_t *r, const uint8_t **p,
                           size_t *n, char *err, size_t err_len);
/* Exactly n bytes of the current file into dst; -1 with err (what names
 * them) when the file ends before. */
int embps_snapstream_read(embps_snapstream_reader_t *r, void *dst, size_t n,
                          const char *what, char *err, size_t err_len);
/* The next n bytes of the current file: in place when one piece holds
 * them (valid until the next call), else copied into spill (n bytes).
 * NULL with err. */
const uint8_t *embps_snapstream_view(embps_snapstream_reader_t *r, size_t n,
                                     uint8_t *spill, const char *what,
                                     char *err, size_t err_len);
/* The current file must end here: reads its end. 0 with *bytes (its
 * length), -1 with err when bytes are left. */
int embps_snapstream_file_end(embps_snapstream_reader_t *r, uint64_t *bytes,
                              char *err, size_t err_len);
/* The current file's bytes read so far. */
static inline uint64_t embps_snapstream_file_off(
    const embps_snapstream_reader_t *r) {
  return r->file_bytes;
}
#endif
