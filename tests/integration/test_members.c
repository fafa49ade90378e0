/* test_members.c - a client given a member's servers as PRIMARY|FOLLOWER
 * (issue 21, client side), against a real primary and follower on port 0:
 *
 *  - bad server lists are refused before anything is connected, naming the
 *    entry (and a read_from that is neither value);
 *  - writes find the primary whatever the order of the list (a follower
 *    listed first sends the client on), and `embps promote` of the
 *    follower after a kill -9 of its primary in the middle of a push storm
 *    from several threads is only a pause for them: no error, and on the
 *    new primary every witness row is exactly the pushes acknowledged (0
 *    lost, 0 doubled) and the Adagrad rows a replay of them, bit for bit
 *    (the retries keep their client id and sequence, and the follower's
 *    exactly-once table came from the primary's log);
 *  - reads from the follower (read_from follower) say the LSN they read
 *    at, and every row read is the primary's at that LSN: a single writer
 *    adds 1 to every row per push, so the rows at LSN L are L - L0;
 *  - the CLI's --read-from and pull --json's LSNs, and its refusals;
 *  - a follower naming its primary by an address the client cannot reach
 *    does not hide the primary listed after it;
 *  - a client created while its member has no primary waits for one
 *    within its retry window. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dur_util.h"
#include "proxy.h"
#include "repl_util.h"

#define START_MS 30000
#define WORKERS 4

/* ------------------------------------------------------------ helpers */

static void start(dur_server_t *s, const char *const *args) {
  if (!s->work[0])
    assert_int_equal(dur_server_init(s, NULL), 0);
  int i = 0;
  for (; args && args[i]; i++)
    s->args[i] = args[i];
  s->args[i] = NULL;
  int rc = dur_server_start(s, START_MS);
  if (rc) {
    dur_server_dump_log(s);
    fail_msg("server did not start (%d)", rc);
  }
}

static void cleanup(dur_server_t *s) {
  if (s->pid)
    dur_server_kill(s);
  dur_server_cleanup(s);
}

/* A client on `servers` (a list), reading from `read_from`. */
static embps_client_t *client_on(const char *servers, int read_from,
                                 int retry_ms) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = servers;
  o.timeout_ms = 20000;
  o.retry_ms = retry_ms;
  o.read_from = read_from;
  embps_client_t *c = NULL;
  char err[512];
  int rc = embps_client_create(&o, &c, err, sizeof err);
  if (rc)
    fail_msg("client on %s: %s", servers, err);
  return c;
}

/* ------------------------------------------------------------ bad lists */

