/* redispeer.c - Redis as an embedding store, driven with the batches of
 * `embps bench`, for tests/bench/compare (needs hiredis).
 *
 *   redispeer --port P [--host H] [--rows R] [--dim D] [--batch B]
 *             [--zipf S] [--batches N] [--seconds T] [--warmup T]
 *             [--depth N] [--chunk C] [--mode pull|push|both] [--load]
 *             [--json]
 *
 * Row id i is the key "<i>" (decimal) holding dim float32s as one binary
 * string. --load first empties the database (FLUSHALL) and stores rows
 * 0..R-1 with pipelined MSETs; without it the rows must already be there.
 *   pull: a batch's U unique ids, as MGETs of --chunk keys each, all of the
 *         batch's commands pipelined; the values are copied out and their
 *         lengths checked.
 *   push: the same U ids with one gradient row each (the client's merged
 *         gradient; the merge itself is not timed), as EVALSHA of a Lua
 *         script per chunk that applies SGD (w -= lr * g) to those rows on
 *         the server: MGET, struct.unpack, update, struct.pack, MSET. It is
 *         atomic per chunk, not per batch. Before timing, one batch is
 *         pushed and a row read back to check the update.
 * Keys are formatted before timing. Up to --depth batches are in flight
 * (their commands written before the oldest batch's replies are read); a
 * batch's latency runs from its first command to its last reply.
 * Throughput: U rows per batch over the measured wall time, as rawbench.
 *
 * Output: a table, or with --json one line with the field names of
 * `embps bench --json`, plus load_seconds and used_memory_bytes. */
#define _GNU_SOURCE
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "benchutil.h"

#define PROG "redispeer"
#define MAX_DEPTH 16
#define KEY_LEN 24

static const char *SGD_LUA =
    "local lr = tonumber(ARGV[1])\n"
    "local d = tonumber(ARGV[2])\n"
    "local fmt = '<' .. string.rep('f', d)\n"
    "local rows = redis.call('MGET', unpack(KEYS))\n"
    "local kv = {}\n"
    "for i = 1, #KEYS do\n"
    "  local w = {struct.unpack(fmt, rows[i])}\n"
    "  local g = {struct.unpack(fmt, ARGV[i + 2])}\n"
    "  for j = 1, d do w[j] = w[j] - lr * g[j] end\n"
    "  kv[2 * i - 1] = KEYS[i]\n"
    "  kv[2 * i] = struct.pack(fmt, unpack(w, 1, d))\n"
    "end\n"
    "redis.call('MSET', unpack(kv))\n"
    "return #KEYS\n";

typedef struct {
  const char *host, *mode;
  int port;
  uint32_t dim, depth, n_batches, chunk;
  uint64_t rows, batch;
  double zipf, seconds, warmup;
  int load, json;
} opts_t;

typedef struct {
  redisContext *c;
  const opts_t *o;
  const bu_workload_t *w;
  char (*keys)[KEY_LEN]; /* per batch: n_unique keys, flattened */
  size_t *key_off;       /* first key of each batch */
  size_t *key_len;
  const float *grads;    /* max_unique x dim */
  float *out;            /* max_unique x dim, pulled rows land here */
  const char **argv;     /* scratch for one command */
  size_t *argl;
  char sha[48];
} ctx_t;

typedef struct {
  double rows_per_s, ids_per_s, p50, p99, p999;
  uint64_t requests;
} result_t;

/* Prints the problem and returns -1 unless r is a reply of type `want`. */
static int check(const ctx_t *x, const redisReply *r, int want,
                 const char *what) {
  if (!r) {
    fprintf(stderr, PROG ": %s: %s\n", what,
            x->c->errstr[0] ? x->c->errstr : "no reply");
    return -1;
  }
  if (r->type == REDIS_REPLY_ERROR) {
    fprintf(stderr, PROG ": %s: %s\n", what, r->str);
    return -1;
  }
  if (r->type != want) {
    fprintf(stderr, PROG ": %s: unexpected reply type %d\n", what, r->type);
    return -1;
  }
  return 0;
}

