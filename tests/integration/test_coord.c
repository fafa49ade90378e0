/* test_coord.c - the election and fencing of server/coord.c against a
 * real etcd on loopback, with each server played by a probe process (this
 * program run as `test_coord probe ...`): a coordinator whose callbacks
 * print what it was told (PROMOTE, FOLLOW) and a writer thread that asks
 * embps_coord_may_write in a loop and reports the last moment it was
 * allowed (OK, CLOCK_MONOTONIC ns: the same clock in every process).
 *   - one winner, and it is the candidate with the highest LSN; the
 *     others follow it; epochs start at 1 and only grow;
 *   - servers that may not campaign (not in sync) never take the key;
 *     one that becomes eligible does, in a later round;
 *   - kill -9 of the primary: the other takes over within lease + 2 s,
 *     cycle after cycle, the killed one coming back as a follower;
 *   - fencing: a primary frozen (SIGSTOP) for 2 leases acknowledges
 *     nothing once resumed, its last write allowed before the new
 *     primary was promoted, and it becomes a follower of it;
 *   - a primary that shuts down gives its lease back: the follower takes
 *     over at once, without waiting for the lease; one restarted on its
 *     address ends its previous run's lease;
 *   - etcd down for 3 leases: the primary stops writing before its lease
 *     could have ended, no one else is promoted; etcd back: writes go on
 *     with exactly one primary. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coord.h"
#include "etcd.h"
#include "etcd_util.h"
#include "harness.h"
#include "util.h"

#define LEASE_MS 2000

/* ---- the probe: one server's coordinator ---- */

static atomic_uint_fast64_t probe_last_ok;
static const char *probe_ctl; /* a file "LSN ELIGIBLE EPOCH" overriding args */
static uint64_t probe_lsn;
static int probe_eligible;
static volatile sig_atomic_t probe_stop;

static void probe_self(void *ctx, uint32_t last, embps_coord_self_t *out) {
  (void)ctx;
  out->lsn = probe_lsn;
  out->eligible = probe_eligible;
  out->epoch = 0;
  FILE *f = fopen(probe_ctl, "r");
  if (f) {
    unsigned long long lsn;
    int el;
    unsigned ep;
    if (fscanf(f, "%llu %d %u", &lsn, &el, &ep) == 3) {
      out->lsn = lsn;
      out->eligible = el;
      out->epoch = ep;
    }
    fclose(f);
  }
  printf("SELF %" PRIu32 " %" PRIu64 " %d\n", last, out->lsn, out->eligible);
  fflush(stdout);
}

static int probe_promote(void *ctx, uint32_t epoch) {
  (void)ctx;
  printf("PROMOTE %" PRIu32 " %" PRIu64 "\n", epoch, embps_now_ns());
  fflush(stdout);
  return 0;
}

static void probe_follow(void *ctx, const char *addr, uint32_t epoch,
                         int was_primary) {
  (void)ctx;
  printf("FOLLOW %s %" PRIu32 " %d %" PRIu64 "\n", addr, epoch, was_primary,
         embps_now_ns());
  fflush(stdout);
}

static void probe_log(void *ctx, int level, const char *msg) {
  (void)ctx;
  printf("LOG %d %s\n", level, msg);
  fflush(stdout);
}

static void *probe_writer(void *arg) {
  embps_coord_t *c = arg;
  while (!probe_stop) {
    uint64_t now = embps_now_ns();
    if (embps_coord_may_write(c))
      atomic_store(&probe_last_ok, now);
    usleep(500);
  }
  return NULL;
}

static void on_term(int sig) {
  (void)sig;
  probe_stop = 1;
}

