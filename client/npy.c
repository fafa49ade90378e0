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

void embps_file_show(char *out, size_t len, const char *dir,
                     const char *name) {
  const size_t n = dir ? strlen(dir) : 0;
  const char *sep = dir && name ? "/" : "";
  if (!name)
    name = "";
  if (n > 200)
    snprintf(out, len, "%.80s...%s%s%s", dir, dir + n - 100, sep, name);
  else
    snprintf(out, len, "%s%s%s", dir ? dir : "", sep, name);
}

FILE *embps_file_create_excl(int dirfd, const char *name) {
  if (unlinkat(dirfd, name, 0) && errno != ENOENT)
    return NULL;
  int fd = openat(dirfd, name,
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    return NULL;
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    int e = errno;
    close(fd);
    unlinkat(dirfd, name, 0);
    errno = e;
  }
  return f;
}

int embps_file_open_read(int dirfd, const char *name, const char *shown,
                         char *err, size_t err_len) {
  int fd = openat(dirfd, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ELOOP)
      snprintf(err, err_len, "%s: a symbolic link (files are read only as "
               "regular files, never through a link)", shown);
    else
      snprintf(err, err_len, "%s: %s", shown, strerror(e));
    return -e;
  }
  struct stat st;
  int flags = fcntl(fd, F_GETFL);
  if (fstat(fd, &st) || flags < 0 ||
      fcntl(fd, F_SETFL, flags & ~O_NONBLOCK)) {
    int e = errno;
    close(fd);
    snprintf(err, err_len, "%s: %s", shown, strerror(e));
    return -e;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    snprintf(err, err_len, "%s: not a regular file (%s)", shown,
             S_ISFIFO(st.st_mode)  ? "a FIFO"
             : S_ISDIR(st.st_mode) ? "a directory"
             : S_ISSOCK(st.st_mode) ? "a socket"
                                    : "a device");
    return -EINVAL;
  }
  return fd;
}

int embps_npy_create(embps_npy_writer_t *w, int dirfd, const char *dir,
                     const char *name, embps_npy_type_t type, uint32_t cols,
                     char *err, size_t err_len) {
  memset(w, 0, sizeof *w);
  embps_file_show(w->path, sizeof w->path, dir, name);
  w->type = type;
  w->cols = cols;
  errno = 0;
  w->f = embps_file_create_excl(dirfd, name);
  char h[WRITE_HEADER_BYTES];
  header(w, h);
  if (!w->f || fwrite(h, 1, sizeof h, w->f) != sizeof h) {
    int e = errno ? errno : EIO;
    snprintf(err, err_len, "%s: %s", w->path, strerror(e));
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

/* The header dict is read by a small recursive-descent parser over the
 * few Python literals numpy writes there: strings, True/False, ints and
 * tuples of ints. A message for the first thing wrong goes in l->why. */
typedef struct {
  const char *p, *end;
  const char *why;
} lex_t;

static void skip_blanks(lex_t *l) {
  while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' ||
                           *l->p == '\r' || *l->p == '\f'))
    l->p++;
}

#define END (-1) /* peek at the end of the text */

/* The next token's first byte (after blanks), or END. */
static int peek(lex_t *l) {
  skip_blanks(l);
  return l->p < l->end ? (unsigned char)*l->p : END;
}

static int refuse(lex_t *l, const char *why) {
  if (!l->why)
    l->why = why;
  return -1;
}

/* Consumes byte ch as the next token, or refuses with why. */
static int expect(lex_t *l, int ch, const char *why) {
  if (peek(l) != ch)
    return refuse(l, why);
  l->p++;
  return 0;
}

/* A string literal, '...' or "...", of printable ASCII without escapes,
 * into out; one longer than len - 1 bytes is cut (a caller compares it
 * with names shorter than that). */
static int parse_string(lex_t *l, char *out, size_t len) {
  int q = peek(l);
  if (q != '\'' && q != '"')
    return -1;
  size_t n = 0;
  for (l->p++; l->p < l->end && *l->p != q; l->p++) {
    unsigned char ch = (unsigned char)*l->p;
    if (ch == '\\')
      return refuse(l, "a string in the header has a backslash escape");
    if (ch < 0x20 || ch > 0x7e)
      return refuse(l, "a string in the header holds a byte that is not "
                       "printable ASCII");
    if (n + 1 < len)
      out[n++] = (char)ch;
  }
  if (l->p == l->end)
    return refuse(l, "a string in the header does not end");
  l->p++;
  out[n] = 0;
  return 0;
}

