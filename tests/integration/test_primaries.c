/* test_primaries.c - clients find the primary of every member without knowing
 * etcd (issue 22): a coordinated cluster of two members of two servers
 * each, against a real etcd on loopback.
 *
 *   - every server, followers included, says in its stats which server is
 *     primary of each member (address and epoch), for both members;
 *   - a client given only the FOLLOWER of each member (an entry of one
 *     server is a seed) creates, pushes and pulls with no error, its
 *     connections on the primaries, each push applied exactly once;
 *   - `embps stats` and `embps tables` print the line of each member's
 *     primary (text and --json);
 *   - kill -9 of member 1's primary: once its follower is elected, every
 *     server's copy names the new primary with a higher epoch; the killed
 *     server rejoins as its follower, and the same client pushes on
 *     (exactly once) through the entry it was given;
 *   - both servers of member 1 gone: the copies say it has no primary, and
 *     the CLI prints "no primary (an election is on)".
 * Without the copy of the cluster's primaries (server/coord.c) or the seed
 * rule (client/servers.c) these checks fail. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dur_util.h"
#include "etcd_util.h"
#include "wire.h" /* EMBPS_ROLE_* */

#define LEASE_S "2000"
#define ROWS 64
#define DIM 4

static char etcd_url[256];
static it_etcd_t etcd;
static dur_server_t srv[2][2]; /* [member][0: first primary, 1: follower] */
static char dirs[2][2][256];

/* Server j of member m, coordinated in cluster "route". */
static int start(int m, int j) {
  dur_server_t *s = &srv[m][j];
  int i = 0;
  s->args[i++] = "--coordinator";
  s->args[i++] = etcd_url;
  s->args[i++] = "--cluster-name";
  s->args[i++] = "route";
  s->args[i++] = "--cluster-size";
  s->args[i++] = "2";
  s->args[i++] = "--cluster-index";
  s->args[i++] = m ? "1" : "0";
  s->args[i++] = "--lease-ms";
  s->args[i++] = LEASE_S;
  s->args[i++] = "--sync-followers";
  s->args[i++] = "1";
  s->args[i++] = "--sync-timeout-ms";
  s->args[i++] = "20000";
  s->args[i] = NULL;
  int rc = dur_server_start(s, 30000);
  if (rc) {
    dur_fail("member %d server %d did not start (%d)", m, j, rc);
    dur_server_dump_log(s);
  }
  return rc;
}

/* The stats of server j of member m (its own: a client of that member
 * alone, servers_as_listed), its member primaries copied into mp (cap of
 * them): their count, or -1. */
static int server_members(int m, int j, embps_server_stats_t *st,
                          embps_member_primary_t *mp, size_t cap) {
  char list[80]; /* the other member's entry is never connected */
  snprintf(list, sizeof list, "%s,%s", m ? "127.0.0.1:1" : srv[m][j].addr,
           m ? srv[m][j].addr : "127.0.0.1:1");
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = list;
  o.timeout_ms = 5000;
  o.retry_ms = -1;
  o.servers_as_listed = 1;
  embps_client_t *c = NULL;
  if (embps_client_create_member(&o, (uint32_t)m, &c, NULL, 0))
    return -1;
  embps_server_stats_t *s;
  size_t n;
  int rc = embps_stats(c, &s, &n);
  embps_client_destroy(c);
  if (rc || n != 1) {
    if (!rc)
      embps_stats_free(s, n);
    return -1;
  }
  *st = s[0];
  size_t k = s[0].n_members < cap ? s[0].n_members : cap;
  if (k)
    memcpy(mp, s[0].members, k * sizeof *mp);
  st->tables = NULL;
  st->members = NULL;
  embps_stats_free(s, n);
  return (int)k;
}

/* Waits until server j of member m names `want` (NULL: no one) primary of
 * member `of`, with an epoch above min_epoch; *epoch gets it. 0 or -1. */
static int wait_named(int m, int j, uint32_t of, const char *want,
                      uint32_t min_epoch, uint32_t *epoch, int timeout_ms) {
  const double end = dur_now_ms() + timeout_ms;
  char last[160] = "(no answer)";
  while (dur_now_ms() < end) {
    embps_server_stats_t st;
    embps_member_primary_t mp[8];
    int n = server_members(m, j, &st, mp, 8);
    if (n == 0)
      snprintf(last, sizeof last, "no member primaries");
    for (int i = 0; i < n; i++) {
      if (mp[i].member != of)
        continue;
      snprintf(last, sizeof last, "\"%s\" epoch %u", mp[i].primary,
               mp[i].epoch);
      if (want ? !strcmp(mp[i].primary, want) && mp[i].epoch > min_epoch
               : !mp[i].primary[0]) {
        if (epoch)
          *epoch = mp[i].epoch;
        return 0;
      }
    }
    dur_sleep_ms(20);
  }
  dur_fail("%s does not name %s primary of member %u (epoch > %u) within "
           "%d ms: it says %s", srv[m][j].addr, want ? want : "no one", of,
           min_epoch, timeout_ms, last);
  return -1;
}