/* probe URL CLUSTER MEMBER ADDR LSN ELIGIBLE CTL_FILE */
static int probe_main(int argc, char **argv) {
  if (argc != 9)
    return 2;
  probe_lsn = strtoull(argv[6], NULL, 10);
  probe_eligible = atoi(argv[7]);
  probe_ctl = argv[8];
  signal(SIGTERM, on_term);
  embps_coord_config_t cfg = {.url = argv[2], .cluster = argv[3],
                              .member = (uint32_t)atoi(argv[4]),
                              .addr = argv[5], .lease_ms = LEASE_MS,
                              .self = probe_self, .promote = probe_promote,
                              .follow = probe_follow, .log = probe_log};
  embps_coord_t *c;
  char err[256];
  if (embps_coord_create(&cfg, &c, err, sizeof err)) {
    printf("ERROR %s\n", err);
    return 1;
  }
  embps_coord_start(c);
  pthread_t w;
  pthread_create(&w, NULL, probe_writer, c);
  uint64_t shown_ok = 0;
  embps_coord_role_t shown_role = (embps_coord_role_t)-1;
  uint32_t shown_epoch = 0;
  while (!probe_stop) {
    embps_coord_status_t s;
    embps_coord_status(c, &s);
    if (s.role != shown_role || s.epoch != shown_epoch) {
      printf("ROLE %s %" PRIu32 " %s\n", embps_coord_role_name(s.role),
             s.epoch, s.primary[0] ? s.primary : "-");
      shown_role = s.role;
      shown_epoch = s.epoch;
    }
    uint64_t ok = atomic_load(&probe_last_ok);
    if (ok != shown_ok) {
      printf("OK %" PRIu64 "\n", ok);
      shown_ok = ok;
    }
    fflush(stdout);
    usleep(10000);
  }
  pthread_join(w, NULL);
  embps_coord_destroy(c, 1);
  printf("OK %" PRIu64 "\nBYE\n", (uint64_t)atomic_load(&probe_last_ok));
  fflush(stdout);
  return 0;
}

/* ---- the tests' side ---- */

static char self_exe[512];
static it_etcd_t etcd;
static char url[256];
static int cluster_seq;

typedef struct {
  pid_t pid;
  char addr[32];
  char log[300], ctl[300];
} probe_t;

static void probe_start(probe_t *p, const char *cluster, const char *addr,
                        uint64_t lsn, int eligible) {
  snprintf(p->addr, sizeof p->addr, "%s", addr);
  snprintf(p->log, sizeof p->log, "%s/probe-%s-%s.log", etcd.dir, cluster, addr);
  snprintf(p->ctl, sizeof p->ctl, "%s/probe-%s-%s.ctl", etcd.dir, cluster, addr);
  char lsn_s[32], el_s[8];
  snprintf(lsn_s, sizeof lsn_s, "%" PRIu64, lsn);
  snprintf(el_s, sizeof el_s, "%d", eligible);
  const char *argv[] = {self_exe, "probe", url, cluster, "0", addr, lsn_s,
                        el_s, p->ctl, NULL};
  p->pid = it_spawn(argv, p->log, NULL);
  assert_true(p->pid > 0);
}

static void probe_kill(probe_t *p, int sig) {
  if (!p->pid)
    return;
  kill(p->pid, sig);
  if (sig == SIGKILL || sig == SIGTERM) {
    int code;
    if (it_wait_exit(p->pid, 10000, &code) != 1) {
      kill(p->pid, SIGKILL);
      waitpid(p->pid, NULL, 0);
    }
    p->pid = 0;
  }
}

/* The last line of p's log starting with what (and after a line
 * starting with after, when not NULL): 1 with it in line, or 0. */
static int probe_find(const probe_t *p, const char *what, char *line,
                      size_t cap) {
  FILE *f = fopen(p->log, "r");
  if (!f)
    return 0;
  char buf[1024];
  int found = 0;
  while (fgets(buf, sizeof buf, f))
    if (!strncmp(buf, what, strlen(what))) {
      snprintf(line, cap, "%s", buf);
      found = 1;
    }
  fclose(f);
  return found;
}

static int probe_count(const probe_t *p, const char *what) {
  FILE *f = fopen(p->log, "r");
  if (!f)
    return 0;
  char buf[1024];
  int n = 0;
  while (fgets(buf, sizeof buf, f))
    n += !strncmp(buf, what, strlen(what));
  fclose(f);
  return n;
}

static void probe_dump(const probe_t *p) {
  FILE *f = fopen(p->log, "r");
  if (!f)
    return;
  fprintf(stderr, "---- probe %s ----\n", p->addr);
  char buf[1024];
  while (fgets(buf, sizeof buf, f))
    if (strncmp(buf, "OK ", 3))
      fputs(buf, stderr);
  fclose(f);
}

/* Waits until p has printed `count` lines starting with what. */
static int probe_wait(const probe_t *p, const char *what, int count,
                      int timeout_ms) {
  const double end = it_now_ms() + timeout_ms;
  while (it_now_ms() < end) {
    if (probe_count(p, what) >= count)
      return 0;
    it_sleep_ms(20);
  }
  probe_dump(p);
  return -1;
}

