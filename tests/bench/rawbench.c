/* rawbench.c - the loopback limit for embps's traffic: a server that does
 * nothing but move bytes, and a client that moves the bytes of an
 * `embps bench` run with the same pipelining.
 *
 *   rawbench server [--listen HOST:PORT] [--port-file FILE]
 *   rawbench client --port P [--host H] [--mode pull|push|both]
 *            [--workers W] [--batch B] [--rows R] [--dim D] [--zipf S]
 *            [--batches N] [--seconds T] [--warmup T] [--depth N]
 *            [--push-rows unique|batch] [--json]
 *
 * The batches are those of `embps bench` with the same options (see
 * benchutil.h); U is a batch's number of unique ids.
 *   pull: the client sends a 16-byte header and U ids (8 bytes each); the
 *         server answers a 16-byte header and U x dim x 4 bytes.
 *   push: the client sends a 16-byte header, the ids and one dim x 4-byte
 *         row per id; the server answers a 16-byte header. The ids are the
 *         U unique ids (--push-rows unique, the default) or the whole batch
 *         with its duplicates (--push-rows batch: what `embps bench` sends,
 *         as it pushes without EMBPS_PUSH_MERGE).
 * embps's frames add a few dozen bytes of protobuf to each of these.
 *
 * The server answers each connection's requests in order from one thread
 * per connection and never looks at the payload; its reply rows come from a
 * buffer filled once. The client is like libembps: one non-blocking socket
 * per worker thread, TCP_NODELAY, up to --depth requests in flight, each
 * reply read into its own reply buffer. A request's latency runs from its
 * issue to the last byte of its reply. Throughput counts U rows per request
 * (as `embps bench` counts unique rows) over the measured wall time: from
 * the end of the warm-up to the arrival of the last reply.
 *
 * Output: a table, or with --json one line with the field names of
 * `embps bench --json` (pull_rows_per_s, pull_p50_us, ...) plus
 * *_bytes_per_s (payload bytes both ways). Exit 0, or 1 with a message.
 * Loopback only: the header is in host byte order. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "benchutil.h"

#define PROG "rawbench"
#define MAGIC 0x42574152u /* "RAWB" */
#define KIND_PULL 1
#define KIND_PUSH 2
#define KIND_REPLY 0x80
#define MAX_DEPTH 16
#define MAX_IDS (1u << 26)
#define MAX_DIM 65536u
#define MAX_BYTES (1ULL << 31) /* largest request body or reply */
#define STALL_MS 30000         /* no progress for this long: give up */

typedef struct {
  uint32_t magic;
  uint16_t kind, flags;
  uint32_t n, dim; /* ids in the request; floats per row */
} hdr_t;

_Static_assert(sizeof(hdr_t) == 16, "the header is 16 bytes");

/* ------------------------------------------------------------ I/O helpers */

