/* test_degrade.c - --sync-degrade-ms (Patroni's non-strict synchronous
 * mode): two embps-server processes of one member with --coordinator
 * against a real etcd on loopback, --sync-followers 1 and a data dir each,
 * under the durability tests' exactly checkable push storm (dur_util.h)
 * from worker processes listing both servers ("a|b").
 *
 *   test_degrade kill      the follower killed (kill -9): pushes pause
 *       about --sync-degrade-ms (plus the time the follower still counts
 *       as in sync), then are acknowledged again; etcd's P/sync says the
 *       primary's epoch is degraded, stats and /metrics say so. Then the
 *       primary killed too and the old follower started alone: it is not
 *       elected (no primary for two leases after the old key ended); the
 *       old primary started again is elected; the witness rows equal the
 *       acknowledged pushes exactly (0 lost, 0 doubled) and Adagrad rows
 *       a bit-for-bit replay.
 *   test_degrade recover   the follower killed (degraded), started again:
 *       it catches up, the primary waits for it again and P/sync says
 *       strict for the same epoch; then the primary killed: the follower
 *       is elected and nothing acknowledged is lost.
 *   test_degrade strict    without --sync-degrade-ms (the default): the
 *       follower killed, a push is refused EMBPS_ENOREPLICAS after
 *       --sync-timeout-ms, again a few seconds later, and nothing is
 *       written in P/sync.
 *   test_degrade flags     the real binary refuses bad values, naming
 *       the flag (exit status 2). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coord.h"
#include "dur_util.h"
#include "etcd.h"
#include "etcd_util.h"
#include "http.h"
#include "repl_util.h"
#include "wire.h" /* EMBPS_ROLE_* */

#define LEASE_MS 2000
#define LEASE_S "2000"
#define DEGRADE_MS 1000
#define DEGRADE_S "1000"
#define SYNC_TIMEOUT "20000"
#define CLUSTER "degrade"

#ifdef EMBPS_TEST_SANITIZED
static const int sanitized = 1;
#else
static const int sanitized = 0;
#endif

static char etcd_url[256];
static it_etcd_t etcd;

typedef struct {
  dur_server_t s;
  char dir[256];
  char metrics[32]; /* 127.0.0.1:PORT */
  int metrics_port;
} node_t;

/* A coordinated server of member 0; degrade: with --sync-degrade-ms. */
static int start(node_t *n, int degrade, const char *timeout) {
  int i = 0;
  const char **a = n->s.args;
  a[i++] = "--coordinator";
  a[i++] = etcd_url;
  a[i++] = "--cluster-name";
  a[i++] = CLUSTER;
  a[i++] = "--lease-ms";
  a[i++] = LEASE_S;
  a[i++] = "--sync-followers";
  a[i++] = "1";
  a[i++] = "--sync-timeout-ms";
  a[i++] = timeout;
  a[i++] = "--metrics-listen";
  a[i++] = n->metrics;
  if (degrade) {
    a[i++] = "--sync-degrade-ms";
    a[i++] = DEGRADE_S;
  }
  a[i] = NULL;
  int rc = dur_server_start(&n->s, 30000);
  if (rc) {
    dur_fail("%s did not start (%d)", n->s.addr, rc);
    dur_server_dump_log(&n->s);
  }
  return rc;
}

static void node_init(node_t *n, const char *what) {
  memset(n, 0, sizeof *n);
  dur_mkdtemp(n->dir, sizeof n->dir, what);
  dur_server_init(&n->s, n->dir);
  n->metrics_port = it_free_port();
  snprintf(n->metrics, sizeof n->metrics, "127.0.0.1:%d", n->metrics_port);
}

static int role_of(const char *addr) {
  embps_server_stats_t st;
  return repl_stats(addr, &st) ? -1 : (int)st.role;
}

static int wait_primary(const char *addr, int timeout_ms) {
  const double end = dur_now_ms() + timeout_ms;
  while (dur_now_ms() < end) {
    if (role_of(addr) == EMBPS_ROLE_PRIMARY)
      return 0;
    dur_sleep_ms(10);
  }
  return -1;
}

