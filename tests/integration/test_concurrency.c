/* test_concurrency.c - concurrent and pipelined clients of one real
 * server (integration.concurrency): 8 client processes pushing at once
 * apply every push exactly once; pullers racing pushers never read a torn
 * row or a row that went back in time; asynchronous tickets waited for in
 * any order each see the pushes issued before them. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness_model.h"

enum { CC_CHILDREN = 8, CC_PUSHES = 200, CC_ROWS = 40, CC_DIM = 4, CC_N = 6 };

static void cc_batch(int child, int p, int64_t *idx) {
  uint64_t h = rng_mix((uint64_t)child * 100000 + (uint64_t)p);
  idx[0] = (int64_t)(h % CC_ROWS);
  idx[1] = (int64_t)((h >> 8) % CC_ROWS);
  idx[2] = idx[0];
  idx[3] = (int64_t)((h >> 16) % CC_ROWS);
  idx[4] = CC_ROWS - 1; /* every push touches the last row */
  idx[5] = idx[3];
}

static int cc_child(const char *addr, int child) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = addr;
  o.timeout_ms = IT_TIMEOUT_MS;
  embps_client_t *c;
  if (embps_client_create(&o, &c, NULL, 0))
    return 2;
  float v[CC_N * CC_DIM];
  for (size_t i = 0; i < CC_N * CC_DIM; i++)
    v[i] = -1.0f;
  for (int p = 0; p < CC_PUSHES; p++) {
    int64_t idx[CC_N];
    cc_batch(child, p, idx);
    if (embps_push(c, "cc", idx, CC_N, v, CC_DIM,
                   child % 2 ? EMBPS_PUSH_MERGE : 0)) {
      embps_client_destroy(c);
      return 3;
    }
  }
  embps_client_destroy(c);
  return 0;
}

static void test_concurrent_clients(void **state) {
  it_fx_t *f = *state;
  embps_table_spec_t s = it_spec("cc", CC_DIM, CC_ROWS, EMBPS_OPT_SGD, 1.0,
                                 EMBPS_INIT_ZEROS, 0, 0);
  it_create(f->c, &s);
  pid_t kids[CC_CHILDREN];
  for (int k = 0; k < CC_CHILDREN; k++) {
    kids[k] = fork();
    assert_true(kids[k] >= 0);
    if (kids[k] == 0)
      _exit(cc_child(f->srv[0].addr, k));
  }
  int failed = 0;
  for (int k = 0; k < CC_CHILDREN; k++) {
    int st;
    while (waitpid(kids[k], &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "client process %d failed (status 0x%x)\n", k, st);
      failed++;
    }
  }
  assert_int_equal(failed, 0);
  double want[CC_ROWS] = {0};
  for (int k = 0; k < CC_CHILDREN; k++)
    for (int p = 0; p < CC_PUSHES; p++) {
      int64_t idx[CC_N];
      cc_batch(k, p, idx);
      for (int i = 0; i < CC_N; i++)
        want[idx[i]] += 1.0;
    }
  assert_true(want[CC_ROWS - 1] >= CC_CHILDREN * CC_PUSHES);
  float *rows = it_pull_all(f->c, "cc", CC_ROWS, CC_DIM);
  for (int r = 0; r < CC_ROWS; r++)
    for (int j = 0; j < CC_DIM; j++)
      if ((double)rows[r * CC_DIM + j] != want[r])
        fail_msg("row %d: %.9g, expected %.0f (every push applied once)", r,
                 (double)rows[r * CC_DIM + j], want[r]);
  free(rows);
  embps_server_stats_t *st;
  size_t ns;
  assert_rc(embps_stats(f->c, &st, &ns), f->c);
  assert_true(st[0].pushes >= CC_CHILDREN * CC_PUSHES);
  embps_stats_free(st, ns);
}

/* Pushers add 1 to every element of every row, again and again, while
 * pullers read: every row read must be a state the row really had (all its
 * elements equal, never lower than before). */
