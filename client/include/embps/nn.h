/*
 * embps/nn.h - local helpers for workers, part of libembps: embedding
 * lookup, bag lookup and their backward passes, which produce the
 * IndexedSlices gradients that embps_push() sends, and clipping by global
 * norm. Nothing here talks to a server; the conventions are embps.h's
 * (0 or a negative code, never abort, never print).
 */
#ifndef EMBPS_NN_H
#define EMBPS_NN_H

#include <embps/embps.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * An IndexedSlices gradient held by the caller: n rows of dim floats,
 * values[i*dim..] is the gradient for row indices[i]. Indices may repeat.
 */
typedef struct {
  int64_t *indices;
  float *values;
  size_t n;
  size_t cap; /* rows allocated */
  uint32_t dim;
  uint64_t reserved[2]; /* zero (embps.h, "Structs and the ABI") */
} embps_slices_t;

/* Initialises s empty; embps_slices_free() releases it (NULL accepted). */
EMBPS_EXTERN void embps_slices_init(embps_slices_t *s, uint32_t dim);
EMBPS_EXTERN void embps_slices_free(embps_slices_t *s);
/* Makes room for `n` rows in total; returns 0 or -ENOMEM. */
EMBPS_EXTERN int embps_slices_reserve(embps_slices_t *s, size_t n);

/* Sums duplicates in place: afterwards s holds each index once, in the order
 * of first appearance, with the sum of its rows (TensorFlow's
 * unsorted_segment_sum over unique indices; PyTorch's coalesce() up to
 * order). Returns 0 or -ENOMEM (s unchanged). */
EMBPS_EXTERN int embps_slices_merge(embps_slices_t *s);

/* Embedding lookup (tf.nn.embedding_lookup): given the rows pulled for
 * `unique_ids` (n_unique x dim, e.g. by embps_pull) and, for each of the n
 * positions of an id array of any shape, inverse[i] = its row in that list,
 * writes out[i*dim..] = rows[inverse[i]*dim..]. */
EMBPS_EXTERN void embps_lookup(const float *rows, uint32_t dim,
                               const uint32_t *inverse, size_t n, float *out);

/* Unique ids of an array with the inverse map: unique_out gets the distinct
 * ids in order of first appearance (at most n), inverse_out[i] the position
 * of ids[i] in it. Returns the number of unique ids, or -ENOMEM. */
EMBPS_EXTERN int64_t embps_unique(const int64_t *ids, size_t n,
                                  int64_t *unique_out, uint32_t *inverse_out);

/* Backward of a lookup: d out / d rows as IndexedSlices. Appends, for every
 * position i whose id is not the padding id, the row grad[i*dim..] with
 * index ids[i] to `g` (scatter-add semantics: repeated ids accumulate once
 * merged). has_padding = 0 disables the padding id. Returns 0 or -ENOMEM. */
EMBPS_EXTERN int embps_lookup_backward(const int64_t *ids, size_t n,
                                       const float *grad, uint32_t dim,
                                       int has_padding, int64_t padding_id,
                                       embps_slices_t *g);

typedef enum {
  EMBPS_COMBINER_SUM = 0,
  EMBPS_COMBINER_MEAN = 1,  /* sum(w*x) / sum(w) */
  EMBPS_COMBINER_SQRTN = 2, /* sum(w*x) / sqrt(sum(w^2)) */
} embps_combiner_t;

/*
 * Bag lookup (tf.nn.embedding_lookup_sparse, torch EmbeddingBag): bag b
 * covers ids[offsets[b] .. offsets[b+1]) (offsets has n_bags+1 entries,
 * non-decreasing, offsets[n_bags] = number of ids); `rows` holds the row of
 * each id position (n_ids x dim, e.g. from embps_pull on the ids array) and
 * weights (NULL: all 1) one weight per id position. Padding ids contribute
 * nothing and count for nothing. An empty bag gives zeros.
 * out is n_bags x dim.
 */
EMBPS_EXTERN void embps_bag_forward(const float *rows, uint32_t dim,
                                    const int64_t *ids, const size_t *offsets,
                                    size_t n_bags, const float *weights,
                                    embps_combiner_t combiner, int has_padding,
                                    int64_t padding_id, float *out);
/* Backward of embps_bag_forward: given d loss / d out (n_bags x dim),
 * appends one gradient row per non-padding id position to g. */
EMBPS_EXTERN int embps_bag_backward(const float *grad_out, uint32_t dim,
                                    const int64_t *ids, const size_t *offsets,
                                    size_t n_bags, const float *weights,
                                    embps_combiner_t combiner, int has_padding,
                                    int64_t padding_id, embps_slices_t *g);

/* Clips a list of gradients by their global norm (tf.clip_by_global_norm),
 * merging duplicates in every slices first, so the norm is that of the
 * dense gradient the slices stand for (TensorFlow's clipping of IndexedSlices
 * does not merge and overstates it). Scales every value by
 * clip_norm / max(global_norm, clip_norm). *norm_out (may be NULL) gets the
 * norm before clipping. Returns 0, -ENOMEM or EMBPS_EINVAL. */
EMBPS_EXTERN int embps_clip_by_global_norm(embps_slices_t *const *list,
                                           size_t n_list, double clip_norm,
                                           double *norm_out);

#ifdef __cplusplus
}
#endif
#endif /* EMBPS_NN_H */
