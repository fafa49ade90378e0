/* soak.c - a soak test of one real embps-server (ctest label `soak`).
 *
 * For EMBPS_SOAK_SECONDS (default 70): 8 workers, each with its own
 * client, pull a batch of rows and push a gradient for it, over and over;
 * meanwhile a chaos thread opens raw connections that hang up at every
 * stage (before a header, mid-header, after a hello, mid-body, with a reply
 * unread, after garbage), and a table thread creates, uses and drops
 * tables of every kind.
 *
 * Pass: no call of a good client (the workers and the table thread) fails;
 * the server's applied push count is the good clients' pushes plus at most
 * the whole pushes the chaos thread sent before hanging up;
 * the server's resident memory (VmRSS from /proc) after the warm-up (the
 * first third) grows by at most 2%; SIGTERM ends it with status 0. The
 * pull and push latencies (p50, p99, max) are printed.
 * EMBPS_SOAK_OFF=chaos,tables leaves either thread out (to tell which one
 * a failure needs). */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "embps/embps.h"
#include "frame.h"
#include "harness.h"
#include "wire.h"
#include "rng.h"

#define WORKERS 8
#define DIM 32
#define ROWS 200000 /* ~50 MB with Adagrad state: every row exists within a
                       few seconds, so the warm-up ends with the table full */
#define BATCH 256
#define RSS_GROWTH_MAX 0.02
#define RSS_WINDOW 5 /* samples (one a second) averaged at each end */

static it_server_t srv;
static atomic_int stop_flag;
static atomic_int failures;
static atomic_uint_fast64_t good_pushes, chaos_pushes;

static void failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "soak: FAIL: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  atomic_fetch_add(&failures, 1);
}

static embps_client_t *connect_client(void) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = srv.addr;
  o.timeout_ms = 30000;
  embps_client_t *c = NULL;
  char err[256];
  if (embps_client_create(&o, &c, err, sizeof err))
    failf("cannot connect to %s: %s", srv.addr, err);
  return c;
}

/* ------------------------------------------------------------ workers */

typedef struct {
  int id;
  double *lat_ms; /* pull and push latencies */
  size_t n, cap;
  uint64_t pulls, pushes;
} worker_t;

static void record(worker_t *w, double ms) {
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 4096;
    double *v = realloc(w->lat_ms, cap * sizeof *v);
    if (!v)
      return;
    w->lat_ms = v;
    w->cap = cap;
  }
  w->lat_ms[w->n++] = ms;
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  embps_client_t *c = connect_client();
  if (!c)
    return NULL;
  int64_t ids[BATCH];
  static float rows[WORKERS][BATCH * DIM], grads[WORKERS][BATCH * DIM];
  float *out = rows[w->id], *g = grads[w->id];
  uint64_t s = 1000 + (uint64_t)w->id;
  for (size_t i = 0; i < BATCH * DIM; i++)
    g[i] = (float)((int)(i % 9) - 4) / 1024.0f;
  while (!atomic_load(&stop_flag)) {
    for (size_t i = 0; i < BATCH; i++)
      ids[i] = (int64_t)(rng_next(&s) % ROWS);
    double t0 = it_now_ms();
    int rc = embps_pull(c, "soak", ids, BATCH, out, DIM);
    double t1 = it_now_ms();
    if (rc) {
      failf("worker %d: pull: %s", w->id, embps_client_last_error(c));
      break;
    }
    record(w, t1 - t0);
    w->pulls++;
    for (size_t i = 0; i < BATCH * DIM; i++) {
      if (!isfinite(out[i])) {
        failf("worker %d: pulled a non-finite value", w->id);
        break;
      }
    }
    rc = embps_push(c, "soak", ids, BATCH, g, DIM, 0);
    double t2 = it_now_ms();
    if (rc) {
      failf("worker %d: push: %s", w->id, embps_client_last_error(c));
      break;
    }
    record(w, t2 - t1);
    w->pushes++;
    atomic_fetch_add(&good_pushes, 1);
  }
  embps_client_destroy(c);
  return NULL;
}

/* ------------------------------------------------------------ chaos */

static int raw_connect(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)srv.port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    return -1;
  }
  return fd;
}

static void send_all(int fd, const void *p, size_t n) {
  ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
  (void)w; /* the server may already have closed: that is allowed */
}

/* A frame for m with bulk_len bytes of bulk (a pattern); malloc'd. */
static uint8_t *frame_of(const embps_msg_t *m, size_t bulk_len,
                         size_t *len) {
  uint8_t *f;
  size_t off;
  if (embps_frame_build(m, 1, bulk_len, &f, len, &off))
    return NULL;
  memset(f + off, 0, bulk_len);
  return f;
}

