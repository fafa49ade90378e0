/* snapstream.c - the snapshot stream's framing (snapstream.h): headers
 * written into caller buffers, and a reader that pulls the bytes piece by
 * piece and hands out each file's bytes in place whenever a piece holds
 * them, so a loader parses a checkpoint straight out of the network
 * buffers it was read into. */
#include "snapstream.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC "EMBPSSNP"
#define FILE_ 0x454c4946u /* 'FILE' */
#define DATA_ 0x41544144u /* 'DATA' */
#define FEND_ 0x444e4546u /* 'FEND' */
#define SEND_ 0x444e4553u /* 'SEND' */

enum { S_HEAD, S_ENTRY, S_FILE, S_DONE };

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* ------------------------------------------------------------ writing */

size_t embps_snapstream_put_head(uint8_t out[EMBPS_SNAPSTREAM_HEAD_BYTES],
                                 const embps_snapstream_head_t *h) {
  memset(out, 0, EMBPS_SNAPSTREAM_HEAD_BYTES);
  memcpy(out, MAGIC, 8);
  put32(out + 8, h->version);
  put32(out + 12, h->ckpt_format);
  put64(out + 16, h->lsn);
  put32(out + 24, h->cluster_size);
  put32(out + 28, h->cluster_index);
  put32(out + 32, h->shards);
  put32(out + 36, h->flags);
  return EMBPS_SNAPSTREAM_HEAD_BYTES;
}

size_t embps_snapstream_put_entry(uint8_t out[EMBPS_SNAPSTREAM_ENTRY_BYTES],
                                  const embps_snapstream_entry_t *e) {
  memset(out, 0, EMBPS_SNAPSTREAM_ENTRY_BYTES);
  put32(out, FILE_);
  put32(out + 4, e->type);
  put64(out + 8, e->id);
  put64(out + 16, e->step);
  put32(out + 24, e->info_len);
  return EMBPS_SNAPSTREAM_ENTRY_BYTES;
}

size_t embps_snapstream_put_data(uint8_t out[EMBPS_SNAPSTREAM_DATA_BYTES],
                                 uint32_t n) {
  put32(out, DATA_);
  put32(out + 4, n);
  return EMBPS_SNAPSTREAM_DATA_BYTES;
}

size_t embps_snapstream_put_fend(uint8_t out[EMBPS_SNAPSTREAM_FEND_BYTES],
                                 uint64_t file_bytes) {
  put32(out, FEND_);
  put32(out + 4, 0);
  put64(out + 8, file_bytes);
  return EMBPS_SNAPSTREAM_FEND_BYTES;
}

size_t embps_snapstream_put_end(uint8_t out[EMBPS_SNAPSTREAM_END_BYTES],
                                const embps_snapstream_end_t *e) {
  memset(out, 0, EMBPS_SNAPSTREAM_END_BYTES);
  put32(out, SEND_);
  put32(out + 4, e->entries);
  put64(out + 8, e->lsn);
  return EMBPS_SNAPSTREAM_END_BYTES;
}

void embps_snapstream_entry_name(const embps_snapstream_entry_t *e, char *buf,
                                 size_t len) {
  if (e->type == EMBPS_SNAPSTREAM_TABLE)
    snprintf(buf, len, "table-%016" PRIx64 ".dat", e->id);
  else if (e->type == EMBPS_SNAPSTREAM_LOG)
    snprintf(buf, len, "%016" PRIx64 ".log", e->id);
  else
    snprintf(buf, len, "MANIFEST");
}

/* ------------------------------------------------------------ reading */

void embps_snapstream_reader_init(embps_snapstream_reader_t *r,
                                  embps_snapstream_next_fn next, void *ctx) {
  memset(r, 0, sizeof *r);
  r->next = next;
  r->ctx = ctx;
  r->state = S_HEAD;
}

static int fail(const embps_snapstream_reader_t *r, char *err, size_t err_len,
                const char *what) {
  snprintf(err, err_len, "snapshot stream at offset %" PRIu64 ": %s", r->at,
           what);
  return -1;
}

/* Makes r->n > 0: 1, 0 when the bytes ended, -1 with err. */
static int fill(embps_snapstream_reader_t *r, char *err, size_t err_len) {
  while (!r->n) {
    const uint8_t *p;
    size_t n;
    if (r->next(r->ctx, &p, &n, err, err_len))
      return -1;
    if (!n)
      return 0;
    r->p = p;
    r->n = n;
  }
  return 1;
}

static void skip(embps_snapstream_reader_t *r, size_t k) {
  r->p += k;
  r->n -= k;
  r->at += k;
}

