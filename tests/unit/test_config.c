/* test_config.c - unit tests of embps-server's command line (server/
 * config.c): the defaults, every flag in both forms (--flag value and
 * --flag=value) reaching its field, and the refusals, each naming the
 * flag. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server.h"
#include "space.h"
#include "wal.h"

static char err[512];

/* Parses the NULL-terminated arguments; returns parse's result. */
static int parse(embps_server_config_t *cfg, ...) {
  char *argv[32] = {"embps-server"};
  int argc = 1;
  va_list ap;
  va_start(ap, cfg);
  for (char *a; (a = va_arg(ap, char *)) && argc < 31;)
    argv[argc++] = a;
  va_end(ap);
  err[0] = 0;
  return embps_server_config_parse(cfg, argc, argv, err, sizeof err);
}

static void test_defaults(void **state) {
  (void)state;
  embps_server_config_t c;
  assert_int_equal(parse(&c, NULL), 0);
  assert_string_equal(c.listen_host, "127.0.0.1");
  assert_int_equal(c.listen_port, 7070);
  assert_int_equal(c.io_threads, 2);
  assert_int_equal(c.shards, 16);
  assert_int_equal(c.omp_threads, 0);
  assert_int_equal(c.cluster_size, 1);
  assert_int_equal(c.cluster_index, 0);
  assert_true(c.max_frame_bytes == 64u << 20);
  assert_int_equal(c.max_connections, 1024);
  assert_int_equal(c.max_tables, 1024);
  assert_int_equal(c.idle_timeout_s, 600);
  assert_int_equal(c.hello_timeout_s, 5);
  assert_true(c.max_memory == 0);
  assert_int_equal(c.log_level, EMBPS_LOG_INFO);
  assert_int_equal(c.log_json, 0);
  assert_int_equal(c.fsync, EMBPS_FSYNC_EVERYSEC);
  assert_int_equal(c.checkpoint_every_s, 0);
  assert_true(c.checkpoint_log_bytes == EMBPS_CHECKPOINT_LOG_AUTO);
  assert_string_equal(c.data_dir, "");
  assert_string_equal(c.port_file, "");
  assert_string_equal(c.metrics_host, "");
  assert_null(c.cluster_servers);
  assert_int_equal(c.has_token + c.insecure + c.complete_tables, 0);
  assert_true(c.max_conn_buffer_bytes == 2 * c.max_frame_bytes);
  assert_true(c.max_buffer_bytes >= 1ULL << 30);
  assert_int_equal(c.repl_retain_ms, 300000);
}

/* Every flag in both forms: "--flag value" and "--flag=value" must give
 * the same configuration, and not the default one. */
