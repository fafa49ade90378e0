/* test_eligible.c - who may be elected (issue 22): a coordinated follower
 * whose primary no longer holds its next record takes a copy of the
 * primary's state (copy.h), and until that copy is in and caught up its
 * tables are older than its history says: it must not be elected.
 *
 * Two servers of member 0 against a real etcd on loopback (etcd_util.h):
 * A, memory only with a replication backlog of 1 MiB, advertising a proxy
 * in front of it (proxy.h), so its follower B (a data dir, its history
 * A's epoch) reaches it through the proxy. B is killed, A takes 3 MiB of
 * pushes (its backlog no longer holds B's next record), and B starts
 * again: it must copy, and the proxy holds its copy's first SNAPSHOT_READ
 * (nothing reaches A: the copy cannot end, whatever the timing).
 *
 *   test_eligible hold      A is killed while B's copy is held: B says it
 *       is not eligible, and after a whole election round and its
 *       give-up (B asks itself again) no one is primary.
 *   test_eligible release   the hold lifted: B's copy goes in, B catches
 *       up (and says it is eligible again), A is killed: B is elected and
 *       holds A's rows.
 *   test_eligible restart   A has a data dir too (--repl-retain-ms 1000,
 *       a checkpoint once B is away: its log no longer holds B's next
 *       record either). B is killed -9 while its copy is held (its data
 *       dir holds COPYING), then A: B started again alone must not be
 *       elected (its tables are its old ones). A started again is
 *       elected, B copies it and says it is eligible again (COPYING
 *       gone), A is killed: B is elected with A's rows. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include "dur_util.h"
#include "etcd_util.h"
#include "frame.h" /* EMBPS_KIND_SNAPSHOT_READ */
#include "proxy.h"
#include "repl_util.h"
#include "wire.h" /* EMBPS_ROLE_* */

#define LEASE_MS 2000
#define ROWS 4096
#define DIM 64 /* a whole push: a record of 1 MiB */

static char etcd_url[256];
static it_etcd_t etcd;

/* A coordinated server of member 0 of cluster name; more: flags after. */
static int start(dur_server_t *s, const char *name, const char *const *more) {
  int i = 0;
  s->args[i++] = "--coordinator";
  s->args[i++] = etcd_url;
  s->args[i++] = "--cluster-name";
  s->args[i++] = name;
  s->args[i++] = "--lease-ms";
  s->args[i++] = "2000";
  s->args[i++] = "--shards";
  s->args[i++] = "4";
  for (; more && *more; more++)
    s->args[i++] = *more;
  s->args[i] = NULL;
  int rc = dur_server_start(s, 30000);
  if (rc) {
    dur_fail("%s did not start (%d)", s->addr, rc);
    dur_server_dump_log(s);
  }
  return rc;
}

static int wait_role(const char *addr, uint32_t role, int timeout_ms) {
  for (double end = dur_now_ms() + timeout_ms; dur_now_ms() < end;
       dur_sleep_ms(10)) {
    embps_server_stats_t st;
    if (!repl_stats(addr, &st) && st.role == role)
      return 0;
  }
  return -1;
}

/* How many times s's log holds text. */
static int log_count(const dur_server_t *s, const char *text) {
  char *log = dur_server_log(s);
  int n = 0;
  for (const char *p = log; p && (p = strstr(p, text)); p += strlen(text))
    n++;
  free(log);
  return n;
}

/* Waits until s's log holds text n times: 0, or -1 (reported). */
static int wait_log(const dur_server_t *s, const char *text, int n,
                    int timeout_ms) {
  for (double end = dur_now_ms() + timeout_ms; dur_now_ms() < end;
       dur_sleep_ms(10))
    if (log_count(s, text) >= n)
      return 0;
  dur_fail("%s: \"%s\" not logged %d times within %d ms", s->addr, text, n,
           timeout_ms);
  return -1;
}

/* Pushes every row of "t" n times through c. */
static int push_whole(embps_client_t *c, int n, float scale) {
  static int64_t ids[ROWS];
  static float g[ROWS * DIM];
  for (int i = 0; i < ROWS; i++)
    ids[i] = i;
  for (int i = 0; i < ROWS * DIM; i++)
    g[i] = scale * (float)((i % 7) - 3);
  for (int k = 0; k < n; k++)
    if (embps_push(c, "t", ids, ROWS, g, DIM, 0)) {
      dur_fail("push: %s", embps_client_last_error(c));
      return -1;
    }
  return 0;
}

