/* test_refusals.c - what real servers refuse (integration.refusals), and
 * that a refusal names the problem and changes nothing: unknown tables,
 * wrong dims, ids out of range, counts that do not match the bulk,
 * non-finite gradients, existing tables, frames above --max-frame-bytes
 * (refused before sending, or skipped unread by the server), garbage,
 * another protocol version, requests before the hello and a wrong auth
 * token. After each, the table holds exactly what the valid pushes made it
 * and the server still serves this client and a new one. Raw frames come
 * from harness_raw.h. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness_raw.h"

/* Dense table "t": dim 4, 10 rows, SGD, uniform init, two pushes applied. */
enum { T_DIM = 4, T_ROWS = 10 };

static void err_prepare(it_fx_t *f, it_ref_t *ref) {
  embps_table_spec_t s = it_spec("t", T_DIM, T_ROWS, EMBPS_OPT_SGD, 0.5,
                                 EMBPS_INIT_UNIFORM, 0.5, 8);
  it_create(f->c, &s);
  it_ref_init(ref, &s);
  int64_t all[T_ROWS];
  for (int i = 0; i < T_ROWS; i++)
    all[i] = i;
  it_ref_learn_from(ref, f->c, "t", all, T_ROWS);
  int64_t idx[] = {1, 2, 2, 9, 0, 1};
  float v[6 * T_DIM];
  for (int p = 0; p < 2; p++) {
    for (size_t i = 0; i < 6 * T_DIM; i++)
      v[i] = it_grad_value(rng_mix(i + (uint64_t)p * 100));
    assert_rc(embps_push(f->c, "t", idx, 6, v, T_DIM, 0), f->c);
    it_ref_push(ref, idx, 6, v);
  }
  it_check_dense(f->c, "t", ref, T_ROWS, 0, "table before the refusals");
}

/* The table is exactly what the valid pushes made it, and the server (and
 * this client) still serve: a valid push applies exactly. */
static void err_check_unchanged(it_fx_t *f, it_ref_t *ref,
                                const float *before) {
  float *now = it_pull_all(f->c, "t", T_ROWS, T_DIM);
  assert_memory_equal(now, before, T_ROWS * T_DIM * sizeof(float));
  free(now);
  it_check_dense(f->c, "t", ref, T_ROWS, 0, "table after the refusals");
  int64_t idx[] = {3, 3, 4};
  float v[3 * T_DIM];
  for (size_t i = 0; i < 3 * T_DIM; i++)
    v[i] = it_grad_value(rng_mix(i + 555));
  assert_rc(embps_push(f->c, "t", idx, 3, v, T_DIM, 0), f->c);
  it_ref_push(ref, idx, 3, v);
  it_check_dense(f->c, "t", ref, T_ROWS, 0, "a valid push after the refusals");
  embps_client_t *c2 = it_client_ok(f->srv[0].addr, NULL);
  it_check_dense(c2, "t", ref, T_ROWS, 0, "a new client after the refusals");
  embps_client_destroy(c2);
}

static void test_refuse_unknown_table(void **state) {
  it_fx_t *f = *state;
  it_ref_t ref;
  err_prepare(f, &ref);
  float *before = it_pull_all(f->c, "t", T_ROWS, T_DIM);
  int64_t idx[] = {1, 2};
  float v[2 * T_DIM], out[2 * T_DIM];
  it_fill_values(v, 2 * T_DIM, 1);
  assert_err(embps_push(f->c, "nope", idx, 2, v, T_DIM, 0), f->c,
             EMBPS_ENOTABLE, "unknown table \"nope\"");
  assert_err(embps_pull(f->c, "nope", idx, 2, out, T_DIM), f->c,
             EMBPS_ENOTABLE, "unknown table \"nope\"");
  embps_table_info_t info;
  assert_err(embps_describe_table(f->c, "nope", &info), f->c, EMBPS_ENOTABLE,
             "unknown table \"nope\"");
  assert_err(embps_drop_table(f->c, "nope"), f->c, EMBPS_ENOTABLE,
             "unknown table \"nope\"");
  err_check_unchanged(f, &ref, before);
  free(before);
  it_ref_free(&ref);
}