/* A server's stats' sync_degraded, or -1. */
static int stats_degraded(const char *addr) {
  embps_server_stats_t st;
  return repl_stats(addr, &st) ? -1 : (int)st.sync_degraded;
}

/* A series of a node's /metrics, or -1. */
static double metric(const node_t *n, const char *name) {
  char *body;
  int st = test_http_get(n->metrics_port, "/metrics", &body);
  double v = st == 200 ? dur_metric(body, name) : -1;
  free(body);
  return v;
}

/* P/sync as etcd holds it: 1 with *s, 0 absent, -1 unreadable. */
static int read_sync(embps_coord_sync_t *s) {
  embps_etcd_t *e;
  char err[256];
  memset(s, 0, sizeof *s);
  if (embps_etcd_create(etcd_url, 2000, &e, err, sizeof err))
    return -1;
  char key[160];
  embps_coord_prefix(CLUSTER, 0, key, sizeof key - 8);
  strcat(key, "/sync");
  embps_etcd_kvs_t kvs;
  int rc = embps_etcd_range(e, key, strlen(key), 0, &kvs);
  embps_etcd_destroy(e);
  if (rc)
    return -1;
  rc = 0;
  if (kvs.n) {
    /* {"epoch":E,"degraded":B,"lsn":L,"addr":"A"}, as coord.c writes it */
    const char *v = kvs.v[0].value, *p;
    rc = 1;
    s->present = 1;
    s->degraded = strstr(v, "\"degraded\":true") != NULL;
    if ((p = strstr(v, "\"epoch\":")))
      s->epoch = (uint32_t)strtoul(p + 8, NULL, 10);
    if ((p = strstr(v, "\"addr\":\"")))
      sscanf(p + 8, "%127[^\"]", s->addr);
  }
  embps_etcd_kvs_free(&kvs);
  return rc;
}

/* Who holds P/primary: 1 with addr, 0 no one, -1 unreadable. */
static int read_primary(char *addr, size_t cap) {
  embps_etcd_t *e;
  char err[256];
  if (embps_etcd_create(etcd_url, 2000, &e, err, sizeof err))
    return -1;
  uint32_t epoch;
  int rc = embps_coord_read_primary(e, CLUSTER, 0, addr, cap, &epoch);
  embps_etcd_destroy(e);
  return rc < 0 ? -1 : rc;
}

/* Waits until P/sync is (degraded, epoch): 0, or -1 after timeout_ms. */
static int wait_sync(int degraded, uint32_t epoch, int timeout_ms) {
  const double end = dur_now_ms() + timeout_ms;
  embps_coord_sync_t s;
  while (dur_now_ms() < end) {
    if (read_sync(&s) == 1 && s.degraded == degraded && s.epoch == epoch)
      return 0;
    dur_sleep_ms(20);
  }
  return -1;
}

static uint64_t acked_total(dur_shared_t *sh, int n) {
  uint64_t t = 0;
  for (int w = 0; w < n; w++)
    t += atomic_load(&sh->w[w].acked_wit) + atomic_load(&sh->w[w].acked_ada);
  return t;
}

/* Waits until at least `more` pushes more than now are acknowledged. */
static int wait_acks(dur_shared_t *sh, int n, uint64_t more, int timeout_ms) {
  const uint64_t want = acked_total(sh, n) + more;
  const double end = dur_now_ms() + timeout_ms;
  while (acked_total(sh, n) < want && dur_now_ms() < end)
    dur_sleep_ms(5);
  return acked_total(sh, n) >= want ? 0 : -1;
}

/* Both up, n[0] elected, n[1] its follower in sync, the tables made. */
static int setup(node_t n[2], int degrade, const char *timeout,
                 const dur_workload_t *wl) {
  node_init(&n[0], "deg-a");
  node_init(&n[1], "deg-b");
  if (start(&n[0], degrade, timeout) || wait_primary(n[0].s.addr, 20000)) {
    dur_fail("%s was not elected", n[0].s.addr);
    return -1;
  }
  if (start(&n[1], degrade, timeout) ||
      repl_wait_in_sync(n[0].s.addr, 1, 20000))
    return -1;
  embps_client_t *c = dur_connect(n[0].s.addr, 20000, 30000, "setup");
  int rc = !c || dur_create_tables(c, wl);
  embps_client_destroy(c);
  return rc ? -1 : 0;
}

