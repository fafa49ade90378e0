/* test_watchdog.c - liveness of the serving threads (server/watchdog.c):
 *  - the watches themselves: a thread with work in hand and no progress is
 *    named once past the timeout, not while idle, paused or beating;
 *  - an in-process server with --stall-timeout 1: its apply thread and an
 *    I/O thread are really wedged, by this test holding every shard's
 *    write lock of a table (a push then blocks the apply thread at its
 *    commit, a pull blocks an I/O thread at its gather): /healthz turns
 *    503 naming the thread (and embps_thread_stall_seconds says so), and
 *    200 again once the lock is let go and the request completes. SIGSTOP
 *    cannot stop one thread of a process; a held lock wedges it the way a
 *    deadlock would. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "embps/embps.h"
#include "http.h"
#include "server.h"
#include "table_impl.h"
#include "watchdog.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void test_watches(void **state) {
  (void)state;
  char why[160] = "";
  embps_watch_t *w = embps_watch_start("worker", 0);
  assert_non_null(w);
  sleep_ms(60);
  assert_int_equal(embps_watch_check(50, why, sizeof why), 0); /* idle */
  embps_watch_busy(w, 1);
  assert_int_equal(embps_watch_check(50, why, sizeof why), 0);
  sleep_ms(60); /* work in hand, no progress for 60 ms: past 50 */
  assert_int_equal(embps_watch_check(50, why, sizeof why), 1);
  assert_non_null(strstr(why, "worker: no progress for "));
  assert_int_equal(embps_watch_check(0, why, sizeof why), 0); /* off */
  embps_watch_pause(); /* waiting for another thread's work */
  assert_int_equal(embps_watch_check(50, why, sizeof why), 0);
  embps_watch_resume();
  assert_int_equal(embps_watch_check(50, why, sizeof why), 0);
  sleep_ms(60);
  assert_int_equal(embps_watch_check(50, why, sizeof why), 1);
  embps_watch_beat(w); /* progress */
  assert_int_equal(embps_watch_check(50, why, sizeof why), 0);
  embps_watch_busy(w, 0);
  sleep_ms(60);
  assert_int_equal(embps_watch_check(50, why, sizeof why), 0);
  embps_watch_busy(w, 1);
  sleep_ms(60);
  embps_watch_stop(w); /* a thread that ended is not watched */
  assert_int_equal(embps_watch_check(50, why, sizeof why), 0);
  /* a loop is always busy */
  embps_watch_t *loop = embps_watch_start("loop", 1);
  embps_watch_busy(loop, 0);
  sleep_ms(60);
  assert_int_equal(embps_watch_check(50, why, sizeof why), 1);
  assert_non_null(strstr(why, "loop: "));
  embps_watch_stop(loop);
}

/* ------------------------------------------------------ a wedged server */

typedef struct {
  embps_server_t *srv;
  pthread_t tid;
  int status, mport;
  char addr[64];
} running_t;

static void *run_main(void *arg) {
  running_t *r = arg;
  r->status = embps_server_run(r->srv);
  return NULL;
}

static embps_client_t *connect_to(const char *addr) {
  embps_client_options_t o = {
      .size = sizeof o, .servers = addr, .timeout_ms = 60000, .retry_ms = -1};
  embps_client_t *c = NULL;
  char err[256];
  if (embps_client_create(&o, &c, err, sizeof err))
    fail_msg("connect to %s: %s", addr, err);
  return c;
}

/* One push (op 'p') or pull ('g') of row 0 on a client of its own. */
typedef struct {
  const char *addr;
  char op;
  int rc;
} call_t;

static void *call_main(void *arg) {
  call_t *k = arg;
  embps_client_t *c = connect_to(k->addr);
  int64_t id = 0;
  float v[4] = {1, 1, 1, 1};
  k->rc = k->op == 'p' ? embps_push(c, "t", &id, 1, v, 4, 0)
                       : embps_pull(c, "t", &id, 1, v, 4);
  embps_client_destroy(c);
  return NULL;
}

/* Polls /healthz for up to 15 s until it answers `want`; returns the last
 * body (malloc'd). */
static char *healthz_until(running_t *r, int want) {
  char *body = NULL;
  for (int i = 0; i < 150; i++) {
    free(body);
    if (test_http_get(r->mport, "/healthz", &body) == want)
      return body;
    sleep_ms(100);
  }
  fail_msg("/healthz never answered %d: %s", want, body ? body : "(none)");
  return body;
}

/* Every shard's write lock of table t: held (1) or let go (0). */
static void hold(embps_table_t *t, int on) {
  for (uint32_t k = 0; k < t->n_shards; k++)
    if (on)
      pthread_rwlock_wrlock(&t->shards[k].lock);
    else
      pthread_rwlock_unlock(&t->shards[k].lock);
}

/* Wedges a thread with a request of kind op; /healthz must name it. */
static void wedge(running_t *r, embps_table_t *t, char op,
                  const char *thread) {
  hold(t, 1);
  call_t k = {.addr = r->addr, .op = op, .rc = -1};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, call_main, &k), 0);
  char *body = healthz_until(r, 503);
  if (!strstr(body, thread) || !strstr(body, "no progress for"))
    fail_msg("/healthz 503 without naming the %s thread: %s", thread, body);
  free(body);
  char *metrics;
  assert_int_equal(test_http_get(r->mport, "/metrics", &metrics), 200);
  char want[64];
  snprintf(want, sizeof want, "embps_thread_stall_seconds{thread=\"%s",
           thread);
  const char *line = strstr(metrics, want);
  assert_non_null(line);
  line = strchr(line, ' ');
  assert_true(line && strtod(line, NULL) >= 1.0);
  free(metrics);
  hold(t, 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(k.rc, 0);
  free(healthz_until(r, 200));
}

static void test_wedged_threads(void **state) {
  (void)state;
  char mfile[] = "/tmp/embps-test-watchdog-XXXXXX";
  int fd = mkstemp(mfile);
  assert_true(fd >= 0);
  close(fd);
  char *argv[] = {"embps-server", "--listen", "127.0.0.1:0", "--io-threads",
                  "1", "--shards", "4", "--metrics-listen", "127.0.0.1:0",
                  "--metrics-port-file", mfile, "--stall-timeout", "1"};
  embps_server_config_t cfg;
  char err[512];
  assert_int_equal(embps_server_config_parse(&cfg, 13, argv, err, sizeof err),
                   0);
  running_t r = {0};
  assert_int_equal(embps_server_create(&cfg, &r.srv), 0);
  assert_int_equal(pthread_create(&r.tid, NULL, run_main, &r), 0);
  snprintf(r.addr, sizeof r.addr, "127.0.0.1:%d", embps_server_port(r.srv));
  FILE *f = fopen(mfile, "r");
  assert_true(f && fscanf(f, "%d", &r.mport) == 1);
  fclose(f);
  free(healthz_until(&r, 200));

  embps_client_t *c = connect_to(r.addr);
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "t", 4, EMBPS_OPT_SGD);
  spec.rows = 64;
  assert_int_equal(embps_create_table(c, &spec), 0);
  embps_client_destroy(c);
  embps_table_t *t = embps_registry_get(&r.srv->registry, "t");
  assert_non_null(t);
  wedge(&r, t, 'p', "apply");
  wedge(&r, t, 'g', "io-");
  embps_table_unref(t);

  embps_server_stop(r.srv);
  assert_int_equal(pthread_join(r.tid, NULL), 0);
  embps_server_destroy(r.srv);
  assert_int_equal(r.status, 0);
  unlink(mfile);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_watches),
      cmocka_unit_test(test_wedged_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
