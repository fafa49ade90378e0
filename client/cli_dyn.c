/* cli_dyn.c - the CLI's admission and eviction options (issue 12):
 * create-table flags and what `tables` shows of them. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* A decimal number in [0, max] (an integer when `integral`). */
static int dyn_number(const char *v, double max, int integral, double *out) {
  char *end;
  errno = 0;
  double d = strtod(v, &end);
  if (errno || end == v || *end || !(d >= 0) || d > max ||
      (integral && d != floor(d)))
    return -1;
  *out = d;
  return 0;
}

int embps_cli_dyn_option(const char *a, const char *v,
                         embps_table_spec_t *spec) {
  double d;
  if (!strcmp(a, "--evict")) {
    if (!strcmp(v, "lru"))
      spec->evict = EMBPS_EVICT_LRU;
    else if (!strcmp(v, "lfu"))
      spec->evict = EMBPS_EVICT_LFU;
    else
      return -1;
    return 1;
  }
  if (!strcmp(a, "--admit-after")) {
    if (dyn_number(v, UINT32_MAX, 1, &d))
      return -1;
    spec->admit_after = (uint32_t)d;
  } else if (!strcmp(a, "--admit-probability")) {
    if (dyn_number(v, 1, 0, &d))
      return -1;
    spec->admit_probability = d;
  } else if (!strcmp(a, "--admit-sketch-bytes")) {
    if (dyn_number(v, 0x1p53, 1, &d))
      return -1;
    spec->admit_sketch_bytes = (uint64_t)d;
  } else if (!strcmp(a, "--ttl-steps")) {
    if (dyn_number(v, 0x1p53, 1, &d))
      return -1;
    spec->ttl_steps = (uint64_t)d;
  } else if (!strcmp(a, "--max-rows")) {
    if (dyn_number(v, 0x1p53, 1, &d))
      return -1;
    spec->max_rows = (uint64_t)d;
  } else if (!strcmp(a, "--evict-l2-below")) {
    if (dyn_number(v, HUGE_VAL, 0, &d) || !isfinite(d))
      return -1;
    spec->evict_l2_below = d;
  } else {
    return 0;
  }
  return 1;
}

int embps_cli_dyn_evict(embps_client_t *c, int argc, char **argv) {
  if (argc != 1) {
    fprintf(stderr, "embps: evict takes one table NAME\n");
    return 2;
  }
  uint64_t n;
  int rc = embps_evict(c, argv[0], &n);
  if (rc) {
    const char *why = embps_client_last_error(c);
    fprintf(stderr, "embps: %s\n", why[0] ? why : embps_strerror(rc));
    return 1;
  }
  printf("evicted %" PRIu64 " rows\n", n);
  return 0;
}

void embps_cli_dyn_print(const embps_table_info_t *x, int json) {
  const embps_table_spec_t *s = &x->spec;
  if (json) {
    printf(", \"admit_after\": %u, \"admit_probability\": %.9g, "
           "\"admit_sketch_bytes\": %" PRIu64 ", \"ttl_steps\": %" PRIu64
           ", \"max_rows\": %" PRIu64 ", \"evict\": \"%s\", "
           "\"evict_l2_below\": %.9g, \"rows_admitted\": %" PRIu64
           ", \"rows_pending\": %" PRIu64 ", \"evicted_ttl\": %" PRIu64
           ", \"evicted_capacity\": %" PRIu64 ", \"evicted_l2\": %" PRIu64
           ", \"capacity\": %" PRIu64 ", \"evict_stall_max_us\": %" PRIu64,
           s->admit_after, s->admit_probability, s->admit_sketch_bytes,
           s->ttl_steps, s->max_rows,
           s->evict == EMBPS_EVICT_LFU ? "lfu" : "lru", s->evict_l2_below,
           x->rows_admitted, x->rows_pending, x->evicted_ttl,
           x->evicted_capacity, x->evicted_l2, x->capacity,
           x->evict_stall_max_us);
    return;
  }
  if (!(s->admit_after || s->admit_probability != 0 || s->ttl_steps ||
        s->max_rows || s->evict_l2_below != 0))
    return;
  printf("  %s: admit-after %u admit-probability %g ttl-steps %" PRIu64
         " max-rows %" PRIu64 " evict %s evict-l2-below %g\n", s->name,
         s->admit_after, s->admit_probability, s->ttl_steps, s->max_rows,
         s->evict == EMBPS_EVICT_LFU ? "lfu" : "lru", s->evict_l2_below);
  printf("  %s: admitted %" PRIu64 " pending ~%" PRIu64 " evicted ttl %"
         PRIu64 " capacity %" PRIu64 " l2 %" PRIu64 ", in use %" PRIu64
         " of %" PRIu64 ", longest eviction stall %" PRIu64 " us\n",
         s->name, x->rows_admitted, x->rows_pending, x->evicted_ttl,
         x->evicted_capacity, x->evicted_l2, x->rows_allocated, x->capacity,
         x->evict_stall_max_us);
}
