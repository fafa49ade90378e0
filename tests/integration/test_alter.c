/* test_alter.c - ALTER (changing a table's hyperparameters during
 * training) on real servers: pushes after the alter's reply use the new
 * learning rate (SGD rows checked exactly); the alter survives kill -9
 * with --data-dir both from the log and from a checkpoint; refused values
 * name the problem and change nothing; an unknown table names the server;
 * both servers of a cluster are altered; describes running concurrently
 * with alters see one value or the other, never a mix; the CLI's
 * `alter`. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "embps/embps.h"
#include "harness.h"

#define DIM 2

static embps_client_t *connect_to(const char *servers) {
  embps_client_options_t o = {.size = sizeof o, .servers = servers};
  embps_client_t *c = NULL;
  char err[256];
  int rc = embps_client_create(&o, &c, err, sizeof err);
  if (rc)
    fprintf(stderr, "connect %s: %s\n", servers, err);
  assert_int_equal(rc, 0);
  return c;
}

static void ok(embps_client_t *c, int rc) {
  if (rc)
    fprintf(stderr, "call failed: %s\n", embps_client_last_error(c));
  assert_int_equal(rc, 0);
}

/* Pushes gradient 1 to row 1 of "t" and checks the row then reads want. */
static void push_one(embps_client_t *c, float want) {
  const int64_t id = 1;
  const float g[DIM] = {1, 1};
  float row[DIM];
  ok(c, embps_push(c, "t", &id, 1, g, DIM, 0));
  ok(c, embps_pull(c, "t", &id, 1, row, DIM));
  assert_true(row[0] == want && row[1] == want);
}

static double lr_of(embps_client_t *c, const char *table) {
  embps_table_info_t info;
  ok(c, embps_describe_table(c, table, &info));
  return info.spec.lr;
}

static void start_durable(it_server_t *s, const char *dir) {
  const char *args[] = {"--data-dir", dir, "--fsync", "always", NULL};
  assert_int_equal(it_server_start(s, args), 0);
}

/* SGD at lr 1, then 0.5 (log), then 0.25 (checkpoint): each kill -9 and
 * restart keeps the value the last acknowledged alter set. */
static void test_alter_survives_kill(void **state) {
  (void)state;
  char dir[] = "/tmp/embps-alter-XXXXXX";
  assert_non_null(mkdtemp(dir));
  it_server_t s;
  start_durable(&s, dir);
  embps_client_t *c = connect_to(s.addr);
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "t", DIM, EMBPS_OPT_SGD);
  spec.rows = 10;
  spec.lr = 1;
  ok(c, embps_create_table(c, &spec));
  push_one(c, -1.0f);
  ok(c, embps_set_lr(c, "t", 0.5));
  push_one(c, -1.5f); /* the push after the reply uses the new lr */
  embps_client_destroy(c);
  it_server_kill(&s);

  start_durable(&s, dir); /* replays the log: CREATE, PUSH, ALTER, PUSH */
  c = connect_to(s.addr);
  assert_true(lr_of(c, "t") == 0.5);
  push_one(c, -2.0f);
  ok(c, embps_checkpoint(c, NULL));
  ok(c, embps_set_lr(c, "t", 0.25));
  ok(c, embps_checkpoint(c, NULL)); /* the manifest holds lr 0.25 */
  embps_client_destroy(c);
  it_server_kill(&s);

  start_durable(&s, dir);
  c = connect_to(s.addr);
  assert_true(lr_of(c, "t") == 0.25);
  push_one(c, -2.25f);
  embps_client_destroy(c);
  assert_int_equal(it_server_stop(&s), 0);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

/* Expects alter to fail with code and a message containing text, and the
 * spec of "t" to be what it was. */
static void refused(embps_client_t *c, const embps_table_alter_t *a, int code,
                    const char *text) {
  embps_table_info_t before, after;
  ok(c, embps_describe_table(c, "t", &before));
  int rc = embps_alter_table(c, "t", a, NULL);
  if (rc != code || !strstr(embps_client_last_error(c), text))
    fail_msg("alter: %d \"%s\", want %d with \"%s\"", rc,
             embps_client_last_error(c), code, text);
  ok(c, embps_describe_table(c, "t", &after));
  assert_memory_equal(&before.spec, &after.spec, sizeof before.spec);
}

static void test_alter_refused(void **state) {
  (void)state;
  it_server_t s;
  assert_int_equal(it_server_start(&s, NULL), 0);
  embps_client_t *c = connect_to(s.addr);
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "t", DIM, EMBPS_OPT_ADAM);
  spec.rows = 10;
  ok(c, embps_create_table(c, &spec));
#define ALTER_(...) ((embps_table_alter_t){.size = sizeof a, __VA_ARGS__})
  embps_table_alter_t a = ALTER_(.set = EMBPS_ALTER_LR | EMBPS_ALTER_BETA1,
                                 .lr = 0.1, .beta1 = 1.5);
  refused(c, &a, EMBPS_EPARAM, "beta1 must be in [0, 1) (got 1.5)");
  a = ALTER_(.set = EMBPS_ALTER_LR, .lr = -1);
  refused(c, &a, EMBPS_EPARAM, "table \"t\" not altered: lr must be > 0");
  a = ALTER_(.set = EMBPS_ALTER_WEIGHT_DECAY, .weight_decay = INFINITY);
  refused(c, &a, EMBPS_EPARAM, "must be finite");
  a = ALTER_(.set = 0);
  refused(c, &a, EMBPS_EPARAM, "nothing to alter");

  char want[128];
  snprintf(want, sizeof want, "server 0 (%s): unknown table \"nope\"",
           s.addr);
  assert_int_equal(embps_set_lr(c, "nope", 0.1), EMBPS_ENOTABLE);
  if (!strstr(embps_client_last_error(c), want))
    fail_msg("alter of an unknown table: \"%s\", want \"%s\"",
             embps_client_last_error(c), want);

  /* the fields that may change do; the others stay */
  embps_table_info_t info;
  a = ALTER_(.set = EMBPS_ALTER_ALL, .lr = 0.2, .eps = 1e-6, .beta1 = 0.8,
             .beta2 = 0.99, .l1 = 0.01, .l2 = 0.02, .lr_power = -0.25,
             .weight_decay = 0.03);
