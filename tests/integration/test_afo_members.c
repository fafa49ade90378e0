/* test_afo_members.c - a 3-member cluster with automatic failover (issue
 * 22) under a training-like load while its members fail one after
 * another: the workers must see pauses, never an error.
 *
 * Six embps-server processes, two per member (--cluster-size 3, each with
 * --coordinator against one real etcd on loopback, --sync-followers 1, a
 * data dir each). Worker processes train through the library as a job's
 * workers do, listing the cluster as "a0|a1,b0|b1,c0|c1" (the library
 * finds each member's primary): each step pulls a batch of rows (skewed
 * ids, so repeated ones), computes a gradient from the pulled values and
 * pushes it, the batch's repeated ids included. Every push also carries
 * the worker's witness rows, one on each member, each listed twice with
 * gradient -0.5 (SGD, lr 1, zeros): each applied push adds exactly 1 to
 * each. Since a worker's steps are sequential and each resolved before
 * the next, every pull must read its witness rows equal to its count of
 * acknowledged pushes, exactly: one lost push reads low, one applied
 * twice reads high, at once, on whichever primary answers.
 *
 * Failures, one at a time, each waited out (the member's other server
 * elected, every worker stepping again, the failed server back as the
 * new primary's follower in sync) before the next: kill -9 of member 0's
 * primary (the killed server started again: it rejoins as a follower),
 * then member 1's, then member 2's, then member 1's new primary frozen
 * (SIGSTOP) for two leases and resumed (it rejoins by itself).
 * EMBPS_LONG=1 runs that sequence three times with four workers.
 *
 * Checked: every library call of every worker returns 0; every pull reads
 * the witness rows equal to the acknowledged pushes; at the end each
 * witness row on its member's primary equals its worker's acknowledged
 * pushes, and every follower equals its primary row for row (repl_compare).
 * Reported for each failure: the time from the failure to every worker
 * stepping again, and the longest time each worker went between two
 * successful calls (its pause). A pause longer than two leases + 4 s
 * fails (a worker stuck in a per-attempt timeout, a client that never
 * finds the new primary). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dur_util.h"
#include "etcd_util.h"
#include "repl_util.h"
#include "route.h" /* embps_mix64 */
#include "wire.h" /* EMBPS_ROLE_* */

#define LEASE_MS 2000
#define LEASE_S "2000"
#define MEMBERS 3
#define MAX_WORKERS 8
#define DIM 8
#define ROWS 4096       /* table rows; training ids below TRAIN_IDS */
#define TRAIN_IDS 4000  /* witness ids in [TRAIN_IDS, ROWS) */
#define BATCH 64        /* training ids per step */
#define MAX_EVENTS 16

#ifdef EMBPS_TEST_SANITIZED
static const int sanitized = 1;
#else
static const int sanitized = 0;
#endif

/* A worker's counters, in memory shared with the parent. */
typedef struct {
  _Atomic uint64_t steps;      /* acknowledged pushes */
  _Atomic uint64_t calls;      /* library calls that returned 0 */
  _Atomic int64_t last_ok_us;  /* when the latest of them returned */
  _Atomic int64_t max_gap_us;  /* longest time between two, since reset */
  _Atomic int failed;
  char error[512];
} mw_worker_t;

typedef struct {
  _Atomic int stop;
  mw_worker_t w[MAX_WORKERS];
} mw_shared_t;

typedef struct {
  int n_workers;
  int64_t wit[MAX_WORKERS][MEMBERS]; /* witness id of worker w on member m */
  char servers[512];                 /* "a0|a1,b0|b1,c0|c1" */
} mw_job_t;

static char etcd_url[256];
static it_etcd_t etcd;

static int64_t now_us(void) { return (int64_t)(dur_now_ms() * 1000.0); }

/* Witness ids: the first free ids from TRAIN_IDS that route to each
 * member (the library's own route), one per worker and member. */
static int pick_witness_ids(mw_job_t *job) {
  int next[MEMBERS] = {0};
  for (int64_t id = TRAIN_IDS; id < ROWS; id++) {
    uint32_t m = embps_route(id, MEMBERS);
    if (next[m] < job->n_workers)
      job->wit[next[m]++][m] = id;
  }
  for (int m = 0; m < MEMBERS; m++)
    if (next[m] < job->n_workers)
      return -1;
  return 0;
}

/* -------------------------------------------------------------- workers */

