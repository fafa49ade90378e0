/* history.h - the epochs of a log (issue 21): the list of (epoch, first
 * LSN made in it), in rising order, as PostgreSQL keeps timeline history
 * files. Every log record carries the epoch it was made in (wal.h); a
 * primary starts a new epoch at every start and at every promotion, so
 * one (LSN, epoch) pair names one record whatever server holds it. Two
 * servers' logs agree up to the last LSN where their histories give the
 * same epoch (embps_history_common): what a rejoining server holds beyond
 * it was never its new primary's, and is cut.
 *
 * With --data-dir the history is DIR/HISTORY, a text file ("embps
 * history 1", then one "EPOCH FIRST_LSN" line per epoch, then "crc32c
 * XXXXXXXX", the CRC-32C of the lines before it) replaced atomically
 * (temporary file, fsync, rename, directory fsync) whenever it grows. Not
 * locked: the owner (feed.c) serialises its users. */
#ifndef EMBPS_HISTORY_H
#define EMBPS_HISTORY_H
#include <stddef.h>
#include <stdint.h>

#include "wire.h" /* embps_epoch_t: an epoch and its first LSN */

typedef struct {
  embps_epoch_t *v;
  size_t n, cap;
} embps_history_t;

/* Largest history kept: beyond it the oldest epochs are merged away (a
 * server restarted or promoted a million times). */
#define EMBPS_HISTORY_MAX EMBPS_EPOCHS_MAX

void embps_history_init(embps_history_t *h);
void embps_history_close(embps_history_t *h);
/* Appends epoch from LSN start: epoch above the last one, start at or
 * after the last start. 0, EMBPS_EINVAL (out of order) or -ENOMEM. */
int embps_history_add(embps_history_t *h, uint32_t epoch, uint64_t start);
/* dst = a copy of src. 0 or -ENOMEM (dst unchanged). */
int embps_history_copy(embps_history_t *dst, const embps_history_t *src);
/* The last epoch (0: none). */
uint32_t embps_history_epoch(const embps_history_t *h);
/* The epoch LSN lsn was made in: that of the last entry starting at or
 * before it (0: none). */
uint32_t embps_history_epoch_at(const embps_history_t *h, uint64_t lsn);
/* The last LSN up to which logs a (last LSN a_last) and b (b_last) hold
 * the same records: the LSN before the first one at which their
 * histories name different epochs, or the smaller last LSN. */
uint64_t embps_history_common(const embps_history_t *a, uint64_t a_last,
                              const embps_history_t *b, uint64_t b_last);

/* DIR/HISTORY into h (left empty when there is none). 0, or -1 with err
 * naming the file and an offset for one that does not read, check or
 * parse, or is out of order. */
int embps_history_load(const char *dir, embps_history_t *h, char *err,
                       size_t err_len);
/* Writes h to DIR/HISTORY durably. 0, or -1 with err. */
int embps_history_save(const char *dir, const embps_history_t *h, char *err,
                       size_t err_len);
#endif
