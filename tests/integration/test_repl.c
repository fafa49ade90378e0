/* test_repl.c - followers (issue 21) against real servers on loopback:
 *  - exact: three followers (memory only; a data dir in --fsync always;
 *    one started in the middle of the storm, when the primary's backlog no
 *    longer holds its first records: it copies a snapshot) of a primary
 *    under a push storm of 4 workers over every optimizer, dtype, dense
 *    and dynamic tables, admission, TTL, LRU and LFU capacity, L2
 *    eviction, a synchronous table, imports, alters and a drop and create
 *    end equal to it, row for row (weights and optimizer state, bit for
 *    bit) and counter for counter; a follower refuses writes naming its
 *    primary;
 *  - reads: every row a follower's pull returns is the primary's at the
 *    LSN the reply says (rows all pushed together: one value per LSN), on
 *    a follower fed record by record and on one copying a snapshot;
 *  - proxy: a proxy between primary and follower cutting the connection
 *    and dropping FETCH replies at random: the follower resumes with no
 *    gap and no record twice (it ends equal);
 *  - restart: a follower with a data dir killed (-9) and stopped during
 *    pushes resumes from its own log, without a snapshot, and ends equal;
 *  - copy: a follower copies a snapshot when the primary's backlog and log
 *    no longer hold its next record, also after a kill -9 in the middle of
 *    a copy, and catches up from the primary's log without one when that
 *    still holds it (past the backlog, after the primary's restart);
 *  - sync: --sync-followers 1 with the follower stopped: a push is
 *    refused after --sync-timeout-ms with nothing changed on either
 *    server (not owed); with the follower frozen just after the gate, the
 *    push is applied but not acknowledged: the client keeps it owed (with
 *    and without retries), sends it again once, and it is applied once
 *    on both servers;
 *  - promote: a follower killed, its primary acknowledging 7 more pushes
 *    and killed; the follower restarted (its primary silent: it starts
 *    from its own log) and promoted; the old primary restarted as its
 *    follower cuts exactly those 7 (says so) and ends equal;
 *  - rejoin_copy: an old primary whose checkpoint holds records the new
 *    primary never had sets its state aside and copies the new one's;
 *  - pin_bound: a snapshot session keeps a memory-only primary's backlog
 *    only up to twice its bound;
 *  - retain: a follower away longer than --repl-retain-ms is not kept for
 *    by its primary's checkpoints: back, it copies a snapshot;
 *  - layout: a follower with another --shards than its primary's exits 2
 *    naming both, before it serves (or, its primary silent at its start,
 *    at its first contact). */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dur_util.h"
#include "frame.h"
#include "proxy.h"
#include "repl_util.h"
#include "snapshot.h" /* client/: a snapshot session left open */

#define DIM 8
#define DENSE_ROWS 512
#define START_MS 30000
#define CATCH_UP_MS 60000

/* ------------------------------------------------------------ servers */

/* Starts s (its data dir, or none) with args (NULL-terminated). */
static void start(dur_server_t *s, const char *data_dir,
                  const char *const *args) {
  if (!s->work[0])
    assert_int_equal(dur_server_init(s, data_dir), 0);
  int i = 0;
  for (; args && args[i]; i++)
    s->args[i] = args[i];
  s->args[i] = NULL;
  int rc = dur_server_start(s, START_MS);
  if (rc) {
    dur_server_dump_log(s);
    fail_msg("server did not start (%d)", rc);
  }
}

static void stop_server(dur_server_t *s) {
  if (s->pid && dur_server_term(s, 20000) != 0) {
    dur_server_dump_log(s);
    fail_msg("server %s did not stop cleanly", s->addr);
  }
}

static void cleanup(dur_server_t *s) {
  if (s->pid)
    dur_server_kill(s);
  if (s->data_dir[0])
    dur_rm_rf(s->data_dir);
  dur_server_cleanup(s);
}

static void new_dir(char *dir, size_t len, const char *what) {
  assert_int_equal(dur_mkdtemp(dir, len, what), 0);
}

static embps_client_t *connect_to(const char *addr, int retry_ms) {
  embps_client_t *c = dur_connect(addr, 20000, retry_ms, "connect");
  assert_non_null(c);
  return c;
}

/* Whether s's log holds `text`. */
static int log_has(const dur_server_t *s, const char *text) {
  char *log = dur_server_log(s);
  int has = log && strstr(log, text) != NULL;
  free(log);
  return has;
}

/* ------------------------------------------------------------ workload */

static const char *const OPTS[] = {"sgd", "adagrad", "adam", "ftrl"};
static const char *const DTYPES[] = {"f32", "f16", "bf16"};
#define N_PLAIN 24 /* 4 optimizers x 3 dtypes x dense, dynamic */

typedef struct {
  char names[N_PLAIN + 8][EMBPS_TABLE_NAME_MAX];
  int n;
} tables_t;

static void create(embps_client_t *c, const embps_table_spec_t *s) {
  int rc = embps_create_table(c, s);
  if (rc)
    fail_msg("create %s: %s", s->name, embps_client_last_error(c));
}

/* Every table of the storm, created through c; their names in t. */
static void create_tables(embps_client_t *c, tables_t *t) {
  t->n = 0;
  for (int o = 0; o < 4; o++)
    for (int d = 0; d < 3; d++)
      for (int dyn = 0; dyn < 2; dyn++) {
        embps_table_spec_t s;
        embps_optimizer_t opt;
        assert_int_equal(embps_optimizer_parse(OPTS[o], &opt), 0);
        snprintf(t->names[t->n], EMBPS_TABLE_NAME_MAX, "%s_%s_%s", OPTS[o],
                 DTYPES[d], dyn ? "dyn" : "dense");
        embps_table_spec_init(&s, t->names[t->n], DIM, opt);
        assert_int_equal(embps_dtype_parse(DTYPES[d], &s.dtype), 0);
        s.dynamic = dyn;
        s.rows = dyn ? 0 : DENSE_ROWS;
        s.init = EMBPS_INIT_UNIFORM;
        s.init_value = 0.1;
        s.seed = 7 + (uint64_t)t->n;
        create(c, &s);
        t->n++;
      }
  struct {
    const char *name;
    embps_optimizer_t opt;
    uint32_t admit_after;
    double admit_p;
    uint64_t ttl, max_rows;
    embps_evict_t evict;
    double l2;
  } pol[] = {
      {"adm_lru", EMBPS_OPT_ADAGRAD, 2, 0, 25, 300, EMBPS_EVICT_LRU, 0},
      {"lfu", EMBPS_OPT_ADAM, 0, 0.7, 0, 200, EMBPS_EVICT_LFU, 0},
      {"ttl_l2", EMBPS_OPT_SGD, 3, 0, 30, 0, EMBPS_EVICT_LRU, 0.02},
  };
  for (size_t i = 0; i < sizeof pol / sizeof *pol; i++) {
    embps_table_spec_t s;
    embps_table_spec_init(&s, pol[i].name, DIM, pol[i].opt);
    s.dynamic = 1;
    s.admit_after = pol[i].admit_after;
    s.admit_probability = pol[i].admit_p;
    s.admit_sketch_bytes = 4096;
    s.ttl_steps = pol[i].ttl;
    s.max_rows = pol[i].max_rows;
    s.evict = pol[i].evict;
    s.evict_l2_below = pol[i].l2;
    s.init = EMBPS_INIT_NORMAL;
    s.init_value = 0.05;
    create(c, &s);
    snprintf(t->names[t->n++], EMBPS_TABLE_NAME_MAX, "%s", pol[i].name);
  }
  embps_table_spec_t s;
  embps_table_spec_init(&s, "sync", DIM, EMBPS_OPT_ADAGRAD);
  s.rows = 64;
  s.sync_workers = 2;
  create(c, &s);
}