static void test_refuse_wrong_dim(void **state) {
  it_fx_t *f = *state;
  it_ref_t ref;
  err_prepare(f, &ref);
  float *before = it_pull_all(f->c, "t", T_ROWS, T_DIM);
  int64_t idx[] = {1, 2};
  float v[2 * 5], out[2 * 5];
  it_fill_values(v, 2 * 5, 2);
  assert_err(embps_push(f->c, "t", idx, 2, v, 5, 0), f->c, EMBPS_EDIM,
             "dim 4");
  assert_err(embps_push(f->c, "t", idx, 1, v, 3, 0), f->c, EMBPS_EDIM,
             "dim 3");
  assert_err(embps_pull(f->c, "t", idx, 2, out, 5), f->c, EMBPS_EDIM,
             "dim 5");
  err_check_unchanged(f, &ref, before);
  free(before);
  it_ref_free(&ref);
}

static void test_refuse_out_of_range(void **state) {
  it_fx_t *f = *state;
  it_ref_t ref;
  err_prepare(f, &ref);
  float *before = it_pull_all(f->c, "t", T_ROWS, T_DIM);
  /* every index valid except the very last */
  int64_t idx[11];
  float v[11 * T_DIM], out[2 * T_DIM];
  for (int i = 0; i < 11; i++)
    idx[i] = i;
  it_fill_values(v, 11 * T_DIM, 3);
  assert_err(embps_push(f->c, "t", idx, 11, v, T_DIM, 0), f->c, EMBPS_ERANGE,
             "index 10 out of range [0, 10)");
  int64_t neg[] = {2, 3, -1};
  assert_err(embps_push(f->c, "t", neg, 3, v, T_DIM, EMBPS_PUSH_MERGE), f->c,
             EMBPS_ERANGE, "index -1 out of range");
  int64_t big[] = {2, 2, 1000000, 4};
  assert_err(embps_push(f->c, "t", big, 4, v, T_DIM, 0), f->c, EMBPS_ERANGE,
             "index 1000000 out of range");
  int64_t pbad[] = {0, 10};
  assert_err(embps_pull(f->c, "t", pbad, 2, out, T_DIM), f->c, EMBPS_ERANGE,
             "index 10 out of range [0, 10)");
  int64_t pmin[] = {INT64_MIN};
  assert_err(embps_pull(f->c, "t", pmin, 1, out, T_DIM), f->c, EMBPS_ERANGE,
             "out of range");
  err_check_unchanged(f, &ref, before);
  free(before);
  it_ref_free(&ref);
}

static void test_refuse_count_mismatch(void **state) {
  it_fx_t *f = *state;
  it_ref_t ref;
  err_prepare(f, &ref);
  float *before = it_pull_all(f->c, "t", T_ROWS, T_DIM);
  int fd = it_raw_connect(f->srv[0].port);
  it_raw_hello(fd, NULL, 1);
  uint8_t bulk[3 * 8 + 13 * 4];
  int64_t idx[3] = {1, 2, 3};
  memcpy(bulk, idx, sizeof idx);
  it_fill_values((float *)(bulk + sizeof idx), 13, 4);
  /* 3 indices, dim 4: 12 values needed; send 11, then 13, then none */
  it_raw_push(fd, 2, "t", 3, T_DIM, bulk, 3 * 8 + 11 * 4);
  it_raw_expect_error(fd, 2, EMBPS_ECOUNT, "3 indices");
  it_raw_push(fd, 3, "t", 3, T_DIM, bulk, 3 * 8 + 13 * 4);
  it_raw_expect_error(fd, 3, EMBPS_ECOUNT, "3 indices");
  it_raw_push(fd, 4, "t", 3, T_DIM, bulk, 2 * 8);
  it_raw_expect_error(fd, 4, EMBPS_ECOUNT, "indices");
  /* a pull that says 3 ids but carries 2 */
  it_raw_pull(fd, 5, "t", 3, T_DIM, idx, 2);
  it_raw_expect_error(fd, 5, EMBPS_ECOUNT, "3 ids");
  /* the same connection still serves */
  int64_t ok[] = {9, 1, 1};
  it_raw_pull_check(fd, 6, "t", &ref, ok, 3);
  close(fd);
  err_check_unchanged(f, &ref, before);
  free(before);
  it_ref_free(&ref);
}

