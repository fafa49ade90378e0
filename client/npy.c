/* npy.c - numpy .npy files, streamed (see npy.h). */
#define _GNU_SOURCE /* sync_file_range */
#include "npy.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Header size of the files we write: fixed, so the final row count can be
 * written over the first one; any shape fits in it. */
#define WRITE_HEADER_BYTES 128
#define MAGIC "\x93NUMPY"
#define MAGIC_LEN 6
#define READ_HEADER_MAX (1u << 20)
#define CONVERT_ROWS 4096 /* rows converted per read */

static const char *const descrs[] = {"<f4", "<f8", "<i8", "<i4"};
static const size_t item_bytes[] = {4, 8, 8, 4};

const char *embps_npy_descr(embps_npy_type_t type) { return descrs[type]; }

/* ------------------------------------------------------------ writer */

/* The 128-byte header for the writer's current row count. */
static void header(const embps_npy_writer_t *w, char out[WRITE_HEADER_BYTES]) {
  char dict[WRITE_HEADER_BYTES];
  char shape[64];
  if (w->cols)
    snprintf(shape, sizeof shape, "(%" PRIu64 ", %u)", w->rows, w->cols);
  else
    snprintf(shape, sizeof shape, "(%" PRIu64 ",)", w->rows);
  int n = snprintf(dict, sizeof dict,
                   "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                   descrs[w->type], shape);
  const size_t hlen = WRITE_HEADER_BYTES - 10;
  memcpy(out, MAGIC, MAGIC_LEN);
  out[6] = 1;
  out[7] = 0;
  out[8] = (char)(hlen & 0xff);
  out[9] = (char)(hlen >> 8);
  memset(out + 10, ' ', hlen);
  memcpy(out + 10, dict, (size_t)n);
  out[WRITE_HEADER_BYTES - 1] = '\n';
}

FILE *embps_file_create_excl(const char *path) {
  if (unlink(path) && errno != ENOENT)
    return NULL;
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                0644);
  if (fd < 0)
    return NULL;
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    int e = errno;
    close(fd);
    unlink(path);
    errno = e;
  }
  return f;
}

int embps_npy_create(embps_npy_writer_t *w, const char *path,
                     embps_npy_type_t type, uint32_t cols, char *err,
                     size_t err_len) {
  memset(w, 0, sizeof *w);
  snprintf(w->path, sizeof w->path, "%s", path);
  w->type = type;
  w->cols = cols;
  errno = 0;
  w->f = embps_file_create_excl(path);
  char h[WRITE_HEADER_BYTES];
  header(w, h);
  if (!w->f || fwrite(h, 1, sizeof h, w->f) != sizeof h) {
    int e = errno ? errno : EIO;
    snprintf(err, err_len, "%s: %s", path, strerror(e));
    embps_npy_abandon(w);
    return -e;
  }
  return 0;
}

int embps_npy_append(embps_npy_writer_t *w, const void *data, size_t rows,
                     char *err, size_t err_len) {
  size_t items = rows * (w->cols ? w->cols : 1);
  if (items && fwrite(data, item_bytes[w->type], items, w->f) != items) {
    int e = errno ? errno : EIO;
    snprintf(err, err_len, "%s: %s", w->path, strerror(e));
    return -e;
  }
  w->rows += rows;
  return 0;
}

int embps_npy_start_writeback(embps_npy_writer_t *w, char *err,
                              size_t err_len) {
  int rc = 0;
  if (fflush(w->f))
    rc = -(errno ? errno : EIO);
  else if (sync_file_range(fileno(w->f), 0, 0, SYNC_FILE_RANGE_WRITE) &&
           errno != ENOSYS && errno != EINVAL && errno != ESPIPE)
    rc = -errno; /* a file system without it: the final fsync does all */
  if (rc)
    snprintf(err, err_len, "%s: %s", w->path, strerror(-rc));
  return rc;
}