/* Waits until server j of member m says it is primary: 0 or -1. */
static int wait_primary(int m, int j, int timeout_ms) {
  const double end = dur_now_ms() + timeout_ms;
  while (dur_now_ms() < end) {
    embps_server_stats_t st;
    embps_member_primary_t mp[1];
    if (server_members(m, j, &st, mp, 0) >= 0 &&
        st.role == EMBPS_ROLE_PRIMARY)
      return 0;
    dur_sleep_ms(10);
  }
  dur_fail("%s was not elected within %d ms", srv[m][j].addr, timeout_ms);
  return -1;
}

/* Waits until the primary, server j of member m, has its follower in
 * sync: 0 or -1. */
static int wait_in_sync(int m, int j, int timeout_ms) {
  const double end = dur_now_ms() + timeout_ms;
  while (dur_now_ms() < end) {
    embps_server_stats_t st;
    embps_member_primary_t mp[1];
    if (server_members(m, j, &st, mp, 0) >= 0 && st.followers_in_sync >= 1)
      return 0;
    dur_sleep_ms(20);
  }
  dur_fail("member %d: no follower in sync within %d ms", m, timeout_ms);
  return -1;
}

/* Every row of table "r" through c equals -k (each pushed k times, lr 1,
 * gradient 1): each push applied exactly once. */
static int rows_are(embps_client_t *c, float k, const char *when) {
  int64_t ids[ROWS];
  static float out[ROWS * DIM];
  for (int i = 0; i < ROWS; i++)
    ids[i] = i;
  int rc = embps_pull(c, "r", ids, ROWS, out, DIM);
  if (rc) {
    dur_fail("%s: pull: %s", when, embps_client_last_error(c));
    return -1;
  }
  for (int i = 0; i < ROWS * DIM; i++)
    if (out[i] != -k) {
      dur_fail("%s: row %d holds %g, not %g", when, i / DIM, out[i], -k);
      return -1;
    }
  return 0;
}

static int push_all(embps_client_t *c, const char *when) {
  static float g[ROWS * DIM];
  int64_t ids[ROWS];
  for (int i = 0; i < ROWS; i++)
    ids[i] = i;
  for (int i = 0; i < ROWS * DIM; i++)
    g[i] = 1;
  for (int i = 0; i < ROWS; i += 8) /* several pushes, each on 8 rows */
    if (embps_push(c, "r", ids + i, 8, g, DIM, 0)) {
      dur_fail("%s: push: %s", when, embps_client_last_error(c));
      return -1;
    }
  return 0;
}

/* The CLI's `args` on list, its stdout holding every one of `want`. */
static int cli_says(const char *list, const char *const *args,
                    const char *const *want, const char *what) {
  char *out = NULL, *err = NULL;
  int rc = dur_cli(list, args, &out, &err);
  int bad = rc != 0;
  for (int i = 0; !bad && want[i]; i++)
    bad = !out || !strstr(out, want[i]);
  if (bad)
    dur_fail("%s: exit %d, stdout:\n%s\nstderr:\n%s", what, rc,
             out ? out : "", err ? err : "");
  free(out);
  free(err);
  return bad ? -1 : 0;
}

