/* test_etcd.c - the etcd v3 gateway client (server/etcd.c) against a real
 * etcd on loopback (etcd_util.h), and against fake endpoints for what a
 * real one will not do on demand (a malformed, oversized or refused
 * answer, an endpoint that accepts and never answers):
 *   - leases: grant, keepalive, revoke; a lease never ends before its TTL
 *     counted from when the request was sent (the premise of fencing,
 *     coord.h), and ends after it once not renewed;
 *   - the campaign transaction: exactly one of two racing clients
 *     creates a key, the other reads the winner's value and lease;
 *     compares over a prefix; ranges and deletes over prefixes;
 *   - watches: events in order, a replay from an old revision, a
 *     compacted start cancelled with its revision, wake-ups, the end of
 *     the stream when etcd dies;
 *   - endpoints: failover past a dead, a refusing, a silent and an
 *     unavailable endpoint within one deadline; every failure named;
 *     etcd killed and restarted (calls fail within the timeout, then
 *     work again with the data kept); a 3-member cluster losing the
 *     member the client talks to. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "etcd.h"
#include "etcd_util.h"
#include "harness.h"

static it_etcd_t etcd; /* shared by the tests that do not kill it */
static char url[256];

static embps_etcd_t *client(const char *u, uint32_t timeout_ms) {
  embps_etcd_t *e;
  char err[256];
  if (embps_etcd_create(u, timeout_ms, &e, err, sizeof err))
    fail_msg("%s", err);
  return e;
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

#define KEY(s) (s), strlen(s)

static void test_urls(void **state) {
  (void)state;
  static const char *bad[] = {"http://127.0.0.1:2379", "etcd://", "etcd://a",
                              "etcd://127.0.0.1:2379,", "etcd://h:0",
                              "etcd://h:99999", "etcd://a/b:1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    embps_etcd_t *e;
    char err[256] = "";
    assert_int_equal(embps_etcd_create(bad[i], 1000, &e, err, sizeof err), -1);
    assert_null(e);
    assert_non_null(strstr(err, bad[i][0] == 'h' ? "etcd://" : "coordinator"));
  }
  embps_etcd_t *e = client("etcd://[::1]:2379,localhost:1,127.0.0.1:2", 1000);
  assert_int_equal(embps_etcd_endpoints(e), 3);
  assert_string_equal(embps_etcd_endpoint(e), "[::1]:2379");
  embps_etcd_destroy(e);
}

static void test_lease_lifecycle(void **state) {
  (void)state;
  embps_etcd_t *e = client(url, 2000);
  int64_t id, ttl;
  assert_int_equal(embps_etcd_lease_grant(e, 1, &id, &ttl), 0);
  assert_true(ttl >= 1); /* etcd may raise it to its minimum */
  embps_etcd_kv_t *kv;
  assert_int_equal(embps_etcd_put(e, KEY("/t/lease/k"), "v", 1, id, NULL), 0);
  embps_etcd_kvs_t kvs;
  assert_int_equal(embps_etcd_range(e, KEY("/t/lease/k"), 0, &kvs), 0);
  assert_int_equal(kvs.n, 1);
  kv = &kvs.v[0];
  assert_true(kv->lease == id);
  assert_string_equal(kv->value, "v");
  embps_etcd_kvs_free(&kvs);
  int64_t ttl2;
  assert_int_equal(embps_etcd_lease_keepalive(e, id, &ttl2), 0);
  assert_true(ttl2 == ttl);
  assert_int_equal(embps_etcd_lease_revoke(e, id), 0);
  assert_int_equal(embps_etcd_range(e, KEY("/t/lease/k"), 0, &kvs), 0);
  assert_int_equal(kvs.n, 0); /* the lease's keys went with it */
  embps_etcd_kvs_free(&kvs);
  assert_int_equal(embps_etcd_lease_keepalive(e, id, &ttl2), -ENOENT);
  assert_non_null(strstr(embps_etcd_error(e), "not found"));
  assert_int_equal(embps_etcd_lease_revoke(e, id), -ENOENT);
  assert_non_null(strstr(embps_etcd_error(e), "lease not found"));
  embps_etcd_destroy(e);
}

/* Polls until key is gone; the time it went, in it_now_ms. */
static double wait_gone(embps_etcd_t *e, const char *key, double limit_ms) {
  const double end = it_now_ms() + limit_ms;
  while (it_now_ms() < end) {
    embps_etcd_kvs_t kvs;
    double t = it_now_ms();
    assert_int_equal(embps_etcd_range(e, KEY(key), 0, &kvs), 0);
    size_t n = kvs.n;
    embps_etcd_kvs_free(&kvs);
    if (!n)
      return t;
    it_sleep_ms(20);
  }
  fail_msg("%s still there after %.0f ms", key, limit_ms);
  return 0;
}

/* The premise of fencing: etcd counts a lease's TTL from when it received
 * the grant or keepalive, after we sent it, so a holder measuring from
 * the moment it sent is never late. And a lease not renewed does end. */
static void test_lease_not_early(void **state) {
  (void)state;
  embps_etcd_t *e = client(url, 2000);
  int64_t id, ttl;
  double sent = it_now_ms();
  assert_int_equal(embps_etcd_lease_grant(e, 2, &id, &ttl), 0);
  assert_int_equal(ttl, 2);
  assert_int_equal(embps_etcd_put(e, KEY("/t/early/k"), "v", 1, id, NULL), 0);
  it_sleep_ms(1200);
  sent = it_now_ms();
  assert_int_equal(embps_etcd_lease_keepalive(e, id, &ttl), 0);
  double gone = wait_gone(e, "/t/early/k", 8000);
  fprintf(stderr, "lease of 2 s renewed: key gone %.0f ms after the renewal "
          "was sent\n", gone - sent);
  assert_true(gone - sent >= 2000);
  assert_true(gone - sent < 2000 + 3000);
  embps_etcd_destroy(e);
}

static void test_keepalive_holds(void **state) {
  (void)state;
  embps_etcd_t *e = client(url, 2000);
  int64_t id, ttl;
  assert_int_equal(embps_etcd_lease_grant(e, 2, &id, &ttl), 0);
  assert_int_equal(embps_etcd_put(e, KEY("/t/hold/k"), "v", 1, id, NULL), 0);
  const double end = it_now_ms() + 3500;
  while (it_now_ms() < end) {
    assert_int_equal(embps_etcd_lease_keepalive(e, id, &ttl), 0);
    it_sleep_ms(500);
  }
  embps_etcd_kvs_t kvs;
  assert_int_equal(embps_etcd_range(e, KEY("/t/hold/k"), 0, &kvs), 0);
  assert_int_equal(kvs.n, 1);
  embps_etcd_kvs_free(&kvs);
  assert_int_equal(embps_etcd_lease_revoke(e, id), 0);
  embps_etcd_destroy(e);
}

static void test_create_or_get(void **state) {
  (void)state;
  embps_etcd_t *e = client(url, 2000);
  int64_t a, b, ttl;
  assert_int_equal(embps_etcd_lease_grant(e, 10, &a, &ttl), 0);
  assert_int_equal(embps_etcd_lease_grant(e, 10, &b, &ttl), 0);
  int created;
  embps_etcd_kvs_t kvs;
  assert_int_equal(embps_etcd_create_or_get(e, KEY("/t/cog"), "A", 1, a,
                                            &created, &kvs), 0);
  assert_true(created);
  assert_int_equal(kvs.n, 0);
  int64_t rev = kvs.revision;
  embps_etcd_kvs_free(&kvs);
  assert_int_equal(embps_etcd_create_or_get(e, KEY("/t/cog"), "B", 1, b,
                                            &created, &kvs), 0);
  assert_false(created);
  assert_int_equal(kvs.n, 1);
  assert_string_equal(kvs.v[0].value, "A");
  assert_true(kvs.v[0].lease == a);
  assert_true(kvs.v[0].create_rev == rev); /* created by the first */
  embps_etcd_kvs_free(&kvs);
  embps_etcd_lease_revoke(e, a);
  embps_etcd_lease_revoke(e, b);
  embps_etcd_destroy(e);
}

/* Two clients race for the same keys: each key has exactly one creator,
 * and the other reads the creator's value and lease. */
#define RACES 40
typedef struct {
  int who;
  int64_t lease;
  int won[RACES];
  char seen[RACES][8];
  int64_t seen_lease[RACES];
} racer_t;
static pthread_barrier_t race_barrier;

static void *race(void *arg) {
  racer_t *r = arg;
  embps_etcd_t *e = client(url, 3000);
  char me[8];
  snprintf(me, sizeof me, "r%d", r->who);
  for (int i = 0; i < RACES; i++) {
    char key[64];
    snprintf(key, sizeof key, "/t/race/%d", i);
    embps_etcd_kvs_t kvs;
    pthread_barrier_wait(&race_barrier);
    int rc = embps_etcd_create_or_get(e, KEY(key), me, strlen(me), r->lease,
                                      &r->won[i], &kvs);
    if (rc)
      fail_msg("%s", embps_etcd_error(e));
    if (!r->won[i]) {
      snprintf(r->seen[i], sizeof r->seen[i], "%s", kvs.v[0].value);
      r->seen_lease[i] = kvs.v[0].lease;
    }
    embps_etcd_kvs_free(&kvs);
  }
  embps_etcd_destroy(e);
  return NULL;
}

static void test_txn_race(void **state) {
  (void)state;
  embps_etcd_t *e = client(url, 2000);
  static racer_t r[2];
  int64_t ttl;
  pthread_barrier_init(&race_barrier, NULL, 2);
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    r[i].who = i;
    assert_int_equal(embps_etcd_lease_grant(e, 30, &r[i].lease, &ttl), 0);
    pthread_create(&th[i], NULL, race, &r[i]);
  }
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&race_barrier);
  int wins[2] = {0, 0};
  for (int i = 0; i < RACES; i++) {
    assert_int_equal(r[0].won[i] + r[1].won[i], 1);
    int w = r[0].won[i] ? 0 : 1, l = 1 - w;
    wins[w]++;
    char want[8];
    snprintf(want, sizeof want, "r%d", w);
    assert_string_equal(r[l].seen[i], want);
    assert_true(r[l].seen_lease[i] == r[w].lease);
  }
  fprintf(stderr, "races won: %d and %d\n", wins[0], wins[1]);
  for (int i = 0; i < 2; i++)
    embps_etcd_lease_revoke(e, r[i].lease);
  embps_etcd_destroy(e);
}

