/* test_probes.c - the health/metrics port against strangers (issue 18.1):
 * 200 connections trickling a byte at a time, from the probes' own
 * address and from eight others (127.0.0.2-9), while /healthz, /readyz and
 * /metrics must each answer within PROBE_MS; the trickling connections
 * are closed once they pass the request deadline. And who may see table
 * names: with a token, only requests carrying it; without one, a
 * non-loopback --metrics-listen needs --insecure.
 *
 * Real embps-server processes on 127.0.0.1, port 0; every wait has a
 * deadline. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
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

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "embps/embps.h"
#include "harness.h"

#define SLOW 200        /* trickling connections */
#define PROBE_MS 1000   /* every probe answers within this */
#define ATTACK_MS 8000  /* probing this long (past the 5 s deadline) */

typedef struct {
  char dir[64];
  char mport[128];
  it_server_t srv;
  int port; /* metrics */
} probed_t;

/* A server with --metrics-listen 127.0.0.1:0 and extra args. */
static void start_probed(probed_t *p, const char *const *extra) {
  snprintf(p->dir, sizeof p->dir, "/tmp/embps-probes-XXXXXX");
  assert_non_null(mkdtemp(p->dir));
  snprintf(p->mport, sizeof p->mport, "%s/metrics.port", p->dir);
  const char *args[24] = {"--metrics-listen", "127.0.0.1:0",
                          "--metrics-port-file", p->mport};
  int n = 4;
  for (int i = 0; extra && extra[i] && n < 23; i++)
    args[n++] = extra[i];
  args[n] = NULL;
  assert_int_equal(it_server_start(&p->srv, args), 0);
  p->port = it_read_port(p->mport);
  assert_true(p->port > 0);
}

static void stop_probed(probed_t *p) {
  assert_int_equal(it_server_stop(&p->srv), 0);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", p->dir);
  assert_int_equal(system(cmd), 0);
}

/* ---------------------------------------------------------- slow peers */

typedef struct {
  int fd[SLOW];
  atomic_int stop, open;
  double closed_ms[SLOW]; /* when the server closed it (0: not yet) */
  double t0;
} slow_t;

/* Connects from 127.0.0.(first + i % n_addrs) and sends the start of a
 * request, never its end. */
