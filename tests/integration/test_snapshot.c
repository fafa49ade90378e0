/* test_snapshot.c - snapshot sessions and `embps backup` (issue 19's
 * online backups, issue 21's snapshot) against real servers.
 *
 * backup_under_storm: a server with --data-dir and a checkpoint every
 * second, under a push storm (4 worker processes on the durability
 * workload, one thread pushing a dynamic table with admission, TTL and
 * LRU capacity eviction in a known order, one sending pushes with known
 * (client, seq) pairs, one pulling), is backed up twice: through the
 * library with a consumer slow enough that at least two periodic
 * checkpoints (which rotate and delete log segments) run during the
 * session, and with `embps backup --out`. Each backup, restored by
 * embps-server --data-dir (into the same shard count and into another),
 * holds exactly a state the server had: every witness row pair agrees (no
 * torn push), the Adagrad rows equal a replay of the pushes it holds, bit
 * for bit, also after one more push (accumulators); the dynamic table's
 * rows, step and admission/eviction counters equal a replay of its first
 * `step` pushes (and decide the same on one more push); a push retried
 * after the restore is a duplicate exactly when the backup holds it. The
 * pushes and pulls went on during the backups; the longest a push and a
 * pull waited is printed.
 *
 * no_data_dir: a server without --data-dir serves a backup that restores
 * exactly while nothing changes, and one during which a push ran (its
 * record from the replication backlog the session pinned);
 * no_data_dir_pushes: `embps backup` of such a server under pushes
 * restores to exactly the state at the backup's LSN.
 *
 * sessions: at most EMBPS_SNAPSHOT_SESSIONS at once (ELIMIT names the
 * limit), an idle session expires and frees its place, wrong session ids,
 * sequence numbers, READ sizes, chunk sizes and idle times are refused
 * with messages naming them, READs past the end are refused, END ends.
 *
 * backup_dir_rules: DIR must be new or empty (a planted symlink or file
 * makes it refused, untouched); a failed backup leaves nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dur_util.h"
#include "embps/embps.h"
#include "harness.h"
#include "internal.h"
#include "snapshot.h"
#include "util.h"
#include "wire.h"

#define SHARDS "8"
#define DYN_IDS 6000
#define DYN_K 48
#define DYN_DIM 8
#define EX_ROWS 400000
#define BIG_ROWS 200000
#define BIG_DIM 32

/* ------------------------------------------------------------ raw pushes */

/* A connection sending pushes with the (client, seq) it is told. */
typedef struct {
  int fd;
  uint32_t req;
} raw_t;

static int raw_open(int port, raw_t *r) {
  r->req = 0;
  r->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int one = 1;
  setsockopt(r->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(r->fd, (struct sockaddr *)&a, sizeof a))
    return -1;
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_HELLO;
  m.u.hello.version = EMBPS_PROTOCOL_VERSION;
  uint8_t *f;
  size_t len;
  if (embps_frame_build(&m, ++r->req, 0, &f, &len, NULL))
    return -1;
  int rc = it_send_full(r->fd, f, len);
  free(f);
  uint8_t h[EMBPS_FRAME_HEADER_LEN], body[512];
  embps_frame_header_t fh;
  if (rc || it_recv_full(r->fd, h, sizeof h, 10000) ||
      embps_frame_header_decode(h, sizeof body, &fh) ||
      it_recv_full(r->fd, body, fh.body_len, 10000) ||
      fh.kind != (EMBPS_KIND_HELLO | EMBPS_KIND_REPLY))
    return -1;
  return 0;
}

/* Push of -1 to row `row` of table ex with (client, seq): 0 with
 * *duplicate, or -1. */
static int raw_push(raw_t *r, uint64_t client, uint64_t seq, int64_t row,
                    int *duplicate) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_PUSH;
  strcpy(m.u.push.table, "ex");
  m.u.push.n = 1;
  m.u.push.dim = 1;
  m.u.push.client_id = client;
  m.u.push.seq = seq;
  uint8_t *f;
  size_t len, off;
  if (embps_frame_build(&m, ++r->req, 12, &f, &len, &off))
    return -1;
  const float g = -1.0f;
  memcpy(f + off, &row, 8);
  memcpy(f + off + 8, &g, 4);
  int rc = it_send_full(r->fd, f, len);
  free(f);
  uint8_t h[EMBPS_FRAME_HEADER_LEN], body[1024];
  embps_frame_header_t fh;
  embps_msg_t rep;
  if (rc || it_recv_full(r->fd, h, sizeof h, 30000) ||
      embps_frame_header_decode(h, sizeof body, &fh) ||
      it_recv_full(r->fd, body, fh.body_len, 30000) ||
      embps_msg_unpack(fh.kind, body, fh.meta_len, &rep))
    return -1;
  if (rep.kind != (EMBPS_KIND_PUSH | EMBPS_KIND_REPLY) ||
      !rep.u.push_reply.applied)
    return -1;
  *duplicate = rep.u.push_reply.duplicate;
  return 0;
}

/* ------------------------------------------------------------ tables */

static void dyn_spec(embps_table_spec_t *s) {
  embps_table_spec_init(s, "dyn", DYN_DIM, EMBPS_OPT_ADAGRAD);
  s->dynamic = 1;
  s->init = EMBPS_INIT_UNIFORM;
  s->init_value = 0.1;
  s->seed = 5;
  s->admit_after = 2;
  s->ttl_steps = 3000;
  s->max_rows = 2500;
  s->evict = EMBPS_EVICT_LRU;
}

/* Push k of the dynamic table: DYN_K ids (Zipf-ish over DYN_IDS). */
static int dyn_push(embps_client_t *c, uint64_t k) {
  int64_t ids[DYN_K];
  float g[DYN_K * DYN_DIM];
  uint64_t st = k * 0x9e3779b97f4a7c15ULL + 17;
  for (int i = 0; i < DYN_K; i++) { /* half of them among a hot eighth */
    uint64_t r = rng_next(&st);
    ids[i] = (int64_t)(r % (i & 1 ? DYN_IDS : DYN_IDS / 8));
  }
  for (int i = 0; i < DYN_K * DYN_DIM; i++)
    g[i] = (float)((int64_t)(rng_next(&st) % 129) - 64) / 32.0f;
  return embps_push(c, "dyn", ids, DYN_K, g, DYN_DIM, 0);
}

static void ex_spec(embps_table_spec_t *s) {
  embps_table_spec_init(s, "ex", 1, EMBPS_OPT_SGD);
  s->lr = 1;
  s->rows = EX_ROWS;
}