/* Reads exactly len bytes from a blocking fd. 0, or -1 on EOF or error. */
static int read_full(int fd, void *buf, size_t len) {
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

/* Advances iov[*first..cnt) past `done` bytes. */
static void iov_advance(struct iovec *iov, int *first, int cnt, size_t done) {
  while (*first < cnt && done >= iov[*first].iov_len) {
    done -= iov[*first].iov_len;
    iov[*first].iov_len = 0;
    (*first)++;
  }
  if (*first < cnt) {
    iov[*first].iov_base = (char *)iov[*first].iov_base + done;
    iov[*first].iov_len -= done;
  }
}

/* Writes all of iov[0..cnt) to a blocking fd (modifies iov). 0 or -1. */
static int writev_full(int fd, struct iovec *iov, int cnt) {
  int first = 0;
  while (first < cnt) {
    ssize_t r = writev(fd, iov + first, cnt - first);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return -1;
    iov_advance(iov, &first, cnt, (size_t)r);
  }
  return 0;
}

/* Grows *buf to at least len bytes; new bytes are set to `fill` when
 * fill >= 0 (so replies come from real, distinct pages). 0 or -ENOMEM. */
static int grow(char **buf, size_t *cap, size_t len, int fill) {
  if (len <= *cap)
    return 0;
  char *p = realloc(*buf, len);
  if (!p)
    return -ENOMEM;
  if (fill >= 0)
    memset(p + *cap, fill, len - *cap);
  *buf = p;
  *cap = len;
  return 0;
}

/* Parses "HOST:PORT" (IPv4). 0 or -1. */
static int parse_addr(const char *s, struct sockaddr_in *a) {
  const char *colon = strrchr(s, ':');
  char host[64];
  if (!colon || (size_t)(colon - s) >= sizeof host)
    return -1;
  memcpy(host, s, (size_t)(colon - s));
  host[colon - s] = 0;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  memset(a, 0, sizeof *a);
  a->sin_family = AF_INET;
  a->sin_port = htons((uint16_t)port);
  if (*end || port < 0 || port > 65535 ||
      inet_pton(AF_INET, host, &a->sin_addr) != 1)
    return -1;
  return 0;
}

/* ------------------------------------------------------------ server */

/* Serves one connection until EOF or a bad header; owns and closes fd. */
static void *conn_main(void *arg) {
  int fd = (int)(intptr_t)arg;
  char *body = NULL, *rows = NULL;
  size_t body_cap = 0, rows_cap = 0;
  hdr_t h;
  while (read_full(fd, &h, sizeof h) == 0) {
    if (h.magic != MAGIC || (h.kind != KIND_PULL && h.kind != KIND_PUSH) ||
        h.n > MAX_IDS || h.dim == 0 || h.dim > MAX_DIM) {
      fprintf(stderr, PROG ": server: bad header, closing the connection\n");
      break;
    }
    uint64_t row_bytes = (uint64_t)h.dim * sizeof(float);
    uint64_t in = (uint64_t)h.n * (sizeof(int64_t) +
                                   (h.kind == KIND_PUSH ? row_bytes : 0));
    uint64_t out = h.kind == KIND_PULL ? (uint64_t)h.n * row_bytes : 0;
    if (in > MAX_BYTES || out > MAX_BYTES ||
        grow(&body, &body_cap, (size_t)in, -1) ||
        grow(&rows, &rows_cap, (size_t)out, 0x3c) ||
        read_full(fd, body, (size_t)in))
      break;
    hdr_t r = {MAGIC, (uint16_t)(h.kind | KIND_REPLY), 0, h.n, h.dim};
    struct iovec iov[2] = {{&r, sizeof r}, {rows, (size_t)out}};
    if (writev_full(fd, iov, out ? 2 : 1))
      break;
  }
  close(fd);
  free(body);
  free(rows);
  return NULL;
}

static int write_port_file(const char *path, int port) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return -1;
  FILE *f = fopen(tmp, "w");
  if (!f)
    return -1;
  int bad = fprintf(f, "%d\n", port) < 0;
  bad |= fclose(f) != 0;
  return bad || rename(tmp, path) ? -1 : 0;
}

static int server_main(int argc, char **argv) {
  const char *listen_at = "127.0.0.1:0", *port_file = NULL;
  for (int i = 0; i < argc; i++) {
    if (i + 1 < argc && !strcmp(argv[i], "--listen"))
      listen_at = argv[++i];
    else if (i + 1 < argc && !strcmp(argv[i], "--port-file"))
      port_file = argv[++i];
    else {
      fprintf(stderr, PROG ": server: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  struct sockaddr_in a;
  if (parse_addr(listen_at, &a)) {
    fprintf(stderr, PROG ": server: bad --listen \"%s\"\n", listen_at);
    return 2;
  }
  int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
  socklen_t alen = sizeof a;
  if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
      bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 64) ||
      getsockname(ls, (struct sockaddr *)&a, &alen)) {
    fprintf(stderr, PROG ": server: %s: %s\n", listen_at, strerror(errno));
    return 1;
  }
  int port = ntohs(a.sin_port);
  if (port_file && write_port_file(port_file, port)) {
    fprintf(stderr, PROG ": server: cannot write %s\n", port_file);
    return 1;
  }
  printf(PROG " server ready on port %d\n", port);
  fflush(stdout);
  for (;;) {
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      fprintf(stderr, PROG ": server: accept: %s\n", strerror(errno));
      return 1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, conn_main, (void *)(intptr_t)fd))
      close(fd);
    pthread_attr_destroy(&attr);
  }
}