/* Hangs up at stage `kind` of a connection. */
static void chaos_once(int kind, uint64_t *s) {
  int fd = raw_connect();
  if (fd < 0) {
    failf("chaos: cannot connect: %s", strerror(errno));
    return;
  }
  embps_msg_t hello, push;
  memset(&hello, 0, sizeof hello);
  hello.kind = EMBPS_KIND_HELLO;
  hello.u.hello.version = EMBPS_PROTOCOL_VERSION;
  memset(&push, 0, sizeof push);
  push.kind = EMBPS_KIND_PUSH;
  snprintf(push.u.push.table, sizeof push.u.push.table, "soak");
  push.u.push.n = 64;
  push.u.push.dim = DIM;
  size_t hlen, plen;
  uint8_t *h = frame_of(&hello, 0, &hlen);
  uint8_t *p = frame_of(&push, 64 * (8 + DIM * 4), &plen);
  uint8_t junk[64];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (uint8_t)rng_next(s);
  char reply[256];
  switch (kind) {
  case 0: /* connect, hang up */
    break;
  case 1: /* half a header */
    send_all(fd, h, EMBPS_FRAME_HEADER_LEN / 2);
    break;
  case 2: /* a hello, then half a push */
    send_all(fd, h, hlen);
    send_all(fd, p, plen / 2);
    break;
  case 3: /* a hello and a whole push (maybe applied), reply unread */
    send_all(fd, h, hlen);
    send_all(fd, p, plen);
    atomic_fetch_add(&chaos_pushes, 1);
    break;
  case 4: /* garbage */
    send_all(fd, junk, sizeof junk);
    break;
  case 5: /* a hello, its reply read, then a push header only */
    send_all(fd, h, hlen);
    if (recv(fd, reply, sizeof reply, 0) <= 0)
      failf("chaos: no hello reply");
    send_all(fd, p, EMBPS_FRAME_HEADER_LEN);
    break;
  default: /* a push before any hello: refused, then closed */
    send_all(fd, p, plen);
    break;
  }
  if (rng_next(s) & 1) { /* sometimes a reset instead of a FIN */
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  }
  close(fd);
  free(h);
  free(p);
}

static atomic_uint_fast64_t chaos_conns;

static void *chaos_main(void *arg) {
  uint64_t s = 77;
  while (!arg && !atomic_load(&stop_flag)) {
    chaos_once((int)(rng_next(&s) % 7), &s);
    atomic_fetch_add(&chaos_conns, 1);
    usleep(2000);
  }
  return NULL;
}

/* ------------------------------------------------------------ tables */

static atomic_uint_fast64_t table_cycles;

static int table_cycle(embps_client_t *c, uint64_t n, uint64_t *s) {
  char name[64];
  snprintf(name, sizeof name, "tmp-%llu", (unsigned long long)n);
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, name, 8, (embps_optimizer_t)(n % 4));
  if (n % 3 == 0)
    spec.dynamic = 1;
  else
    spec.rows = 1000 + n % 5000;
  spec.dtype = (embps_dtype_t)(n % 3);
  if (n % 5 == 0)
    spec.sync_workers = 2; /* created and dropped, never pushed */
  if (embps_create_table(c, &spec))
    return -1;
  if (!spec.sync_workers) {
    int64_t ids[32];
    float v[32 * 8], out[32 * 8];
    for (int i = 0; i < 32; i++)
      ids[i] = (int64_t)(rng_next(s) % 1000);
    for (int i = 0; i < 32 * 8; i++)
      v[i] = 0.25f;
    for (int k = 0; k < 3; k++) {
      if (embps_push(c, name, ids, 32, v, 8, 0))
        return -1;
      atomic_fetch_add(&good_pushes, 1);
      if (embps_pull(c, name, ids, 32, out, 8))
        return -1;
    }
  }
  embps_table_info_t info;
  if (embps_describe_table(c, name, &info))
    return -1;
  embps_table_info_t *list;
  size_t n_list;
  if (embps_list_tables(c, &list, &n_list))
    return -1;
  free(list);
  return embps_drop_table(c, name);
}

static void *tables_main(void *arg) {
  if (arg)
    return NULL;
  embps_client_t *c = connect_client();
  if (!c)
    return NULL;
  uint64_t s = 99;
  for (uint64_t n = 0; !atomic_load(&stop_flag); n++) {
    if (table_cycle(c, n, &s)) {
      failf("tables: cycle %llu: %s", (unsigned long long)n,
            embps_client_last_error(c));
      break;
    }
    atomic_fetch_add(&table_cycles, 1);
    usleep(20000);
  }
  embps_client_destroy(c);
  return NULL;
}

/* ------------------------------------------------------------ measuring */

static long rss_kib(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  long kib = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
      break;
  fclose(f);
  return kib;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double mean(const long *v, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++)
    s += (double)v[i];
  return n ? s / (double)n : 0;
}