typedef struct {
  const char *addr;
  const tables_t *tables;
  int w, sync_steps;
  atomic_int *stop;
  uint64_t seed;
  int failed;
  char error[600];
  uint64_t pushes;
} worker_t;

static uint64_t rnd(uint64_t *s) { return rng_next(s); }

/* Pushes random batches (duplicates included) to random tables until
 * stop; workers 0 and 1 also push sync_steps synchronous steps, worker 0
 * imports rows and alters a learning rate, worker 1 evicts. */
static void *worker_main(void *arg) {
  worker_t *wk = arg;
  embps_client_t *c = dur_connect(wk->addr, 20000, 30000, NULL);
  if (!c) {
    wk->failed = 1;
    snprintf(wk->error, sizeof wk->error, "worker %d: no client", wk->w);
    return NULL;
  }
  uint64_t s = wk->seed;
  int64_t ids[64];
  float vals[64 * DIM], acc[4 * DIM];
  for (int it = 0;; it++) {
    if (it >= wk->sync_steps && atomic_load(wk->stop))
      break;
    const char *name = wk->tables->names[rnd(&s) % wk->tables->n];
    int dyn = strstr(name, "dense") == NULL;
    uint32_t n = 8 + (uint32_t)(rnd(&s) % 48);
    for (uint32_t i = 0; i < n; i++) {
      ids[i] = (int64_t)(rnd(&s) % (dyn ? 3000 : DENSE_ROWS));
      if (i && rnd(&s) % 5 == 0)
        ids[i] = ids[rnd(&s) % i]; /* a duplicate */
    }
    for (uint32_t i = 0; i < n * DIM; i++)
      vals[i] = (float)((double)(rnd(&s) % 2001) / 1000.0 - 1.0);
    int rc = embps_push(c, name, ids, n, vals, DIM, 0);
    if (!rc && wk->w < 2 && it < wk->sync_steps) {
      int64_t sync_ids[4] = {it % 64, (it * 7 + wk->w) % 64, 5, 60};
      rc = embps_push_step(c, "sync", sync_ids, 4, vals, DIM, 0,
                           (uint64_t)it + 1);
    }
    if (!rc && wk->w == 0 && it % 13 == 5) {
      int64_t rows[4] = {1, 2, 3, (int64_t)(rnd(&s) % DENSE_ROWS)};
      if (rows[3] < 4)
        rows[3] = 100;
      for (int i = 0; i < 4 * DIM; i++) /* accumulators: >= 0 */
        acc[i] = (float)(rnd(&s) % 100) / 50;
      rc = embps_write_rows(c, "adagrad_f32_dense", rows, 4, vals, DIM, acc,
                            0, 0);
    }
    if (!rc && wk->w == 0 && it % 29 == 7)
      rc = embps_set_lr(c, "sgd_f16_dense", 0.01 + (double)(it % 7) / 100);
    if (!rc && wk->w == 1 && it % 37 == 11) {
      uint64_t evicted;
      rc = embps_evict(c, "ttl_l2", &evicted);
    }
    if (rc) {
      wk->failed = 1;
      snprintf(wk->error, sizeof wk->error, "worker %d: %s", wk->w,
               embps_client_last_error(c));
      break;
    }
    wk->pushes++;
  }
  embps_client_destroy(c);
  return NULL;
}

/* Runs n workers on addr for ms, and until meanwhile(arg) ran `rounds`
 * times (every 150 ms), with a drop and create of a table meanwhile
 * (through c, unless NULL), then stops them; fails on a worker error. */
static void storm(const char *addr, const tables_t *t, int n, int ms,
                  embps_client_t *c, void (*meanwhile)(void *), void *arg,
                  int rounds) {
  pthread_t th[8];
  worker_t wk[8];
  atomic_int stop = 0;
  for (int i = 0; i < n; i++) {
    wk[i] = (worker_t){.addr = addr, .tables = t, .w = i, .stop = &stop,
                       .seed = 1000 + (uint64_t)i * 77,
                       .sync_steps = 25};
    assert_int_equal(pthread_create(&th[i], NULL, worker_main, &wk[i]), 0);
  }
  double until = dur_now_ms() + ms;
  int round = 0;
  while (dur_now_ms() < until || round < rounds) {
    if (c) { /* a table that comes and goes */
      embps_table_spec_t s;
      embps_table_spec_init(&s, "tmp", 4 + round % 3, EMBPS_OPT_ADAGRAD);
      s.rows = 32;
      create(c, &s);
      int64_t ids[2] = {1, 5};
      float v[2 * 6] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
      assert_int_equal(embps_push(c, "tmp", ids, 2, v, s.dim, 0), 0);
      assert_int_equal(embps_drop_table(c, "tmp"), 0);
    }
    round++;
    if (meanwhile)
      meanwhile(arg);
    dur_sleep_ms(150);
  }
  atomic_store(&stop, 1);
  uint64_t pushes = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(th[i], NULL);
    if (wk[i].failed)
      fail_msg("%s", wk[i].error);
    pushes += wk[i].pushes;
  }
  printf("[repl] storm: %d workers, %llu pushes, %d rounds\n", n,
         (unsigned long long)pushes, round);
  assert_true(pushes > 100);
}

/* ------------------------------------------------------------ exact */

/* Pushes every row of the dense table name (dim DIM) n times: records of
 * 20 KiB that fill a backlog. */