#undef ALTER_
  ok(c, embps_alter_table(c, "t", &a, &info));
  embps_table_spec_t want_spec = spec;
  want_spec.lr = 0.2;
  want_spec.eps = 1e-6;
  want_spec.beta1 = 0.8;
  want_spec.beta2 = 0.99;
  want_spec.l1 = 0.01;
  want_spec.l2 = 0.02;
  want_spec.lr_power = -0.25;
  want_spec.weight_decay = 0.03;
  assert_memory_equal(&info.spec, &want_spec, sizeof want_spec);

  /* the CLI */
  const char *const cli_ok[] = {"--servers", s.addr, "alter", "t", "--lr",
                                "0.125", NULL};
  it_cli_result_t r;
  assert_int_equal(it_cli_run(&r, cli_ok), 0);
  assert_non_null(strstr(r.out, "table t: lr 0.125, eps 1e-06"));
  it_cli_result_free(&r);
  assert_true(lr_of(c, "t") == 0.125);
  const char *const cli_bad[] = {"--servers", s.addr, "alter", "t", "--dim",
                                 "4", NULL};
  assert_int_equal(it_cli_run(&r, cli_bad), 2);
  assert_non_null(strstr(r.err, "unknown option --dim for alter"));
  it_cli_result_free(&r);
  const char *const cli_range[] = {"--servers", s.addr, "alter", "t",
                                   "--beta2", "1", NULL};
  assert_int_equal(it_cli_run(&r, cli_range), 1);
  assert_non_null(strstr(r.err, "beta2 must be in [0, 1)"));
  it_cli_result_free(&r);
  embps_client_destroy(c);
  assert_int_equal(it_server_stop(&s), 0);
}

/* A cluster of two: the alter reaches both (each member reports it). */
static void test_alter_cluster(void **state) {
  (void)state;
  it_server_t s[2];
  char list[80];
  const char *a0[] = {"--cluster-size", "2", "--cluster-index", "0", NULL};
  const char *a1[] = {"--cluster-size", "2", "--cluster-index", "1", NULL};
  assert_int_equal(it_server_start(&s[0], a0), 0);
  assert_int_equal(it_server_start(&s[1], a1), 0);
  snprintf(list, sizeof list, "%s,%s", s[0].addr, s[1].addr);
  embps_client_t *c = connect_to(list);
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "t", DIM, EMBPS_OPT_ADAGRAD);
  spec.dynamic = 1;
  ok(c, embps_create_table(c, &spec));
  ok(c, embps_set_lr(c, "t", 0.75));
  for (int i = 0; i < 2; i++) {
    embps_client_t *m;
    embps_client_options_t o = {.size = sizeof o, .servers = list};
    char err[256];
    assert_int_equal(embps_client_create_member(&o, (uint32_t)i, &m, err,
                                                sizeof err), 0);
    assert_true(lr_of(m, "t") == 0.75);
    embps_client_destroy(m);
  }
  embps_client_destroy(c);
  it_server_stop(&s[0]);
  it_server_stop(&s[1]);
}

/* Describes while another connection alters: every spec read holds one
 * alter's values, never a mix (lr and weight decay change together). */
typedef struct {
  const char *addr;
  atomic_int stop;
  int bad;
} race_t;

static void *describer(void *arg) {
  race_t *r = arg;
  embps_client_t *c = connect_to(r->addr);
  while (!atomic_load(&r->stop)) {
    embps_table_info_t info;
    if (embps_describe_table(c, "t", &info) ||
        info.spec.weight_decay != info.spec.lr * 2)
      r->bad++;
  }
  embps_client_destroy(c);
  return NULL;
}

static void test_alter_concurrent_describe(void **state) {
  (void)state;
  it_server_t s;
  const char *args[] = {"--io-threads", "2", NULL};
  assert_int_equal(it_server_start(&s, args), 0);
  embps_client_t *c = connect_to(s.addr);
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "t", DIM, EMBPS_OPT_ADAM);
  spec.rows = 10;
  spec.lr = 0.5;
  spec.weight_decay = 1;
  ok(c, embps_create_table(c, &spec));
  race_t r = {.addr = s.addr};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, describer, &r), 0);
  for (int i = 1; i <= 300; i++) {
    embps_table_alter_t a = {.size = sizeof a,
                             .set = EMBPS_ALTER_LR | EMBPS_ALTER_WEIGHT_DECAY,
                             .lr = i * 0.001, .weight_decay = i * 0.002};
    ok(c, embps_alter_table(c, "t", &a, NULL));
  }
  atomic_store(&r.stop, 1);
  pthread_join(th, NULL);
  assert_int_equal(r.bad, 0);
  assert_true(lr_of(c, "t") == 300 * 0.001);
  embps_client_destroy(c);
  assert_int_equal(it_server_stop(&s), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alter_survives_kill),
      cmocka_unit_test(test_alter_refused),
      cmocka_unit_test(test_alter_cluster),
      cmocka_unit_test(test_alter_concurrent_describe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