/* Reads one pipelined reply of type `want`; 0 or -1. */
static int get_reply(ctx_t *x, int want, const char *what,
                     redisReply **out) {
  void *r = NULL;
  if (redisGetReply(x->c, &r) != REDIS_OK)
    r = NULL;
  if (check(x, r, want, what)) {
    if (r)
      freeReplyObject(r);
    return -1;
  }
  *out = r;
  return 0;
}

static int load_rows(ctx_t *x, double *seconds) {
  const opts_t *o = x->o;
  redisReply *r = redisCommand(x->c, "FLUSHALL");
  if (check(x, r, REDIS_REPLY_STATUS, "FLUSHALL")) {
    if (r)
      freeReplyObject(r);
    return -1;
  }
  freeReplyObject(r);
  const uint32_t per = 1000, pipe = 8; /* keys per MSET, MSETs in flight */
  size_t rb = o->dim * sizeof(float);
  char (*kb)[KEY_LEN] = malloc(per * pipe * sizeof *kb);
  float *vals = malloc(per * pipe * rb);
  if (!kb || !vals) {
    free(kb);
    free(vals);
    fprintf(stderr, PROG ": out of memory for loading\n");
    return -1;
  }
  uint64_t t0 = bu_now_ns();
  int rc = 0;
  for (uint64_t id = 0; id < o->rows && !rc;) {
    uint32_t sent = 0;
    for (; sent < pipe && id < o->rows; sent++) {
      uint32_t m = 0, a = 0;
      x->argv[a] = "MSET";
      x->argl[a++] = 4;
      for (; m < per && id < o->rows; m++, id++) {
        size_t slot = (size_t)sent * per + m;
        float *v = vals + slot * o->dim;
        for (uint32_t j = 0; j < o->dim; j++)
          v[j] = (float)((id + j) % 1000) * 1e-3f;
        x->argv[a] = kb[slot];
        x->argl[a++] = (size_t)snprintf(kb[slot], KEY_LEN, "%" PRIu64, id);
        x->argv[a] = (const char *)v;
        x->argl[a++] = rb;
      }
      redisAppendCommandArgv(x->c, (int)a, x->argv, x->argl);
    }
    for (uint32_t q = 0; q < sent && !rc; q++) {
      rc = get_reply(x, REDIS_REPLY_STATUS, "MSET", &r);
      if (!rc)
        freeReplyObject(r);
    }
  }
  *seconds = (double)(bu_now_ns() - t0) / 1e9;
  free(kb);
  free(vals);
  return rc;
}

/* Appends the commands of one batch, `chunk` keys per command; returns how
 * many, or -1. */
static int append_batch(ctx_t *x, int push, uint32_t b, size_t chunk) {
  const opts_t *o = x->o;
  size_t n = x->w->n_unique[b], off = x->key_off[b];
  size_t rb = o->dim * sizeof(float);
  int cmds = 0;
  char nk[16], dimstr[16];
  snprintf(dimstr, sizeof dimstr, "%u", o->dim);
  for (size_t i = 0; i < n; i += chunk, cmds++) {
    size_t m = n - i < chunk ? n - i : chunk, a = 0;
    if (push) {
      snprintf(nk, sizeof nk, "%zu", m);
      x->argv[a] = "EVALSHA";
      x->argl[a++] = 7;
      x->argv[a] = x->sha;
      x->argl[a++] = strlen(x->sha);
      x->argv[a] = nk;
      x->argl[a++] = strlen(nk);
    } else {
      x->argv[a] = "MGET";
      x->argl[a++] = 4;
    }
    for (size_t j = 0; j < m; j++) {
      x->argv[a] = x->keys[off + i + j];
      x->argl[a++] = x->key_len[off + i + j];
    }
    if (push) {
      x->argv[a] = "0.01";
      x->argl[a++] = 4;
      x->argv[a] = dimstr;
      x->argl[a++] = strlen(dimstr);
      for (size_t j = 0; j < m; j++) {
        x->argv[a] = (const char *)(x->grads + (i + j) * o->dim);
        x->argl[a++] = rb;
      }
    }
    if (redisAppendCommandArgv(x->c, (int)a, x->argv, x->argl) != REDIS_OK) {
      fprintf(stderr, PROG ": out of memory for a command\n");
      return -1;
    }
  }
  return cmds;
}