static void test_every_flag_both_forms(void **state) {
  (void)state;
  char token[] = "/tmp/embps-test-config-XXXXXX";
  int fd = mkstemp(token);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "s3cret\n", 7), 7);
  close(fd);
  const char *flags[][2] = {
      {"--listen", "127.0.0.1:0"},
      {"--port-file", "/tmp/p"},
      {"--io-threads", "3"},
      {"--shards", "8"},
      {"--omp-threads", "2"},
      {"--max-frame-bytes", "1M"},
      {"--max-connections", "10"},
      {"--max-tables", "5"},
      {"--idle-timeout", "60"},
      {"--hello-timeout", "2"},
      {"--max-conn-buffer-bytes", "4M"},
      {"--max-buffer-bytes", "2G"},
      {"--max-memory", "1G"},
      {"--log-level", "debug"},
      {"--log-format", "json"},
      {"--data-dir", "/tmp/d"},
      {"--fsync", "never"},
      {"--checkpoint-every", "30"},
      {"--checkpoint-log-bytes", "1G"},
      {"--metrics-listen", "127.0.0.1:0"},
      {"--metrics-port-file", "/tmp/m"},
      {"--auth-token-file", token},
      {"--repl-retain-ms", "60000"},
      {"--cluster-size", "2"},
      {"--cluster-index", "1"},
  };
  const size_t n = sizeof flags / sizeof *flags;
  embps_server_config_t def, c1, c2;
  assert_int_equal(parse(&def, NULL), 0);
  for (size_t k = 0; k < n; k++) {
    char joined[256];
    snprintf(joined, sizeof joined, "%s=%s", flags[k][0], flags[k][1]);
    /* --cluster-index needs a --cluster-size above it */
    const char *extra = k + 1 == n ? "--cluster-size" : NULL;
    if (parse(&c1, flags[k][0], flags[k][1], extra, "2", NULL) ||
        parse(&c2, joined, extra, "2", NULL))
      fail_msg("%s: %s", flags[k][0], err);
    assert_memory_equal(&c1, &c2, sizeof c1);
    if (!memcmp(&c1, &def, sizeof c1))
      fail_msg("%s %s changed nothing", flags[k][0], flags[k][1]);
  }
  assert_int_equal(parse(&c1, "--auth-token-file", token, NULL), 0);
  assert_int_equal(c1.has_token, 1);
  assert_memory_equal(c1.token, "s3cret", 6);
  assert_true(c1.token_len == 6);
  assert_int_equal(parse(&c1, "--max-frame-bytes=1M", "--fsync=always",
                         "--log-format", "json", "--insecure", NULL),
                   0);
  assert_true(c1.max_frame_bytes == 1u << 20);
  assert_true(c1.max_conn_buffer_bytes == 2u << 20); /* 2 x the frame */
  assert_int_equal(c1.fsync, EMBPS_FSYNC_ALWAYS);
  assert_int_equal(c1.log_json, 1);
  assert_int_equal(c1.insecure, 1);
  assert_int_equal(parse(&c1, "--checkpoint-log-bytes", "0", NULL), 0);
  assert_true(c1.checkpoint_log_bytes == 0);
  assert_int_equal(parse(&c1, "--checkpoint-log-bytes=1G",
                         "--checkpoint-log-bytes=auto", NULL), 0);
  assert_true(c1.checkpoint_log_bytes == EMBPS_CHECKPOINT_LOG_AUTO);
  /* the cluster list is the argument itself, in either form */
  char list[] = "--cluster-servers=127.0.0.1:7070,127.0.0.1:7071";
  assert_int_equal(parse(&c1, "--cluster-size", "2", list, "--listen",
                         "127.0.0.1:7070", "--complete-tables", NULL),
                   0);
  assert_ptr_equal(c1.cluster_servers, list + strlen("--cluster-servers="));
  assert_int_equal(c1.complete_tables, 1);
  unlink(token);
}