static void test_refuse_nonfinite(void **state) {
  it_fx_t *f = *state;
  it_ref_t ref;
  err_prepare(f, &ref);
  float *before = it_pull_all(f->c, "t", T_ROWS, T_DIM);
  int64_t idx[] = {0, 1, 2, 3, 4, 5};
  float v[6 * T_DIM];
  it_fill_values(v, 6 * T_DIM, 5);
  v[2 * T_DIM + 1] = NAN;
  assert_err(embps_push(f->c, "t", idx, 6, v, T_DIM, 0), f->c,
             EMBPS_ENONFINITE, "non-finite");
  it_fill_values(v, 6 * T_DIM, 5);
  v[3 * T_DIM + 2] = INFINITY;
  assert_err(embps_push(f->c, "t", idx, 6, v, T_DIM, 0), f->c,
             EMBPS_ENONFINITE, "non-finite");
  it_fill_values(v, 6 * T_DIM, 5);
  v[5 * T_DIM + 3] = -INFINITY;
  assert_err(embps_push(f->c, "t", idx, 6, v, T_DIM, EMBPS_PUSH_MERGE), f->c,
             EMBPS_ENONFINITE, "non-finite");
  err_check_unchanged(f, &ref, before);
  free(before);
  it_ref_free(&ref);
}

static void test_refuse_table_exists(void **state) {
  it_fx_t *f = *state;
  it_ref_t ref;
  err_prepare(f, &ref);
  float *before = it_pull_all(f->c, "t", T_ROWS, T_DIM);
  embps_table_spec_t s = it_spec("t", T_DIM, T_ROWS, EMBPS_OPT_SGD, 0.5,
                                 EMBPS_INIT_UNIFORM, 0.5, 8);
  assert_err(embps_create_table(f->c, &s), f->c, EMBPS_EEXIST,
             "table \"t\" already exists");
  s.dim = 8;
  s.optimizer = EMBPS_OPT_ADAGRAD;
  assert_err(embps_create_table(f->c, &s), f->c, EMBPS_EEXIST,
             "already exists");
  embps_table_info_t info;
  assert_rc(embps_describe_table(f->c, "t", &info), f->c);
  assert_int_equal(info.spec.dim, T_DIM);
  assert_int_equal(info.spec.optimizer, EMBPS_OPT_SGD);
  err_check_unchanged(f, &ref, before);
  free(before);
  it_ref_free(&ref);
}