int embps_npy_finish(embps_npy_writer_t *w, char *err, size_t err_len) {
  char h[WRITE_HEADER_BYTES];
  header(w, h);
  int rc = 0;
  if (fflush(w->f) || fseek(w->f, 0, SEEK_SET) ||
      fwrite(h, 1, sizeof h, w->f) != sizeof h || fflush(w->f) ||
      fsync(fileno(w->f)))
    rc = -(errno ? errno : EIO);
  if (fclose(w->f) && !rc)
    rc = -(errno ? errno : EIO);
  w->f = NULL;
  if (rc)
    snprintf(err, err_len, "%s: %s", w->path, strerror(-rc));
  return rc;
}

void embps_npy_abandon(embps_npy_writer_t *w) {
  if (w->f)
    fclose(w->f);
  w->f = NULL;
}

/* ------------------------------------------------------------ reader */

/* The value of 'key' in a header dict: a pointer just past "'key':" and
 * blanks, or NULL. */
static const char *dict_value(const char *dict, const char *key) {
  char pat[32];
  snprintf(pat, sizeof pat, "'%s'", key);
  const char *p = strstr(dict, pat);
  if (!p) {
    snprintf(pat, sizeof pat, "\"%s\"", key);
    p = strstr(dict, pat);
  }
  if (!p)
    return NULL;
  p += strlen(pat);
  while (isspace((unsigned char)*p))
    p++;
  if (*p++ != ':')
    return NULL;
  while (isspace((unsigned char)*p))
    p++;
  return p;
}

/* Parses the header dict into r; a message for what is wrong, or NULL. */
static const char *parse_dict(embps_npy_reader_t *r, const char *dict) {
  const char *v = dict_value(dict, "descr");
  if (!v || (*v != '\'' && *v != '"'))
    return "header has no 'descr' string";
  char descr[16];
  size_t n = 0;
  for (v++; *v && *v != '\'' && *v != '"' && n + 1 < sizeof descr; v++)
    descr[n++] = *v;
  descr[n] = 0;
  int found = 0;
  for (unsigned i = 0; i < sizeof descrs / sizeof *descrs; i++) {
    if (!strcmp(descr, descrs[i]) ||
        (descr[0] == '=' && !strcmp(descr + 1, descrs[i] + 1))) {
      r->type = (embps_npy_type_t)i;
      found = 1;
    }
  }
  if (!found)
    return "dtype is not one of <f4, <f8, <i8, <i4 (little-endian float32, "
           "float64, int64, int32)";
  v = dict_value(dict, "fortran_order");
  if (!v)
    return "header has no 'fortran_order'";
  if (strncmp(v, "False", 5))
    return "fortran_order is not False (save a C-contiguous array)";
  v = dict_value(dict, "shape");
  if (!v || *v != '(')
    return "header has no 'shape' tuple";
  uint64_t dims[3];
  int nd = 0;
  for (v++;;) {
    while (isspace((unsigned char)*v) || *v == ',')
      v++;
    if (*v == ')')
      break;
    if (!isdigit((unsigned char)*v) || nd == 3)
      return "shape is not a tuple of at most 2 sizes";
    char *end;
    errno = 0;
    dims[nd++] = strtoull(v, &end, 10);
    if (errno)
      return "shape holds a size out of range";
    v = end;
    while (*v == 'L') /* Python 2 longs */
      v++;
  }
  if (nd < 1 || nd > 2)
    return "shape must have 1 or 2 dimensions";
  r->ndim = nd;
  r->rows = dims[0];
  r->cols = nd == 2 ? dims[1] : 1;
  return NULL;
}