/* Each list is refused with EMBPS_EINVAL and a message holding `names`. */
static void test_bad_lists(void **state) {
  (void)state;
  static const struct {
    const char *list, *names;
  } bad[] = {
      {"127.0.0.1:1|", "entry 0"},
      {"|127.0.0.1:1", "an empty address"},
      {"127.0.0.1:1,127.0.0.1:2||127.0.0.1:3", "entry 1"},
      {"127.0.0.1:1|127.0.0.1:1", "twice"},
      {"127.0.0.1:1|nohost", "\"nohost\" is not HOST:PORT"},
      {"127.0.0.1:1,,127.0.0.1:2", "entry 1 is empty"},
      {"a:1|a:2|a:3|a:4|a:5|a:6|a:7|a:8|a:9", "at most 8"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    embps_client_options_t o;
    embps_client_options_init(&o);
    o.servers = bad[i].list;
    o.retry_ms = -1;
    embps_client_t *c = NULL;
    char err[512] = "";
    assert_int_equal(embps_client_create(&o, &c, err, sizeof err),
                     EMBPS_EINVAL);
    assert_null(c);
    if (!strstr(err, bad[i].names))
      fail_msg("list \"%s\": \"%s\" does not say \"%s\"", bad[i].list, err,
               bad[i].names);
  }
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = "127.0.0.1:1";
  o.read_from = 2;
  embps_client_t *c = NULL;
  char err[512] = "";
  assert_int_equal(embps_client_create(&o, &c, err, sizeof err),
                   EMBPS_EINVAL);
  assert_non_null(strstr(err, "read_from 2"));
  /* the CLI: the same refusal, and --read-from's */
  char *out = NULL, *cerr = NULL;
  const char *const args[] = {"tables", NULL};
  assert_int_not_equal(dur_cli("127.0.0.1:1|", args, &out, &cerr), 0);
  assert_non_null(strstr(cerr, "entry 0"));
  free(out);
  free(cerr);
  const char *const args2[] = {"--read-from", "nearest", "tables", NULL};
  assert_int_not_equal(dur_cli("127.0.0.1:1", args2, &out, &cerr), 0);
  assert_non_null(
      strstr(cerr, "--read-from \"nearest\" is not primary or follower"));
  free(out);
  free(cerr);
}

/* ------------------------------------------------------ promote storm */

typedef struct {
  const char *servers;
  const dur_workload_t *wl;
  dur_shared_t *sh;
  int w;
} worker_t;

/* Pushes (witness, then Adagrad j) until told to stop; any failure is
 * recorded and ends the worker. */
static void *worker(void *arg) {
  worker_t *x = arg;
  dur_worker_state_t *st = &x->sh->w[x->w];
  embps_client_t *c = client_on(x->servers, EMBPS_READ_PRIMARY, 60000);
  for (uint64_t j = 0; !atomic_load(&x->sh->stop); j++) {
    atomic_store(&st->inflight_wit, 1);
    int rc = dur_push_wit(c, x->wl, x->w);
    if (!rc) {
      atomic_fetch_add(&st->acked_wit, 1);
      atomic_store(&st->inflight_wit, 0);
      atomic_store(&st->inflight_ada, 1);
      rc = dur_push_ada(c, x->wl, x->w, j);
    }
    if (rc) {
      snprintf(st->error, sizeof st->error, "worker %d push %llu: %s", x->w,
               (unsigned long long)j, embps_client_last_error(c));
      atomic_store(&st->failed, 1);
      break;
    }
    atomic_fetch_add(&st->acked_ada, 1);
    atomic_store(&st->inflight_ada, 0);
  }
  embps_client_destroy(c);
  return NULL;
}

/* Waits until every worker acknowledged at least `want` Adagrad pushes. */
static void wait_acked(dur_shared_t *sh, uint64_t want) {
  for (int w = 0; w < WORKERS; w++)
    if (dur_worker_wait_acked(sh, w, want, 60000) != 1)
      fail_msg("worker %d stuck below %llu pushes: %s", w,
               (unsigned long long)want, sh->w[w].error);
}

static void test_promote_storm(void **state) {
  (void)state;
  dur_server_t p = {0}, f = {0};
  start(&p, (const char *const[]){"--sync-followers", "1",
                                  "--sync-timeout-ms", "20000", "--shards",
                                  "4", NULL});
  start(&f, (const char *const[]){"--follow", p.addr, "--shards", "4", NULL});
  assert_int_equal(repl_wait_in_sync(p.addr, 1, 20000), 0);
  char list[80], rlist[80];
  snprintf(list, sizeof list, "%s|%s", p.addr, f.addr);
  snprintf(rlist, sizeof rlist, "%s|%s", f.addr, p.addr);

  /* the follower listed first: the client goes on to the primary */
  dur_workload_t wl = {.n_workers = WORKERS, .rows_per_worker = 64,
                       .seed = 2121};
  embps_client_t *admin = client_on(rlist, EMBPS_READ_PRIMARY, 60000);
  assert_int_equal(dur_create_tables(admin, &wl), 0);
  assert_string_equal(embps_client_server_address(admin, 0), p.addr);
  embps_client_destroy(admin);

  dur_shared_t *sh = dur_shared_new();
  assert_non_null(sh);
  pthread_t th[WORKERS];
  worker_t wk[WORKERS];
  for (int w = 0; w < WORKERS; w++) {
    wk[w] = (worker_t){w % 2 ? rlist : list, &wl, sh, w};
    assert_int_equal(pthread_create(&th[w], NULL, worker, &wk[w]), 0);
  }
  wait_acked(sh, 30);
  dur_server_kill(&p); /* mid-storm: pushes in flight on the primary */
  char *out = NULL, *err = NULL;
  const char *const promote[] = {"promote", NULL};
  int rc = dur_cli(f.addr, promote, &out, &err);
  if (rc)
    fail_msg("embps promote: %s%s", out ? out : "", err ? err : "");
  free(out);
  free(err);
  uint64_t at[WORKERS];
  for (int w = 0; w < WORKERS; w++)
    at[w] = atomic_load(&sh->w[w].acked_ada);
  for (int w = 0; w < WORKERS; w++)
    if (dur_worker_wait_acked(sh, w, at[w] + 30, 60000) != 1)
      fail_msg("worker %d made no progress after the promotion: %s", w,
               sh->w[w].error);
  atomic_store(&sh->stop, 1);
  for (int w = 0; w < WORKERS; w++)
    pthread_join(th[w], NULL);
  for (int w = 0; w < WORKERS; w++)
    if (atomic_load(&sh->w[w].failed))
      fail_msg("%s", sh->w[w].error);

  uint64_t total = 0;
  for (int w = 0; w < WORKERS; w++)
    total += atomic_load(&sh->w[w].acked_ada) - at[w];
  dur_note("%llu pushes acknowledged after the promotion (the workers' "
           "first %llu, %llu, %llu, %llu before it)",
           (unsigned long long)total, (unsigned long long)at[0],
           (unsigned long long)at[1], (unsigned long long)at[2],
           (unsigned long long)at[3]);
  embps_client_t *c = client_on(list, EMBPS_READ_PRIMARY, 60000);
  assert_string_equal(embps_client_server_address(c, 0), f.addr);
  assert_int_equal(dur_check_witness(c, &wl, sh, "after the promotion", 1,
                                     1),
                   0);
  uint64_t counts[WORKERS];
  for (int w = 0; w < WORKERS; w++)
    counts[w] = atomic_load(&sh->w[w].acked_ada);
  float *want = dur_replay_ada(&wl, counts);
  float *got = dur_pull_ada(c, &wl);
  assert_non_null(want);
  assert_non_null(got);
  assert_int_equal(dur_compare_ada(&wl, want, got, "new primary"), 0);
  assert_int_equal(dur_failures(), 0);
  free(want);
  free(got);
  embps_client_destroy(c);
  dur_shared_free(sh);
  cleanup(&p);
  cleanup(&f);
}

/* ---------------------------------------------------- follower reads */

#define READ_ROWS 64
#define READ_DIM 4

typedef struct {
  const char *servers;
  _Atomic int stop;
  _Atomic uint64_t pushes;
  char error[512];
} writer_t;

/* One push at a time, each adding 1 to every row (SGD, lr 1, -1). */
static void *writer(void *arg) {
  writer_t *x = arg;
  embps_client_t *c = client_on(x->servers, EMBPS_READ_PRIMARY, 30000);
  int64_t ids[READ_ROWS];
  float g[READ_ROWS * READ_DIM];
  for (int i = 0; i < READ_ROWS; i++)
    ids[i] = i;
  for (int i = 0; i < READ_ROWS * READ_DIM; i++)
    g[i] = -1.0f;
  while (!atomic_load(&x->stop)) {
    if (embps_push(c, "r", ids, READ_ROWS, g, READ_DIM, 0)) {
      snprintf(x->error, sizeof x->error, "%s", embps_client_last_error(c));
      break;
    }
    atomic_fetch_add(&x->pushes, 1);
  }
  embps_client_destroy(c);
  return NULL;
}

/* Pulls every row through c; checks each equals `expect`. */
static void pull_all(embps_client_t *c, float expect, const char *what) {
  int64_t ids[READ_ROWS];
  float rows[READ_ROWS * READ_DIM];
  for (int i = 0; i < READ_ROWS; i++)
    ids[i] = READ_ROWS - 1 - i;
  assert_int_equal(embps_pull(c, "r", ids, READ_ROWS, rows, READ_DIM), 0);
  for (int i = 0; i < READ_ROWS * READ_DIM; i++)
    if (rows[i] != expect)
      fail_msg("%s: row %lld element %d is %g where the primary had %g at "
               "LSN %llu", what, (long long)ids[i / READ_DIM], i % READ_DIM,
               (double)rows[i], (double)expect,
               (unsigned long long)embps_client_read_lsn(c, 0));
}

static void test_follower_reads(void **state) {
  (void)state;
  dur_server_t p = {0}, f = {0};
  start(&p, (const char *const[]){"--shards", "4", NULL});
  start(&f, (const char *const[]){"--follow", p.addr, "--shards", "4", NULL});
  char list[80];
  snprintf(list, sizeof list, "%s|%s", p.addr, f.addr);
  embps_client_t *admin = client_on(list, EMBPS_READ_PRIMARY, 30000);
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "r", READ_DIM, EMBPS_OPT_SGD);
  spec.rows = READ_ROWS;
  spec.lr = 1.0;
  assert_int_equal(embps_create_table(admin, &spec), 0);
  /* L0: the LSN the table was created at, read on the primary */
  pull_all(admin, 0.0f, "primary before the pushes");
  const uint64_t l0 = embps_client_read_lsn(admin, 0);
  assert_true(l0 > 0);
  assert_string_equal(embps_client_read_address(admin, 0), p.addr);

  /* the follower holds the table (its reads may be behind the primary) */
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, 60000), 0);
  embps_client_t *r = client_on(list, EMBPS_READ_FOLLOWER, 30000);
  writer_t wr = {.servers = list};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, writer, &wr), 0);
  uint64_t seen_lsns = 0, last = 0;
  for (int round = 0; round < 400 && (seen_lsns < 20 || round < 50);
       round++) {
    int64_t ids[READ_ROWS];
    float rows[READ_ROWS * READ_DIM];
    for (int i = 0; i < READ_ROWS; i++)
      ids[i] = i;
    assert_int_equal(embps_pull(r, "r", ids, READ_ROWS, rows, READ_DIM), 0);
    uint64_t lsn = embps_client_read_lsn(r, 0);
    assert_true(lsn >= l0);
    for (int i = 0; i < READ_ROWS * READ_DIM; i++)
      if (rows[i] != (float)(lsn - l0))
        fail_msg("follower row %d element %d is %g; the primary had %g at "
                 "the LSN %llu the read reported", i / READ_DIM,
                 i % READ_DIM, (double)rows[i], (double)(lsn - l0),
                 (unsigned long long)lsn);
    assert_true(lsn >= last); /* one follower: never back in time */
    seen_lsns += lsn != last;
    last = lsn;
  }
  assert_string_equal(embps_client_read_address(r, 0), f.addr);
  atomic_store(&wr.stop, 1);
  pthread_join(th, NULL);
  if (wr.error[0])
    fail_msg("writer: %s", wr.error);
  dur_note("follower reads saw %llu LSNs, up to %llu (%llu pushes)",
           (unsigned long long)seen_lsns, (unsigned long long)last,
           (unsigned long long)atomic_load(&wr.pushes));
  assert_true(seen_lsns >= 5); /* reads saw the follower move */
  const uint64_t pushes = atomic_load(&wr.pushes);
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, 60000), 0);
  pull_all(r, (float)pushes, "follower caught up");
  assert_int_equal(embps_client_read_lsn(r, 0), l0 + pushes);
  pull_all(admin, (float)pushes, "primary");
  assert_int_equal(embps_client_read_lsn(admin, 0), l0 + pushes);

  /* the CLI: --read-from follower, the LSN in pull --json */
  char *out = NULL, *err = NULL;
  const char *const args[] = {"--read-from", "follower", "pull", "r",
                              "--ids", "3", "--json", NULL};
  int rc = dur_cli(list, args, &out, &err);
  if (rc)
    fail_msg("embps pull: %s", err ? err : "");
  char want[64];
  snprintf(want, sizeof want, "\"lsn\": [%llu]",
           (unsigned long long)(l0 + pushes));
  if (!strstr(out, want))
    fail_msg("pull --json says \"%s\", not %s", out, want);
  free(out);
  free(err);

  /* the primary gone: follower reads go on, writes wait for a primary */
  dur_server_kill(&p);
  pull_all(r, (float)pushes, "follower, its primary gone");
  embps_client_destroy(r);
  embps_client_destroy(admin);
  cleanup(&p);
  cleanup(&f);
}

