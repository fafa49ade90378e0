/* mf_demo.c - matrix factorization trained by worker processes against a
 * running embps-server. From the seed it plants a low-rank truth (signal
 * variance ~1), draws ratings u.v + N(0, noise^2) for Zipf-popular (user,
 * item) pairs and holds 10% out. The parent creates the "users" and "items"
 * tables, then fork()s the workers; each pulls its batches' rows, computes
 * the squared-error gradients locally, turns them into IndexedSlices with
 * embps_lookup_backward and pushes them, repeated ids and all (the server
 * sums them). Workers report each epoch through a pipe; the parent pulls all
 * rows, prints the held-out RMSE and passes if it ends within 1.2x the noise.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "embps/embps.h"
#include "embps/nn.h"

#define MAX_WORKERS 64
#define TARGET_RATIO 1.2

typedef struct {
  const char *servers;
  int workers, epochs, batch;
  uint64_t seed;
  int64_t users, items;
  uint32_t rank;
  double noise, lr, l2, init_std;
  size_t ratings;
} config_t;

typedef struct {
  int32_t user, item;
  float r;
} rating_t;

/* The synthetic data set; built before fork(), so every process holds the
 * same copy. */
typedef struct {
  float *u_true, *v_true; /* users x rank, items x rank */
  rating_t *all;
  size_t n_train, n_test; /* all[0..n_train) train, the rest held out */
} dataset_t;

/* One per worker per epoch, written whole to the worker's pipe. */
typedef struct {
  int32_t worker, epoch;
  double sse;     /* sum of squared errors of the epoch's predictions */
  uint64_t count; /* ratings seen */
  uint64_t rows;  /* rows pulled + pushed */
  double seconds; /* wall time of the epoch */
} report_t;

/* ------------------------------------------------------------------ util */

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints "mf-demo: message" with one write, so the lines of several
 * processes do not interleave; returns 1. */
