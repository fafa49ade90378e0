/* ckpt.c - checkpoint directories (ckpt.h): their file formats, written
 * and read back.
 *
 * embps_ckpt_write writes ckpt-S.tmp/: a table file per table (below),
 * each shard copied out of the table under its read lock
 * (embps_table_snapshot_shard_state, table_io.c) by a thread of its own
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

/* A checkpoint file being written (dio.h) and the CRC-32C chained over its
 * headers, which the MANIFEST holds. */
typedef struct {
  embps_dio_writer_t w;
  uint32_t chain;
} out_t;

/* Writes head (chained into o's CRC) then body (n bytes; its CRC is in
 * head). 0, or -1 with err. */
static int out_write(out_t *o, const void *head, size_t head_len,
                     const void *body, size_t body_len, char *err,
                     size_t err_len) {
  o->chain = embps_crc32c(o->chain, head, head_len);
  if (embps_dio_write(&o->w, head, head_len, err, err_len))
    return -1;
  return body_len ? embps_dio_write(&o->w, body, body_len, err, err_len) : 0;
}


/* One shard's snapshot. write_table takes shard k + 1's on a thread of its
 * own while it writes shard k, so the copy out of the table and the write
 * (CRC-32C, the copy into the page cache) each use a core; at most two
 * shards' copies exist at a time. */
typedef struct {
  embps_table_t *t;
  uint32_t k;
  int with_state, rc;
  unsigned char *recs, *state; /* recs reused shard after shard */
  size_t cap, rows, state_bytes;
  uint64_t lsn, copy_ns; /* how long the shard was held for the copy */
} snap_job_t;

static void *snap_run(void *arg) {
  snap_job_t *j = arg;
  free(j->state);
  j->state = NULL;
  j->state_bytes = 0;
  j->rc = embps_table_snapshot_shard_state(
      j->t, j->k, &j->recs, &j->cap, &j->rows, &j->lsn,
      j->with_state ? &j->state : NULL, &j->state_bytes, &j->copy_ns);
  return NULL;
}

/* Records a block holds: as many as fit BLOCK_BYTES, at least one. */
static size_t block_records(size_t record_bytes) {
  const size_t n = BLOCK_BYTES / record_bytes;
  return n ? n : 1;
}

static int write_shard(out_t *f, const snap_job_t *j, char *err,
                       size_t err_len) {
  if (j->rc) {
    snprintf(err, err_len, "checkpoint %s: out of memory copying shard %u",
             f->w.path, j->k);
    return -1;
  }
  uint8_t h[SEC_HDR] = {0};
  embps_put32(h, SHRD);
  embps_put32(h + 4, j->k);
  embps_put64(h + 8, j->lsn);
  embps_put64(h + 16, j->rows);
  embps_put32(h + 28, embps_crc32c(0, h, 28));
  int rc = out_write(f, h, sizeof h, NULL, 0, err, err_len);
  if (!rc && j->state) {
    uint8_t d[DYN_HDR] = {0};
    embps_put32(d, DYNS);
    embps_put64(d + 8, j->state_bytes);
    embps_put32(d + 16, embps_crc32c(0, j->state, j->state_bytes));
    embps_put32(d + 20, embps_crc32c(0, d, 20));
    rc = out_write(f, d, sizeof d, j->state, j->state_bytes, err, err_len);
  }
  const size_t fr = embps_table_file_record_bytes(j->t);
  const size_t per = block_records(fr);
  for (size_t i = 0; !rc && i < j->rows; i += per) {
    size_t n = j->rows - i < per ? j->rows - i : per;
    uint8_t b[BLK_HDR];
    embps_put32(b, BLCK);
    embps_put32(b + 4, (uint32_t)n);
    embps_put32(b + 8, embps_crc32c(0, j->recs + i * fr, n * fr));
    embps_put32(b + 12, embps_crc32c(0, b, 12));
    rc = out_write(f, b, sizeof b, j->recs + i * fr, n * fr, err, err_len);
  }
  return rc;
}