/* Reads the replies of one batch's `cmds` commands. 0 or -1. */
static int finish_batch(ctx_t *x, int push, int cmds) {
  size_t rb = x->o->dim * sizeof(float), row = 0;
  for (int q = 0; q < cmds; q++) {
    redisReply *r;
    if (get_reply(x, push ? REDIS_REPLY_INTEGER : REDIS_REPLY_ARRAY,
                  push ? "EVALSHA" : "MGET", &r))
      return -1;
    for (size_t e = 0; !push && e < r->elements; e++, row++) {
      if (r->element[e]->type != REDIS_REPLY_STRING ||
          r->element[e]->len != rb) {
        fprintf(stderr, PROG ": MGET: a row is missing or has the wrong "
                        "size (was the table loaded with this --dim?)\n");
        freeReplyObject(r);
        return -1;
      }
      memcpy(x->out + row * x->o->dim, r->element[e]->str, rb);
    }
    freeReplyObject(r);
  }
  return 0;
}

static int run_phase(ctx_t *x, int push, result_t *res) {
  const opts_t *o = x->o;
  memset(res, 0, sizeof *res);
  bu_lat_t lat = {0};
  uint64_t started[MAX_DEPTH];
  uint32_t batch_of[MAX_DEPTH];
  int cmds[MAX_DEPTH];
  uint32_t next = 0;
  for (int measuring = 0; measuring < 2; measuring++) {
    uint64_t t0 = bu_now_ns(), last = t0, rows = 0, ids = 0;
    uint64_t end = t0 + (uint64_t)((measuring ? o->seconds : o->warmup) * 1e9);
    uint32_t head = 0, inflight = 0;
    for (;;) {
      if (bu_now_ns() < end && inflight < o->depth) {
        uint32_t s = (head + inflight) % o->depth;
        batch_of[s] = next++ % o->n_batches;
        started[s] = bu_now_ns();
        cmds[s] = append_batch(x, push, batch_of[s], o->chunk);
        if (cmds[s] < 0)
          goto fail;
        inflight++;
        continue;
      }
      if (!inflight)
        break;
      if (finish_batch(x, push, cmds[head]))
        goto fail;
      last = bu_now_ns();
      if (measuring) {
        bu_lat_add(&lat, (double)(last - started[head]) / 1e3);
        rows += x->w->n_unique[batch_of[head]];
        ids += x->w->batch;
        res->requests++;
      }
      head = (head + 1) % o->depth;
      inflight--;
    }
    double secs = (double)(last - t0) / 1e9;
    if (measuring && secs > 0) {
      res->rows_per_s = (double)rows / secs;
      res->ids_per_s = (double)ids / secs;
    }
  }
  if (lat.n) {
    qsort(lat.v, lat.n, sizeof *lat.v, bu_cmp_double);
    res->p50 = bu_pct(lat.v, lat.n, 0.50);
    res->p99 = bu_pct(lat.v, lat.n, 0.99);
    res->p999 = bu_pct(lat.v, lat.n, 0.999);
  }
  free(lat.v);
  return 0;
fail:
  free(lat.v);
  return -1;
}

/* Loads the script, pushes batch 0 once and checks its first row. */
static int prepare_push(ctx_t *x) {
  redisReply *r = redisCommand(x->c, "SCRIPT LOAD %s", SGD_LUA);
  if (check(x, r, REDIS_REPLY_STRING, "SCRIPT LOAD")) {
    if (r)
      freeReplyObject(r);
    return -1;
  }
  snprintf(x->sha, sizeof x->sha, "%s", r->str);
  freeReplyObject(r);
  const char *k = x->keys[x->key_off[0]];
  float before[2], after[2];
  for (int pass = 0; pass < 2; pass++) {
    r = redisCommand(x->c, "GET %b", k, x->key_len[x->key_off[0]]);
    if (check(x, r, REDIS_REPLY_STRING, "GET")) {
      if (r)
        freeReplyObject(r);
      return -1;
    }
    memcpy(pass ? after : before, r->str, sizeof before);
    freeReplyObject(r);
    if (pass)
      break;
    int cmds = append_batch(x, 1, 0, x->o->chunk); /* the whole batch */
    if (cmds < 0 || finish_batch(x, 1, cmds))
      return -1;
  }
  for (int j = 0; j < 2; j++) {
    float want = before[j] - 0.01f * x->grads[j];
    if (fabsf(after[j] - want) > 1e-6f * (1 + fabsf(want))) {
      fprintf(stderr, PROG ": the SGD script gave %g, expected %g\n",
              (double)after[j], (double)want);
      return -1;
    }
  }
  return 0;
}

