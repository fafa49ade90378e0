/* ckpt.c - checkpoint directories (ckpt.h): their file formats, written
 * and read back.
 *
 * embps_ckpt_write writes ckpt-S.tmp/: a table file per table (below),
 * each shard copied out of the table under its read lock
 * (embps_table_snapshot_shard, table_io.c) by a thread of its own
 * while the shard before it is written, then the MANIFEST; fsyncs every
 * file and the directory, renames it to ckpt-S and fsyncs DIR. Table files
 * expected to reach 64 MiB (embps_ckpt_direct_min) are written and read
 * around the page cache through dio.h's staged buffers, the others
 * through it. embps_ckpt_load checks every CRC and field as it reads, and
 * restores the records block by block into a table of the shard count
 * asked for (embps_table_restore, _restore_state, _restore_meta). Test
 * builds and the crash tests stop the server at named points
 * (failpoint.h).
 *
 * Formats (little-endian):
 *
 * table-<incarnation %016llx>.dat
 *   header  64 B: "EMBPSTBL", u32 version, u32 dtype, u64 incarnation,
 *                 u32 dim, u32 0 (reserved: written 0, never read),
 *                 u32 record bytes, u32 shards, u32 optimizer, zeros,
 *                 u32 crc of bytes 0..59
 *                 (version >= 2: u32 flags at byte 44, 1: shard state)
 *   per shard: section 32 B: u32 'SHRD', u32 shard, u64 shard LSN,
 *                 u64 rows, u32 0, u32 crc of bytes 0..27
 *              version >= 2 with flag 1: state 24 B {u32 'DYNS', u32 0,
 *                 u64 bytes, u32 crc of the state, u32 crc of bytes
 *                 0..19} + the admission and eviction state (table_io.c,
 *                 "Shard state of a checkpoint"; version 2 had a shorter
 *                 header, without the counters)
 *              blocks: 16 B {u32 'BLCK', u32 records, u32 crc of the
 *                 records, u32 crc of bytes 0..11} + records (table.h),
 *                 as many records as fit 1 MiB (at least one) in every
 *                 block but a shard's last; rows with eviction state come
 *                 least recently pushed first, block after block, in the
 *                 order of the state's rows
 *   trailer 16 B: u32 'TEND', u32 shards, u32 0, u32 crc of bytes 0..11
 * The file's CRC in the MANIFEST chains every header, section, block
 * header (which holds its records' CRC) and the trailer.
 *
 * MANIFEST
 *   48 B: "EMBPSMAN", u32 version, u32 0, u64 S, u32 cluster size,
 *         u32 cluster index, u32 shards, u32 tables, u64 clients
 *   clients x {u64 client id, u64 seq}: the exactly-once table
 *   tables x {u64 incarnation, u64 step, u64 file bytes, u32 file crc,
 *             u32 spec bytes, packed TableSpec, zeros to 8 bytes}
 *   u32 crc of everything before, u32 'MEND' */
#include "ckpt.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "dio.h"
#include "failpoint.h"
#include "le.h"
#include "log.h"
#include "util.h"
#include "wal.h"
#include "wire.h"

/* 3: shard state with counters, grouped sketch */
#define VERSION EMBPS_CKPT_FORMAT
#define VERSION_V2 2u /* still read: shard state without counters */
#define VERSION_V1 EMBPS_CKPT_FORMAT_OLDEST /* still read: no shard state */
#define TBL_HAS_STATE 1u
#define DYNS 0x534e5944u
#define DYN_HDR 24
#define TBL_MAGIC "EMBPSTBL"
#define MAN_MAGIC "EMBPSMAN"
#define SHRD 0x44524853u
#define BLCK 0x4b434c42u
#define TEND 0x444e4554u
#define MEND 0x444e454du
#define BLOCK_BYTES (1u << 20)
#define TBL_HDR 64
#define SEC_HDR 32
#define BLK_HDR 16
#define MAN_HDR 48
#define MANIFEST_MAX ((size_t)1 << 30)

static void ckpt_name(char *buf, size_t len, const char *dir, uint64_t lsn,
                      const char *suffix) {
  snprintf(buf, len, "%s/ckpt-%016" PRIx64 "%s", dir, lsn, suffix);
}

/* Deletes a directory of plain files. */
static void rm_dir(const char *path) {
  DIR *d = opendir(path);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
        continue;
      char p[2200];
      snprintf(p, sizeof p, "%s/%s", path, e->d_name);
      unlink(p);
    }
    closedir(d);
  }
  if (rmdir(path) && errno != ENOENT)
    LOG_WARN("cannot delete %s: %s", path, strerror(errno));
}

/* ------------------------------------------------------------ writing */

/* Smaller files go through the page cache: for them O_DIRECT saves
 * nothing, and a file read many times (tests, tools) is read from memory. */
static uint64_t direct_min = 64u << 20;

void embps_ckpt_direct_min(uint64_t bytes) { direct_min = bytes; }

/* A checkpoint file being written into a sink, its bytes so far and the
 * CRC-32C chained over its headers, which the MANIFEST holds. */
typedef struct {
  embps_ckpt_sink_t *sink;
  uint64_t bytes;
  uint32_t chain;
} out_t;

/* Writes head (chained into o's CRC) then body (n bytes; its CRC is in
 * head). 0, or -1 with err. */
static int out_write(out_t *o, const void *head, size_t head_len,
                     const void *body, size_t body_len, char *err,
                     size_t err_len) {
  o->chain = embps_crc32c(o->chain, head, head_len);
  if (o->sink->write(o->sink, head, head_len, err, err_len))
    return -1;
  o->bytes += head_len + body_len;
  return body_len ? o->sink->write(o->sink, body, body_len, err, err_len)
                  : 0;
}


/* One shard's snapshot. write_table takes shard k + 1's on a thread of its
 * own while it writes shard k, so the copy out of the table and the write
 * (CRC-32C, the copy into the page cache) each use a core; at most two
 * shards' copies exist at a time. The records come in blocks of the file's
 * own block size, each with EMBPS_CKPT_BLOCK_ROOM bytes in front of it: a
 * sink with write_block sends them as they are. */
typedef struct {
  embps_table_t *t;
  uint32_t k;
  int with_state, rc;
  embps_table_blocks_t blocks;
  unsigned char *state;
  size_t state_bytes;
  uint64_t lsn, copy_ns; /* how long the shard was held for the copy */
} snap_job_t;

static void *snap_run(void *arg) {
  snap_job_t *j = arg;
  free(j->state);
  j->state = NULL;
  j->state_bytes = 0;
  j->rc = embps_table_snapshot_shard(j->t, j->k, &j->blocks, &j->lsn,
                                     j->with_state ? &j->state : NULL,
                                     &j->state_bytes, &j->copy_ns);
  return NULL;
}