static void big_spec(embps_table_spec_t *s) {
  embps_table_spec_init(s, "big", BIG_DIM, EMBPS_OPT_ADAGRAD);
  s->rows = BIG_ROWS;
  s->init = EMBPS_INIT_UNIFORM;
  s->init_value = 0.05;
}

/* Creates the storm's tables and fills "big" (every row made). */
static void make_tables(embps_client_t *c, const dur_workload_t *wl) {
  assert_int_equal(dur_create_tables(c, wl), 0);
  embps_table_spec_t s;
  dyn_spec(&s);
  assert_int_equal(embps_create_table(c, &s), 0);
  ex_spec(&s);
  assert_int_equal(embps_create_table(c, &s), 0);
  big_spec(&s);
  assert_int_equal(embps_create_table(c, &s), 0);
  enum { BATCH = 20000 };
  int64_t *ids = malloc(BATCH * sizeof *ids);
  float *g = malloc((size_t)BATCH * BIG_DIM * sizeof *g);
  for (size_t i = 0; i < (size_t)BATCH * BIG_DIM; i++)
    g[i] = (float)(i % 7) / 7.0f - 0.4f;
  for (int b = 0; b < BIG_ROWS / BATCH; b++) {
    for (int i = 0; i < BATCH; i++)
      ids[i] = (int64_t)b * BATCH + i;
    assert_int_equal(embps_push(c, "big", ids, BATCH, g, BIG_DIM, 0), 0);
  }
  free(ids);
  free(g);
}

/* ------------------------------------------------------------ storm */

typedef struct {
  const char *addr;
  int port;
  uint64_t ex_client;
  _Atomic int stop, window;
  _Atomic uint64_t dyn_acked, ex_sent;
  _Atomic uint64_t push_max_ns, pull_max_ns, window_pushes, window_pulls;
  _Atomic int failed;
  char error[512];
} storm_t;

static void storm_fail(storm_t *s, const char *what, const char *why) {
  if (!atomic_exchange(&s->failed, 1))
    snprintf(s->error, sizeof s->error, "%s: %s", what, why);
}

static void note_latency(_Atomic uint64_t *max, _Atomic uint64_t *count,
                         const storm_t *s, uint64_t ns) {
  if (!atomic_load(&s->window))
    return;
  atomic_fetch_add(count, 1);
  uint64_t old = atomic_load(max);
  while (ns > old && !atomic_compare_exchange_weak(max, &old, ns))
    ;
}

static void *dyn_main(void *arg) {
  storm_t *s = arg;
  embps_client_t *c = dur_connect(s->addr, 30000, DUR_RETRY_DEFAULT, NULL);
  if (!c) {
    storm_fail(s, "dyn pusher", "cannot connect");
    return NULL;
  }
  for (uint64_t k = 0; !atomic_load(&s->stop); k++) {
    double t0 = it_now_ms();
    if (dyn_push(c, k)) {
      storm_fail(s, "dyn push", embps_client_last_error(c));
      break;
    }
    atomic_store(&s->dyn_acked, k + 1);
    note_latency(&s->push_max_ns, &s->window_pushes, s,
                 (uint64_t)((it_now_ms() - t0) * 1e6));
  }
  embps_client_destroy(c);
  return NULL;
}

static void *ex_main(void *arg) {
  storm_t *s = arg;
  raw_t r;
  if (raw_open(s->port, &r)) {
    storm_fail(s, "ex pusher", "cannot connect");
    return NULL;
  }
  for (uint64_t k = 0; k < EX_ROWS && !atomic_load(&s->stop); k++) {
    int dup;
    atomic_store(&s->ex_sent, k + 1); /* sent: applied or not */
    if (raw_push(&r, s->ex_client, k + 1, (int64_t)k, &dup) || dup) {
      storm_fail(s, "ex push", "failed or a duplicate");
      break;
    }
  }
  close(r.fd);
  return NULL;
}

static void *pull_main(void *arg) {
  storm_t *s = arg;
  embps_client_t *c = dur_connect(s->addr, 30000, DUR_RETRY_DEFAULT, NULL);
  if (!c) {
    storm_fail(s, "puller", "cannot connect");
    return NULL;
  }
  int64_t ids[512];
  float rows[512 * BIG_DIM];
  for (uint64_t k = 0; !atomic_load(&s->stop); k++) {
    for (int i = 0; i < 512; i++)
      ids[i] = (int64_t)((k * 7919 + (uint64_t)i * 104729) % BIG_ROWS);
    double t0 = it_now_ms();
    if (embps_pull(c, "big", ids, 512, rows, BIG_DIM)) {
      storm_fail(s, "pull", embps_client_last_error(c));
      break;
    }
    note_latency(&s->pull_max_ns, &s->window_pulls, s,
                 (uint64_t)((it_now_ms() - t0) * 1e6));
  }
  embps_client_destroy(c);
  return NULL;
}

/* ------------------------------------------------------------ a slow copy */

/* embps_snapshot_copy's sink writing a data dir (no fsync: the test's),
 * slowly: each write waits until the copy has lasted min_ms. */
typedef struct {
  char dir[600];
  char ckpt[700];
  FILE *f;
  double t0, min_ms;
  uint64_t writes;
} slow_t;

static int slow_head(void *ctx, const embps_snapstream_head_t *h, char *err,
                     size_t err_len) {
  slow_t *s = ctx;
  char log[700];
  snprintf(s->ckpt, sizeof s->ckpt, "%s/ckpt-%016" PRIx64, s->dir, h->lsn);
  snprintf(log, sizeof log, "%s/log", s->dir);
  s->t0 = it_now_ms();
  if (mkdir(s->dir, 0700) || mkdir(s->ckpt, 0700) || mkdir(log, 0700)) {
    snprintf(err, err_len, "mkdir: %s", strerror(errno));
    return -1;
  }
  return 0;
}

static int slow_file(void *ctx, const embps_snapstream_entry_t *e,
                     const char *name, char *err, size_t err_len) {
  slow_t *s = ctx;
  char path[1000];
  if (e->type == EMBPS_SNAPSTREAM_LOG)
    snprintf(path, sizeof path, "%s/log/%s", s->dir, name);
  else
    snprintf(path, sizeof path, "%s/%s", s->ckpt, name);
  s->f = fopen(path, "wbx");
  if (!s->f)
    snprintf(err, err_len, "%s: %s", path, strerror(errno));
  return s->f ? 0 : -1;
}

static int slow_write(void *ctx, const uint8_t *p, size_t n, char *err,
                      size_t err_len) {
  slow_t *s = ctx;
  if (it_now_ms() - s->t0 < s->min_ms)
    it_sleep_ms(20);
  if (fwrite(p, 1, n, s->f) != n) {
    snprintf(err, err_len, "fwrite failed");
    return -1;
  }
  return 0;
}