/* Which of n probes printed a PROMOTE for epoch (-1 none, -2 several). */
static int promoted(const probe_t *p, int n, uint32_t epoch, uint64_t *at) {
  int who = -1;
  for (int i = 0; i < n; i++) {
    FILE *f = fopen(p[i].log, "r");
    char buf[256];
    while (f && fgets(buf, sizeof buf, f)) {
      unsigned e;
      unsigned long long t;
      if (sscanf(buf, "PROMOTE %u %llu", &e, &t) == 2 && e == epoch) {
        who = who == -1 ? i : -2;
        if (at)
          *at = t;
      }
    }
    if (f)
      fclose(f);
  }
  return who;
}

static int wait_promoted(const probe_t *p, int n, uint32_t epoch,
                         int timeout_ms, uint64_t *at) {
  const double end = it_now_ms() + timeout_ms;
  int who;
  while ((who = promoted(p, n, epoch, at)) == -1 && it_now_ms() < end)
    it_sleep_ms(10);
  if (who < 0)
    for (int i = 0; i < n; i++)
      probe_dump(&p[i]);
  return who;
}

static uint64_t last_ok(const probe_t *p) {
  char line[1024];
  unsigned long long t = 0;
  if (probe_find(p, "OK ", line, sizeof line))
    sscanf(line, "OK %llu", &t);
  return t;
}

static void next_cluster(char *name, size_t cap) {
  snprintf(name, cap, "c%d", ++cluster_seq);
}

static int group_setup(void **state) {
  (void)state;
  return it_etcd_start(&etcd, 1, url, sizeof url);
}

static int group_teardown(void **state) {
  (void)state;
  it_etcd_destroy(&etcd, 1);
  return 0;
}

static void test_config_refused(void **state) {
  (void)state;
  embps_coord_config_t cfg = {.url = url, .cluster = "a/b", .member = 0,
                              .addr = "127.0.0.1:1", .lease_ms = LEASE_MS,
                              .self = probe_self, .promote = probe_promote,
                              .follow = probe_follow};
  embps_coord_t *c;
  char err[256];
  assert_int_equal(embps_coord_create(&cfg, &c, err, sizeof err), -1);
  assert_non_null(strstr(err, "--cluster-name"));
  cfg.cluster = "ok";
  cfg.lease_ms = 999;
  assert_int_equal(embps_coord_create(&cfg, &c, err, sizeof err), -1);
  assert_non_null(strstr(err, "--lease-ms"));
  cfg.lease_ms = LEASE_MS;
  cfg.member = EMBPS_COORD_MEMBERS_MAX;
  assert_int_equal(embps_coord_create(&cfg, &c, err, sizeof err), -1);
  assert_non_null(strstr(err, "--member"));
  cfg.member = 1;
  cfg.url = "http://x:1";
  assert_int_equal(embps_coord_create(&cfg, &c, err, sizeof err), -1);
  assert_non_null(strstr(err, "etcd://"));
  cfg.url = url;
  assert_int_equal(embps_coord_create(&cfg, &c, err, sizeof err), 0);
  assert_false(embps_coord_may_write(c)); /* nothing before it won */
  embps_coord_destroy(c, 1);
  char p[64];
  embps_coord_prefix("ps", 3, p, sizeof p);
  assert_string_equal(p, "/embps/ps/member/3");
}

/* Holds cluster cl's primary key for a server that does not exist, under
 * a lease of its own (returned, with the client in *e), so that an
 * election starts only once the test ends that lease. */
static int64_t hold_slot(const char *cl, embps_etcd_t **e) {
  char err[256], key[64];
  assert_int_equal(embps_etcd_create(url, 2000, e, err, sizeof err), 0);
  int64_t lease, ttl;
  assert_int_equal(embps_etcd_lease_grant(*e, 60, &lease, &ttl), 0);
  snprintf(key, sizeof key, "/embps/%s/member/0/primary", cl);
  const char *v = "{\"addr\":\"127.0.0.1:1\",\"epoch\":\"0\",\"lsn\":\"0\"}";
  assert_int_equal(embps_etcd_put(*e, key, strlen(key), v, strlen(v), lease,
                                  NULL),
                   0);
  return lease;
}

/* Waits until n servers of cl are registered: 0, or -1. */
static int wait_registered(embps_etcd_t *e, const char *cl, size_t n) {
  char key[64];
  snprintf(key, sizeof key, "/embps/%s/member/0/servers/", cl);
  const double end = it_now_ms() + 20000;
  while (it_now_ms() < end) {
    embps_etcd_kvs_t kvs;
    if (!embps_etcd_range(e, key, strlen(key), 1, &kvs)) {
      size_t have = kvs.n;
      embps_etcd_kvs_free(&kvs);
      if (have >= n)
        return 0;
    }
    it_sleep_ms(20);
  }
  return -1;
}