/* Records a block holds: as many as fit BLOCK_BYTES, at least one. */
static size_t block_records(size_t record_bytes) {
  const size_t n = BLOCK_BYTES / record_bytes;
  return n ? n : 1;
}

/* Writes shard j's section; every block of j is taken (sent or freed). */
static int write_shard(out_t *f, snap_job_t *j, char *err, size_t err_len) {
  embps_table_blocks_t *bl = &j->blocks;
  embps_ckpt_sink_t *sink = f->sink;
  int rc = 0;
  if (j->rc) {
    snprintf(err, err_len, "checkpoint %s: out of memory copying shard %u",
             sink->path, j->k);
    rc = -1;
  }
  uint64_t rows = 0;
  for (size_t i = 0; i < bl->n; i++)
    rows += bl->rows[i];
  uint8_t h[SEC_HDR] = {0};
  embps_put32(h, SHRD);
  embps_put32(h + 4, j->k);
  embps_put64(h + 8, j->lsn);
  embps_put64(h + 16, rows);
  embps_put32(h + 28, embps_crc32c(0, h, 28));
  if (!rc)
    rc = out_write(f, h, sizeof h, NULL, 0, err, err_len);
  if (!rc && j->state) {
    uint8_t d[DYN_HDR] = {0};
    embps_put32(d, DYNS);
    embps_put64(d + 8, j->state_bytes);
    embps_put32(d + 16, embps_crc32c(0, j->state, j->state_bytes));
    embps_put32(d + 20, embps_crc32c(0, d, 20));
    rc = out_write(f, d, sizeof d, j->state, j->state_bytes, err, err_len);
  }
  const size_t fr = embps_table_file_record_bytes(j->t);
  for (size_t i = 0; i < bl->n; i++) {
    const size_t n = bl->rows[i], body = n * fr;
    unsigned char *recs = bl->buf[i] + bl->room;
    bl->buf[i] = NULL;
    uint8_t b[BLK_HDR];
    embps_put32(b, BLCK);
    embps_put32(b + 4, (uint32_t)n);
    embps_put32(b + 8, embps_crc32c(0, recs, body));
    embps_put32(b + 12, embps_crc32c(0, b, 12));
    if (rc) {
      free(recs - bl->room);
    } else if (sink->write_block) {
      f->chain = embps_crc32c(f->chain, b, sizeof b);
      f->bytes += sizeof b + body;
      rc = sink->write_block(sink, b, sizeof b, recs - bl->room, bl->room,
                             body, err, err_len);
    } else {
      rc = out_write(f, b, sizeof b, recs, body, err, err_len);
      free(recs - bl->room);
    }
  }
  bl->n = 0;
  return rc;
}

/* Whether a table's file carries shard state: a policy of issue 12. */
static int table_has_state(const embps_table_spec_t *spec) {
  return spec->dynamic &&
         (spec->admit_after > 1 || spec->admit_probability != 0 ||
          spec->ttl_steps || spec->max_rows || spec->evict_l2_below > 0);
}

/* Writes one table's file into sink; raises *max_lsn to the highest shard
 * LSN copied and res->longest_copy_ns to the longest shard copy. */
static int write_table(embps_ckpt_sink_t *sink, const embps_ckpt_table_t *ct,
                       int first, uint64_t *size, uint32_t *crc,
                       uint64_t *max_lsn, embps_ckpt_result_t *res, char *err,
                       size_t err_len) {
  embps_table_t *t = ct->table;
  const embps_table_spec_t *spec = embps_table_spec(t);
  embps_table_info_t info;
  embps_table_info(t, &info);
  const uint64_t guess = info.rows_allocated * embps_table_file_record_bytes(t);
  out_t f = {.sink = sink};
  if (sink->begin(sink, ct, guess, err, err_len))
    return -1;
  const uint32_t shards = embps_table_n_shards(t);
  uint8_t h[TBL_HDR] = {0};
  memcpy(h, TBL_MAGIC, 8);
  embps_put32(h + 8, VERSION);
  embps_put32(h + 12, (uint32_t)spec->dtype);
  embps_put64(h + 16, ct->incarnation);
  embps_put32(h + 24, spec->dim);
  embps_put32(h + 28, 0);
  embps_put32(h + 32, (uint32_t)embps_table_file_record_bytes(t));
  embps_put32(h + 36, shards);
  embps_put32(h + 40, (uint32_t)spec->optimizer);
  embps_put32(h + 44, table_has_state(spec) ? TBL_HAS_STATE : 0);
  embps_put32(h + 60, embps_crc32c(0, h, 60));
  int rc = out_write(&f, h, sizeof h, NULL, 0, err, err_len);
  const int with_state = table_has_state(spec);
  const embps_table_blocks_t blocks = {
      .per = block_records(embps_table_file_record_bytes(t)),
      .room = EMBPS_CKPT_BLOCK_ROOM};
  snap_job_t jobs[2] = {{.t = t, .with_state = with_state, .blocks = blocks},
                        {.t = t, .with_state = with_state, .blocks = blocks}};
  if (!rc)
    snap_run(&jobs[0]);
  for (uint32_t k = 0; !rc && k < shards; k++) {
    snap_job_t *next = &jobs[(k + 1) & 1];
    pthread_t th;
    int ahead = k + 1 < shards;
    next->k = k + 1;
    if (ahead && pthread_create(&th, NULL, snap_run, next)) {
      ahead = 0; /* no thread: in line */
      snap_run(next);
    }
    rc = write_shard(&f, &jobs[k & 1], err, err_len);
    if (jobs[k & 1].lsn > *max_lsn)
      *max_lsn = jobs[k & 1].lsn;
    if (jobs[k & 1].copy_ns > res->longest_copy_ns)
      res->longest_copy_ns = jobs[k & 1].copy_ns;
    if (ahead)
      pthread_join(th, NULL);
    if (first && k == (shards - 1) / 2)
      embps_failpoint("ckpt-mid-write");
  }
  for (int i = 0; i < 2; i++) {
    embps_table_blocks_close(&jobs[i].blocks);
    free(jobs[i].state);
  }
  uint8_t e[16] = {0};
  embps_put32(e, TEND);
  embps_put32(e + 4, shards);
  embps_put32(e + 12, embps_crc32c(0, e, 12));
  if (!rc)
    rc = out_write(&f, e, sizeof e, NULL, 0, err, err_len);
  rc = sink->end(sink, rc, err, err_len);
  *size = f.bytes;
  *crc = f.chain;
  return rc;
}

/* Appends n bytes to a growing buffer. */
typedef struct {
  uint8_t *p;
  size_t n, cap;
  int oom;
} buf_t;

static void buf_add(buf_t *b, const void *src, size_t n) {
  if (b->oom)
    return;
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + n)
      cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
      b->oom = 1;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  if (src)
    memcpy(b->p + b->n, src, n);
  else
    memset(b->p + b->n, 0, n);
  b->n += n;
}

