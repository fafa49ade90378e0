/* test_export_dense.c - the dense export (client/export_dense.c) against
 * an in-process server (server.h), through the real client library:
 *  - weights.npy is [rows, dim] float32 with row i equal to a pull of id
 *    i, for every id: pushed rows, never-pushed rows (the server's init),
 *    the padding row; over many chunks, so the writer thread reuses every
 *    buffer (run under TSan by `make test-tsan`); spec.json says dense;
 *  - a link planted at weights.npy.tmp is removed, not followed;
 *  - an export that cannot write leaves no temporary file and returns the
 *    error; dense with state, and unknown flags, are refused. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "embps/embps.h"
#include "npy.h"
#include "server.h"

#define DIM 64
#define ROWS 50001 /* 13 pulls of 4096 rows, the last one short */

typedef struct {
  embps_server_t *srv;
  pthread_t tid;
  embps_client_t *c;
  char dir[64];
} fixture_t;

static void *run_main(void *arg) {
  embps_server_run(arg);
  return NULL;
}

static int setup(void **state) {
  fixture_t *f = calloc(1, sizeof *f);
  char *argv[] = {"embps-server", "--listen", "127.0.0.1:0", "--shards", "3"};
  embps_server_config_t cfg;
  char err[512], addr[64];
  assert_int_equal(embps_server_config_parse(&cfg, 5, argv, err, sizeof err),
                   0);
  assert_int_equal(embps_server_create(&cfg, &f->srv), 0);
  assert_int_equal(pthread_create(&f->tid, NULL, run_main, f->srv), 0);
  snprintf(addr, sizeof addr, "127.0.0.1:%d", embps_server_port(f->srv));
  embps_client_options_t o = {.size = sizeof o, .servers = addr};
  assert_int_equal(embps_client_create(&o, &f->c, err, sizeof err), 0);
  snprintf(f->dir, sizeof f->dir, "/tmp/embps-dense-XXXXXX");
  assert_non_null(mkdtemp(f->dir));
  *state = f;
  return 0;
}

static void rm_dir(const char *dir) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static int teardown(void **state) {
  fixture_t *f = *state;
  embps_client_destroy(f->c);
  embps_server_stop(f->srv);
  pthread_join(f->tid, NULL);
  embps_server_destroy(f->srv);
  rm_dir(f->dir);
  free(f);
  return 0;
}

/* A fixed table: uniform init, padding id 7, every third row pushed. */
static void make_table(fixture_t *f) {
  embps_table_spec_t s;
  embps_table_spec_init(&s, "t", DIM, EMBPS_OPT_ADAGRAD);
  s.rows = ROWS;
  s.init = EMBPS_INIT_UNIFORM;
  s.init_value = 0.25;
  s.seed = 11;
  s.has_padding = 1;
  s.padding_id = 7;
  assert_int_equal(embps_create_table(f->c, &s), 0);
  size_t n = (ROWS - 1) / 3 + 1; /* ids 0, 3, ..., < ROWS */
  int64_t *ids = malloc(n * sizeof *ids);
  float *g = malloc(n * DIM * sizeof *g);
  for (size_t i = 0; i < n; i++) {
    ids[i] = (int64_t)(3 * i);
    for (int j = 0; j < DIM; j++)
      g[i * DIM + j] = (float)((i + (size_t)j) % 5) - 2.0f;
  }
  assert_int_equal(embps_push(f->c, "t", ids, n, g, DIM, 0), 0);
  free(ids);
  free(g);
}

/* Reads DIR/weights.npy whole; checks its shape. */
static float *read_weights(const char *dir) {
  char p[256], err[512];
  snprintf(p, sizeof p, "%s/weights.npy", dir);
  embps_npy_reader_t r;
  assert_int_equal(embps_npy_open(&r, AT_FDCWD, NULL, p, err, sizeof err),
                   0);
  assert_int_equal(r.type, EMBPS_NPY_F4);
  assert_int_equal(r.ndim, 2);
  assert_int_equal(r.rows, ROWS);
  assert_int_equal(r.cols, DIM);
  float *w = malloc((size_t)ROWS * DIM * sizeof *w);
  assert_int_equal(embps_npy_read_f32(&r, w, ROWS, err, sizeof err), 0);
  embps_npy_close(&r);
  return w;
}

static int exists(const char *dir, const char *name) {
  char p[256];
  struct stat st;
  snprintf(p, sizeof p, "%s/%s", dir, name);
  return lstat(p, &st) == 0;
}