static int slow_file_end(void *ctx, uint64_t bytes, char *err,
                         size_t err_len) {
  slow_t *s = ctx;
  (void)bytes;
  int rc = fclose(s->f);
  s->f = NULL;
  if (rc)
    snprintf(err, err_len, "fclose failed");
  return rc ? -1 : 0;
}

/* ------------------------------------------------------------ checks */

static embps_client_t *connect_or_fail(const char *addr) {
  embps_client_t *c = dur_connect(addr, 30000, DUR_RETRY_DEFAULT, "connect");
  assert_non_null(c);
  return c;
}

static void info_of(embps_client_t *c, const char *table,
                    embps_table_info_t *out) {
  if (embps_describe_table(c, table, out))
    fail_msg("describe %s: %s", table, embps_client_last_error(c));
}

/* The restored server at `addr` holds exactly a state the stormed server
 * had (the workload's tables, the dynamic table), what (the backup) names
 * it in messages. probe: the dynamic table decides the same as a replay
 * on one more push (same shard count only). Returns the number of ex
 * pushes the backup holds. */
static uint64_t check_restored(const char *addr, const dur_workload_t *wl,
                               const char *what, int probe) {
  embps_client_t *c = connect_or_fail(addr);
  /* witness rows: both rows of a push, or neither */
  double wit[2 * DUR_MAX_WORKERS];
  assert_int_equal(dur_pull_wit(c, wl, wit), 0);
  uint64_t counts[DUR_MAX_WORKERS], total = 0;
  for (int w = 0; w < wl->n_workers; w++) {
    if (wit[w] != wit[wl->n_workers + w] || wit[w] < 0)
      dur_fail("%s: worker %d: witness rows %.0f and %.0f: a torn push", what,
               w, wit[w], wit[wl->n_workers + w]);
    counts[w] = (uint64_t)wit[w];
    total += counts[w];
  }
  embps_table_info_t info;
  info_of(c, "wit", &info);
  if (info.step != total)
    dur_fail("%s: table wit at step %" PRIu64 ", its rows count %" PRIu64
             " pushes", what, info.step, total);
  /* Adagrad rows: a replay of worker w's first counts[w] (or one fewer:
   * its Adagrad push follows its witness push) pushes */
  float *got = dur_pull_ada(c, wl);
  assert_non_null(got);
  const size_t per = (size_t)wl->rows_per_worker * DUR_ADA_DIM;
  float *exp = dur_replay_ada(wl, counts);
  assert_non_null(exp);
  uint64_t ada[DUR_MAX_WORKERS], ada_total = 0;
  int redo = 0;
  for (int w = 0; w < wl->n_workers; w++) {
    ada[w] = counts[w];
    if (memcmp(exp + (size_t)w * per, got + (size_t)w * per,
               per * sizeof *got) && counts[w]) {
      ada[w] = counts[w] - 1;
      redo = 1;
    }
  }
  if (redo) {
    free(exp);
    exp = dur_replay_ada(wl, ada);
    assert_non_null(exp);
  }
  if (dur_compare_ada(wl, exp, got, what))
    dur_fail("%s: the Adagrad rows are no state the server had", what);
  for (int w = 0; w < wl->n_workers; w++)
    ada_total += ada[w];
  info_of(c, "ada", &info);
  if (info.step != ada_total)
    dur_fail("%s: table ada at step %" PRIu64 ", its rows hold %" PRIu64
             " pushes", what, info.step, ada_total);
  free(exp);
  free(got);
  /* optimizer state: one more push to the backup and to a replay */
  it_server_t ref;
  embps_client_t *rc;
  assert_int_equal(dur_replay_open(wl, ada, &ref, &rc), 0);
  if (dur_probe_accumulators(wl, c, rc, what))
    dur_fail("%s: Adagrad accumulators differ from the replay's", what);
  dur_replay_close(&ref, rc);
  /* the dynamic table: its first `step` pushes, replayed in order on a
   * server of the same shard count */
  embps_table_info_t dyn;
  info_of(c, "dyn", &dyn);
  const char *args[] = {"--shards", SHARDS, NULL};
  assert_int_equal(it_server_start(&ref, args), 0);
  rc = connect_or_fail(ref.addr);
  embps_table_spec_t s;
  dyn_spec(&s);
  assert_int_equal(embps_create_table(rc, &s), 0);
  for (uint64_t k = 0; k < dyn.step; k++)
    assert_int_equal(dyn_push(rc, k), 0);
  embps_table_info_t want;
  info_of(rc, "dyn", &want);
  if (!probe) {
    /* another shard count: the log after the checkpoint is replayed into
     * other shards, whose merged admission sketches estimate within their
     * bounds but not bit for bit (README "Admission and eviction"), and
     * each shard's capacity is another share of max_rows: the pushes are
     * all there, the counts close */
    const double a = (double)dyn.rows_admitted, b = (double)want.rows_admitted;
    if (dyn.step != want.step || a < 0.98 * b || a > 1.02 * b ||
        !dyn.evicted_capacity)
      dur_fail("%s: dyn at step %" PRIu64 " (a replay: %" PRIu64 "), %.0f "
               "rows admitted (a replay: %.0f), %" PRIu64 " evicted for "
               "capacity", what, dyn.step, want.step, a, b,
               dyn.evicted_capacity);
  } else if (want.rows_allocated != dyn.rows_allocated ||
      want.rows_admitted != dyn.rows_admitted ||
      want.rows_pending != dyn.rows_pending ||
      want.evicted_ttl != dyn.evicted_ttl ||
      want.evicted_capacity != dyn.evicted_capacity || !dyn.evicted_capacity)
    dur_fail("%s: dyn after %" PRIu64 " pushes: rows %" PRIu64 " admitted %"
             PRIu64 " pending %" PRIu64 " evicted ttl %" PRIu64 " capacity %"
             PRIu64 "; a replay: %" PRIu64 " %" PRIu64 " %" PRIu64 " %"
             PRIu64 " %" PRIu64, what, dyn.step, dyn.rows_allocated,
             dyn.rows_admitted, dyn.rows_pending, dyn.evicted_ttl,
             dyn.evicted_capacity, want.rows_allocated, want.rows_admitted,
             want.rows_pending, want.evicted_ttl, want.evicted_capacity);
  for (int round = 0; probe && round < 2; round++) {
    if (round) { /* one more push to both: the same decisions */
      assert_int_equal(dyn_push(c, dyn.step), 0);
      assert_int_equal(dyn_push(rc, dyn.step), 0);
      embps_table_info_t a, b;
      info_of(c, "dyn", &a);
      info_of(rc, "dyn", &b);
      if (a.rows_allocated != b.rows_allocated ||
          a.rows_admitted != b.rows_admitted ||
          a.evicted_capacity != b.evicted_capacity)
        dur_fail("%s: dyn decides otherwise than a replay after one more "
                 "push", what);
    }
    int64_t *ids = malloc(DYN_IDS * sizeof *ids);
    float *x = malloc((size_t)DYN_IDS * DYN_DIM * sizeof *x);
    float *y = malloc((size_t)DYN_IDS * DYN_DIM * sizeof *y);
    for (int i = 0; i < DYN_IDS; i++)
      ids[i] = i;
    assert_int_equal(embps_pull(c, "dyn", ids, DYN_IDS, x, DYN_DIM), 0);
    assert_int_equal(embps_pull(rc, "dyn", ids, DYN_IDS, y, DYN_DIM), 0);
    if (memcmp(x, y, (size_t)DYN_IDS * DYN_DIM * sizeof *x))
      dur_fail("%s: dyn rows differ from a replay of its %" PRIu64
               " pushes%s", what, dyn.step, round ? " (after one more)" : "");
    free(ids);
    free(x);
    free(y);
  }
  embps_client_destroy(rc);
  it_server_stop(&ref);
  /* ex: the pushes it holds are a prefix (each row 1 or 0) */
  float *ex = malloc(EX_ROWS * sizeof *ex);
  int64_t *ids = malloc(EX_ROWS * sizeof *ids);
  for (int i = 0; i < EX_ROWS; i++)
    ids[i] = i;
  assert_int_equal(embps_pull(c, "ex", ids, EX_ROWS, ex, 1), 0);
  uint64_t m = 0;
  while (m < EX_ROWS && ex[m] == 1.0f)
    m++;
  for (uint64_t i = m; i < EX_ROWS; i++)
    if (ex[i] != 0.0f) {
      dur_fail("%s: ex row %" PRIu64 " = %g after %" PRIu64 " rows of 1", what,
               i, (double)ex[i], m);
      break;
    }
  free(ex);
  free(ids);
  embps_client_destroy(c);
  return m;
}

