/* test_extensible.c - the public structs' growth rules (embps.h, "Structs
 * and the ABI") against a real server:
 *  - a program compiled when embps_client_options_t ended before `servers`
 *    connects and works: servers, past its size, is never read (a bogus
 *    value there is ignored and $EMBPS_SERVERS used), while the same
 *    options at the full size are refused for that bogus value;
 *  - a newer program's larger options, its extra fields 0, connect too;
 *  - an embps_table_alter_t compiled when the struct ended after lr alters
 *    lr on the server; setting eps, past its size, is refused and changes
 *    nothing there;
 *  - a spec with a reserved word set is refused before anything is created;
 *  - what the library writes into the fixed-size structs (describe's info,
 *    checkpoint info, stats, scan chunks) has its reserved words zeroed,
 *    whatever the caller's memory held. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embps/embps.h"
#include "harness.h"

#define DIM 2

static it_server_t srv;
static char dir[] = "/tmp/embps-extensible.XXXXXX";

/* One server for every test, with a data dir (checkpoint info). */
static int setup(void **state) {
  (void)state;
  if (!mkdtemp(dir))
    return -1;
  char data[64];
  snprintf(data, sizeof data, "%s/d", dir);
  const char *const args[] = {"--data-dir", data, NULL};
  return it_server_start(&srv, args);
}

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static int teardown(void **state) {
  (void)state;
  int rc = it_server_stop(&srv);
  nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc == 0 ? 0 : -1;
}

static void ok(embps_client_t *c, int rc) {
  if (rc)
    fail_msg("call failed: %s (%s)", embps_client_last_error(c),
             embps_err_name(rc));
}

static embps_client_t *connect_ok(const embps_client_options_t *o) {
  embps_client_t *c = NULL;
  char err[256];
  int rc = embps_client_create(o, &c, err, sizeof err);
  if (rc)
    fail_msg("connect: %s (%s)", err, embps_err_name(rc));
  return c;
}

static void create(embps_client_t *c, const char *name) {
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, name, DIM, EMBPS_OPT_ADAM);
  spec.rows = 10;
  ok(c, embps_create_table(c, &spec));
}

static void test_options_older_size(void **state) {
  (void)state;
  setenv("EMBPS_SERVERS", srv.addr, 1);
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = "127.0.0.1:1"; /* nothing listens there */
  o.timeout_ms = 5000;
  o.retry_ms = -1;
  embps_client_t *c = NULL;
  char err[256];
  assert_int_not_equal(embps_client_create(&o, &c, err, sizeof err), 0);
  assert_null(c);

  o.size = offsetof(embps_client_options_t, servers);
  c = connect_ok(&o);
  create(c, "old_options");
  const int64_t id = 3;
  const float g[DIM] = {1, 2};
  float row[DIM];
  ok(c, embps_push(c, "old_options", &id, 1, g, DIM, 0));
  ok(c, embps_pull(c, "old_options", &id, 1, row, DIM));
  assert_true(row[0] < 0 && row[1] < 0); /* one adam step from zeros */
  ok(c, embps_drop_table(c, "old_options"));
  embps_client_destroy(c);
  unsetenv("EMBPS_SERVERS");
}

static void test_options_newer_size(void **state) {
  (void)state;
  struct {
    embps_client_options_t o;
    uint64_t newer[3];
  } b;
  memset(&b, 0, sizeof b);
  b.o.size = sizeof b;
  b.o.servers = srv.addr;
  embps_client_t *c = connect_ok(&b.o);
  size_t n = 0;
  embps_table_info_t *v = NULL;
  ok(c, embps_list_tables(c, &v, &n));
  embps_tables_free(v, NULL);
  embps_client_destroy(c);
}

