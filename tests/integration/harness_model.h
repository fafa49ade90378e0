/* harness_model.h - a reference model of a table for the integration
 * tests: the rows a server should hold, computed here from the same pushes
 * (duplicates summed in order of first appearance, then one optimizer step
 * per push, SGD or Adagrad with PyTorch's formula). Rows are learnt from
 * the server first (their initial values), then only pushed. Linear search:
 * meant for a few thousand rows. */
#ifndef EMBPS_TEST_HARNESS_MODEL_H
#define EMBPS_TEST_HARNESS_MODEL_H
#include "harness_fixture.h"

typedef struct {
  uint32_t dim;
  embps_optimizer_t opt;
  float lr, eps, acc0;
  int has_padding;
  int64_t padding_id;
  size_t n, cap;
  int64_t *ids;
  float *w, *acc;          /* n rows of dim: weights, Adagrad accumulators */
  unsigned char *touched;  /* row i was pushed */
} it_ref_t;

/* A model of table s (SGD or Adagrad) knowing no row yet. */
void it_ref_init(it_ref_t *r, const embps_table_spec_t *s);
void it_ref_free(it_ref_t *r);
/* Learns rows (n of dim) as the current rows of ids not yet known. */
void it_ref_learn(it_ref_t *r, const int64_t *ids, size_t n,
                  const float *rows);
/* it_ref_learn from a pull of ids through c. */
void it_ref_learn_from(it_ref_t *r, embps_client_t *c, const char *table,
                       const int64_t *ids, size_t n);
/* Applies a push of n (idx, vals) as the server does; every row must have
 * been learnt (the padding id is skipped). */
void it_ref_push(it_ref_t *r, const int64_t *idx, size_t n,
                 const float *vals);
/* The rows a pull of ids should return (zeros for the padding id). */
void it_ref_expect(const it_ref_t *r, const int64_t *ids, size_t n,
                   float *out);
/* Rows pushed at least once. */
size_t it_ref_touched(const it_ref_t *r);
/* Pulls ids through c and compares with the model (it_assert_floats). */
void it_check_rows(embps_client_t *c, const char *table, const it_ref_t *r,
                   const int64_t *ids, size_t n, double tol,
                   const char *what);
/* it_check_rows of ids 0..rows-1. */
void it_check_dense(embps_client_t *c, const char *table, const it_ref_t *r,
                    uint64_t rows, double tol, const char *what);
#endif