/* Exactly n framing bytes into dst; -1 with err when the bytes end. */
static int take(embps_snapstream_reader_t *r, void *dst, size_t n,
                const char *what, char *err, size_t err_len) {
  for (size_t got = 0; got < n;) {
    int rc = fill(r, err, err_len);
    if (rc <= 0) {
      if (!rc) {
        char why[128];
        snprintf(why, sizeof why, "the stream ends inside %s", what);
        fail(r, err, err_len, why);
      }
      return -1;
    }
    size_t k = r->n < n - got ? r->n : n - got;
    memcpy((uint8_t *)dst + got, r->p, k);
    skip(r, k);
    got += k;
  }
  return 0;
}

int embps_snapstream_head(embps_snapstream_reader_t *r,
                          embps_snapstream_head_t *h, char *err,
                          size_t err_len) {
  uint8_t b[EMBPS_SNAPSTREAM_HEAD_BYTES];
  if (r->state != S_HEAD)
    return fail(r, err, err_len, "the head was read already");
  if (take(r, b, sizeof b, "its head", err, err_len))
    return -1;
  if (memcmp(b, MAGIC, 8)) {
    r->at -= sizeof b;
    return fail(r, err, err_len, "not a snapshot stream (bad magic)");
  }
  h->version = get32(b + 8);
  h->ckpt_format = get32(b + 12);
  h->lsn = get64(b + 16);
  h->cluster_size = get32(b + 24);
  h->cluster_index = get32(b + 28);
  h->shards = get32(b + 32);
  h->flags = get32(b + 36);
  if (h->version != EMBPS_SNAPSTREAM_VERSION) {
    char why[128];
    snprintf(why, sizeof why, "stream version %u (this build reads %u)",
             h->version, EMBPS_SNAPSTREAM_VERSION);
    return fail(r, err, err_len, why);
  }
  if (!h->cluster_size || h->cluster_index >= h->cluster_size ||
      !h->shards || h->flags & ~EMBPS_SNAPSTREAM_WITH_LOG || get64(b + 40))
    return fail(r, err, err_len, "bad head fields");
  r->state = S_ENTRY;
  return 0;
}

int embps_snapstream_entry(embps_snapstream_reader_t *r,
                           embps_snapstream_entry_t *e, char *err,
                           size_t err_len) {
  memset(e, 0, sizeof *e);
  if (r->state != S_ENTRY)
    return fail(r, err, err_len, r->state == S_FILE
                                     ? "the previous file was not read to "
                                       "its end"
                                     : "no entry can come here");
  uint8_t b[EMBPS_SNAPSTREAM_ENTRY_BYTES];
  if (take(r, b, sizeof b, "an entry header", err, err_len))
    return -1;
  if (get32(b) == SEND_) {
    r->end.entries = get32(b + 4);
    r->end.lsn = get64(b + 8);
    if (get64(b + 16) || get64(b + 24)) {
      r->at -= sizeof b;
      return fail(r, err, err_len, "bad end fields");
    }
    if (r->end.entries != r->entries) {
      char why[128];
      snprintf(why, sizeof why, "its end counts %u files, %u came",
               r->end.entries, r->entries);
      return fail(r, err, err_len, why);
    }
    int more = fill(r, err, err_len);
    if (more < 0)
      return -1;
    if (more)
      return fail(r, err, err_len, "bytes after the stream's end");
    r->state = S_DONE;
    return 0;
  }
  e->type = get32(b + 4);
  e->id = get64(b + 8);
  e->step = get64(b + 16);
  e->info_len = get32(b + 24);
  if (get32(b) != FILE_ || e->type < EMBPS_SNAPSTREAM_TABLE ||
      e->type > EMBPS_SNAPSTREAM_LOG || get32(b + 28) ||
      e->info_len > EMBPS_SNAPSTREAM_INFO_MAX ||
      (e->type != EMBPS_SNAPSTREAM_TABLE && (e->step || e->info_len)) ||
      (e->type == EMBPS_SNAPSTREAM_MANIFEST && e->id)) {
    r->at -= sizeof b;
    return fail(r, err, err_len, "bad entry header");
  }
  size_t padded = ((size_t)e->info_len + 7) & ~(size_t)7;
  if (padded) {
    uint8_t *info = malloc(padded);
    if (!info)
      return fail(r, err, err_len, "out of memory");
    if (take(r, info, padded, "an entry's info", err, err_len)) {
      free(info);
      return -1;
    }
    for (size_t i = e->info_len; i < padded; i++) {
      if (info[i]) {
        free(info);
        return fail(r, err, err_len, "an entry's padding is not zero");
      }
    }
    e->info = info;
  }
  r->state = S_FILE;
  r->data_left = 0;
  r->file_bytes = 0;
  r->entries++;
  return 1;
}

/* In a file with no DATA bytes left: reads the next framing header. 1: a
 * DATA piece begins; 0: the file ended (its FEND read); -1 with err. */