static void teardown(node_t n[2]) {
  int bad = dur_failures();
  for (int i = 0; i < 2; i++) {
    if (bad)
      dur_server_dump_log(&n[i].s);
    dur_server_term(&n[i].s, 30000);
    dur_server_cleanup(&n[i].s);
    if (!bad)
      dur_rm_rf(n[i].dir);
  }
  if (bad)
    fprintf(stderr, "data dirs kept: %s %s\n", n[0].dir, n[1].dir);
}

/* The end: exact on the primary p, bit for bit with a replay, the other
 * equal to it. */
static void final_checks(node_t n[2], int p, const dur_workload_t *wl,
                         dur_shared_t *sh) {
  embps_client_t *chk = dur_connect(n[p].s.addr, 10000, -1, "final check");
  uint64_t counts[DUR_MAX_WORKERS];
  for (int w = 0; w < wl->n_workers; w++)
    counts[w] = atomic_load(&sh->w[w].acked_ada);
  if (chk) {
    dur_check_witness(chk, wl, sh, "end (workers finished)", 1, 1);
    float *got = dur_pull_ada(chk, wl), *replay = dur_replay_ada(wl, counts);
    if (got && replay)
      dur_compare_ada(wl, replay, got, "end");
    free(got);
    free(replay);
    embps_client_destroy(chk);
  }
  if (repl_wait_caught_up(n[p].s.addr, n[1 - p].s.addr, 60000) ||
      repl_compare(n[p].s.addr, n[1 - p].s.addr, "follower at the end", 0))
    dur_fail("the follower is not the primary's copy at the end");
}

/* Kills the follower n[f] of n[p] under the storm and checks the
 * degradation: the longest pause between two acknowledgements, P/sync,
 * stats and /metrics. 0, or -1 (failed). */
static int degrade_by_kill(node_t n[2], int p, dur_shared_t *sh, int workers) {
  embps_server_stats_t st;
  if (repl_stats(n[p].s.addr, &st) || st.role != EMBPS_ROLE_PRIMARY) {
    dur_fail("%s is not the primary", n[p].s.addr);
    return -1;
  }
  const uint32_t epoch = st.epoch;
  if (wait_acks(sh, workers, 20, 20000)) {
    dur_fail("no storm before the kill");
    return -1;
  }
  const double killed = dur_now_ms();
  dur_server_kill(&n[1 - p].s);
  /* the longest time with no new acknowledgement, until 30 after it */
  uint64_t last = acked_total(sh, workers), resumed_at = 0;
  double last_t = killed, pause = 0;
  const double end = killed + 30000;
  while (dur_now_ms() < end) {
    uint64_t a = acked_total(sh, workers);
    double now = dur_now_ms();
    if (a != last) {
      if (now - last_t > pause)
        pause = now - last_t;
      if (!resumed_at && pause >= DEGRADE_MS * 0.9)
        resumed_at = a;
      last = a;
      last_t = now;
    }
    if (resumed_at && a >= resumed_at + 30)
      break;
    dur_sleep_ms(1);
  }
  dur_note("follower killed: the longest pause between acknowledgements "
           "%.0f ms (--sync-degrade-ms %d, a follower counts as in sync "
           "1500 ms after its last fetch)", pause, DEGRADE_MS);
  if (!resumed_at) {
    dur_fail("pushes were not acknowledged again after the follower's "
             "loss (longest pause %.0f ms)", pause);
    return -1;
  }
  if (pause < DEGRADE_MS * 0.9)
    dur_fail("pause %.0f ms: degraded before --sync-degrade-ms", pause);
  if (!sanitized && pause > DEGRADE_MS + 1500 + 3000)
    dur_fail("pause %.0f ms: more than --sync-degrade-ms + 1.5 s + 3 s",
             pause);
  embps_coord_sync_t s;
  if (read_sync(&s) != 1 || !s.degraded || s.epoch != epoch ||
      strcmp(s.addr, n[p].s.addr))
    dur_fail("P/sync does not say epoch %u of %s is degraded (present %d, "
             "degraded %d, epoch %u, addr %s)", epoch, n[p].s.addr,
             s.present, s.degraded, s.epoch, s.addr);
  if (stats_degraded(n[p].s.addr) != 1)
    dur_fail("stats of %s do not say degraded", n[p].s.addr);
  if (metric(&n[p], "embps_sync_degraded") != 1 ||
      metric(&n[p], "embps_sync_degradations_total") < 1)
    dur_fail("/metrics of %s: embps_sync_degraded %.0f, "
             "embps_sync_degradations_total %.0f", n[p].s.addr,
             metric(&n[p], "embps_sync_degraded"),
             metric(&n[p], "embps_sync_degradations_total"));
  char *log = dur_server_log(&n[p].s);
  if (!log || !strstr(log, "degraded, acknowledging writes without"))
    dur_fail("%s: no degradation in its log", n[p].s.addr);
  free(log);
  return dur_failures() ? -1 : 0;
}

