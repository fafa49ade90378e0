/* test_server.c - the embeddable server core (server/server.c): servers
 * created, run on a thread, stopped and destroyed inside this process,
 * driven through the real client library over loopback.
 *  - a server on port 0 serves a create, push and pull, stops from another
 *    thread (twice), and a second one in the same process does the same;
 *  - with --data-dir, a graceful stop takes the final checkpoint: a second
 *    server on the same directory has the rows and a checkpoint;
 *  - stop before run, and destroy without run;
 *  - every failing create (port in use, with and without a data dir; a
 *    data dir that cannot be made or is locked by a live server; a
 *    --port-file that cannot be written, the last step; --cluster-servers
 *    while another server of the process runs it, after every thread is
 *    up) returns its code, never prints the ready line (a successful one
 *    does), leaves no thread or descriptor behind (and no memory: LSan in
 *    `make test-sanitize`), and leaves the live server serving;
 *  - a checkpoint that lists one table name twice is refused, and the
 *    failed restore leaves nothing behind either. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "embps/embps.h"
#include "server.h"

#define DIM 4
#define ROWS 64

/* ---------------------------------------------------------------- helpers */

typedef struct {
  embps_server_t *srv;
  pthread_t tid;
  int status;
} running_t;

static void *run_main(void *arg) {
  running_t *r = arg;
  r->status = embps_server_run(r->srv);
  return NULL;
}

/* The daemon's defaults, then args (NULL-terminated), on 127.0.0.1:0. */
static void config(embps_server_config_t *cfg, ...) {
  char *argv[16] = {"embps-server", "--listen", "127.0.0.1:0",
                    "--io-threads", "2", "--shards", "4"};
  int argc = 7;
  va_list ap;
  va_start(ap, cfg);
  for (char *a; (a = va_arg(ap, char *)) && argc < 15;)
    argv[argc++] = a;
  va_end(ap);
  char err[512];
  assert_int_equal(embps_server_config_parse(cfg, argc, argv, err, sizeof err),
                   0);
}

/* What the process writes to stderr (the log, the ready line) between
 * capture_begin and capture_end. */
typedef struct {
  FILE *f;
  int saved;
} capture_t;

static void capture_begin(capture_t *cap) {
  fflush(stderr);
  cap->f = tmpfile();
  assert_non_null(cap->f);
  cap->saved = dup(2);
  assert_true(cap->saved >= 0);
  assert_true(dup2(fileno(cap->f), 2) == 2);
}

/* Ends the capture: what was written (caller frees). The text goes to
 * the real stderr too. */
static char *capture_end(capture_t *cap) {
  fflush(stderr);
  assert_true(dup2(cap->saved, 2) == 2);
  close(cap->saved);
  long len = ftell(cap->f);
  assert_true(len >= 0);
  char *text = calloc(1, (size_t)len + 1);
  assert_non_null(text);
  rewind(cap->f);
  assert_int_equal(fread(text, 1, (size_t)len, cap->f), (size_t)len);
  fclose(cap->f);
  fputs(text, stderr);
  return text;
}

#define READY_LINE " ready on 127.0.0.1:"

/* Creates a server from cfg (it says it is ready) and runs it on a
 * thread of its own. */
static void start(running_t *r, const embps_server_config_t *cfg) {
  memset(r, 0, sizeof *r);
  capture_t cap;
  capture_begin(&cap);
  int rc = embps_server_create(cfg, &r->srv);
  char *said = capture_end(&cap);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(said, READY_LINE));
  free(said);
  assert_non_null(r->srv);
  assert_true(embps_server_port(r->srv) > 0);
  assert_int_equal(pthread_create(&r->tid, NULL, run_main, r), 0);
}

/* Stops r from this thread (twice: stop is idempotent), joins, destroys;
 * returns run's exit status. */
static int finish(running_t *r) {
  embps_server_stop(r->srv);
  embps_server_stop(r->srv);
  assert_int_equal(pthread_join(r->tid, NULL), 0);
  embps_server_destroy(r->srv);
  r->srv = NULL;
  return r->status;
}