static long long used_memory(ctx_t *x) {
  redisReply *r = redisCommand(x->c, "INFO memory");
  long long v = -1;
  if (r && r->type == REDIS_REPLY_STRING) {
    const char *p = strstr(r->str, "used_memory:");
    if (p)
      v = atoll(p + strlen("used_memory:"));
  }
  if (r)
    freeReplyObject(r);
  return v;
}

int main(int argc, char **argv) {
  opts_t o = {.host = "127.0.0.1", .mode = "both", .port = -1, .dim = 64,
              .depth = 2, .n_batches = 8, .chunk = 1000, .rows = 1000000,
              .batch = 65536, .zipf = 1.05, .seconds = 5, .warmup = 1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--json")) {
      o.json = 1;
      continue;
    }
    if (!strcmp(a, "--load")) {
      o.load = 1;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, PROG ": %s needs a value\n", a);
      return 2;
    }
    const char *v = argv[++i];
    double x;
    if (!strcmp(a, "--host")) {
      o.host = v;
      continue;
    }
    if (!strcmp(a, "--mode")) {
      if (strcmp(v, "pull") && strcmp(v, "push") && strcmp(v, "both")) {
        fprintf(stderr, PROG ": --mode is pull, push or both\n");
        return 2;
      }
      o.mode = v;
      continue;
    }
#define NUM_(flag, lo, hi, dst)                                                \
  if (!strcmp(a, flag)) {                                                      \
    if (bu_parse_num(PROG, flag, v, lo, hi, &x))                               \
      return 2;                                                                \
    dst = x;                                                                   \
    continue;                                                                  \
  }
    NUM_("--port", 1, 65535, o.port)
    NUM_("--batch", 1, 1 << 24, o.batch)
    NUM_("--rows", 1, 1e9, o.rows)
    NUM_("--dim", 1, 4096, o.dim)
    NUM_("--zipf", 0, 10, o.zipf)
    NUM_("--seconds", 0.05, 3600, o.seconds)
    NUM_("--warmup", 0, 600, o.warmup)
    NUM_("--depth", 1, MAX_DEPTH, o.depth)
    NUM_("--batches", 1, 1024, o.n_batches)
    NUM_("--chunk", 1, 2000, o.chunk) /* Lua's unpack() takes ~8000 */