static void slow_open(slow_t *sl, int port, int first, int n_addrs) {
  memset(sl, 0, sizeof *sl);
  sl->t0 = it_now_ms();
  for (int i = 0; i < SLOW; i++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in src = {.sin_family = AF_INET};
    src.sin_addr.s_addr = htonl(0x7f000000u | (uint32_t)(first + i % n_addrs));
    assert_int_equal(bind(fd, (struct sockaddr *)&src, sizeof src), 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a))
      fail_msg("slow connection %d: %s", i, strerror(errno));
    static const char start[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
    (void)send(fd, start, sizeof start - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    sl->fd[i] = fd;
  }
  atomic_store(&sl->open, SLOW);
}

/* Sends one byte of a header line to every open connection every 200 ms,
 * noting the ones the server closed. */
static void *slow_trickle(void *arg) {
  slow_t *sl = arg;
  while (!atomic_load(&sl->stop)) {
    for (int i = 0; i < SLOW; i++) {
      if (sl->closed_ms[i])
        continue;
      char junk[64];
      ssize_t r = recv(sl->fd[i], junk, sizeof junk, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
          (send(sl->fd[i], "X", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
           errno != EAGAIN && errno != EWOULDBLOCK)) {
        sl->closed_ms[i] = it_now_ms() - sl->t0;
        atomic_fetch_sub(&sl->open, 1);
      }
    }
    it_sleep_ms(200);
  }
  return NULL;
}

static void slow_close(slow_t *sl) {
  for (int i = 0; i < SLOW; i++)
    close(sl->fd[i]);
}

/* Probes /healthz, /readyz and /metrics for ATTACK_MS while sl trickles:
 * each must answer 200 within PROBE_MS. Returns the slowest, in ms. */
static double probe_through(const probed_t *p, slow_t *sl, const char *what) {
  pthread_t t;
  pthread_create(&t, NULL, slow_trickle, sl);
  static const char *const paths[] = {"/healthz", "/readyz", "/metrics"};
  double worst = 0, end = it_now_ms() + ATTACK_MS;
  int n = 0;
  char body[4096];
  for (int k = 0; it_now_ms() < end; k++, n++) {
    const char *path = paths[k % 3];
    double t0 = it_now_ms();
    int st = it_http_get("127.0.0.1", p->port, path, PROBE_MS, body,
                         sizeof body);
    double ms = it_now_ms() - t0;
    if (st != 200) {
      atomic_store(&sl->stop, 1);
      pthread_join(t, NULL);
      fail_msg("%s: %s answered %d after %.0f ms (probe %d, %d slow "
               "connections open)", what, path, st, ms, k,
               atomic_load(&sl->open));
    }
    worst = ms > worst ? ms : worst;
    it_sleep_ms(100);
  }
  /* the slow ones pass the 5 s request deadline: all closed */
  double until = it_now_ms() + 15000;
  while (atomic_load(&sl->open) > 0 && it_now_ms() < until)
    it_sleep_ms(100);
  atomic_store(&sl->stop, 1);
  pthread_join(t, NULL);
  int left = atomic_load(&sl->open);
  printf("%s: %d probes, slowest %.0f ms; %d of %d slow connections closed "
         "by the server, the first after %.0f ms\n", what, n, worst,
         SLOW - left, SLOW, sl->closed_ms[0]);
  if (left)
    fail_msg("%s: %d slow connections still open %d s on", what, left,
             (ATTACK_MS + 15000) / 1000);
  return worst;
}

/* 200 connections trickling bytes from the probes' own address, then
 * from eight others: the probes answer within PROBE_MS throughout. */
static void test_slow_peers(void **state) {
  (void)state;
  probed_t p;
  start_probed(&p, NULL);
  slow_t *sl = malloc(sizeof *sl);
  assert_non_null(sl);
  slow_open(sl, p.port, 1, 1);
  probe_through(&p, sl, "200 slow connections from 127.0.0.1");
  slow_close(sl);
  slow_open(sl, p.port, 2, 8);
  probe_through(&p, sl, "200 slow connections from 127.0.0.2-9");
  slow_close(sl);
  free(sl);
  stop_probed(&p);
}

/* ---------------------------------------------------------- names */

static embps_client_t *client_with(const it_server_t *s, const char *token) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = s->addr;
  o.token = token;
  embps_client_t *c = NULL;
  char err[256];
  if (embps_client_create(&o, &c, err, sizeof err))
    fail_msg("connect: %s", err);
  return c;
}

/* With a token, a scrape without it sees every series but no table name:
 * tables are labelled "#N", the same N in every series of the table; with
 * "Authorization: Bearer TOKEN" it sees the names. */
static void test_names_need_the_token(void **state) {
  (void)state;
  char dir[64], token_file[128];
  snprintf(dir, sizeof dir, "/tmp/embps-probes-tok-XXXXXX");
  assert_non_null(mkdtemp(dir));
  snprintf(token_file, sizeof token_file, "%s/token", dir);
  const char *token = "s3cret-probe-token";
  FILE *f = fopen(token_file, "w");
  assert_non_null(f);
  fprintf(f, "%s\n", token);
  fclose(f);
  assert_int_equal(chmod(token_file, 0600), 0);
  const char *extra[] = {"--auth-token-file", token_file, NULL};
  probed_t p;
  start_probed(&p, extra);
  embps_client_t *c = client_with(&p.srv, token);
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "secret_table", 4, EMBPS_OPT_SGD);
  spec.rows = 8;
  assert_int_equal(embps_create_table(c, &spec), 0);
  int64_t id = 9; /* out of range: an error counted for the table */
  float w[4];
  assert_int_equal(embps_pull(c, "secret_table", &id, 1, w, 4), EMBPS_ERANGE);
  embps_client_destroy(c);
  static char body[1 << 16];
  assert_int_equal(it_http_get("127.0.0.1", p.port, "/metrics", 3000, body,
                               sizeof body), 200);
  assert_null(strstr(body, "secret_table"));
  assert_non_null(strstr(body, "embps_ready 1"));
  const char *rows = strstr(body, "embps_table_rows{table=\"#");
  assert_non_null(rows);
  unsigned label;
  assert_int_equal(sscanf(rows, "embps_table_rows{table=\"#%u\"}", &label), 1);
  char want[160];
  snprintf(want, sizeof want, "embps_errors_total{code=\"EMBPS_ERANGE\","
           "table=\"#%u\"} 1", label);
  assert_non_null(strstr(body, want));
  snprintf(want, sizeof want, "embps_table_dim{table=\"#%u\"} 4", label);
  assert_non_null(strstr(body, want));
  assert_int_equal(it_http_request("127.0.0.1", p.port, "/metrics",
                                   "Authorization: Bearer wrong\r\n", 3000,
                                   body, sizeof body), 200);
  assert_null(strstr(body, "secret_table"));
  char auth[128];
  snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", token);
  assert_int_equal(it_http_request("127.0.0.1", p.port, "/metrics", auth,
                                   3000, body, sizeof body), 200);
  assert_non_null(strstr(body, "embps_table_rows{table=\"secret_table\"}"));
  assert_non_null(strstr(body, "embps_errors_total{code=\"EMBPS_ERANGE\","
                               "table=\"secret_table\"} 1"));
  stop_probed(&p);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  assert_int_equal(system(cmd), 0);
}

