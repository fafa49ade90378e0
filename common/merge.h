/* merge.h - duplicate removal for id arrays and IndexedSlices.
 *
 * One open-addressing hash table of 32-bit positions (4 bytes a slot, load
 * at most 1/2) over the output list itself: a probe compares against the
 * unique ids already written, so the table holds no keys. Output keeps the
 * order of first appearance, which makes every result deterministic. The
 * scratch table is reused across calls, so a steady stream of batches
 * allocates nothing. */
#ifndef EMBPS_MERGE_H
#define EMBPS_MERGE_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t *slots;
  size_t cap; /* power of two, or 0 */
} embps_dedup_t;

void embps_dedup_init(embps_dedup_t *d);
void embps_dedup_close(embps_dedup_t *d);

/* unique_out (n entries) gets the distinct ids in order of first appearance;
 * inverse_out (n entries, may be NULL) the position of each ids[i] in it.
 * Returns the number of distinct ids, or -ENOMEM. n < 2^32. */
int64_t embps_dedup_ids(embps_dedup_t *d, const int64_t *ids, size_t n,
                        int64_t *unique_out, uint32_t *inverse_out);

/* Sums the rows of duplicate indices: uidx/uvals get each index once with the
 * sum of its rows, in order of first appearance (sums run in input order).
 * uidx/uvals may alias idx/vals (in-place merge). Returns the number of
 * distinct indices or -ENOMEM. */
int64_t embps_merge_rows(embps_dedup_t *d, const int64_t *idx,
                         const float *vals, size_t n, uint32_t dim,
                         int64_t *uidx, float *uvals);

/* embps_merge_rows that also checks every value is finite, in the same
 * pass (the row is checked while it is in cache). On the first row holding
 * an inf or NaN it stops and returns EMBPS_ENONFINITE with *bad_pos = its
 * position and *bad_index = its index; uidx/uvals are then partly written.
 * Otherwise *small = 1 if every merged value lies within screen (finite,
 * >= 0), else 0; inputs small enough for any n of them to sum within
 * screen (in practice: most gradients) tell that without a second pass. */
int64_t embps_merge_rows_checked(embps_dedup_t *d, const int64_t *idx,
                                 const float *vals, size_t n, uint32_t dim,
                                 int64_t *uidx, float *uvals, float screen,
                                 int *small, size_t *bad_pos,
                                 int64_t *bad_index);
#endif