/* Server started with --max-frame-bytes 4096. */
static void test_refuse_oversized_frame(void **state) {
  it_fx_t *f = *state;
  const uint32_t dim = 16;
  embps_table_spec_t s = it_spec("big", dim, 1000, EMBPS_OPT_SGD, 0.5,
                                 EMBPS_INIT_UNIFORM, 0.5, 4);
  it_create(f->c, &s);
  it_ref_t ref;
  it_ref_init(&ref, &s);
  int64_t *all = it_xmalloc(1000 * sizeof *all);
  for (int i = 0; i < 1000; i++)
    all[i] = i;
  /* pull in pieces: the reply may be up to 4x the frame limit */
  for (int i = 0; i < 1000; i += 50)
    it_ref_learn_from(&ref, f->c, "big", all + i, 50);
  int64_t idx[100];
  float v[100 * 16];
  for (int i = 0; i < 100; i++)
    idx[i] = (i * 7) % 1000;
  it_fill_values(v, 100 * dim, 6);
  /* a small push (about 1.4 KB) goes through */
  assert_rc(embps_push(f->c, "big", idx, 20, v, dim, 0), f->c);
  it_ref_push(&ref, idx, 20, v);
  /* about 7 KB: refused before sending (the hello announced the limit) */
  assert_err(embps_push(f->c, "big", idx + 10, 90, v, dim, 0), f->c,
             EMBPS_EFRAMESIZE, "max-frame-bytes");
  /* the same client reconnects and serves; nothing was applied */
  for (int i = 0; i < 1000; i += 50)
    it_check_rows(f->c, "big", &ref, all + i, 50, 0, "after an oversized push");
  assert_rc(embps_push(f->c, "big", idx + 50, 10, v, dim, 0), f->c);
  it_ref_push(&ref, idx + 50, 10, v);
  embps_client_t *c2 = it_client_ok(f->srv[0].addr, NULL);
  it_check_rows(c2, "big", &ref, idx, 50, 0, "a new client after the refusal");
  embps_client_destroy(c2);
  /* a raw header announcing 1 GiB: refused before any allocation, with
   * the error addressed to that request */
  int fd = it_raw_connect(f->srv[0].port);
  it_raw_hello(fd, NULL, 1);
  embps_frame_header_t h = {.body_len = 1u << 30, .meta_len = 16,
                            .req_id = 2, .kind = EMBPS_KIND_PUSH};
  uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
  embps_frame_header_encode(&h, hdr);
  assert_int_equal(it_send_full(fd, hdr, sizeof hdr), 0);
  it_raw_expect_error(fd, 2, EMBPS_EFRAMESIZE, "max-frame-bytes");
  close(fd);
  /* a well-framed oversized frame is skipped unread: the connection goes
   * on serving the requests after it */
  fd = it_raw_connect(f->srv[0].port);
  it_raw_hello(fd, NULL, 1);
  h.body_len = 8192;
  h.req_id = 3;
  embps_frame_header_encode(&h, hdr);
  uint8_t *junk = it_xmalloc(8192);
  memset(junk, 0xab, 8192);
  assert_int_equal(it_send_full(fd, hdr, sizeof hdr), 0);
  assert_int_equal(it_send_full(fd, junk, 8192), 0);
  free(junk);
  it_raw_expect_error(fd, 3, EMBPS_EFRAMESIZE, "max-frame-bytes");
  it_raw_hello(fd, NULL, 4);
  close(fd);
  it_check_rows(f->c, "big", &ref, idx, 50, 0, "after a raw oversized frame");
  free(all);
  it_ref_free(&ref);
}

/* A push far above the limit (4 MB, more than the socket buffers hold) must
 * be refused with the same code, not lost in a connection reset. */
static void test_refuse_oversized_frame_large(void **state) {
  it_fx_t *f = *state;
  const uint32_t dim = 64;
  embps_table_spec_t s = it_spec("dd", dim, 0, EMBPS_OPT_SGD, 0.5,
                                 EMBPS_INIT_ZEROS, 0, 4);
  it_create(f->c, &s);
  size_t n = 16000; /* 4.2 MB */
  int64_t *idx = it_xmalloc(n * sizeof *idx);
  float *v = it_xmalloc(n * dim * sizeof *v);
  for (size_t i = 0; i < n; i++)
    idx[i] = (int64_t)i;
  it_fill_values(v, n * dim, 7);
  int push_of_4mb = embps_push(f->c, "dd", idx, n, v, dim, 0);
  free(idx);
  free(v);
  assert_err(push_of_4mb, f->c, EMBPS_EFRAMESIZE, "max-frame-bytes");
  /* nothing applied, and the server still serves this client */
  assert_int_equal(it_rows_allocated(f->c, "dd"), 0);
}

