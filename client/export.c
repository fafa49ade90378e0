/* export.c - embps_export_table / embps_import_table: a table's rows to and
 * from a directory of numpy .npy files (npy.h) and a spec.json, streamed
 * chunk by chunk over embps_scan and embps_write_rows (client.c); the dense
 * form of an export is export_dense.c's.
 *
 * Both open their directory once and name every file relative to it, so
 * any path open() takes works (a longer one is refused before anything is
 * written) and the directory cannot be swapped under them. Export writes
 * every file under "<name>.tmp" (created new, never through a link),
 * renames each to its name once all are complete (spec.json last) and
 * fsyncs the directory, so a directory never holds a half-written file
 * under a final name, and no temporary file stays after a failure. Import
 * reads regular files only (never through a link, never a FIFO that would
 * block) and reads every file through once to check it before writing any
 * row. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include "embps/embps.h"
#include "export.h"
#include "internal.h"
#include "npy.h"

#define CHUNK_BYTES (1u << 20) /* target bytes of rows per request */
#define FRAME_META_ROOM 512u /* frame bytes kept for header and meta */
#define MAX_SLOTS 2 /* EMBPS_EXPORT_MAX_FILES holds them */
#define SPEC_JSON_MAX (64u << 10)
#define EXPORT_FORMAT 1

#define fail embps_export_fail_

/* Errors are reported like the rest of the library: through the client's
 * last error, set by a call that fails with that message. */
int embps_export_fail_(embps_client_t *c, int code, const char *fmt, ...) {
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return embps_client_set_error_(c, code, msg);
}

size_t embps_export_chunk_rows_(embps_client_t *c, size_t row_bytes,
                                size_t target_bytes) {
  uint64_t frame = embps_client_max_frame_(c);
  if (frame && frame - FRAME_META_ROOM < target_bytes)
    target_bytes = (size_t)(frame - FRAME_META_ROOM);
  size_t n = target_bytes / (row_bytes ? row_bytes : 1);
  return n ? n : 1;
}

/* Rows of a scan or write chunk for a table of dim with `slots` state
 * slots: an id, the weights and the state of each. */
static uint32_t chunk_rows(embps_client_t *c, uint32_t dim, uint32_t slots) {
  size_t n = embps_export_chunk_rows_(c, 8 + 4 * (size_t)dim * (1 + slots),
                                      CHUNK_BYTES);
  return n < UINT32_MAX ? (uint32_t)n : UINT32_MAX;
}

/* ------------------------------------------------------------ spec.json */

static const char *init_name(embps_init_t init) {
  static const char *const names[] = {"zeros", "constant", "uniform",
                                      "normal"};
  return (unsigned)init < 4 ? names[init] : "zeros";
}

/* Writes the spec (and what the export holds) as one JSON object. */
static int write_spec(FILE *f, const embps_table_spec_t *s, uint64_t step,
                      uint64_t rows, int with_state, int dense) {
  fprintf(f, "{\n  \"format\": \"embps-export\",\n  \"version\": %d,\n",
          EXPORT_FORMAT);
  fprintf(f, "  \"name\": \"%s\",\n  \"dim\": %u,\n", s->name, s->dim);
  fprintf(f, "  \"rows\": %" PRIu64 ",\n  \"dynamic\": %s,\n", s->rows,
          s->dynamic ? "true" : "false");
  fprintf(f, "  \"optimizer\": \"%s\",\n", embps_optimizer_name(s->optimizer));
  fprintf(f, "  \"lr\": %.17g,\n  \"eps\": %.17g,\n  \"beta1\": %.17g,\n"
             "  \"beta2\": %.17g,\n  \"initial_accumulator\": %.17g,\n"
             "  \"l1\": %.17g,\n  \"l2\": %.17g,\n  \"lr_power\": %.17g,\n"
             "  \"weight_decay\": %.17g,\n",
          s->lr, s->eps, s->beta1, s->beta2, s->initial_accumulator, s->l1,
          s->l2, s->lr_power, s->weight_decay);
  fprintf(f, "  \"init\": \"%s\",\n  \"init_value\": %.17g,\n",
          init_name(s->init), s->init_value);
  fprintf(f, "  \"seed\": %" PRIu64 ",\n  \"has_padding\": %s,\n", s->seed,
          s->has_padding ? "true" : "false");
  fprintf(f, "  \"padding_id\": %" PRId64 ",\n  \"dtype\": \"%s\",\n",
          s->padding_id, embps_dtype_name(s->dtype));
  fprintf(f, "  \"sync_workers\": %u,\n", s->sync_workers);
  fprintf(f, "  \"step\": %" PRIu64 ",\n  \"n\": %" PRIu64 ",\n", step, rows);
  fprintf(f, "  \"state\": %s,\n  \"dense\": %s\n}\n",
          with_state ? "true" : "false", dense ? "true" : "false");
  return ferror(f) ? -EIO : 0;
}