static void buf_64(buf_t *b, uint64_t v) { buf_add(b, &v, 8); }
static void buf_32(buf_t *b, uint32_t v) { buf_add(b, &v, 4); }

/* A table spec as the MANIFEST and the stream's TABLE entries hold it:
 * packed as CREATE's message; *len its bytes, malloc'd (NULL: no memory). */
static uint8_t *spec_pack(const embps_table_spec_t *spec, size_t *len) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_CREATE;
  m.u.spec = *spec;
  *len = embps_msg_size(&m);
  uint8_t *p = malloc(*len ? *len : 1);
  if (p)
    embps_msg_pack(&m, p);
  return p;
}

static int write_manifest(embps_ckpt_sink_t *sink, const embps_ckpt_t *c,
                          const uint64_t *sizes, const uint32_t *crcs,
                          char *err, size_t err_len) {
  buf_t b = {0};
  buf_add(&b, MAN_MAGIC, 8);
  buf_32(&b, VERSION);
  buf_32(&b, 0);
  buf_64(&b, c->lsn);
  buf_32(&b, c->cluster_size);
  buf_32(&b, c->cluster_index);
  buf_32(&b, c->shards);
  buf_32(&b, (uint32_t)c->n_tables);
  buf_64(&b, c->n_seen);
  for (size_t i = 0; i < c->n_seen; i++) {
    buf_64(&b, c->seen[i].client);
    buf_64(&b, c->seen[i].seq);
  }
  for (size_t i = 0; i < c->n_tables; i++) {
    size_t len;
    uint8_t *spec = spec_pack(&c->tables[i].spec, &len);
    b.oom |= !spec;
    buf_64(&b, c->tables[i].incarnation);
    buf_64(&b, c->tables[i].step);
    buf_64(&b, sizes[i]);
    buf_32(&b, crcs[i]);
    buf_32(&b, (uint32_t)len);
    buf_add(&b, spec, len);
    buf_add(&b, NULL, ((len + 7) & ~(size_t)7) - len);
    free(spec);
  }
  if (!b.oom)
    buf_32(&b, embps_crc32c(0, b.p, b.n));
  buf_32(&b, MEND);
  int rc = -1;
  if (b.oom) {
    snprintf(err, err_len, "checkpoint MANIFEST: out of memory");
  } else if (!sink->begin(sink, NULL, b.n, err, err_len)) {
    rc = sink->end(sink, sink->write(sink, b.p, b.n, err, err_len), err,
                   err_len);
  }
  free(b.p);
  return rc;
}

int embps_ckpt_emit(embps_ckpt_sink_t *sink, const embps_ckpt_t *c,
                    embps_ckpt_result_t *res, char *err, size_t err_len) {
  memset(res, 0, sizeof *res);
  uint64_t *sizes = calloc(c->n_tables + 1, sizeof *sizes);
  uint32_t *crcs = calloc(c->n_tables + 1, sizeof *crcs);
  int rc = sizes && crcs ? 0 : -1;
  if (rc)
    snprintf(err, err_len, "checkpoint: out of memory");
  uint64_t max_lsn = 0;
  for (size_t i = 0; !rc && i < c->n_tables; i++) {
    rc = write_table(sink, &c->tables[i], i == 0, &sizes[i], &crcs[i],
                     &max_lsn, res, err, err_len);
    res->bytes += sizes[i];
  }
  res->max_lsn = max_lsn > c->lsn ? max_lsn : c->lsn;
  /* The shards were copied one after another while pushes went on: a
   * later shard may hold a push an earlier one lacks. Replay completes the
   * earlier one from the log, so the log must be durable that far before
   * the checkpoint can replace it. */
  if (!rc && c->log_sync && max_lsn > c->lsn)
    rc = c->log_sync(c->log_ctx, max_lsn, err, err_len);
  if (!rc)
    rc = write_manifest(sink, c, sizes, crcs, err, err_len);
  free(sizes);
  free(crcs);
  return rc;
}

/* ---- a directory: each file written into ckpt-S.tmp through dio.h ---- */

typedef struct {
  embps_ckpt_sink_t base;
  const char *tmp;
  embps_dio_writer_t w;
} dir_sink_t;

static int dir_begin(embps_ckpt_sink_t *s, const embps_ckpt_table_t *ct,
                     uint64_t size_guess, char *err, size_t err_len) {
  dir_sink_t *d = (dir_sink_t *)s;
  if (ct)
    snprintf(s->path, sizeof s->path, "%s/table-%016" PRIx64 ".dat", d->tmp,
             ct->incarnation);
  else
    snprintf(s->path, sizeof s->path, "%s/MANIFEST", d->tmp);
  return embps_dio_writer_open(&d->w, "checkpoint", s->path,
                               ct && size_guess >= direct_min, err, err_len);
}

static int dir_write(embps_ckpt_sink_t *s, const void *p, size_t n,
                     char *err, size_t err_len) {
  return embps_dio_write(&((dir_sink_t *)s)->w, p, n, err, err_len);
}

static int dir_end(embps_ckpt_sink_t *s, int rc, char *err, size_t err_len) {
  return embps_dio_writer_close(&((dir_sink_t *)s)->w, rc, err, err_len);
}

int embps_ckpt_write(const char *dir, const embps_ckpt_t *c,
                     embps_ckpt_result_t *res, char *err, size_t err_len) {
  char tmp[1100], final[1100];
  ckpt_name(tmp, sizeof tmp, dir, c->lsn, ".tmp");
  ckpt_name(final, sizeof final, dir, c->lsn, "");
  struct stat st;
  memset(res, 0, sizeof *res);
  if (!stat(final, &st))
    return 0; /* the same LSN holds the same state */
  rm_dir(tmp);
  if (mkdir(tmp, 0755)) {
    snprintf(err, err_len, "checkpoint %s: %s", tmp, strerror(errno));
    return -1;
  }
  embps_failpoint("ckpt-before-write");
  dir_sink_t sink = {.base = {.begin = dir_begin, .write = dir_write,
                              .end = dir_end},
                     .tmp = tmp};
  int rc = embps_ckpt_emit(&sink.base, c, res, err, err_len);
  if (!rc && embps_fsync_dir(tmp)) {
    snprintf(err, err_len, "checkpoint %s: fsync of the directory failed",
             tmp);
    rc = -1;
  }
  if (!rc)
    embps_failpoint("ckpt-before-rename");
  if (!rc && rename(tmp, final)) {
    snprintf(err, err_len, "checkpoint %s: rename failed: %s", tmp,
             strerror(errno));
    rc = -1;
  }
  if (!rc && embps_fsync_dir(dir)) {
    snprintf(err, err_len, "checkpoint %s: fsync of %s failed", final, dir);
    rc = -1;
  }
  if (rc)
    rm_dir(tmp);
  return rc;
}