/* Whether a table's file carries shard state: a policy of issue 12. */
static int table_has_state(const embps_table_spec_t *spec) {
  return spec->dynamic &&
         (spec->admit_after > 1 || spec->admit_probability != 0 ||
          spec->ttl_steps || spec->max_rows || spec->evict_l2_below > 0);
}

/* Writes one table's file; raises *max_lsn to the highest shard LSN
 * copied and res->longest_copy_ns to the longest shard copy. */
static int write_table(const char *tmp, const embps_ckpt_table_t *ct,
                       int first, uint64_t *size, uint32_t *crc,
                       uint64_t *max_lsn, embps_ckpt_result_t *res, char *err,
                       size_t err_len) {
  char path[1200];
  snprintf(path, sizeof path, "%s/table-%016" PRIx64 ".dat", tmp,
           ct->incarnation);
  embps_table_t *t = ct->table;
  const embps_table_spec_t *spec = embps_table_spec(t);
  embps_table_info_t info;
  embps_table_info(t, &info);
  const uint64_t guess = info.rows_allocated * embps_table_file_record_bytes(t);
  out_t f = {.chain = 0};
  if (embps_dio_writer_open(&f.w, "checkpoint", path, guess >= direct_min,
                            err, err_len))
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
  snap_job_t jobs[2] = {{.t = t, .with_state = with_state},
                        {.t = t, .with_state = with_state}};
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
    free(jobs[i].recs);
    free(jobs[i].state);
  }
  uint8_t e[16] = {0};
  embps_put32(e, TEND);
  embps_put32(e + 4, shards);
  embps_put32(e + 12, embps_crc32c(0, e, 12));
  if (!rc)
    rc = out_write(&f, e, sizeof e, NULL, 0, err, err_len);
  rc = embps_dio_writer_close(&f.w, rc, err, err_len);
  *size = f.w.off;
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

static int write_manifest(const char *tmp, const embps_ckpt_t *c,
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
    embps_msg_t m;
    memset(&m, 0, sizeof m);
    m.kind = EMBPS_KIND_CREATE;
    m.u.spec = c->tables[i].spec;
    size_t len = embps_msg_size(&m);
    buf_64(&b, c->tables[i].incarnation);
    buf_64(&b, c->tables[i].step);
    buf_64(&b, sizes[i]);
    buf_32(&b, crcs[i]);
    buf_32(&b, (uint32_t)len);
    buf_add(&b, NULL, (len + 7) & ~(size_t)7);
    if (!b.oom)
      embps_msg_pack(&m, b.p + b.n - ((len + 7) & ~(size_t)7));
  }
  if (!b.oom)
    buf_32(&b, embps_crc32c(0, b.p, b.n));
  buf_32(&b, MEND);
  char path[1200];
  snprintf(path, sizeof path, "%s/MANIFEST", tmp);
  int rc = -1;
  if (b.oom) {
    snprintf(err, err_len, "checkpoint %s: out of memory", path);
  } else {
    embps_dio_writer_t f;
    if (!embps_dio_writer_open(&f, "checkpoint", path, 0, err, err_len))
      rc = embps_dio_writer_close(
          &f, embps_dio_write(&f, b.p, b.n, err, err_len), err, err_len);
  }
  free(b.p);
  return rc;
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
  uint64_t *sizes = calloc(c->n_tables + 1, sizeof *sizes);
  uint32_t *crcs = calloc(c->n_tables + 1, sizeof *crcs);
  int rc = sizes && crcs ? 0 : -1;
  if (rc)
    snprintf(err, err_len, "checkpoint %s: out of memory", tmp);
  uint64_t max_lsn = 0;
  for (size_t i = 0; !rc && i < c->n_tables; i++) {
    rc = write_table(tmp, &c->tables[i], i == 0, &sizes[i], &crcs[i],
                     &max_lsn, res, err, err_len);
    res->bytes += sizes[i];
  }
  /* The shards were copied one after another while pushes went on: a
   * later shard may hold a push an earlier one lacks. Replay completes the
   * earlier one from the log, so the log must be durable that far before
   * the checkpoint can replace it. */
  if (!rc && c->log_sync && max_lsn > c->lsn)
    rc = c->log_sync(c->log_ctx, max_lsn, err, err_len);
  if (!rc)
    rc = write_manifest(tmp, c, sizes, crcs, err, err_len);
  free(sizes);
  free(crcs);
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