static void push_whole(embps_client_t *c, const char *name, int n) {
  int64_t ids[DENSE_ROWS];
  static float g[DENSE_ROWS * DIM];
  for (int i = 0; i < DENSE_ROWS; i++)
    ids[i] = i;
  for (int i = 0; i < DENSE_ROWS * DIM; i++)
    g[i] = (float)((i % 7) - 3) / 100;
  for (int k = 0; k < n; k++)
    assert_int_equal(embps_push(c, name, ids, DENSE_ROWS, g, DIM, 0), 0);
}

typedef struct {
  dur_server_t *f;
  const char *const *args;
  int round, at;
} late_t;

/* Starts the late follower at round `at` of a storm. */
static void start_late(void *arg) {
  late_t *l = arg;
  if (l->round++ == l->at)
    start(l->f, NULL, l->args);
}

static void test_exact(void **state) {
  dur_server_t p = {0}, f1 = {0}, f2 = {0}, f3 = {0};
  char d2[512];
  new_dir(d2, sizeof d2, "f2");
  /* a backlog of 1 MiB: the late follower must copy a snapshot */
  start(&p, NULL,
        (const char *const[]){"--shards", "8", "--repl-backlog-bytes",
                              "1048576", NULL});
  char follow[64];
  snprintf(follow, sizeof follow, "%s", p.addr);
  const char *const fargs[] = {"--shards", "8", "--follow", follow, NULL};
  start(&f1, NULL, fargs);
  f2.fsync = "always";
  start(&f2, d2, fargs);
  /* no snapshot for these two: they fetch before the first record */
  assert_int_equal(repl_wait_in_sync(p.addr, 2, 10000), 0);
  embps_client_t *c = connect_to(p.addr, 30000);
  tables_t t;
  create_tables(c, &t);
  push_whole(c, "sgd_f32_dense", 64); /* 1.3 MB of records */
  late_t late = {.f = &f3, .args = fargs, .at = 3};
  storm(p.addr, &t, 4, 3000, c, start_late, &late, 6);
  assert_int_equal(repl_wait_caught_up(p.addr, f1.addr, CATCH_UP_MS), 0);
  assert_int_equal(repl_wait_caught_up(p.addr, f2.addr, CATCH_UP_MS), 0);
  assert_int_equal(repl_wait_caught_up(p.addr, f3.addr, CATCH_UP_MS), 0);
  assert_int_equal(repl_compare(p.addr, f1.addr, "follower (memory)",
                                !log_has(&f1, "copying a snapshot")),
                   0);
  assert_int_equal(repl_compare(p.addr, f2.addr, "follower (data dir)",
                                !log_has(&f2, "copying a snapshot")),
                   0);
  assert_true(log_has(&f3, "copying a snapshot"));
  assert_int_equal(repl_compare(p.addr, f3.addr, "late follower (copy)", 0),
                   0);
  embps_server_stats_t sp, sf;
  assert_int_equal(repl_stats(p.addr, &sp), 0);
  assert_int_equal(repl_stats(f2.addr, &sf), 0);
  assert_int_equal(sp.role, 0);
  assert_int_equal(sf.role, 1);
  assert_string_equal(sf.primary, p.addr);
  assert_int_equal(sf.lag_records, 0);
  assert_true(sp.bytes_shipped > 0 && sf.bytes_shipped > 0);
  assert_true(sp.applied_lsn > 500);
  assert_int_equal(sp.followers, 3);
  /* writes to a follower are refused, naming its primary */
  embps_client_t *cf = connect_to(f1.addr, -1);
  int64_t id = 1;
  float v[DIM] = {1};
  assert_int_equal(embps_push(cf, "sgd_f32_dense", &id, 1, v, DIM, 0),
                   EMBPS_ENOTPRIMARY);
  assert_non_null(strstr(embps_client_last_error(cf), p.addr));
  assert_int_equal(embps_drop_table(cf, "sgd_f32_dense"), EMBPS_ENOTPRIMARY);
  embps_client_destroy(cf);
  /* ...by a client that takes the list as it is; by default an entry of
     one server is a seed: the follower names its primary in its hello,
     and the push goes there, applied once (no retry needed) */
  embps_client_options_t so;
  embps_client_options_init(&so);
  so.servers = f1.addr;
  so.retry_ms = -1;
  char serr[512];
  embps_client_t *cs = NULL;
  assert_int_equal(embps_client_create(&so, &cs, serr, sizeof serr), 0);
  assert_int_equal(repl_stats(p.addr, &sp), 0);
  const uint64_t pushes_before = sp.pushes;
  assert_int_equal(embps_push(cs, "sgd_f32_dense", &id, 1, v, DIM, 0), 0);
  assert_string_equal(embps_client_server_address(cs, 0), p.addr);
  assert_int_equal(repl_stats(p.addr, &sp), 0);
  assert_int_equal(sp.pushes, pushes_before + 1);
  embps_client_destroy(cs);
  embps_client_destroy(c);
  /* the follower with a data dir restores to the same state */
  stop_server(&f2);
  start(&f2, d2,
        (const char *const[]){"--shards", "8", "--follow", follow, NULL});
  assert_int_equal(repl_wait_caught_up(p.addr, f2.addr, CATCH_UP_MS), 0);
  assert_int_equal(repl_compare(p.addr, f2.addr, "follower restarted", 0),
                   0);
  stop_server(&f1);
  stop_server(&f2);
  stop_server(&f3);
  stop_server(&p);
  cleanup(&p);
  cleanup(&f1);
  cleanup(&f2);
  cleanup(&f3);
}

/* ------------------------------------------------------------ reads */

#define R_ROWS 2048
#define R_DIM 16

typedef struct {
  const char *addr;
  atomic_int *stop;
  int reads, wrong, lsns;
  _Atomic uint64_t last_lsn;
} reader_t;

static void *reader_main(void *arg) {
  reader_t *r = arg;
  int64_t *ids = malloc(R_ROWS * sizeof *ids);
  float *out = malloc((size_t)R_ROWS * R_DIM * sizeof *out);
  for (int i = 0; i < R_ROWS; i++)
    ids[i] = R_ROWS - 1 - i;
  while (!atomic_load(r->stop)) {
    uint64_t lsn;
    if (repl_pull_lsn(r->addr, "r", ids, R_ROWS, R_DIM, out, &lsn))
      continue;
    r->reads++;
    if (lsn != r->last_lsn)
      r->lsns++;
    r->last_lsn = lsn;
    /* LSN 1 made the table; push k (LSN k + 1) leaves every value k */
    for (size_t i = 0; i < (size_t)R_ROWS * R_DIM; i++) {
      if (out[i] != (float)(lsn - 1)) {
        if (r->wrong++ < 5)
          fprintf(stderr, "read at LSN %llu: row %lld holds %g, the "
                  "primary's at that LSN is %llu\n",
                  (unsigned long long)lsn, (long long)ids[i / R_DIM],
                  (double)out[i], (unsigned long long)(lsn - 1));
        break;
      }
    }
  }
  free(ids);
  free(out);
  return NULL;
}

