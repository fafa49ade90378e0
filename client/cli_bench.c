/* cli_bench.c - `embps bench`: drives the servers with W worker threads
 * (one client each) doing pulls, then pushes, of Zipf-distributed batches,
 * and reports throughput (unique rows/s and requested ids/s), latency
 * percentiles and the batches' duplicate ratio.
 *
 * The workload is the baselines' (../shared/baselines/common.h): Zipf(s)
 * over ranks 1..R, rank r mapped to id (r-1)*2654435761 mod R so hot rows
 * are spread over the table (with --dynamic, ids are then mixed over the
 * whole int64 range). Batches are generated before timing starts;
 * each worker keeps --depth requests in flight so the wire never idles
 * while the server works. With --unique, each request carries only its
 * batch's distinct ids (a worker that deduplicates itself): the same bytes
 * as the raw-loopback baseline, which moves unique rows only. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "embps/embps.h"
#include "embps/nn.h"
#include "route.h"
#include "util.h"

#define SCATTER_PRIME 2654435761ULL
#define MAX_DEPTH 16

typedef struct {
  uint32_t workers, dim, depth, n_batches;
  uint64_t rows, batch;
  double zipf, seconds, warmup;
  embps_optimizer_t optimizer;
  const char *table, *mode;
  int json, keep, dynamic, no_prefill, unique;
  embps_table_spec_t policy; /* --admit-after, --max-rows, ... (cli_dyn.c) */
} bench_opts_t;

typedef struct {
  int64_t **ids;     /* n_batches x batch (x n_ids[b] with --unique) */
  size_t *n_ids;     /* ids sent per request for batch b */
  size_t *n_unique;  /* distinct ids of batch b */
  float *values;     /* batch x dim gradient rows (small, shared) */
} workload_t;

typedef struct {
  const bench_opts_t *o;
  const workload_t *w;
  const embps_client_options_t *copts;
  int push;
  uint32_t index;
  /* results */
  uint64_t requests, ids, rows;
  double elapsed_s; /* the measured phase, drain included */
  double *lat_us;
  size_t n_lat, cap_lat;
  int error;
  char message[512];
} worker_t;

/* ------------------------------------------------------------ workload */

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

static double unit(uint64_t *s) {
  return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0);
}

static int workload_make(const bench_opts_t *o, workload_t *w) {
  memset(w, 0, sizeof *w);
  double *cdf = malloc(o->rows * sizeof *cdf);
  w->ids = calloc(o->n_batches, sizeof *w->ids);
  w->n_unique = calloc(o->n_batches, sizeof *w->n_unique);
  w->n_ids = calloc(o->n_batches, sizeof *w->n_ids);
  w->values = malloc(o->batch * o->dim * sizeof *w->values);
  int64_t *scratch = malloc(o->batch * sizeof *scratch);
  if (!cdf || !w->ids || !w->n_unique || !w->n_ids || !w->values ||
      !scratch) {
    free(cdf);
    free(scratch);
    return -ENOMEM;
  }
  double acc = 0;
  for (uint64_t k = 0; k < o->rows; k++) {
    acc += pow((double)(k + 1), -o->zipf);
    cdf[k] = acc;
  }
  uint64_t seed = 42;
  for (uint32_t b = 0; b < o->n_batches; b++) {
    w->ids[b] = malloc(o->batch * sizeof **w->ids);
    if (!w->ids[b]) {
      free(cdf);
      free(scratch);
      return -ENOMEM;
    }
    for (uint64_t i = 0; i < o->batch; i++) {
      double u = unit(&seed) * acc;
      uint64_t lo = 0, hi = o->rows - 1;
      while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        if (cdf[mid] >= u)
          hi = mid;
        else
          lo = mid + 1;
      }
      uint64_t id = (lo * SCATTER_PRIME) % o->rows;
      /* dynamic tables: the same ids spread over the whole int64 range */
      w->ids[b][i] = o->dynamic ? (int64_t)embps_mix64(id) : (int64_t)id;
    }
    int64_t k = embps_unique(w->ids[b], o->batch, scratch, NULL);
    w->n_unique[b] = k > 0 ? (size_t)k : 0;
    w->n_ids[b] = o->batch;
    if (o->unique) { /* requests carry the distinct ids only */
      memcpy(w->ids[b], scratch, w->n_unique[b] * sizeof *scratch);
      w->n_ids[b] = w->n_unique[b];
    }
  }
  for (uint64_t i = 0; i < o->batch * o->dim; i++)
    w->values[i] = (float)((unit(&seed) - 0.5) * 1e-3);
  free(cdf);
  free(scratch);
  return 0;
}