/* After check_restored: the ex pushes around the cut (and some before),
 * sent again with their (client, seq), are duplicates exactly when the
 * backup holds them; then every row sent is 1. */
static void check_exactly_once(const it_server_t *srv, uint64_t client,
                               uint64_t held, uint64_t sent,
                               const char *what) {
  raw_t r;
  assert_int_equal(raw_open(srv->port, &r), 0);
  uint64_t lo = held > 3000 ? held - 3000 : 0;
  for (uint64_t k = 0; k < sent; k = k < lo ? k + 97 : k + 1) {
    if (k >= lo && k > held + 3000)
      break;
    int dup;
    assert_int_equal(raw_push(&r, client, k + 1, (int64_t)k, &dup), 0);
    if (dup != (k < held))
      dur_fail("%s: ex push %" PRIu64 " sent again: %s, but the backup %s "
               "it", what, k, dup ? "a duplicate" : "applied",
               k < held ? "holds" : "does not hold");
  }
  close(r.fd);
}

/* "KEY VALUE" of member 0's line in DIR/BACKUP. */
static uint64_t backup_field(const char *dir, const char *key) {
  char path[700], *text;
  size_t len;
  snprintf(path, sizeof path, "%s/BACKUP", dir);
  assert_int_equal(embps_read_file(path, &text, &len), 0);
  char pat[64];
  snprintf(pat, sizeof pat, " %s ", key);
  const char *p = strstr(strstr(text, "member 0 "), pat);
  assert_non_null(p);
  uint64_t v = strtoull(p + strlen(pat), NULL, 10);
  free(text);
  return v;
}

static uint64_t checkpoint_lsn(const char *addr) {
  embps_client_t *c = connect_or_fail(addr);
  embps_server_stats_t *st;
  size_t n;
  assert_int_equal(embps_stats(c, &st, &n), 0);
  uint64_t lsn = st[0].checkpoint_lsn;
  embps_stats_free(st, n);
  embps_client_destroy(c);
  return lsn;
}

/* ------------------------------------------------------------ tests */

