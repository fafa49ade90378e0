/* export.h - what export.c shares with export_dense.c (library-internal):
 * error reporting through the client's last error, chunk sizing, the
 * directory of temporary files an export commits (spec.json included).
 *
 * An export opens its directory once and names every file relative to it.
 * It writes every file as "<name>.tmp" (created new, never through a
 * link: embps_file_create_excl), and embps_export_commit_ renames them to
 * their names, spec.json last, then fsyncs the directory; after any
 * failure embps_export_unlink_tmp_ removes them all. */
#ifndef EMBPS_CLIENT_EXPORT_H
#define EMBPS_CLIENT_EXPORT_H
#include <stdint.h>

#include "embps/embps.h"
#include "npy.h"

#define EMBPS_EXPORT_MAX_FILES 5 /* ids, weights, 2 state slots, spec */
#define EMBPS_EXPORT_NAME_MAX 64  /* a file's name, ".tmp" included */

/* The directory an export writes and the files it holds there. */
typedef struct {
  int dirfd;       /* the directory, open: files are named relative to it */
  char dir[EMBPS_NPY_PATH_MAX]; /* its path as messages show it */
  uint32_t n_files;
  char names[EMBPS_EXPORT_MAX_FILES][EMBPS_EXPORT_NAME_MAX];
} embps_export_files_t;

/* Sets c's last error to the formatted message; returns code. */
int embps_export_fail_(embps_client_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Rows of row_bytes each that make about target_bytes, and fit a frame
 * every server of c accepts (with room for the header and meta); >= 1. */
size_t embps_export_chunk_rows_(embps_client_t *c, size_t row_bytes,
                                size_t target_bytes);
/* Opens directory dir (for an export, mkdir first when export is set)
 * into *dirfd: O_DIRECTORY, so every file is then opened relative to it,
 * whatever the length of its path. A path the system refuses as too long
 * is refused here, before anything is written. 0 or an error with the
 * client's error set. */
int embps_export_open_dir_(embps_client_t *c, const char *dir, int export,
                           int *dirfd);
/* Adds file `name` to fs and writes its temporary name ("name.tmp") into
 * tmp. */
void embps_export_add_(embps_export_files_t *fs, const char *name,
                       char tmp[EMBPS_EXPORT_NAME_MAX]);
/* Writes spec.json.tmp (the spec, the table's step, the rows written,
 * whether state files and a dense matrix are there), fsynced, and adds
 * it to fs. 0 or an error with the client's error set. */
int embps_export_spec_(embps_client_t *c, embps_export_files_t *fs,
                       const embps_table_spec_t *s, uint64_t step,
                       uint64_t rows, int with_state, int dense);
/* Renames every temporary file of fs to its name, in order, and fsyncs
 * the directory. */
int embps_export_commit_(embps_client_t *c, const embps_export_files_t *fs);
/* Removes the temporary files of fs (after a failure): none is left. */
void embps_export_unlink_tmp_(const embps_export_files_t *fs);

/* export_dense.c: embps_export_table with EMBPS_EXPORT_DENSE on a table
 * of fixed size (info): weights.npy [rows, dim] indexed by id, every row
 * as a pull returns it, and spec.json, into fs (opened, no file yet). */
int embps_export_dense_(embps_client_t *c, const embps_table_info_t *info,
                        embps_export_files_t *fs, uint64_t *rows_out);
#endif