/* ------------------------------------------------------------ reading */

/* A checkpoint file being read (dio.h) and the CRC-32C chained over the
 * headers read so far, checked against the MANIFEST's at the end. */
typedef struct {
  embps_dio_reader_t r;
  uint32_t chain;
} in_t;

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
           "mismatch or bad field", f->r.path, what, off);
  return -1;
}

/* Reads the state block of shard section k (version >= 2) into *state
 * and restores the shard's counters and admission sketch from it. 0, or
 * -1 with err. */
static int read_state(in_t *f, embps_table_t *t, uint32_t version,
                      uint32_t k, uint32_t file_shards, unsigned char **state,
                      size_t *bytes, char *err, size_t err_len) {
  uint8_t d[DYN_HDR];
  const uint64_t at = f->r.off;
  if (embps_dio_read(&f->r, d, sizeof d, "shard state header", err, err_len))
    return -1;
  const uint64_t n = embps_get64(d + 8);
  if (embps_get32(d) != DYNS || embps_get32(d + 20) != embps_crc32c(0, d, 20) ||
      n > f->r.size - f->r.off - sizeof d) {
    return bad(f, at, "shard state header", err, err_len);
  }
  f->chain = embps_crc32c(f->chain, d, sizeof d);
  f->r.off += sizeof d;
  if (!(*state = malloc(n ? n : 1))) {
    snprintf(err, err_len, "checkpoint %s: out of memory", f->r.path);
    return -1;
  }
  *bytes = n;
  if (embps_dio_read(&f->r, *state, n, "shard state", err, err_len))
    return -1;
  if (embps_crc32c(0, *state, n) != embps_get32(d + 16) ||
      embps_table_restore_state(t, version, k, file_shards, *state, n))
    return bad(f, f->r.off, "shard state", err, err_len);
  f->r.off += n;
  return 0;
}