static void test_backup_under_storm(void **state) {
  (void)state;
  char root[64] = "/tmp/embps-snap-XXXXXX";
  assert_non_null(mkdtemp(root));
  char data[128], slow_dir[128], cli_dir[128];
  snprintf(data, sizeof data, "%s/data", root);
  snprintf(slow_dir, sizeof slow_dir, "%s/slow", root);
  snprintf(cli_dir, sizeof cli_dir, "%s/cli", root);
  const char *args[] = {"--data-dir", data, "--checkpoint-every", "1",
                        "--shards", SHARDS, NULL};
  it_server_t srv;
  assert_int_equal(it_server_start(&srv, args), 0);
  const dur_workload_t wl = {.n_workers = 4, .rows_per_worker = 256,
                             .seed = 77};
  embps_client_t *c = connect_or_fail(srv.addr);
  make_tables(c, &wl);
  storm_t st = {.addr = srv.addr, .port = srv.port, .ex_client = 0x5eed1};
  dur_shared_t *sh = dur_shared_new();
  pid_t pids[4];
  for (int w = 0; w < 4; w++)
    pids[w] = dur_worker_spawn(sh, &wl, w, srv.addr, NULL, 60000);
  pthread_t th[3];
  pthread_create(&th[0], NULL, dyn_main, &st);
  pthread_create(&th[1], NULL, ex_main, &st);
  pthread_create(&th[2], NULL, pull_main, &st);
  it_sleep_ms(1500); /* pushes, and a checkpoint or two */
  /* and the dynamic table past its capacity, which the restores check (a
   * slow build, ThreadSanitizer's, needs longer than 1.5 s to get there) */
  for (const double until = it_now_ms() + 60000;;) {
    embps_table_info_t d;
    info_of(c, "dyn", &d);
    if (d.evicted_capacity)
      break;
    if (it_now_ms() > until || atomic_load(&st.failed))
      fail_msg("storm: table dyn has not evicted for capacity%s",
               atomic_load(&st.failed) ? " (a storm thread failed)" : " in 60 s");
    it_sleep_ms(20);
  }

  /* 1. through the library, slowly: periodic checkpoints during it */
  atomic_store(&st.window, 1);
  const uint64_t dyn_before = atomic_load(&st.dyn_acked);
  slow_t slow = {.min_ms = 3500};
  snprintf(slow.dir, sizeof slow.dir, "%s/member-0", slow_dir);
  assert_int_equal(mkdir(slow_dir, 0700), 0);
  const embps_snapshot_sink_t sink = {slow_head, slow_file, slow_write,
                                      slow_file_end};
  embps_snapshot_options_t o = {.with_log = 1, .max_chunk_bytes = 1 << 20};
  embps_snapshot_info_t info;
  embps_snapstream_end_t end;
  const double t0 = it_now_ms();
  if (embps_snapshot_copy(c, 0, &o, &sink, &slow, &info, &end))
    fail_msg("slow backup: %s", embps_client_last_error(c));
  const double slow_ms = it_now_ms() - t0;
  const uint64_t ckpt_after = checkpoint_lsn(srv.addr);
  print_message("slow backup: S %" PRIu64 ", L %" PRIu64 ", %.0f ms; the "
                "server's checkpoint LSN since: %" PRIu64 "\n", info.lsn,
                end.lsn, slow_ms, ckpt_after);
  /* checkpoints ran after the marker, their log rotations and deletions
   * too, and the records after S were still there to ship */
  assert_true(ckpt_after > info.lsn);
  assert_true(end.lsn > info.lsn);

  /* 2. the CLI */
  it_cli_result_t r;
  const char *cli[] = {"--servers", srv.addr, "backup", "--out", cli_dir,
                       NULL};
  const double t1 = it_now_ms();
  it_cli_run(&r, cli);
  const double cli_ms = it_now_ms() - t1;
  if (r.status)
    fail_msg("embps backup: %s%s", r.out, r.err);
  print_message("%s", r.out);
  it_cli_result_free(&r);
  atomic_store(&st.window, 0);
  const uint64_t dyn_during = atomic_load(&st.dyn_acked) - dyn_before;
  it_sleep_ms(200);
  atomic_store(&st.stop, 1);
  for (int i = 0; i < 3; i++)
    pthread_join(th[i], NULL);
  dur_workers_finish(sh, pids, 4, 30000, 1);
  if (atomic_load(&st.failed))
    fail_msg("storm: %s", st.error);
  print_message("during the backups (%.0f + %.0f ms): %" PRIu64 " pushes, "
                "the longest waited %.1f ms; %" PRIu64 " pulls, the "
                "longest %.1f ms\n", slow_ms, cli_ms,
                atomic_load(&st.window_pushes),
                (double)atomic_load(&st.push_max_ns) / 1e6,
                atomic_load(&st.window_pulls),
                (double)atomic_load(&st.pull_max_ns) / 1e6);
  assert_true(dyn_during >= 10);
  assert_true(atomic_load(&st.window_pulls) >= 10);
  const uint64_t ex_sent = atomic_load(&st.ex_sent);
  embps_client_destroy(c);
  assert_int_equal(it_server_stop(&srv), 0);
  assert_true(backup_field(cli_dir, "lsn") >=
              backup_field(cli_dir, "checkpoint_lsn"));

  /* each backup restored: into the same shard count, into another */
  struct {
    const char *dir, *shards, *what;
  } restores[] = {{slow.dir, SHARDS, "slow backup (8 shards)"},
                  {NULL, "5", "embps backup (5 shards)"},
                  {NULL, "3", "slow backup (3 shards)"}};
  char cli_member[200];
  snprintf(cli_member, sizeof cli_member, "%s/member-0", cli_dir);
  restores[1].dir = cli_member;
  restores[2].dir = slow.dir;
  for (int i = 0; i < 3; i++) {
    char copy[200];
    snprintf(copy, sizeof copy, "%s/restore-%d", root, i);
    assert_int_equal(dur_copy_tree(restores[i].dir, copy), 0);
    const char *rargs[] = {"--data-dir", copy, "--shards", restores[i].shards,
                           NULL};
    it_server_t back;
    assert_int_equal(it_server_start(&back, rargs), 0);
    uint64_t held = check_restored(back.addr, &wl, restores[i].what,
                                   !strcmp(restores[i].shards, SHARDS));
    check_exactly_once(&back, st.ex_client, held, ex_sent,
                       restores[i].what);
    assert_int_equal(it_server_stop(&back), 0);
  }
  dur_shared_free(sh);
  dur_rm_rf(root);
  assert_int_equal(dur_failures(), 0);
}

/* A server without --data-dir: a backup while nothing changes restores
 * exactly; a push during the copy makes it fail, naming --data-dir. */
static void test_no_data_dir(void **state) {
  (void)state;
  char root[64] = "/tmp/embps-snap-XXXXXX";
  assert_non_null(mkdtemp(root));
  it_server_t srv;
  const char *args[] = {"--shards", "4", NULL};
  assert_int_equal(it_server_start(&srv, args), 0);
  embps_client_t *c = connect_or_fail(srv.addr);
  embps_table_spec_t s;
  dyn_spec(&s);
  assert_int_equal(embps_create_table(c, &s), 0);
  big_spec(&s);
  s.rows = 40000;
  assert_int_equal(embps_create_table(c, &s), 0);
  for (uint64_t k = 0; k < 300; k++)
    assert_int_equal(dyn_push(c, k), 0);
  enum { N = 40000 };
  int64_t *ids = malloc(N * sizeof *ids);
  float *g = malloc((size_t)N * BIG_DIM * sizeof *g);
  float *x = malloc((size_t)N * BIG_DIM * sizeof *x);
  float *y = malloc((size_t)N * BIG_DIM * sizeof *y);
  for (int i = 0; i < N; i++)
    ids[i] = i;
  for (size_t i = 0; i < (size_t)N * BIG_DIM; i++)
    g[i] = (float)(i % 5) / 5.0f - 0.3f;
  assert_int_equal(embps_push(c, "big", ids, N, g, BIG_DIM, 0), 0);
  char out[128];
  snprintf(out, sizeof out, "%s/bk", root);
  it_cli_result_t r;
  const char *cli[] = {"--servers", srv.addr, "backup", "--out", out, NULL};
  if (it_cli_run(&r, cli))
    fail_msg("embps backup: %s%s", r.out, r.err);
  it_cli_result_free(&r);
  /* a push while the copy runs: the producer is held by the unread pipe */
  embps_snapshot_options_t o = {.with_log = 1, .max_chunk_bytes = 4096,
                                .depth = 1};
  embps_snapshot_t *snap;
  assert_int_equal(embps_snapshot_begin(c, 0, &o, &snap), 0);
  assert_int_equal(embps_push(c, "big", ids, 10, g, BIG_DIM, 0), 0);
  const uint8_t *p;
  size_t n;
  int rc;
  while (!(rc = embps_snapshot_next(snap, &p, &n)) && n)
    ;
  /* complete: the push's record comes from the replication backlog */
  if (rc)
    fail_msg("snapshot with a push during the copy: %s",
             embps_client_last_error(c));
  embps_snapshot_end(snap);
  assert_int_equal(embps_pull(c, "big", ids, N, x, BIG_DIM), 0);
  embps_table_info_t dyn;
  info_of(c, "dyn", &dyn);
  embps_client_destroy(c);
  assert_int_equal(it_server_stop(&srv), 0);
  /* the first backup (taken before the 10 rows were pushed again) */
  char member[160];
  snprintf(member, sizeof member, "%s/member-0", out);
  const char *rargs[] = {"--data-dir", member, "--shards", "7", NULL};
  it_server_t back;
  assert_int_equal(it_server_start(&back, rargs), 0);
  c = connect_or_fail(back.addr);
  assert_int_equal(embps_push(c, "big", ids, 10, g, BIG_DIM, 0), 0);
  assert_int_equal(embps_pull(c, "big", ids, N, y, BIG_DIM), 0);
  assert_memory_equal(x, y, (size_t)N * BIG_DIM * sizeof *x);
  embps_table_info_t got;
  info_of(c, "dyn", &got);
  assert_int_equal(got.step, dyn.step);
  assert_int_equal(got.rows_allocated, dyn.rows_allocated);
  assert_int_equal(got.rows_admitted, dyn.rows_admitted);
  assert_int_equal(got.evicted_capacity, dyn.evicted_capacity);
  embps_client_destroy(c);
  assert_int_equal(it_server_stop(&back), 0);
  free(ids);
  free(g);
  free(x);
  free(y);
  dur_rm_rf(root);
}

