/* npy.h - numpy's .npy format (version 1.0 written; 1.0, 2.0 and 3.0
 * read), streamed: a writer appends rows and patches the row count into
 * the header when it finishes; a reader checks the header and converts
 * rows to the type the caller wants. Used by export.c; library-internal.
 *
 * The format: "\x93NUMPY", major, minor, header length (u16 in 1.0, u32
 * later), then an ASCII Python dict literal {'descr': '<f4',
 * 'fortran_order': False, 'shape': (n, dim), } padded with spaces and a
 * newline so the data starts at a multiple of 64 bytes, then the data,
 * C order. The header is parsed as the Python literal it is, as numpy
 * reads it, never searched for text.
 *
 * Files are named relative to a directory descriptor (AT_FDCWD for the
 * current one): an export or import opens its directory once, so a path
 * of any length open() takes works, and no file is written through, or
 * read from, a link or a FIFO someone planted there. */
#ifndef EMBPS_NPY_H
#define EMBPS_NPY_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Element types this module reads or writes. */
typedef enum {
  EMBPS_NPY_F4 = 0, /* <f4 */
  EMBPS_NPY_F8 = 1, /* <f8 (read only: narrowed to float32) */
  EMBPS_NPY_I8 = 2, /* <i8 */
  EMBPS_NPY_I4 = 3, /* <i4 (read only: widened to int64) */
} embps_npy_type_t;

/* Room for a path as messages show it (embps_file_show). */
#define EMBPS_NPY_PATH_MAX 320

typedef struct {
  FILE *f;
  char path[EMBPS_NPY_PATH_MAX]; /* "DIR/NAME", for messages */
  embps_npy_type_t type;
  uint32_t cols; /* 0: a 1-D array [rows] */
  uint64_t rows;
} embps_npy_writer_t;

/* Creates file `name` in directory dirfd (AT_FDCWD: the current one) for
 * writing, as a new file: a file or symbolic link already there is
 * removed first (unlinkat does not follow links), then the file is made
 * with O_CREAT | O_EXCL | O_NOFOLLOW, so the write never goes through a
 * link someone planted at name. NULL with errno on failure. */
FILE *embps_file_create_excl(int dirfd, const char *name);
/* Opens file `name` in directory dirfd for reading, as a regular file
 * only: O_NOFOLLOW (a symbolic link is refused), O_NONBLOCK (a FIFO cannot
 * hang the open; the flag is cleared again), then fstat must say regular
 * (not a FIFO, device, socket or directory). The fd, or -errno (-ENOENT
 * when missing) with err "SHOWN: why". */
int embps_file_open_read(int dirfd, const char *name, const char *shown,
                         char *err, size_t err_len);
/* Writes "dir/name" (name alone when dir is NULL, dir alone when name is)
 * into out, as messages show it: a dir over 200 bytes as its first 80,
 * "...", and its last 100, so a message keeps room for what went wrong. */
void embps_file_show(char *out, size_t len, const char *dir,
                     const char *name);
/* Creates file `name` in dirfd (as embps_file_create_excl) with room for
 * the header; type F4 or I8; dir (may be NULL) names the directory in
 * messages. 0, or -errno with err naming the file. */
int embps_npy_create(embps_npy_writer_t *w, int dirfd, const char *dir,
                     const char *name, embps_npy_type_t type, uint32_t cols,
                     char *err, size_t err_len);
/* Appends rows (rows x max(cols, 1) elements of the writer's type). */
int embps_npy_append(embps_npy_writer_t *w, const void *data, size_t rows,
                     char *err, size_t err_len);
/* Starts writing the rows appended so far to disk, without waiting
 * (fflush, then sync_file_range SYNC_FILE_RANGE_WRITE), so the final
 * fsync has less left to do. 0, or -errno with err. */
int embps_npy_start_writeback(embps_npy_writer_t *w, char *err,
                              size_t err_len);
/* Writes the final header (the row count), flushes, fsyncs and closes. */
int embps_npy_finish(embps_npy_writer_t *w, char *err, size_t err_len);
/* Closes without finishing (after an error); the file stays as it is. */
void embps_npy_abandon(embps_npy_writer_t *w);

/* What a header says. */
typedef struct {
  embps_npy_type_t type;
  int ndim;      /* 1 or 2 */
  uint64_t rows; /* shape[0] */
  uint64_t cols; /* shape[1], 1 for a 1-D array */
} embps_npy_header_t;

/* The largest header read, numpy's own default limit (max_header_size). */
#define EMBPS_NPY_HEADER_MAX 10000

/* Parses a header's dict (len bytes, no NUL needed) as numpy reads it: a
 * Python dict literal with exactly the keys 'descr', 'fortran_order' and
 * 'shape', in any order, each once, with any whitespace between tokens and
 * an optional trailing comma; 'descr' one of the strings "<f4", "<f8",
 * "<i8", "<i4" ('=' for '<' too), 'fortran_order' True or False (True only
 * where it lays out the data as C order does), 'shape' a tuple of 1 or 2
 * non-negative ints (Python 2's 5L too); then only whitespace. Anything
 * else (other keys, escapes, a structured dtype, (5) which is no tuple, a
 * comment) is refused. NULL, or a message saying what is wrong. */
const char *embps_npy_parse_header(const char *dict, size_t len,
                                   embps_npy_header_t *out);

typedef struct {
  FILE *f;
  char path[EMBPS_NPY_PATH_MAX]; /* "DIR/NAME", for messages */
  embps_npy_type_t type;
  int ndim;          /* 1 or 2 */
  uint64_t rows;     /* shape[0] */
  uint64_t cols;     /* shape[1], 1 for a 1-D array */
  long data_off;
  uint64_t next_row; /* rows read so far */
} embps_npy_reader_t;

/* Opens file `name` of directory dirfd (embps_file_open_read: a regular
 * file, never through a link; dir, may be NULL, names the directory in
 * messages) and checks it: magic, version 1.0, 2.0 or 3.0, a header that
 * embps_npy_parse_header takes, and a file size that matches the shape.
 * 0; -errno when it cannot be opened (-ENOENT: missing); -EINVAL when it
 * is not a .npy file this reads; err names the file and what is wrong. */
int embps_npy_open(embps_npy_reader_t *r, int dirfd, const char *dir,
                   const char *name, char *err, size_t err_len);
/* Reads the next rows (rows x cols elements) converted to float32 (f4, f8
 * files) or int64 (i8, i4 files). 0, or -1 with err. */
int embps_npy_read_f32(embps_npy_reader_t *r, float *dst, size_t rows,
                       char *err, size_t err_len);
int embps_npy_read_i64(embps_npy_reader_t *r, int64_t *dst, size_t rows,
                       char *err, size_t err_len);
/* Goes back to the first row. */
int embps_npy_rewind(embps_npy_reader_t *r);
void embps_npy_close(embps_npy_reader_t *r);
/* "<f4", "<f8", "<i8", "<i4". */
const char *embps_npy_descr(embps_npy_type_t type);
#endif