static void note_ok(mw_worker_t *ws) {
  const int64_t t = now_us(), prev = atomic_exchange(&ws->last_ok_us, t);
  int64_t gap = t - prev, cur = atomic_load(&ws->max_gap_us);
  while (gap > cur && !atomic_compare_exchange_weak(&ws->max_gap_us, &cur, gap))
    ;
  atomic_fetch_add(&ws->calls, 1);
}

static _Noreturn void worker_fail(mw_worker_t *ws, uint64_t step,
                                  const char *fmt, const char *detail) {
  snprintf(ws->error, sizeof ws->error, fmt, (unsigned long long)step, detail);
  atomic_store(&ws->failed, 1);
  _exit(1);
}

/* A feature of (id, element) in [-0.005, 0.005): the data the gradient
 * pulls the rows towards. */
static float feature(int64_t id, int e) {
  uint64_t h = embps_mix64((uint64_t)id * 8 + (uint64_t)e);
  return (float)(h % 1000) / 100000.0f - 0.005f;
}

static _Noreturn void worker_main(mw_shared_t *sh, const mw_job_t *job,
                                  int w, uint64_t seed) {
  mw_worker_t *ws = &sh->w[w];
  /* per attempt 5 s (a frozen primary's requests time out and go to the
     member's other server); retried for a minute */
  embps_client_t *c = dur_connect(job->servers, 5000, 60000, NULL);
  if (!c)
    worker_fail(ws, 0, "worker step %llu: cannot connect to %s", job->servers);
  atomic_store(&ws->last_ok_us, now_us());
  uint64_t rng = seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(w + 1));
  enum { NPULL = BATCH + MEMBERS, NPUSH = BATCH + 2 * MEMBERS };
  int64_t pull_ids[NPULL], push_ids[NPUSH];
  static float rows[NPULL * DIM], grad[NPUSH * DIM];
  for (uint64_t step = 0; !atomic_load(&sh->stop); step++) {
    /* the batch: a quarter of it from 32 hot ids, repeats included */
    for (int i = 0; i < BATCH; i++) {
      uint64_t r = rng_next(&rng);
      pull_ids[i] = (r & 3) == 0 ? (int64_t)((r >> 8) % 32)
                                 : (int64_t)((r >> 8) % TRAIN_IDS);
    }
    for (int m = 0; m < MEMBERS; m++)
      pull_ids[BATCH + m] = job->wit[w][m];
    int rc = embps_pull(c, "emb", pull_ids, NPULL, rows, DIM);
    if (rc)
      worker_fail(ws, step, "worker step %llu: pull: %s",
                  embps_client_last_error(c));
    note_ok(ws);
    /* read-your-writes across failovers: each witness row has every
       acknowledged push of this worker, once */
    const uint64_t acked = atomic_load(&ws->steps);
    for (int m = 0; m < MEMBERS; m++) {
      const float got = rows[(BATCH + m) * DIM];
      if (got != (float)acked) {
        char d[160];
        snprintf(d, sizeof d, "member %d's witness row reads %.0f after %llu "
                 "acknowledged pushes (%s)", m, (double)got,
                 (unsigned long long)acked,
                 got < (float)acked ? "lost" : "doubled");
        worker_fail(ws, step, "worker step %llu: %s", d);
      }
    }
    /* the gradient: pulls each row towards its feature (lr 1) */
    for (int i = 0; i < BATCH; i++) {
      push_ids[i] = pull_ids[i];
      for (int e = 0; e < DIM; e++)
        grad[i * DIM + e] =
            0.01f * rows[i * DIM + e] - feature(pull_ids[i], e);
    }
    for (int m = 0; m < MEMBERS; m++)
      for (int k = 0; k < 2; k++) {
        push_ids[BATCH + 2 * m + k] = job->wit[w][m];
        for (int e = 0; e < DIM; e++)
          grad[(BATCH + 2 * m + k) * DIM + e] = -0.5f;
      }
    rc = embps_push(c, "emb", push_ids, NPUSH, grad, DIM, 0);
    if (rc)
      worker_fail(ws, step, "worker step %llu: push: %s",
                  embps_client_last_error(c));
    atomic_fetch_add(&ws->steps, 1);
    note_ok(ws);
  }
  embps_client_destroy(c);
  _exit(0);
}

static pid_t worker_spawn(mw_shared_t *sh, const mw_job_t *job, int w,
                          uint64_t seed) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    worker_main(sh, job, w, seed);
  }
  return pid;
}