static void test_every_row_by_id(void **state) {
  fixture_t *f = *state;
  make_table(f);
  char out[128];
  snprintf(out, sizeof out, "%s/out", f->dir);
  uint64_t rows = 0;
  assert_int_equal(embps_export_table(f->c, "t", out, EMBPS_EXPORT_DENSE,
                                      &rows), 0);
  assert_int_equal(rows, ROWS);
  float *w = read_weights(out);
  int64_t *ids = malloc(ROWS * sizeof *ids);
  float *want = malloc((size_t)ROWS * DIM * sizeof *want);
  for (int64_t i = 0; i < ROWS; i++)
    ids[i] = i;
  assert_int_equal(embps_pull(f->c, "t", ids, ROWS, want, DIM), 0);
  assert_memory_equal(w, want, (size_t)ROWS * DIM * sizeof *w);
  for (int j = 0; j < DIM; j++)
    assert_true(w[7 * DIM + j] == 0.0f); /* the padding row */
  assert_true(w[1 * DIM] != 0.0f);        /* never pushed: its init */
  assert_false(exists(out, "ids.npy"));
  assert_false(exists(out, "weights.npy.tmp"));
  char p[256], text[4096];
  snprintf(p, sizeof p, "%s/spec.json", out);
  FILE *sf = fopen(p, "r");
  assert_non_null(sf);
  size_t n = fread(text, 1, sizeof text - 1, sf);
  fclose(sf);
  text[n] = 0;
  assert_non_null(strstr(text, "\"dense\": true"));
  assert_non_null(strstr(text, "\"n\": 50001"));
  free(w);
  free(ids);
  free(want);
}

static void test_planted_link_not_followed(void **state) {
  fixture_t *f = *state;
  make_table(f);
  char out[128], victim[128], link[160];
  snprintf(out, sizeof out, "%s/links", f->dir);
  snprintf(victim, sizeof victim, "%s/victim", f->dir);
  assert_int_equal(mkdir(out, 0777), 0);
  FILE *v = fopen(victim, "w");
  fputs("precious", v);
  fclose(v);
  snprintf(link, sizeof link, "%s/weights.npy.tmp", out);
  assert_int_equal(symlink(victim, link), 0);
  snprintf(link, sizeof link, "%s/spec.json.tmp", out);
  assert_int_equal(symlink(victim, link), 0);
  assert_int_equal(embps_export_table(f->c, "t", out, EMBPS_EXPORT_DENSE,
                                      NULL), 0);
  struct stat st;
  assert_int_equal(stat(victim, &st), 0);
  assert_int_equal(st.st_size, 8);
  snprintf(link, sizeof link, "%s/weights.npy", out);
  assert_int_equal(lstat(link, &st), 0);
  assert_true(S_ISREG(st.st_mode));
}

static void test_failures_leave_nothing(void **state) {
  fixture_t *f = *state;
  make_table(f);
  char out[128];
  snprintf(out, sizeof out, "%s/ro", f->dir);
  assert_int_equal(mkdir(out, 0555), 0);
  if (geteuid() != 0) { /* root writes anyway */
    int rc = embps_export_table(f->c, "t", out, EMBPS_EXPORT_DENSE, NULL);
    assert_int_equal(rc, -EACCES);
    assert_non_null(strstr(embps_client_last_error(f->c), "weights.npy"));
    assert_false(exists(out, "weights.npy.tmp"));
  }
  /* "DIR" is a file: nothing can be created in it, whoever runs this */
  snprintf(out, sizeof out, "%s/file", f->dir);
  FILE *file = fopen(out, "w");
  fclose(file);
  assert_int_equal(embps_export_table(f->c, "t", out, EMBPS_EXPORT_DENSE,
                                      NULL), -ENOTDIR);
  assert_non_null(strstr(embps_client_last_error(f->c), "Not a directory"));
  assert_int_equal(embps_export_table(f->c, "t", f->dir,
                                      EMBPS_EXPORT_DENSE | EMBPS_EXPORT_STATE,
                                      NULL), EMBPS_EINVAL);
  assert_int_equal(embps_export_table(f->c, "t", f->dir, 8u, NULL),
                   EMBPS_EINVAL);
  assert_int_equal(embps_export_table(f->c, "nope", f->dir,
                                      EMBPS_EXPORT_DENSE, NULL),
                   EMBPS_ENOTABLE);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_every_row_by_id, setup, teardown),
      cmocka_unit_test_setup_teardown(test_planted_link_not_followed, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_failures_leave_nothing, setup,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
