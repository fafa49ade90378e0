/* export.h - what export.c shares with export_dense.c (library-internal):
 * error reporting through the client's last error, chunk sizing, the
 * directory of temporary files an export commits (spec.json included).
 *
 * An export writes every file as "<name>.tmp" (created new, never through
 * a link: embps_file_create_excl), and embps_export_commit_ renames them
 * to their names, spec.json last, then fsyncs the directory. */
#ifndef EMBPS_CLIENT_EXPORT_H
#define EMBPS_CLIENT_EXPORT_H
#include <stdint.h>

#include "embps/embps.h"

#define EMBPS_EXPORT_MAX_FILES 5 /* ids, weights, 2 state slots, spec */

typedef struct {
  char dir[1024];
  uint32_t n_files;
  char names[EMBPS_EXPORT_MAX_FILES][64];
} embps_export_files_t;

/* Sets c's last error to the formatted message; returns code. */
int embps_export_fail_(embps_client_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Rows of row_bytes each that make about target_bytes, and fit a frame
 * every server of c accepts (with room for the header and meta); >= 1. */
size_t embps_export_chunk_rows_(embps_client_t *c, size_t row_bytes,
                                size_t target_bytes);
/* Adds file `name` to fs and writes its temporary path ("DIR/name.tmp")
 * into path. */
void embps_export_add_(embps_export_files_t *fs, const char *name,
                       char *path, size_t path_len);
/* Writes spec.json.tmp (the spec, the table's step, the rows written,
 * whether state files and a dense matrix are there), fsynced, and adds
 * it to fs. 0 or an error with the client's error set. */
int embps_export_spec_(embps_client_t *c, embps_export_files_t *fs,
                       const embps_table_spec_t *s, uint64_t step,
                       uint64_t rows, int with_state, int dense);
/* Renames every temporary file of fs to its name, in order, and fsyncs
 * the directory. */
int embps_export_commit_(embps_client_t *c, const embps_export_files_t *fs);
/* Removes the temporary files of fs (after a failure). */
void embps_export_unlink_tmp_(const embps_export_files_t *fs);

/* export_dense.c: embps_export_table with EMBPS_EXPORT_DENSE on a table
 * of fixed size (info): DIR/weights.npy [rows, dim] indexed by id, every
 * row as a pull returns it, and spec.json. */
int embps_export_dense_(embps_client_t *c, const embps_table_info_t *info,
                        const char *dir, uint64_t *rows_out);
#endif