/* Runs the server with args; returns its exit code within 10 s (-1: it
 * ran on, killed) and its log in log. */
static int server_exit(const char *const *args, char *log, size_t cap) {
  char dir[64], path[128];
  snprintf(dir, sizeof dir, "/tmp/embps-probes-run-XXXXXX");
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/log", dir);
  const char *argv[16] = {EMBPS_SERVER_BIN};
  int n = 1;
  for (int i = 0; args[i] && n < 15; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  pid_t pid = it_spawn(argv, path, NULL);
  assert_true(pid > 0);
  int code = -1;
  if (it_wait_exit(pid, 10000, &code) != 1) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    code = -1;
  }
  FILE *f = fopen(path, "r");
  size_t got = f ? fread(log, 1, cap - 1, f) : 0;
  log[got] = 0;
  if (f)
    fclose(f);
  unlink(path);
  rmdir(dir);
  return code;
}

/* Without a token a --metrics-listen beyond loopback needs --insecure,
 * as --listen does. */
static void test_public_metrics_need_token_or_insecure(void **state) {
  (void)state;
  char log[4096];
  const char *refused[] = {"--listen", "127.0.0.1:0", "--metrics-listen",
                           "0.0.0.0:0", NULL};
  int code = server_exit(refused, log, sizeof log);
  assert_int_not_equal(code, 0);
  assert_int_not_equal(code, -1);
  if (!strstr(log, "--metrics-listen 0.0.0.0") || !strstr(log, "--insecure"))
    fail_msg("the refusal does not say why: %s", log);
  probed_t p;
  const char *insecure[] = {"--insecure", NULL};
  snprintf(p.dir, sizeof p.dir, "/tmp/embps-probes-XXXXXX");
  assert_non_null(mkdtemp(p.dir));
  snprintf(p.mport, sizeof p.mport, "%s/metrics.port", p.dir);
  const char *args[] = {"--metrics-listen", "0.0.0.0:0",
                        "--metrics-port-file", p.mport, insecure[0], NULL};
  assert_int_equal(it_server_start(&p.srv, args), 0);
  p.port = it_read_port(p.mport);
  char body[256];
  assert_int_equal(it_http_get("127.0.0.1", p.port, "/healthz", 3000, body,
                               sizeof body), 200);
  stop_probed(&p);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slow_peers),
      cmocka_unit_test(test_names_need_the_token),
      cmocka_unit_test(test_public_metrics_need_token_or_insecure),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