/* ------------------------------------------------------------ client */

typedef struct {
  struct sockaddr_in addr;
  const char *mode;
  uint32_t workers, dim, depth, n_batches;
  uint64_t rows, batch;
  double zipf, seconds, warmup;
  int push_full, json;
} opts_t;

typedef struct {
  hdr_t hdr;
  struct iovec iov[3]; /* request: header, ids, rows */
  int iov_first, iov_cnt;
  struct iovec rx[2]; /* reply: header, rows */
  int rx_first, rx_cnt;
  hdr_t rx_hdr;
  uint64_t started;
  uint32_t batch;
} slot_t;

typedef struct {
  const opts_t *o;
  const bu_workload_t *w;
  const float *values; /* push rows, shared read-only */
  int push;
  uint32_t index;
  /* results of the measured part */
  uint64_t requests, ids, rows, bytes, elapsed_ns;
  bu_lat_t lat;
  char error[256];
} worker_t;

/* The ids a request of batch b carries. */
static const int64_t *req_ids(const worker_t *k, uint32_t b, size_t *n) {
  if (k->push && k->o->push_full) {
    *n = k->w->batch;
    return k->w->ids[b];
  }
  *n = k->w->n_unique[b];
  return k->w->uniq[b];
}

static void slot_issue(worker_t *k, slot_t *s, uint32_t b, float *reply) {
  size_t n;
  const int64_t *ids = req_ids(k, b, &n);
  size_t row_bytes = (size_t)k->o->dim * sizeof(float);
  s->hdr = (hdr_t){MAGIC, (uint16_t)(k->push ? KIND_PUSH : KIND_PULL), 0,
                   (uint32_t)n, k->o->dim};
  s->iov[0] = (struct iovec){&s->hdr, sizeof s->hdr};
  s->iov[1] = (struct iovec){(void *)ids, n * sizeof *ids};
  s->iov[2] = (struct iovec){(void *)k->values, k->push ? n * row_bytes : 0};
  s->iov_first = 0;
  s->iov_cnt = k->push ? 3 : 2;
  s->rx[0] = (struct iovec){&s->rx_hdr, sizeof s->rx_hdr};
  s->rx[1] = (struct iovec){reply, k->push ? 0 : n * row_bytes};
  s->rx_first = 0;
  s->rx_cnt = k->push ? 1 : 2;
  s->batch = b;
  s->started = bu_now_ns();
}