static void test_alter_older_size(void **state) {
  (void)state;
  embps_client_options_t o = {.size = sizeof o, .servers = srv.addr};
  embps_client_t *c = connect_ok(&o);
  create(c, "old_alter");
  embps_table_alter_t a;
  memset(&a, 0x7f, sizeof a); /* what lies past the old size: garbage */
  a.size = offsetof(embps_table_alter_t, eps);
  a.set = EMBPS_ALTER_LR;
  a.lr = 0.125;
  embps_table_info_t info;
  ok(c, embps_alter_table(c, "old_alter", &a, &info));
  assert_true(info.spec.lr == 0.125);
  assert_true(info.spec.eps == 1e-8); /* adam's default, untouched */

  a.set = EMBPS_ALTER_LR | EMBPS_ALTER_EPS;
  a.lr = 0.5;
  assert_int_equal(embps_alter_table(c, "old_alter", &a, &info),
                   EMBPS_EINVAL);
  assert_non_null(strstr(embps_client_last_error(c), "sets eps"));
  ok(c, embps_describe_table(c, "old_alter", &info));
  assert_true(info.spec.lr == 0.125);
  ok(c, embps_drop_table(c, "old_alter"));
  embps_client_destroy(c);
}

static void test_spec_reserved_refused(void **state) {
  (void)state;
  embps_client_options_t o = {.size = sizeof o, .servers = srv.addr};
  embps_client_t *c = connect_ok(&o);
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "reserved", DIM, EMBPS_OPT_SGD);
  spec.rows = 10;
  spec.reserved[0] = 42;
  assert_int_equal(embps_create_table(c, &spec), EMBPS_EPARAM);
  assert_non_null(strstr(embps_client_last_error(c), "reserved word 0"));
  embps_table_info_t info;
  assert_int_equal(embps_describe_table(c, "reserved", &info),
                   EMBPS_ENOTABLE);
  embps_client_destroy(c);
}

static int all_zero(const uint64_t *w, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (w[i])
      return 0;
  return 1;
}
#define RESERVED_ZERO(s)                                                       \
  assert_true(all_zero((s).reserved, sizeof(s).reserved / 8))

static void test_reserved_written_zero(void **state) {
  (void)state;
  embps_client_options_t o = {.size = sizeof o, .servers = srv.addr};
  embps_client_t *c = connect_ok(&o);
  create(c, "zeroed");
  const int64_t id = 1;
  const float g[DIM] = {1, 1};
  ok(c, embps_push(c, "zeroed", &id, 1, g, DIM, 0));

  embps_table_info_t info;
  memset(&info, 0xa5, sizeof info);
  ok(c, embps_describe_table(c, "zeroed", &info));
  RESERVED_ZERO(info);
  RESERVED_ZERO(info.spec);

  embps_checkpoint_info_t ck[1];
  memset(ck, 0xa5, sizeof ck);
  ok(c, embps_checkpoint(c, ck));
  assert_true(ck[0].lsn > 0);
  RESERVED_ZERO(ck[0]);

  embps_server_stats_t *st = NULL;
  size_t n = 0;
  ok(c, embps_stats(c, &st, &n));
  assert_int_equal(n, 1);
  assert_int_equal(st[0].sync_degraded, 0); /* not degraded */
  /* and no members: not coordinated */
  assert_null(st[0].members);
  assert_int_equal(st[0].n_members, 0);
  assert_int_equal(st[0].n_tables, 1);
  RESERVED_ZERO(st[0].tables[0]);
  RESERVED_ZERO(st[0].tables[0].spec);
  embps_stats_free(st, n);

  embps_scan_chunk_t chunk;
  memset(&chunk, 0xa5, sizeof chunk);
  ok(c, embps_scan(c, 0, "zeroed", 0, 0, 0, &chunk));
  assert_int_equal(chunk.n, 1);
  RESERVED_ZERO(chunk);
  embps_scan_chunk_free(&chunk);

  ok(c, embps_drop_table(c, "zeroed"));
  embps_client_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_options_older_size),
      cmocka_unit_test(test_options_newer_size),
      cmocka_unit_test(test_alter_older_size),
      cmocka_unit_test(test_spec_reserved_refused),
      cmocka_unit_test(test_reserved_written_zero),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