static void workload_free(const bench_opts_t *o, workload_t *w) {
  if (w->ids)
    for (uint32_t b = 0; b < o->n_batches; b++)
      free(w->ids[b]);
  free(w->ids);
  free(w->n_unique);
  free(w->n_ids);
  free(w->values);
}

/* ------------------------------------------------------------ workers */

static void record(worker_t *k, double us) {
  if (k->n_lat == k->cap_lat) {
    size_t cap = k->cap_lat ? 2 * k->cap_lat : 1024;
    double *v = realloc(k->lat_us, cap * sizeof *v);
    if (!v)
      return;
    k->lat_us = v;
    k->cap_lat = cap;
  }
  k->lat_us[k->n_lat++] = us;
}

/* Runs one phase for `seconds` (or the warm-up when record == 0). */
static void *worker_main(void *arg) {
  worker_t *k = arg;
  const bench_opts_t *o = k->o;
  embps_client_t *c;
  char err[512];
  int rc = embps_client_create(k->copts, &c, err, sizeof err);
  if (rc) {
    k->error = rc;
    snprintf(k->message, sizeof k->message, "%s", err);
    return NULL;
  }
  float *out[MAX_DEPTH] = {0};
  for (uint32_t d = 0; d < o->depth && !k->push; d++) {
    out[d] = malloc(o->batch * o->dim * sizeof(float));
    if (!out[d]) {
      k->error = -ENOMEM;
      goto done;
    }
  }
  embps_ticket_t *tickets[MAX_DEPTH];
  uint64_t started[MAX_DEPTH];
  uint32_t batch_of[MAX_DEPTH];
  uint32_t next = k->index * 7919u; /* workers start on different batches */
  for (int phase = 0; phase < 2 && !k->error; phase++) {
    int measuring = phase == 1;
    double seconds = measuring ? o->seconds : o->warmup;
    uint64_t phase_start = embps_now_ns();
    uint64_t end = phase_start + (uint64_t)(seconds * 1e9);
    uint32_t inflight = 0, head = 0;
    for (;;) {
      int more = embps_now_ns() < end;
      if (more && inflight < o->depth) {
        uint32_t slot = (head + inflight) % o->depth;
        uint32_t b = next++ % o->n_batches;
        started[slot] = embps_now_ns();
        batch_of[slot] = b;
        size_t n = k->w->n_ids[b];
        rc = k->push ? embps_push_async(c, o->table, k->w->ids[b], n,
                                        k->w->values, o->dim, 0,
                                        &tickets[slot])
                     : embps_pull_async(c, o->table, k->w->ids[b], n,
                                        out[slot], o->dim, &tickets[slot]);
        if (rc)
          break;
        inflight++;
        continue;
      }
      if (!inflight)
        break;
      rc = embps_wait(c, tickets[head]); /* frees the ticket, even failed */
      uint32_t done_slot = head;
      head = (head + 1) % o->depth;
      inflight--;
      if (rc)
        break;
      if (measuring) {
        record(k, (double)(embps_now_ns() - started[done_slot]) / 1e3);
        k->requests++;
        k->ids += k->w->n_ids[batch_of[done_slot]];
        k->rows += k->w->n_unique[batch_of[done_slot]];
      }
    }
    if (measuring)
      k->elapsed_s = (double)(embps_now_ns() - phase_start) / 1e9;
    if (rc) {
      k->error = rc;
      snprintf(k->message, sizeof k->message, "%s",
               embps_client_last_error(c));
      while (inflight--) { /* collect what is still out */
        embps_wait(c, tickets[head]);
        head = (head + 1) % o->depth;
      }
    }
  }
done:
  for (uint32_t d = 0; d < MAX_DEPTH; d++)
    free(out[d]);
  embps_client_destroy(c);
  return NULL;
}