/* One warm-up then one measured stretch on one connection. */
static void *worker_main(void *arg) {
  worker_t *k = arg;
  const opts_t *o = k->o;
  float *reply[MAX_DEPTH] = {0};
  slot_t slot[MAX_DEPTH];
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  if (fd < 0 || connect(fd, (const struct sockaddr *)&o->addr,
                        sizeof o->addr)) {
    snprintf(k->error, sizeof k->error, "connect: %s", strerror(errno));
    goto out;
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  for (uint32_t d = 0; d < o->depth && !k->push; d++) {
    reply[d] = malloc(k->w->max_unique * o->dim * sizeof(float));
    if (!reply[d]) {
      snprintf(k->error, sizeof k->error, "out of memory");
      goto out;
    }
  }
  uint32_t next = k->index * 7919u; /* as embps bench */
  for (int measuring = 0; measuring < 2; measuring++) {
    uint64_t t0 = bu_now_ns(), last = t0;
    uint64_t end = t0 + (uint64_t)((measuring ? o->seconds : o->warmup) * 1e9);
    uint32_t head = 0, inflight = 0, sending = 0; /* sending: unsent from */
    for (;;) {
      uint64_t now = bu_now_ns();
      if (now < end && inflight < o->depth) {
        slot_issue(k, &slot[(head + inflight) % o->depth],
                   next++ % o->n_batches, reply[(head + inflight) % o->depth]);
        inflight++;
        continue;
      }
      if (!inflight)
        break;
      int progress = 0, want_out = 0;
      while (sending < inflight) { /* write what the socket takes */
        slot_t *s = &slot[(head + sending) % o->depth];
        ssize_t r = writev(fd, s->iov + s->iov_first,
                           s->iov_cnt - s->iov_first);
        if (r < 0) {
          if (errno == EINTR)
            continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) {
            snprintf(k->error, sizeof k->error, "write: %s",
                     strerror(errno));
            goto out;
          }
          want_out = 1;
          break;
        }
        progress = 1;
        iov_advance(s->iov, &s->iov_first, s->iov_cnt, (size_t)r);
        if (s->iov_first == s->iov_cnt)
          sending++;
      }
      slot_t *s = &slot[head];
      while (s->rx_first < s->rx_cnt) { /* read the head's reply */
        ssize_t r = readv(fd, s->rx + s->rx_first, s->rx_cnt - s->rx_first);
        if (r < 0 && errno == EINTR)
          continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
          break;
        if (r <= 0) {
          snprintf(k->error, sizeof k->error, "read: %s",
                   r ? strerror(errno) : "the server closed the connection");
          goto out;
        }
        progress = 1;
        iov_advance(s->rx, &s->rx_first, s->rx_cnt, (size_t)r);
        if (s->rx_first >= 1 &&
            (s->rx_hdr.magic != MAGIC ||
             s->rx_hdr.kind != (s->hdr.kind | KIND_REPLY) ||
             s->rx_hdr.n != s->hdr.n)) {
          snprintf(k->error, sizeof k->error, "unexpected reply header");
          goto out;
        }
      }
      if (s->rx_first == s->rx_cnt) {
        now = bu_now_ns();
        if (measuring) {
          bu_lat_add(&k->lat, (double)(now - s->started) / 1e3);
          size_t n;
          req_ids(k, s->batch, &n);
          k->requests++;
          k->ids += k->w->batch;
          k->rows += k->w->n_unique[s->batch];
          k->bytes += n * (sizeof(int64_t) + (size_t)o->dim * sizeof(float)) +
                      2 * sizeof(hdr_t);
        }
        last = now;
        head = (head + 1) % o->depth;
        inflight--;
        if (sending)
          sending--;
        continue;
      }
      if (progress)
        continue;
      struct pollfd p = {fd, (short)(POLLIN | (want_out ? POLLOUT : 0)), 0};
      int pr = poll(&p, 1, STALL_MS);
      if (pr == 0 || (pr < 0 && errno != EINTR)) {
        snprintf(k->error, sizeof k->error, "%s",
                 pr ? strerror(errno) : "no progress for 30 s");
        goto out;
      }
    }
    if (measuring)
      k->elapsed_ns = last - t0;
  }
out:
  if (fd >= 0)
    close(fd);
  for (uint32_t d = 0; d < MAX_DEPTH; d++)
    free(reply[d]);
  return NULL;
}

typedef struct {
  double rows_per_s, ids_per_s, bytes_per_s, p50, p99, p999;
  uint64_t requests;
} result_t;