static int scenario(void) {
  for (int m = 0; m < 2; m++)
    for (int j = 0; j < 2; j++) {
      dur_mkdtemp(dirs[m][j], sizeof dirs[m][j], "route");
      dur_server_init(&srv[m][j], dirs[m][j]);
    }
  /* the first server of each member is elected, then its follower joins */
  for (int m = 0; m < 2; m++)
    if (start(m, 0) || wait_primary(m, 0, 20000))
      return -1;
  for (int m = 0; m < 2; m++)
    if (start(m, 1) || wait_in_sync(m, 0, 20000))
      return -1;
  const char *p0 = srv[0][0].addr, *p1 = srv[1][0].addr;
  const char *f0 = srv[0][1].addr, *f1 = srv[1][1].addr;

  /* any server names both primaries: followers too */
  uint32_t e0 = 0, e1 = 0;
  for (int m = 0; m < 2; m++)
    for (int j = 0; j < 2; j++)
      if (wait_named(m, j, 0, p0, 0, &e0, 10000) ||
          wait_named(m, j, 1, p1, 0, &e1, 10000))
        return -1;
  dur_note("every server names %s (epoch %u) and %s (epoch %u)", p0, e0, p1,
           e1);

  /* a client given only the followers: everything reaches the primaries */
  char seeds[80];
  snprintf(seeds, sizeof seeds, "%s,%s", f0, f1);
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = seeds;
  o.timeout_ms = 20000;
  o.retry_ms = 30000;
  embps_client_t *c = NULL;
  char err[512];
  if (embps_client_create(&o, &c, err, sizeof err)) {
    dur_fail("a client on the followers %s: %s", seeds, err);
    return -1;
  }
  embps_table_spec_t spec;
  embps_table_spec_init(&spec, "r", DIM, EMBPS_OPT_SGD);
  spec.rows = ROWS;
  spec.lr = 1;
  int rc = embps_create_table(c, &spec);
  if (rc)
    dur_fail("create through the followers: %s", embps_client_last_error(c));
  if (!rc && (strcmp(embps_client_server_address(c, 0), p0) ||
              strcmp(embps_client_server_address(c, 1), p1))) {
    dur_fail("the client writes to %s and %s, not the primaries %s and %s",
             embps_client_server_address(c, 0),
             embps_client_server_address(c, 1), p0, p1);
    rc = -1;
  }
  if (!rc)
    rc = push_all(c, "pushes through the followers");
  if (!rc)
    rc = rows_are(c, 1, "after the first pushes");

  /* the CLI: stats and tables on the followers' list */
  char l0[96], l1[96], j0[160], j1[160];
  snprintf(l0, sizeof l0, "  member 0: primary %s epoch %u\n", p0, e0);
  snprintf(l1, sizeof l1, "  member 1: primary %s epoch %u\n", p1, e1);
  snprintf(j0, sizeof j0, "\"members\": [{\"member\": 0, \"primary\": \"%s\", "
           "\"epoch\": %u}, {\"member\": 1, \"primary\": \"%s\", "
           "\"epoch\": %u}]", p0, e0, p1, e1);
  snprintf(j1, sizeof j1, "\"durability_failed\": \"\", \"primary\": \"%s\", "
           "\"epoch\": %u}]}]", p1, e1); /* the entry of member 1's server */
  if (!rc)
    rc = cli_says(seeds, (const char *const[]){"stats", NULL},
                  (const char *const[]){l0, l1, NULL}, "stats");
  if (!rc)
    rc = cli_says(seeds, (const char *const[]){"stats", "--json", NULL},
                  (const char *const[]){j0, NULL}, "stats --json");
  if (!rc)
    rc = cli_says(seeds, (const char *const[]){"tables", NULL},
                  (const char *const[]){l0 + 2, l1 + 2, NULL}, "tables");
  if (!rc)
    rc = cli_says(seeds, (const char *const[]){"tables", "--json", NULL},
                  (const char *const[]){j1, NULL}, "tables --json");

  /* member 1's primary dies: its follower is elected, every copy follows */
  if (!rc) {
    dur_server_kill(&srv[1][0]);
    const double t0 = dur_now_ms();
    rc = wait_primary(1, 1, 20000);
    const double elected = dur_now_ms() - t0;
    uint32_t e1b = 0;
    for (int m = 0; !rc && m < 2; m++)
      for (int j = 0; !rc && j < 2; j++)
        if (m != 1 || j != 0)
          rc = wait_named(m, j, 1, f1, e1, &e1b, 10000);
    if (!rc)
      dur_note("member 1: %s elected %.0f ms after the kill; every server "
               "named it (epoch %u) %.0f ms after the kill", f1, elected,
               e1b, dur_now_ms() - t0);
    if (!rc)
      rc = wait_named(0, 1, 0, p0, 0, NULL, 1000); /* member 0 unchanged */
    /* the killed server rejoins as the new primary's follower (writes
       need one in sync: --sync-followers 1) */
    if (!rc)
      rc = start(1, 0) || wait_in_sync(1, 1, 20000) ? -1 : 0;
    if (!rc)
      rc = push_all(c, "pushes after the failover");
    if (!rc)
      rc = rows_are(c, 2, "after the failover");
    if (!rc && strcmp(embps_client_server_address(c, 1), f1)) {
      dur_fail("member 1's writes go to %s, not %s",
               embps_client_server_address(c, 1), f1);
      rc = -1;
    }
  }
  embps_client_destroy(c);

  /* member 1 gone whole: no primary, said so */
  if (!rc) {
    dur_server_kill(&srv[1][0]);
    dur_server_kill(&srv[1][1]);
    rc = wait_named(0, 1, 1, NULL, 0, NULL, 15000) ||
                 wait_named(0, 0, 1, NULL, 0, NULL, 15000)
             ? -1
             : 0;
    char list[80];
    snprintf(list, sizeof list, "%s,%s", p0, f1);
    if (!rc)
      rc = cli_says(list, (const char *const[]){"--member", "0", "stats",
                                                NULL},
                    (const char *const[]){"  member 1: no primary (an "
                                          "election is on)\n", NULL},
                    "stats, member 1 gone");
  }
  return rc || dur_failures() ? -1 : 0;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  if (it_etcd_start(&etcd, 1, etcd_url, sizeof etcd_url))
    return 1;
  int rc = scenario();
  for (int m = 0; m < 2; m++)
    for (int j = 0; j < 2; j++) {
      if (rc && srv[m][j].port)
        dur_server_dump_log(&srv[m][j]);
      dur_server_kill(&srv[m][j]);
      dur_server_cleanup(&srv[m][j]);
      dur_rm_rf(dirs[m][j]);
    }
  if (rc)
    it_etcd_dump_log(&etcd);
  it_etcd_destroy(&etcd, 1);
  printf("%s\n", rc ? "FAIL" : "ok");
  return rc ? 1 : 0;
}
