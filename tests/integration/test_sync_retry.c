/* test_sync_retry.c - retries of pushes to a synchronous table (2
 * workers) through the fault-injecting proxy (proxy.c). Worker A goes
 * through the proxy.
 *   step 1: A's push is held waiting for B; the proxy cuts A's connection;
 *           A's library retries (same client id and seq), and the retry
 *           takes the held push's place; B's push completes the step and
 *           A's retry is acknowledged.
 *   step 2: the proxy drops A's reply after the step was applied; A's retry
 *           is acknowledged as a duplicate.
 * The rows equal the reference (SGD at lr 1 of the workers' mean
 * gradient, exact in float32) and the step counter is 2. Worker B goes
 * through a second proxy that injects nothing, so that the test knows
 * every frame sent and waits until the server has dispatched them. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "embps/embps.h"
#include "frame.h"
#include "harness_fixture.h"
#include "proxy.h"

#define DIM 2
#define N 3

static const int64_t ids[N] = {1, 4, 7};

static embps_client_t *client_for(const char *servers) {
  embps_client_options_t o = {.size = sizeof o,
                              .servers = servers,
                              .timeout_ms = 10000,
                              .retry_ms = 10000};
  char err[512];
  embps_client_t *c = NULL;
  if (embps_client_create(&o, &c, err, sizeof err))
    fail_msg("connect to %s: %s", servers, err);
  return c;
}

static unsigned pushes_seen(it_proxy_t *px) {
  it_proxy_counts_t n;
  it_proxy_counts(px, &n);
  return n.requests[EMBPS_KIND_PUSH];
}

/* What the server has dispatched, against what the proxies forwarded:
 * from a quiet moment on, the server's `requests` counter grows by the
 * frames the proxies forward and by the STATS polls of `watch` (a client
 * that does nothing else, straight to the server), which are taken off. */
typedef struct {
  embps_client_t *watch;
  it_proxy_t *px[2];
  uint64_t r0;       /* the counter at the quiet moment (with its poll) */
  uint64_t polls;    /* polls since */
  unsigned fwd0;     /* frames forwarded by then */
} tally_t;

static unsigned forwarded(const tally_t *t) {
  unsigned n = 0;
  for (int i = 0; i < 2; i++) {
    it_proxy_counts_t c;
    it_proxy_counts(t->px[i], &c);
    for (int k = 0; k < 256; k++)
      n += c.requests[k];
  }
  return n;
}

/* Call while no request is in flight. */
static void tally_start(tally_t *t) {
  t->fwd0 = forwarded(t);
  t->r0 = it_stat(t->watch, IT_STAT(requests));
  t->polls = 0;
}

/* Waits up to 10 s for the proxy to have forwarded `want` pushes of A,
 * then until the server has dispatched every frame the proxies forwarded:
 * with one I/O thread, a push the server counted went to the apply thread
 * before any request it reads later. */
static void wait_pushes(tally_t *t, unsigned want) {
  double end = it_now_ms() + 10000;
  while (pushes_seen(t->px[0]) < want && it_now_ms() < end)
    it_sleep_ms(5);
  if (pushes_seen(t->px[0]) < want)
    fail_msg("the proxy forwarded %u pushes, want %u",
             pushes_seen(t->px[0]), want);
  for (;;) {
    unsigned fwd = forwarded(t) - t->fwd0;
    uint64_t r = it_stat(t->watch, IT_STAT(requests));
    uint64_t seen = r - t->r0 - ++t->polls;
    if (seen >= fwd)
      return;
    if (it_now_ms() > end)
      fail_msg("the server dispatched %llu of the %u frames forwarded",
               (unsigned long long)seen, fwd);
    it_sleep_ms(2);
  }
}

/* Worker A, on its own thread: its library drives the connection (and its
 * retries) while the test thread cuts and lets worker B push. */
typedef struct {
  embps_client_t *c;
  uint64_t step;
  float g[N * DIM];
  int rc;
} worker_t;

static void *worker_a(void *arg) {
  worker_t *w = arg;
  w->rc = embps_push_step(w->c, "sync", ids, N, w->g, DIM, 0, w->step);
  return NULL;
}

static void fill(float *g, float v) {
  for (int i = 0; i < N * DIM; i++)
    g[i] = v;
}

static void test_sync_push_retried(void **state) {
  (void)state;
  it_server_t srv;
  const char *args[] = {"--io-threads", "1", NULL};
  assert_int_equal(it_server_start(&srv, args), 0);
  it_proxy_t *px, *pxb;
  assert_int_equal(it_proxy_start(&px, srv.addr), 0);
  assert_int_equal(it_proxy_start(&pxb, srv.addr), 0);
  embps_client_t *a = client_for(it_proxy_addr(px));
  embps_client_t *bc = client_for(it_proxy_addr(pxb));
  tally_t tally = {.watch = client_for(srv.addr), .px = {px, pxb}};
  embps_table_spec_t s;
  embps_table_spec_init(&s, "sync", DIM, EMBPS_OPT_SGD);
  s.rows = 10;
  s.lr = 1;
  s.sync_workers = 2;
  assert_int_equal(embps_create_table(bc, &s), 0);
  tally_start(&tally);

  /* step 1: A held, A's connection cut, A's retry replaces it */
  worker_t a1 = {.c = a, .step = 1};
  fill(a1.g, 1.0f);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, worker_a, &a1), 0);
  wait_pushes(&tally, 1);
  it_proxy_cut(px);
  wait_pushes(&tally, 2); /* the retry is at the server */
  float gb[N * DIM];
  fill(gb, 3.0f);
  int rc = embps_push_step(bc, "sync", ids, N, gb, DIM, 0, 1);
  pthread_join(th, NULL);
  if (a1.rc)
    fail_msg("A's retry of a held push: %s", embps_client_last_error(a));
  if (rc)
    fail_msg("B's push: %s", embps_client_last_error(bc));
  assert_int_equal(pushes_seen(px), 2);

  /* step 2: applied, A's reply dropped, A's retry is a duplicate */
  it_proxy_arm(px, IT_PROXY_DROP_REPLY, EMBPS_KIND_PUSH, 1);
  worker_t a2 = {.c = a, .step = 2};
  fill(a2.g, 0.5f);
  assert_int_equal(pthread_create(&th, NULL, worker_a, &a2), 0);
  wait_pushes(&tally, 3);
  fill(gb, 1.5f);
  rc = embps_push_step(bc, "sync", ids, N, gb, DIM, 0, 2);
  pthread_join(th, NULL);
  if (a2.rc)
    fail_msg("A's retry of an applied push: %s", embps_client_last_error(a));
  if (rc)
    fail_msg("B's push: %s", embps_client_last_error(bc));
  it_proxy_counts_t n;
  it_proxy_counts(px, &n);
  assert_int_equal(n.faults_fired, 1);
  assert_int_equal(n.push_duplicates, 1);

  /* rows: -(1+3)/2 - (0.5+1.5)/2 = -3, every id, once */
  float rows[N * DIM];
  assert_int_equal(embps_pull(bc, "sync", ids, N, rows, DIM), 0);
  for (int i = 0; i < N * DIM; i++)
    assert_true(rows[i] == -3.0f);
  embps_table_info_t info;
  assert_int_equal(embps_describe_table(bc, "sync", &info), 0);
  assert_int_equal(info.step, 2);

  embps_client_destroy(a);
  embps_client_destroy(bc);
  embps_client_destroy(tally.watch);
  it_proxy_stop(px);
  it_proxy_stop(pxb);
  assert_int_equal(it_server_stop(&srv), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sync_push_retried),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