static void test_refusals_name_the_flag(void **state) {
  (void)state;
  embps_server_config_t c;
  const struct {
    const char *a, *b, *want;
  } bad[] = {
      {"--io-threads", "0", "--io-threads \"0\" is not a number in [1, 64]"},
      {"--io-threads=65", NULL,
       "--io-threads \"65\" is not a number in [1, "
       "64]"},
      {"--shards", "x", "--shards \"x\" is not a number in [1, 4096]"},
      {"--max-frame-bytes", "3G",
       "--max-frame-bytes \"3G\" is not a number "
       "in [1024, 2147483648]"},
      {"--max-memory", "-1", "--max-memory \"-1\" is not a number"},
      {"--fsync", "sometimes",
       "--fsync \"sometimes\" is not "
       "always|everysec|never"},
      {"--log-format", "xml", "--log-format \"xml\" is not text|json"},
      {"--checkpoint-log-bytes", "some",
       "--checkpoint-log-bytes \"some\" is not auto or a number of bytes"},
      {"--log-level", "loud",
       "--log-level \"loud\" is not "
       "debug|info|warn|error"},
      {"--listen", "nowhere", "--listen \"nowhere\" is not HOST:PORT"},
      {"--metrics-listen=x", NULL, "--metrics-listen \"x\" is not HOST:PORT"},
      {"--data-dir=", NULL, "--data-dir \"\" is not a directory name"},
      {"--shards", NULL, "--shards needs a value"},
      {"--insecure=yes", NULL, "--insecure takes no value"},
      {"--bogus", NULL, "unknown option --bogus (see --help)"},
      {"--shard", "8", "unknown option --shard (see --help)"},
      {"--max-conn", "8", "unknown option --max-conn (see --help)"},
      {"serve", NULL, "unexpected argument \"serve\""},
      {"--cluster-index", "1",
       "--cluster-index 1 must be below "
       "--cluster-size 1"},
      {"--coordinator", "http://h:1",
       "--coordinator \"http://h:1\" is not etcd://HOST:PORT"},
      {"--coordinator", "etcd://h:1",
       "--coordinator needs --cluster-name"},
      {"--cluster-name", "a/b", "--cluster-name \"a/b\" is not 1-63"},
      {"--cluster-name", "x",
       "--cluster-name is a setting of --coordinator"},
      {"--lease-ms", "999", "--lease-ms \"999\" is not a number in [1000"},
      {"--repl-retain-ms", "999",
       "--repl-retain-ms \"999\" is not a number in [1000, 604800000]"},
      {"--repl-retain-ms", "8d", "--repl-retain-ms \"8d\" is not a number"},
      {"--member", "4096", "--member \"4096\" is not a member slot"},
      {"--advertise", "nohost", "--advertise \"nohost\" is not HOST:PORT"},
      {"--sync-degrade-ms", "99",
       "--sync-degrade-ms 99: 0 (never) or 100 to 3600000"},
      {"--sync-degrade-ms", "3600001",
       "--sync-degrade-ms \"3600001\" is not a number in [0, 3600000]"},
      {"--sync-degrade-ms", "soon", "--sync-degrade-ms \"soon\" is not a "
       "number"},
      {"--sync-degrade-ms", "1000",
       "--sync-degrade-ms needs --sync-followers 1 or more"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    if (parse(&c, bad[k].a, bad[k].b, NULL) != -1)
      fail_msg("%s %s accepted", bad[k].a, bad[k].b ? bad[k].b : "");
    if (!strstr(err, bad[k].want))
      fail_msg("%s: \"%s\", want \"%s\"", bad[k].a, err, bad[k].want);
  }
}

/* --coordinator's settings, and what it cannot be combined with. */
static void test_coordinator(void **state) {
  (void)state;
  embps_server_config_t c;
  assert_int_equal(parse(&c, "--coordinator", "etcd://127.0.0.1:2379,h:2",
                         "--cluster-name", "prod-1", "--cluster-size", "3",
                         "--cluster-index", "2", "--lease-ms", "5000",
                         "--advertise", "10.0.0.5:7070", NULL),
                   0);
  assert_string_equal(c.coordinator, "etcd://127.0.0.1:2379,h:2");
  assert_string_equal(c.cluster_name, "prod-1");
  assert_int_equal(c.member, 2); /* the slot is --cluster-index's */
  assert_int_equal(c.lease_ms, 5000);
  assert_string_equal(c.advertise, "10.0.0.5:7070");
  /* the slot is the rows' slot: --member 1 serves --cluster-index 1 */
  assert_int_equal(parse(&c, "--coordinator", "etcd://h:1", "--cluster-name",
                         "x", "--cluster-size", "2", "--member", "1", NULL),
                   -1);
  assert_non_null(strstr(err, "--member 1 and --cluster-index 0"));
  assert_int_equal(parse(&c, "--coordinator", "etcd://h:1", "--cluster-name",
                         "x", "--cluster-size", "2", "--cluster-index", "1",
                         "--member", "1", NULL),
                   0);
  assert_int_equal(parse(&c, "--coordinator", "etcd://h:1", "--cluster-name",
                         "x", "--follow", "127.0.0.1:7070", NULL),
                   -1);
  assert_non_null(strstr(err, "--follow with --coordinator"));
  assert_int_equal(parse(&c, NULL), 0);
  assert_int_equal(c.coordinator[0], 0);
  assert_int_equal(c.lease_ms, 3000);
  assert_int_equal(c.sync_degrade_ms, 0); /* strict by default */
  /* --sync-degrade-ms: with --sync-followers, coordinated or not */
  assert_int_equal(parse(&c, "--sync-followers", "1", "--sync-degrade-ms",
                         "10000", NULL), 0);
  assert_int_equal(c.sync_degrade_ms, 10000);
  assert_int_equal(parse(&c, "--coordinator", "etcd://h:1", "--cluster-name",
                         "x", "--sync-followers", "1",
                         "--sync-degrade-ms=100", NULL), 0);
  assert_int_equal(c.sync_degrade_ms, 100);
  assert_int_equal(parse(&c, "--sync-followers", "1", "--sync-degrade-ms",
                         "0", NULL), 0);
  assert_int_equal(c.sync_degrade_ms, 0);
}

static void test_help_and_version(void **state) {
  (void)state;
  embps_server_config_t c;
  /* print to /dev/null: only the result matters here */
  fflush(stdout);
  int out = dup(1);
  FILE *null = freopen("/dev/null", "w", stdout);
  assert_non_null(null);
  int help = parse(&c, "--help", NULL), h = parse(&c, "-h", NULL),
      version = parse(&c, "--shards", "4", "--version", NULL),
      bad_then_help = parse(&c, "--shards", "0", "--help", NULL);
  fflush(stdout);
  dup2(out, 1);
  close(out);
  assert_int_equal(help, 1);
  assert_int_equal(h, 1);
  assert_int_equal(version, 1);
  assert_int_equal(bad_then_help, -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_every_flag_both_forms),
      cmocka_unit_test(test_refusals_name_the_flag),
      cmocka_unit_test(test_coordinator),
      cmocka_unit_test(test_help_and_version),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