/* ------------------------------------------------------------ reporting */

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double pct(const double *v, size_t n, double p) {
  if (!n)
    return 0;
  size_t i = (size_t)(p * (double)(n - 1) + 0.5);
  return v[i < n ? i : n - 1];
}

typedef struct {
  double rows_per_s, ids_per_s, p50, p99, p999, max;
  uint64_t requests;
} phase_result_t;

static int run_phase(const bench_opts_t *o, const workload_t *w,
                     const embps_client_options_t *copts, int push,
                     phase_result_t *r) {
  worker_t *k = calloc(o->workers, sizeof *k);
  pthread_t *th = calloc(o->workers, sizeof *th);
  if (!k || !th) {
    free(k);
    free(th);
    return -ENOMEM;
  }
  for (uint32_t i = 0; i < o->workers; i++) {
    k[i] = (worker_t){.o = o, .w = w, .copts = copts, .push = push,
                      .index = i};
    pthread_create(&th[i], NULL, worker_main, &k[i]);
  }
  int rc = 0;
  size_t n_lat = 0;
  memset(r, 0, sizeof *r);
  uint64_t ids = 0, rows = 0;
  double elapsed = 0;
  for (uint32_t i = 0; i < o->workers; i++) {
    pthread_join(th[i], NULL);
    if (k[i].error && !rc) {
      rc = k[i].error;
      fprintf(stderr, "embps: bench worker %u: %s\n", i, k[i].message);
    }
    n_lat += k[i].n_lat;
    if (k[i].elapsed_s > elapsed)
      elapsed = k[i].elapsed_s;
    ids += k[i].ids;
    rows += k[i].rows;
    r->requests += k[i].requests;
  }
  double *lat = malloc((n_lat ? n_lat : 1) * sizeof *lat);
  size_t m = 0;
  for (uint32_t i = 0; i < o->workers; i++) {
    if (lat)
      memcpy(lat + m, k[i].lat_us, k[i].n_lat * sizeof *lat);
    m += k[i].n_lat;
    free(k[i].lat_us);
  }
  if (lat) {
    qsort(lat, n_lat, sizeof *lat, cmp_double);
    r->p50 = pct(lat, n_lat, 0.50);
    r->p99 = pct(lat, n_lat, 0.99);
    r->p999 = pct(lat, n_lat, 0.999);
    r->max = n_lat ? lat[n_lat - 1] : 0;
  }
  if (elapsed <= 0)
    elapsed = o->seconds;
  r->rows_per_s = (double)rows / elapsed;
  r->ids_per_s = (double)ids / elapsed;
  free(lat);
  free(k);
  free(th);
  return rc;
}

/* Pushes a zero gradient once to every id the workload uses, so the
 * measurement sees steady state: those rows materialised and their pages
 * touched (a first touch costs a page fault and zeroing). It is one
 * optimizer step per batch, like any push. */
static int prefill(embps_client_t *c, const bench_opts_t *o,
                   const workload_t *w) {
  float *zeros = calloc(o->batch * o->dim, sizeof *zeros);
  int rc = zeros ? 0 : -ENOMEM;
  for (uint32_t b = 0; !rc && b < o->n_batches; b++)
    rc = embps_push(c, o->table, w->ids[b], w->n_ids[b], zeros, o->dim,
                    EMBPS_PUSH_MERGE);
  free(zeros);
  return rc;
}