static void spawn(dur_shared_t *sh, const dur_workload_t *wl, pid_t *pids,
                  node_t n[2]) {
  char both[2 * sizeof n[0].s.addr + 2];
  snprintf(both, sizeof both, "%s|%s", n[0].s.addr, n[1].s.addr);
  for (int w = 0; w < wl->n_workers; w++)
    pids[w] = dur_worker_spawn(sh, wl, w, both, NULL, 120000);
}

static int scenario_kill(void) {
  dur_workload_t wl = {.n_workers = 2, .rows_per_worker = 16,
                       .seed = dur_seed()};
  node_t n[2];
  dur_shared_t *sh = dur_shared_new();
  pid_t pids[DUR_MAX_WORKERS] = {0};
  if (setup(n, 1, SYNC_TIMEOUT, &wl))
    goto out;
  spawn(sh, &wl, pids, n);
  if (degrade_by_kill(n, 0, sh, wl.n_workers))
    goto out;
  /* acknowledged without a follower: the old follower must never be
     elected while they are only on the primary */
  if (wait_acks(sh, wl.n_workers, 50, 20000)) {
    dur_fail("too few pushes acknowledged while degraded");
    goto out;
  }
  dur_server_kill(&n[0].s);
  const double killed = dur_now_ms();
  /* its key ends with its lease; then the old follower starts (as a
     follower of no one: the election decides) */
  char holder[EMBPS_COORD_ADDR_MAX] = "";
  int held = 1;
  while ((held = read_primary(holder, sizeof holder)) != 0 &&
         dur_now_ms() < killed + 4.0 * LEASE_MS)
    dur_sleep_ms(20);
  if (held) {
    dur_fail("the killed primary's key outlived two leases (%d)", held);
    goto out;
  }
  dur_note("the killed primary's key ended %.0f ms after the kill",
           dur_now_ms() - killed);
  if (start(&n[1], 1, SYNC_TIMEOUT))
    goto out;
  /* two leases and more with no primary: it runs in the election after
     the degraded epoch but may not campaign */
  const double from = dur_now_ms(), until = from + 2.0 * LEASE_MS + 1000;
  int became = 0, polls = 0, answered = 0;
  while (dur_now_ms() < until) {
    int r = role_of(n[1].s.addr);
    became |= r == EMBPS_ROLE_PRIMARY;
    answered += r >= 0;
    polls++;
    dur_sleep_ms(50);
  }
  held = read_primary(holder, sizeof holder);
  if (became || held != 0 || answered < polls / 2)
    dur_fail("the old follower of a degraded primary: elected %d, P/primary "
             "%d (%s), answered %d of %d looks", became, held, holder,
             answered, polls);
  else
    dur_note("no primary for %.0f ms after the old follower started (%d "
             "looks at it)", dur_now_ms() - from, polls);
  char *log = dur_server_log(&n[1].s);
  if (!log || !strstr(log, "was degraded") ||
      !strstr(log, "not eligible: will not campaign"))
    dur_fail("%s does not say why it is not eligible", n[1].s.addr);
  free(log);
  /* the old primary comes back: elected, nothing it acknowledged lost */
  const double back = dur_now_ms();
  if (start(&n[0], 1, SYNC_TIMEOUT) ||
      wait_primary(n[0].s.addr, LEASE_MS + 15000)) {
    dur_fail("the old primary %s was not elected again", n[0].s.addr);
    goto out;
  }
  dur_note("the old primary elected again %.0f ms after its start",
           dur_now_ms() - back);
  if (wait_acks(sh, wl.n_workers, 30, 60000))
    dur_fail("pushes not acknowledged after the old primary's return");
  if (repl_wait_in_sync(n[0].s.addr, 1, 60000))
    dur_fail("%s did not follow the re-elected primary", n[1].s.addr);
  dur_workers_finish(sh, pids, wl.n_workers, 120000, 1);
  pids[0] = 0; /* finished */
  final_checks(n, 0, &wl, sh);
out:
  if (pids[0])
    dur_workers_finish(sh, pids, wl.n_workers, 120000, 1);
  int bad = dur_failures();
  if (!bad)
    printf("[degrade kill] degraded after the follower's loss; its follower "
           "not elected; the old primary elected again; 0 lost, 0 "
           "doubled\n");
  teardown(n);
  dur_shared_free(sh);
  return bad ? 1 : 0;
}

