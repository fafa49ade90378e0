/* test_durability.c - --data-dir on real servers: after kill -9 (a log
 * tail to replay) and after SIGTERM (its final checkpoint) a restarted
 * server holds exactly the state of a reference server that never
 * stopped and got the same pushes. "Exactly": every row bit for bit, the
 * step counters, and the optimizer state, which shows through two more
 * identical pushes to both (Adam's moments and step, Adagrad's and FTRL's
 * accumulators all move the weights). Every optimizer x dtype, dense and
 * dynamic, a synchronous table; restarts into 7, 1 and 16 shards. Also: a
 * second server on the same data dir is refused, and CHECKPOINT without a
 * data dir says so. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "embps/embps.h"
#include "harness.h"
#include "rng.h"

#define DIM 8
#define ROWS 200
#define N_OPT 4
#define N_DTYPE 3
#define N_TABLES (N_OPT * N_DTYPE * 2)
#define BATCH 24

static int64_t dyn_ids[ROWS];

typedef struct {
  char data_dir[256];
  it_server_t ref, dur;
  embps_client_t *cr, *cd;   /* reference, durable */
  embps_client_t *cr2, *cd2; /* second worker for the synchronous table */
  uint64_t rng;
  uint64_t sync_step;
} fixture_t;

static void table_name(char *buf, size_t len, int i) {
  snprintf(buf, len, "t%02d", i);
}

static void spec_of(embps_table_spec_t *s, int i) {
  char name[16];
  table_name(name, sizeof name, i);
  embps_table_spec_init(s, name, DIM, (embps_optimizer_t)(i % N_OPT));
  s->dtype = (embps_dtype_t)((i / N_OPT) % N_DTYPE);
  s->init = EMBPS_INIT_UNIFORM;
  s->init_value = 0.1;
  s->seed = 1000 + (uint64_t)i;
  s->lr = 0.05;
  if (i >= N_OPT * N_DTYPE)
    s->dynamic = 1;
  else
    s->rows = ROWS;
}

static embps_client_t *connect_to(const it_server_t *s) {
  embps_client_options_t o = {.size = sizeof o, .servers = s->addr};
  embps_client_t *c = NULL;
  char err[256];
  int rc = embps_client_create(&o, &c, err, sizeof err);
  if (rc)
    fprintf(stderr, "connect %s: %s\n", s->addr, err);
  assert_int_equal(rc, 0);
  return c;
}

static void start_dur(fixture_t *f, const char *shards) {
  const char *args[] = {"--data-dir", f->data_dir, "--fsync", "always",
                        "--shards", shards, NULL};
  assert_int_equal(it_server_start(&f->dur, args), 0);
  f->cd = connect_to(&f->dur);
  f->cd2 = connect_to(&f->dur);
}

static void both(fixture_t *f, int rc_r, int rc_d) {
  if (rc_r || rc_d)
    fprintf(stderr, "ref: %s / durable: %s\n", embps_client_last_error(f->cr),
            embps_client_last_error(f->cd));
  assert_int_equal(rc_r, 0);
  assert_int_equal(rc_d, 0);
}

/* One worker of the synchronous table: its push for a step to the
 * reference, then to the durable server (each waits for both workers). */
typedef struct {
  embps_client_t *ref, *dur;
  const int64_t *ids;
  const float *g;
  uint64_t step;
  int rc;
} sync_worker_t;

static void *sync_worker(void *arg) {
  sync_worker_t *w = arg;
  w->rc = embps_push_step(w->ref, "sync", w->ids, BATCH - 1, w->g, DIM, 0,
                          w->step);
  if (!w->rc)
    w->rc = embps_push_step(w->dur, "sync", w->ids, BATCH - 1, w->g, DIM, 0,
                            w->step);
  return NULL;
}

/* One push of random gradients (duplicated ids included) to table i of
 * both servers, and one step of the synchronous table. */
static void push_round(fixture_t *f) {
  int64_t ids[BATCH];
  float g[BATCH * DIM];
  for (int i = 0; i < N_TABLES; i++) {
    char name[16];
    table_name(name, sizeof name, i);
    for (int k = 0; k < BATCH; k++) {
      uint64_t r = rng_next(&f->rng) % ROWS;
      ids[k] = i >= N_OPT * N_DTYPE ? dyn_ids[r] : (int64_t)r;
      for (int j = 0; j < DIM; j++)
        g[k * DIM + j] =
            (float)((int64_t)(rng_next(&f->rng) % 2001) - 1000) / 997.0f;
    }
    both(f, embps_push(f->cr, name, ids, BATCH, g, DIM, 0),
         embps_push(f->cd, name, ids, BATCH, g, DIM, 0));
  }
  /* the synchronous table: two workers per step on each server */
  f->sync_step++;
  for (int k = 0; k < BATCH; k++) {
    ids[k] = (int64_t)(rng_next(&f->rng) % ROWS);
    for (int j = 0; j < DIM; j++)
      g[k * DIM + j] = (float)(k + j) / 31.0f;
  }
  sync_worker_t w[2] = {{f->cr, f->cd, ids, g, f->sync_step, -1},
                        {f->cr2, f->cd2, ids + 1, g, f->sync_step, -1}};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, sync_worker, &w[1]), 0);
  sync_worker(&w[0]);
  pthread_join(th, NULL);
  assert_int_equal(w[0].rc, 0);
  assert_int_equal(w[1].rc, 0);
}

static atomic_int pushing;

/* Pushes rounds until told to stop (at least two). */
static void *pusher(void *arg) {
  for (int i = 0; i < 2 || atomic_load(&pushing); i++)
    push_round(arg);
  return NULL;
}

/* Pulls every row of every table from both servers: bit for bit equal,
 * and the same step counters. */
