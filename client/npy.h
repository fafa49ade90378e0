/* npy.h - numpy's .npy format (version 1.0 written; 1.0, 2.0 and 3.0
 * read), streamed: a writer appends rows and patches the row count into
 * the header when it finishes; a reader checks the header and converts
 * rows to the type the caller wants. Used by export.c; library-internal.
 *
 * The format: "\x93NUMPY", major, minor, header length (u16 in 1.0, u32
 * later), then an ASCII Python dict literal {'descr': '<f4',
 * 'fortran_order': False, 'shape': (n, dim), } padded with spaces and a
 * newline so the data starts at a multiple of 64 bytes, then the data,
 * C order. */
#ifndef EMBPS_NPY_H
#define EMBPS_NPY_H
#include <stdint.h>
#include <stdio.h>

/* Element types this module reads or writes. */
typedef enum {
  EMBPS_NPY_F4 = 0, /* <f4 */
  EMBPS_NPY_F8 = 1, /* <f8 (read only: narrowed to float32) */
  EMBPS_NPY_I8 = 2, /* <i8 */
  EMBPS_NPY_I4 = 3, /* <i4 (read only: widened to int64) */
} embps_npy_type_t;

typedef struct {
  FILE *f;
  char path[1100];
  embps_npy_type_t type;
  uint32_t cols; /* 0: a 1-D array [rows] */
  uint64_t rows;
} embps_npy_writer_t;

/* Creates path for writing, as a new file: a file or symbolic link already
 * there is removed first (unlink does not follow links), then the file is
 * made with O_CREAT | O_EXCL | O_NOFOLLOW, so the write never goes through
 * a link someone planted at path. NULL with errno on failure. */
FILE *embps_file_create_excl(const char *path);
/* Creates path (as embps_file_create_excl) with room for the header; type
 * F4 or I8. 0, or -errno with err naming the file. */
int embps_npy_create(embps_npy_writer_t *w, const char *path,
                     embps_npy_type_t type, uint32_t cols, char *err,
                     size_t err_len);
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

typedef struct {
  FILE *f;
  char path[1100];
  embps_npy_type_t type;
  int ndim;          /* 1 or 2 */
  uint64_t rows;     /* shape[0] */
  uint64_t cols;     /* shape[1], 1 for a 1-D array */
  long data_off;
  uint64_t next_row; /* rows read so far */
} embps_npy_reader_t;

/* Opens and checks a .npy file: magic, version, a header that parses,
 * little-endian <f4/<f8/<i8/<i4, fortran_order False, a 1-D or 2-D shape,
 * and a file size that matches. 0, or -1 with err naming the file and
 * what is wrong. */
int embps_npy_open(embps_npy_reader_t *r, const char *path, char *err,
                   size_t err_len);
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