/* Two readers on the follower at addr, started into rd and th. */
static void readers_start(const char *addr, atomic_int *stop, reader_t *rd,
                          pthread_t *th) {
  for (int i = 0; i < 2; i++) {
    rd[i] = (reader_t){.addr = addr, .stop = stop};
    assert_int_equal(pthread_create(&th[i], NULL, reader_main, &rd[i]), 0);
  }
}

/* Waits until both readers read at LSN lsn or later (so reads are seen
 * at several LSNs however fast the follower applies). */
static void readers_reach(reader_t *rd, uint64_t lsn) {
  for (double until = dur_now_ms() + CATCH_UP_MS;
       (atomic_load(&rd[0].last_lsn) < lsn ||
        atomic_load(&rd[1].last_lsn) < lsn) && dur_now_ms() < until;)
    dur_sleep_ms(1);
}

/* Joins them and checks what they read: every row right, at min_lsns
 * LSNs at least (reads went on while records were applied). */
static void readers_check(const char *what, reader_t *rd, pthread_t *th,
                          int min_lsns) {
  int reads = 0, wrong = 0, lsns = 0;
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    reads += rd[i].reads;
    wrong += rd[i].wrong;
    lsns += rd[i].lsns;
  }
  printf("[repl] reads (%s): %d pulls of %d rows on the follower, %d "
         "distinct LSNs seen, %d not the primary's\n", what, reads, R_ROWS,
         lsns, wrong);
  assert_int_equal(wrong, 0);
  assert_true(lsns >= min_lsns);
}

static void push_r(embps_client_t *c, int n) {
  int64_t *ids = malloc(R_ROWS * sizeof *ids);
  float *g = malloc((size_t)R_ROWS * R_DIM * sizeof *g);
  for (int i = 0; i < R_ROWS; i++)
    ids[i] = i;
  for (size_t i = 0; i < (size_t)R_ROWS * R_DIM; i++)
    g[i] = -1;
  for (int k = 0; k < n; k++)
    assert_int_equal(embps_push(c, "r", ids, R_ROWS, g, R_DIM, 0), 0);
  free(ids);
  free(g);
}

/* Reads on a follower fed record by record, and on one that copies a
 * snapshot meanwhile (the primary's backlog of 1 MiB holds 8 of these
 * 128 KiB pushes): every row pulled is the primary's at the LSN the reply
 * says, the copy going in included. */
static void test_reads(void **state) {
  dur_server_t p = {0}, f = {0}, f2 = {0};
  start(&p, NULL,
        (const char *const[]){"--omp-threads", "2", "--repl-backlog-bytes",
                              "1048576", NULL});
  char follow[64];
  snprintf(follow, sizeof follow, "%s", p.addr);
  const char *const fargs[] = {"--omp-threads", "2", "--follow", follow,
                               NULL};
  start(&f, NULL, fargs);
  assert_int_equal(repl_wait_in_sync(p.addr, 1, 10000), 0);
  embps_client_t *c = connect_to(p.addr, 30000);
  embps_table_spec_t s;
  embps_table_spec_init(&s, "r", R_DIM, EMBPS_OPT_SGD);
  s.rows = R_ROWS;
  s.lr = 1;
  create(c, &s);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  atomic_int stop = 0;
  reader_t rd[2];
  pthread_t th[2];
  readers_start(f.addr, &stop, rd, th);
  for (int k = 0; k < 300; k += 20) {
    push_r(c, 20);
    assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
    readers_reach(rd, (uint64_t)k + 21);
  }
  dur_sleep_ms(100);
  atomic_store(&stop, 1);
  readers_check("fed", rd, th, 10);

  /* a follower that copies, read from before it has the table, pushes
   * going on until 50 after its copy went in */
  start(&f2, NULL, fargs);
  atomic_store(&stop, 0);
  readers_start(f2.addr, &stop, rd, th);
  int pushed = 300;
  for (double until = dur_now_ms() + CATCH_UP_MS;
       !log_has(&f2, "replaces this server's state") && dur_now_ms() < until;
       pushed++)
    push_r(c, 1);
  assert_true(log_has(&f2, "copying a snapshot"));
  push_r(c, 50);
  pushed += 50;
  assert_int_equal(repl_wait_caught_up(p.addr, f2.addr, CATCH_UP_MS), 0);
  dur_sleep_ms(100);
  atomic_store(&stop, 1);
  readers_check("copying", rd, th, 2); /* the copy, then records */

  int64_t *ids = malloc(R_ROWS * sizeof *ids);
  for (int i = 0; i < R_ROWS; i++)
    ids[i] = i;
  float *out = malloc((size_t)R_ROWS * R_DIM * sizeof *out);
  uint64_t lsn;
  assert_int_equal(repl_pull_lsn(f2.addr, "r", ids, R_ROWS, R_DIM, out,
                                 &lsn), 0);
  assert_int_equal(lsn, (uint64_t)pushed + 1);
  for (size_t i = 0; i < (size_t)R_ROWS * R_DIM; i++)
    assert_true(out[i] == (float)pushed);
  free(out);
  free(ids);
  embps_client_destroy(c);
  stop_server(&f);
  stop_server(&f2);
  stop_server(&p);
  cleanup(&p);
  cleanup(&f);
  cleanup(&f2);
}

/* ------------------------------------------------------------ proxy */

typedef struct {
  it_proxy_t *x;
  uint64_t seed;
  int cuts;
} chaos_t;

static void chaos(void *arg) {
  chaos_t *ch = arg;
  switch (rng_next(&ch->seed) % 3) {
  case 0:
    it_proxy_cut(ch->x);
    break;
  case 1: /* the primary served a FETCH; the follower never sees it */
    it_proxy_arm(ch->x, IT_PROXY_DROP_REPLY, EMBPS_KIND_FETCH,
                 1 + (unsigned)(rng_next(&ch->seed) % 3));
    break;
  default:
    it_proxy_arm(ch->x, IT_PROXY_DROP_REQUEST, EMBPS_KIND_FETCH, 1);
    break;
  }
  ch->cuts++;
}