static int scenario_recover(void) {
  dur_workload_t wl = {.n_workers = 2, .rows_per_worker = 16,
                       .seed = dur_seed()};
  node_t n[2];
  dur_shared_t *sh = dur_shared_new();
  pid_t pids[DUR_MAX_WORKERS] = {0};
  if (setup(n, 1, SYNC_TIMEOUT, &wl))
    goto out;
  spawn(sh, &wl, pids, n);
  if (degrade_by_kill(n, 0, sh, wl.n_workers))
    goto out;
  embps_server_stats_t st;
  if (repl_stats(n[0].s.addr, &st))
    goto out;
  const uint32_t epoch = st.epoch;
  if (wait_acks(sh, wl.n_workers, 30, 20000))
    dur_fail("too few pushes acknowledged while degraded");
  const double back = dur_now_ms();
  if (start(&n[1], 1, SYNC_TIMEOUT))
    goto out;
  if (wait_sync(0, epoch, 60000)) {
    dur_fail("P/sync not strict again for epoch %u after the follower's "
             "return", epoch);
    goto out;
  }
  dur_note("P/sync strict again %.0f ms after the follower was started",
           dur_now_ms() - back);
  if (stats_degraded(n[0].s.addr) != 0 ||
      metric(&n[0], "embps_sync_degraded") != 0 ||
      metric(&n[0], "embps_sync_degradations_total") != 1)
    dur_fail("%s still says degraded (or counted more than once)",
             n[0].s.addr);
  if (wait_acks(sh, wl.n_workers, 30, 20000))
    dur_fail("pushes not acknowledged once strict again");
  /* failover is possible again: every acknowledged push is on it */
  dur_server_kill(&n[0].s);
  if (wait_primary(n[1].s.addr, LEASE_MS + 10000)) {
    dur_fail("the follower in sync was not elected");
    goto out;
  }
  if (start(&n[0], 1, SYNC_TIMEOUT))
    goto out;
  if (wait_acks(sh, wl.n_workers, 30, 60000))
    dur_fail("pushes not acknowledged by the new primary");
  if (repl_wait_in_sync(n[1].s.addr, 1, 60000))
    dur_fail("%s did not rejoin", n[0].s.addr);
  dur_workers_finish(sh, pids, wl.n_workers, 120000, 1);
  pids[0] = 0; /* finished */
  final_checks(n, 1, &wl, sh);
out:
  if (pids[0])
    dur_workers_finish(sh, pids, wl.n_workers, 120000, 1);
  int bad = dur_failures();
  if (!bad)
    printf("[degrade recover] strict again once the follower caught up; "
           "it was elected after the primary's kill; 0 lost, 0 doubled\n");
  teardown(n);
  dur_shared_free(sh);
  return bad ? 1 : 0;
}