/* The candidate with the highest LSN wins; the others follow it. The
 * vacancy comes once all three are registered (a server that has not
 * registered yet is not waited for: on a loaded machine, starting a
 * process can take longer than a round). */
static void test_highest_lsn_wins(void **state) {
  (void)state;
  char cl[16];
  next_cluster(cl, sizeof cl);
  probe_t p[3];
  const uint64_t lsn[3] = {10, 30, 20};
  const char *addr[3] = {"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"};
  embps_etcd_t *held;
  const int64_t lease = hold_slot(cl, &held);
  for (int i = 0; i < 3; i++)
    probe_start(&p[i], cl, addr[i], lsn[i], 1);
  assert_int_equal(wait_registered(held, cl, 3), 0);
  assert_int_equal(embps_etcd_lease_revoke(held, lease), 0);
  embps_etcd_destroy(held);
  assert_int_equal(wait_promoted(p, 3, 1, 10000, NULL), 1);
  for (int i = 0; i < 3; i += 2) {
    assert_int_equal(probe_wait(&p[i], "FOLLOW 127.0.0.1:7002 1 0", 1, 5000), 0);
    assert_int_equal(probe_count(&p[i], "PROMOTE"), 0);
  }
  assert_int_equal(probe_wait(&p[1], "OK ", 1, 5000), 0);
  /* P/epoch says 1, P/primary names the winner */
  embps_etcd_t *e;
  char err[256];
  assert_int_equal(embps_etcd_create(url, 2000, &e, err, sizeof err), 0);
  char key[64];
  snprintf(key, sizeof key, "/embps/%s/member/0/epoch", cl);
  embps_etcd_kvs_t kvs;
  assert_int_equal(embps_etcd_range(e, key, strlen(key), 0, &kvs), 0);
  assert_int_equal(kvs.n, 1);
  assert_string_equal(kvs.v[0].value, "1");
  embps_etcd_kvs_free(&kvs);
  snprintf(key, sizeof key, "/embps/%s/member/0/primary", cl);
  assert_int_equal(embps_etcd_range(e, key, strlen(key), 0, &kvs), 0);
  assert_int_equal(kvs.n, 1);
  assert_non_null(strstr(kvs.v[0].value, "\"addr\":\"127.0.0.1:7002\""));
  embps_etcd_kvs_free(&kvs);
  embps_etcd_destroy(e);
  for (int i = 0; i < 3; i++)
    probe_kill(&p[i], SIGTERM);
}

/* No one eligible: no primary; one becoming eligible wins a later round. */
static void test_ineligible_never_campaign(void **state) {
  (void)state;
  char cl[16];
  next_cluster(cl, sizeof cl);
  probe_t p[2];
  probe_start(&p[0], cl, "127.0.0.1:7011", 50, 0);
  probe_start(&p[1], cl, "127.0.0.1:7012", 40, 0);
  it_sleep_ms(3 * LEASE_MS / 2);
  assert_int_equal(promoted(p, 2, 1, NULL), -1);
  /* p[1] catches up and may campaign: its next round makes it primary
     although p[0] posted a higher LSN (p[0] is not eligible) */
  FILE *f = fopen(p[1].ctl, "w");
  fprintf(f, "60 1 0\n");
  fclose(f);
  assert_int_equal(wait_promoted(p, 2, 1, 4 * LEASE_MS + 3000, NULL), 1);
  assert_int_equal(probe_wait(&p[0], "FOLLOW 127.0.0.1:7012 1 0", 1, 5000), 0);
  for (int i = 0; i < 2; i++)
    probe_kill(&p[i], SIGTERM);
}

/* kill -9 of the primary: the follower takes over within lease + 2 s; the
 * killed one restarts and follows; epochs grow by one per failover. */