static void test_refuse_garbage(void **state) {
  it_fx_t *f = *state;
  it_ref_t ref;
  err_prepare(f, &ref);
  float *before = it_pull_all(f->c, "t", T_ROWS, T_DIM);
  /* random junk, not starting with a valid header */
  uint8_t junk[4096];
  for (size_t i = 0; i < sizeof junk; i++)
    junk[i] = (uint8_t)rng_mix(i * 3 + 17);
  junk[14] = 0; /* no "EP" magic */
  int fd = it_raw_connect(f->srv[0].port);
  it_send_full(fd, junk, sizeof junk); /* may fail once the server closes */
  assert_true(it_raw_closed(fd, 5000));
  close(fd);
  /* junk after a hello */
  fd = it_raw_connect(f->srv[0].port);
  it_raw_hello(fd, NULL, 1);
  it_send_full(fd, junk, 64);
  assert_true(it_raw_closed(fd, 5000));
  close(fd);
  /* a valid header around a meta that does not decode */
  fd = it_raw_connect(f->srv[0].port);
  uint8_t frame[EMBPS_FRAME_HEADER_LEN + 64];
  embps_frame_header_t h = {.body_len = 64, .meta_len = 64, .req_id = 9,
                            .kind = EMBPS_KIND_HELLO};
  embps_frame_header_encode(&h, frame);
  memset(frame + EMBPS_FRAME_HEADER_LEN, 0xff, 64);
  assert_int_equal(it_send_full(fd, frame, sizeof frame), 0);
  it_raw_expect_error(fd, 9, EMBPS_EPROTO, "decode");
  assert_true(it_raw_closed(fd, 5000));
  close(fd);
  /* after a hello, an unknown kind is refused and the connection serves */
  fd = it_raw_connect(f->srv[0].port);
  it_raw_hello(fd, NULL, 1);
  h.kind = 77;
  h.body_len = h.meta_len = 0;
  h.req_id = 2;
  embps_frame_header_encode(&h, frame);
  assert_int_equal(it_send_full(fd, frame, EMBPS_FRAME_HEADER_LEN), 0);
  it_raw_expect_error(fd, 2, EMBPS_EKIND, "kind 77");
  int64_t ids[] = {4, 0};
  it_raw_pull_check(fd, 3, "t", &ref, ids, 2);
  close(fd);
  err_check_unchanged(f, &ref, before);
  free(before);
  it_ref_free(&ref);
}

static void test_refuse_protocol_version(void **state) {
  it_fx_t *f = *state;
  int fd = it_raw_connect(f->srv[0].port);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.u.hello.version = 99;
  it_raw_send(fd, EMBPS_KIND_HELLO, &m, 41, NULL, 0);
  it_raw_expect_error(fd, 41, EMBPS_EVERSION, "99");
  assert_true(it_raw_closed(fd, 5000));
  close(fd);
  /* the server still serves */
  embps_table_spec_t s = it_spec("v", 2, 4, EMBPS_OPT_SGD, 1, EMBPS_INIT_ZEROS,
                                 0, 0);
  it_create(f->c, &s);
  embps_client_t *c2 = it_client_ok(f->srv[0].addr, NULL);
  assert_int_equal(it_rows_allocated(c2, "v"), 0);
  embps_client_destroy(c2);
}

static void test_refuse_request_before_hello(void **state) {
  it_fx_t *f = *state;
  embps_table_spec_t s = it_spec("h", 2, 4, EMBPS_OPT_SGD, 1, EMBPS_INIT_ZEROS,
                                 0, 0);
  it_create(f->c, &s);
  int fd = it_raw_connect(f->srv[0].port);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  it_raw_send(fd, EMBPS_KIND_STATS, &m, 5, NULL, 0);
  it_raw_expect_error(fd, 5, EMBPS_EAUTH, "hello");
  assert_true(it_raw_closed(fd, 5000));
  close(fd);
  /* a push before hello changes nothing */
  fd = it_raw_connect(f->srv[0].port);
  uint8_t bulk[8 + 2 * 4];
  int64_t one = 1;
  float g[2] = {1, 1};
  memcpy(bulk, &one, 8);
  memcpy(bulk + 8, g, sizeof g);
  it_raw_push(fd, 6, "h", 1, 2, bulk, sizeof bulk);
  it_raw_expect_error(fd, 6, EMBPS_EAUTH, "hello");
  assert_true(it_raw_closed(fd, 5000));
  close(fd);
  assert_int_equal(it_rows_allocated(f->c, "h"), 0);
}