/* A follower names its primary by an address this client cannot reach
 * (here: the proxy it followed through, stopped; in compose, a name only
 * the servers resolve): the client goes on with the server listed after
 * the follower and finds the primary there, at once (no retry window). */
static void test_unreachable_named(void **state) {
  (void)state;
  dur_server_t p = {0}, f = {0};
  start(&p, (const char *const[]){"--shards", "2", NULL});
  it_proxy_t *x = NULL;
  assert_int_equal(it_proxy_start(&x, p.addr), 0);
  start(&f, (const char *const[]){"--follow", it_proxy_addr(x), "--shards",
                                  "2", NULL});
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, 60000), 0);
  it_proxy_stop(x); /* f now names an address where nothing listens */
  char list[80];
  snprintf(list, sizeof list, "%s|%s", f.addr, p.addr);
  embps_client_t *c = client_on(list, EMBPS_READ_PRIMARY, -1);
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "u", 4, EMBPS_OPT_SGD);
  spec.rows = 8;
  assert_int_equal(embps_create_table(c, &spec), 0);
  int64_t ids[8];
  float rows[8 * 4];
  for (int i = 0; i < 8; i++)
    ids[i] = i;
  assert_int_equal(embps_pull(c, "u", ids, 8, rows, 4), 0);
  assert_string_equal(embps_client_read_address(c, 0), p.addr);
  embps_client_destroy(c);
  cleanup(&f);
  cleanup(&p);
}