enum { TR_ROWS = 16, TR_DIM = 512, TR_ROUNDS = 150 };

static int tr_child(const char *addr, int role) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = addr;
  o.timeout_ms = IT_TIMEOUT_MS;
  embps_client_t *c;
  if (embps_client_create(&o, &c, NULL, 0))
    return 2;
  int64_t ids[TR_ROWS];
  for (int i = 0; i < TR_ROWS; i++)
    ids[i] = role < 2 ? i : TR_ROWS - 1 - i;
  float *buf = malloc(TR_ROWS * TR_DIM * sizeof *buf);
  float last[TR_ROWS] = {0};
  int rc = buf ? 0 : 2;
  if (role < 2) { /* pusher */
    for (size_t i = 0; buf && i < TR_ROWS * TR_DIM; i++)
      buf[i] = -1.0f;
    for (int p = 0; !rc && p < TR_ROUNDS; p++)
      if (embps_push(c, "tr", ids, TR_ROWS, buf, TR_DIM,
                     role ? EMBPS_PUSH_MERGE : 0))
        rc = 3;
  } else { /* puller */
    for (int p = 0; !rc && p < 2 * TR_ROUNDS; p++) {
      if (embps_pull(c, "tr", ids, TR_ROWS, buf, TR_DIM)) {
        rc = 3;
        break;
      }
      for (int r = 0; r < TR_ROWS && !rc; r++) {
        const float *row = buf + r * TR_DIM;
        for (int j = 1; j < TR_DIM; j++)
          if (row[j] != row[0])
            rc = 4; /* torn row */
        if (row[0] < last[r])
          rc = 5; /* went back in time */
        last[r] = row[0];
      }
    }
  }
  free(buf);
  embps_client_destroy(c);
  return rc;
}

static void test_no_torn_rows(void **state) {
  it_fx_t *f = *state;
  embps_table_spec_t s = it_spec("tr", TR_DIM, TR_ROWS, EMBPS_OPT_SGD, 1.0,
                                 EMBPS_INIT_ZEROS, 0, 0);
  it_create(f->c, &s);
  pid_t kids[4];
  for (int k = 0; k < 4; k++) {
    kids[k] = fork();
    assert_true(kids[k] >= 0);
    if (kids[k] == 0)
      _exit(tr_child(f->srv[0].addr, k));
  }
  int failed = 0;
  for (int k = 0; k < 4; k++) {
    int st;
    while (waitpid(kids[k], &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "%s process %d failed: %s\n", k < 2 ? "push" : "pull",
              k, WIFEXITED(st) && WEXITSTATUS(st) == 4   ? "torn row"
                 : WIFEXITED(st) && WEXITSTATUS(st) == 5 ? "row went back"
                                                         : "error");
      failed++;
    }
  }
  assert_int_equal(failed, 0);
  float *rows = it_pull_all(f->c, "tr", TR_ROWS, TR_DIM);
  for (size_t i = 0; i < TR_ROWS * TR_DIM; i++)
    if (rows[i] != 2.0f * TR_ROUNDS)
      fail_msg("element %zu is %.9g, expected %d", i, (double)rows[i],
               2 * TR_ROUNDS);
  free(rows);
}

enum { AS_ROWS = 64, AS_DIM = 8, AS_STEPS = 12, AS_N = 30, AS_PULL = 80 };