static int set_mode(const embps_flag_t *f, const char *v, void *obj,
                    char *err, size_t err_len) {
  if (strcmp(v, "pull") && strcmp(v, "push") && strcmp(v, "both"))
    return embps_flag_refuse(f, v, err, err_len);
  ((bench_opts_t *)obj)->mode = v;
  return 0;
}

static int set_optimizer(const embps_flag_t *f, const char *v, void *obj,
                         char *err, size_t err_len) {
  return embps_optimizer_parse(v, &((bench_opts_t *)obj)->optimizer)
             ? embps_flag_refuse(f, v, err, err_len)
             : 0;
}

#define OPTS bench_opts_t
#define COUNT_(name, arg, field, lo, hi, help)                                 \
  EMBPS_FLAG_NUMBER(name, arg, embps_flag_set_count, OPTS, field, lo, hi,      \
                    NULL, help)
#define REAL_(name, arg, field, lo, hi, help)                                  \
  EMBPS_FLAG_NUMBER(name, arg, embps_flag_set_double, OPTS, field, lo, hi,     \
                    NULL, help)
static const embps_flag_t bench_flags[] = {
    COUNT_("workers", "W", workers, 1, 256,
           "worker threads, one client each (default 1)"),
    COUNT_("batch", "B", batch, 1, 16777216, "ids per request (default 65536)"),
    COUNT_("rows", "R", rows, 1, 1e12,
           "the Zipf distribution's ranks: ids 0..R-1 (default 10000000)"),
    COUNT_("dim", "D", dim, 1, EMBPS_DIM_MAX, "the table's dim (default 64)"),
    REAL_("zipf", "S", zipf, 0, 10, "the Zipf exponent (default 1.05)"),
    {"optimizer", "sgd|adagrad|adam|ftrl",
     "the table's optimizer (default "
     "adagrad)",
     set_optimizer, 0, 0, 0, 0, 0, "sgd|adagrad|adam|ftrl"},
    REAL_("seconds", "T", seconds, 0.1, 3600,
          "measured time per phase (default 5)"),
    REAL_("warmup", "T", warmup, 0, 600,
          "unmeasured time before each phase (default 1)"),
    COUNT_("depth", "N", depth, 1, MAX_DEPTH,
           "requests each worker keeps in flight (default 2)"),
    COUNT_("batches", "N", n_batches, 1, 1024,
           "distinct batches generated, then sent in turn (default 8)"),
    {"mode", "pull|push|both", "the phases to run (default both)", set_mode, 0,
     0, 0, 0, 0, "pull|push|both"},
    EMBPS_FLAG_STRING("table", "NAME", OPTS, table,
                      "the table to create, or reuse when it has this shape "
                      "(default embps_bench)"),
    EMBPS_FLAG_TRUE("keep", OPTS, keep, "do not drop the table it created"),
    EMBPS_FLAG_TRUE("no-prefill", OPTS, no_prefill,
                    "do not push every row of the workload once first"),
    EMBPS_FLAG_TRUE("unique", OPTS, unique,
                    "requests carry their batch's distinct ids only"),
    EMBPS_FLAG_TRUE("dynamic", OPTS, dynamic,
                    "a dynamic table (ids spread over int64); so does any "
                    "flag below"),
    EMBPS_FLAG_TRUE("json", OPTS, json, "print one JSON object"),
    EMBPS_FLAG_END};

/* bench's flags, then create-table's admission and eviction ones */
const embps_flag_group_t embps_cli_bench_groups[] = {
    {bench_flags, 0},
    {embps_cli_dyn_flags, offsetof(bench_opts_t, policy)},
    {NULL, 0}};