/* The raw value text of "key" in a flat JSON object, or NULL. */
static const char *json_value(const char *text, const char *key) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\"", key);
  for (const char *p = strstr(text, pat); p; p = strstr(p + 1, pat)) {
    const char *v = p + strlen(pat);
    while (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r')
      v++;
    if (*v != ':')
      continue;
    v++;
    while (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r')
      v++;
    return v;
  }
  return NULL;
}

static int json_string(const char *text, const char *key, char *out,
                       size_t len) {
  const char *v = json_value(text, key);
  if (!v || *v != '"')
    return -1;
  size_t n = 0;
  for (v++; *v && *v != '"'; v++)
    if (n + 1 < len)
      out[n++] = *v;
  out[n] = 0;
  return *v == '"' ? 0 : -1;
}

static int json_number(const char *text, const char *key, double *out) {
  const char *v = json_value(text, key);
  char *end;
  if (!v)
    return -1;
  errno = 0;
  *out = strtod(v, &end);
  return end == v || errno ? -1 : 0;
}

static int json_u64(const char *text, const char *key, uint64_t *out) {
  const char *v = json_value(text, key);
  char *end;
  if (!v || *v == '-')
    return -1;
  errno = 0;
  *out = strtoull(v, &end, 10);
  return end == v || errno ? -1 : 0;
}

static int json_bool(const char *text, const char *key, int *out) {
  const char *v = json_value(text, key);
  if (v && !strncmp(v, "true", 4))
    *out = 1;
  else if (v && !strncmp(v, "false", 5))
    *out = 0;
  else
    return -1;
  return 0;
}

/* Reads spec.json of directory dirfd (shown as path) into *text
 * (malloc'd). 0, 1 if it does not exist, or an error code with the
 * client's error set. */
static int read_spec_text(embps_client_t *c, int dirfd, const char *path,
                          char **text) {
  char err[EMBPS_NPY_PATH_MAX + 256];
  int fd = embps_file_open_read(dirfd, "spec.json", path, err, sizeof err);
  if (fd == -ENOENT)
    return 1;
  if (fd < 0)
    return fail(c, EMBPS_EBADFILE, "%s", err);
  FILE *f = fdopen(fd, "rb");
  char *buf = f ? malloc(SPEC_JSON_MAX + 1) : NULL;
  size_t n = buf ? fread(buf, 1, SPEC_JSON_MAX + 1, f) : 0;
  int e = f && ferror(f) ? errno : 0;
  if (f)
    fclose(f);
  else
    close(fd);
  if (!buf)
    return fail(c, -ENOMEM, "out of memory");
  if (e || n > SPEC_JSON_MAX) {
    free(buf);
    return e ? fail(c, -e, "%s: %s", path, strerror(e))
             : fail(c, EMBPS_EBADFILE, "%s: larger than %u bytes", path,
                    SPEC_JSON_MAX);
  }
  buf[n] = 0;
  *text = buf;
  return 0;
}

/* The spec of spec.json (named `name`), checked. */
static int parse_spec(embps_client_t *c, const char *path, const char *text,
                      const char *name, embps_table_spec_t *s) {
  char opt[32], dtype[32], init[32];
  double dim;
  embps_optimizer_t o;
  if (json_number(text, "dim", &dim) ||
      json_string(text, "optimizer", opt, sizeof opt) ||
      embps_optimizer_parse(opt, &o))
    return fail(c, EMBPS_EBADFILE, "%s: no valid \"dim\" and \"optimizer\"",
                path);
  if (!(dim >= 1 && dim <= EMBPS_DIM_MAX && dim == (double)(uint32_t)dim))
    return fail(c, EMBPS_EBADFILE, "%s: \"dim\" %g is not a whole number in "
                "[1, %u]", path, dim, EMBPS_DIM_MAX);
  embps_table_spec_init(s, name, (uint32_t)dim, o);
  int ok = 1, b;
  double d;
  uint64_t u;
#define NUM_(key)                                                              \
  if (json_value(text, #key))                                                  \
    ok &= json_number(text, #key, &s->key) == 0;
  NUM_(lr) NUM_(eps) NUM_(beta1) NUM_(beta2) NUM_(initial_accumulator)
  NUM_(l1) NUM_(l2) NUM_(lr_power) NUM_(weight_decay) NUM_(init_value)
#undef NUM_
  if (json_value(text, "rows"))
    ok &= json_u64(text, "rows", &s->rows) == 0;
  if (json_value(text, "seed"))
    ok &= json_u64(text, "seed", &s->seed) == 0;
  if (json_value(text, "sync_workers") && (ok &= json_u64(
      text, "sync_workers", &u) == 0 && u <= UINT32_MAX))
    s->sync_workers = (uint32_t)u;
  if (json_value(text, "dynamic") && (ok &= json_bool(text, "dynamic",
                                                      &b) == 0))
    s->dynamic = b;
  if (json_value(text, "has_padding") &&
      (ok &= json_bool(text, "has_padding", &b) == 0))
    s->has_padding = b;
  if (json_value(text, "padding_id") &&
      (ok &= json_number(text, "padding_id", &d) == 0))
    s->padding_id = (int64_t)strtoll(json_value(text, "padding_id"), NULL, 10);
  if (json_value(text, "dtype"))
    ok &= json_string(text, "dtype", dtype, sizeof dtype) == 0 &&
          embps_dtype_parse(dtype, &s->dtype) == 0;
  if (json_value(text, "init")) {
    ok &= json_string(text, "init", init, sizeof init) == 0;
    int found = 0;
    for (int i = 0; ok && i < 4; i++)
      if (!strcmp(init, init_name((embps_init_t)i))) {
        s->init = (embps_init_t)i;
        found = 1;
      }
    ok &= found;
  }
  char why[256];
  if (!ok)
    return fail(c, EMBPS_EBADFILE, "%s: a field does not parse", path);
  if (embps_table_spec_check(s, why, sizeof why))
    return fail(c, EMBPS_EBADFILE, "%s: %s", path, why);
  return 0;
}

/* ------------------------------------------------------------ export */

typedef embps_export_files_t files_t;

int embps_export_open_dir_(embps_client_t *c, const char *dir, int export,
                           int *dirfd) {
  const size_t len = strlen(dir);
  int fd = -1;
  errno = 0;
  if (!export || !mkdir(dir, 0777) || errno == EEXIST)
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    *dirfd = fd;
    return 0;
  }
  int e = errno;
  if (e == ENAMETOOLONG)
    return fail(c, -e, "%.64s... (%zu bytes): path too long (the system "
                "takes at most %d bytes, and %d in one name)", dir, len,
                PATH_MAX - 1, NAME_MAX);
  char shown[EMBPS_NPY_PATH_MAX];
  embps_file_show(shown, sizeof shown, dir, NULL);
  return fail(c, -e, "%s %s: %s", export && e != ENOTDIR ? "mkdir" : "open",
              shown, strerror(e));
}

void embps_export_add_(files_t *fs, const char *name,
                       char tmp[EMBPS_EXPORT_NAME_MAX]) {
  snprintf(fs->names[fs->n_files++], sizeof fs->names[0], "%s", name);
  snprintf(tmp, EMBPS_EXPORT_NAME_MAX, "%s.tmp", name);
}

int embps_export_spec_(embps_client_t *c, files_t *fs,
                       const embps_table_spec_t *s, uint64_t step,
                       uint64_t rows, int with_state, int dense) {
  char tmp[EMBPS_EXPORT_NAME_MAX];
  embps_export_add_(fs, "spec.json", tmp);
  errno = 0;
  FILE *f = embps_file_create_excl(fs->dirfd, tmp);
  int rc = f ? write_spec(f, s, step, rows, with_state, dense)
             : -(errno ? errno : EIO);
  if (f && (fflush(f) || fsync(fileno(f))) && !rc)
    rc = -errno;
  if (f && fclose(f) && !rc)
    rc = -errno;
  return rc ? fail(c, rc, "%s/%s: %s", fs->dir, tmp, strerror(-rc)) : 0;
}

void embps_export_unlink_tmp_(const files_t *fs) {
  char tmp[EMBPS_EXPORT_NAME_MAX];
  for (uint32_t i = 0; i < fs->n_files; i++) {
    snprintf(tmp, sizeof tmp, "%s.tmp", fs->names[i]);
    unlinkat(fs->dirfd, tmp, 0);
  }
}

int embps_export_commit_(embps_client_t *c, const files_t *fs) {
  char tmp[EMBPS_EXPORT_NAME_MAX];
  for (uint32_t i = 0; i < fs->n_files; i++) {
    snprintf(tmp, sizeof tmp, "%s.tmp", fs->names[i]);
    /* replaces whatever is at the name, a link itself, never its target */
    if (renameat(fs->dirfd, tmp, fs->dirfd, fs->names[i]))
      return fail(c, -errno, "rename %s/%s: %s", fs->dir, tmp,
                  strerror(errno));
  }
  if (fsync(fs->dirfd))
    return fail(c, -errno, "fsync %s: %s", fs->dir, strerror(errno));
  return 0;
}

typedef struct {
  embps_npy_writer_t ids, w, slot[MAX_SLOTS];
  uint32_t slots, dim;
  float *col; /* one slot of a chunk: n x dim */
  size_t col_rows;
} writers_t;

/* Appends a chunk to every file. 0 or -errno with err. */
static int append_chunk(writers_t *ws, const embps_scan_chunk_t *ch,
                        char *err, size_t err_len) {
  int rc = embps_npy_append(&ws->ids, ch->ids, ch->n, err, err_len);
  if (!rc)
    rc = embps_npy_append(&ws->w, ch->weights, ch->n, err, err_len);
  if (rc || !ws->slots)
    return rc;
  if (ch->n > ws->col_rows) {
    free(ws->col);
    ws->col = malloc(ch->n * ws->dim * sizeof *ws->col);
    ws->col_rows = ws->col ? ch->n : 0;
    if (!ws->col) {
      snprintf(err, err_len, "out of memory");
      return -ENOMEM;
    }
  }
  for (uint32_t j = 0; j < ws->slots && !rc; j++) {
    for (size_t i = 0; i < ch->n; i++)
      memcpy(ws->col + i * ws->dim,
             ch->state + (i * ws->slots + j) * ws->dim,
             ws->dim * sizeof *ws->col);
    rc = embps_npy_append(&ws->slot[j], ws->col, ch->n, err, err_len);
  }
  return rc;
}

/* The most rows a scan of table s (info: its counters at some moment)
 * may bring from all servers together: a dense table's rows; for a
 * dynamic one, twice every row it ever made (rows held and rows evicted:
 * rows made during the export count once they are described), plus a
 * chunk. What a server sends beyond that is not the table's. */
static uint64_t scan_row_limit(const embps_table_info_t *info, uint32_t max) {
  const embps_table_spec_t *s = &info->spec;
  if (!s->dynamic)
    return s->rows;
  return 2 * (info->rows_allocated + info->evicted_ttl +
              info->evicted_capacity + info->evicted_l2) +
         max;
}

/* Checks a chunk of server srv of table `table` (spec s) against what the
 * table can hold: every chunk but the last moves the cursor on, its ids
 * are the server's (and a dense table's in range), the rows so far (*got,
 * counted) are within the limit (described again once before giving up:
 * a dynamic table grows). 0, or EMBPS_EPROTO (or the describe's error)
 * with c's error set. */
static int check_chunk_sane(embps_client_t *c, const char *table,
                            const embps_table_spec_t *s, uint32_t srv,
                            uint64_t cursor, const embps_scan_chunk_t *ch,
                            uint32_t max, uint64_t *limit, uint64_t *got) {
  const char *addr = embps_client_server_address(c, srv);
  const uint32_t n_srv = (uint32_t)embps_client_n_servers(c);
  if (!ch->done && ch->next_cursor <= cursor)
    return fail(c, EMBPS_EPROTO, "server %u (%s): a scan of table \"%s\" "
                "that is not done did not move its cursor on (%" PRIu64
                " after %" PRIu64 "): the export stops", srv, addr, table,
                ch->next_cursor, cursor);
  for (size_t i = 0; i < ch->n; i++)
    if (embps_route(ch->ids[i], n_srv) != srv ||
        (!s->dynamic && (uint64_t)ch->ids[i] >= s->rows))
      return fail(c, EMBPS_EPROTO, "server %u (%s): scan of table \"%s\" "
                  "sent id %" PRId64 ", which is not one of its rows", srv,
                  addr, table, ch->ids[i]);
  *got += ch->n;
  if (*got <= *limit)
    return 0;
  embps_table_info_t info;
  int rc = embps_describe_table(c, table, &info);
  if (rc)
    return rc;
  *limit = scan_row_limit(&info, max);
  if (*got <= *limit)
    return 0;
  return fail(c, EMBPS_EPROTO, "server %u (%s): the scan of table \"%s\" "
              "sent %" PRIu64 " rows, more than the table holds (%" PRIu64
              "): the export stops", srv, addr, table, *got, *limit);
}

/* Streams every server's rows into the writers; *step = the table's step
 * (the largest a server reports: pushes go to every server). info: the
 * table, described before. */
static int scan_all(embps_client_t *c, const char *table,
                    const embps_table_info_t *info, unsigned flags,
                    writers_t *ws, uint64_t *step) {
  char err[EMBPS_NPY_PATH_MAX + 256];
  const uint32_t max = chunk_rows(c, ws->dim, ws->slots);
  uint64_t limit = scan_row_limit(info, max), got = 0;
  for (uint32_t s = 0; s < embps_client_n_servers(c); s++) {
    uint64_t cursor = 0;
    for (int done = 0; !done;) {
      embps_scan_chunk_t ch;
      int rc = embps_scan(c, s, table, cursor, max,
                          flags & EMBPS_EXPORT_STATE ? EMBPS_SCAN_STATE : 0,
                          &ch);
      if (rc)
        return rc;
      if (ch.dim != ws->dim || ch.state_slots != ws->slots) {
        embps_scan_chunk_free(&ch);
        return fail(c, EMBPS_EPROTO, "server %u: table \"%s\" changed shape "
                    "during the export", s, table);
      }
      rc = check_chunk_sane(c, table, &info->spec, s, cursor, &ch, max,
                            &limit, &got);
      if (!rc && (rc = append_chunk(ws, &ch, err, sizeof err)))
        rc = fail(c, rc, "%s", err);
      if (ch.step > *step)
        *step = ch.step;
      cursor = ch.next_cursor;
      done = ch.done;
      embps_scan_chunk_free(&ch);
      if (rc)
        return rc;
    }
  }
  return 0;
}

/* The sparse form: ids.npy, weights.npy and (with state) a file per slot,
 * scanned from every server, then spec.json, all as temporary files of fs
 * (the caller commits them, or removes them after a failure). */
static int export_rows(embps_client_t *c, const char *table,
                       const embps_table_info_t *info, unsigned flags,
                       files_t *fs, uint64_t *rows_out) {
  const embps_table_spec_t *s = &info->spec;
  const char *const *slot_names;
  uint32_t slots = embps_optimizer_state_slots(s->optimizer, &slot_names);
  if (!(flags & EMBPS_EXPORT_STATE))
    slots = 0;
  writers_t ws;
  memset(&ws, 0, sizeof ws);
  ws.slots = slots;
  ws.dim = s->dim;
  char err[EMBPS_NPY_PATH_MAX + 256], tmp[EMBPS_EXPORT_NAME_MAX], name[48];
  embps_export_add_(fs, "ids.npy", tmp);
  int rc = embps_npy_create(&ws.ids, fs->dirfd, fs->dir, tmp, EMBPS_NPY_I8,
                            0, err, sizeof err);
  if (!rc) {
    embps_export_add_(fs, "weights.npy", tmp);
    rc = embps_npy_create(&ws.w, fs->dirfd, fs->dir, tmp, EMBPS_NPY_F4,
                          s->dim, err, sizeof err);
  }
  for (uint32_t j = 0; j < slots && !rc; j++) {
    snprintf(name, sizeof name, "%s_%s.npy",
             embps_optimizer_name(s->optimizer), slot_names[j]);
    embps_export_add_(fs, name, tmp);
    rc = embps_npy_create(&ws.slot[j], fs->dirfd, fs->dir, tmp, EMBPS_NPY_F4,
                          s->dim, err, sizeof err);
  }
  if (rc)
    rc = fail(c, rc, "%s", err);
  uint64_t step = 0;
  if (!rc)
    rc = scan_all(c, table, info, flags, &ws, &step);
  const uint64_t rows = ws.ids.rows;
  if (!rc) {
    rc = embps_npy_finish(&ws.ids, err, sizeof err);
    if (!rc)
      rc = embps_npy_finish(&ws.w, err, sizeof err);
    for (uint32_t j = 0; j < slots && !rc; j++)
      rc = embps_npy_finish(&ws.slot[j], err, sizeof err);
    if (rc)
      rc = fail(c, rc, "%s", err);
  }
  embps_npy_abandon(&ws.ids);
  embps_npy_abandon(&ws.w);
  for (uint32_t j = 0; j < slots; j++)
    embps_npy_abandon(&ws.slot[j]);
  free(ws.col);
  if (!rc)
    rc = embps_export_spec_(c, fs, s, step, rows, slots > 0, 0);
  if (!rc)
    *rows_out = rows;
  return rc;
}

int embps_export_table(embps_client_t *c, const char *table, const char *dir,
                       unsigned flags, uint64_t *rows_out) {
  embps_table_info_t info;
  int rc = embps_describe_table(c, table, &info);
  if (rc)
    return rc;
  const embps_table_spec_t *s = &info.spec;
  if ((flags & EMBPS_EXPORT_DENSE) && (flags & EMBPS_EXPORT_STATE))
    return fail(c, EMBPS_EINVAL, "a dense export writes the weights only: "
                "export the optimizer state without EMBPS_EXPORT_DENSE "
                "(--dense)");
  if (flags & ~(EMBPS_EXPORT_STATE | EMBPS_EXPORT_DENSE))
    return fail(c, EMBPS_EINVAL, "unknown export flags 0x%x", flags);
  files_t fs;
  memset(&fs, 0, sizeof fs);
  embps_file_show(fs.dir, sizeof fs.dir, dir, NULL);
  if ((rc = embps_export_open_dir_(c, dir, 1, &fs.dirfd)))
    return rc;
  uint64_t rows = 0;
  if ((flags & EMBPS_EXPORT_DENSE) && !s->dynamic)
    rc = embps_export_dense_(c, &info, &fs, &rows);
  else
    rc = export_rows(c, table, &info, flags, &fs, &rows);
  if (!rc)
    rc = embps_export_commit_(c, &fs);
  if (rc)
    embps_export_unlink_tmp_(&fs);
  else if (rows_out)
    *rows_out = rows;
  close(fs.dirfd);
  return rc;
}

/* ------------------------------------------------------------ import */

typedef struct {
  int dirfd;                    /* the directory, open */
  char dir[EMBPS_NPY_PATH_MAX]; /* as messages show it */
  embps_npy_reader_t ids, w, slot[MAX_SLOTS];
  int has_ids;
  uint32_t slots, dim;
  embps_table_spec_t spec;
  uint64_t n;
  /* one chunk */
  int64_t *cid;
  float *cw, *cstate, *col;
  uint32_t *order;
  uint8_t *keep;
  size_t cap;
} readers_t;

/* Frees the chunk buffers. */
static void chunk_free(readers_t *rs) {
  free(rs->cid);
  free(rs->cw);
  free(rs->cstate);
  free(rs->col);
  free(rs->order);
  free(rs->keep);
  rs->cap = 0;
}

static void readers_close(readers_t *rs) {
  embps_npy_close(&rs->ids);
  embps_npy_close(&rs->w);
  for (uint32_t j = 0; j < MAX_SLOTS; j++)
    embps_npy_close(&rs->slot[j]);
  chunk_free(rs);
}

/* Opens a [n, dim] float file `name` and checks its shape. */
static int open_matrix(embps_client_t *c, const readers_t *rs,
                       embps_npy_reader_t *r, const char *name, uint64_t n,
                       uint32_t dim) {
  char err[EMBPS_NPY_PATH_MAX + 256];
  const char *path = r->path;
  if (embps_npy_open(r, rs->dirfd, rs->dir, name, err, sizeof err))
    return fail(c, EMBPS_EBADFILE, "%s", err);
  if (r->type != EMBPS_NPY_F4 && r->type != EMBPS_NPY_F8)
    return fail(c, EMBPS_EBADFILE, "%s: dtype %s, expected <f4 (float32)",
                path, embps_npy_descr(r->type));
  if (r->ndim != 2 || r->cols != dim || (n != UINT64_MAX && r->rows != n))
    return fail(c, EMBPS_EBADFILE, "%s: shape (%" PRIu64 ", %" PRIu64 "), "
                "expected (%s, %u)", path, r->rows, r->cols,
                n == UINT64_MAX ? "n" : "the rows of weights.npy", dim);
  return 0;
}

/* Opens the files of rs's directory for table spec; with state, one per
 * slot. */
static int open_files(embps_client_t *c, unsigned flags, readers_t *rs) {
  char err[EMBPS_NPY_PATH_MAX + 256];
  const char *const *names;
  uint32_t slots = embps_optimizer_state_slots(rs->spec.optimizer, &names);
  rs->dim = rs->spec.dim;
  int rc = open_matrix(c, rs, &rs->w, "weights.npy", UINT64_MAX, rs->dim);
  if (rc)
    return rc;
  rs->n = rs->w.rows;
  const char *p = rs->ids.path;
  rc = embps_npy_open(&rs->ids, rs->dirfd, rs->dir, "ids.npy", err,
                      sizeof err);
  if (rc && rc != -ENOENT)
    return fail(c, EMBPS_EBADFILE, "%s", err);
  if (!rc) {
    if (rs->ids.type != EMBPS_NPY_I8 && rs->ids.type != EMBPS_NPY_I4)
      return fail(c, EMBPS_EBADFILE, "%s: dtype %s, expected <i8 (int64)", p,
                  embps_npy_descr(rs->ids.type));
    if (rs->ids.ndim != 1 || rs->ids.rows != rs->n)
      return fail(c, EMBPS_EBADFILE, "%s: shape (%" PRIu64 "%s), expected "
                  "(%" PRIu64 ",) like weights.npy", p, rs->ids.rows,
                  rs->ids.ndim == 1 ? "," : ", ...", rs->n);
    rs->has_ids = 1;
  } else if (rs->spec.dynamic) {
    return fail(c, EMBPS_EBADFILE, "%s is missing: a dynamic table needs the "
                "ids of its rows", p);
  } else if (rs->n > rs->spec.rows) {
    return fail(c, EMBPS_EBADFILE, "%s has %" PRIu64 " rows but table \"%s\" "
                "only %" PRIu64 " (and no ids.npy says which)",
                rs->w.path, rs->n, rs->spec.name, rs->spec.rows);
  }
  if (!(flags & EMBPS_IMPORT_STATE))
    return 0;
  rs->slots = slots;
  for (uint32_t j = 0; j < slots; j++) {
    char name[64];
    snprintf(name, sizeof name, "%s_%s.npy",
             embps_optimizer_name(rs->spec.optimizer), names[j]);
    rc = open_matrix(c, rs, &rs->slot[j], name, rs->n, rs->dim);
    if (rc)
      return rc;
  }
  return 0;
}

/* Reads the next n rows of every file into the chunk buffers (state
 * interleaved per row, as embps_write_rows takes it); ids 0.. without
 * ids.npy. */
static int read_chunk(embps_client_t *c, readers_t *rs, uint64_t first,
                      size_t n) {
  char err[EMBPS_NPY_PATH_MAX + 256];
  if (n > rs->cap) {
    chunk_free(rs);
    rs->cid = malloc(n * sizeof *rs->cid);
    rs->cw = malloc(n * rs->dim * sizeof *rs->cw);
    rs->cstate = malloc(n * (rs->slots ? rs->slots : 1) * rs->dim *
                        sizeof *rs->cstate);
    rs->col = malloc(n * rs->dim * sizeof *rs->col);
    rs->order = malloc(n * sizeof *rs->order);
    rs->keep = malloc(n);
    rs->cap = rs->cid && rs->cw && rs->cstate && rs->col && rs->order &&
                      rs->keep
                  ? n
                  : 0;
    if (!rs->cap)
      return fail(c, -ENOMEM, "out of memory for a chunk of %zu rows", n);
  }
  int rc = 0;
  if (rs->has_ids)
    rc = embps_npy_read_i64(&rs->ids, rs->cid, n, err, sizeof err);
  else
    for (size_t i = 0; i < n; i++)
      rs->cid[i] = (int64_t)(first + i);
  if (!rc)
    rc = embps_npy_read_f32(&rs->w, rs->cw, n, err, sizeof err);
  for (uint32_t j = 0; j < rs->slots && !rc; j++) {
    rc = embps_npy_read_f32(&rs->slot[j], rs->col, n, err, sizeof err);
    for (size_t i = 0; !rc && i < n; i++)
      memcpy(rs->cstate + (i * rs->slots + j) * rs->dim, rs->col + i * rs->dim,
             rs->dim * sizeof *rs->col);
  }
  return rc ? fail(c, EMBPS_EBADFILE, "%s", err) : 0;
}

/* Checks a chunk read from the files: ids in range, finite values,
 * accumulators non-negative. The error names the file and the row. */
static int check_chunk(embps_client_t *c, const readers_t *rs,
                       uint64_t first, size_t n) {
  const embps_table_spec_t *s = &rs->spec;
  for (size_t i = 0; i < n; i++) {
    if (!s->dynamic && (uint64_t)rs->cid[i] >= s->rows)
      return fail(c, EMBPS_EBADFILE, "%s: row %" PRIu64 ": id %" PRId64
                  " out of range [0, %" PRIu64 ") of table \"%s\"",
                  rs->has_ids ? rs->ids.path : rs->w.path, first + i,
                  rs->cid[i], s->rows, s->name);
    for (uint32_t d = 0; d < rs->dim; d++)
      if (!isfinite(rs->cw[i * rs->dim + d]))
        return fail(c, EMBPS_EBADFILE, "%s: row %" PRIu64 ", column %u: "
                    "not a finite float32 value", rs->w.path, first + i, d);
    const uint32_t nonneg = s->optimizer == EMBPS_OPT_ADAM ? 1 : 0;
    for (uint32_t j = 0; j < rs->slots; j++)
      for (uint32_t d = 0; d < rs->dim; d++) {
        float v = rs->cstate[(i * rs->slots + j) * rs->dim + d];
        if (!isfinite(v) || (j == nonneg && v < 0))
          return fail(c, EMBPS_EBADFILE, "%s: row %" PRIu64 ", column %u: "
                      "%s", rs->slot[j].path, first + i, d,
                      isfinite(v) ? "an accumulator must not be negative"
                                  : "not a finite float32 value");
      }
  }
  return 0;
}

static const int64_t *sort_ids; /* for cmp_pos: the ids being ordered */

static int cmp_pos(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  int64_t ix = sort_ids[x], iy = sort_ids[y];
  if (ix != iy)
    return (ix > iy) - (ix < iy);
  return (x > y) - (x < y);
}

/* Drops every row of the chunk whose id comes again later in it (the
 * later row wins), keeping the order of the rest. Returns the rows left. */
static size_t drop_repeats(readers_t *rs, size_t n) {
  for (size_t i = 0; i < n; i++)
    rs->order[i] = (uint32_t)i;
  sort_ids = rs->cid;
  qsort(rs->order, n, sizeof *rs->order, cmp_pos);
  memset(rs->keep, 1, n);
  int any = 0;
  for (size_t i = 0; i + 1 < n; i++)
    if (rs->cid[rs->order[i]] == rs->cid[rs->order[i + 1]]) {
      rs->keep[rs->order[i]] = 0; /* sorted by (id, position) */
      any = 1;
    }
  if (!any)
    return n;
  const size_t sf = (size_t)rs->slots * rs->dim;
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (!rs->keep[i])
      continue;
    rs->cid[m] = rs->cid[i];
    memmove(rs->cw + m * rs->dim, rs->cw + i * rs->dim,
            rs->dim * sizeof *rs->cw);
    if (sf)
      memmove(rs->cstate + m * sf, rs->cstate + i * sf,
              sf * sizeof *rs->cstate);
    m++;
  }
  return m;
}

/* The table's spec, creating it from spec.json when missing and allowed. */
static int target_spec(embps_client_t *c, const char *table,
                       const char *spec_path, const char *spec_text,
                       unsigned flags, embps_table_spec_t *out) {
  embps_table_info_t info;
  int rc = embps_describe_table(c, table, &info);
  if (rc != EMBPS_ENOTABLE || !(flags & EMBPS_IMPORT_CREATE)) {
    if (!rc)
      *out = info.spec;
    return rc;
  }
  if (!spec_text)
    return fail(c, EMBPS_ENOTABLE, "table \"%s\" does not exist and %s is "
                "missing to create it", table, spec_path);
  rc = parse_spec(c, spec_path, spec_text, table, out);
  if (!rc)
    rc = embps_create_table_ex(c, out, EMBPS_CREATE_EXIST_OK);
  return rc;
}

int embps_import_table(embps_client_t *c, const char *table, const char *dir,
                       unsigned flags, uint64_t *rows_out) {
  char spec_path[EMBPS_NPY_PATH_MAX];
  char *text = NULL;
  readers_t rs;
  memset(&rs, 0, sizeof rs);
  embps_file_show(rs.dir, sizeof rs.dir, dir, NULL);
  embps_file_show(spec_path, sizeof spec_path, dir, "spec.json");
  int rc = embps_export_open_dir_(c, dir, 0, &rs.dirfd);
  if (rc)
    return rc;
  rc = read_spec_text(c, rs.dirfd, spec_path, &text);
  if (rc < 0) {
    close(rs.dirfd);
    return rc;
  }
  uint64_t step = 0;
  const int set_step = (flags & EMBPS_IMPORT_STATE) && text &&
                       json_u64(text, "step", &step) == 0;
  rc = target_spec(c, table, spec_path, text, flags, &rs.spec);
  if (!rc && set_step && step > EMBPS_STEP_MAX)
    rc = fail(c, EMBPS_EBADFILE, "%s: \"step\" %" PRIu64 " is past the "
              "largest a table reaches, 2^53 (EMBPS_STEP_MAX)", spec_path,
              step);
  if (!rc && (flags & EMBPS_IMPORT_STATE) && !set_step &&
      embps_optimizer_state_slots(rs.spec.optimizer, NULL))
    rc = fail(c, EMBPS_EBADFILE, "%s: no \"step\" (the table's step counter "
              "an import with state sets)", spec_path);
  if (!rc && (flags & EMBPS_IMPORT_STATE) && text) {
    char opt[32];
    if (json_string(text, "optimizer", opt, sizeof opt) ||
        strcmp(opt, embps_optimizer_name(rs.spec.optimizer)))
      rc = fail(c, EMBPS_EBADFILE, "%s: optimizer state of \"%s\", but table "
                "\"%s\" uses %s", spec_path, opt, table,
                embps_optimizer_name(rs.spec.optimizer));
  }
  free(text);
  if (!rc)
    rc = open_files(c, flags, &rs);
  const uint32_t max = chunk_rows(c, rs.dim ? rs.dim : 1, rs.slots);
  /* pass 1: check everything; pass 2: write */
  for (int pass = 0; pass < 2 && !rc; pass++) {
    for (uint64_t first = 0; first < rs.n && !rc; first += max) {
      size_t n = rs.n - first < max ? (size_t)(rs.n - first) : max;
      rc = read_chunk(c, &rs, first, n);
      if (!rc && pass == 0)
        rc = check_chunk(c, &rs, first, n);
      if (!rc && pass == 1) {
        n = drop_repeats(&rs, n);
        rc = embps_write_rows(c, table, rs.cid, n, rs.cw, rs.dim,
                              rs.slots ? rs.cstate : NULL,
                              set_step && first == 0, step);
      }
    }
    if (!rc && pass == 1 && rs.n == 0 && set_step)
      rc = embps_write_rows(c, table, NULL, 0, NULL, rs.dim, NULL, 1, step);
    if (!rc && pass == 0) {
      if ((rs.has_ids && embps_npy_rewind(&rs.ids)) ||
          embps_npy_rewind(&rs.w))
        rc = fail(c, -errno, "%s: cannot seek", rs.dir);
      for (uint32_t j = 0; j < rs.slots && !rc; j++)
        if (embps_npy_rewind(&rs.slot[j]))
          rc = fail(c, -errno, "%s: cannot seek", rs.slot[j].path);
    }
  }
  if (!rc && rows_out)
    *rows_out = rs.n;
  readers_close(&rs);
  close(rs.dirfd);
  return rc;
}