static int run_phase(const opts_t *o, const bu_workload_t *w,
                     const float *values, int push, result_t *r) {
  worker_t *k = calloc(o->workers, sizeof *k);
  pthread_t *th = calloc(o->workers, sizeof *th);
  int rc = k && th ? 0 : -1;
  uint32_t started = 0;
  for (; !rc && started < o->workers; started++) {
    k[started] = (worker_t){.o = o, .w = w, .values = values, .push = push,
                            .index = started};
    if (pthread_create(&th[started], NULL, worker_main, &k[started]))
      rc = -1;
  }
  memset(r, 0, sizeof *r);
  bu_lat_t all = {0};
  for (uint32_t i = 0; i < started; i++) {
    pthread_join(th[i], NULL);
    if (k[i].error[0]) {
      fprintf(stderr, PROG ": %s worker %u: %s\n", push ? "push" : "pull", i,
              k[i].error);
      rc = -1;
    }
    double secs = k[i].elapsed_ns ? (double)k[i].elapsed_ns / 1e9 : 1;
    r->rows_per_s += (double)k[i].rows / secs;
    r->ids_per_s += (double)k[i].ids / secs;
    r->bytes_per_s += (double)k[i].bytes / secs;
    r->requests += k[i].requests;
    for (size_t j = 0; j < k[i].lat.n; j++)
      bu_lat_add(&all, k[i].lat.v[j]);
    free(k[i].lat.v);
  }
  if (all.n) {
    qsort(all.v, all.n, sizeof *all.v, bu_cmp_double);
    r->p50 = bu_pct(all.v, all.n, 0.50);
    r->p99 = bu_pct(all.v, all.n, 0.99);
    r->p999 = bu_pct(all.v, all.n, 0.999);
  }
  free(all.v);
  free(k);
  free(th);
  return rc;
}