/* Promotes f once the client has reached it twice through proxy x (it is
 * waiting for a primary), or gives up after 30 s. */
typedef struct {
  it_proxy_t *x;
  const char *f;
  atomic_int stop;
  int rc;
} promoter_t;

static void *promoter(void *arg) {
  promoter_t *pr = arg;
  pr->rc = -1;
  it_proxy_counts_t n;
  int polls = 0;
  do {
    if (atomic_load(&pr->stop) || ++polls > 6000) /* 30 s */
      return NULL;
    nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL); /* a poll */
    it_proxy_counts(pr->x, &n);
  } while (n.connections < 2);
  char *out = NULL, *err = NULL;
  const char *const promote[] = {"promote", NULL};
  pr->rc = dur_cli(pr->f, promote, &out, &err);
  free(out);
  free(err);
  return NULL;
}

/* A client created while its member has no primary (the primary killed,
 * its follower not yet promoted) waits within its retry window, then
 * works once the follower is promoted: creation is no different from a
 * request. */
static void test_create_between_primaries(void **state) {
  (void)state;
  dur_server_t p = {0}, f = {0};
  start(&p, (const char *const[]){"--shards", "2", NULL});
  start(&f, (const char *const[]){"--follow", p.addr, "--shards", "2", NULL});
  assert_int_equal(repl_wait_caught_up(p.addr, f.addr, 60000), 0);
  dur_server_kill(&p);
  it_proxy_t *x = NULL;
  assert_int_equal(it_proxy_start(&x, f.addr), 0);
  promoter_t pr = {.x = x, .f = f.addr};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, promoter, &pr), 0);
  char list[80];
  snprintf(list, sizeof list, "%s|%s", it_proxy_addr(x), p.addr);
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = list;
  o.retry_ms = 30000;
  embps_client_t *c = NULL;
  char err[512] = "";
  int rc = embps_client_create(&o, &c, err, sizeof err);
  atomic_store(&pr.stop, 1);
  pthread_join(th, NULL);
  if (rc)
    fail_msg("client created between primaries: %s", err);
  assert_int_equal(pr.rc, 0);
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "b", 4, EMBPS_OPT_SGD);
  spec.rows = 8;
  assert_int_equal(embps_create_table(c, &spec), 0);
  assert_string_equal(embps_client_read_address(c, 0), it_proxy_addr(x));
  embps_client_destroy(c);
  it_proxy_stop(x);
  cleanup(&f);
  cleanup(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_lists),
      cmocka_unit_test(test_follower_reads),
      cmocka_unit_test(test_promote_storm),
      cmocka_unit_test(test_unreachable_named),
      cmocka_unit_test(test_create_between_primaries),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