/* Every row of "t" on the server at addr (malloc'd), NULL on failure. */
static float *pull_all(const char *addr) {
  embps_client_t *c = dur_connect(addr, 10000, -1, "pull");
  static int64_t ids[ROWS];
  for (int i = 0; i < ROWS; i++)
    ids[i] = i;
  float *v = malloc(sizeof(float) * ROWS * DIM);
  if (!c || !v || embps_pull(c, "t", ids, ROWS, v, DIM)) {
    dur_fail("pull from %s: %s", addr, c ? embps_client_last_error(c) : "");
    free(v);
    v = NULL;
  }
  embps_client_destroy(c);
  return v;
}

/* Whether DIR/COPYING (copy.h: a copy under way) is there. */
static int marked(const char *dir) {
  char path[600];
  struct stat st;
  snprintf(path, sizeof path, "%s/COPYING", dir);
  return !stat(path, &st);
}

/* A elected, B following it, a table of A's rows; B away while A's
 * backlog (and, with a data dir, its log: a checkpoint) moves on; B
 * started again with its copy's first SNAPSHOT_READ held by the proxy.
 * 0, or -1 (reported). */
static int copy_held(dur_server_t *a, dur_server_t *b, it_proxy_t *x,
                     const char *name) {
  const char *const a_more[] = {"--advertise", it_proxy_addr(x),
                                "--repl-backlog-bytes", "1048576",
                                "--repl-retain-ms", "1000", NULL};
  if (start(a, name, a_more) ||
      wait_role(a->addr, EMBPS_ROLE_PRIMARY, 20000)) {
    dur_fail("%s was not elected", a->addr);
    return -1;
  }
  if (start(b, name, NULL) || repl_wait_in_sync(a->addr, 1, 20000)) {
    dur_fail("%s did not follow %s", b->addr, a->addr);
    return -1;
  }
  embps_client_t *c = dur_connect(a->addr, 10000, -1, "A");
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "t", DIM, EMBPS_OPT_SGD);
  spec.rows = ROWS;
  if (!c || embps_create_table(c, &spec) || push_whole(c, 1, 0.01f) ||
      repl_wait_caught_up(a->addr, b->addr, 30000)) {
    dur_fail("setup: %s", c ? embps_client_last_error(c) : "no client");
    embps_client_destroy(c);
    return -1;
  }
  /* B away while A's backlog moves on: back, it must copy A's state */
  dur_server_kill(b);
  const double gone = dur_now_ms();
  int rc = push_whole(c, 3, 0.02f);
  if (!rc && a->data_dir[0]) { /* past --repl-retain-ms: its log goes */
    while (dur_now_ms() < gone + 1100)
      dur_sleep_ms(20);
    if ((rc = embps_checkpoint(c, NULL)))
      dur_fail("checkpoint: %s", embps_client_last_error(c));
  }
  embps_client_destroy(c);
  if (rc)
    return -1;
  it_proxy_hold(x, EMBPS_KIND_SNAPSHOT_READ);
  if (start(b, name, NULL))
    return -1;
  it_proxy_counts_t n;
  for (double end = dur_now_ms() + 30000; dur_now_ms() < end;
       dur_sleep_ms(10)) {
    it_proxy_counts(x, &n);
    if (n.held)
      break;
  }
  it_proxy_counts(x, &n);
  if (!n.held || wait_log(b, "copying a snapshot", 1, 1000)) {
    dur_fail("%s did not start copying %s's state", b->addr, a->addr);
    return -1;
  }
  return 0;
}

/* A vacancy with only B: it looks at it twice (a whole election round
 * and its give-up), saying it is not eligible, and is not elected. 0, or
 * -1 (reported). */
static int not_elected(const dur_server_t *b) {
  const char *vacancy = "no primary after epoch 1: candidate";
  for (double end = dur_now_ms() + 4 * LEASE_MS + 30000;
       log_count(b, vacancy) < 2 && !log_count(b, "elected primary") &&
       dur_now_ms() < end;
       dur_sleep_ms(10)) {
  }
  embps_server_stats_t st;
  if (log_count(b, "elected primary") || repl_stats(b->addr, &st) ||
      st.role != EMBPS_ROLE_FOLLOWER) {
    dur_fail("%s was elected with tables older than its history (a copy "
             "not in)", b->addr);
    return -1;
  }
  if (log_count(b, vacancy) < 2 ||
      log_count(b, "(not eligible: will not campaign)") < 2) {
    dur_fail("%s did not look at the vacancy twice, saying it is not "
             "eligible", b->addr);
    return -1;
  }
  return 0;
}

/* B, once A's copy went in and it caught up, is eligible (its mark gone)
 * and elected with A's rows when A is killed. 0, or -1 (reported). */