/* ---- a snapshot stream: each file an entry of DATA pieces ---- */

static int stream_put(embps_ckpt_stream_t *s, const void *p, size_t n,
                      char *err, size_t err_len) {
  return s->put(s->ctx, p, n, err, err_len);
}

/* Begins an entry (snapstream.h) with info bytes. */
static int stream_entry(embps_ckpt_stream_t *s, uint32_t type, uint64_t id,
                        uint64_t step, const uint8_t *info, size_t info_len,
                        char *err, size_t err_len) {
  embps_snapstream_entry_t e = {.type = type, .id = id, .step = step,
                                .info_len = (uint32_t)info_len};
  uint8_t h[EMBPS_SNAPSTREAM_ENTRY_BYTES];
  char name[64];
  embps_snapstream_entry_name(&e, name, sizeof name);
  snprintf(s->base.path, sizeof s->base.path, "snapshot stream %s", name);
  static const uint8_t zeros[8];
  s->file_bytes = 0;
  s->entries++;
  embps_snapstream_put_entry(h, &e);
  if (stream_put(s, h, sizeof h, err, err_len) ||
      (info_len && stream_put(s, info, info_len, err, err_len)))
    return -1;
  size_t pad = ((info_len + 7) & ~(size_t)7) - info_len;
  return pad ? stream_put(s, zeros, pad, err, err_len) : 0;
}

static int stream_begin(embps_ckpt_sink_t *b, const embps_ckpt_table_t *ct,
                        uint64_t size_guess, char *err, size_t err_len) {
  embps_ckpt_stream_t *s = (embps_ckpt_stream_t *)b;
  (void)size_guess;
  if (!ct)
    return stream_entry(s, EMBPS_SNAPSTREAM_MANIFEST, 0, 0, NULL, 0, err,
                        err_len);
  size_t len;
  uint8_t *spec = spec_pack(&ct->spec, &len);
  if (!spec) {
    snprintf(err, err_len, "snapshot stream: out of memory");
    return -1;
  }
  int rc = stream_entry(s, EMBPS_SNAPSTREAM_TABLE, ct->incarnation, ct->step,
                        spec, len, err, err_len);
  free(spec);
  return rc;
}

static int stream_write(embps_ckpt_sink_t *b, const void *p, size_t n,
                        char *err, size_t err_len) {
  embps_ckpt_stream_t *s = (embps_ckpt_stream_t *)b;
  const uint8_t *src = p;
  while (n) {
    uint32_t k = n < EMBPS_SNAPSTREAM_DATA_MAX ? (uint32_t)n
                                               : EMBPS_SNAPSTREAM_DATA_MAX;
    uint8_t h[EMBPS_SNAPSTREAM_DATA_BYTES];
    embps_snapstream_put_data(h, k);
    if (stream_put(s, h, sizeof h, err, err_len) ||
        stream_put(s, src, k, err, err_len))
      return -1;
    s->file_bytes += k;
    src += k;
    n -= k;
  }
  return 0;
}

/* A block handed over: its BLCK header and the DATA header of both go
 * into the room in front of its records, and the buffer to put_block. */
static int stream_write_block(embps_ckpt_sink_t *b, const void *head,
                              size_t head_len, uint8_t *buf, size_t room,
                              size_t body_len, char *err, size_t err_len) {
  embps_ckpt_stream_t *s = (embps_ckpt_stream_t *)b;
  const size_t len = head_len + body_len;
  const size_t off = room - head_len - EMBPS_SNAPSTREAM_DATA_BYTES;
  assert(room >= head_len + EMBPS_SNAPSTREAM_DATA_BYTES);
  if (len > EMBPS_SNAPSTREAM_DATA_MAX) { /* never with 1 MiB blocks */
    int rc = stream_write(b, head, head_len, err, err_len) ||
             stream_write(b, buf + room, body_len, err, err_len);
    free(buf);
    return rc ? -1 : 0;
  }
  embps_snapstream_put_data(buf + off, (uint32_t)len);
  memcpy(buf + off + EMBPS_SNAPSTREAM_DATA_BYTES, head, head_len);
  s->file_bytes += len;
  return s->put_block(s->ctx, buf, off, EMBPS_SNAPSTREAM_DATA_BYTES + len,
                      err, err_len);
}

static int stream_file_end(embps_ckpt_sink_t *b, int rc, char *err,
                           size_t err_len) {
  embps_ckpt_stream_t *s = (embps_ckpt_stream_t *)b;
  if (rc)
    return rc;
  uint8_t h[EMBPS_SNAPSTREAM_FEND_BYTES];
  embps_snapstream_put_fend(h, s->file_bytes);
  return stream_put(s, h, sizeof h, err, err_len);
}

void embps_ckpt_stream_init(embps_ckpt_stream_t *s,
                            int (*put)(void *ctx, const void *p, size_t n,
                                       char *err, size_t err_len),
                            int (*put_block)(void *ctx, uint8_t *buf,
                                             size_t off, size_t n, char *err,
                                             size_t err_len),
                            void *ctx) {
  memset(s, 0, sizeof *s);
  s->base.begin = stream_begin;
  s->base.write = stream_write;
  s->base.end = stream_file_end;
  s->base.write_block = put_block ? stream_write_block : NULL;
  s->put_block = put_block;
  snprintf(s->base.path, sizeof s->base.path, "snapshot stream");
  s->put = put;
  s->ctx = ctx;
}

int embps_ckpt_stream_head(embps_ckpt_stream_t *s, const embps_ckpt_t *c,
                           uint32_t flags, char *err, size_t err_len) {
  const embps_snapstream_head_t h = {
      .version = EMBPS_SNAPSTREAM_VERSION, .ckpt_format = VERSION,
      .lsn = c->lsn, .cluster_size = c->cluster_size,
      .cluster_index = c->cluster_index, .shards = c->shards, .flags = flags};
  uint8_t b[EMBPS_SNAPSTREAM_HEAD_BYTES];
  embps_snapstream_put_head(b, &h);
  return stream_put(s, b, sizeof b, err, err_len);
}

int embps_ckpt_stream_log(embps_ckpt_stream_t *s, uint64_t first_lsn,
                          char *err, size_t err_len) {
  return stream_entry(s, EMBPS_SNAPSTREAM_LOG, first_lsn, 0, NULL, 0, err,
                      err_len);
}

int embps_ckpt_stream_end(embps_ckpt_stream_t *s, uint64_t lsn, char *err,
                          size_t err_len) {
  const embps_snapstream_end_t e = {.entries = s->entries, .lsn = lsn};
  uint8_t b[EMBPS_SNAPSTREAM_END_BYTES];
  embps_snapstream_put_end(b, &e);
  snprintf(s->base.path, sizeof s->base.path, "snapshot stream");
  return stream_put(s, b, sizeof b, err, err_len);
}

/* ------------------------------------------------------------ reading */