static embps_client_t *connect_to(const running_t *r) {
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", embps_server_port(r->srv));
  embps_client_options_t o = {
      .size = sizeof o, .servers = addr, .timeout_ms = 10000, .retry_ms = -1};
  embps_client_t *c = NULL;
  char err[256];
  int rc = embps_client_create(&o, &c, err, sizeof err);
  if (rc)
    fail_msg("connect to %s: %s", addr, err);
  return c;
}

/* The push: gradient row i (value grad(i, k)) is for row ids[i]. */
static const int64_t ids[] = {3, 17, 3, 63, 0};
#define N_IDS (sizeof ids / sizeof *ids)
static float grad(size_t i, uint32_t k) { return 0.25f * (float)(i + 1) - k; }

/* What a pull of `id` must return after the push (SGD, lr 0.5, zeros):
 * minus lr times the sum of its gradient rows. */
static float expected(int64_t id, uint32_t k) {
  float sum = 0;
  for (size_t i = 0; i < N_IDS; i++)
    if (ids[i] == id)
      sum += grad(i, k);
  return -0.5f * sum;
}

/* Creates table `name`, pushes the gradient once. */
static void create_and_push(embps_client_t *c, const char *name) {
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, name, DIM, EMBPS_OPT_SGD);
  spec.rows = ROWS;
  spec.lr = 0.5;
  assert_int_equal(embps_create_table(c, &spec), 0);
  float g[N_IDS * DIM];
  for (size_t i = 0; i < N_IDS; i++)
    for (uint32_t k = 0; k < DIM; k++)
      g[i * DIM + k] = grad(i, k);
  assert_int_equal(embps_push(c, name, ids, N_IDS, g, DIM, 0), 0);
}

/* Starts a server on data_dir and connects; table "emb", pushed once. */
static embps_client_t *start_pushed(running_t *r, const char *data_dir) {
  embps_server_config_t cfg;
  config(&cfg, "--data-dir", data_dir, NULL);
  start(r, &cfg);
  embps_client_t *c = connect_to(r);
  create_and_push(c, "emb");
  return c;
}

/* Pulls ids 0..ROWS-1 of `name` and checks every value. */
static void check_rows(embps_client_t *c, const char *name) {
  int64_t all[ROWS];
  float out[ROWS * DIM];
  for (int64_t i = 0; i < ROWS; i++)
    all[i] = i;
  int rc = embps_pull(c, name, all, ROWS, out, DIM);
  if (rc)
    fail_msg("pull %s: %s: %s", name, embps_err_name(rc),
             embps_client_last_error(c));
  for (int64_t i = 0; i < ROWS; i++)
    for (uint32_t k = 0; k < DIM; k++)
      assert_float_equal(out[i * DIM + k], expected(i, k), 1e-6);
}

/* The log position the server's last checkpoint covers (0: none). */
static uint64_t checkpoint_lsn(embps_client_t *c) {
  embps_server_stats_t *st;
  size_t n;
  assert_int_equal(embps_stats(c, &st, &n), 0);
  uint64_t lsn = st[0].checkpoint_lsn;
  embps_stats_free(st, n);
  return lsn;
}