int embps_cli_bench(const embps_client_options_t *copts, int argc,
                    char **argv) {
  bench_opts_t o = {.workers = 1, .dim = 64, .depth = 2, .n_batches = 8,
                    .rows = 10000000, .batch = 65536, .zipf = 1.05,
                    .seconds = 5, .warmup = 1,
                    .optimizer = EMBPS_OPT_ADAGRAD, .table = "embps_bench",
                    .mode = "both"};
  embps_flags_t p;
  char err[512];
  if (embps_flags_parse(&p, embps_cli_bench_groups, &o, argc, argv, "bench",
                        err, sizeof err)) {
    fprintf(stderr, "embps: %s (see embps --help)\n", err);
    return 2;
  }
  if (p.next < argc) {
    fprintf(stderr, "embps: unexpected argument \"%s\" for bench (see embps "
            "--help)\n", argv[p.next]);
    return 2;
  }
  if (p.seen[1]) /* admission and eviction need a dynamic table */
    o.dynamic = 1;

  embps_client_t *admin;
  int rc = embps_client_create(copts, &admin, err, sizeof err);
  if (rc) {
    fprintf(stderr, "embps: %s\n", err);
    return 1;
  }
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, o.table, o.dim, o.optimizer);
  spec.rows = o.dynamic ? 0 : o.rows;
  spec.dynamic = o.dynamic;
  spec.lr = 0.01;
  spec.admit_after = o.policy.admit_after;
  spec.admit_probability = o.policy.admit_probability;
  spec.admit_sketch_bytes = o.policy.admit_sketch_bytes;
  spec.ttl_steps = o.policy.ttl_steps;
  spec.max_rows = o.policy.max_rows;
  spec.evict = o.policy.evict;
  spec.evict_l2_below = o.policy.evict_l2_below;
  rc = embps_create_table(admin, &spec);
  int created = rc == 0;
  if (rc == EMBPS_EEXIST) { /* reuse it only if it is the table asked for */
    embps_table_info_t info;
    rc = embps_describe_table(admin, o.table, &info);
    if (!rc && (info.spec.dim != o.dim || info.spec.dynamic != o.dynamic ||
                (!o.dynamic && info.spec.rows != o.rows))) {
      fprintf(stderr, "embps: bench: table \"%s\" exists with another "
              "shape; drop it or pass --table\n", o.table);
      embps_client_destroy(admin);
      return 1;
    }
  }
  if (rc) {
    fprintf(stderr, "embps: bench: %s\n", embps_client_last_error(admin));
    embps_client_destroy(admin);
    return 1;
  }
  workload_t w;
  if (workload_make(&o, &w)) {
    fprintf(stderr, "embps: bench: out of memory for the workload\n");
    embps_client_destroy(admin);
    return 1;
  }
  double unique = 0;
  for (uint32_t b = 0; b < o.n_batches; b++)
    unique += (double)w.n_unique[b];
  unique /= (double)o.n_batches * (double)o.batch;

  double prefill_s = 0;
  if (!o.no_prefill) {
    uint64_t t0 = embps_now_ns();
    rc = prefill(admin, &o, &w);
    prefill_s = (double)(embps_now_ns() - t0) / 1e9;
    if (rc) {
      fprintf(stderr, "embps: bench prefill: %s\n",
              embps_client_last_error(admin));
      embps_client_destroy(admin);
      workload_free(&o, &w);
      return 1;
    }
  }
  phase_result_t pull = {0}, push = {0};
  int do_pull = strcmp(o.mode, "push") != 0, do_push = strcmp(o.mode, "pull");
  if (do_pull)
    rc = run_phase(&o, &w, copts, 0, &pull);
  if (!rc && do_push)
    rc = run_phase(&o, &w, copts, 1, &push);
  /* what admission and eviction did meanwhile (zeros without a policy) */
  embps_table_info_t after;
  memset(&after, 0, sizeof after);
  if (!rc && o.dynamic && embps_describe_table(admin, o.table, &after))
    memset(&after, 0, sizeof after);
  if (created && !o.keep)
    embps_drop_table(admin, o.table);
  embps_client_destroy(admin);
  workload_free(&o, &w);
  if (rc)
    return 1;

  if (o.json) {
    printf("{\"workers\": %u, \"batch\": %" PRIu64 ", \"rows\": %" PRIu64
           ", \"dim\": %u, \"zipf\": %g, \"optimizer\": \"%s\", "
           "\"seconds\": %g, \"depth\": %u, \"dynamic\": %s, "
           "\"prefill_s\": %.2f, \"unique_requests\": %s, "
           "\"unique_ratio\": %.6f, "
           "\"pull_rows_per_s\": %.0f, \"pull_ids_per_s\": %.0f, "
           "\"pull_p50_us\": %.1f, \"pull_p99_us\": %.1f, "
           "\"pull_p999_us\": %.1f, "
           "\"push_rows_per_s\": %.0f, \"push_ids_per_s\": %.0f, "
           "\"push_p50_us\": %.1f, \"push_p99_us\": %.1f, "
           "\"push_p999_us\": %.1f, \"warmup\": %g, \"batches\": %u, "
           "\"pull_requests\": %" PRIu64 ", \"push_requests\": %" PRIu64
           ", \"pull_max_us\": %.1f, \"push_max_us\": %.1f, "
           "\"admit_after\": %u, \"max_rows\": %" PRIu64
           ", \"rows_held\": %" PRIu64 ", \"rows_admitted\": %" PRIu64
           ", \"evicted_capacity\": %" PRIu64 ", \"evicted_ttl\": %" PRIu64
           ", \"evict_stall_max_us\": %" PRIu64 "}\n",
           o.workers, o.batch, o.rows, o.dim, o.zipf,
           embps_optimizer_name(o.optimizer), o.seconds, o.depth,
           o.dynamic ? "true" : "false", prefill_s,
           o.unique ? "true" : "false", unique, pull.rows_per_s,
           pull.ids_per_s, pull.p50, pull.p99, pull.p999, push.rows_per_s,
           push.ids_per_s, push.p50, push.p99, push.p999, o.warmup,
           o.n_batches, pull.requests, push.requests, pull.max, push.max,
           o.policy.admit_after, o.policy.max_rows, after.rows_allocated,
           after.rows_admitted, after.evicted_capacity, after.evicted_ttl,
           after.evict_stall_max_us);
  } else {
    printf("embps bench: %u worker(s), batch %" PRIu64 " Zipf(%g) over %"
           PRIu64 " rows, dim %u, %s, %g s per phase, depth %u\n",
           o.workers, o.batch, o.zipf, o.rows, o.dim,
           embps_optimizer_name(o.optimizer), o.seconds, o.depth);
    printf("unique ids per batch: %.1f%%", 100 * unique);
    if (prefill_s > 0)
      printf("; their rows prefilled in %.1f s", prefill_s);
    printf("\n");
    printf("%-5s %14s %14s %10s %10s %10s %9s\n", "", "unique rows/s",
           "ids/s", "p50 us", "p99 us", "p99.9 us", "requests");
    if (do_pull)
      printf("%-5s %14.0f %14.0f %10.1f %10.1f %10.1f %9" PRIu64 "\n", "pull",
             pull.rows_per_s, pull.ids_per_s, pull.p50, pull.p99, pull.p999,
             pull.requests);
    if (do_push)
      printf("%-5s %14.0f %14.0f %10.1f %10.1f %10.1f %9" PRIu64 "\n", "push",
             push.rows_per_s, push.ids_per_s, push.p50, push.p99, push.p999,
             push.requests);
    if (after.rows_admitted || after.evicted_capacity || after.evicted_ttl)
      printf("table: %" PRIu64 " rows held, %" PRIu64 " admitted, %" PRIu64
             " evicted for capacity and %" PRIu64 " by TTL, longest eviction "
             "stall %" PRIu64 " us\n",
             after.rows_allocated, after.rows_admitted, after.evicted_capacity,
             after.evicted_ttl, after.evict_stall_max_us);
  }
  return 0;
}