/* A checkpoint file being read: a file (dio.h) or the current entry of a
 * snapshot stream, with the bytes read so far and the CRC-32C chained over
 * the headers read, checked against the MANIFEST's at the end. */
typedef struct {
  embps_dio_reader_t *r;        /* a file, or NULL: */
  embps_snapstream_reader_t *s; /* a stream entry */
  const char *path;             /* names it in messages */
  uint64_t off;                 /* bytes read */
  uint64_t size;                /* a file's size; UINT64_MAX in a stream */
  uint32_t chain;
} in_t;

/* A stream's error, with the file it is in. */
static int in_stream_fail(in_t *f, char *err, size_t err_len) {
  char why[1024];
  snprintf(why, sizeof why, "%s", err);
  snprintf(err, err_len, "checkpoint %s: %s", f->path, why);
  return -1;
}

/* Reads the next n bytes (part names them in messages). 0, or -1 with
 * err. */
static int in_read(in_t *f, void *p, size_t n, const char *part, char *err,
                   size_t err_len) {
  if (f->r) {
    f->r->off = f->off;
    if (embps_dio_read(f->r, p, n, part, err, err_len))
      return -1;
  } else if (embps_snapstream_read(f->s, p, n, part, err, err_len)) {
    return in_stream_fail(f, err, err_len);
  }
  f->off += n;
  return 0;
}

/* The next n bytes, in place or in spill (in_read's terms). */
static const uint8_t *in_view(in_t *f, size_t n, uint8_t *spill,
                              const char *part, char *err, size_t err_len) {
  const uint8_t *p;
  if (f->r) {
    f->r->off = f->off;
    p = embps_dio_view(f->r, n, spill, part, err, err_len);
  } else if (!(p = embps_snapstream_view(f->s, n, spill, part, err,
                                         err_len))) {
    in_stream_fail(f, err, err_len);
  }
  if (p)
    f->off += n;
  return p;
}

int embps_ckpt_latest(const char *dir, uint64_t *lsn, char *err,
                      size_t err_len) {
  DIR *d = opendir(dir);
  if (!d) {
    snprintf(err, err_len, "data dir %s: %s", dir, strerror(errno));
    return -1;
  }
  int found = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *n = e->d_name;
    if (strncmp(n, "ckpt-", 5) || strlen(n) < 21)
      continue;
    char *end;
    unsigned long long v = strtoull(n + 5, &end, 16);
    if (end != n + 21)
      continue;
    if (!strcmp(end, ".tmp")) {
      char p[1200];
      snprintf(p, sizeof p, "%s/%s", dir, n);
      LOG_INFO("deleting the unfinished checkpoint %s", p);
      rm_dir(p);
    } else if (!*end && (!found || v > *lsn)) {
      *lsn = v;
      found = 1;
    }
  }
  closedir(d);
  return found;
}


static int bad(in_t *f, uint64_t off, const char *what, char *err,
               size_t err_len) {
  snprintf(err, err_len, "checkpoint %s: %s at offset %" PRIu64 ": checksum "
           "mismatch or bad field", f->path, what, off);
  return -1;
}

/* The most bytes of shard state a stream may announce (a file's size
 * bounds it in a directory). */
#define STREAM_STATE_MAX ((uint64_t)1 << 38)

/* Reads the state block of shard section k (version >= 2) into *state
 * and restores the shard's counters and admission sketch from it. 0, or
 * -1 with err. */
static int read_state(in_t *f, embps_table_t *t, uint32_t version,
                      uint32_t k, uint32_t file_shards, unsigned char **state,
                      size_t *bytes, char *err, size_t err_len) {
  uint8_t d[DYN_HDR];
  const uint64_t at = f->off;
  if (in_read(f, d, sizeof d, "shard state header", err, err_len))
    return -1;
  const uint64_t n = embps_get64(d + 8);
  if (embps_get32(d) != DYNS || embps_get32(d + 20) != embps_crc32c(0, d, 20) ||
      (f->r ? n > f->size - f->off : n > STREAM_STATE_MAX)) {
    return bad(f, at, "shard state header", err, err_len);
  }
  f->chain = embps_crc32c(f->chain, d, sizeof d);
  if (!(*state = malloc(n ? n : 1))) {
    snprintf(err, err_len, "checkpoint %s: out of memory", f->path);
    return -1;
  }
  *bytes = n;
  const uint64_t state_at = f->off;
  if (in_read(f, *state, n, "shard state", err, err_len))
    return -1;
  if (embps_crc32c(0, *state, n) != embps_get32(d + 16) ||
      embps_table_restore_state(t, version, k, file_shards, *state, n))
    return bad(f, state_at, "shard state", err, err_len);
  return 0;
}

/* Reads a table file from its header to its trailer into ct->table
 * (created empty, incarnation and step set), setting ct->file_shards and
 * ct->shard_lsn; f->chain is then the file's CRC and f->off its bytes.
 * 0, or -1 with err. */
