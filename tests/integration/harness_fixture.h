/* harness_fixture.h - the cmocka fixture and library helpers shared by the
 * integration programs that drive real servers through libembps
 * (test_values.c, test_refusals.c, test_protocol.c, test_cluster.c,
 * test_concurrency.c, test_shutdown.c).
 *
 * A fixture (it_fx_t) holds up to IT_FX_MAX_SRV servers started by
 * harness.c and one client. Each it_fx_setup_* starts its servers in a
 * test's setup; it_fx_teardown stops every server still running with
 * SIGTERM, which must end each with exit status 0, and fails the test
 * otherwise. The helpers fail the running test (cmocka's fail_msg) with
 * the library's message instead of returning an error.
 *
 * Gradients come from it_grad_value: multiples of 1/64 in [-4, 4], never
 * 0, so sums of a few of them are exact in float and SGD results can be
 * compared bit for bit. */
#ifndef EMBPS_TEST_HARNESS_FIXTURE_H
#define EMBPS_TEST_HARNESS_FIXTURE_H
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "embps/embps.h"
#include "harness.h"
#include "rng.h"

#define IT_TIMEOUT_MS 15000 /* the clients' timeout */
#define IT_FX_MAX_SRV 4

typedef struct {
  it_server_t srv[IT_FX_MAX_SRV];
  embps_client_t *c; /* on srv[0] (both servers for it_fx_setup_two) */
  char token_file[128];
} it_fx_t;

/* "--io-threads 2 --shards 4": the servers it_fx_setup_one starts. */
extern const char *const it_fx_default_args[];

/* cmocka setups: one default server and a client on it; the same with
 * --max-frame-bytes 4096; one server with --auth-token-file holding
 * "s3cret-Token_42" and no client; a cluster of two (3 and 5 shards) and
 * a client on both. */
int it_fx_setup_one(void **state);
int it_fx_setup_small_frames(void **state);
int it_fx_setup_auth(void **state);
int it_fx_setup_two(void **state);
/* Stops every server still running; each must exit 0 on SIGTERM. */
int it_fx_teardown(void **state);
/* Starts a server in slot (args NULL: it_fx_default_args) or fails. */
void it_fx_start(it_fx_t *f, int slot, const char *const *args);

/* A client on servers ("a,b") with token (may be NULL); NULL with *rc and
 * err when it cannot connect. */
embps_client_t *it_client_try(const char *servers, const char *token,
                              int *rc, char *err, size_t err_len);
/* The same, failing the test when it cannot connect. */
embps_client_t *it_client_ok(const char *servers, const char *token);

/* A counter of server 0's stats, as an offset for it_stat and
 * it_stat_wait: IT_STAT(connections), IT_STAT(bytes_in), ... */
#define IT_STAT(field) offsetof(embps_server_stats_t, field)
/* The uint64_t counter at offset `field` of server 0's stats through c
 * (one STATS request, itself counted in `requests`). */
uint64_t it_stat(embps_client_t *c, size_t field);
/* Polls it_stat (every 2 ms) until lo <= value <= hi and returns the value;
 * fails the test, naming `what`, if that takes more than timeout_ms. */
uint64_t it_stat_wait(embps_client_t *c, size_t field, uint64_t lo,
                      uint64_t hi, int timeout_ms, const char *what);

/* The call must return 0. */
#define assert_rc(expr, c)                                                     \
  do {                                                                         \
    int rc_ = (expr);                                                          \
    if (rc_ != 0)                                                              \
      fail_msg("%s failed: %s (%d): %s", #expr, embps_err_name(rc_), rc_,      \
               embps_client_last_error(c));                                    \
  } while (0)

/* The call must fail with `code` and a message containing `substr`. */
#define assert_err(expr, c, code, substr)                                      \
  do {                                                                         \
    int rc_ = (expr);                                                          \
    const char *msg_ = embps_client_last_error(c);                             \
    if (rc_ != (code))                                                         \
      fail_msg("%s: got %s (%d), want %s; message: %s", #expr,                 \
               embps_err_name(rc_), rc_, embps_err_name(code), msg_);          \
    if (!strstr(msg_, (substr)))                                               \
      fail_msg("%s: message \"%s\" does not name the problem (\"%s\")",       \
               #expr, msg_, (substr));                                         \
  } while (0)

void *it_xmalloc(size_t n);
/* A gradient value: a multiple of 1/64 in [-4, 4], never 0. */
float it_grad_value(uint64_t h);
/* v[i] = it_grad_value(rng_mix(seed + i)). */
void it_fill_values(float *v, size_t n, uint64_t seed);

/* A table spec: rows 0 makes it dynamic. */
embps_table_spec_t it_spec(const char *name, uint32_t dim, uint64_t rows,
                           embps_optimizer_t opt, double lr,
                           embps_init_t init, double init_v, uint64_t seed);
void it_create(embps_client_t *c, const embps_table_spec_t *s);
/* The rows of ids (malloc'd, n * dim floats), or the test fails. */
float *it_pull_ids(embps_client_t *c, const char *table, const int64_t *ids,
                   size_t n, uint32_t dim);
/* Rows 0..rows-1. */
float *it_pull_all(embps_client_t *c, const char *table, uint64_t rows,
                   uint32_t dim);
uint64_t it_rows_allocated(embps_client_t *c, const char *table);
/* Compares n floats; rel_tol 0 means bit for bit. */
void it_assert_floats(const float *got, const float *want, size_t n,
                      double rel_tol, const char *what);
#endif