static int next_data(embps_snapstream_reader_t *r, char *err, size_t err_len) {
  uint8_t b[EMBPS_SNAPSTREAM_FEND_BYTES];
  if (take(r, b, EMBPS_SNAPSTREAM_DATA_BYTES, "a file", err, err_len))
    return -1;
  if (get32(b) == DATA_) {
    uint32_t n = get32(b + 4);
    if (!n || n > EMBPS_SNAPSTREAM_DATA_MAX) {
      r->at -= EMBPS_SNAPSTREAM_DATA_BYTES;
      return fail(r, err, err_len, "bad data piece length");
    }
    r->data_left = n;
    return 1;
  }
  if (get32(b) != FEND_) {
    r->at -= EMBPS_SNAPSTREAM_DATA_BYTES;
    return fail(r, err, err_len, "bad data piece header");
  }
  if (take(r, b + 8, 8, "a file's end", err, err_len))
    return -1;
  if (get32(b + 4) || get64(b + 8) != r->file_bytes) {
    char why[128];
    snprintf(why, sizeof why, "a file's end says %" PRIu64 " bytes (flags "
             "%u), %" PRIu64 " came", get64(b + 8), get32(b + 4),
             r->file_bytes);
    return fail(r, err, err_len, why);
  }
  r->state = S_ENTRY;
  return 0;
}

int embps_snapstream_piece(embps_snapstream_reader_t *r, const uint8_t **p,
                           size_t *n, char *err, size_t err_len) {
  *n = 0;
  *p = NULL;
  if (r->state != S_FILE)
    return 0;
  if (!r->data_left) {
    int rc = next_data(r, err, err_len);
    if (rc <= 0)
      return rc;
  }
  int rc = fill(r, err, err_len);
  if (rc <= 0)
    return rc ? -1 : fail(r, err, err_len, "the stream ends inside a file");
  size_t k = r->n < r->data_left ? r->n : (size_t)r->data_left;
  *p = r->p;
  *n = k;
  skip(r, k);
  r->data_left -= k;
  r->file_bytes += k;
  return 0;
}

/* A read of `what` at file offset `at` found the file's end. */
static int short_file(embps_snapstream_reader_t *r, const char *what,
                      uint64_t at, char *err, size_t err_len) {
  char why[256];
  snprintf(why, sizeof why, "%s at file offset %" PRIu64 ": the file ends "
           "at %" PRIu64, what, at, r->file_bytes);
  return fail(r, err, err_len, why);
}

int embps_snapstream_read(embps_snapstream_reader_t *r, void *dst, size_t n,
                          const char *what, char *err, size_t err_len) {
  const uint64_t at = r->file_bytes;
  for (size_t got = 0; got < n;) {
    if (r->state != S_FILE)
      return short_file(r, what, at, err, err_len);
    if (!r->data_left) {
      int rc = next_data(r, err, err_len);
      if (rc <= 0)
        return rc ? -1 : short_file(r, what, at, err, err_len);
    }
    int rc = fill(r, err, err_len);
    if (rc <= 0)
      return rc ? -1 : fail(r, err, err_len, "the stream ends inside a file");
    size_t k = r->n < r->data_left ? r->n : (size_t)r->data_left;
    k = k < n - got ? k : n - got;
    memcpy((uint8_t *)dst + got, r->p, k);
    skip(r, k);
    r->data_left -= k;
    r->file_bytes += k;
    got += k;
  }
  return 0;
}

const uint8_t *embps_snapstream_view(embps_snapstream_reader_t *r, size_t n,
                                     uint8_t *spill, const char *what,
                                     char *err, size_t err_len) {
  if (r->state == S_FILE && !r->data_left) {
    int rc = next_data(r, err, err_len);
    if (rc < 0)
      return NULL;
    if (!rc) {
      short_file(r, what, r->file_bytes, err, err_len);
      return NULL;
    }
  }
  if (r->state == S_FILE && r->data_left >= n) {
    int rc = fill(r, err, err_len);
    if (rc < 0)
      return NULL;
    if (rc && r->n >= n) {
      const uint8_t *p = r->p;
      skip(r, n);
      r->data_left -= n;
      r->file_bytes += n;
      return p;
    }
  }
  return embps_snapstream_read(r, spill, n, what, err, err_len) ? NULL : spill;
}

int embps_snapstream_file_end(embps_snapstream_reader_t *r, uint64_t *bytes,
                              char *err, size_t err_len) {
  *bytes = r->file_bytes;
  if (r->state == S_ENTRY) /* ended by a piece of 0 bytes */
    return 0;
  if (r->state != S_FILE)
    return fail(r, err, err_len, "no file to end");
  if (r->data_left) {
    char why[128];
    snprintf(why, sizeof why, "%" PRIu64 " more bytes where the file should "
             "end at %" PRIu64, r->data_left, r->file_bytes);
    return fail(r, err, err_len, why);
  }
  int rc = next_data(r, err, err_len);
  if (rc > 0) {
    r->at -= EMBPS_SNAPSTREAM_DATA_BYTES;
    char why[128];
    snprintf(why, sizeof why, "more bytes where the file should end at %"
             PRIu64, r->file_bytes);
    return fail(r, err, err_len, why);
  }
  return rc;
}