static int read_table(in_t *f, embps_ckpt_table_t *ct, char *err,
                      size_t err_len) {
  int rc = -1;
  unsigned char *recs = NULL, *state = NULL;
  size_t state_bytes = 0;
  int64_t *ids = NULL;
  embps_table_scratch_t s;
  embps_table_scratch_init(&s);
  embps_table_t *t = ct->table;
  const embps_table_spec_t *spec = embps_table_spec(t);
  const size_t fr = embps_table_file_record_bytes(t);
  uint8_t h[TBL_HDR];
  f->chain = 0;
  if (in_read(f, h, sizeof h, "header", err, err_len))
    goto out;
  if (!memcmp(h, TBL_MAGIC, 8) && embps_get32(h + 60) == embps_crc32c(0, h, 60) &&
      embps_get32(h + 8) > VERSION) {
    snprintf(err, err_len, "checkpoint %s: header at offset 0: "
             EMBPS_FORMAT_NEWER, f->path, embps_get32(h + 8), VERSION);
    goto out;
  }
  if (memcmp(h, TBL_MAGIC, 8) || embps_get32(h + 60) != embps_crc32c(0, h, 60) ||
      embps_get32(h + 8) < VERSION_V1 || embps_get32(h + 8) > VERSION ||
      embps_get32(h + 12) != (uint32_t)spec->dtype ||
      embps_get64(h + 16) != ct->incarnation || embps_get32(h + 24) != spec->dim ||
      embps_get32(h + 32) != fr || embps_get32(h + 36) == 0 || embps_get32(h + 36) > 65536) {
    bad(f, 0, "header", err, err_len);
    goto out;
  }
  f->chain = embps_crc32c(0, h, sizeof h);
  const uint32_t version = embps_get32(h + 8);
  const int has_state = version >= VERSION_V2 &&
                        (embps_get32(h + 44) & TBL_HAS_STATE);
  ct->file_shards = embps_get32(h + 36);
  ct->shard_lsn = calloc(ct->file_shards, sizeof *ct->shard_lsn);
  const size_t per = block_records(fr);
  recs = malloc(per * fr);
  ids = malloc(per * sizeof *ids);
  if (!ct->shard_lsn || !recs || !ids) {
    snprintf(err, err_len, "checkpoint %s: out of memory", f->path);
    goto out;
  }
  for (uint32_t k = 0; k < ct->file_shards; k++) {
    uint8_t sh[SEC_HDR];
    uint64_t at = f->off;
    if (in_read(f, sh, sizeof sh, "shard section", err, err_len))
      goto out;
    if (embps_get32(sh) != SHRD || embps_get32(sh + 28) != embps_crc32c(0, sh, 28) ||
        embps_get32(sh + 4) != k) {
      bad(f, at, "shard section", err, err_len);
      goto out;
    }
    f->chain = embps_crc32c(f->chain, sh, sizeof sh);
    ct->shard_lsn[k] = embps_get64(sh + 8);
    uint64_t rows = embps_get64(sh + 16), first = 0;
    free(state);
    state = NULL;
    state_bytes = 0;
    if (has_state && read_state(f, t, version, k, ct->file_shards, &state,
                                &state_bytes, err, err_len))
      goto out;
    while (rows) {
      uint8_t b[BLK_HDR];
      at = f->off;
      if (in_read(f, b, sizeof b, "block header", err, err_len))
        goto out;
      uint32_t n = embps_get32(b + 4);
      if (embps_get32(b) != BLCK || embps_get32(b + 12) != embps_crc32c(0, b, 12) ||
          n == 0 || n > per || n > rows) {
        bad(f, at, "block header", err, err_len);
        goto out;
      }
      f->chain = embps_crc32c(f->chain, b, sizeof b);
      const uint64_t blk_at = f->off;
      const uint8_t *blk = in_view(f, n * fr, recs, "block", err, err_len);
      if (!blk)
        goto out;
      if (embps_crc32c(0, blk, n * fr) != embps_get32(b + 8)) {
        bad(f, blk_at, "block", err, err_len);
        goto out;
      }
      int r = embps_table_restore(t, &s, blk, n, ids);
      if (!r && state)
        r = embps_table_restore_meta(t, version, state, state_bytes, ids,
                                     first, n);
      first += n;
      if (r) {
        snprintf(err, err_len, "checkpoint %s: block at offset %" PRIu64
                 ": cannot restore its rows: %s", f->path, blk_at,
                 embps_strerror(r));
        goto out;
      }
      rows -= n;
    }
  }
  uint8_t e[16];
  uint64_t at = f->off;
  if (in_read(f, e, sizeof e, "trailer", err, err_len))
    goto out;
  if (embps_get32(e) != TEND || embps_get32(e + 12) != embps_crc32c(0, e, 12) ||
      embps_get32(e + 4) != ct->file_shards ||
      (f->r && at + sizeof e != f->size)) {
    bad(f, at, "trailer", err, err_len);
    goto out;
  }
  f->chain = embps_crc32c(f->chain, e, sizeof e);
  rc = 0;
out:
  embps_table_scratch_close(&s);
  free(state);
  free(recs);
  free(ids);
  return rc;
}

/* Loads ct's table file from checkpoint directory cdir: of want_size bytes
 * and CRC want_crc (the MANIFEST's). */
static int load_table(const char *cdir, embps_ckpt_table_t *ct,
                      uint64_t want_size, uint32_t want_crc, char *err,
                      size_t err_len) {
  char path[1200];
  snprintf(path, sizeof path, "%s/table-%016" PRIx64 ".dat", cdir,
           ct->incarnation);
  embps_dio_reader_t r;
  if (embps_dio_reader_open(&r, "checkpoint", path, direct_min, err,
                            err_len))
    return -1;
  in_t f = {.r = &r, .path = path, .size = r.size};
  int rc = -1;
  if (r.size != want_size) {
    snprintf(err, err_len, "checkpoint %s: %" PRIu64 " bytes at offset 0, "
             "the MANIFEST says %" PRIu64, path, r.size, want_size);
  } else if (!read_table(&f, ct, err, err_len)) {
    if (f.chain != want_crc)
      snprintf(err, err_len, "checkpoint %s: file checksum at offset 0 does "
               "not match the MANIFEST", path);
    else
      rc = 0;
  }
  embps_dio_reader_close(&r);
  return rc;
}

/* A MANIFEST's table entry. */
typedef struct {
  uint64_t incarnation, step, size;
  uint32_t crc;
  embps_table_spec_t spec;
  const uint8_t *packed; /* the spec as packed in the MANIFEST */
  uint32_t packed_len;
} man_table_t;

/* A parsed MANIFEST: header fields into c (lsn, cluster, shards, seen:
 * malloc'd), tables into *tables (malloc'd, *n; packed points into p). */
static int parse_manifest(const uint8_t *p, size_t len, const char *path,
                          uint64_t lsn, embps_ckpt_t *c, man_table_t **tables,
                          uint32_t *n, uint32_t *version, char *err,
                          size_t err_len) {
  *tables = NULL;
  *n = 0;
  if (len < MAN_HDR + 8 || len > MANIFEST_MAX ||
      embps_get32(p + len - 4) != MEND ||
      embps_get32(p + len - 8) != embps_crc32c(0, p, len - 8)) {
    snprintf(err, err_len, "checkpoint %s: trailer at offset %zu: checksum "
             "mismatch or short file", path, len >= 8 ? len - 8 : 0);
    return -1;
  }
  if (!memcmp(p, MAN_MAGIC, 8) && embps_get32(p + 8) > VERSION) {
    snprintf(err, err_len, "checkpoint %s: header at offset 0: "
             EMBPS_FORMAT_NEWER, path, embps_get32(p + 8), VERSION);
    return -1;
  }
  if (memcmp(p, MAN_MAGIC, 8) ||
      embps_get32(p + 8) < VERSION_V1 || embps_get32(p + 8) > VERSION ||
      embps_get64(p + 16) != lsn) {
    snprintf(err, err_len, "checkpoint %s: header at offset 0: bad magic, "
             "version or LSN", path);
    return -1;
  }
  *version = embps_get32(p + 8);
  c->lsn = lsn;
  c->cluster_size = embps_get32(p + 24);
  c->cluster_index = embps_get32(p + 28);
  c->shards = embps_get32(p + 32);
  uint32_t n_tables = embps_get32(p + 36);
  uint64_t n_seen = embps_get64(p + 40);
  size_t off = MAN_HDR, end = len - 8;
  if (n_seen > (end - off) / 16 || n_tables > (end - off) / 32) {
    snprintf(err, err_len, "checkpoint %s: header at offset 0: %" PRIu64
             " clients and %u tables do not fit", path, n_seen, n_tables);
    return -1;
  }
  c->seen = malloc((n_seen ? n_seen : 1) * sizeof *c->seen);
  *tables = calloc(n_tables ? n_tables : 1, sizeof **tables);
  if (!c->seen || !*tables) {
    snprintf(err, err_len, "checkpoint %s: out of memory", path);
    return -1;
  }
  for (uint64_t i = 0; i < n_seen; i++, off += 16) {
    c->seen[i].client = embps_get64(p + off);
    c->seen[i].seq = embps_get64(p + off + 8);
  }
  c->n_seen = n_seen;
  for (uint32_t i = 0; i < n_tables; i++) {
    size_t at = off;
    if (end - off < 32) {
      snprintf(err, err_len, "checkpoint %s: table at offset %zu: past the "
               "end", path, at);
      return -1;
    }
    man_table_t *mt = &(*tables)[i];
    mt->incarnation = embps_get64(p + off);
    mt->step = embps_get64(p + off + 8);
    mt->size = embps_get64(p + off + 16);
    mt->crc = embps_get32(p + off + 24);
    mt->packed_len = embps_get32(p + off + 28);
    off += 32;
    size_t padded = ((size_t)mt->packed_len + 7) & ~(size_t)7;
    embps_msg_t m;
    char why[256];
    if (end - off < padded ||
        embps_msg_unpack(EMBPS_KIND_CREATE, p + off, mt->packed_len, &m) ||
        embps_table_spec_check(&m.u.spec, why, sizeof why)) {
      snprintf(err, err_len, "checkpoint %s: table at offset %zu: spec does "
               "not decode", path, at);
      return -1;
    }
    mt->packed = p + off;
    mt->spec = m.u.spec;
    off += padded;
    *n = i + 1;
  }
  if (off != end) {
    snprintf(err, err_len, "checkpoint %s: %zu stray bytes at offset %zu",
             path, end - off, off);
    return -1;
  }
  return 0;
}