/* A word of letters (True, False), into out (cut as parse_string). */
static void parse_word(lex_t *l, char *out, size_t len) {
  size_t n = 0;
  peek(l);
  for (; l->p < l->end && isalpha((unsigned char)*l->p); l->p++)
    if (n + 1 < len)
      out[n++] = *l->p;
  out[n] = 0;
}

/* A non-negative int literal as Python 3 reads it (digits, single '_'
 * between them, no leading zero but in 0), or Python 2's with an L. */
static int parse_size(lex_t *l, uint64_t *out) {
  int ch = peek(l);
  if (ch == '-')
    return refuse(l, "'shape' holds a negative size");
  if (ch == END || !isdigit(ch))
    return refuse(l, "'shape' holds something that is not an int");
  const char *start = l->p;
  uint64_t v = 0;
  int all_zero = 1;
  for (; l->p < l->end; l->p++) {
    if (*l->p == '_' && l->p + 1 < l->end &&
        isdigit((unsigned char)l->p[1]) && isdigit((unsigned char)l->p[-1]))
      continue;
    if (!isdigit((unsigned char)*l->p))
      break;
    unsigned d = (unsigned)(*l->p - '0');
    all_zero &= d == 0;
    if (v > (UINT64_MAX - d) / 10)
      return refuse(l, "'shape' holds a size past 2^64");
    v = v * 10 + d;
  }
  if (*start == '0' && !all_zero)
    return refuse(l, "'shape' holds an int with a leading zero (not a "
                     "Python literal)");
  if (l->p < l->end && (*l->p == 'L' || *l->p == 'l'))
    l->p++;
  if (l->p < l->end && (isalnum((unsigned char)*l->p) || *l->p == '.' ||
                        *l->p == '_'))
    return refuse(l, "'shape' holds something that is not an int");
  *out = v;
  return 0;
}

#define SHAPE_MAX 2 /* dimensions read */

/* 'shape': a tuple of ints, "(n,)" "(n, m)" "()" (a trailing comma
 * allowed; one element needs it), at most SHAPE_MAX of them. */
static int parse_shape(lex_t *l, uint64_t *dims, int *nd) {
  if (expect(l, '(', "'shape' is not a tuple"))
    return -1;
  int n = 0, comma = 0;
  while (peek(l) != ')') {
    uint64_t v;
    if (n && !comma)
      return refuse(l, "'shape' is not a tuple of ints separated by commas");
    if (parse_size(l, &v))
      return -1;
    if (n == SHAPE_MAX)
      return refuse(l, "'shape' has more than 2 dimensions (only 1-D and "
                       "2-D arrays are read)");
    dims[n++] = v;
    comma = peek(l) == ',';
    if (comma)
      l->p++;
  }
  l->p++;
  if (n == 1 && !comma)
    return refuse(l, "'shape' is an int in parentheses, not a tuple (a 1-D "
                     "shape is written (n,))");
  if (n == 0)
    return refuse(l, "'shape' is (): a 0-d array (a scalar) has no rows");
  *nd = n;
  return 0;
}

static int parse_descr(lex_t *l, embps_npy_type_t *type) {
  char descr[16];
  if (parse_string(l, descr, sizeof descr))
    return refuse(l, "'descr' is not a string (a structured dtype? only "
                     "<f4, <f8, <i8, <i4 arrays are read)");
  for (unsigned i = 0; i < sizeof descrs / sizeof *descrs; i++)
    if (!strcmp(descr, descrs[i]) ||
        (descr[0] == '=' && !strcmp(descr + 1, descrs[i] + 1))) {
      *type = (embps_npy_type_t)i;
      return 0;
    }
  return refuse(l, "dtype is not one of <f4, <f8, <i8, <i4 (little-endian "
                   "float32, float64, int64, int32)");
}