typedef struct {
  const char *addr;
  atomic_int stop;
  uint64_t acked;
} pusher_t;

#define W_ROWS 8192
#define W_DIM 16

/* Pushes -1 to every row of "w" (SGD, lr 1, zeros) until stop. */
static void *pusher_main(void *arg) {
  pusher_t *ps = arg;
  embps_client_t *c = connect_or_fail(ps->addr);
  int64_t *ids = malloc(W_ROWS * sizeof *ids);
  float *g = malloc((size_t)W_ROWS * W_DIM * sizeof *g);
  for (int i = 0; i < W_ROWS; i++)
    ids[i] = i;
  for (size_t i = 0; i < (size_t)W_ROWS * W_DIM; i++)
    g[i] = -1;
  while (!atomic_load(&ps->stop) &&
         !embps_push(c, "w", ids, W_ROWS, g, W_DIM, 0))
    ps->acked++;
  free(ids);
  free(g);
  embps_client_destroy(c);
  return NULL;
}

/* A server without --data-dir backed up by `embps backup` while a thread
 * pushes: the backup's log tail comes from its replication backlog (until
 * one of them holds records after its checkpoint), and restored (into
 * another --shards) every row counts exactly the pushes up to the
 * backup's LSN (LSN 1 is the create): no shard ahead of another. */
static void test_no_data_dir_pushes(void **state) {
  (void)state;
  char root[64] = "/tmp/embps-snap-XXXXXX";
  assert_non_null(mkdtemp(root));
  it_server_t srv;
  const char *args[] = {"--shards", "4", NULL};
  assert_int_equal(it_server_start(&srv, args), 0);
  embps_client_t *c = connect_or_fail(srv.addr);
  embps_table_spec_t s;
  embps_table_spec_init(&s, "w", W_DIM, EMBPS_OPT_SGD);
  s.rows = W_ROWS;
  s.lr = 1;
  assert_int_equal(embps_create_table(c, &s), 0);
  pusher_t ps = {.addr = srv.addr};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, pusher_main, &ps), 0);
  char out[128] = "";
  unsigned long long ck = 0, lsn = 0;
  for (int k = 0; k < 50 && lsn <= ck; k++) {
    snprintf(out, sizeof out, "%s/bk%d", root, k);
    it_cli_result_t r;
    const char *cli[] = {"--servers", srv.addr, "backup", "--out", out, NULL};
    if (it_cli_run(&r, cli))
      fail_msg("embps backup under pushes: %s%s", r.out, r.err);
    it_cli_result_free(&r);
    char path[160];
    snprintf(path, sizeof path, "%s/BACKUP", out);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[256];
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "member 0 dir member-0 checkpoint_lsn %llu lsn %llu",
                 &ck, &lsn) == 2)
        break;
    fclose(f);
  }
  atomic_store(&ps.stop, 1);
  pthread_join(th, NULL);
  printf("[snapshot] memory-only backup under pushes: checkpoint at LSN "
         "%llu, log to LSN %llu (%llu pushes acknowledged)\n", ck, lsn,
         (unsigned long long)ps.acked);
  assert_true(lsn > ck); /* records after the checkpoint were copied */
  embps_client_destroy(c);
  assert_int_equal(it_server_stop(&srv), 0);
  char member[160];
  snprintf(member, sizeof member, "%s/member-0", out);
  const char *rargs[] = {"--data-dir", member, "--shards", "7", NULL};
  it_server_t back;
  assert_int_equal(it_server_start(&back, rargs), 0);
  c = connect_or_fail(back.addr);
  int64_t *ids = malloc(W_ROWS * sizeof *ids);
  float *v = malloc((size_t)W_ROWS * W_DIM * sizeof *v);
  for (int i = 0; i < W_ROWS; i++)
    ids[i] = i;
  assert_int_equal(embps_pull(c, "w", ids, W_ROWS, v, W_DIM), 0);
  for (size_t i = 0; i < (size_t)W_ROWS * W_DIM; i++)
    if (v[i] != (float)(lsn - 1))
      fail_msg("restored row %zu element %zu is %g, not %llu (the pushes "
               "up to LSN %llu)", i / W_DIM, i % W_DIM, (double)v[i],
               lsn - 1, lsn);
  free(ids);
  free(v);
  embps_client_destroy(c);
  assert_int_equal(it_server_stop(&back), 0);
  dur_rm_rf(root);
}

/* A cluster of two: `embps backup` writes member-0 and member-1, each
 * restored on its own slot holds its half of the table; --member 1 backs
 * up member 1 alone; a member restored on the other slot is refused. */