#undef NUM_
    fprintf(stderr, PROG ": unknown option %s\n", a);
    return 2;
  }
  if (o.port < 0) {
    fprintf(stderr, PROG ": --port is needed\n");
    return 2;
  }
  ctx_t x = {.o = &o};
  x.c = redisConnect(o.host, o.port);
  if (!x.c || x.c->err) {
    fprintf(stderr, PROG ": connect %s:%d: %s\n", o.host, o.port,
            x.c ? x.c->errstr : "out of memory");
    return 1;
  }
  struct timeval tv = {120, 0};
  redisSetTimeout(x.c, tv);
  bu_workload_t w;
  int rc = bu_workload_make(&w, o.rows, o.batch, o.zipf, o.n_batches);
  x.w = &w;
  size_t total = 0;
  for (uint32_t b = 0; !rc && b < o.n_batches; b++)
    total += w.n_unique[b];
  size_t max_args = 2 * (size_t)(o.chunk > 1000 ? o.chunk : 1000) + 8;
  x.keys = rc ? NULL : malloc((total ? total : 1) * sizeof *x.keys);
  x.key_len = rc ? NULL : malloc((total ? total : 1) * sizeof *x.key_len);
  x.key_off = calloc(o.n_batches, sizeof *x.key_off);
  float *grads = rc ? NULL : malloc(w.max_unique * o.dim * sizeof *grads);
  x.grads = grads;
  x.out = rc ? NULL : malloc(w.max_unique * o.dim * sizeof *x.out);
  x.argv = malloc(max_args * sizeof *x.argv);
  x.argl = malloc(max_args * sizeof *x.argl);
  if (rc || !x.keys || !x.key_len || !x.key_off || !grads || !x.out ||
      !x.argv || !x.argl) {
    fprintf(stderr, PROG ": out of memory\n");
    return 1;
  }
  for (uint32_t b = 0, k = 0; b < o.n_batches; b++) {
    x.key_off[b] = k;
    for (size_t i = 0; i < w.n_unique[b]; i++, k++)
      x.key_len[k] = (size_t)snprintf(x.keys[k], KEY_LEN, "%" PRId64,
                                      w.uniq[b][i]);
  }
  uint64_t seed = 11;
  for (size_t i = 0; i < w.max_unique * o.dim; i++)
    grads[i] = (float)((bu_unit(&seed) - 0.5) * 1e-2);

  double load_s = 0;
  result_t pull = {0}, push = {0};
  int do_pull = strcmp(o.mode, "push") != 0, do_push = strcmp(o.mode, "pull");
  rc = o.load ? load_rows(&x, &load_s) : 0;
  if (!rc && do_pull)
    rc = run_phase(&x, 0, &pull);
  if (!rc && do_push)
    rc = prepare_push(&x);
  if (!rc && do_push)
    rc = run_phase(&x, 1, &push);
  long long mem = rc ? -1 : used_memory(&x);
  double unique = bu_unique_ratio(&w);
  redisFree(x.c);
  bu_workload_free(&w);
  free(x.keys);
  free(x.key_len);
  free(x.key_off);
  free(grads);
  free(x.out);
  free(x.argv);
  free(x.argl);
  if (rc)
    return 1;
  if (o.json) {
    printf("{\"tool\": \"redis\", \"batch\": %" PRIu64 ", \"rows\": %" PRIu64
           ", \"dim\": %u, \"zipf\": %g, \"seconds\": %g, \"depth\": %u, "
           "\"chunk\": %u, \"unique_ratio\": %.4f, "
           "\"unique_per_batch\": %.1f, \"load_seconds\": %.2f, "
           "\"used_memory_bytes\": %lld, "
           "\"pull_rows_per_s\": %.0f, \"pull_ids_per_s\": %.0f, "
           "\"pull_p50_us\": %.1f, \"pull_p99_us\": %.1f, "
           "\"push_rows_per_s\": %.0f, \"push_ids_per_s\": %.0f, "
           "\"push_p50_us\": %.1f, \"push_p99_us\": %.1f, "
           "\"pull_requests\": %" PRIu64 ", \"push_requests\": %" PRIu64
           "}\n",
           o.batch, o.rows, o.dim, o.zipf, o.seconds, o.depth, o.chunk,
           unique, unique * (double)o.batch, load_s, mem, pull.rows_per_s,
           pull.ids_per_s, pull.p50, pull.p99, push.rows_per_s,
           push.ids_per_s, push.p50, push.p99, pull.requests, push.requests);
  } else {
    printf("redispeer: batch %" PRIu64 " Zipf(%g) over %" PRIu64
           " rows (%.0f unique ids per batch), dim %u, depth %u, chunk %u, "
           "%g s per phase; used_memory %lld bytes\n",
           o.batch, o.zipf, o.rows, unique * (double)o.batch, o.dim, o.depth,
           o.chunk, o.seconds, mem);
    if (o.load)
      printf("loaded %" PRIu64 " rows in %.2f s\n", o.rows, load_s);
    printf("%-5s %14s %10s %10s %10s %9s\n", "", "unique rows/s", "p50 us",
           "p99 us", "p99.9 us", "batches");
    if (do_pull)
      printf("%-5s %14.0f %10.1f %10.1f %10.1f %9" PRIu64 "\n", "pull",
             pull.rows_per_s, pull.p50, pull.p99, pull.p999, pull.requests);
    if (do_push)
      printf("%-5s %14.0f %10.1f %10.1f %10.1f %9" PRIu64 "\n", "push",
             push.rows_per_s, push.p50, push.p99, push.p999, push.requests);
  }
  return 0;
}