static void test_txn_compares(void **state) {
  (void)state;
  embps_etcd_t *e = client(url, 2000);
  int64_t rev;
  assert_int_equal(embps_etcd_put(e, KEY("/t/cmp/c/a"), "1", 1, 0, &rev), 0);
  /* no key under the prefix changed after rev: holds */
  embps_etcd_cmp_t cmp[2] = {
      {.key = "/t/cmp/c/", .key_len = 9, .prefix = 1, .target = EMBPS_ETCD_MOD,
       .result = EMBPS_ETCD_LESS, .number = rev + 1},
      {.key = "/t/cmp/x", .key_len = 8, .target = EMBPS_ETCD_VERSION,
       .result = EMBPS_ETCD_EQUAL, .number = 0}};
  embps_etcd_op_t then[2] = {
      {.kind = EMBPS_ETCD_OP_PUT, .key = "/t/cmp/x", .key_len = 8,
       .value = "then", .value_len = 4},
      {.kind = EMBPS_ETCD_OP_RANGE, .key = "/t/cmp/c/", .key_len = 9,
       .prefix = 1}};
  embps_etcd_op_t otherwise[1] = {
      {.kind = EMBPS_ETCD_OP_RANGE, .key = "/t/cmp/", .key_len = 7,
       .prefix = 1}};
  int ok;
  embps_etcd_kvs_t kvs;
  assert_int_equal(embps_etcd_txn(e, cmp, 2, then, 2, otherwise, 1, &ok, &kvs), 0);
  assert_true(ok);
  assert_int_equal(kvs.n, 1);
  assert_string_equal(kvs.v[0].key, "/t/cmp/c/a");
  embps_etcd_kvs_free(&kvs);
  /* a new key under the prefix: the compare fails, the else branch runs */
  assert_int_equal(embps_etcd_put(e, KEY("/t/cmp/c/b"), "2", 1, 0, NULL), 0);
  cmp[1].number = 1; /* x exists now, once */
  assert_int_equal(embps_etcd_txn(e, cmp, 2, then, 2, otherwise, 1, &ok, &kvs), 0);
  assert_false(ok);
  assert_int_equal(kvs.n, 3); /* c/a c/b x, in key order */
  assert_string_equal(kvs.v[2].key, "/t/cmp/x");
  assert_string_equal(kvs.v[2].value, "then");
  embps_etcd_kvs_free(&kvs);
  /* bounds refused before anything is sent */
  static char big[EMBPS_ETCD_VALUE_MAX + 1];
  assert_int_equal(embps_etcd_put(e, KEY("/t/big"), big, sizeof big, 0, NULL),
                   -EMSGSIZE);
  assert_non_null(strstr(embps_etcd_error(e), "value of"));
  assert_int_equal(embps_etcd_put(e, "", 0, "v", 1, 0, NULL), -EMSGSIZE);
  embps_etcd_op_t many[EMBPS_ETCD_TXN_MAX + 1];
  for (int i = 0; i <= EMBPS_ETCD_TXN_MAX; i++)
    many[i] = then[1];
  assert_int_equal(embps_etcd_txn(e, NULL, 0, many, EMBPS_ETCD_TXN_MAX + 1,
                                  NULL, 0, &ok, NULL), -EINVAL);
  embps_etcd_destroy(e);
}