static void test_proxy(void **state) {
  dur_server_t p = {0}, f = {0};
  start(&p, NULL, NULL);
  it_proxy_t *x;
  assert_int_equal(it_proxy_start(&x, p.addr), 0);
  char follow[64];
  snprintf(follow, sizeof follow, "%s", it_proxy_addr(x));
  start(&f, NULL, (const char *const[]){"--follow", follow, NULL});
  assert_int_equal(repl_wait_in_sync(p.addr, 1, 10000), 0);
  embps_client_t *c = connect_to(p.addr, 30000);
  tables_t t;
  create_tables(c, &t);
  chaos_t ch = {.x = x, .seed = dur_seed()};
  storm(p.addr, &t, 3, 4000, NULL, chaos, &ch, 20);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  it_proxy_counts_t n;
  it_proxy_counts(x, &n);
  printf("[repl] proxy: %u connections, %u faults fired, %u FETCHes\n",
         n.connections, n.faults_fired, n.requests[EMBPS_KIND_FETCH]);
  assert_true(n.connections >= 5);
  assert_true(n.faults_fired >= 3);
  assert_int_equal(
      repl_compare(p.addr, f.addr, "follower behind a proxy", 1), 0);
  assert_false(log_has(&f, "stopped following"));
  embps_client_destroy(c);
  stop_server(&f);
  stop_server(&p);
  it_proxy_stop(x);
  cleanup(&p);
  cleanup(&f);
}

/* ------------------------------------------------------------ restart */

typedef struct {
  dur_server_t *f;
  const char *follow;
  int round;
  int restarts, resumed;
} restarts_t;

/* Every 4th call kills (-9) or stops the follower, then starts it again
 * on its data dir: it must resume from its own log (the LSN it says it
 * follows from, once it does). */
static void restart_follower(void *arg) {
  restarts_t *r = arg;
  if (r->round++ % 4 != 1)
    return;
  /* it has a record to resume after (a loaded machine may not have let
     it fetch any yet, the first time: it would start from LSN 1) */
  embps_server_stats_t st;
  for (double until = dur_now_ms() + 30000;
       (repl_stats(r->f->addr, &st) || !st.applied_lsn) &&
       dur_now_ms() < until;
       dur_sleep_ms(20)) {
  }
  assert_true(st.applied_lsn > 0);
  if (r->round % 8 < 4)
    dur_server_kill(r->f);
  else
    assert_int_equal(dur_server_term(r->f, 20000), 0);
  start(r->f, r->f->data_dir,
        (const char *const[]){"--follow", r->follow, NULL});
  r->restarts++;
  unsigned long long from = 0;
  for (double until = dur_now_ms() + 20000; dur_now_ms() < until;
       dur_sleep_ms(20)) {
    char *log = dur_server_log(r->f);
    const char *at = log ? strstr(log, "following") : NULL;
    int found = at && sscanf(at, "following %*s from LSN %llu", &from) == 1;
    free(log);
    if (found)
      break;
  }
  if (from > 1) {
    r->resumed++;
  } else { /* kept for whoever reads a failure */
    fprintf(stderr, "restart %d: the follower did not say it resumed from "
            "its log (from LSN %llu); its log:\n", r->restarts, from);
    dur_server_dump_log(r->f);
  }
}

static void test_restart(void **state) {
  dur_server_t p = {0}, f = {0};
  char d[512];
  new_dir(d, sizeof d, "fr");
  start(&p, NULL, NULL);
  char follow[64];
  snprintf(follow, sizeof follow, "%s", p.addr);
  start(&f, d, (const char *const[]){"--follow", follow, NULL});
  assert_int_equal(repl_wait_in_sync(p.addr, 1, 10000), 0);
  embps_client_t *c = connect_to(p.addr, 30000);
  tables_t t;
  create_tables(c, &t);
  restarts_t r = {.f = &f, .follow = follow};
  storm(p.addr, &t, 3, 3000, NULL, restart_follower, &r, 16);
  printf("[repl] restart: the follower resumed from its log %d times of "
         "%d\n", r.resumed, r.restarts);
  assert_true(r.restarts >= 4);
  assert_int_equal(r.resumed, r.restarts);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_int_equal(repl_compare(p.addr, f.addr, "follower restarted", 0),
                   0);
  assert_false(log_has(&f, "snapshot"));
  embps_client_destroy(c);
  stop_server(&f);
  stop_server(&p);
  cleanup(&p);
  cleanup(&f);
}

/* ------------------------------------------------------------ copy */

/* Waits until s's log holds text; 0, or -1 after timeout_ms. */
static int wait_log(const dur_server_t *s, const char *text, int timeout_ms) {
  for (double until = dur_now_ms() + timeout_ms; dur_now_ms() < until;
       dur_sleep_ms(5))
    if (log_has(s, text))
      return 0;
  return -1;
}

/* Pushes n whole-table records through *c (past the primary's backlog of
 * 1 MiB); with forget, the primary p then restarts (it forgets its
 * followers, whose records its checkpoints keep in its log for
 * --repl-retain-ms) and checkpoints: its log's segments before that
 * are deleted. */
static void move_on(dur_server_t *p, embps_client_t **c, int n, int forget) {
  push_whole(*c, "adam_f32_dense", n);
  if (!forget)
    return;
  embps_client_destroy(*c);
  stop_server(p);
  start(p, p->data_dir, p->args);
  *c = connect_to(p->addr, 30000);
  assert_int_equal(embps_checkpoint(*c, NULL), 0);
}

/* A follower with a data dir of a primary with one (a backlog of 1 MiB):
 * it copies a snapshot when the primary's backlog and log no longer hold
 * its next record (it joins after a checkpoint; it restarts after one it
 * was not kept for; it is killed in the middle of a copy), and catches up
 * from the primary's log, without a copy, when that still holds it (past
 * the backlog; after a kill -9; after the primary's restart, which empties
 * its backlog). Equal to the primary after each. */