static int scenario_strict(void) {
  dur_workload_t wl = {.n_workers = 1, .rows_per_worker = 16,
                       .seed = dur_seed()};
  node_t n[2];
  if (setup(n, 0, "1500", &wl))
    goto out;
  dur_server_kill(&n[1].s);
  embps_client_t *c = dur_connect(n[0].s.addr, 5000, -1, "pusher");
  for (int round = 0; c && round < 2; round++) {
    const double t0 = dur_now_ms();
    int rc = dur_push_wit(c, &wl, 0);
    const double took = dur_now_ms() - t0;
    dur_note("push %d after the follower's loss: %d after %.0f ms (%s)",
             round, rc, took, rc ? embps_client_last_error(c) : "");
    if (rc != EMBPS_ENOREPLICAS || took < 1500 * 0.9)
      dur_fail("strict: push %d answered %d after %.0f ms, want "
               "EMBPS_ENOREPLICAS after --sync-timeout-ms 1500", round, rc,
               took);
    dur_sleep_ms(2000);
  }
  embps_client_destroy(c);
  embps_coord_sync_t s;
  if (read_sync(&s) != 0)
    dur_fail("strict: P/sync written (degraded %d)", s.degraded);
  if (stats_degraded(n[0].s.addr) != 0)
    dur_fail("strict: stats say degraded");
  if (metric(&n[0], "embps_sync_degraded") != -1)
    dur_fail("strict: /metrics has embps_sync_degraded without the flag");
out:;
  int bad = dur_failures();
  if (!bad)
    printf("[degrade strict] refused EMBPS_ENOREPLICAS after the timeout, "
           "never degraded\n");
  teardown(n);
  return bad ? 1 : 0;
}

/* The binary's answer to argv: its exit status, stderr in err. */
static int run_server(const char *const *args, char *err, size_t cap) {
  const char *argv[16] = {EMBPS_SERVER_BIN};
  int i = 1;
  for (; args[i - 1] && i < 15; i++)
    argv[i] = args[i - 1];
  argv[i] = NULL;
  int fds[2];
  if (pipe(fds))
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(fds[1]);
  size_t len = 0;
  ssize_t k;
  while (len + 1 < cap && (k = read(fds[0], err + len, cap - len - 1)) > 0)
    len += (size_t)k;
  err[len] = 0;
  close(fds[0]);
  int st;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int scenario_flags(void) {
  const struct {
    const char *args[8], *want;
  } bad[] = {
      {{"--sync-followers", "1", "--sync-degrade-ms", "50", NULL},
       "--sync-degrade-ms 50: 0 (never) or 100 to 3600000"},
      {{"--sync-followers", "1", "--sync-degrade-ms", "3600001", NULL},
       "--sync-degrade-ms \"3600001\" is not a number in [0, 3600000]"},
      {{"--sync-followers", "1", "--sync-degrade-ms", "-5", NULL},
       "--sync-degrade-ms \"-5\" is not a number"},
      {{"--sync-degrade-ms", "10000", NULL},
       "--sync-degrade-ms needs --sync-followers 1 or more"},
  };
  char err[4096];
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    int rc = run_server(bad[k].args, err, sizeof err);
    if (rc != 2 || !strstr(err, bad[k].want))
      dur_fail("%s %s: exit %d, stderr \"%s\", want 2 and \"%s\"",
               bad[k].args[2] ? bad[k].args[2] : bad[k].args[0],
               bad[k].args[3] ? bad[k].args[3] : bad[k].args[1], rc, err,
               bad[k].want);
  }
  const char *help[] = {"--help", NULL};
  if (run_server(help, err, sizeof err) != 0)
    dur_fail("--help failed");
  int bad_n = dur_failures();
  if (!bad_n)
    printf("[degrade flags] bad --sync-degrade-ms values refused, naming "
           "the flag\n");
  return bad_n ? 1 : 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const char *what = argc > 1 ? argv[1] : "kill";
  if (!strcmp(what, "flags"))
    return scenario_flags();
  if (it_etcd_start(&etcd, 1, etcd_url, sizeof etcd_url))
    return 1;
  int rc;
  if (!strcmp(what, "kill"))
    rc = scenario_kill();
  else if (!strcmp(what, "recover"))
    rc = scenario_recover();
  else if (!strcmp(what, "strict"))
    rc = scenario_strict();
  else
    rc = 2;
  if (rc)
    it_etcd_dump_log(&etcd);
  it_etcd_destroy(&etcd, 1);
  return rc;
}