int main(void) {
  const char *env = getenv("EMBPS_SOAK_SECONDS");
  int seconds = env ? atoi(env) : 70;
  if (seconds < 3 * RSS_WINDOW)
    seconds = 3 * RSS_WINDOW;
  const char *const args[] = {"--io-threads", "2", "--shards", "8",
                              "--log-level", "warn", NULL};
  if (it_server_start(&srv, args)) {
    fprintf(stderr, "soak: cannot start embps-server\n");
    return 1;
  }
  embps_client_t *admin = connect_client();
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "soak", DIM, EMBPS_OPT_ADAGRAD);
  spec.rows = ROWS;
  if (!admin || embps_create_table(admin, &spec)) {
    fprintf(stderr, "soak: cannot create the table\n");
    it_server_kill(&srv);
    return 1;
  }

  worker_t workers[WORKERS];
  pthread_t wt[WORKERS], chaos, tables;
  memset(workers, 0, sizeof workers);
  for (int i = 0; i < WORKERS; i++) {
    workers[i].id = i;
    pthread_create(&wt[i], NULL, worker_main, &workers[i]);
  }
  /* a thread given a non-NULL argument does nothing */
  const char *off = getenv("EMBPS_SOAK_OFF");
  pthread_create(&chaos, NULL, chaos_main,
                 off && strstr(off, "chaos") ? "" : NULL);
  pthread_create(&tables, NULL, tables_main,
                 off && strstr(off, "tables") ? "" : NULL);

  /* one RSS sample a second; the warm-up is the first third */
  long *rss = calloc((size_t)seconds + 1, sizeof *rss);
  int warm = seconds / 3, n_rss = 0;
  for (int t = 0; t < seconds && !atomic_load(&failures); t++) {
    sleep(1);
    rss[n_rss++] = rss_kib(srv.pid);
  }
  atomic_store(&stop_flag, 1);
  for (int i = 0; i < WORKERS; i++)
    pthread_join(wt[i], NULL);
  pthread_join(chaos, NULL);
  pthread_join(tables, NULL);

  int ok = atomic_load(&failures) == 0;
  embps_server_stats_t *st = NULL;
  size_t n_st;
  if (ok && embps_stats(admin, &st, &n_st) == 0) {
    uint64_t good = atomic_load(&good_pushes);
    if (st[0].pushes < good ||
        st[0].pushes > good + atomic_load(&chaos_pushes)) {
      failf("the server applied %llu pushes; the good clients made %llu, "
            "the chaos thread sent %llu", (unsigned long long)st[0].pushes,
            (unsigned long long)good,
            (unsigned long long)atomic_load(&chaos_pushes));
      ok = 0;
    }
    embps_stats_free(st, n_st);
  } else if (ok) {
    failf("stats: %s", embps_client_last_error(admin));
    ok = 0;
  }
  embps_client_destroy(admin);

  size_t n_lat = 0;
  uint64_t pulls = 0, pushes = 0;
  for (int i = 0; i < WORKERS; i++) {
    n_lat += workers[i].n;
    pulls += workers[i].pulls;
    pushes += workers[i].pushes;
  }
  double *lat = malloc((n_lat ? n_lat : 1) * sizeof *lat);
  size_t k = 0;
  for (int i = 0; i < WORKERS; i++) {
    memcpy(lat + k, workers[i].lat_ms, workers[i].n * sizeof *lat);
    k += workers[i].n;
    free(workers[i].lat_ms);
  }
  qsort(lat, n_lat, sizeof *lat, cmp_double);
  if (n_lat)
    printf("soak: %d s, %llu pulls and %llu pushes of %d rows (dim %d), "
           "latency p50 %.2f ms, p99 %.2f ms, max %.2f ms; %llu chaos "
           "connections, %llu table cycles\n",
           n_rss, (unsigned long long)pulls, (unsigned long long)pushes,
           BATCH, DIM, lat[n_lat / 2], lat[(size_t)((double)n_lat * 0.99)],
           lat[n_lat - 1], (unsigned long long)atomic_load(&chaos_conns),
           (unsigned long long)atomic_load(&table_cycles));
  free(lat);

  if (ok && n_rss == seconds) {
    /* mean of the RSS_WINDOW samples ending the warm-up vs the last ones */
    double base = mean(rss + warm - RSS_WINDOW, RSS_WINDOW);
    double last = mean(rss + n_rss - RSS_WINDOW, RSS_WINDOW);
    double growth = (last - base) / base;
    printf("soak: server RSS %.0f KiB after warm-up, %.0f KiB at the end "
           "(%+.2f%%, limit +%.0f%%)\n", base, last, 100 * growth,
           100 * RSS_GROWTH_MAX);
    printf("soak: RSS KiB each second:");
    for (int i = 0; i < n_rss; i++)
      printf(" %ld", rss[i]);
    printf("\n");
    if (growth > RSS_GROWTH_MAX) {
      failf("server RSS grew by %.2f%% after warm-up", 100 * growth);
      ok = 0;
    }
  }
  free(rss);
  if (!ok)
    it_server_dump_log(&srv);
  int status = it_server_stop(&srv);
  if (status != 0) {
    failf("server exit status %d after SIGTERM", status);
    ok = 0;
  }
  if (!ok)
    return 1;
  printf("soak: passed\n");
  return 0;
}