static void test_copy(void **state) {
  dur_server_t p = {0}, f = {0};
  char dp[512], df[512];
  new_dir(dp, sizeof dp, "cp");
  new_dir(df, sizeof df, "cf");
  start(&p, dp, (const char *const[]){"--repl-backlog-bytes", "1048576",
                                      NULL});
  char follow[64];
  snprintf(follow, sizeof follow, "%s", p.addr);
  const char *const fargs[] = {"--follow", follow, NULL};
  embps_client_t *c = connect_to(p.addr, 30000);
  tables_t t;
  create_tables(c, &t);
  move_on(&p, &c, 64, 1);
  start(&f, df, fargs);
  storm(p.addr, &t, 3, 2000, NULL, NULL, NULL, 0);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_true(log_has(&f, "copying a snapshot"));
  assert_int_equal(repl_compare(p.addr, f.addr, "joined after a checkpoint",
                                0), 0);

  /* stopped while the primary's backlog moves on: its log serves */
  stop_server(&f);
  move_on(&p, &c, 64, 0);
  assert_int_equal(embps_checkpoint(c, NULL), 0); /* kept for it */
  start(&f, df, fargs);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_false(log_has(&f, "snapshot"));
  assert_int_equal(repl_compare(p.addr, f.addr, "caught up from the log", 0),
                   0);

  /* stopped while the primary forgets it and checkpoints: a copy again */
  stop_server(&f);
  move_on(&p, &c, 64, 1);
  start(&f, df, fargs);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_true(log_has(&f, "copying a snapshot"));
  assert_int_equal(repl_compare(p.addr, f.addr, "restarted past a "
                                "checkpoint", 0), 0);

  /* killed while it copies (or just after): starts again and ends equal */
  dur_server_kill(&f);
  move_on(&p, &c, 64, 1);
  start(&f, df, fargs);
  assert_int_equal(wait_log(&f, "copying a snapshot", 20000), 0);
  dur_server_kill(&f);
  start(&f, df, fargs);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_int_equal(repl_compare(p.addr, f.addr, "killed in a copy", 0), 0);

  /* killed, then a few records: no copy */
  dur_server_kill(&f);
  move_on(&p, &c, 4, 0);
  start(&f, df, fargs);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_false(log_has(&f, "snapshot"));
  assert_int_equal(repl_compare(p.addr, f.addr, "resumed", 0), 0);

  /* the primary restarted under it: its backlog is empty, and its final
   * checkpoint kept in its log what the follower lacked (an L2 eviction
   * of that checkpoint's) */
  embps_client_destroy(c);
  stop_server(&p);
  start(&p, dp, p.args);
  c = connect_to(p.addr, 30000);
  push_whole(c, "adam_f32_dense", 4);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_false(log_has(&f, "snapshot"));
  assert_int_equal(repl_compare(p.addr, f.addr, "primary restarted", 0), 0);
  embps_client_destroy(c);
  stop_server(&f);
  stop_server(&p);
  cleanup(&p);
  cleanup(&f);
}

/* ------------------------------------------------------------ sync */

static float witness(const char *addr) {
  embps_client_t *c = connect_to(addr, -1);
  int64_t id = 3;
  float v[4];
  assert_int_equal(embps_pull(c, "w", &id, 1, v, 4), 0);
  embps_client_destroy(c);
  return v[0];
}

/* SIGSTOPs server s and waits until it is stopped (kill returns before
 * every thread of it is). */
static void freeze(dur_server_t *s) {
  int st;
  assert_int_equal(kill(s->pid, SIGSTOP), 0);
  while (waitpid(s->pid, &st, WUNTRACED) < 0)
    assert_int_equal(errno, EINTR);
  assert_true(WIFSTOPPED(st));
}

static void test_sync(void **state) {
  dur_server_t p = {0}, f = {0};
  char d[512];
  new_dir(d, sizeof d, "fs");
  start(&p, NULL,
        (const char *const[]){"--sync-followers", "1", "--sync-timeout-ms",
                              "700", NULL});
  char follow[64];
  snprintf(follow, sizeof follow, "%s", p.addr);
  f.fsync = "always";
  start(&f, d, (const char *const[]){"--follow", follow, NULL});
  assert_int_equal(repl_wait_in_sync(p.addr, 1, 10000), 0);
  embps_client_t *c = connect_to(p.addr, -1);
  embps_table_spec_t s;
  embps_table_spec_init(&s, "w", 4, EMBPS_OPT_SGD);
  s.rows = 8;
  s.lr = 1;
  create(c, &s);
  int64_t id = 3;
  float g[4] = {-1, -1, -1, -1};
  assert_int_equal(embps_push(c, "w", &id, 1, g, 4, 0), 0);
  /* acknowledged: the follower has it already */
  assert_true(witness(f.addr) == 1);

  /* the follower gone: refused after the timeout, nothing changed */
  assert_int_equal(dur_server_term(&f, 20000), 0);
  double until = dur_now_ms() + 10000;
  embps_server_stats_t st;
  while (!repl_stats(p.addr, &st) && st.followers_in_sync &&
         dur_now_ms() < until)
    dur_sleep_ms(50);
  assert_int_equal(st.followers_in_sync, 0);
  const uint64_t lsn = st.applied_lsn;
  double t0 = dur_now_ms();
  assert_int_equal(embps_push(c, "w", &id, 1, g, 4, 0), EMBPS_ENOREPLICAS);
  double waited = dur_now_ms() - t0;
  printf("[repl] sync: refused after %.0f ms: %s\n", waited,
         embps_client_last_error(c));
  assert_true(waited >= 600);
  assert_non_null(strstr(embps_client_last_error(c), "nothing changed"));
  assert_int_equal(embps_push_owed(c), 0); /* refused: not owed */
  assert_true(witness(p.addr) == 1);
  assert_int_equal(repl_stats(p.addr, &st), 0);
  assert_int_equal(st.applied_lsn, lsn);
  embps_table_spec_t s2;
  embps_table_spec_init(&s2, "x", 4, EMBPS_OPT_SGD);
  s2.rows = 8;
  assert_int_equal(embps_create_table(c, &s2), EMBPS_ENOREPLICAS);
  start(&f, d, (const char *const[]){"--follow", follow, NULL});
  assert_int_equal(repl_wait_in_sync(p.addr, 1, 10000), 0);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_true(witness(f.addr) == 1);
  assert_int_equal(repl_compare(p.addr, f.addr, "after a refusal", 0), 0);
  assert_int_equal(embps_push(c, "w", &id, 1, g, 4, 0), 0);
  assert_true(witness(f.addr) == 2);

  /* frozen after the gate let the push in: applied, not acknowledged */
  assert_int_equal(repl_wait_in_sync(p.addr, 1, 30000), 0);
  freeze(&f);
  assert_int_equal(embps_push(c, "w", &id, 1, g, 4, 0), EMBPS_ENOREPLICAS);
  printf("[repl] sync: %s\n", embps_client_last_error(c));
  assert_non_null(strstr(embps_client_last_error(c), "applied here"));
  assert_non_null(strstr(embps_client_last_error(c), "do not push it again"));
  assert_int_equal(embps_push_owed(c), 1); /* kept: sent again, once */
  assert_true(witness(p.addr) == 3);
  kill(f.pid, SIGCONT);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_int_equal(embps_push_resume(c), 0); /* a duplicate: acknowledged */
  assert_int_equal(embps_push_owed(c), 0);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_true(witness(f.addr) == 3);
  assert_true(witness(p.addr) == 3);

  /* the same with retries for longer than the timeout: each retry is a
     duplicate (answered before the gate, which would say "nothing
     changed"), refused again with the record's LSN; once the retry time
     is over the push is owed, applied once */
  embps_client_t *r = connect_to(p.addr, 2000);
  assert_int_equal(repl_wait_in_sync(p.addr, 1, 30000), 0);
  freeze(&f);
  t0 = dur_now_ms();
  assert_int_equal(embps_push(r, "w", &id, 1, g, 4, 0), EMBPS_ENOREPLICAS);
  printf("[repl] sync: retried for %.0f ms: %s\n", dur_now_ms() - t0,
         embps_client_last_error(r));
  assert_non_null(strstr(embps_client_last_error(r), "was applied but not "
                         "acknowledged"));
  assert_int_equal(embps_push_owed(r), 1);
  assert_true(witness(p.addr) == 4);
  kill(f.pid, SIGCONT);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  /* the next push sends the owed one first: both acknowledged, once */
  assert_int_equal(embps_push(r, "w", &id, 1, g, 4, 0), 0);
  assert_int_equal(embps_push_owed(r), 0);
  assert_int_equal(embps_push_resume(r), 0);
  assert_true(witness(p.addr) == 5);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_true(witness(f.addr) == 5);
  embps_client_destroy(r);
  embps_client_destroy(c);
  stop_server(&f);
  stop_server(&p);
  cleanup(&p);
  cleanup(&f);
}