/* Every worker's acknowledged pushes above base[w], or a failed worker. */
static int all_stepped(mw_shared_t *sh, int n, const uint64_t *base) {
  for (int w = 0; w < n; w++)
    if (atomic_load(&sh->w[w].steps) <= base[w] && !atomic_load(&sh->w[w].failed))
      return 0;
  return 1;
}

static int workers_failed(mw_shared_t *sh, int n) {
  int bad = 0;
  for (int w = 0; w < n; w++)
    if (atomic_load(&sh->w[w].failed)) {
      dur_fail("worker %d: %s", w, sh->w[w].error);
      atomic_store(&sh->w[w].failed, 2); /* reported */
      bad++;
    }
  return bad;
}

/* -------------------------------------------------------------- servers */

/* A coordinated server of member m. */
static int start(dur_server_t *s, int m) {
  static const char *index[MEMBERS] = {"0", "1", "2"};
  int i = 0;
  s->args[i++] = "--coordinator";
  s->args[i++] = etcd_url;
  s->args[i++] = "--cluster-name";
  s->args[i++] = "members";
  s->args[i++] = "--cluster-size";
  s->args[i++] = "3";
  s->args[i++] = "--cluster-index";
  s->args[i++] = index[m];
  s->args[i++] = "--lease-ms";
  s->args[i++] = LEASE_S;
  s->args[i++] = "--sync-followers";
  s->args[i++] = "1";
  s->args[i++] = "--sync-timeout-ms";
  s->args[i++] = "20000";
  s->args[i] = NULL;
  int rc = dur_server_start(s, 30000);
  if (rc) {
    dur_fail("member %d: %s did not start (%d)", m, s->addr, rc);
    dur_server_dump_log(s);
  }
  return rc;
}

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

/* ------------------------------------------------------------- failures */

typedef struct {
  int member;
  int freeze;      /* SIGSTOP for two leases, else kill -9 and restart */
  double elected;  /* ms from the failure to the other's promotion */
  double resumed;  /* ms from the failure to every worker stepping again */
  double pause[MAX_WORKERS]; /* each worker's longest gap, ms */
} mw_event_t;

/* One failure of member m's primary s[m][p[m]], waited out. 0 or -1. */
static int fail_member(dur_server_t s[MEMBERS][2], int p[MEMBERS],
                       mw_shared_t *sh, int n, mw_event_t *ev) {
  const int m = ev->member, old = p[m], f = 1 - old;
  for (int w = 0; w < n; w++)
    atomic_store(&sh->w[w].max_gap_us, 0);
  uint64_t base[MAX_WORKERS];
  const double t0 = dur_now_ms();
  if (ev->freeze) {
    kill(s[m][old].pid, SIGSTOP);
    int st;
    waitpid(s[m][old].pid, &st, WUNTRACED);
  } else {
    dur_server_kill(&s[m][old]);
  }
  if (wait_primary(s[m][f].addr, 2 * LEASE_MS + 10000)) {
    dur_fail("member %d: %s was not elected", m, s[m][f].addr);
    dur_server_dump_log(&s[m][f]);
    return -1;
  }
  ev->elected = dur_now_ms() - t0;
  p[m] = f;
  /* a push acknowledged from here on went through the new primary */
  for (int w = 0; w < n; w++)
    base[w] = atomic_load(&sh->w[w].steps);
  if (ev->freeze) {
    double left = 2.0 * LEASE_MS - (dur_now_ms() - t0);
    if (left > 0)
      dur_sleep_ms(left);
    kill(s[m][old].pid, SIGCONT); /* it rejoins by itself */
  } else if (start(&s[m][old], m)) {
    return -1;
  }
  const double end = dur_now_ms() + 60000;
  while (!all_stepped(sh, n, base) && dur_now_ms() < end)
    dur_sleep_ms(2);
  if (workers_failed(sh, n))
    return -1;
  if (!all_stepped(sh, n, base)) {
    dur_fail("member %d: the workers did not step again within 60 s", m);
    return -1;
  }
  ev->resumed = dur_now_ms() - t0;
  if (repl_wait_in_sync(s[m][f].addr, 1, 60000)) {
    dur_fail("member %d: %s did not rejoin %s", m, s[m][old].addr,
             s[m][f].addr);
    dur_server_dump_log(&s[m][old]);
    return -1;
  }
  dur_sleep_ms(500); /* steady steps again: the pause is over */
  for (int w = 0; w < n; w++) {
    ev->pause[w] = (double)atomic_load(&sh->w[w].max_gap_us) / 1000.0;
    if (ev->pause[w] > 2 * LEASE_MS + 4000 && !sanitized)
      dur_fail("member %d %s: worker %d paused %.0f ms, more than two "
               "leases + 4 s", m, ev->freeze ? "frozen" : "killed", w,
               ev->pause[w]);
  }
  return workers_failed(sh, n) ? -1 : 0;
}