static void test_kill_failover_cycles(void **state) {
  (void)state;
  char cl[16];
  next_cluster(cl, sizeof cl);
  probe_t p[2];
  const char *addr[2] = {"127.0.0.1:7021", "127.0.0.1:7022"};
  probe_start(&p[0], cl, addr[0], 7, 1);
  probe_start(&p[1], cl, addr[1], 7, 1);
  int holder = wait_promoted(p, 2, 1, 10000, NULL);
  assert_true(holder >= 0);
  double worst = 0;
  for (uint32_t epoch = 2; epoch <= 4; epoch++) {
    const int other = 1 - holder;
    char want[64];
    snprintf(want, sizeof want, "FOLLOW %s %u", addr[holder], epoch - 1);
    assert_int_equal(probe_wait(&p[other], want, 1, 5000), 0);
    /* the other's state says it may campaign when the key is free */
    FILE *f = fopen(p[other].ctl, "w");
    fprintf(f, "%u 1 %u\n", 100 * epoch, epoch - 1);
    fclose(f);
    const uint64_t killed = embps_now_ns();
    probe_kill(&p[holder], SIGKILL);
    uint64_t at;
    assert_int_equal(wait_promoted(p, 2, epoch, LEASE_MS + 5000, &at), other);
    const double ms = (double)(at - killed) / 1e6;
    fprintf(stderr, "epoch %u: promoted %.0f ms after the kill\n", epoch, ms);
    assert_true(ms <= LEASE_MS + 2000);
    if (ms > worst)
      worst = ms;
    /* the killed one comes back (behind, not eligible) and follows */
    f = fopen(p[holder].ctl, "w");
    fprintf(f, "%u 0 %u\n", 100 * epoch - 1, epoch - 1);
    fclose(f);
    probe_start(&p[holder], cl, addr[holder], 0, 0);
    snprintf(want, sizeof want, "FOLLOW %s %u 0", addr[other], epoch);
    assert_int_equal(probe_wait(&p[holder], want, 1, 5000), 0);
    holder = other;
  }
  fprintf(stderr, "worst failover: %.0f ms (lease %d ms)\n", worst, LEASE_MS);
  for (int i = 0; i < 2; i++)
    probe_kill(&p[i], SIGTERM);
}

/* A primary frozen for 2 leases: nothing allowed once it runs again. */
static void test_fence_sigstop(void **state) {
  (void)state;
  char cl[16];
  next_cluster(cl, sizeof cl);
  probe_t p[2];
  const char *addr[2] = {"127.0.0.1:7031", "127.0.0.1:7032"};
  probe_start(&p[0], cl, addr[0], 9, 1);
  assert_int_equal(wait_promoted(p, 1, 1, 10000, NULL), 0);
  probe_start(&p[1], cl, addr[1], 9, 1);
  assert_int_equal(probe_wait(&p[1], "FOLLOW 127.0.0.1:7031 1 0", 1, 5000), 0);
  assert_int_equal(probe_wait(&p[0], "OK ", 1, 5000), 0);
  it_sleep_ms(300);
  kill(p[0].pid, SIGSTOP);
  int st;
  waitpid(p[0].pid, &st, WUNTRACED); /* stopped for sure */
  const uint64_t stopped = embps_now_ns();
  uint64_t promoted_at;
  assert_int_equal(wait_promoted(p, 2, 2, 2 * LEASE_MS + 3000, &promoted_at), 1);
  const double wait_ms = 2.0 * LEASE_MS - (double)(embps_now_ns() - stopped) / 1e6;
  if (wait_ms > 0)
    it_sleep_ms(wait_ms);
  const uint64_t resumed = embps_now_ns();
  kill(p[0].pid, SIGCONT);
  assert_int_equal(probe_wait(&p[0], "FOLLOW 127.0.0.1:7032 2 1", 1, 5000), 0);
  it_sleep_ms(200);
  const uint64_t ok = last_ok(&p[0]);
  fprintf(stderr, "frozen primary: last write allowed %.0f ms before the "
          "stop, new primary %.0f ms after it\n",
          (double)((int64_t)stopped - (int64_t)ok) / 1e6,
          (double)(promoted_at - stopped) / 1e6);
  assert_true(ok > 0);
  assert_true(ok < promoted_at);
  assert_true(ok < resumed);
  assert_int_equal(probe_count(&p[0], "PROMOTE"), 1);
  for (int i = 0; i < 2; i++)
    probe_kill(&p[i], SIGTERM);
}

/* A clean stop gives the lease back: takeover without waiting for it. */
static void test_resign(void **state) {
  (void)state;
  char cl[16];
  next_cluster(cl, sizeof cl);
  probe_t p[2];
  probe_start(&p[0], cl, "127.0.0.1:7041", 3, 1);
  assert_int_equal(wait_promoted(p, 1, 1, 10000, NULL), 0);
  probe_start(&p[1], cl, "127.0.0.1:7042", 3, 1);
  assert_int_equal(probe_wait(&p[1], "FOLLOW 127.0.0.1:7041 1 0", 1, 5000), 0);
  const uint64_t t0 = embps_now_ns();
  probe_kill(&p[0], SIGTERM);
  uint64_t at;
  assert_int_equal(wait_promoted(p, 2, 2, LEASE_MS, &at), 1);
  fprintf(stderr, "resigned: successor promoted %.0f ms after the stop\n",
          (double)(at - t0) / 1e6);
  assert_true(at - t0 < (uint64_t)LEASE_MS * 1000000u);
  probe_kill(&p[1], SIGTERM);
}