const char *embps_npy_parse_header(const char *dict, size_t len,
                                   embps_npy_header_t *out) {
  static const char *const keys[] = {"descr", "fortran_order", "shape"};
  lex_t l = {dict, dict + len, NULL};
  unsigned seen = 0;
  int fortran = 0, nd = 0;
  uint64_t dims[SHAPE_MAX] = {0};
  if (expect(&l, '{', "the header is not a dict literal ({...})"))
    return l.why;
  while (peek(&l) != '}') {
    char key[24];
    unsigned k = 0;
    if (parse_string(&l, key, sizeof key)) {
      refuse(&l, "a key of the header dict is not a string (or the dict "
                 "does not end)");
      return l.why;
    }
    while (k < 3 && strcmp(key, keys[k]))
      k++;
    if (k == 3)
      return "the header dict has a key other than 'descr', "
             "'fortran_order' and 'shape'";
    if (seen & (1u << k))
      return k == 0 ? "the header dict gives 'descr' twice"
             : k == 1 ? "the header dict gives 'fortran_order' twice"
                      : "the header dict gives 'shape' twice";
    seen |= 1u << k;
    if (expect(&l, ':', "a key of the header dict has no ':' after it"))
      return l.why;
    if (k == 0 && parse_descr(&l, &out->type))
      return l.why;
    if (k == 1) {
      char word[8];
      parse_word(&l, word, sizeof word);
      if (strcmp(word, "True") && strcmp(word, "False"))
        return "'fortran_order' is not True or False";
      fortran = word[0] == 'T';
    }
    if (k == 2 && parse_shape(&l, dims, &nd))
      return l.why;
    if (peek(&l) == ',')
      l.p++;
    else if (peek(&l) == END)
      return "the header dict does not end (no '}')";
    else if (peek(&l) != '}')
      return "the header dict has no ',' between its items";
  }
  l.p++;
  if (peek(&l) != END)
    return "the header has text after its dict";
  if (!(seen & 1))
    return "the header has no 'descr'";
  if (!(seen & 2))
    return "the header has no 'fortran_order'";
  if (!(seen & 4))
    return "the header has no 'shape'";
  /* Fortran order lays out the data as C order does unless both sizes of
   * a 2-D array are over 1 */
  if (fortran && nd == 2 && dims[0] > 1 && dims[1] > 1)
    return "fortran_order is True (save a C-contiguous array)";
  out->ndim = nd;
  out->rows = dims[0];
  out->cols = nd == 2 ? dims[1] : 1;
  return NULL;
}

/* Reads and checks the magic, version and header of r->f; sets r's
 * shape, type and data offset. NULL, or what is wrong. */
static const char *read_header(embps_npy_reader_t *r) {
  unsigned char pre[12];
  size_t hlen, pre_len = 10;
  if (fread(pre, 1, 10, r->f) != 10 || memcmp(pre, MAGIC, MAGIC_LEN))
    return "not a .npy file (no \\x93NUMPY magic)";
  if (pre[6] < 1 || pre[6] > 3 || pre[7] != 0)
    return "unsupported .npy format version (1.0, 2.0 and 3.0 are read)";
  if (pre[6] == 1) {
    hlen = pre[8] | (size_t)pre[9] << 8;
  } else if (fread(pre + 10, 1, 2, r->f) != 2) {
    return "truncated header";
  } else {
    hlen = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 |
           (size_t)pre[11] << 24;
    pre_len = 12;
  }
  if (hlen > EMBPS_NPY_HEADER_MAX)
    return "header longer than numpy's limit of 10000 bytes";
  char dict[EMBPS_NPY_HEADER_MAX];
  if (fread(dict, 1, hlen, r->f) != hlen)
    return "truncated header";
  embps_npy_header_t h;
  const char *why = embps_npy_parse_header(dict, hlen, &h);
  if (why)
    return why;
  r->type = h.type;
  r->ndim = h.ndim;
  r->rows = h.rows;
  r->cols = h.cols;
  r->data_off = (long)(pre_len + hlen);
  return NULL;
}

int embps_npy_open(embps_npy_reader_t *r, int dirfd, const char *dir,
                   const char *name, char *err, size_t err_len) {
  memset(r, 0, sizeof *r);
  embps_file_show(r->path, sizeof r->path, dir, name);
  int fd = embps_file_open_read(dirfd, name, r->path, err, err_len);
  if (fd < 0)
    return fd;
  r->f = fdopen(fd, "rb");
  if (!r->f) {
    int e = errno;
    close(fd);
    snprintf(err, err_len, "%s: %s", r->path, strerror(e));
    return -e;
  }
  const char *why = read_header(r);
  struct stat st;
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
    snprintf(err, err_len, "%s: %s", r->path, why);
    embps_npy_close(r);
    return -EINVAL;
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