/* A table of spec for c's next slot, made empty for `shards` shards of a
 * cluster of cluster_size. 0, or -1 with err. */
static int add_table(embps_ckpt_t *c, const embps_table_spec_t *spec,
                     uint64_t incarnation, uint64_t step, uint32_t shards,
                     uint32_t cluster_size, const char *path, char *err,
                     size_t err_len) {
  embps_ckpt_table_t *ct = &c->tables[c->n_tables];
  memset(ct, 0, sizeof *ct);
  if (embps_table_create(spec, shards, cluster_size, &ct->table)) {
    snprintf(err, err_len, "checkpoint %s: table \"%s\": out of memory",
             path, spec->name);
    return -1;
  }
  c->n_tables++;
  ct->incarnation = incarnation;
  ct->step = step;
  ct->spec = *spec;
  embps_table_set_incarnation(ct->table, incarnation);
  embps_table_set_step(ct->table, step);
  return 0;
}

int embps_ckpt_load(const char *dir, uint64_t lsn, uint32_t shards,
                    uint32_t cluster_size, embps_ckpt_t *c, char *err,
                    size_t err_len) {
  char cdir[1100], path[1200];
  ckpt_name(cdir, sizeof cdir, dir, lsn, "");
  snprintf(path, sizeof path, "%s/MANIFEST", cdir);
  memset(c, 0, sizeof *c);
  char *data;
  size_t len;
  int r = embps_read_file(path, &data, &len);
  if (r) {
    snprintf(err, err_len, "checkpoint %s: %s", path, strerror(-r));
    return -1;
  }
  man_table_t *mt = NULL;
  uint32_t n = 0, version;
  int rc = parse_manifest((const uint8_t *)data, len, path, lsn, c, &mt, &n,
                          &version, err, err_len);
  if (!rc && !(c->tables = calloc(n ? n : 1, sizeof *c->tables))) {
    snprintf(err, err_len, "checkpoint %s: out of memory", path);
    rc = -1;
  }
  for (uint32_t i = 0; !rc && i < n; i++)
    rc = add_table(c, &mt[i].spec, mt[i].incarnation, mt[i].step, shards,
                   cluster_size, path, err, err_len) ||
         load_table(cdir, &c->tables[i], mt[i].size, mt[i].crc, err,
                    err_len);
  free(mt);
  free(data);
  if (rc)
    embps_ckpt_free(c);
  return rc ? -1 : 0;
}

/* ---- from a snapshot stream ---- */

/* What a stream's table entry brought, to check against its MANIFEST. */
typedef struct {
  uint64_t size;
  uint32_t crc;
  uint8_t *packed; /* the entry's spec bytes */
  uint32_t packed_len;
} came_t;

/* Reads the current entry's bytes whole (the MANIFEST) into *out. */
static int read_whole(embps_snapstream_reader_t *s, const char *path,
                      uint8_t **out, size_t *len, char *err, size_t err_len) {
  buf_t b = {0};
  for (;;) {
    const uint8_t *p;
    size_t n;
    if (embps_snapstream_piece(s, &p, &n, err, err_len)) {
      in_t f = {.path = path};
      free(b.p);
      return in_stream_fail(&f, err, err_len);
    }
    if (!n)
      break;
    if (b.n + n > MANIFEST_MAX) {
      snprintf(err, err_len, "checkpoint %s: larger than %zu bytes", path,
               MANIFEST_MAX);
      free(b.p);
      return -1;
    }
    buf_add(&b, p, n);
    if (b.oom) {
      snprintf(err, err_len, "checkpoint %s: out of memory", path);
      free(b.p);
      return -1;
    }
  }
  *out = b.p;
  *len = b.n;
  return 0;
}

/* The stream's MANIFEST (bytes p, len) must list exactly the tables that
 * came, in their order, with their sizes, CRCs, steps and specs. Sets c's
 * header fields and exactly-once table. */
static int check_manifest(embps_ckpt_t *c, const came_t *came,
                          const uint8_t *p, size_t len,
                          const embps_snapstream_head_t *h, const char *path,
                          char *err, size_t err_len) {
  embps_ckpt_t m;
  memset(&m, 0, sizeof m);
  man_table_t *mt;
  uint32_t n, version;
  int rc = parse_manifest(p, len, path, h->lsn, &m, &mt, &n, &version, err,
                          err_len);
  if (!rc && (version != h->ckpt_format || m.shards != h->shards ||
              m.cluster_size != h->cluster_size ||
              m.cluster_index != h->cluster_index)) {
    snprintf(err, err_len, "checkpoint %s: its format, shards or cluster "
             "slot differ from the stream's head", path);
    rc = -1;
  }
  if (!rc && n != c->n_tables) {
    snprintf(err, err_len, "checkpoint %s: lists %u tables, %zu came", path,
             n, c->n_tables);
    rc = -1;
  }
  for (uint32_t i = 0; !rc && i < n; i++) {
    const embps_ckpt_table_t *ct = &c->tables[i];
    if (mt[i].incarnation != ct->incarnation || mt[i].step != ct->step ||
        mt[i].size != came[i].size || mt[i].crc != came[i].crc ||
        mt[i].packed_len != came[i].packed_len ||
        memcmp(mt[i].packed, came[i].packed, came[i].packed_len)) {
      snprintf(err, err_len, "checkpoint %s: table %u (\"%s\") differs from "
               "the table file that came", path, i, mt[i].spec.name);
      rc = -1;
    }
  }
  free(mt);
  if (rc) {
    free(m.seen);
    return -1;
  }
  c->lsn = m.lsn;
  c->cluster_size = m.cluster_size;
  c->cluster_index = m.cluster_index;
  c->shards = m.shards;
  c->seen = m.seen;
  c->n_seen = m.n_seen;
  return 0;
}