/* The sole server of a slot killed and restarted on its address: it ends
 * its previous run's lease instead of waiting it out, and wins epoch 2. */
static void test_restart_own_address(void **state) {
  (void)state;
  char cl[16];
  next_cluster(cl, sizeof cl);
  probe_t p[1];
  probe_start(&p[0], cl, "127.0.0.1:7061", 5, 1);
  assert_int_equal(wait_promoted(p, 1, 1, 10000, NULL), 0);
  probe_kill(&p[0], SIGKILL);
  const uint64_t t0 = embps_now_ns();
  FILE *f = fopen(p[0].ctl, "w");
  fprintf(f, "5 1 1\n");
  fclose(f);
  probe_start(&p[0], cl, "127.0.0.1:7061", 5, 1);
  uint64_t at;
  assert_int_equal(wait_promoted(p, 1, 2, 2 * LEASE_MS, &at), 0);
  fprintf(stderr, "restarted on its address: primary again after %.0f ms\n",
          (double)(at - t0) / 1e6);
  assert_true(at - t0 < (uint64_t)LEASE_MS * 1000000u);
  probe_kill(&p[0], SIGTERM);
}

/* etcd down for 3 leases: the primary stops writing in time and no one
 * else is promoted; etcd back: one primary writes again. */
static void test_etcd_outage(void **state) {
  (void)state;
  char cl[16];
  next_cluster(cl, sizeof cl);
  probe_t p[2];
  probe_start(&p[0], cl, "127.0.0.1:7051", 4, 1);
  assert_int_equal(wait_promoted(p, 1, 1, 10000, NULL), 0);
  probe_start(&p[1], cl, "127.0.0.1:7052", 4, 1);
  assert_int_equal(probe_wait(&p[1], "FOLLOW 127.0.0.1:7051 1 0", 1, 5000), 0);
  it_sleep_ms(500);
  const uint64_t down = embps_now_ns();
  it_etcd_kill(&etcd);
  it_sleep_ms(3 * LEASE_MS);
  const uint64_t ok = last_ok(&p[0]);
  fprintf(stderr, "etcd down: last write allowed %.0f ms after it went\n",
          (double)((int64_t)ok - (int64_t)down) / 1e6);
  assert_true(ok < down + (uint64_t)LEASE_MS * 1000000u);
  assert_int_equal(promoted(p, 2, 2, NULL), -1);
  assert_int_equal(it_etcd_restart(&etcd, 1), 0);
  const uint64_t up = embps_now_ns();
  /* writes resume on exactly one primary */
  const double end = it_now_ms() + 5 * LEASE_MS;
  int writer = -1;
  while (writer < 0 && it_now_ms() < end) {
    for (int i = 0; i < 2; i++)
      if (last_ok(&p[i]) > up)
        writer = i;
    it_sleep_ms(20);
  }
  if (writer < 0)
    for (int i = 0; i < 2; i++)
      probe_dump(&p[i]);
  assert_true(writer >= 0);
  fprintf(stderr, "etcd back: writes again on %s after %.0f ms\n",
          p[writer].addr, (double)(last_ok(&p[writer]) - up) / 1e6);
  it_sleep_ms(LEASE_MS);
  assert_true(last_ok(&p[1 - writer]) < up);
  for (int i = 0; i < 2; i++)
    probe_kill(&p[i], SIGTERM);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "probe"))
    return probe_main(argc, argv);
  ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
  if (n <= 0)
    return 1;
  self_exe[n] = 0;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_refused),
      cmocka_unit_test(test_highest_lsn_wins),
      cmocka_unit_test(test_ineligible_never_campaign),
      cmocka_unit_test(test_kill_failover_cycles),
      cmocka_unit_test(test_fence_sigstop),
      cmocka_unit_test(test_resign),
      cmocka_unit_test(test_restart_own_address),
      cmocka_unit_test(test_etcd_outage),
  };
  return cmocka_run_group_tests_name("coord", tests, group_setup,
                                     group_teardown);
}
