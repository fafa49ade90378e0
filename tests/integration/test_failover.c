/* test_failover.c - kill -9 of the primary under a push storm, then
 * `embps promote` of its follower (issue 21), cycle after cycle, the two
 * servers taking turns: both run with --sync-followers 1 and a data dir,
 * the workers (the durability tests' exactly checkable workload: SGD
 * witness rows counting applied pushes, Adagrad rows replayed bit for
 * bit) push through a proxy that is pointed at the new primary after each
 * promotion, and each old primary comes back with --follow NEW on its own
 * data dir, cutting the records it held that were never acknowledged.
 *
 * Every other cycle the follower is frozen (SIGSTOP) until the primary
 * has made a record after that, so the primary dies holding records its
 * follower may lack; when it rejoins, what it held past the promotion
 * (its last LSN known, the new epoch's first LSN from `embps promote`) is
 * cut, starting at the new epoch's first LSN, and counted in its log.
 *
 * After every promotion, with the workers frozen, every witness row lies
 * in [acknowledged, acknowledged + in flight] on the new primary (nothing
 * acknowledged lost, nothing doubled); at the end, once every push
 * resolved, witness == acknowledged exactly, the Adagrad rows equal a
 * replay of the acknowledged pushes bit for bit, and the follower equals
 * the primary table for table. The library's exactly-once retries (same
 * client id and seq) carry each push across the promotion.
 *
 *   test_failover [cycles]   (default 20, 8 under sanitizers; EMBPS_LONG=1:
 *                            100) */
#define _GNU_SOURCE
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dur_util.h"
#include "proxy.h"
#include "repl_util.h"

#define SYNC_TIMEOUT "20000"
#define JOIN_MS 60000

/* Starts s as a primary, or as the follower of `follow` (NULL: none). */
static int start(dur_server_t *s, const char *follow) {
  int i = 0;
  s->args[i++] = "--sync-followers";
  s->args[i++] = "1";
  s->args[i++] = "--sync-timeout-ms";
  s->args[i++] = SYNC_TIMEOUT;
  s->args[i++] = "--shards";
  s->args[i++] = "4";
  if (follow) {
    s->args[i++] = "--follow";
    s->args[i++] = follow;
  }
  s->args[i] = NULL;
  int rc = dur_server_start(s, 30000);
  if (rc) {
    dur_fail("%s did not start (%d)", follow ? "follower" : "primary", rc);
    dur_server_dump_log(s);
  }
  return rc;
}

/* "cut N records (LSN A to B)" in s's log: N, and A in *first (0 when
 * nothing was cut). */
static unsigned long long cut_range(const dur_server_t *s,
                                    unsigned long long *first) {
  char *log = dur_server_log(s);
  const char *at = log ? strstr(log, "cut ") : NULL;
  unsigned long long n = 0;
  *first = 0;
  if (at && sscanf(at, "cut %llu records (LSN %llu", &n, first) != 2)
    n = *first = 0;
  free(log);
  return n;
}

/* embps promote of addr: 0 with *from, the first LSN of its new epoch
 * ("epoch E from LSN A"), or -1. */
static int promote(const char *addr, unsigned long long *from) {
  const char *args[] = {"promote", NULL};
  char *out = NULL, *err = NULL;
  int rc = dur_cli(addr, args, &out, &err);
  const char *at = out ? strstr(out, "from LSN ") : NULL;
  if (rc || !at || sscanf(at, "from LSN %llu", from) != 1) {
    dur_fail("embps promote of %s: %s%s", addr, out ? out : "",
             err ? err : "?");
    rc = -1;
  }
  free(out);
  free(err);
  return rc;
}

/* The follower frozen (SIGSTOP) and a record made on the primary after
 * that (applied, waiting for its acknowledgement; the follower may still
 * get it, in the reply to a FETCH it sent before). *last = the primary's
 * last LSN then (0: none came within 3 s: the workers were blocked). */