static void compare(fixture_t *f) {
  static float a[ROWS * DIM], b[ROWS * DIM];
  int64_t dense[ROWS];
  for (int k = 0; k < ROWS; k++)
    dense[k] = k;
  for (int i = 0; i <= N_TABLES; i++) {
    char name[16];
    if (i == N_TABLES)
      snprintf(name, sizeof name, "sync");
    else
      table_name(name, sizeof name, i);
    const int64_t *ids = i >= N_OPT * N_DTYPE && i < N_TABLES ? dyn_ids
                                                                : dense;
    both(f, embps_pull(f->cr, name, ids, ROWS, a, DIM),
         embps_pull(f->cd, name, ids, ROWS, b, DIM));
    if (memcmp(a, b, sizeof a)) {
      for (int k = 0; k < ROWS * DIM; k++)
        if (memcmp(&a[k], &b[k], 4)) {
          fprintf(stderr, "table %s row %d col %d: %a != %a\n", name,
                  k / DIM, k % DIM, a[k], b[k]);
          break;
        }
      fail();
    }
    embps_table_info_t ir, id;
    both(f, embps_describe_table(f->cr, name, &ir),
         embps_describe_table(f->cd, name, &id));
    assert_int_equal(ir.step, id.step);
    assert_int_equal(ir.rows_allocated, id.rows_allocated);
  }
}

/* Restored state = reference state: rows now, and optimizer state
 * through two more identical pushes. */
static void check_equal(fixture_t *f) {
  compare(f);
  push_round(f);
  push_round(f);
  compare(f);
}

static void close_dur(fixture_t *f) {
  embps_client_destroy(f->cd);
  embps_client_destroy(f->cd2);
  f->cd = f->cd2 = NULL;
}

static void test_restore_equals_reference(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  assert_non_null(f);
  f->rng = 42;
  for (int k = 0; k < ROWS; k++)
    dyn_ids[k] = (int64_t)(rng_next(&f->rng) >> 1) * (k % 2 ? -1 : 1);
  snprintf(f->data_dir, sizeof f->data_dir, "/tmp/embps-dur-XXXXXX");
  assert_non_null(mkdtemp(f->data_dir));
  assert_int_equal(it_server_start(&f->ref, NULL), 0);
  f->cr = connect_to(&f->ref);
  f->cr2 = connect_to(&f->ref);
  start_dur(f, "16");
  for (int i = 0; i < N_TABLES; i++) {
    embps_table_spec_t s;
    spec_of(&s, i);
    both(f, embps_create_table(f->cr, &s), embps_create_table(f->cd, &s));
  }
  embps_table_spec_t s;
  embps_table_spec_init(&s, "sync", DIM, EMBPS_OPT_ADAM);
  s.rows = ROWS;
  s.sync_workers = 2;
  both(f, embps_create_table(f->cr, &s), embps_create_table(f->cd, &s));

  /* 1: checkpoints taken while pushes go on (so shard snapshots are newer
   * than the checkpoint's LSN), a log tail, kill -9, restart: 7 shards */
  push_round(f);
  embps_client_t *ck = connect_to(&f->dur);
  pthread_t th;
  atomic_store(&pushing, 1);
  assert_int_equal(pthread_create(&th, NULL, pusher, f), 0);
  embps_checkpoint_info_t info = {0};
  for (int i = 0; i < 6; i++)
    assert_int_equal(embps_checkpoint(ck, &info), 0);
  atomic_store(&pushing, 0);
  pthread_join(th, NULL);
  assert_true(info.lsn > N_TABLES);
  embps_client_destroy(ck);
  push_round(f);
  close_dur(f);
  it_server_kill(&f->dur);
  start_dur(f, "7");
  check_equal(f);

  /* 2: SIGTERM (final checkpoint, empty log), restart into 1 shard */
  push_round(f);
  close_dur(f);
  assert_int_equal(it_server_stop(&f->dur), 0);
  start_dur(f, "1");
  check_equal(f);

  /* 3: only a log (no checkpoint since the restart), a dropped and a
   * re-created table in it, kill -9, restart into 16 shards */
  both(f, embps_drop_table(f->cr, "t00"), embps_drop_table(f->cd, "t00"));
  spec_of(&s, 0);
  both(f, embps_create_table(f->cr, &s), embps_create_table(f->cd, &s));
  push_round(f);
  close_dur(f);
  it_server_kill(&f->dur);
  start_dur(f, "16");
  check_equal(f);

  /* a second server on the same data dir is refused, naming the holder */
  char cmd[600];
  snprintf(cmd, sizeof cmd, "%s --listen 127.0.0.1:0 --data-dir %s 2>&1",
           EMBPS_SERVER_BIN, f->data_dir);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char out[4096] = {0};
  size_t got = fread(out, 1, sizeof out - 1, p);
  int st = pclose(p);
  out[got] = 0;
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
  char want[64];
  snprintf(want, sizeof want, "is in use by pid %d", (int)f->dur.pid);
  if (!strstr(out, want))
    fprintf(stderr, "second server said: %s\n", out);
  assert_non_null(strstr(out, want));

  /* no data dir: CHECKPOINT is refused with ENODATADIR */
  assert_int_equal(embps_checkpoint(f->cr, NULL), EMBPS_ENODATADIR);

  close_dur(f);
  assert_int_equal(it_server_stop(&f->dur), 0);
  embps_client_destroy(f->cr);
  embps_client_destroy(f->cr2);
  assert_int_equal(it_server_stop(&f->ref), 0);
  snprintf(cmd, sizeof cmd, "rm -rf %s", f->data_dir);
  assert_int_equal(system(cmd), 0);
  free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_restore_equals_reference),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