/* ------------------------------------------------------------- the end */

/* Each witness row on its member's primary equals its worker's
 * acknowledged pushes; each follower equals its primary. */
static void final_checks(dur_server_t s[MEMBERS][2], const int p[MEMBERS],
                         mw_shared_t *sh, const mw_job_t *job) {
  embps_client_t *c = dur_connect(job->servers, 10000, 30000, "final check");
  for (int w = 0; c && w < job->n_workers; w++) {
    float rows[MEMBERS * DIM];
    if (embps_pull(c, "emb", job->wit[w], MEMBERS, rows, DIM)) {
      dur_fail("final pull: %s", embps_client_last_error(c));
      break;
    }
    const uint64_t acked = atomic_load(&sh->w[w].steps);
    for (int m = 0; m < MEMBERS; m++)
      for (int e = 0; e < DIM; e++)
        if (rows[m * DIM + e] != (float)acked) {
          dur_fail("worker %d: member %d's witness row element %d is %.0f, "
                   "%llu pushes acknowledged (%s)", w, m, e,
                   (double)rows[m * DIM + e], (unsigned long long)acked,
                   rows[m * DIM + e] < (float)acked ? "lost" : "doubled");
          break;
        }
  }
  embps_client_destroy(c);
  for (int m = 0; m < MEMBERS; m++) {
    const char *pa = s[m][p[m]].addr, *fa = s[m][1 - p[m]].addr;
    char what[64];
    snprintf(what, sizeof what, "member %d's follower at the end", m);
    if (repl_wait_caught_up(pa, fa, 60000) || repl_compare(pa, fa, what, 0))
      dur_fail("member %d: %s is not %s's copy at the end", m, fa, pa);
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void report(const mw_event_t *ev, int n_ev, int n) {
  double resumed[MAX_EVENTS], pauses[MAX_EVENTS * MAX_WORKERS];
  int np = 0;
  for (int i = 0; i < n_ev; i++) {
    char line[256];
    int len = snprintf(line, sizeof line, "%s member %d: elected %.0f ms, "
                       "every worker stepping %.0f ms after; pauses",
                       ev[i].freeze ? "SIGSTOP" : "kill -9", ev[i].member,
                       ev[i].elected, ev[i].resumed);
    for (int w = 0; w < n && len < (int)sizeof line; w++) {
      len += snprintf(line + len, sizeof line - (size_t)len, " %.0f",
                      ev[i].pause[w]);
      pauses[np++] = ev[i].pause[w];
    }
    dur_note("%s ms", line);
    resumed[i] = ev[i].resumed;
  }
  if (!n_ev)
    return;
  qsort(resumed, (size_t)n_ev, sizeof *resumed, cmp_double);
  qsort(pauses, (size_t)np, sizeof *pauses, cmp_double);
  printf("[afo-members] %d failures, lease %d ms: failure to every worker "
         "stepping median %.0f ms, worst %.0f ms; a worker's pause median "
         "%.0f ms, worst %.0f ms\n", n_ev, LEASE_MS, resumed[n_ev / 2],
         resumed[n_ev - 1], pauses[np / 2], pauses[np - 1]);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const int rounds = dur_long() ? 3 : 1;
  mw_job_t job = {.n_workers = dur_long() ? 4 : 3};
  if (pick_witness_ids(&job)) {
    fprintf(stderr, "no witness ids for every member\n");
    return 1;
  }
  const uint64_t seed = dur_seed();
  if (it_etcd_start(&etcd, 1, etcd_url, sizeof etcd_url))
    return 1;
  dur_server_t s[MEMBERS][2];
  char dirs[MEMBERS][2][256];
  int p[MEMBERS] = {0, 0, 0};
  for (int m = 0; m < MEMBERS; m++)
    for (int i = 0; i < 2; i++) {
      dur_mkdtemp(dirs[m][i], sizeof dirs[m][i], i ? "afm-b" : "afm-a");
      dur_server_init(&s[m][i], dirs[m][i]);
    }
  /* server 0 of each member first: it is elected; then its follower */
  int rc = 0;
  for (int m = 0; m < MEMBERS && !rc; m++)
    if ((rc = start(&s[m][0], m)) || (rc = wait_primary(s[m][0].addr, 20000)))
      dur_fail("member %d: %s was not elected", m, s[m][0].addr);
  for (int m = 0; m < MEMBERS && !rc; m++)
    if ((rc = start(&s[m][1], m)) ||
        (rc = repl_wait_in_sync(s[m][0].addr, 1, 20000)))
      dur_fail("member %d: %s did not follow", m, s[m][1].addr);
  int len = 0;
  for (int m = 0; m < MEMBERS; m++)
    len += snprintf(job.servers + len, sizeof job.servers - (size_t)len,
                    "%s%s|%s", m ? "," : "", s[m][1].addr, s[m][0].addr);
  mw_shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  pid_t pids[MAX_WORKERS] = {0};
  mw_event_t ev[MAX_EVENTS];
  int n_ev = 0;
  double t_start = 0;
  if (!rc) {
    embps_client_t *c = dur_connect(job.servers, 20000, 30000, "setup");
    embps_table_spec_t spec;
    embps_table_spec_init(&spec, "emb", DIM, EMBPS_OPT_SGD);
    spec.lr = 1.0;
    spec.rows = ROWS;
    if (c && embps_create_table(c, &spec)) {
      dur_fail("create emb: %s", embps_client_last_error(c));
      rc = -1;
    }
    embps_client_destroy(c);
    rc = rc || !c;
  }
  if (!rc) {
    t_start = dur_now_ms();
    for (int w = 0; w < job.n_workers; w++)
      pids[w] = worker_spawn(sh, &job, w, seed);
    uint64_t zero[MAX_WORKERS] = {0};
    const double end = dur_now_ms() + 30000;
    while (!all_stepped(sh, job.n_workers, zero) && dur_now_ms() < end)
      dur_sleep_ms(10);
    dur_sleep_ms(1000); /* training going */
    static const int plan[][2] = {{0, 0}, {1, 0}, {2, 0}, {1, 1}};
    for (int r = 0; r < rounds && !dur_failures(); r++)
      for (int i = 0; i < 4 && !dur_failures(); i++) {
        ev[n_ev] = (mw_event_t){.member = plan[i][0], .freeze = plan[i][1]};
        if (fail_member(s, p, sh, job.n_workers, &ev[n_ev]) == 0)
          n_ev++;
      }
  }
  atomic_store(&sh->stop, 1);
  uint64_t steps = 0;
  for (int w = 0; w < job.n_workers; w++) {
    int code = -1, exited = pids[w] > 0 ? it_wait_exit(pids[w], 60000, &code)
                                        : 1;
    if (exited == 0) {
      kill(pids[w], SIGKILL);
      it_wait_exit(pids[w], 10000, &code);
      dur_fail("worker %d did not finish within 60 s", w);
    } else if (pids[w] > 0 && code && atomic_load(&sh->w[w].failed) != 2) {
      dur_fail("worker %d: %s", w, sh->w[w].error[0] ? sh->w[w].error
                                                   : "exited with an error");
    }
    steps += atomic_load(&sh->w[w].steps);
  }
  const double took = dur_now_ms() - t_start;
  report(ev, n_ev, job.n_workers);
  if (!rc && !dur_failures())
    final_checks(s, p, sh, &job);
  int bad = dur_failures() || rc;
  if (!bad)
    printf("[afo-members] %d workers, %llu steps in %.1f s (%.0f pushes/s) "
           "across %d failures: no call failed, 0 acknowledged pushes lost, "
           "0 doubled, every follower equal to its primary\n",
           job.n_workers, (unsigned long long)steps, took / 1000.0,
           (double)steps * 1000.0 / took, n_ev);
  for (int m = 0; m < MEMBERS; m++)
    for (int i = 0; i < 2; i++) {
      if (bad)
        dur_server_dump_log(&s[m][i]);
      if (s[m][i].pid)
        kill(s[m][i].pid, SIGCONT);
      dur_server_term(&s[m][i], 30000);
      dur_server_cleanup(&s[m][i]);
      if (!bad)
        dur_rm_rf(dirs[m][i]);
    }
  if (bad)
    it_etcd_dump_log(&etcd);
  it_etcd_destroy(&etcd, 1);
  munmap(sh, sizeof *sh);
  return bad ? 1 : 0;
}