static void make_tail(const dur_server_t *p, const dur_server_t *f,
                      uint64_t *last) {
  kill(f->pid, SIGSTOP);
  embps_server_stats_t st;
  *last = 0;
  if (repl_stats(p->addr, &st))
    return;
  const uint64_t froze = st.applied_lsn;
  for (double until = dur_now_ms() + 3000; dur_now_ms() < until;
       dur_sleep_ms(2)) {
    if (!repl_stats(p->addr, &st) && st.applied_lsn > froze) {
      *last = st.applied_lsn;
      return;
    }
  }
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
#ifdef EMBPS_TEST_SANITIZED /* memory errors and races: 8 cycles do */
  int cycles = argc > 1 ? atoi(argv[1]) : dur_long() ? 100 : 8;
#else
  int cycles = argc > 1 ? atoi(argv[1]) : dur_long() ? 100 : 20;
#endif
  uint64_t seed = dur_seed(), rng = seed;
  dur_workload_t wl = {.n_workers = 4, .rows_per_worker = 16, .seed = seed};
  char da[256], db[256];
  dur_mkdtemp(da, sizeof da, "fo-a");
  dur_mkdtemp(db, sizeof db, "fo-b");
  dur_server_t s[2];
  dur_server_init(&s[0], da);
  dur_server_init(&s[1], db);
  if (start(&s[0], NULL))
    return 1;
  char follow[2][64];
  snprintf(follow[0], sizeof follow[0], "%s", s[0].addr);
  if (start(&s[1], follow[0]))
    return 1;
  snprintf(follow[1], sizeof follow[1], "%s", s[1].addr);
  if (repl_wait_in_sync(s[0].addr, 1, 20000))
    return 1;
  it_proxy_t *x;
  if (it_proxy_start(&x, s[0].addr))
    return 1;
  embps_client_t *c = dur_connect(it_proxy_addr(x), 20000, 30000, "setup");
  if (!c || dur_create_tables(c, &wl))
    return 1;
  embps_client_destroy(c);
  dur_shared_t *sh = dur_shared_new();
  pid_t pids[DUR_MAX_WORKERS] = {0};
  for (int w = 0; w < wl.n_workers; w++)
    pids[w] = dur_worker_spawn(sh, &wl, w, it_proxy_addr(x), NULL, 120000);

  int p = 0; /* the primary: s[p] */
  unsigned long long cut = 0;
  int cycle, tails = 0;
  for (cycle = 0; cycle < cycles && !dur_failures(); cycle++) {
    dur_sleep_ms(150 + (double)(rng_next(&rng) % 450));
    const int f = 1 - p;
    /* every other cycle, records made on the primary while its follower
     * is frozen: the primary dies holding up to at least LSN last */
    uint64_t last = 0;
    if (cycle % 2)
      make_tail(&s[p], &s[f], &last);
    dur_server_kill(&s[p]);
    if (cycle % 2)
      kill(s[f].pid, SIGCONT);
    unsigned long long from;
    if (promote(s[f].addr, &from))
      break;
    it_proxy_set_upstream(x, s[f].addr);
    it_proxy_cut(x); /* the workers retry on the new primary */
    dur_workers_stop(pids, wl.n_workers);
    char when[64];
    snprintf(when, sizeof when, "cycle %d (after the promotion)", cycle);
    embps_client_t *chk = dur_connect(s[f].addr, 10000, -1, when);
    if (chk)
      dur_check_witness(chk, &wl, sh, when, 0, 1);
    embps_client_destroy(chk);
    dur_workers_alive(pids, wl.n_workers, sh);
    dur_workers_cont(pids, wl.n_workers);
    /* the old primary comes back as the new one's follower */
    if (start(&s[p], follow[f]))
      break;
    /* what it held past the promotion is cut, from there */
    unsigned long long first, n = cut_range(&s[p], &first);
    if (n && first != from)
      dur_fail("cycle %d: %s cut its log from LSN %llu, the new primary's "
               "epoch begins at LSN %llu", cycle, s[p].addr, first, from);
    if (last >= from && n < last - from + 1)
      dur_fail("cycle %d: %s held up to LSN %llu at least, the new "
               "primary's epoch begins at LSN %llu: %llu records cut", cycle,
               s[p].addr, (unsigned long long)last, from, n);
    tails += last >= from;
    cut += n;
    if (repl_wait_in_sync(s[f].addr, 1, JOIN_MS)) {
      dur_fail("cycle %d: %s did not rejoin", cycle, s[p].addr);
      dur_server_dump_log(&s[p]);
      break;
    }
    p = f;
  }
  uint64_t total = 0;
  for (int w = 0; w < wl.n_workers; w++)
    total += atomic_load(&sh->w[w].acked_wit);
  dur_note("%d promotions, %llu witness pushes acknowledged, %llu records "
           "cut from rejoining old primaries (%d known to hold a tail)",
           cycle, (unsigned long long)total, cut, tails);
  if (cycle < cycles)
    dur_fail("stopped after %d of %d cycles", cycle, cycles);
  dur_sleep_ms(200);
  dur_workers_finish(sh, pids, wl.n_workers, 120000, 1);

  /* The end: exact on the primary, bit for bit with a replay, and the
   * follower equal to it. */
  embps_client_t *chk = dur_connect(s[p].addr, 10000, -1, "final check");
  uint64_t counts[DUR_MAX_WORKERS];
  for (int w = 0; w < wl.n_workers; w++)
    counts[w] = atomic_load(&sh->w[w].acked_ada);
  if (chk) {
    dur_check_witness(chk, &wl, sh, "end (workers finished)", 1, 1);
    float *got = dur_pull_ada(chk, &wl), *replay = dur_replay_ada(&wl, counts);
    if (got && replay)
      dur_compare_ada(&wl, replay, got, "end of the failover loop");
    free(got);
    free(replay);
    embps_client_destroy(chk);
  }
  if (repl_wait_caught_up(s[p].addr, s[1 - p].addr, 60000) ||
      repl_compare(s[p].addr, s[1 - p].addr, "follower at the end", 0))
    dur_fail("the follower is not the primary's copy at the end");
  int bad = dur_failures();
  if (!bad)
    printf("[failover] 0 acknowledged pushes lost, 0 doubled\n");
  for (int i = 0; i < 2; i++) {
    if (bad)
      dur_server_dump_log(&s[i]);
    dur_server_term(&s[i], 30000);
    dur_server_cleanup(&s[i]);
  }
  it_proxy_stop(x);
  if (!bad) {
    dur_rm_rf(da);
    dur_rm_rf(db);
  } else {
    fprintf(stderr, "data dirs kept: %s %s\n", da, db);
  }
  dur_shared_free(sh);
  return bad ? 1 : 0;
}