static void test_async_tickets(void **state) {
  it_fx_t *f = *state;
  embps_table_spec_t s = it_spec("as", AS_DIM, AS_ROWS, EMBPS_OPT_SGD, 0.25,
                                 EMBPS_INIT_UNIFORM, 0.5, 21);
  it_create(f->c, &s);
  it_ref_t ref;
  it_ref_init(&ref, &s);
  int64_t all[AS_ROWS];
  for (int i = 0; i < AS_ROWS; i++)
    all[i] = i;
  it_ref_learn_from(&ref, f->c, "as", all, AS_ROWS);
  int64_t pull_ids_[AS_PULL];
  for (int k = 0; k < AS_PULL; k++)
    pull_ids_[k] = (AS_ROWS - 1 - k % AS_ROWS);
  static int64_t idx[AS_STEPS][AS_N];
  static float vals[AS_STEPS][AS_N * AS_DIM];
  static float outs[AS_STEPS][AS_PULL * AS_DIM];
  static float want[AS_STEPS][AS_PULL * AS_DIM];
  embps_ticket_t *tickets[2 * AS_STEPS];
  for (int i = 0; i < AS_STEPS; i++) {
    for (int k = 0; k < AS_N; k++) {
      idx[i][k] = (int64_t)(rng_mix((uint64_t)(i * 100 + k)) % 24);
      for (int j = 0; j < AS_DIM; j++)
        vals[i][k * AS_DIM + j] =
            it_grad_value(rng_mix((uint64_t)(i * 977 + k * 13 + j)));
    }
    assert_rc(embps_push_async(f->c, "as", idx[i], AS_N, vals[i], AS_DIM,
                               i % 3 == 0 ? EMBPS_PUSH_MERGE : 0,
                               &tickets[2 * i]),
              f->c);
    it_ref_push(&ref, idx[i], AS_N, vals[i]);
    it_ref_expect(&ref, pull_ids_, AS_PULL, want[i]);
    assert_rc(embps_pull_async(f->c, "as", pull_ids_, AS_PULL, outs[i], AS_DIM,
                               &tickets[2 * i + 1]),
              f->c);
  }
  /* wait in an order unrelated to the issue order */
  int order[2 * AS_STEPS];
  for (int i = 0; i < 2 * AS_STEPS; i++)
    order[i] = i;
  for (int i = 2 * AS_STEPS - 1; i > 0; i--) {
    int j = (int)(rng_mix((uint64_t)i + 5) % (uint64_t)(i + 1));
    int t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  if (order[0] == 0) { /* make sure the first wait is not the first ticket */
    order[0] = order[1];
    order[1] = 0;
  }
  for (int i = 0; i < 2 * AS_STEPS; i++)
    assert_rc(embps_wait(f->c, tickets[order[i]]), f->c);
  for (int i = 0; i < AS_STEPS; i++) {
    char what[64];
    snprintf(what, sizeof what, "pull issued after push %d", i);
    it_assert_floats(outs[i], want[i], AS_PULL * AS_DIM, 0, what);
  }
  /* pipelined push then pull: waiting for the pull first, it sees the push */
  int64_t pidx[] = {40, 41, 40};
  float pv[3 * AS_DIM];
  it_fill_values(pv, 3 * AS_DIM, 77);
  float pout[3 * AS_DIM], pwant[3 * AS_DIM];
  embps_ticket_t *tp, *tq;
  assert_rc(embps_push_async(f->c, "as", pidx, 3, pv, AS_DIM, 0, &tp), f->c);
  assert_rc(embps_pull_async(f->c, "as", pidx, 3, pout, AS_DIM, &tq), f->c);
  it_ref_push(&ref, pidx, 3, pv);
  it_ref_expect(&ref, pidx, 3, pwant);
  assert_rc(embps_wait(f->c, tq), f->c);
  assert_rc(embps_wait(f->c, tp), f->c);
  it_assert_floats(pout, pwant, 3 * AS_DIM, 0, "pull pipelined after a push");
  it_check_dense(f->c, "as", &ref, AS_ROWS, 0, "table after the async pushes");
  it_ref_free(&ref);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  unsetenv("EMBPS_SERVERS");
  unsetenv("EMBPS_TOKEN_FILE");
#define T(f) cmocka_unit_test_setup_teardown(f, it_fx_setup_one, it_fx_teardown)
  const struct CMUnitTest tests[] = {
      T(test_concurrent_clients),
      T(test_no_torn_rows),
      T(test_async_tickets),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