int embps_npy_open(embps_npy_reader_t *r, const char *path, char *err,
                   size_t err_len) {
  memset(r, 0, sizeof *r);
  snprintf(r->path, sizeof r->path, "%s", path);
  r->f = fopen(path, "rb");
  if (!r->f) {
    snprintf(err, err_len, "%s: %s", path, strerror(errno));
    return -1;
  }
  unsigned char pre[12];
  const char *why = NULL;
  char *dict = NULL;
  size_t hlen = 0, pre_len = 10;
  if (fread(pre, 1, 10, r->f) != 10 || memcmp(pre, MAGIC, MAGIC_LEN)) {
    why = "not a .npy file (no \\x93NUMPY magic)";
  } else if (pre[6] < 1 || pre[6] > 3) {
    why = "unsupported .npy format version";
  } else if (pre[6] == 1) {
    hlen = pre[8] | (size_t)pre[9] << 8;
  } else if (fread(pre + 10, 1, 2, r->f) != 2) {
    why = "truncated header";
  } else {
    hlen = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 |
           (size_t)pre[11] << 24;
    pre_len = 12;
  }
  if (!why && hlen > READ_HEADER_MAX)
    why = "header too long";
  if (!why && !(dict = malloc(hlen + 1)))
    why = "out of memory";
  if (!why && fread(dict, 1, hlen, r->f) != hlen)
    why = "truncated header";
  if (!why) {
    dict[hlen] = 0;
    why = parse_dict(r, dict);
  }
  free(dict);
  struct stat st;
  r->data_off = (long)(pre_len + hlen);
  if (!why) {
    uint64_t bytes = r->rows * r->cols;
    if ((r->cols && bytes / r->cols != r->rows) ||
        bytes > UINT64_MAX / item_bytes[r->type])
      why = "shape too large";
    else if (fstat(fileno(r->f), &st) ||
             (uint64_t)st.st_size !=
                 (uint64_t)r->data_off + bytes * item_bytes[r->type])
      why = "file size does not match the shape in its header (truncated?)";
  }
  if (why) {
    snprintf(err, err_len, "%s: %s", path, why);
    embps_npy_close(r);
    return -1;
  }
  return 0;
}

/* Reads `rows` rows into dst, converting item by item (conv) in blocks. */
static int read_rows(embps_npy_reader_t *r, void *dst, size_t rows,
                     size_t dst_item, char *err, size_t err_len) {
  if (rows > r->rows - r->next_row) {
    snprintf(err, err_len, "%s: read past its %" PRIu64 " rows", r->path,
             r->rows);
    return -1;
  }
  const size_t src_item = item_bytes[r->type];
  size_t items = rows * r->cols;
  unsigned char *out = dst;
  if (src_item == dst_item) {
    if (items && fread(out, src_item, items, r->f) != items)
      goto short_read;
  } else {
    unsigned char buf[CONVERT_ROWS * 8];
    while (items) {
      size_t k = items < CONVERT_ROWS ? items : CONVERT_ROWS;
      if (fread(buf, src_item, k, r->f) != k)
        goto short_read;
      for (size_t i = 0; i < k; i++, out += dst_item) {
        if (r->type == EMBPS_NPY_F8) {
          double d;
          memcpy(&d, buf + i * 8, 8);
          float f = (float)d;
          memcpy(out, &f, 4);
        } else { /* I4 */
          int32_t x;
          memcpy(&x, buf + i * 4, 4);
          int64_t y = x;
          memcpy(out, &y, 8);
        }
      }
      items -= k;
    }
  }
  r->next_row += rows;
  return 0;
short_read:
  snprintf(err, err_len, "%s: short read: %s", r->path,
           ferror(r->f) ? strerror(errno) : "unexpected end of file");
  return -1;
}

int embps_npy_read_f32(embps_npy_reader_t *r, float *dst, size_t rows,
                       char *err, size_t err_len) {
  if (r->type != EMBPS_NPY_F4 && r->type != EMBPS_NPY_F8) {
    snprintf(err, err_len, "%s: dtype %s is not a float type", r->path,
             descrs[r->type]);
    return -1;
  }
  return read_rows(r, dst, rows, sizeof *dst, err, err_len);
}

int embps_npy_read_i64(embps_npy_reader_t *r, int64_t *dst, size_t rows,
                       char *err, size_t err_len) {
  if (r->type != EMBPS_NPY_I8 && r->type != EMBPS_NPY_I4) {
    snprintf(err, err_len, "%s: dtype %s is not an integer type", r->path,
             descrs[r->type]);
    return -1;
  }
  return read_rows(r, dst, rows, sizeof *dst, err, err_len);
}

int embps_npy_rewind(embps_npy_reader_t *r) {
  r->next_row = 0;
  return fseek(r->f, r->data_off, SEEK_SET);
}

void embps_npy_close(embps_npy_reader_t *r) {
  if (r->f)
    fclose(r->f);
  r->f = NULL;
}