static void test_range_delete_prefix(void **state) {
  (void)state;
  embps_etcd_t *e = client(url, 2000);
  const char *keys[] = {"/t/p/a/1", "/t/p/a/2", "/t/p/b/1", "/t/p/a"};
  for (int i = 0; i < 4; i++)
    assert_int_equal(embps_etcd_put(e, KEY(keys[i]), keys[i], strlen(keys[i]),
                                    0, NULL), 0);
  embps_etcd_kvs_t kvs;
  assert_int_equal(embps_etcd_range(e, KEY("/t/p/a/"), 1, &kvs), 0);
  assert_int_equal(kvs.n, 2);
  assert_string_equal(kvs.v[0].key, "/t/p/a/1");
  assert_string_equal(kvs.v[1].value, "/t/p/a/2");
  assert_true(kvs.revision > 0);
  assert_false(kvs.more);
  embps_etcd_kvs_free(&kvs);
  int64_t n;
  assert_int_equal(embps_etcd_delete(e, KEY("/t/p/a/"), 1, &n), 0);
  assert_int_equal(n, 2);
  assert_int_equal(embps_etcd_delete(e, KEY("/t/p/zzz"), 0, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(embps_etcd_range(e, KEY("/t/p/"), 1, &kvs), 0);
  assert_int_equal(kvs.n, 2);
  embps_etcd_kvs_free(&kvs);
  uint8_t end[4];
  size_t len;
  embps_etcd_prefix_end("a\xff\xff", 3, end, &len);
  assert_int_equal(len, 1);
  assert_int_equal(end[0], 'b');
  embps_etcd_prefix_end("\xff", 1, end, &len);
  assert_int_equal(len, 1);
  assert_int_equal(end[0], 0);
  embps_etcd_destroy(e);
}

static void *wake_later(void *arg) {
  it_sleep_ms(300);
  embps_etcd_watch_wakeup(arg);
  return NULL;
}

static void test_watch(void **state) {
  (void)state;
  embps_etcd_t *e = client(url, 2000);
  int64_t rev;
  assert_int_equal(embps_etcd_put(e, KEY("/t/w/old"), "o", 1, 0, &rev), 0);
  embps_etcd_watch_t *w;
  assert_int_equal(embps_etcd_watch_open(e, KEY("/t/w/"), 1, rev + 1, &w), 0);
  assert_int_equal(embps_etcd_put(e, KEY("/t/w/a"), "1", 1, 0, NULL), 0);
  assert_int_equal(embps_etcd_put(e, KEY("/t/w/a"), "2", 1, 0, NULL), 0);
  assert_int_equal(embps_etcd_put(e, KEY("/t/other"), "x", 1, 0, NULL), 0);
  assert_int_equal(embps_etcd_delete(e, KEY("/t/w/a"), 0, NULL), 0);
  embps_etcd_event_t ev;
  const char *want[] = {"1", "2", NULL};
  int64_t last = rev;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(embps_etcd_watch_next(w, 5000, &ev), 1);
    assert_string_equal(ev.kv.key, "/t/w/a");
    assert_int_equal(ev.kind, want[i] ? EMBPS_ETCD_EV_PUT : EMBPS_ETCD_EV_DELETE);
    if (want[i])
      assert_string_equal(ev.kv.value, want[i]);
    assert_true(ev.kv.mod_rev > last);
    last = ev.kv.mod_rev;
    embps_etcd_event_free(&ev);
  }
  double t = it_now_ms();
  assert_int_equal(embps_etcd_watch_next(w, 200, &ev), 0);
  assert_true(it_now_ms() - t >= 190);
  pthread_t th;
  pthread_create(&th, NULL, wake_later, w);
  t = it_now_ms();
  assert_int_equal(embps_etcd_watch_next(w, 10000, &ev), 0);
  assert_true(it_now_ms() - t < 5000);
  pthread_join(th, NULL);
  embps_etcd_watch_close(w);

  /* a replay from an old revision */
  assert_int_equal(embps_etcd_watch_open(e, KEY("/t/w/"), 1, rev, &w), 0);
  assert_int_equal(embps_etcd_watch_next(w, 5000, &ev), 1);
  assert_string_equal(ev.kv.key, "/t/w/old");
  assert_true(ev.kv.mod_rev == rev);
  embps_etcd_event_free(&ev);
  embps_etcd_watch_close(w);

  /* compacted: cancelled, naming the compact revision */
  CURL *c = curl_easy_init();
  char body[64], curl_url[96];
  snprintf(body, sizeof body, "{\"revision\":\"%lld\"}", (long long)last);
  snprintf(curl_url, sizeof curl_url, "http://127.0.0.1:%d/v3/kv/compaction",
           etcd.client_port);
  curl_easy_setopt(c, CURLOPT_URL, curl_url);
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
  FILE *devnull = fopen("/dev/null", "w");
  curl_easy_setopt(c, CURLOPT_WRITEDATA, devnull);
  assert_int_equal(curl_easy_perform(c), CURLE_OK);
  fclose(devnull);
  curl_easy_cleanup(c);
  int rc = embps_etcd_watch_open(e, KEY("/t/w/"), 1, rev, &w);
  if (rc == 0) { /* confirmed, then cancelled */
    assert_int_equal(embps_etcd_watch_next(w, 5000, &ev), -ECANCELED);
    assert_true(embps_etcd_watch_compacted(w) == last);
    assert_non_null(strstr(embps_etcd_watch_error(w), "compacted"));
    embps_etcd_watch_close(w);
  } else {
    assert_int_equal(rc, -ECANCELED);
    assert_non_null(strstr(embps_etcd_error(e), "compacted"));
  }
  embps_etcd_destroy(e);
}

/* ---- fake endpoints ---- */

typedef struct {
  int fd, port;
  const char *reply; /* whole HTTP response; NULL: accept, never answer */
  size_t reply_len;
  pthread_t th;
  atomic_int stop;
} fake_t;

static void *fake_run(void *arg) {
  fake_t *f = arg;
  while (!atomic_load(&f->stop)) {
    int c = accept(f->fd, NULL, NULL);
    if (c < 0)
      break;
    char buf[65536];
    size_t len = 0;
    /* the request: headers, then Content-Length bytes */
    for (;;) {
      ssize_t k = recv(c, buf + len, sizeof buf - 1 - len, 0);
      if (k <= 0)
        break;
      len += (size_t)k;
      buf[len] = 0;
      char *end = strstr(buf, "\r\n\r\n");
      char *cl = strstr(buf, "Content-Length:");
      if (end && (!cl || (size_t)(end + 4 - buf) + (size_t)atol(cl + 15) <= len))
        break;
    }
    if (f->reply) {
      it_send_full(c, f->reply, f->reply_len);
      close(c);
    } else {
      while (!atomic_load(&f->stop)) /* never answer */
        it_sleep_ms(20);
      close(c);
    }
  }
  return NULL;
}

static void fake_start(fake_t *f, const char *reply, size_t len) {
  memset(f, 0, sizeof *f);
  f->reply = reply;
  f->reply_len = len;
  f->fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  assert_int_equal(bind(f->fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(f->fd, 16), 0);
  getsockname(f->fd, (struct sockaddr *)&a, &al);
  f->port = ntohs(a.sin_port);
  pthread_create(&f->th, NULL, fake_run, f);
}

static void fake_stop(fake_t *f) {
  atomic_store(&f->stop, 1);
  shutdown(f->fd, SHUT_RDWR);
  pthread_join(f->th, NULL);
  close(f->fd);
}

static char *http(const char *status, const char *body, size_t *len) {
  size_t n = strlen(body) + 256;
  char *r = malloc(n);
  *len = (size_t)snprintf(r, n, "HTTP/1.1 %s\r\nContent-Type: application/json"
                          "\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                          status, strlen(body), body);
  return r;
}

static void test_failover(void **state) {
  (void)state;
  const int dead = it_free_port();
  char u[512];
  /* a dead endpoint first: refused, the next one answers */
  snprintf(u, sizeof u, "etcd://127.0.0.1:%d,127.0.0.1:%d", dead,
           etcd.client_port);
  embps_etcd_t *e = client(u, 2000);
  embps_etcd_kvs_t kvs;
  assert_int_equal(embps_etcd_range(e, KEY("/t/none"), 0, &kvs), 0);
  embps_etcd_kvs_free(&kvs);
  char live[32];
  snprintf(live, sizeof live, "127.0.0.1:%d", etcd.client_port);
  assert_string_equal(embps_etcd_endpoint(e), live);
  embps_etcd_destroy(e);

  /* every endpoint dead: each named, within the deadline */
  const int dead2 = it_free_port();
  snprintf(u, sizeof u, "etcd://127.0.0.1:%d,127.0.0.1:%d", dead, dead2);
  e = client(u, 500);
  double t = it_now_ms();
  int rc = embps_etcd_range(e, KEY("/t/none"), 0, &kvs);
  assert_int_equal(rc, -ECONNREFUSED);
  assert_true(it_now_ms() - t < 1500);
  const char *msg = embps_etcd_error(e);
  assert_non_null(strstr(msg, "no etcd endpoint answered"));
  char name[2][32];
  snprintf(name[0], sizeof name[0], "127.0.0.1:%d: ", dead);
  snprintf(name[1], sizeof name[1], "127.0.0.1:%d: ", dead2);
  assert_non_null(strstr(msg, name[0])); /* each named, with its cause */
  assert_non_null(strstr(msg, name[1]));
  embps_etcd_destroy(e);

  /* silent (accepts, never answers), then unavailable (503), then etcd */
  fake_t silent, unavailable;
  size_t n503;
  char *r503 = http("503 Service Unavailable",
                    "{\"error\":\"etcdserver: no leader\",\"message\":"
                    "\"etcdserver: no leader\",\"code\":14}", &n503);
  fake_start(&silent, NULL, 0);
  fake_start(&unavailable, r503, n503);
  snprintf(u, sizeof u, "etcd://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d",
           silent.port, unavailable.port, etcd.client_port);
  e = client(u, 1500);
  t = it_now_ms();
  assert_int_equal(embps_etcd_range(e, KEY("/t/none"), 0, &kvs), 0);
  embps_etcd_kvs_free(&kvs);
  assert_true(it_now_ms() - t < 1500);
  assert_string_equal(embps_etcd_endpoint(e), live);
  embps_etcd_destroy(e);
  /* the two alone: both failures named, the no-leader message kept */
  snprintf(u, sizeof u, "etcd://127.0.0.1:%d,127.0.0.1:%d", silent.port,
           unavailable.port);
  e = client(u, 600);
  rc = embps_etcd_range(e, KEY("/t/none"), 0, &kvs);
  assert_true(rc == -EHOSTUNREACH || rc == -ETIMEDOUT);
  assert_non_null(strstr(embps_etcd_error(e), "no leader"));
  assert_non_null(strstr(embps_etcd_error(e), "within 600 ms"));
  embps_etcd_destroy(e);
  fake_stop(&silent);
  fake_stop(&unavailable);
  free(r503);
}

/* Answers that are not etcd's, or too large: refused with their cause. */
static void test_bad_answers(void **state) {
  (void)state;
  static const struct {
    const char *status, *body;
    int rc;
    const char *msg;
  } cases[] = {
      {"200 OK", "<html>hello</html>", -EPROTO, "not etcd's v3 JSON"},
      {"404 Not Found", "Not Found", -EPROTO, "HTTP 404"},
      {"200 OK", "{\"kvs\":{}}", -EPROTO, "kvs is not an array"},
      {"200 OK", "{\"kvs\":[{\"key\":\"not base64!\"}]}", -EPROTO, "base64"},
      {"200 OK", "{\"kvs\":[{\"key\":\"YQ==\",\"mod_revision\":\"x\"}]}",
       -EPROTO, "not an integer"},
      {"400 Bad Request", "{\"error\":\"etcdserver: mvcc: required revision "
       "has been compacted\",\"message\":\"etcdserver: mvcc: required revision "
       "has been compacted\",\"code\":11}", -ERANGE, "compacted"},
      {"500 Internal Server Error", "{\"error\":\"etcdserver: mvcc: database "
       "space exceeded\",\"code\":8}", -ENOSPC, "space exceeded"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t n;
    char *r = http(cases[i].status, cases[i].body, &n);
    fake_t f;
    fake_start(&f, r, n);
    char u[64];
    snprintf(u, sizeof u, "etcd://127.0.0.1:%d", f.port);
    embps_etcd_t *e = client(u, 1000);
    embps_etcd_kvs_t kvs;
    int rc = embps_etcd_range(e, KEY("/k"), 0, &kvs);
    if (rc != cases[i].rc || !strstr(embps_etcd_error(e), cases[i].msg))
      fail_msg("case %zu: rc %d, '%s'", i, rc, embps_etcd_error(e));
    assert_non_null(strstr(embps_etcd_error(e), u + 7)); /* names it */
    embps_etcd_destroy(e);
    fake_stop(&f);
    free(r);
  }
  /* a response past EMBPS_ETCD_REPLY_MAX: cut, not buffered */
  size_t big = EMBPS_ETCD_REPLY_MAX + 4096;
  char *body = malloc(big + 1);
  memset(body, ' ', big);
  body[0] = '{';
  body[big - 1] = '}';
  body[big] = 0;
  size_t n;
  char *r = http("200 OK", body, &n);
  fake_t f;
  fake_start(&f, r, n);
  char u[64];
  snprintf(u, sizeof u, "etcd://127.0.0.1:%d", f.port);
  embps_etcd_t *e = client(u, 3000);
  embps_etcd_kvs_t kvs;
  assert_int_equal(embps_etcd_range(e, KEY("/k"), 0, &kvs), -EMSGSIZE);
  assert_non_null(strstr(embps_etcd_error(e), "larger than"));
  embps_etcd_destroy(e);
  fake_stop(&f);
  free(r);
  /* a value past EMBPS_ETCD_VALUE_MAX in a well-formed answer */
  size_t vlen = (EMBPS_ETCD_VALUE_MAX + 3) / 3 * 4 + 8;
  char *kv = malloc(vlen + 128);
  int k = snprintf(kv, vlen + 128, "{\"kvs\":[{\"key\":\"YQ==\",\"value\":\"");
  memset(kv + k, 'A', vlen);
  snprintf(kv + k + vlen, 128, "\"}]}");
  r = http("200 OK", kv, &n);
  fake_start(&f, r, n);
  snprintf(u, sizeof u, "etcd://127.0.0.1:%d", f.port);
  e = client(u, 3000);
  assert_int_equal(embps_etcd_range(e, KEY("/k"), 0, &kvs), -EMSGSIZE);
  assert_non_null(strstr(embps_etcd_error(e), "value"));
  embps_etcd_destroy(e);
  fake_stop(&f);
  free(r);
  free(kv);
  free(body);
}

/* etcd killed: calls fail within the timeout naming it, a watch ends;
 * restarted on the same data: calls work, the data is there, a watch
 * opened from the last revision seen misses nothing. */
static void test_kill_restart(void **state) {
  (void)state;
  it_etcd_t m;
  char u[128];
  assert_int_equal(it_etcd_start(&m, 1, u, sizeof u), 0);
  embps_etcd_t *e = client(u, 500);
  int64_t rev;
  assert_int_equal(embps_etcd_put(e, KEY("/k/kept"), "v", 1, 0, &rev), 0);
  embps_etcd_watch_t *w;
  assert_int_equal(embps_etcd_watch_open(e, KEY("/k/"), 1, rev + 1, &w), 0);
  it_etcd_kill(&m);
  embps_etcd_event_t ev;
  double t = it_now_ms();
  int rc = embps_etcd_watch_next(w, 5000, &ev);
  assert_true(rc < 0);
  assert_true(it_now_ms() - t < 3000);
  fprintf(stderr, "watch ended: %s\n", embps_etcd_watch_error(w));
  embps_etcd_watch_close(w);
  embps_etcd_kvs_t kvs;
  t = it_now_ms();
  assert_true(embps_etcd_range(e, KEY("/k/kept"), 0, &kvs) < 0);
  assert_true(it_now_ms() - t < 1000);
  assert_non_null(strstr(embps_etcd_error(e), u + 7));
  int64_t id, ttl;
  assert_true(embps_etcd_lease_grant(e, 5, &id, &ttl) < 0);
  assert_int_equal(it_etcd_restart(&m, 1), 0);
  assert_int_equal(embps_etcd_range(e, KEY("/k/kept"), 0, &kvs), 0);
  assert_int_equal(kvs.n, 1);
  embps_etcd_kvs_free(&kvs);
  assert_int_equal(embps_etcd_watch_open(e, KEY("/k/"), 1, rev + 1, &w), 0);
  assert_int_equal(embps_etcd_put(e, KEY("/k/new"), "n", 1, 0, NULL), 0);
  assert_int_equal(embps_etcd_watch_next(w, 5000, &ev), 1);
  assert_string_equal(ev.kv.key, "/k/new");
  embps_etcd_event_free(&ev);
  embps_etcd_watch_close(w);
  embps_etcd_destroy(e);
  it_etcd_destroy(&m, 1);
}

/* A 3-member cluster: the member the client uses dies; calls, leases and
 * watches go on through the others. */
static void test_cluster_member_lost(void **state) {
  (void)state;
  it_etcd_t m[3];
  char u[256];
  assert_int_equal(it_etcd_start(m, 3, u, sizeof u), 0);
  embps_etcd_t *e = client(u, 1500);
  int64_t id, ttl;
  assert_int_equal(embps_etcd_lease_grant(e, 5, &id, &ttl), 0);
  assert_int_equal(embps_etcd_put(e, KEY("/c/k"), "1", 1, id, NULL), 0);
  int used = -1;
  for (int i = 0; i < 3; i++) {
    char name[32];
    snprintf(name, sizeof name, "127.0.0.1:%d", m[i].client_port);
    if (!strcmp(name, embps_etcd_endpoint(e)))
      used = i;
  }
  assert_true(used >= 0);
  it_etcd_kill(&m[used]);
  /* the survivors may need an election if it led: retry within 10 s */
  double end = it_now_ms() + 10000;
  int rc;
  while ((rc = embps_etcd_lease_keepalive(e, id, &ttl)) && it_now_ms() < end)
    it_sleep_ms(100);
  assert_int_equal(rc, 0);
  assert_int_equal(embps_etcd_put(e, KEY("/c/k"), "2", 1, id, NULL), 0);
  embps_etcd_kvs_t kvs;
  assert_int_equal(embps_etcd_range(e, KEY("/c/k"), 0, &kvs), 0);
  assert_string_equal(kvs.v[0].value, "2");
  embps_etcd_kvs_free(&kvs);
  assert_string_not_equal(embps_etcd_endpoint(e), "");
  fprintf(stderr, "member %d lost; now on %s\n", used, embps_etcd_endpoint(e));
  embps_etcd_destroy(e);
  it_etcd_destroy(m, 3);
}

int main(void) {
  const struct CMUnitTest shared[] = {
      cmocka_unit_test(test_urls),
      cmocka_unit_test(test_lease_lifecycle),
      cmocka_unit_test(test_lease_not_early),
      cmocka_unit_test(test_keepalive_holds),
      cmocka_unit_test(test_create_or_get),
      cmocka_unit_test(test_txn_race),
      cmocka_unit_test(test_txn_compares),
      cmocka_unit_test(test_range_delete_prefix),
      cmocka_unit_test(test_watch),
      cmocka_unit_test(test_failover),
      cmocka_unit_test(test_bad_answers),
  };
  const struct CMUnitTest own[] = {
      cmocka_unit_test(test_kill_restart),
      cmocka_unit_test(test_cluster_member_lost),
  };
  int failed = cmocka_run_group_tests_name("etcd", shared, group_setup,
                                           group_teardown);
  failed += cmocka_run_group_tests_name("etcd-own", own, NULL, NULL);
  return failed;
}