/* The stream's next TABLE entry e into a new table of c. */
static int stream_table(embps_snapstream_reader_t *s,
                        const embps_snapstream_entry_t *e, embps_ckpt_t *c,
                        came_t *came, uint32_t shards, uint32_t cluster_size,
                        char *err, size_t err_len) {
  char name[64], path[128];
  embps_snapstream_entry_name(e, name, sizeof name);
  snprintf(path, sizeof path, "snapshot stream %s", name);
  embps_msg_t m;
  char why[256];
  if (!e->info ||
      embps_msg_unpack(EMBPS_KIND_CREATE, e->info, e->info_len, &m) ||
      embps_table_spec_check(&m.u.spec, why, sizeof why)) {
    snprintf(err, err_len, "checkpoint %s: its entry's spec does not "
             "decode", path);
    return -1;
  }
  if (add_table(c, &m.u.spec, e->id, e->step, shards, cluster_size, path,
                err, err_len))
    return -1;
  in_t f = {.s = s, .path = path, .size = UINT64_MAX};
  if (read_table(&f, &c->tables[c->n_tables - 1], err, err_len))
    return -1;
  uint64_t bytes;
  if (embps_snapstream_file_end(s, &bytes, err, err_len))
    return in_stream_fail(&f, err, err_len);
  came->size = bytes;
  came->crc = f.chain;
  return 0;
}

int embps_ckpt_load_stream(embps_snapstream_reader_t *s, uint32_t shards,
                           uint32_t cluster_size, embps_ckpt_t *c, char *err,
                           size_t err_len) {
  memset(c, 0, sizeof *c);
  embps_snapstream_head_t h;
  if (embps_snapstream_head(s, &h, err, err_len))
    return -1;
  if (h.flags & EMBPS_SNAPSTREAM_WITH_LOG) {
    snprintf(err, err_len, "snapshot stream: carries log segments (a "
             "backup's): write it to a data dir instead");
    return -1;
  }
  if (h.ckpt_format > VERSION) {
    snprintf(err, err_len, "snapshot stream: " EMBPS_FORMAT_NEWER,
             h.ckpt_format, VERSION);
    return -1;
  }
  if (h.ckpt_format < VERSION_V1) {
    snprintf(err, err_len, "snapshot stream: checkpoint format %u (this "
             "build reads %u to %u)", h.ckpt_format, VERSION_V1, VERSION);
    return -1;
  }
  came_t *came = NULL;
  size_t cap = 0;
  int rc = 0, manifest = 0;
  for (;;) {
    embps_snapstream_entry_t e;
    int got = embps_snapstream_entry(s, &e, err, err_len);
    if (got <= 0) {
      rc = got;
      if (!got && !manifest) {
        snprintf(err, err_len, "snapshot stream: ends without a MANIFEST");
        rc = -1;
      }
      break;
    }
    char name[64];
    embps_snapstream_entry_name(&e, name, sizeof name);
    if (manifest || e.type == EMBPS_SNAPSTREAM_LOG) {
      snprintf(err, err_len, "snapshot stream: entry %s after the MANIFEST%s",
               name, e.type == EMBPS_SNAPSTREAM_LOG
                         ? " (a backup's log: write the stream to a data "
                           "dir)"
                         : "");
      rc = -1;
    } else if (e.type == EMBPS_SNAPSTREAM_TABLE) {
      if (c->n_tables == cap) {
        size_t ncap = cap ? 2 * cap : 8;
        embps_ckpt_table_t *t = realloc(c->tables, ncap * sizeof *t);
        came_t *k = t ? realloc(came, ncap * sizeof *k) : NULL;
        if (t)
          c->tables = t;
        if (k)
          came = k;
        if (!t || !k) {
          snprintf(err, err_len, "snapshot stream: out of memory");
          rc = -1;
        }
        cap = t && k ? ncap : cap;
      }
      if (!rc) {
        came_t *k = &came[c->n_tables];
        memset(k, 0, sizeof *k);
        rc = stream_table(s, &e, c, k, shards, cluster_size, err, err_len);
        if (c->n_tables && k == &came[c->n_tables - 1]) {
          k->packed = e.info; /* kept for the MANIFEST's check */
          k->packed_len = e.info_len;
          e.info = NULL;
        }
      }
    } else {
      char path[128];
      snprintf(path, sizeof path, "snapshot stream %s", name);
      uint8_t *p;
      size_t len;
      rc = read_whole(s, path, &p, &len, err, err_len);
      if (!rc) {
        rc = check_manifest(c, came, p, len, &h, path, err, err_len);
        free(p);
      }
      manifest = 1;
    }
    free(e.info);
    if (rc)
      break;
  }
  for (size_t i = 0; i < c->n_tables; i++)
    free(came[i].packed);
  free(came);
  if (!rc && s->end.lsn != h.lsn) {
    snprintf(err, err_len, "snapshot stream: ends at LSN %" PRIu64 " without "
             "log entries from %" PRIu64, s->end.lsn, h.lsn);
    rc = -1;
  }
  if (rc)
    embps_ckpt_free(c);
  return rc ? -1 : 0;
}

void embps_ckpt_free(embps_ckpt_t *c) {
  for (size_t i = 0; i < c->n_tables; i++) {
    embps_table_unref(c->tables[i].table);
    free(c->tables[i].shard_lsn);
  }
  free(c->tables);
  free(c->seen);
  memset(c, 0, sizeof *c);
}

void embps_ckpt_delete_older(const char *dir, uint64_t lsn) {
  DIR *d = opendir(dir);
  if (!d)
    return;
  struct dirent *e;
  int any = 0;
  while ((e = readdir(d))) {
    const char *n = e->d_name;
    char *end;
    if (strncmp(n, "ckpt-", 5) || strlen(n) != 21)
      continue;
    unsigned long long v = strtoull(n + 5, &end, 16);
    if (*end || v >= lsn)
      continue;
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, n);
    rm_dir(p);
    any = 1;
  }
  closedir(d);
  if (any)
    embps_fsync_dir(dir);
}