static int client_main(int argc, char **argv) {
  opts_t o = {.mode = "both", .workers = 1, .dim = 64, .depth = 2,
              .n_batches = 8, .rows = 10000000, .batch = 65536, .zipf = 1.05,
              .seconds = 5, .warmup = 1};
  const char *host = "127.0.0.1";
  double port = -1;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--json")) {
      o.json = 1;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, PROG ": %s needs a value\n", a);
      return 2;
    }
    const char *v = argv[++i];
    double x;
    if (!strcmp(a, "--host")) {
      host = v;
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
    if (!strcmp(a, "--push-rows")) {
      if (strcmp(v, "unique") && strcmp(v, "batch")) {
        fprintf(stderr, PROG ": --push-rows is unique or batch\n");
        return 2;
      }
      o.push_full = !strcmp(v, "batch");
      continue;
    }
#define NUM_(flag, lo, hi, dst)                                                \
  if (!strcmp(a, flag)) {                                                      \
    if (bu_parse_num(PROG, flag, v, lo, hi, &x))                               \
      return 2;                                                                \
    dst = x;                                                                   \
    continue;                                                                  \
  }
    NUM_("--port", 1, 65535, port)
    NUM_("--workers", 1, 64, o.workers)
    NUM_("--batch", 1, MAX_IDS, o.batch)
    NUM_("--rows", 1, 1e10, o.rows)
    NUM_("--dim", 1, MAX_DIM, o.dim)
    NUM_("--zipf", 0, 10, o.zipf)
    NUM_("--seconds", 0.05, 3600, o.seconds)
    NUM_("--warmup", 0, 600, o.warmup)
    NUM_("--depth", 1, MAX_DEPTH, o.depth)
    NUM_("--batches", 1, 1024, o.n_batches)
#undef NUM_
    fprintf(stderr, PROG ": unknown option %s\n", a);
    return 2;
  }
  char where[128];
  snprintf(where, sizeof where, "%s:%.0f", host, port);
  if (port < 0 || parse_addr(where, &o.addr)) {
    fprintf(stderr, PROG ": client needs --port (and an IPv4 --host)\n");
    return 2;
  }
  if ((double)o.batch * (8.0 + 4.0 * o.dim) > (double)MAX_BYTES) {
    fprintf(stderr, PROG ": a request would exceed %llu bytes\n",
            (unsigned long long)MAX_BYTES);
    return 2;
  }
  bu_workload_t w;
  if (bu_workload_make(&w, o.rows, o.batch, o.zipf, o.n_batches)) {
    fprintf(stderr, PROG ": out of memory for the workload\n");
    return 1;
  }
  size_t n_values = (o.push_full ? o.batch : w.max_unique) * o.dim;
  float *values = malloc(n_values * sizeof *values);
  if (!values) {
    fprintf(stderr, PROG ": out of memory for the rows\n");
    bu_workload_free(&w);
    return 1;
  }
  uint64_t seed = 7;
  for (size_t i = 0; i < n_values; i++)
    values[i] = (float)((bu_unit(&seed) - 0.5) * 1e-3);

  result_t pull = {0}, push = {0};
  int do_pull = strcmp(o.mode, "push") != 0, do_push = strcmp(o.mode, "pull");
  int rc = 0;
  if (do_pull)
    rc = run_phase(&o, &w, values, 0, &pull);
  if (!rc && do_push)
    rc = run_phase(&o, &w, values, 1, &push);
  double unique = bu_unique_ratio(&w);
  free(values);
  bu_workload_free(&w);
  if (rc)
    return 1;

  if (o.json) {
    printf("{\"tool\": \"rawbench\", \"workers\": %u, \"batch\": %" PRIu64
           ", \"rows\": %" PRIu64 ", \"dim\": %u, \"zipf\": %g, "
           "\"seconds\": %g, \"depth\": %u, \"push_rows\": \"%s\", "
           "\"unique_ratio\": %.4f, \"unique_per_batch\": %.1f, "
           "\"pull_rows_per_s\": %.0f, \"pull_ids_per_s\": %.0f, "
           "\"pull_bytes_per_s\": %.0f, \"pull_p50_us\": %.1f, "
           "\"pull_p99_us\": %.1f, \"pull_p999_us\": %.1f, "
           "\"push_rows_per_s\": %.0f, \"push_ids_per_s\": %.0f, "
           "\"push_bytes_per_s\": %.0f, \"push_p50_us\": %.1f, "
           "\"push_p99_us\": %.1f, \"push_p999_us\": %.1f, "
           "\"pull_requests\": %" PRIu64 ", \"push_requests\": %" PRIu64
           "}\n",
           o.workers, o.batch, o.rows, o.dim, o.zipf, o.seconds, o.depth,
           o.push_full ? "batch" : "unique", unique,
           unique * (double)o.batch, pull.rows_per_s, pull.ids_per_s,
           pull.bytes_per_s, pull.p50, pull.p99, pull.p999, push.rows_per_s,
           push.ids_per_s, push.bytes_per_s, push.p50, push.p99, push.p999,
           pull.requests, push.requests);
  } else {
    printf("rawbench: %u connection(s), batch %" PRIu64 " Zipf(%g) over %"
           PRIu64 " rows (%.0f unique ids per batch), dim %u, depth %u, "
           "%g s per phase, push carries the %s ids\n",
           o.workers, o.batch, o.zipf, o.rows, unique * (double)o.batch,
           o.dim, o.depth, o.seconds, o.push_full ? "batch's" : "unique");
    printf("%-5s %14s %10s %10s %10s %10s %9s\n", "", "unique rows/s",
           "MB/s", "p50 us", "p99 us", "p99.9 us", "requests");
    if (do_pull)
      printf("%-5s %14.0f %10.0f %10.1f %10.1f %10.1f %9" PRIu64 "\n",
             "pull", pull.rows_per_s, pull.bytes_per_s / 1e6, pull.p50,
             pull.p99, pull.p999, pull.requests);
    if (do_push)
      printf("%-5s %14.0f %10.0f %10.1f %10.1f %10.1f %9" PRIu64 "\n",
             "push", push.rows_per_s, push.bytes_per_s / 1e6, push.p50,
             push.p99, push.p999, push.requests);
  }
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc >= 2 && !strcmp(argv[1], "server"))
    return server_main(argc - 2, argv + 2);
  if (argc >= 2 && !strcmp(argv[1], "client"))
    return client_main(argc - 2, argv + 2);
  fprintf(stderr, "usage: " PROG " server [--listen HOST:PORT] "
                  "[--port-file FILE]\n"
                  "       " PROG " client --port P [options]  "
                  "(see the comment at the top of rawbench.c)\n");
  return 2;
}