static int load_table(const char *cdir, embps_ckpt_table_t *ct,
                      uint64_t want_size, uint32_t want_crc, char *err,
                      size_t err_len) {
  char path[1200];
  snprintf(path, sizeof path, "%s/table-%016" PRIx64 ".dat", cdir,
           ct->incarnation);
  in_t f = {.chain = 0};
  if (embps_dio_reader_open(&f.r, "checkpoint", path, direct_min, err,
                            err_len))
    return -1;
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
  if (f.r.size != want_size) {
    snprintf(err, err_len, "checkpoint %s: %" PRIu64 " bytes at offset 0, "
             "the MANIFEST says %" PRIu64, path, f.r.size, want_size);
    goto out;
  }
  if (embps_dio_read(&f.r, h, sizeof h, "header", err, err_len))
    goto out;
  if (!memcmp(h, TBL_MAGIC, 8) && embps_get32(h + 60) == embps_crc32c(0, h, 60) &&
      embps_get32(h + 8) > VERSION) {
    snprintf(err, err_len, "checkpoint %s: header at offset 0: "
             EMBPS_FORMAT_NEWER, path, embps_get32(h + 8), VERSION);
    goto out;
  }
  if (memcmp(h, TBL_MAGIC, 8) || embps_get32(h + 60) != embps_crc32c(0, h, 60) ||
      embps_get32(h + 8) < VERSION_V1 || embps_get32(h + 8) > VERSION ||
      embps_get32(h + 12) != (uint32_t)spec->dtype ||
      embps_get64(h + 16) != ct->incarnation || embps_get32(h + 24) != spec->dim ||
      embps_get32(h + 32) != fr || embps_get32(h + 36) == 0 || embps_get32(h + 36) > 65536) {
    bad(&f, 0, "header", err, err_len);
    goto out;
  }
  f.chain = embps_crc32c(0, h, sizeof h);
  f.r.off = sizeof h;
  const uint32_t version = embps_get32(h + 8);
  const int has_state = version >= VERSION_V2 &&
                        (embps_get32(h + 44) & TBL_HAS_STATE);
  ct->file_shards = embps_get32(h + 36);
  ct->shard_lsn = calloc(ct->file_shards, sizeof *ct->shard_lsn);
  const size_t per = block_records(fr);
  recs = malloc(per * fr);
  ids = malloc(per * sizeof *ids);
  if (!ct->shard_lsn || !recs || !ids) {
    snprintf(err, err_len, "checkpoint %s: out of memory", path);
    goto out;
  }
  for (uint32_t k = 0; k < ct->file_shards; k++) {
    uint8_t sh[SEC_HDR];
    uint64_t at = f.r.off;
    if (embps_dio_read(&f.r, sh, sizeof sh, "shard section", err, err_len))
      goto out;
    if (embps_get32(sh) != SHRD || embps_get32(sh + 28) != embps_crc32c(0, sh, 28) ||
        embps_get32(sh + 4) != k) {
      bad(&f, at, "shard section", err, err_len);
      goto out;
    }
    f.chain = embps_crc32c(f.chain, sh, sizeof sh);
    f.r.off += sizeof sh;
    ct->shard_lsn[k] = embps_get64(sh + 8);
    uint64_t rows = embps_get64(sh + 16), first = 0;
    free(state);
    state = NULL;
    state_bytes = 0;
    if (has_state && read_state(&f, t, version, k, ct->file_shards, &state,
                                &state_bytes, err, err_len))
      goto out;
    while (rows) {
      uint8_t b[BLK_HDR];
      at = f.r.off;
      if (embps_dio_read(&f.r, b, sizeof b, "block header", err, err_len))
        goto out;
      uint32_t n = embps_get32(b + 4);
      if (embps_get32(b) != BLCK || embps_get32(b + 12) != embps_crc32c(0, b, 12) ||
          n == 0 || n > per || n > rows) {
        bad(&f, at, "block header", err, err_len);
        goto out;
      }
      f.chain = embps_crc32c(f.chain, b, sizeof b);
      f.r.off += sizeof b;
      const uint8_t *blk = embps_dio_view(&f.r, n * fr, recs, "block", err, err_len);
      if (!blk)
        goto out;
      if (embps_crc32c(0, blk, n * fr) != embps_get32(b + 8)) {
        bad(&f, f.r.off, "block", err, err_len);
        goto out;
      }
      int r = embps_table_restore(t, &s, blk, n, ids);
      if (!r && state)
        r = embps_table_restore_meta(t, version, state, state_bytes, ids,
                                     first, n);
      first += n;
      if (r) {
        snprintf(err, err_len, "checkpoint %s: block at offset %" PRIu64
                 ": cannot restore its rows: %s", path, f.r.off,
                 embps_strerror(r));
        goto out;
      }
      f.r.off += (uint64_t)n * fr;
      rows -= n;
    }
  }
  uint8_t e[16];
  uint64_t at = f.r.off;
  if (embps_dio_read(&f.r, e, sizeof e, "trailer", err, err_len))
    goto out;
  if (embps_get32(e) != TEND || embps_get32(e + 12) != embps_crc32c(0, e, 12) ||
      embps_get32(e + 4) != ct->file_shards || at + sizeof e != f.r.size) {
    bad(&f, at, "trailer", err, err_len);
    goto out;
  }
  f.chain = embps_crc32c(f.chain, e, sizeof e);
  if (f.chain != want_crc) {
    snprintf(err, err_len, "checkpoint %s: file checksum at offset 0 does not "
             "match the MANIFEST", path);
    goto out;
  }
  rc = 0;
out:
  embps_table_scratch_close(&s);
  free(state);
  free(recs);
  free(ids);
  embps_dio_reader_close(&f.r);
  return rc;
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
  const uint8_t *p = (const uint8_t *)data;
  int rc = -1;
  if (len < MAN_HDR + 8 || len > MANIFEST_MAX ||
      embps_get32(p + len - 4) != MEND ||
      embps_get32(p + len - 8) != embps_crc32c(0, p, len - 8)) {
    snprintf(err, err_len, "checkpoint %s: trailer at offset %zu: checksum "
             "mismatch or short file", path, len >= 8 ? len - 8 : 0);
    goto out;
  }
  if (!memcmp(p, MAN_MAGIC, 8) && embps_get32(p + 8) > VERSION) {
    snprintf(err, err_len, "checkpoint %s: header at offset 0: "
             EMBPS_FORMAT_NEWER, path, embps_get32(p + 8), VERSION);
    goto out;
  }
  if (memcmp(p, MAN_MAGIC, 8) ||
      embps_get32(p + 8) < VERSION_V1 || embps_get32(p + 8) > VERSION ||
      embps_get64(p + 16) != lsn) {
    snprintf(err, err_len, "checkpoint %s: header at offset 0: bad magic, "
             "version or LSN", path);
    goto out;
  }
  c->lsn = lsn;
  c->cluster_size = embps_get32(p + 24);
  c->cluster_index = embps_get32(p + 28);
  c->shards = embps_get32(p + 32);
  uint32_t n_tables = embps_get32(p + 36);
  uint64_t n_seen = embps_get64(p + 40);
  size_t off = MAN_HDR, end = len - 8;
  if (n_seen > (end - off) / 16) {
    snprintf(err, err_len, "checkpoint %s: header at offset 0: %" PRIu64
             " clients do not fit", path, n_seen);
    goto out;
  }
  c->seen = malloc((n_seen ? n_seen : 1) * sizeof *c->seen);
  c->tables = calloc(n_tables ? n_tables : 1, sizeof *c->tables);
  if (!c->seen || !c->tables) {
    snprintf(err, err_len, "checkpoint %s: out of memory", path);
    goto out;
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
      goto out;
    }
    embps_ckpt_table_t *ct = &c->tables[i];
    ct->incarnation = embps_get64(p + off);
    ct->step = embps_get64(p + off + 8);
    uint64_t fsize = embps_get64(p + off + 16);
    uint32_t fcrc = embps_get32(p + off + 24), slen = embps_get32(p + off + 28);
    off += 32;
    size_t padded = ((size_t)slen + 7) & ~(size_t)7;
    embps_msg_t m;
    char why[256];
    if (end - off < padded ||
        embps_msg_unpack(EMBPS_KIND_CREATE, p + off, slen, &m) ||
        embps_table_spec_check(&m.u.spec, why, sizeof why)) {
      snprintf(err, err_len, "checkpoint %s: table at offset %zu: spec does "
               "not decode", path, at);
      goto out;
    }
    off += padded;
    ct->spec = m.u.spec;
    if (embps_table_create(&m.u.spec, shards, cluster_size, &ct->table)) {
      snprintf(err, err_len, "checkpoint %s: table \"%s\": out of memory",
               path, m.u.spec.name);
      goto out;
    }
    c->n_tables = i + 1;
    embps_table_set_incarnation(ct->table, ct->incarnation);
    embps_table_set_step(ct->table, ct->step);
    if (load_table(cdir, ct, fsize, fcrc, err, err_len))
      goto out;
  }
  if (off != end) {
    snprintf(err, err_len, "checkpoint %s: %zu stray bytes at offset %zu",
             path, end - off, off);
    goto out;
  }
  rc = 0;
out:
  free(data);
  if (rc)
    embps_ckpt_free(c);
  return rc;
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
