/* cli_dyn.c - the CLI's admission and eviction options (issue 12):
 * create-table's (and bench's) flags, what `tables` shows of them, and
 * `evict`. */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static int set_evict(const embps_flag_t *f, const char *v, void *obj,
                     char *err, size_t err_len) {
  embps_table_spec_t *spec = obj;
  if (!strcmp(v, "lru"))
    spec->evict = EMBPS_EVICT_LRU;
  else if (!strcmp(v, "lfu"))
    spec->evict = EMBPS_EVICT_LFU;
  else
    return embps_flag_refuse(f, v, err, err_len);
  return 0;
}

#define SPEC embps_table_spec_t
#define COUNT_(name, field, hi, help)                                          \
  EMBPS_FLAG_NUMBER(name, "N", embps_flag_set_count, SPEC, field, 0, hi, NULL, \
                    help)
const embps_flag_t embps_cli_dyn_flags[] = {
    COUNT_("admit-after", admit_after, UINT32_MAX,
           "--dynamic only: a row is made on the Nth push of its id"),
    COUNT_("admit-sketch-bytes", admit_sketch_bytes, 0x1p53,
           "memory of the admission counts per server (default 1M)"),
    EMBPS_FLAG_NUMBER("admit-probability", "P", embps_flag_set_double, SPEC,
                      admit_probability, 0, 1, NULL,
                      "an id is admitted iff a hash of (table seed, id) < P"),
    COUNT_("ttl-steps", ttl_steps, 0x1p53,
           "a row not pushed during the table's last N steps is evicted"),
    COUNT_("max-rows", max_rows, 0x1p53,
           "at most N rows in the cluster; a push that passes it evicts"),
    {"evict", "lru|lfu",
     "which rows --max-rows evicts: least recently or "
     "least often pushed (default lru)",
     set_evict, 0, 0, 0, 0, 0, "lru|lfu"},
    EMBPS_FLAG_NUMBER("evict-l2-below", "X", embps_flag_set_double, SPEC,
                      evict_l2_below, 0, DBL_MAX, "a finite number >= 0",
                      "rows of L2 norm below X are evicted at every "
                      "checkpoint and by `evict`"),
    EMBPS_FLAG_END};

int embps_cli_dyn_evict(embps_client_t *c, const char *name) {
  uint64_t n;
  int rc = embps_evict(c, name, &n);
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