/* ------------------------------------------------------------ promote */

static void push_n(const char *addr, int n) {
  embps_client_t *c = connect_to(addr, -1);
  int64_t id = 3;
  float g[4] = {-1, -1, -1, -1};
  for (int i = 0; i < n; i++)
    assert_int_equal(embps_push(c, "w", &id, 1, g, 4, 0), 0);
  embps_client_destroy(c);
}

static void test_promote(void **state) {
  dur_server_t a = {0}, b = {0};
  char da[512], db[512];
  new_dir(da, sizeof da, "pa");
  new_dir(db, sizeof db, "pb");
  start(&a, da, NULL);
  char follow_a[64], follow_b[64];
  snprintf(follow_a, sizeof follow_a, "%s", a.addr);
  start(&b, db, (const char *const[]){"--follow", follow_a, NULL});
  assert_int_equal(repl_wait_in_sync(a.addr, 1, 10000), 0);
  embps_client_t *c = connect_to(a.addr, -1);
  embps_table_spec_t s;
  embps_table_spec_init(&s, "w", 4, EMBPS_OPT_SGD);
  s.rows = 8;
  s.lr = 1;
  create(c, &s);
  embps_client_destroy(c);
  push_n(a.addr, 5);
  assert_int_equal(repl_wait_caught_up(a.addr, b.addr, CATCH_UP_MS), 0);
  /* 7 pushes the follower never gets (it is down): acknowledged
   * (asynchronous), then the primary is lost too */
  dur_server_kill(&b);
  push_n(a.addr, 7); /* LSN 7 to 13 */
  dur_server_kill(&a);
  /* the follower back: its primary does not answer (it waits 10 s for
   * it), so it starts from its own log, LSN 6 */
  start(&b, db, (const char *const[]){"--follow", follow_a, NULL});
  embps_server_stats_t st;
  assert_int_equal(repl_stats(b.addr, &st), 0);
  assert_int_equal(st.applied_lsn, 6);
  assert_true(log_has(&b, "did not answer"));
  char *out = NULL, *err = NULL;
  int rc = dur_cli(b.addr, (const char *const[]){"promote", NULL}, &out, &err);
  printf("[repl] promote: %s%s", out ? out : "", err ? err : "");
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "epoch 2 from LSN 7"));
  free(out);
  free(err);
  rc = dur_cli(b.addr, (const char *const[]){"promote", NULL}, &out, &err);
  assert_int_not_equal(rc, 0); /* a primary already */
  free(out);
  free(err);
  push_n(b.addr, 3);
  /* the old primary back as the new one's follower: its 7 records cut */
  snprintf(follow_b, sizeof follow_b, "%s", b.addr);
  start(&a, da, (const char *const[]){"--follow", follow_b, NULL});
  assert_int_equal(repl_wait_caught_up(b.addr, a.addr, CATCH_UP_MS), 0);
  assert_true(log_has(&a, "cut 7 records (LSN 7 to 13)"));
  assert_true(witness(a.addr) == 8);
  assert_true(witness(b.addr) == 8);
  assert_int_equal(repl_compare(b.addr, a.addr, "rejoined old primary", 0),
                   0);
  embps_client_t *ca = connect_to(a.addr, -1);
  int64_t id = 3;
  float g[4] = {-1, -1, -1, -1};
  assert_int_equal(embps_push(ca, "w", &id, 1, g, 4, 0), EMBPS_ENOTPRIMARY);
  assert_non_null(strstr(embps_client_last_error(ca), b.addr));
  embps_client_destroy(ca);
  stop_server(&a);
  stop_server(&b);
  cleanup(&a);
  cleanup(&b);
}

/* An old primary whose checkpoint holds records the new primary never had
 * (written after its follower was lost): on rejoining it cannot cut them
 * from its log alone, so its state is set aside (DIR/diverged) and it
 * copies the new primary's. */
static void test_rejoin_copy(void **state) {
  dur_server_t a = {0}, b = {0};
  char da[512], db[512];
  new_dir(da, sizeof da, "ra");
  new_dir(db, sizeof db, "rb");
  start(&a, da, NULL);
  char follow_a[64], follow_b[64];
  snprintf(follow_a, sizeof follow_a, "%s", a.addr);
  start(&b, db, (const char *const[]){"--follow", follow_a, NULL});
  assert_int_equal(repl_wait_in_sync(a.addr, 1, 10000), 0);
  embps_client_t *c = connect_to(a.addr, -1);
  embps_table_spec_t s;
  embps_table_spec_init(&s, "w", 4, EMBPS_OPT_SGD);
  s.rows = 8;
  s.lr = 1;
  create(c, &s);
  embps_client_destroy(c);
  push_n(a.addr, 5);
  assert_int_equal(repl_wait_caught_up(a.addr, b.addr, CATCH_UP_MS), 0);
  stop_server(&b);
  push_n(a.addr, 7); /* LSN 7 to 13: b never gets them */
  c = connect_to(a.addr, -1);
  assert_int_equal(embps_checkpoint(c, NULL), 0); /* ckpt-13 */
  embps_client_destroy(c);
  dur_server_kill(&a);
  /* b goes on as a primary (a new epoch from LSN 7) */
  start(&b, db, NULL);
  push_n(b.addr, 3);
  snprintf(follow_b, sizeof follow_b, "%s", b.addr);
  start(&a, da, (const char *const[]){"--follow", follow_b, NULL});
  assert_int_equal(repl_wait_caught_up(b.addr, a.addr, CATCH_UP_MS), 0);
  assert_true(log_has(&a, "set aside"));
  assert_true(log_has(&a, "copying a snapshot"));
  assert_true(witness(a.addr) == 8);
  assert_int_equal(repl_compare(b.addr, a.addr, "rejoined past its "
                                "checkpoint", 0), 0);
  char aside[600];
  snprintf(aside, sizeof aside, "%s/diverged/ckpt-000000000000000d", da);
  assert_int_equal(access(aside, F_OK), 0);
  /* and it restarts from the copy it keeps, without another */
  stop_server(&a);
  start(&a, da, (const char *const[]){"--follow", follow_b, NULL});
  assert_int_equal(repl_wait_caught_up(b.addr, a.addr, CATCH_UP_MS), 0);
  assert_false(log_has(&a, "snapshot"));
  assert_true(witness(a.addr) == 8);
  stop_server(&a);
  stop_server(&b);
  cleanup(&a);
  cleanup(&b);
}