static int elected_after_copy(dur_server_t *a, const dur_server_t *b) {
  if (repl_wait_caught_up(a->addr, b->addr, 30000) ||
      wait_log(b, "eligible again", 1, 10000) ||
      repl_compare(a->addr, b->addr, "copy", 0))
    return -1;
  if (b->data_dir[0] && marked(b->data_dir)) {
    dur_fail("%s caught up after its copy, and %s/COPYING is still there",
             b->addr, b->data_dir);
    return -1;
  }
  float *want = pull_all(a->addr);
  dur_server_kill(a);
  int rc = -1;
  if (wait_role(b->addr, EMBPS_ROLE_PRIMARY, LEASE_MS + 20000)) {
    dur_fail("%s, caught up after its copy, was not elected", b->addr);
  } else {
    float *got = pull_all(b->addr);
    if (want && got && memcmp(want, got, sizeof(float) * ROWS * DIM))
      dur_fail("%s elected without A's rows", b->addr);
    else
      rc = 0;
    free(got);
  }
  free(want);
  return rc;
}

enum { HOLD, RELEASE, RESTART };

static int scenario(int mode) {
  static const char *const names[] = {"elig-hold", "elig-release",
                                      "elig-restart"};
  dur_server_t a, b;
  char dir[256], adir[256] = "";
  it_proxy_t *x = NULL;
  if (mode == RESTART)
    dur_mkdtemp(adir, sizeof adir, "elig-a");
  dur_server_init(&a, adir[0] ? adir : NULL);
  dur_mkdtemp(dir, sizeof dir, "elig-b");
  dur_server_init(&b, dir);
  /* A on a port chosen now: the proxy forwards there, A advertises it */
  a.port = it_free_port();
  char upstream[32];
  snprintf(upstream, sizeof upstream, "127.0.0.1:%d", a.port);
  if (it_proxy_start(&x, upstream)) {
    dur_fail("proxy");
    goto out;
  }
  if (copy_held(&a, &b, x, names[mode]))
    goto out;
  if (mode == HOLD) {
    dur_server_kill(&a);
    if (!not_elected(&b))
      printf("[eligible] a follower in the middle of a copy is not elected "
             "(member left without a primary)\n");
  } else if (mode == RELEASE) {
    it_proxy_hold(x, 0);
    if (!elected_after_copy(&a, &b))
      printf("[eligible] a follower caught up after its copy is elected "
             "with every row\n");
  } else {
    if (!marked(dir)) {
      dur_fail("%s copies, and %s/COPYING is not there", b.addr, dir);
      goto out;
    }
    dur_server_kill(&b); /* in the middle of its copy */
    dur_server_kill(&a);
    it_proxy_hold(x, 0);
    if (start(&b, names[mode], NULL))
      goto out;
    if (wait_log(&b, "stopped while copying its primary's state", 1, 1000) ||
        not_elected(&b))
      goto out;
    printf("[eligible] a follower killed in the middle of a copy and "
           "started again is not elected\n");
    const char *const a_more[] = {"--advertise", it_proxy_addr(x),
                                  "--repl-backlog-bytes", "1048576",
                                  "--repl-retain-ms", "1000", NULL};
    if (start(&a, names[mode], a_more) ||
        wait_role(a.addr, EMBPS_ROLE_PRIMARY, LEASE_MS + 20000)) {
      dur_fail("%s (its data dir the member's last state) was not elected "
               "again", a.addr);
      goto out;
    }
    if (wait_log(&b, "copying a snapshot", 1, 30000) ||
        elected_after_copy(&a, &b))
      goto out;
    printf("[eligible] it copies the primary back, is eligible again "
           "(COPYING gone) and is elected with every row\n");
  }
out:;
  int bad = dur_failures();
  if (bad) {
    dur_server_dump_log(&a);
    dur_server_dump_log(&b);
  }
  dur_server_term(&a, 30000);
  dur_server_term(&b, 30000);
  dur_server_cleanup(&a);
  dur_server_cleanup(&b);
  dur_rm_rf(dir);
  if (adir[0])
    dur_rm_rf(adir);
  it_proxy_stop(x);
  return bad ? 1 : 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  const char *what = argc > 1 ? argv[1] : "hold";
  const int mode = !strcmp(what, "hold")      ? HOLD
                   : !strcmp(what, "release") ? RELEASE
                   : !strcmp(what, "restart") ? RESTART
                                              : -1;
  if (mode < 0) {
    fprintf(stderr, "usage: test_eligible hold|release|restart\n");
    return 2;
  }
  if (it_etcd_start(&etcd, 1, etcd_url, sizeof etcd_url))
    return 1;
  int rc = scenario(mode);
  if (rc)
    it_etcd_dump_log(&etcd);
  it_etcd_destroy(&etcd, 1);
  return rc;
}