/* Server started with --auth-token-file. */
static void test_auth_token(void **state) {
  it_fx_t *f = *state;
  const char *addr = f->srv[0].addr;
  char err[512];
  int rc;
  embps_client_t *c = it_client_try(addr, NULL, &rc, err, sizeof err);
  assert_null(c);
  if (rc != EMBPS_EAUTH)
    fail_msg("no token: got %s: %s", embps_err_name(rc), err);
  assert_non_null(strstr(err, "auth"));
  c = it_client_try(addr, "s3cret-Token_41", &rc, err, sizeof err);
  assert_null(c);
  if (rc != EMBPS_EAUTH)
    fail_msg("wrong token: got %s: %s", embps_err_name(rc), err);
  c = it_client_try(addr, "s3cret-Token_42x", &rc, err, sizeof err);
  assert_null(c);
  assert_int_equal(rc, EMBPS_EAUTH);
  /* raw: wrong token refused, then the right one works */
  int fd = it_raw_connect(f->srv[0].port);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.u.hello.version = EMBPS_PROTOCOL_VERSION;
  m.u.hello.token_len = 3;
  memcpy(m.u.hello.token, "bad", 3);
  it_raw_send(fd, EMBPS_KIND_HELLO, &m, 1, NULL, 0);
  it_raw_expect_error(fd, 1, EMBPS_EAUTH, "token");
  assert_true(it_raw_closed(fd, 5000));
  close(fd);
  fd = it_raw_connect(f->srv[0].port);
  it_raw_hello(fd, "s3cret-Token_42", 1);
  close(fd);
  /* the right token: everything works */
  c = it_client_ok(addr, "s3cret-Token_42");
  embps_table_spec_t s = it_spec("a", 2, 8, EMBPS_OPT_SGD, 1, EMBPS_INIT_ZEROS,
                                 0, 0);
  it_create(c, &s);
  int64_t idx[] = {3, 3};
  float v[] = {-1, -2, -3, -4};
  assert_rc(embps_push(c, "a", idx, 2, v, 2, 0), c);
  float out[2];
  assert_rc(embps_pull(c, "a", idx, 1, out, 2), c);
  assert_true(out[0] == 4.0f && out[1] == 6.0f);
  embps_client_destroy(c);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  unsetenv("EMBPS_SERVERS");
  unsetenv("EMBPS_TOKEN_FILE");
#define T(f) cmocka_unit_test_setup_teardown(f, it_fx_setup_one, it_fx_teardown)
  const struct CMUnitTest tests[] = {
      T(test_refuse_unknown_table),
      T(test_refuse_wrong_dim),
      T(test_refuse_out_of_range),
      T(test_refuse_count_mismatch),
      T(test_refuse_nonfinite),
      T(test_refuse_table_exists),
      cmocka_unit_test_setup_teardown(test_refuse_oversized_frame,
                                      it_fx_setup_small_frames, it_fx_teardown),
      cmocka_unit_test_setup_teardown(test_refuse_oversized_frame_large,
                                      it_fx_setup_small_frames, it_fx_teardown),
      T(test_refuse_garbage),
      T(test_refuse_protocol_version),
      T(test_refuse_request_before_hello),
      cmocka_unit_test_setup_teardown(test_auth_token, it_fx_setup_auth,
                                      it_fx_teardown),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