/* A snapshot session of a primary without a data dir keeps the records
 * after its LSN in the backlog (a follower's copy fetches them next), up
 * to twice --repl-backlog-bytes: then it lets them go, saying so, and the
 * backlog is back within its bound; a follower copies all the same. */
static void test_pin_bound(void **state) {
  dur_server_t p = {0}, f = {0};
  start(&p, NULL, (const char *const[]){"--repl-backlog-bytes", "1048576",
                                        NULL});
  embps_client_t *c = connect_to(p.addr, 30000);
  embps_table_spec_t s;
  embps_table_spec_init(&s, "sgd_f32_dense", DIM, EMBPS_OPT_SGD);
  s.rows = DENSE_ROWS;
  create(c, &s);
  embps_snapshot_t *snap;
  assert_int_equal(embps_snapshot_begin(c, 0, NULL, &snap), 0);
  push_whole(c, "sgd_f32_dense", 40); /* 0.8 MiB: kept */
  assert_false(log_has(&p, "let go"));
  push_whole(c, "sgd_f32_dense", 80); /* past 2 MiB */
  assert_true(log_has(&p, "they are let go"));
  embps_snapshot_end(snap);
  char follow[64];
  snprintf(follow, sizeof follow, "%s", p.addr);
  start(&f, NULL, (const char *const[]){"--follow", follow, NULL});
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_true(log_has(&f, "copying a snapshot"));
  assert_int_equal(repl_compare(p.addr, f.addr, "after a pin let go", 0), 0);
  embps_client_destroy(c);
  stop_server(&f);
  stop_server(&p);
  cleanup(&p);
  cleanup(&f);
}

/* ------------------------------------------------------------ retain */

/* --repl-retain-ms 1000: a follower away for longer is not kept for by
 * its primary's checkpoints (its log's segments go): back, it copies a
 * snapshot (with the default 5 minutes it would catch up from the log:
 * test_copy) and ends equal. */
static void test_retain(void **state) {
  dur_server_t p = {0}, f = {0};
  char dp[512], df[512];
  new_dir(dp, sizeof dp, "rp");
  new_dir(df, sizeof df, "rf");
  start(&p, dp, (const char *const[]){"--repl-backlog-bytes", "1048576",
                                      "--repl-retain-ms", "1000", NULL});
  char follow[64];
  snprintf(follow, sizeof follow, "%s", p.addr);
  const char *const fargs[] = {"--follow", follow, NULL};
  start(&f, df, fargs);
  embps_client_t *c = connect_to(p.addr, 30000);
  embps_table_spec_t s;
  embps_table_spec_init(&s, "adam_f32_dense", DIM, EMBPS_OPT_ADAM);
  s.rows = DENSE_ROWS;
  create(c, &s);
  push_whole(c, "adam_f32_dense", 4);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  dur_server_kill(&f);
  const double gone = dur_now_ms();
  push_whole(c, "adam_f32_dense", 64); /* past the backlog */
  while (dur_now_ms() < gone + 1000) /* its last fetch was before that */
    dur_sleep_ms(20);
  assert_int_equal(embps_checkpoint(c, NULL), 0);
  start(&f, df, fargs);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, CATCH_UP_MS), 0);
  assert_true(log_has(&f, "copying a snapshot"));
  assert_int_equal(repl_compare(p.addr, f.addr, "away past the retention",
                                0), 0);
  embps_client_destroy(c);
  stop_server(&f);
  stop_server(&p);
  cleanup(&p);
  cleanup(&f);
}

/* ------------------------------------------------------------ layout */

/* A follower started with another --shards than its primary's is refused
 * before it serves anything: exit status 2, naming both. One whose primary
 * does not answer at its start comes up, and stops with status 2 at its
 * first contact with a primary of another layout. */
static void test_layout(void **state) {
  dur_server_t p = {0}, f = {0}, g = {0};
  start(&p, NULL, (const char *const[]){"--shards", "8", NULL});
  char follow[64];
  snprintf(follow, sizeof follow, "%s", p.addr);
  assert_int_equal(dur_server_init(&f, NULL), 0);
  f.args[0] = "--shards";
  f.args[1] = "4";
  f.args[2] = "--follow";
  f.args[3] = follow;
  f.args[4] = NULL;
  assert_int_equal(dur_server_start(&f, START_MS), 2);
  assert_true(log_has(&f, "with --shards 8; this one is 0 of 1 with "
                          "--shards 4"));
  assert_false(log_has(&f, "ready on"));

  /* the primary down at the follower's start: found out at first contact */
  stop_server(&p); /* its port is kept for its next start */
  start(&g, NULL, (const char *const[]){"--shards", "4", "--follow", follow,
                                        NULL});
  assert_true(log_has(&g, "did not answer"));
  start(&p, NULL, (const char *const[]){"--shards", "8", NULL});
  assert_int_equal(dur_server_wait(&g, 30000), 2);
  assert_true(log_has(&g, "with --shards 8; this one is 0 of 1 with "
                          "--shards 4"));
  stop_server(&p);
  cleanup(&p);
  cleanup(&f);
  cleanup(&g);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exact),   cmocka_unit_test(test_reads),
      cmocka_unit_test(test_proxy),   cmocka_unit_test(test_restart),
      cmocka_unit_test(test_copy),    cmocka_unit_test(test_sync),
      cmocka_unit_test(test_promote), cmocka_unit_test(test_rejoin_copy),
      cmocka_unit_test(test_pin_bound), cmocka_unit_test(test_layout),
      cmocka_unit_test(test_retain),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