static int fail(const char *fmt, ...) {
  char buf[1024];
  int n = snprintf(buf, sizeof buf, "mf-demo: ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = strlen(buf);
  buf[len++] = '\n';
  fflush(stdout);
  if (write(STDERR_FILENO, buf, len) < 0)
    return 1;
  return 1;
}

/* A failed library call: its code and the client's message. */
static int lib_fail(const char *who, const char *what, embps_client_t *c,
                    int rc) {
  const char *msg = c ? embps_client_last_error(c) : "";
  return fail("%s: %s failed: %s (%s)", who, what,
              msg[0] ? msg : embps_strerror(rc), embps_err_name(rc));
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* splitmix64: small, fast and identical everywhere. */
static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* Uniform in (0, 1). */
static double rng_unit(uint64_t *s) {
  return ((double)(rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double rng_normal(uint64_t *s) {
  double a = rng_unit(s), b = rng_unit(s);
  return sqrt(-2.0 * log(a)) * cos(6.283185307179586 * b);
}

static uint64_t rng_below(uint64_t *s, uint64_t n) { return rng_next(s) % n; }

static void *xmalloc(size_t n, size_t size) {
  if (n && size > SIZE_MAX / n)
    return NULL;
  size_t bytes = n * size;
  return malloc(bytes ? bytes : 1);
}

/* ------------------------------------------------------------- options */

static const char usage[] =
    "usage: embps-mf-demo [--servers H:P[,H:P...]] [--workers N] [--epochs N]\n"
    "                     [--seed S] [--users N] [--items N] [--rank K]\n"
    "                     [--noise X] [--ratings N] [--batch N] [--lr X]\n"
    "                     [--l2 X]\n";

static int parse_num(const char *flag, const char *v, double lo, double hi,
                     double *out) {
  char *end;
  errno = 0;
  double d = strtod(v, &end);
  if (errno || end == v || *end || !(d >= lo && d <= hi)) {
    fprintf(stderr, "mf-demo: %s \"%s\" is not a number in [%g, %g]\n", flag, v,
            lo, hi);
    return -1;
  }
  *out = d;
  return 0;
}

static int parse_int(const char *flag, const char *v, double lo, double hi,
                     double *out) {
  if (parse_num(flag, v, lo, hi, out))
    return -1;
  if (*out != floor(*out)) {
    fprintf(stderr, "mf-demo: %s \"%s\" is not a whole number\n", flag, v);
    return -1;
  }
  return 0;
}

static void config_defaults(config_t *c) {
  c->servers = NULL;
  c->workers = 2;
  c->epochs = 20;
  c->batch = 512;
  c->seed = 42;
  c->users = 10000;
  c->items = 4000;
  c->rank = 10;
  c->noise = 0.5;
  c->ratings = 3000000;
  c->lr = 0.1;
  c->l2 = 0.02;
  c->init_std = 0.1;
}

/* Returns 0, 1 for --help, or 2 for a bad command line. */
static int parse_args(int argc, char **argv, config_t *c) {
  config_defaults(c);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return 1;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "mf-demo: %s needs a value\n%s", a, usage);
      return 2;
    }
    const char *v = argv[++i];
    double d;
    int bad = 0;
    if (!strcmp(a, "--servers"))
      c->servers = v;
    else if (!strcmp(a, "--workers"))
      bad = parse_int(a, v, 1, MAX_WORKERS, &d) || (c->workers = (int)d, 0);
    else if (!strcmp(a, "--epochs"))
      bad = parse_int(a, v, 1, 10000, &d) || (c->epochs = (int)d, 0);
    else if (!strcmp(a, "--batch"))
      bad = parse_int(a, v, 1, 1 << 20, &d) || (c->batch = (int)d, 0);
    else if (!strcmp(a, "--seed"))
      bad = parse_int(a, v, 0, 9007199254740992.0, &d) ||
            (c->seed = (uint64_t)d, 0);
    else if (!strcmp(a, "--users"))
      bad = parse_int(a, v, 1, INT32_MAX, &d) || (c->users = (int64_t)d, 0);
    else if (!strcmp(a, "--items"))
      bad = parse_int(a, v, 1, INT32_MAX, &d) || (c->items = (int64_t)d, 0);
    else if (!strcmp(a, "--rank"))
      bad = parse_int(a, v, 1, 1024, &d) || (c->rank = (uint32_t)d, 0);
    else if (!strcmp(a, "--ratings"))
      bad = parse_int(a, v, 10, 1e9, &d) || (c->ratings = (size_t)d, 0);
    else if (!strcmp(a, "--noise"))
      bad = parse_num(a, v, 1e-3, 100, &c->noise);
    else if (!strcmp(a, "--lr"))
      bad = parse_num(a, v, 1e-6, 100, &c->lr);
    else if (!strcmp(a, "--l2"))
      bad = parse_num(a, v, 0, 100, &c->l2);
    else {
      fprintf(stderr, "mf-demo: unknown option %s\n%s", a, usage);
      return 2;
    }
    if (bad)
      return 2;
  }
  return 0;
}

/* ---------------------------------------------------------------- data */

/* Zipf-like popularity: P(rank k) ~ 1 / (k + 1)^s. cdf gets n entries. */
static void zipf_cdf(double *cdf, int64_t n, double s) {
  double sum = 0;
  for (int64_t k = 0; k < n; k++) {
    sum += pow((double)(k + 1), -s);
    cdf[k] = sum;
  }
  for (int64_t k = 0; k < n; k++)
    cdf[k] /= sum;
}

static int64_t zipf_draw(const double *cdf, int64_t n, uint64_t *rng) {
  double u = rng_unit(rng);
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (cdf[mid] < u)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* A random permutation, so the popular ids are spread over the id space. */
static void shuffle_ids(int32_t *perm, int64_t n, uint64_t *rng) {
  for (int64_t i = 0; i < n; i++)
    perm[i] = (int32_t)i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)rng_below(rng, (uint64_t)i + 1);
    int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

static float dot(const float *a, const float *b, uint32_t k) {
  float s = 0;
  for (uint32_t j = 0; j < k; j++)
    s += a[j] * b[j];
  return s;
}

static void fill_normal(float *w, size_t n, double std, uint64_t *rng) {
  for (size_t i = 0; i < n; i++)
    w[i] = (float)(std * rng_normal(rng));
}

static int dataset_make(const config_t *c, dataset_t *d) {
  memset(d, 0, sizeof *d);
  uint64_t rng = c->seed * 0x2545f4914f6cdd1dULL + 1;
  const uint32_t k = c->rank;
  d->u_true = xmalloc((size_t)c->users * k, sizeof *d->u_true);
  d->v_true = xmalloc((size_t)c->items * k, sizeof *d->v_true);
  d->all = xmalloc(c->ratings, sizeof *d->all);
  double *ucdf = xmalloc((size_t)c->users, sizeof *ucdf);
  double *icdf = xmalloc((size_t)c->items, sizeof *icdf);
  int32_t *uperm = xmalloc((size_t)c->users, sizeof *uperm);
  int32_t *iperm = xmalloc((size_t)c->items, sizeof *iperm);
  int rc = 0;
  if (!d->u_true || !d->v_true || !d->all || !ucdf || !icdf || !uperm ||
      !iperm) {
    rc = fail("out of memory for the data set");
    goto out;
  }
  /* entries ~ N(0, 1/sqrt(k)): u.v then has variance k * (1/sqrt(k))^2 = 1 */
  const double std = pow((double)k, -0.25);
  fill_normal(d->u_true, (size_t)c->users * k, std, &rng);
  fill_normal(d->v_true, (size_t)c->items * k, std, &rng);
  zipf_cdf(ucdf, c->users, 0.5);
  zipf_cdf(icdf, c->items, 0.8);
  shuffle_ids(uperm, c->users, &rng);
  shuffle_ids(iperm, c->items, &rng);
  for (size_t i = 0; i < c->ratings; i++) {
    int32_t u = uperm[zipf_draw(ucdf, c->users, &rng)];
    int32_t v = iperm[zipf_draw(icdf, c->items, &rng)];
    float r = dot(d->u_true + (size_t)u * k, d->v_true + (size_t)v * k, k);
    d->all[i] = (rating_t){u, v, r + (float)(c->noise * rng_normal(&rng))};
  }
  /* the ratings are i.i.d., so the last 10% are a random held-out set */
  d->n_test = c->ratings / 10;
  d->n_train = c->ratings - d->n_test;
out:
  free(ucdf);
  free(icdf);
  free(uperm);
  free(iperm);
  return rc;
}

static void dataset_free(dataset_t *d) {
  free(d->u_true);
  free(d->v_true);
  free(d->all);
}

/* RMSE of the held-out ratings under factors U (users x k), V (items x k). */
static double heldout_rmse(const dataset_t *d, const float *U, const float *V,
                           uint32_t k) {
  double sse = 0;
  for (size_t i = d->n_train; i < d->n_train + d->n_test; i++) {
    const rating_t *r = &d->all[i];
    double e = dot(U + (size_t)r->user * k, V + (size_t)r->item * k, k) - r->r;
    sse += e * e;
  }
  return sqrt(sse / (double)(d->n_test ? d->n_test : 1));
}

/* -------------------------------------------------------------- tables */

/* Whether a table of that name exists (so a rerun drops it without making
 * the server count a refused drop). */
static int table_exists(embps_client_t *cl, const char *name, int *exists) {
  embps_table_info_t *v;
  size_t n;
  int rc = embps_list_tables(cl, &v, &n);
  if (rc)
    return lib_fail("parent", "list-tables", cl, rc);
  *exists = 0;
  for (size_t i = 0; i < n; i++)
    *exists |= !strcmp(v[i].spec.name, name);
  free(v);
  return 0;
}

static int setup_tables(const config_t *c, embps_client_t *cl) {
  const char *names[2] = {"users", "items"};
  const int64_t rows[2] = {c->users, c->items};
  for (int t = 0; t < 2; t++) {
    int exists = 0, rc;
    if (table_exists(cl, names[t], &exists))
      return 1;
    if (exists && (rc = embps_drop_table(cl, names[t])) && rc != EMBPS_ENOTABLE)
      return lib_fail("parent", "drop-table", cl, rc);
    embps_table_spec_t spec;
    embps_table_spec_init(&spec, names[t], c->rank, EMBPS_OPT_ADAGRAD);
    spec.rows = (uint64_t)rows[t];
    spec.lr = c->lr;
    spec.initial_accumulator = 0.1;
    spec.init = EMBPS_INIT_NORMAL;
    spec.init_value = c->init_std;
    spec.seed = c->seed * 2 + (uint64_t)t;
    char why[256];
    rc = embps_table_spec_check(&spec, why, sizeof why);
    if (rc)
      return fail("table %s: %s", names[t], why);
    if ((rc = embps_create_table(cl, &spec)))
      return lib_fail("parent", "create-table", cl, rc);
  }
  return 0;
}

/* Pulls every row of both tables into U and V. */
static int pull_all(const config_t *c, embps_client_t *cl, float *U, float *V) {
  int64_t n = c->users > c->items ? c->users : c->items;
  int64_t *ids = xmalloc((size_t)n, sizeof *ids);
  if (!ids)
    return fail("out of memory for %" PRId64 " ids", n);
  for (int64_t i = 0; i < n; i++)
    ids[i] = i;
  int rc = embps_pull(cl, "users", ids, (size_t)c->users, U, c->rank);
  if (rc)
    lib_fail("parent", "pull users", cl, rc);
  else if ((rc = embps_pull(cl, "items", ids, (size_t)c->items, V, c->rank)))
    lib_fail("parent", "pull items", cl, rc);
  free(ids);
  return rc ? 1 : 0;
}

/* -------------------------------------------------------------- worker */

typedef struct {
  const config_t *c;
  const dataset_t *d;
  int w;
  char name[32]; /* "worker W", for messages */
  embps_client_t *cl;
  size_t lo, hi;        /* the worker's slice of the train ratings */
  size_t *order;        /* its shuffled positions, hi - lo of them */
  int64_t *uids, *iids; /* batch ids, with repeats */
  float *urows, *irows; /* pulled rows, one per position */
  float *ugrad, *igrad; /* d loss / d row, one per position */
  embps_slices_t ug, ig;
} worker_t;

static int worker_alloc(worker_t *wk) {
  const size_t b = (size_t)wk->c->batch, k = wk->c->rank;
  wk->order = xmalloc(wk->hi - wk->lo, sizeof *wk->order);
  wk->uids = xmalloc(b, sizeof *wk->uids);
  wk->iids = xmalloc(b, sizeof *wk->iids);
  wk->urows = xmalloc(b * k, sizeof *wk->urows);
  wk->irows = xmalloc(b * k, sizeof *wk->irows);
  wk->ugrad = xmalloc(b * k, sizeof *wk->ugrad);
  wk->igrad = xmalloc(b * k, sizeof *wk->igrad);
  embps_slices_init(&wk->ug, wk->c->rank);
  embps_slices_init(&wk->ig, wk->c->rank);
  if (!wk->order || !wk->uids || !wk->iids || !wk->urows || !wk->irows ||
      !wk->ugrad || !wk->igrad || embps_slices_reserve(&wk->ug, b) ||
      embps_slices_reserve(&wk->ig, b))
    return fail("worker %d: out of memory", wk->w);
  for (size_t i = 0; i < wk->hi - wk->lo; i++)
    wk->order[i] = wk->lo + i;
  return 0;
}

static void worker_free(worker_t *wk) {
  free(wk->order);
  free(wk->uids);
  free(wk->iids);
  free(wk->urows);
  free(wk->irows);
  free(wk->ugrad);
  free(wk->igrad);
  embps_slices_free(&wk->ug);
  embps_slices_free(&wk->ig);
  embps_client_destroy(wk->cl);
}

static void shuffle_order(size_t *v, size_t n, uint64_t *rng) {
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)rng_below(rng, i);
    size_t t = v[i - 1];
    v[i - 1] = v[j];
    v[j] = t;
  }
}

/* Both tables at once: two asynchronous calls in flight, then two waits. */
static int pull_pair(worker_t *wk, size_t n) {
  const uint32_t k = wk->c->rank;
  embps_ticket_t *tu, *ti;
  int rc = embps_pull_async(wk->cl, "users", wk->uids, n, wk->urows, k, &tu);
  if (rc)
    return lib_fail(wk->name, "pull users", wk->cl, rc);
  rc = embps_pull_async(wk->cl, "items", wk->iids, n, wk->irows, k, &ti);
  if (rc) {
    embps_wait(wk->cl, tu);
    return lib_fail(wk->name, "pull items", wk->cl, rc);
  }
  rc = embps_wait(wk->cl, tu);
  int rc2 = embps_wait(wk->cl, ti);
  if (rc)
    return lib_fail(wk->name, "pull users", wk->cl, rc);
  if (rc2)
    return lib_fail(wk->name, "pull items", wk->cl, rc2);
  return 0;
}

static int push_pair(worker_t *wk) {
  const uint32_t k = wk->c->rank;
  embps_ticket_t *tu, *ti;
  /* flags 0: the duplicates travel as they are and the server sums them */
  int rc = embps_push_async(wk->cl, "users", wk->ug.indices, wk->ug.n,
                            wk->ug.values, k, 0, &tu);
  if (rc)
    return lib_fail(wk->name, "push users", wk->cl, rc);
  rc = embps_push_async(wk->cl, "items", wk->ig.indices, wk->ig.n,
                        wk->ig.values, k, 0, &ti);
  if (rc) {
    embps_wait(wk->cl, tu);
    return lib_fail(wk->name, "push items", wk->cl, rc);
  }
  rc = embps_wait(wk->cl, tu);
  int rc2 = embps_wait(wk->cl, ti);
  if (rc)
    return lib_fail(wk->name, "push users", wk->cl, rc);
  if (rc2)
    return lib_fail(wk->name, "push items", wk->cl, rc2);
  return 0;
}

/* Squared-error loss 1/2 (u.v - r)^2 + l2/2 (|u|^2 + |v|^2) per rating:
 * fills the per-position gradients and returns the batch's sum of squared
 * errors (of the predictions before the update). */
static double batch_gradients(worker_t *wk, const size_t *pos, size_t n) {
  const uint32_t k = wk->c->rank;
  const float l2 = (float)wk->c->l2;
  double sse = 0;
  for (size_t i = 0; i < n; i++) {
    const rating_t *r = &wk->d->all[pos[i]];
    const float *u = wk->urows + i * k, *v = wk->irows + i * k;
    float *gu = wk->ugrad + i * k, *gv = wk->igrad + i * k;
    float e = dot(u, v, k) - r->r;
    sse += (double)e * e;
    for (uint32_t j = 0; j < k; j++) {
      gu[j] = e * v[j] + l2 * u[j];
      gv[j] = e * u[j] + l2 * v[j];
    }
  }
  return sse;
}

static int train_batch(worker_t *wk, const size_t *pos, size_t n, double *sse) {
  const uint32_t k = wk->c->rank;
  for (size_t i = 0; i < n; i++) {
    wk->uids[i] = wk->d->all[pos[i]].user;
    wk->iids[i] = wk->d->all[pos[i]].item;
  }
  if (pull_pair(wk, n))
    return 1;
  *sse += batch_gradients(wk, pos, n);
  wk->ug.n = wk->ig.n = 0;
  int rc = embps_lookup_backward(wk->uids, n, wk->ugrad, k, 0, 0, &wk->ug);
  if (!rc)
    rc = embps_lookup_backward(wk->iids, n, wk->igrad, k, 0, 0, &wk->ig);
  if (rc)
    return fail("worker %d: embps_lookup_backward: %s", wk->w,
                embps_strerror(rc));
  return push_pair(wk);
}

static int train_epoch(worker_t *wk, int epoch, report_t *rep) {
  const size_t n = wk->hi - wk->lo, b = (size_t)wk->c->batch;
  uint64_t rng = wk->c->seed ^ (0x51afd6ed4e3f7b21ULL * (uint64_t)(wk->w + 1)) ^
                 ((uint64_t)epoch << 32);
  shuffle_order(wk->order, n, &rng);
  memset(rep, 0, sizeof *rep);
  rep->worker = wk->w;
  rep->epoch = epoch;
  double t0 = now_s();
  for (size_t s = 0; s < n; s += b) {
    size_t m = n - s < b ? n - s : b;
    if (train_batch(wk, wk->order + s, m, &rep->sse))
      return 1;
    rep->count += m;
    rep->rows += 4 * (uint64_t)m; /* users + items, pulled and pushed */
  }
  rep->seconds = now_s() - t0;
  return 0;
}

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

/* The body of worker process w; returns its exit status. */
static int worker_main(const config_t *c, const dataset_t *d, int w, int fd) {
  worker_t wk = {.c = c, .d = d, .w = w};
  snprintf(wk.name, sizeof wk.name, "worker %d", w);
  wk.lo = d->n_train * (size_t)w / (size_t)c->workers;
  wk.hi = d->n_train * (size_t)(w + 1) / (size_t)c->workers;
  embps_client_options_t opts = {.size = sizeof opts, .servers = c->servers};
  char err[512];
  int rc = embps_client_create(&opts, &wk.cl, err, sizeof err);
  if (rc) {
    fail("worker %d: cannot connect: %s", w, err);
    return 1;
  }
  int status = worker_alloc(&wk);
  for (int e = 1; !status && e <= c->epochs; e++) {
    report_t rep;
    status = train_epoch(&wk, e, &rep);
    if (status)
      fail("worker %d: stopped in epoch %d", w, e);
    else if (write_all(fd, &rep, sizeof rep))
      status = fail("worker %d: cannot report to the parent: %s", w,
                    strerror(errno));
  }
  worker_free(&wk);
  return status;
}

/* -------------------------------------------------------------- parent */

typedef struct {
  pid_t pid;
  int fd;
} child_t;

static int read_all(int fd, void *buf, size_t len) {
  char *p = buf;
  while (len) {
    ssize_t r = read(fd, p, len);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    p += r;
    len -= (size_t)r;
  }
  return 0;
}

static int spawn_workers(const config_t *c, const dataset_t *d, child_t *kids) {
  fflush(stdout);
  fflush(stderr);
  for (int w = 0; w < c->workers; w++) {
    int p[2];
    if (pipe(p))
      return fail("pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
      close(p[0]);
      close(p[1]);
      return fail("fork: %s", strerror(errno));
    }
    if (pid == 0) {
      close(p[0]);
      for (int j = 0; j < w; j++)
        close(kids[j].fd);
      int status = worker_main(c, d, w, p[1]);
      close(p[1]);
      fflush(stdout);
      fflush(stderr);
      _exit(status);
    }
    close(p[1]);
    kids[w].pid = pid;
    kids[w].fd = p[0];
  }
  return 0;
}

/* Waits for every spawned child; returns the number that did not exit 0
 * (killing the others first when kill_all is set). */
static int reap_workers(const config_t *c, child_t *kids, int kill_all) {
  int bad = 0;
  for (int w = 0; w < c->workers; w++) {
    if (kids[w].pid <= 0)
      continue;
    if (kill_all)
      kill(kids[w].pid, SIGTERM);
  }
  for (int w = 0; w < c->workers; w++) {
    if (kids[w].pid <= 0)
      continue;
    int st;
    pid_t r;
    while ((r = waitpid(kids[w].pid, &st, 0)) < 0 && errno == EINTR)
      ;
    if (kids[w].fd >= 0)
      close(kids[w].fd);
    if (r < 0) {
      fail("waitpid worker %d: %s", w, strerror(errno));
      bad++;
    } else if (WIFEXITED(st) && WEXITSTATUS(st) != 0) {
      fail("worker %d (pid %d) failed with exit status %d", w, (int)kids[w].pid,
           WEXITSTATUS(st));
      bad++;
    } else if (WIFSIGNALED(st) && !(kill_all && WTERMSIG(st) == SIGTERM)) {
      fail("worker %d (pid %d) was killed by signal %d", w, (int)kids[w].pid,
           WTERMSIG(st));
      bad++;
    }
  }
  return bad;
}

/* RMSE of always predicting 0: the signal + noise spread. */
static double zero_rmse(const dataset_t *d) {
  double ss = 0;
  for (size_t i = d->n_train; i < d->n_train + d->n_test; i++)
    ss += (double)d->all[i].r * d->all[i].r;
  return sqrt(ss / (double)(d->n_test ? d->n_test : 1));
}

static void print_header(const config_t *c, const dataset_t *d) {
  double oracle = heldout_rmse(d, d->u_true, d->v_true, c->rank);
  printf("embps matrix factorization demo\n");
  printf("  data    %" PRId64 " users x %" PRId64 " items, rank %u, "
         "noise %.3g, seed %" PRIu64 "\n",
         c->users, c->items, c->rank, c->noise, c->seed);
  printf("          %zu ratings (Zipf-popular ids): %zu train, %zu held out\n",
         c->ratings, d->n_train, d->n_test);
  printf("  train   %d workers, %d epochs, batch %d, adagrad lr %.3g, "
         "l2 %.3g, init normal(%.3g)\n",
         c->workers, c->epochs, c->batch, c->lr, c->l2, c->init_std);
  printf("  held-out RMSE of the planted factors %.4f, of predicting 0 "
         "%.4f\n",
         oracle, zero_rmse(d));
  printf("  rows/s: rows pulled + pushed per second, summed over the "
         "workers\n\n");
  printf("%5s  %12s  %15s  %12s  %8s\n", "epoch", "train RMSE", "held-out RMSE",
         "rows/s", "time s");
  fflush(stdout);
}

/* Reads epoch e's report from every worker and prints its line. */
static int epoch_line(const config_t *c, const dataset_t *d, embps_client_t *cl,
                      child_t *kids, int e, float *U, float *V, double t0,
                      double *rmse) {
  double sse = 0, rate = 0;
  uint64_t count = 0;
  for (int w = 0; w < c->workers; w++) {
    report_t rep;
    if (read_all(kids[w].fd, &rep, sizeof rep))
      return fail("worker %d stopped before reporting epoch %d", w, e);
    if (rep.epoch != e || rep.worker != w)
      return fail("worker %d sent a report for epoch %d, expected %d", w,
                  rep.epoch, e);
    sse += rep.sse;
    count += rep.count;
    rate += rep.seconds > 0 ? (double)rep.rows / rep.seconds : 0;
  }
  if (pull_all(c, cl, U, V))
    return 1;
  *rmse = heldout_rmse(d, U, V, c->rank);
  printf("%5d  %12.4f  %15.4f  %12.0f  %8.1f\n", e,
         sqrt(sse / (double)(count ? count : 1)), *rmse, rate, now_s() - t0);
  fflush(stdout);
  return 0;
}

/* Connects, (re)creates the tables and disconnects: no connection crosses
 * fork(), every worker makes its own. */
static int prepare_tables(const config_t *c) {
  embps_client_options_t opts = {.size = sizeof opts, .servers = c->servers};
  embps_client_t *cl;
  char err[512];
  if (embps_client_create(&opts, &cl, err, sizeof err))
    return fail("%s", err);
  int rc = setup_tables(c, cl);
  embps_client_destroy(cl);
  return rc;
}

/* Runs the workers and prints one line per epoch; *rmse gets the last
 * held-out RMSE. Returns 0 only if every worker finished cleanly. */
static int train(const config_t *c, const dataset_t *d, float *U, float *V,
                 double t0, double *rmse) {
  child_t kids[MAX_WORKERS];
  for (int w = 0; w < MAX_WORKERS; w++)
    kids[w] = (child_t){.pid = -1, .fd = -1};
  embps_client_options_t opts = {.size = sizeof opts, .servers = c->servers};
  embps_client_t *cl = NULL;
  char err[512];
  int rc = spawn_workers(c, d, kids);
  if (!rc && embps_client_create(&opts, &cl, err, sizeof err))
    rc = fail("%s", err);
  for (int e = 1; !rc && e <= c->epochs; e++)
    rc = epoch_line(c, d, cl, kids, e, U, V, t0, rmse);
  if (reap_workers(c, kids, rc != 0))
    rc = 1;
  embps_client_destroy(cl);
  return rc;
}

/* The verdict: 0 if the held-out RMSE is within TARGET_RATIO x the noise. */
static int verdict(const config_t *c, double rmse, double seconds) {
  double ratio = rmse / c->noise;
  printf("\nplanted noise %.4f, final held-out RMSE %.4f, ratio %.3f "
         "(target <= %.1f), %.1f s\n",
         c->noise, rmse, ratio, TARGET_RATIO, seconds);
  if (ratio <= TARGET_RATIO) {
    printf("PASS: the workers recovered the planted factors up to the "
           "noise\n");
    return 0;
  }
  printf("FAIL: held-out RMSE %.4f is above %.1f x the noise (%.4f)\n", rmse,
         TARGET_RATIO, TARGET_RATIO * c->noise);
  return 1;
}

static int parent_main(const config_t *c, const dataset_t *d) {
  if (prepare_tables(c))
    return 1;
  float *U = xmalloc((size_t)c->users * c->rank, sizeof *U);
  float *V = xmalloc((size_t)c->items * c->rank, sizeof *V);
  int rc;
  if (!U || !V) {
    rc = fail("out of memory for the evaluation copy");
  } else {
    print_header(c, d);
    double t0 = now_s(), rmse = 0;
    rc = train(c, d, U, V, t0, &rmse);
    if (rc)
      fail("training failed");
    else
      rc = verdict(c, rmse, now_s() - t0);
  }
  free(U);
  free(V);
  return rc;
}

int main(int argc, char **argv) {
  config_t c;
  int rc = parse_args(argc, argv, &c);
  if (rc)
    return rc == 1 ? 0 : 2;
  if ((size_t)c.ratings < 10 * (size_t)c.workers)
    return fail("--ratings %zu is too few for %d workers", c.ratings,
                c.workers);
  dataset_t d;
  if (dataset_make(&c, &d)) {
    dataset_free(&d);
    return 1;
  }
  rc = parent_main(&c, &d);
  dataset_free(&d);
  return rc;
}