static void test_cluster_backup(void **state) {
  (void)state;
  char root[64] = "/tmp/embps-snap-XXXXXX";
  assert_non_null(mkdtemp(root));
  it_server_t srv[2];
  for (int i = 0; i < 2; i++) {
    char idx[8];
    snprintf(idx, sizeof idx, "%d", i);
    const char *args[] = {"--cluster-size", "2", "--cluster-index", idx,
                          NULL};
    assert_int_equal(it_server_start(&srv[i], args), 0);
  }
  char list[80];
  snprintf(list, sizeof list, "%s,%s", srv[0].addr, srv[1].addr);
  embps_client_t *c = connect_or_fail(list);
  embps_table_spec_t s;
  big_spec(&s);
  s.rows = 5000;
  assert_int_equal(embps_create_table(c, &s), 0);
  enum { N = 5000 };
  int64_t *ids = malloc(N * sizeof *ids);
  float *g = malloc((size_t)N * BIG_DIM * sizeof *g);
  float *x = malloc((size_t)N * BIG_DIM * sizeof *x);
  float *y = malloc((size_t)N * BIG_DIM * sizeof *y);
  for (int i = 0; i < N; i++)
    ids[i] = i;
  for (size_t i = 0; i < (size_t)N * BIG_DIM; i++)
    g[i] = (float)(i % 9) / 9.0f - 0.4f;
  assert_int_equal(embps_push(c, "big", ids, N / 2, g, BIG_DIM, 0), 0);
  assert_int_equal(embps_push(c, "big", ids + 1000, N - 1000, g, BIG_DIM, 0),
                   0);
  assert_int_equal(embps_pull(c, "big", ids, N, x, BIG_DIM), 0);
  embps_client_destroy(c);
  char all[128], one[128];
  snprintf(all, sizeof all, "%s/all", root);
  snprintf(one, sizeof one, "%s/one", root);
  it_cli_result_t r;
  const char *cli[] = {"--servers", list, "backup", "--out", all, NULL};
  if (it_cli_run(&r, cli))
    fail_msg("embps backup: %s%s", r.out, r.err);
  assert_non_null(strstr(r.out, "member 1 ("));
  it_cli_result_free(&r);
  const char *cli1[] = {"--servers", list, "--member", "1", "backup",
                        "--out", one, NULL};
  if (it_cli_run(&r, cli1))
    fail_msg("embps backup --member 1: %s%s", r.out, r.err);
  it_cli_result_free(&r);
  char path[200];
  struct stat st;
  snprintf(path, sizeof path, "%s/member-0", one);
  assert_int_equal(stat(path, &st), -1);
  snprintf(path, sizeof path, "%s/member-1", one);
  assert_int_equal(stat(path, &st), 0);
  for (int i = 0; i < 2; i++)
    assert_int_equal(it_server_stop(&srv[i]), 0);
  /* each member restored on its slot, into other shard counts */
  for (int i = 0; i < 2; i++) {
    char dir[200], idx[8];
    snprintf(dir, sizeof dir, "%s/member-%d", all, i);
    snprintf(idx, sizeof idx, "%d", i);
    const char *args[] = {"--cluster-size", "2", "--cluster-index", idx,
                          "--data-dir", dir, "--shards", i ? "3" : "5",
                          NULL};
    assert_int_equal(it_server_start(&srv[i], args), 0);
  }
  snprintf(list, sizeof list, "%s,%s", srv[0].addr, srv[1].addr);
  c = connect_or_fail(list);
  assert_int_equal(embps_pull(c, "big", ids, N, y, BIG_DIM), 0);
  assert_memory_equal(x, y, (size_t)N * BIG_DIM * sizeof *x);
  embps_client_destroy(c);
  for (int i = 0; i < 2; i++)
    assert_int_equal(it_server_stop(&srv[i]), 0);
  /* member 1's copy on slot 0: refused */
  snprintf(path, sizeof path, "%s/member-1", all);
  const char *args[] = {"--cluster-size", "2", "--cluster-index", "0",
                        "--data-dir", path, NULL};
  it_server_t wrong;
  assert_int_equal(it_server_start(&wrong, args), -1);
  free(ids);
  free(g);
  free(x);
  free(y);
  dur_rm_rf(root);
}

/* A raw request of c to server 0: 0 with the reply in *m, or the error
 * with the message in err. */
static size_t n_got; /* the last reply's bulk bytes */

static int call(embps_client_t *c, embps_msg_t *m, uint8_t *dst, size_t cap,
                char *err, size_t err_len) {
  embps_ticket_t *t;
  size_t n = 0;
  int rc = embps_client_request_(c, 0, m, dst, cap, &t);
  if (!rc)
    rc = embps_client_reply_(c, t, m, &n);
  n_got = n;
  snprintf(err, err_len, "%s", rc ? embps_client_last_error(c) : "");
  return rc;
}

static int snap_read(embps_client_t *c, uint64_t session, uint64_t seq,
                     uint32_t max, uint8_t *buf, char *err, size_t err_len) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_SNAPSHOT_READ;
  m.u.snap_read.session = session;
  m.u.snap_read.seq = seq;
  m.u.snap_read.max_bytes = max;
  return call(c, &m, buf, max, err, err_len);
}

