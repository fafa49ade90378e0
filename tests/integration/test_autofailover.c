/* test_autofailover.c - automatic failover of a member (issue 22): two
 * embps-server processes with --coordinator against a real etcd on
 * loopback (etcd_util.h), --sync-followers 1 and a data dir each, under
 * the durability tests' exactly checkable push storm (dur_util.h: SGD
 * witness rows counting applied pushes, Adagrad rows replayed bit for
 * bit) from worker processes that push through a proxy, which the test
 * points at whichever server the election made primary (the library's
 * exactly-once retries carry each push across).
 *
 *   test_autofailover cycles [N]   kill -9 of the primary, N times (10;
 *       EMBPS_LONG=1: 30): the follower is elected and promoted without
 *       anyone's help, the killed server starts again and rejoins as its
 *       follower (its unacknowledged tail cut); after each failover,
 *       every witness row is in [acknowledged, acknowledged + in flight]
 *       on the new primary; the time from the kill to the first push
 *       acknowledged by the new primary is reported for each cycle
 *       (median and worst) and must stay within lease + 2 s; at the end
 *       witness == acknowledged exactly, Adagrad equals its replay, the
 *       follower equals the primary.
 *   test_autofailover direct [N]   the same (6; EMBPS_LONG=1: 30) with
 *       the workers listing both servers ("b|a") instead of a proxy: the
 *       library finds the primary by itself (a follower's hello names it;
 *       EMBPS_ENOTPRIMARY and unreachable servers move it along the
 *       list), the workers see no error.
 *   test_autofailover splitbrain   the primary frozen (SIGSTOP) for two
 *       leases: the follower takes over; resumed, the old primary
 *       acknowledges nothing (pushes sent straight to it are refused),
 *       rejoins as a follower, and every row equals the new primary's.
 *   test_autofailover frozen       a member of three servers, the
 *       primary frozen for four leases (eight under sanitizers) while the
 *       workers list all three ("c|b|a"): the pushes they had already
 *       sent to it do not wait for it to wake; every worker's pushes are
 *       acknowledged by the elected follower (the third server its
 *       synchronous follower) before the freeze ends, within two leases
 *       + 2 s, and nothing is lost or doubled once the old primary has
 *       rejoined.
 *   test_autofailover etcd         etcd killed for three leases: pushes
 *       go on while the lease can be valid, are refused after (nothing
 *       refused is lost: a refused push left applied is counted as in
 *       flight), no one else is elected, and they are taken again once
 *       etcd is back, on the same primary, without a restart. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dur_util.h"
#include "etcd_util.h"
#include "proxy.h"
#include "repl_util.h"
#include "wire.h" /* EMBPS_ROLE_* */

#define LEASE_MS 2000
#define LEASE_S "2000"
#define SYNC_TIMEOUT "20000"

/* Sanitizer builds run the servers ~10x slower: the time to recover is a
 * figure there (printed), checked against its bound elsewhere; they run
 * fewer cycles (4 and 3), each looking for memory errors and races, which
 * do not need the count the timing figures do. */
#ifdef EMBPS_TEST_SANITIZED
static const int sanitized = 1;
#else
static const int sanitized = 0;
#endif

static char etcd_url[256];
static it_etcd_t etcd;

/* A coordinated server of member 0 of cluster `name`. */
static int start(dur_server_t *s, const char *name) {
  int i = 0;
  s->args[i++] = "--coordinator";
  s->args[i++] = etcd_url;
  s->args[i++] = "--cluster-name";
  s->args[i++] = name;
  s->args[i++] = "--lease-ms";
  s->args[i++] = LEASE_S;
  s->args[i++] = "--sync-followers";
  s->args[i++] = "1";
  s->args[i++] = "--sync-timeout-ms";
  s->args[i++] = SYNC_TIMEOUT;
  s->args[i++] = "--shards";
  s->args[i++] = "4";
  s->args[i] = NULL;
  int rc = dur_server_start(s, 30000);
  if (rc) {
    dur_fail("%s did not start (%d)", s->addr, rc);
    dur_server_dump_log(s);
  }
  return rc;
}