/* Entries of a /proc directory: this process's threads or descriptors. */
static int count_entries(const char *path) {
  DIR *d = opendir(path);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

typedef struct {
  int threads, fds;
} footprint_t;

static footprint_t footprint(void) {
  return (footprint_t){count_entries("/proc/self/task"),
                       count_entries("/proc/self/fd")};
}

/* This process's threads once they are no more than `most`, or after
 * 2 s: a joined thread's /proc entry may outlive pthread_join briefly. */
static int threads_settle(int most) {
  int n = count_entries("/proc/self/task");
  for (int ms = 0; n > most && ms < 2000; ms += 10) {
    usleep(10000);
    n = count_entries("/proc/self/task");
  }
  return n;
}

/* A create from cfg must fail with code, logging why (when not NULL),
 * never saying it is ready, and leaving nothing behind. */
static void create_fails(const embps_server_config_t *cfg, int code,
                         const char *why) {
  capture_t cap;
  capture_begin(&cap);
  footprint_t before = footprint();
  static int sentinel;
  embps_server_t *srv = (embps_server_t *)&sentinel; /* must be reset */
  int rc = embps_server_create(cfg, &srv);
  footprint_t after = {threads_settle(before.threads),
                       count_entries("/proc/self/fd")};
  char *said = capture_end(&cap); /* before any check can jump out */
  if (rc != code)
    fail_msg("create returned %s, expected %s", embps_err_name(rc),
             embps_err_name(code));
  assert_null(srv);
  /* a joined thread's /proc entry may outlive pthread_join briefly (so
   * `before` may count one of an earlier create, gone since) */
  assert_in_range(after.threads, 0, before.threads);
  assert_int_equal(after.fds, before.fds);
  if (strstr(said, READY_LINE))
    fail_msg("a failed create printed the ready line");
  if (why && !strstr(said, why))
    fail_msg("a failed create did not log \"%s\"", why);
  free(said);
}

static char *make_tmpdir(void) {
  char tmpl[] = "/tmp/embps-test-server-XXXXXX";
  assert_non_null(mkdtemp(tmpl));
  return strdup(tmpl);
}

static void remove_tree(const char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* ------------------------------------------------------------------ tests */

/* Twice in one process: nothing of the first server outlives it. */
static void test_serve_stop_twice(void **state) {
  (void)state;
  for (int round = 0; round < 2; round++) {
    embps_server_config_t cfg;
    config(&cfg, NULL);
    running_t r;
    start(&r, &cfg);
    embps_client_t *c = connect_to(&r);
    create_and_push(c, "emb");
    check_rows(c, "emb");
    assert_int_equal(finish(&r), 0);
    /* the server is gone: the client cannot reach it */
    int64_t id = 0;
    float out[DIM];
    assert_int_not_equal(embps_pull(c, "emb", &id, 1, out, DIM), 0);
    embps_client_destroy(c);
  }
}

static void test_data_dir_final_checkpoint(void **state) {
  (void)state;
  char *dir = make_tmpdir();
  running_t r;
  embps_client_t *c = start_pushed(&r, dir);
  assert_int_equal(checkpoint_lsn(c), 0); /* none yet */
  embps_client_destroy(c);
  assert_int_equal(finish(&r), 0);

  embps_server_config_t cfg;
  config(&cfg, "--data-dir", dir, NULL);
  start(&r, &cfg); /* the same data dir, the same process */
  c = connect_to(&r);
  check_rows(c, "emb");
  assert_true(checkpoint_lsn(c) > 0); /* the final one of the first */
  embps_client_destroy(c);
  assert_int_equal(finish(&r), 0);
  remove_tree(dir);
  free(dir);
}

static void test_stop_before_run_and_destroy_unrun(void **state) {
  (void)state;
  embps_server_config_t cfg;
  config(&cfg, NULL);
  embps_server_t *srv;
  assert_int_equal(embps_server_create(&cfg, &srv), 0);
  embps_server_stop(srv);
  embps_server_stop(srv);
  assert_int_equal(embps_server_run(srv), 0); /* returns: stopped already */
  embps_server_stop(srv); /* after run, before destroy: harmless */
  embps_server_destroy(srv);

  assert_int_equal(embps_server_create(&cfg, &srv), 0);
  embps_server_destroy(srv); /* never run */
  embps_server_destroy(NULL);
}

static void test_create_failures(void **state) {
  (void)state;
  char *dir = make_tmpdir(), path[512], busy[32];
  running_t live;
  embps_client_t *c = start_pushed(&live, dir);
  embps_server_config_t cfg;
  snprintf(busy, sizeof busy, "127.0.0.1:%d", embps_server_port(live.srv));
  /* LLVM's OpenMP runtime (make test-tsan's) keeps the workers of a team
   * whose thread exited in a pool, for the next team: the first apply
   * thread to run beside live's leaves one there. A first failed create
   * fills the pool before any footprint is taken. */
  embps_server_t *srv;
  config(&cfg, "--listen", busy, NULL);
  assert_int_equal(embps_server_create(&cfg, &srv), -EADDRINUSE);

  /* the port is taken: before any data dir, and after one was restored */
  create_fails(&cfg, -EADDRINUSE, NULL);
  char other[512];
  snprintf(other, sizeof other, "%s/other", dir);
  config(&cfg, "--listen", busy, "--data-dir", other, NULL);
  create_fails(&cfg, -EADDRINUSE, NULL);
  /* its lock was released: the same data dir opens again */
  config(&cfg, "--data-dir", other, NULL);
  running_t again;
  start(&again, &cfg);
  assert_int_equal(finish(&again), 0);

  /* the data dir cannot be made (under a file), or a live server has it */
  snprintf(path, sizeof path, "%s/file", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fclose(f);
  snprintf(path, sizeof path, "%s/file/data", dir);
  config(&cfg, "--data-dir", path, NULL);
  create_fails(&cfg, EMBPS_EIO, NULL);
  config(&cfg, "--data-dir", dir, NULL);
  create_fails(&cfg, EMBPS_EIO, NULL);

  /* the last step fails: every thread and loop was up */
  snprintf(path, sizeof path, "%s/no/such/dir/port", dir);
  config(&cfg, "--port-file", path, NULL);
  create_fails(&cfg, -ENOENT, NULL);
  config(&cfg, "--port-file", path, "--data-dir", other, NULL);
  create_fails(&cfg, -ENOENT, NULL);

  /* the cluster thread cannot start (another server of the process runs
   * one), after every other thread: no ready line, no port file */
  config(&cfg, "--cluster-servers", "127.0.0.1:1", NULL);
  running_t holder;
  start(&holder, &cfg);
  embps_client_t *hc = connect_to(&holder); /* open until it is stopped */
  create_and_push(hc, "emb"); /* its apply thread and OpenMP team are up */
  snprintf(path, sizeof path, "%s/port", dir);
  snprintf(other, sizeof other, "%s/cluster", dir);
  config(&cfg, "--cluster-servers", "127.0.0.1:1",
         "--port-file", path, "--data-dir", other, NULL);
  /* the holder's apply team took the worker LLVM's OpenMP pooled (see
   * above): a first failed create pools one again */
  assert_int_equal(embps_server_create(&cfg, &srv), EMBPS_EINVAL);
  create_fails(&cfg, EMBPS_EINVAL, "another server of this process runs it");
  assert_int_equal(access(path, F_OK), -1);
  embps_client_destroy(hc);
  assert_int_equal(finish(&holder), 0);

  check_rows(c, "emb"); /* the live server never noticed */
  embps_client_destroy(c);
  assert_int_equal(finish(&live), 0);
  remove_tree(dir);
  free(dir);
}

/* A checkpoint whose manifest holds two tables named "emb" (two
 * incarnations): the restore must refuse it and undo everything it did,
 * memory included (LSan sees what it kept). */
static void test_checkpoint_table_twice(void **state) {
  (void)state;
  char *dir = make_tmpdir(), err[512];
  embps_ckpt_table_t tables[2];
  memset(tables, 0, sizeof tables);
  for (int i = 0; i < 2; i++) {
    embps_table_spec_init(&tables[i].spec, "emb", DIM, EMBPS_OPT_SGD);
    tables[i].spec.rows = ROWS;
    assert_int_equal(embps_table_create(&tables[i].spec, 4, 1,
                                        &tables[i].table), 0);
    tables[i].incarnation = (uint64_t)i + 1;
    embps_table_set_incarnation(tables[i].table, tables[i].incarnation);
  }
  embps_ckpt_t c = {.lsn = 2, .cluster_size = 1, .shards = 4,
                    .tables = tables, .n_tables = 2};
  embps_ckpt_result_t res;
  assert_int_equal(embps_ckpt_write(dir, &c, &res, err, sizeof err), 0);
  for (int i = 0; i < 2; i++)
    embps_table_unref(tables[i].table);

  embps_server_config_t cfg;
  config(&cfg, "--data-dir", dir, NULL);
  create_fails(&cfg, EMBPS_EIO, NULL);
  create_fails(&cfg, EMBPS_EIO, NULL); /* and again: the lock was released */
  remove_tree(dir);
  free(dir);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN); /* as the daemon does (server.h) */
  embps_log_set_level(EMBPS_LOG_WARN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_serve_stop_twice),
      cmocka_unit_test(test_data_dir_final_checkpoint),
      cmocka_unit_test(test_stop_before_run_and_destroy_unrun),
      cmocka_unit_test(test_create_failures),
      cmocka_unit_test(test_checkpoint_table_twice),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