static void test_sessions(void **state) {
  (void)state;
  it_server_t srv;
  const char *args[] = {"--max-frame-bytes", "1048576", NULL};
  assert_int_equal(it_server_start(&srv, args), 0);
  embps_client_t *c = connect_or_fail(srv.addr);
  embps_table_spec_t s;
  big_spec(&s);
  s.rows = 20000;
  assert_int_equal(embps_create_table(c, &s), 0);
  int64_t ids[2000];
  static float g[2000 * BIG_DIM];
  for (int b = 0; b < 10; b++) { /* 20,000 rows: several chunks */
    for (int i = 0; i < 2000; i++)
      ids[i] = b * 2000 + i;
    assert_int_equal(embps_push(c, "big", ids, 2000, g, BIG_DIM, 0), 0);
  }
  char err[1024];
  /* bad BEGIN options */
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_SNAPSHOT_BEGIN;
  m.u.snap_begin.max_chunk_bytes = 100;
  assert_int_equal(call(c, &m, NULL, 0, err, sizeof err), EMBPS_EINVAL);
  assert_non_null(strstr(err, "max_chunk_bytes 100"));
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_SNAPSHOT_BEGIN;
  m.u.snap_begin.idle_ms = 5;
  assert_int_equal(call(c, &m, NULL, 0, err, sizeof err), EMBPS_EINVAL);
  assert_non_null(strstr(err, "idle_ms 5"));
  /* chunks bounded by the frame limit (1 MiB here) */
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_SNAPSHOT_BEGIN;
  m.u.snap_begin.max_chunk_bytes = 64u << 20;
  assert_int_equal(call(c, &m, NULL, 0, err, sizeof err), 0);
  const embps_snapshot_begin_reply_t b0 = m.u.snap_begin_reply;
  assert_true(b0.chunk_bytes <= 1048576 && b0.chunk_bytes > 1000000);
  assert_int_equal(b0.tables, 1);
  uint8_t *buf = malloc(b0.chunk_bytes);
  /* wrong READs */
  assert_int_equal(snap_read(c, b0.session ^ 1, 0, b0.chunk_bytes, buf, err,
                             sizeof err), EMBPS_EINVAL);
  assert_non_null(strstr(err, "no snapshot session"));
  assert_int_equal(snap_read(c, b0.session, 3, b0.chunk_bytes, buf, err,
                             sizeof err), EMBPS_EINVAL);
  assert_non_null(strstr(err, "READ of chunk 3, the next one is 0"));
  assert_int_equal(snap_read(c, b0.session, 0, b0.chunk_bytes - 1, buf, err,
                             sizeof err), EMBPS_EINVAL);
  assert_non_null(strstr(err, "its chunks are"));
  /* read it whole, then past its end */
  uint64_t seq = 0, offset = 0;
  for (;; seq++) {
    embps_msg_t rm;
    memset(&rm, 0, sizeof rm);
    rm.kind = EMBPS_KIND_SNAPSHOT_READ;
    rm.u.snap_read.session = b0.session;
    rm.u.snap_read.seq = seq;
    rm.u.snap_read.max_bytes = b0.chunk_bytes;
    assert_int_equal(call(c, &rm, buf, b0.chunk_bytes, err, sizeof err), 0);
    assert_int_equal(rm.u.snap_read_reply.seq, seq);
    assert_int_equal(rm.u.snap_read_reply.offset, offset);
    offset += n_got;
    if (rm.u.snap_read_reply.done)
      break;
  }
  assert_true(seq >= 1);
  assert_int_equal(snap_read(c, b0.session, seq + 1, b0.chunk_bytes, buf,
                             err, sizeof err), EMBPS_EINVAL);
  assert_non_null(strstr(err, "the stream ended"));
  /* END, then nothing of it is left */
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_SNAPSHOT_END;
  m.u.snap_session = b0.session;
  assert_int_equal(call(c, &m, NULL, 0, err, sizeof err), 0);
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_SNAPSHOT_END;
  m.u.snap_session = b0.session;
  assert_int_equal(call(c, &m, NULL, 0, err, sizeof err), EMBPS_EINVAL);
  assert_true(strstr(err, "no snapshot session") || strstr(err, "was ended"));
  /* the limit: the sessions after it are refused until one goes */
  embps_snapshot_t *open[8];
  embps_snapshot_options_t o = {.idle_ms = 60000};
  int k = 0;
  while (k < 8 && !embps_snapshot_begin(c, 0, &o, &open[k]))
    k++;
  assert_int_equal(k, 4);
  assert_non_null(strstr(embps_client_last_error(c), "at most 4"));
  embps_snapshot_end(open[--k]);
  embps_snapshot_options_t quick = {.idle_ms = 300};
  assert_int_equal(embps_snapshot_begin(c, 0, &quick, &open[k]), 0);
  /* expiry: an idle session goes and frees its place */
  const uint64_t idle = embps_snapshot_info(open[k])->session;
  it_sleep_ms(1200);
  embps_snapshot_t *more;
  assert_int_equal(embps_snapshot_begin(c, 0, &o, &more), 0);
  assert_int_equal(snap_read(c, idle, 0, 1u << 20, buf, err, sizeof err),
                   EMBPS_EINVAL);
  assert_true(strstr(err, "expired") || strstr(err, "no snapshot session"));
  embps_snapshot_end(more);
  for (int i = 0; i <= k; i++)
    embps_snapshot_end(open[i]);
  char *log = NULL;
  size_t len;
  assert_int_equal(embps_read_file(srv.log_file, &log, &len), 0);
  assert_non_null(strstr(log, "expired after 300 ms without a READ"));
  free(log);
  free(buf);
  embps_client_destroy(c);
  assert_int_equal(it_server_stop(&srv), 0);
}

/* DIR must be new or empty; nothing planted in it is followed; a failed
 * backup leaves nothing. */
static void test_backup_dir_rules(void **state) {
  (void)state;
  char root[64] = "/tmp/embps-snap-XXXXXX";
  assert_non_null(mkdtemp(root));
  it_server_t srv;
  assert_int_equal(it_server_start(&srv, NULL), 0);
  char out[128], target[128], link[200], file[128];
  snprintf(out, sizeof out, "%s/out", root);
  snprintf(target, sizeof target, "%s/elsewhere", root);
  snprintf(link, sizeof link, "%s/member-0.tmp", out);
  snprintf(file, sizeof file, "%s/file", root);
  assert_int_equal(mkdir(out, 0700), 0);
  assert_int_equal(mkdir(target, 0700), 0);
  assert_int_equal(symlink(target, link), 0);
  struct stat st;
  it_cli_result_t r;
  const char *cli[] = {"--servers", srv.addr, "backup", "--out", out, NULL};
  assert_int_equal(it_cli_run(&r, cli), 1);
  assert_non_null(strstr(r.err, "is not empty"));
  it_cli_result_free(&r);
  char **names;
  size_t n_names = dur_list_files(target, &names);
  dur_free_list(names, n_names);
  assert_int_equal(n_names, 0); /* nothing written through the link */
  assert_int_equal(lstat(link, &st), 0);
  assert_true(S_ISLNK(st.st_mode)); /* and the link left as it was */
  /* a file where DIR should be */
  FILE *f = fopen(file, "w");
  fclose(f);
  const char *cli2[] = {"--servers", srv.addr, "backup", "--out", file, NULL};
  assert_int_equal(it_cli_run(&r, cli2), 1);
  assert_non_null(strstr(r.err, "not a directory"));
  it_cli_result_free(&r);
  const char *cli3[] = {"--servers", srv.addr, "backup", NULL};
  assert_int_equal(it_cli_run(&r, cli3), 2);
  assert_non_null(strstr(r.err, "--out"));
  it_cli_result_free(&r);
  /* a server that is gone: nothing of the run stays */
  unlink(link);
  char fresh[128];
  snprintf(fresh, sizeof fresh, "%s/fresh", root);
  char addr[32];
  snprintf(addr, sizeof addr, "%s", srv.addr);
  assert_int_equal(it_server_stop(&srv), 0);
  const char *cli4[] = {"--servers", addr, "backup", "--out", fresh, NULL};
  assert_int_equal(it_cli_run(&r, cli4), 1);
  it_cli_result_free(&r);
  assert_int_equal(stat(fresh, &st), -1);
  dur_rm_rf(root);
}

int main(void) {
  if (!dur_engine_present())
    return DUR_SKIP;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sessions),
      cmocka_unit_test(test_backup_dir_rules),
      cmocka_unit_test(test_no_data_dir),
      cmocka_unit_test(test_no_data_dir_pushes),
      cmocka_unit_test(test_cluster_backup),
      cmocka_unit_test(test_backup_under_storm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