/* Waits until the server at addr says it is primary: 0, or -1. */
static int wait_primary(const char *addr, int timeout_ms) {
  const double end = dur_now_ms() + timeout_ms;
  while (dur_now_ms() < end) {
    embps_server_stats_t st;
    if (!repl_stats(addr, &st) && st.role == EMBPS_ROLE_PRIMARY)
      return 0;
    dur_sleep_ms(10);
  }
  return -1;
}

static uint64_t acked_total(dur_shared_t *sh, int n) {
  uint64_t t = 0;
  for (int w = 0; w < n; w++)
    t += atomic_load(&sh->w[w].acked_wit) + atomic_load(&sh->w[w].acked_ada);
  return t;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Servers s[0..n-1] of one member up, s[0] elected, the others its
 * followers in sync; the proxy in front of s[0]; the tables created. */
static int setup_member(dur_server_t *s, int n, char dirs[][256],
                        const char *name, it_proxy_t **x,
                        const dur_workload_t *wl) {
  for (int i = 0; i < n; i++) {
    char tag[16];
    snprintf(tag, sizeof tag, "afo-%c", 'a' + i);
    dur_mkdtemp(dirs[i], sizeof dirs[i], tag);
    dur_server_init(&s[i], dirs[i]);
  }
  if (start(&s[0], name) || wait_primary(s[0].addr, 20000)) {
    dur_fail("%s was not elected", s[0].addr);
    return -1;
  }
  for (int i = 1; i < n; i++)
    if (start(&s[i], name))
      return -1;
  if (repl_wait_in_sync(s[0].addr, (uint32_t)(n - 1), 20000))
    return -1;
  if (it_proxy_start(x, s[0].addr))
    return -1;
  embps_client_t *c = dur_connect(it_proxy_addr(*x), 20000, 30000, "setup");
  int rc = !c || dur_create_tables(c, wl);
  embps_client_destroy(c);
  return rc ? -1 : 0;
}

/* The end: exact on the primary p, bit for bit with a replay, and the
 * others equal to it. */
static void final_checks(dur_server_t *s, int n, int p,
                         const dur_workload_t *wl, dur_shared_t *sh) {
  embps_client_t *chk = dur_connect(s[p].addr, 10000, -1, "final check");
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
  for (int i = 0; i < n; i++)
    if (i != p && (repl_wait_caught_up(s[p].addr, s[i].addr, 60000) ||
                   repl_compare(s[p].addr, s[i].addr, "follower at the end",
                                0)))
      dur_fail("%s is not the primary's copy at the end", s[i].addr);
}

static void teardown(dur_server_t *s, int n, char dirs[][256],
                     it_proxy_t *x) {
  int bad = dur_failures();
  for (int i = 0; i < n; i++) {
    if (bad)
      dur_server_dump_log(&s[i]);
    dur_server_term(&s[i], 30000);
    dur_server_cleanup(&s[i]);
    if (!bad)
      dur_rm_rf(dirs[i]);
    else
      fprintf(stderr, "data dir kept: %s\n", dirs[i]);
  }
  if (x)
    it_proxy_stop(x);
}

/* direct: the workers list the member's two servers ("a|b") and find the
 * primary themselves (hello, EMBPS_ENOTPRIMARY); else they push through
 * the proxy, which the test points at the new primary. */
static int scenario_cycles(int cycles, int direct) {
  uint64_t seed = dur_seed(), rng = seed;
  dur_workload_t wl = {.n_workers = 2, .rows_per_worker = 16, .seed = seed};
  dur_server_t s[2];
  char dirs[2][256];
  it_proxy_t *x = NULL;
  if (setup_member(s, 2, dirs, "cycles", &x, &wl)) {
    teardown(s, 2, dirs, x);
    return 1;
  }
  dur_shared_t *sh = dur_shared_new();
  pid_t pids[DUR_MAX_WORKERS] = {0};
  char both[2 * sizeof s[0].addr + 2];
  snprintf(both, sizeof both, "%s|%s", s[1].addr, s[0].addr);
  for (int w = 0; w < wl.n_workers; w++)
    pids[w] = dur_worker_spawn(sh, &wl, w, direct ? both : it_proxy_addr(x),
                               NULL, 120000);
  double *rto = calloc((size_t)cycles, sizeof *rto);
  double *ert = calloc((size_t)cycles, sizeof *ert);
  int p = 0, cycle;
  for (cycle = 0; cycle < cycles && !dur_failures(); cycle++) {
    /* a storm first: some pushes acknowledged since the last failover */
    uint64_t before = acked_total(sh, wl.n_workers);
    double end = dur_now_ms() + 10000;
    while (acked_total(sh, wl.n_workers) < before + 20 && dur_now_ms() < end)
      dur_sleep_ms(5);
    dur_sleep_ms(100 + (double)(rng_next(&rng) % 400));
    const int f = 1 - p;
    const double killed = dur_now_ms();
    dur_server_kill(&s[p]);
    if (wait_primary(s[f].addr, LEASE_MS + 10000)) {
      dur_fail("cycle %d: %s was not elected", cycle, s[f].addr);
      dur_server_dump_log(&s[f]);
      break;
    }
    const double elected = dur_now_ms();
    ert[cycle] = elected - killed;
    if (!direct) {
      it_proxy_set_upstream(x, s[f].addr);
      it_proxy_cut(x); /* the workers retry on the new primary */
    }
    const uint64_t base = acked_total(sh, wl.n_workers);
    /* the killed one starts again: its coordinator finds the new primary
       and it rejoins as a follower (acknowledgements need it) */
    if (start(&s[p], "cycles"))
      break;
    end = dur_now_ms() + 30000;
    while (acked_total(sh, wl.n_workers) == base && dur_now_ms() < end)
      dur_sleep_ms(2);
    if (acked_total(sh, wl.n_workers) == base) {
      dur_fail("cycle %d: no push acknowledged by %s within 30 s", cycle,
               s[f].addr);
      break;
    }
    rto[cycle] = dur_now_ms() - killed;
    dur_note("cycle %d: elected after %.0f ms, first push acknowledged by "
             "the new primary %.0f ms after the kill", cycle,
             elected - killed, rto[cycle]);
    if (rto[cycle] > LEASE_MS + 2000 && !sanitized)
      dur_fail("cycle %d: %.0f ms from the kill to the first acknowledged "
               "push, more than lease + 2 s", cycle, rto[cycle]);
    dur_workers_stop(pids, wl.n_workers);
    char when[64];
    snprintf(when, sizeof when, "cycle %d (after the failover)", cycle);
    embps_client_t *chk = dur_connect(s[f].addr, 10000, -1, when);
    if (chk)
      dur_check_witness(chk, &wl, sh, when, 0, 1);
    embps_client_destroy(chk);
    dur_workers_alive(pids, wl.n_workers, sh);
    dur_workers_cont(pids, wl.n_workers);
    if (repl_wait_in_sync(s[f].addr, 1, 60000)) {
      dur_fail("cycle %d: %s did not rejoin", cycle, s[p].addr);
      dur_server_dump_log(&s[p]);
      break;
    }
    p = f;
  }
  if (cycle < cycles)
    dur_fail("stopped after %d of %d cycles", cycle, cycles);
  if (cycle) {
    /* the first acknowledgement also waits for the workers' reconnection
       backoff (the library's: 20 ms doubling up to 1 s) */
    qsort(rto, (size_t)cycle, sizeof *rto, cmp_double);
    qsort(ert, (size_t)cycle, sizeof *ert, cmp_double);
    printf("[autofailover%s] %d failovers, lease %d ms: kill to the new "
           "primary's promotion median %.0f ms, worst %.0f ms; kill to first "
           "acknowledged push median %.0f ms, 90th %.0f ms, worst %.0f ms\n",
           direct ? " direct" : "", cycle, LEASE_MS, ert[cycle / 2], ert[cycle - 1], rto[cycle / 2],
           rto[cycle * 9 / 10], rto[cycle - 1]);
  }
  free(rto);
  free(ert);
  dur_sleep_ms(200);
  dur_workers_finish(sh, pids, wl.n_workers, 120000, 1);
  final_checks(s, 2, p, &wl, sh);
  int bad = dur_failures();
  if (!bad)
    printf("[autofailover] 0 acknowledged pushes lost, 0 doubled\n");
  teardown(s, 2, dirs, x);
  dur_shared_free(sh);
  return bad ? 1 : 0;
}

/* Pushes one witness increment straight to addr: 0 acknowledged, 1
 * refused before it was applied, 2 refused after (applied, not
 * acknowledged), 3 no answer. */
static int direct_push(const char *addr, const dur_workload_t *wl) {
  embps_client_t *c = dur_connect(addr, 3000, -1, NULL); /* its own answer */
  if (!c)
    return 3;
  int rc = dur_push_wit(c, wl, 0);
  int out = rc == 0                        ? 0
            : rc != EMBPS_ENOTPRIMARY      ? 3
            : strstr(embps_client_last_error(c), "applied on") ? 2
                                                               : 1;
  embps_client_destroy(c);
  return out;
}

static int scenario_splitbrain(void) {
  uint64_t seed = dur_seed();
  dur_workload_t wl = {.n_workers = 2, .rows_per_worker = 16, .seed = seed};
  dur_server_t s[2];
  char dirs[2][256];
  it_proxy_t *x = NULL;
  if (setup_member(s, 2, dirs, "split", &x, &wl)) {
    teardown(s, 2, dirs, x);
    return 1;
  }
  dur_shared_t *sh = dur_shared_new();
  pid_t pids[DUR_MAX_WORKERS] = {0};
  for (int w = 0; w < wl.n_workers; w++)
    pids[w] = dur_worker_spawn(sh, &wl, w, it_proxy_addr(x), NULL, 120000);
  dur_sleep_ms(1000);
  kill(s[0].pid, SIGSTOP);
  int st;
  waitpid(s[0].pid, &st, WUNTRACED);
  const double stopped = dur_now_ms();
  if (wait_primary(s[1].addr, 2 * LEASE_MS + 5000))
    dur_fail("%s was not elected while %s was frozen", s[1].addr, s[0].addr);
  dur_note("frozen primary replaced after %.0f ms", dur_now_ms() - stopped);
  it_proxy_set_upstream(x, s[1].addr);
  it_proxy_cut(x);
  double left = 2.0 * LEASE_MS - (dur_now_ms() - stopped);
  if (left > 0)
    dur_sleep_ms(left);
  kill(s[0].pid, SIGCONT);
  /* straight to the old primary: nothing acknowledged, ever */
  int acked = 0, after = 0, refused = 0;
  const double end = dur_now_ms() + 1000;
  while (dur_now_ms() < end) {
    int r = direct_push(s[0].addr, &wl);
    acked += r == 0;
    after += r == 2;
    refused += r == 1;
  }
  dur_note("after SIGCONT: %d pushes sent straight to the old primary "
           "refused, %d refused after being applied, %d acknowledged",
           refused, after, acked);
  if (acked)
    dur_fail("the old primary acknowledged %d pushes after its lease", acked);
  if (after) /* applied there, unacknowledged: its rejoin cuts them */
    dur_note("(applied unacknowledged pushes are cut by the rejoin)");
  /* it rejoins as the new primary's follower (executing itself again) */
  if (repl_wait_in_sync(s[1].addr, 1, 60000)) {
    dur_fail("%s did not rejoin", s[0].addr);
    dur_server_dump_log(&s[0]);
  }
  char *log = dur_server_log(&s[0]);
  if (!log || !strstr(log, "rejoining as a follower"))
    dur_fail("%s: no rejoin in its log", s[0].addr);
  free(log);
  dur_sleep_ms(500);
  dur_workers_finish(sh, pids, wl.n_workers, 120000, 1);
  final_checks(s, 2, 1, &wl, sh);
  int bad = dur_failures();
  if (!bad)
    printf("[splitbrain] the old primary acknowledged nothing after its "
           "lease; rows equal after its rejoin\n");
  teardown(s, 2, dirs, x);
  dur_shared_free(sh);
  return bad ? 1 : 0;
}

static uint64_t acked_of(dur_shared_t *sh, int w) {
  return atomic_load(&sh->w[w].acked_wit) + atomic_load(&sh->w[w].acked_ada);
}

static int scenario_frozen(void) {
  const int freeze_ms = (sanitized ? 8 : 4) * LEASE_MS;
  uint64_t seed = dur_seed();
  dur_workload_t wl = {.n_workers = 2, .rows_per_worker = 16, .seed = seed};
  dur_server_t s[3];
  char dirs[3][256];
  it_proxy_t *x = NULL;
  if (setup_member(s, 3, dirs, "frozen", &x, &wl)) {
    teardown(s, 3, dirs, x);
    return 1;
  }
  dur_shared_t *sh = dur_shared_new();
  pid_t pids[DUR_MAX_WORKERS] = {0};
  char all[3 * sizeof s[0].addr + 3];
  snprintf(all, sizeof all, "%s|%s|%s", s[2].addr, s[1].addr, s[0].addr);
  for (int w = 0; w < wl.n_workers; w++)
    pids[w] = dur_worker_spawn(sh, &wl, w, all, NULL, 120000);
  for (double end = dur_now_ms() + 20000; dur_now_ms() < end;
       dur_sleep_ms(5))
    if (acked_of(sh, 0) >= 20 && acked_of(sh, 1) >= 20)
      break;
  kill(s[0].pid, SIGSTOP);
  int st;
  waitpid(s[0].pid, &st, WUNTRACED);
  const double stopped = dur_now_ms();
  /* a reply already on its way when the primary froze may still count:
     one push per worker at most */
  uint64_t base[DUR_MAX_WORKERS];
  double resumed[DUR_MAX_WORKERS] = {0};
  for (int w = 0; w < wl.n_workers; w++)
    base[w] = acked_of(sh, w);
  while (dur_now_ms() - stopped < freeze_ms) {
    for (int w = 0; w < wl.n_workers; w++)
      if (!resumed[w] && acked_of(sh, w) >= base[w] + 2)
        resumed[w] = dur_now_ms() - stopped;
    dur_sleep_ms(2);
  }
  kill(s[0].pid, SIGCONT);
  for (int w = 0; w < wl.n_workers; w++) {
    if (!resumed[w])
      dur_fail("worker %d: no push acknowledged while the primary was "
               "frozen for %d ms (its requests waited for it)", w,
               freeze_ms);
    else if (!sanitized && resumed[w] > 2 * LEASE_MS + 2000)
      dur_fail("worker %d: pushes acknowledged again %.0f ms after the "
               "primary froze, more than two leases + 2 s", w, resumed[w]);
    else
      dur_note("worker %d: pushes acknowledged again %.0f ms after the "
               "primary froze (frozen for %d ms)", w, resumed[w], freeze_ms);
  }
  int p = 1;
  if (wait_primary(s[1].addr, 1000) && !wait_primary(s[2].addr, 1000))
    p = 2;
  if (repl_wait_in_sync(s[p].addr, 2, 60000)) {
    dur_fail("%s did not rejoin %s", s[0].addr, s[p].addr);
    dur_server_dump_log(&s[0]);
  }
  dur_sleep_ms(500);
  dur_workers_finish(sh, pids, wl.n_workers, 120000, 1);
  final_checks(s, 3, p, &wl, sh);
  int bad = dur_failures();
  if (!bad)
    printf("[frozen] the workers went on with the elected follower while "
           "the primary was frozen; 0 lost, 0 doubled\n");
  teardown(s, 3, dirs, x);
  dur_shared_free(sh);
  return bad ? 1 : 0;
}

static int scenario_etcd(void) {
  uint64_t seed = dur_seed();
  dur_workload_t wl = {.n_workers = 1, .rows_per_worker = 16, .seed = seed};
  dur_server_t s[2];
  char dirs[2][256];
  it_proxy_t *x = NULL;
  if (setup_member(s, 2, dirs, "outage", &x, &wl)) {
    teardown(s, 2, dirs, x);
    return 1;
  }
  /* one client pushing witness increments to the primary, counting */
  embps_client_t *c = dur_connect(s[0].addr, 5000, -1, "pusher"); /* its answers */
  uint64_t acked = 0, unknown = 0, refused_during = 0, acked_late = 0;
  double last_ack_down = 0;
  int phase = 0; /* 0 before, 1 etcd down, 2 back */
  double down_at = 0, up_at = 0, resumed = 0;
  const double t0 = dur_now_ms();
  while (c && !dur_failures()) {
    const double now = dur_now_ms();
    if (phase == 0 && now - t0 > 1000) {
      it_etcd_kill(&etcd);
      down_at = dur_now_ms();
      phase = 1;
    } else if (phase == 1 && now - down_at > 3 * LEASE_MS) {
      if (it_etcd_restart(&etcd, 1))
        dur_fail("etcd did not come back");
      up_at = dur_now_ms();
      phase = 2;
    } else if (phase == 2 && resumed && now - resumed > 1000) {
      break;
    } else if (phase == 2 && now - up_at > 10000) {
      dur_fail("pushes not taken again within 10 s of etcd's return");
      break;
    }
    int rc = dur_push_wit(c, &wl, 0);
    if (rc == 0) {
      acked++;
      if (phase == 1) {
        last_ack_down = dur_now_ms() - down_at;
        if (last_ack_down > LEASE_MS)
          acked_late++;
      }
      if (phase == 2 && !resumed)
        resumed = dur_now_ms();
    } else if (rc == EMBPS_ENOTPRIMARY) {
      if (strstr(embps_client_last_error(c), "applied on"))
        unknown++;
      refused_during += phase == 1;
      if (phase != 1 && phase != 2)
        dur_fail("push refused before the outage: %s",
                 embps_client_last_error(c));
      dur_sleep_ms(20);
    } else {
      dur_fail("push: %s", embps_client_last_error(c));
    }
  }
  embps_client_destroy(c);
  dur_note("etcd down for %d ms: last push acknowledged %.0f ms into the "
           "outage, %llu refused during it; taken again %.0f ms after etcd "
           "came back", 3 * LEASE_MS, last_ack_down,
           (unsigned long long)refused_during, resumed - up_at);
  if (acked_late)
    dur_fail("%llu pushes acknowledged more than a lease into the outage",
             (unsigned long long)acked_late);
  if (!refused_during)
    dur_fail("no push refused while no lease could be valid");
  embps_server_stats_t st;
  if (repl_stats(s[0].addr, &st) || st.role != EMBPS_ROLE_PRIMARY)
    dur_fail("%s is not the primary after the outage", s[0].addr);
  if (repl_stats(s[1].addr, &st) || st.role != EMBPS_ROLE_FOLLOWER)
    dur_fail("%s was elected during the outage", s[1].addr);
  /* nothing acknowledged lost, nothing applied twice */
  embps_client_t *chk = dur_connect(s[0].addr, 10000, -1, "check");
  double wit[256];
  if (chk && !dur_pull_wit(chk, &wl, wit)) {
    /* worker 0's witness rows each count its applied pushes */
    double got = wit[0];
    if (got < (double)acked || got > (double)(acked + unknown))
      dur_fail("witness %.0f outside [%llu, %llu]", got,
               (unsigned long long)acked,
               (unsigned long long)(acked + unknown));
  }
  embps_client_destroy(chk);
  if (repl_wait_caught_up(s[0].addr, s[1].addr, 30000) ||
      repl_compare(s[0].addr, s[1].addr, "follower after the outage", 0))
    dur_fail("the follower is not the primary's copy");
  int bad = dur_failures();
  if (!bad)
    printf("[etcd-outage] %llu pushes acknowledged, none after the lease "
           "could have ended, none lost\n", (unsigned long long)acked);
  teardown(s, 2, dirs, x);
  return bad ? 1 : 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const char *what = argc > 1 ? argv[1] : "cycles";
  if (it_etcd_start(&etcd, 1, etcd_url, sizeof etcd_url))
    return 1;
  int rc;
  if (!strcmp(what, "cycles"))
    rc = scenario_cycles(argc > 2    ? atoi(argv[2])
                         : dur_long() ? 30
                         : sanitized  ? 4
                                      : 10, 0);
  else if (!strcmp(what, "direct"))
    rc = scenario_cycles(argc > 2    ? atoi(argv[2])
                         : dur_long() ? 30
                         : sanitized  ? 3
                                      : 6, 1);
  else if (!strcmp(what, "splitbrain"))
    rc = scenario_splitbrain();
  else if (!strcmp(what, "frozen"))
    rc = scenario_frozen();
  else if (!strcmp(what, "etcd"))
    rc = scenario_etcd();
  else
    rc = 2;
  if (rc)
    it_etcd_dump_log(&etcd);
  it_etcd_destroy(&etcd, 1);
  return rc;
}
