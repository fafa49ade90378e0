/* dur_disk.c - disk full and I/O errors under the data dir.
 * diskfull: the data dir on a real 1 MiB tmpfs in a private mount namespace
 *   (we are root); filled up, pushes must be refused with EMBPS_EIO and a
 *   message and change nothing, pulls keep working and equal a replay of
 *   the acknowledged pushes, a checkpoint fails without touching the last
 *   good one (or, when every push since it was refused, is that one); after the space is freed and a restart every acknowledged
 *   push is there. Without the mount it says why and runs faultfs instead.
 * faultfs: the same with tests/fault/faultfs.c preloaded (ENOSPC past a
 *   byte budget), then fsync failing with EIO: the push waiting for it is
 *   not acknowledged, every later push is refused with EMBPS_EIO until a
 *   restart (also once fsync works again), the log and `embps stats` say
 *   so, pulls keep working; the restart recovers everything acknowledged.
 * fsync-lost (issue 18.4): fsync failing while the file system loses what
 *   it should have written (faultfs ZERO: the dirty pages read back as
 *   zeros, as ext4 did over a device that stopped taking writes): the
 *   restart comes back by itself with every acknowledged push and without
 *   the failed one, also when the lost record's first page made it; when
 *   only that first page was lost it refuses naming one command, which
 *   works.
 * frozen (issue 18.8): fsync hanging (a frozen disk): /readyz turns 503
 *   within the stall bound and 200 again once the disk answers. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dur_scenarios.h"
#include "dur_util.h"
#include "wal.h" /* EMBPS_WAL_STALL_MS */

#define DUR_EIO (-30022) /* EMBPS_EIO of the durability contract */

typedef struct {
  const char *name;
  dur_server_t srv;
  dur_workload_t wl;
  char data[512];
  char ctl[600];          /* faultfs control file ("" for tmpfs) */
  int ctl_gen;
  char env[3][700];       /* LD_PRELOAD, FAULTFS_DIR, FAULTFS_CTL */
  char mport[700];        /* --metrics-port-file ("": none) */
  uint64_t big_acked;     /* pushes to "big" acknowledged */
  uint64_t wit_acked, ada_acked;
  uint64_t wit_maybe;     /* unacknowledged witness pushes (fsync error) */
  char **ckpt_files;      /* the last good checkpoint and its hashes */
  uint64_t *ckpt_hash;
  size_t n_ckpt;
  uint64_t acked_at_ckpt; /* pushes acknowledged when it was taken */
} disk_t;

/* The faultfs control file (tests/fault/faultfs.c). */
static void set_ctl_all(disk_t *d, long long budget, int fsync_eio, int zero,
                        int hang) {
  char tmp[700], line[96];
  snprintf(tmp, sizeof tmp, "%s.tmp", d->ctl);
  snprintf(line, sizeof line, "%lld %d %d %d %d\n", budget, fsync_eio,
           ++d->ctl_gen, zero, hang);
  FILE *f = fopen(tmp, "w");
  if (!f || fputs(line, f) < 0 || fclose(f) || rename(tmp, d->ctl))
    dur_fail("%s: cannot write the control file %s", d->name, d->ctl);
}

static void set_ctl(disk_t *d, long long budget, int fsync_eio) {
  set_ctl_all(d, budget, fsync_eio, 0, 0);
}

/* d's server runs with the faultfs shim on a fresh data dir. */
static void use_faultfs(disk_t *d, const char *shim) {
  dur_mkdtemp(d->data, sizeof d->data, "faultfs-data");
  snprintf(d->ctl, sizeof d->ctl, "%s.ctl", d->data);
  set_ctl(d, -1, 0);
  snprintf(d->env[0], sizeof d->env[0], "LD_PRELOAD=%s", shim);
  snprintf(d->env[1], sizeof d->env[1], "FAULTFS_DIR=%s", d->data);
  snprintf(d->env[2], sizeof d->env[2], "FAULTFS_CTL=%s", d->ctl);
}

/* One push, witness or Adagrad. Returns 0 (acknowledged, counted), or the
 * code of the refusal, which must be EMBPS_EIO with a message. */
static int push_one(disk_t *d, embps_client_t *c, int ada, const char *when) {
  int rc = ada ? dur_push_ada(c, &d->wl, 0, d->ada_acked)
               : dur_push_wit(c, &d->wl, 0);
  if (!rc) {
    if (ada)
      d->ada_acked++;
    else
      d->wit_acked++;
    return 0;
  }
  const char *msg = embps_client_last_error(c);
  if (rc != DUR_EIO)
    dur_fail("%s: %s: %s push refused with %s (%d), want EMBPS_EIO "
             "(-30022): %s", d->name, when, ada ? "Adagrad" : "witness",
             embps_err_name(rc), rc, msg);
  else if (!msg || strlen(msg) < 10)
    dur_fail("%s: %s: EMBPS_EIO without a message naming the problem",
             d->name, when);
  return rc;
}

/* The server's state must be the acknowledged pushes (witness: up to
 * wit_maybe more) and nothing refused. */
static void check_state(disk_t *d, const char *when) {
  char what[256];
  snprintf(what, sizeof what, "%s: %s", d->name, when);
  embps_client_t *c = dur_connect(d->srv.addr, 10000, DUR_RETRY_DEFAULT,
                                  what);
  if (!c)
    return;
  double wit[2];
  if (!dur_pull_wit(c, &d->wl, wit)) {
    if (wit[0] < (double)d->wit_acked)
      dur_fail("%s: witness = %.0f but %llu pushes acknowledged: pushes "
               "#%.0f..#%llu LOST", what, wit[0],
               (unsigned long long)d->wit_acked, wit[0],
               (unsigned long long)d->wit_acked - 1);
    else if (wit[0] > (double)(d->wit_acked + d->wit_maybe))
      dur_fail("%s: witness = %.0f but %llu acknowledged (+%llu "
               "unacknowledged): a REFUSED push was applied", what, wit[0],
               (unsigned long long)d->wit_acked,
               (unsigned long long)d->wit_maybe);
  }
  float *got = dur_pull_ada(c, &d->wl);
  embps_client_destroy(c);
  float *exp = dur_replay_ada(&d->wl, &d->ada_acked);
  if (got && exp)
    dur_compare_ada(&d->wl, exp, got, what);
  free(got);
  free(exp);
}

static void remember_ckpt(disk_t *d) {
  char **all;
  size_t n = dur_list_files(d->data, &all);
  d->ckpt_files = calloc(n ? n : 1, sizeof *d->ckpt_files);
  d->ckpt_hash = calloc(n ? n : 1, sizeof *d->ckpt_hash);
  for (size_t i = 0; i < n; i++) {
    if (strncmp(all[i], "ckpt-", 5) || strstr(all[i], ".tmp"))
      continue;
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", d->data, all[i]);
    d->ckpt_files[d->n_ckpt] = strdup(all[i]);
    d->ckpt_hash[d->n_ckpt++] = dur_file_hash(path);
  }
  dur_free_list(all, n);
  d->acked_at_ckpt = d->wit_acked + d->ada_acked;
  if (!d->n_ckpt)
    dur_fail("%s: no checkpoint files in %s", d->name, d->data);
}

static void check_ckpt_intact(disk_t *d, const char *when) {
  for (size_t i = 0; i < d->n_ckpt; i++) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", d->data, d->ckpt_files[i]);
    if (dur_file_hash(path) != d->ckpt_hash[i])
      dur_fail("%s: %s: the last good checkpoint's file %s changed or "
               "vanished", d->name, when, d->ckpt_files[i]);
  }
}

static int checkpoint(disk_t *d, char **err) {
  const char *args[] = {"checkpoint", NULL};
  return dur_cli(d->srv.addr, args, NULL, err);
}

static int restart(disk_t *d, const char *when) {
  dur_server_kill(&d->srv);
  if (dur_server_start(&d->srv, 30000)) {
    dur_fail("%s: restart %s failed", d->name, when);
    dur_server_dump_log(&d->srv);
    return -1;
  }
  return 0;
}

/* The disk-full phase; make_full and make_room switch the fault. */
static void disk_full_phase(disk_t *d, const char *mnt) {
  embps_client_t *c = dur_connect(d->srv.addr, 10000, DUR_RETRY_DEFAULT,
                                  d->name);
  if (!c)
    return;
  char filler[700] = "";
  if (mnt) {
    if (dur_fill_fs(mnt, filler, sizeof filler))
      dur_fail("%s: cannot fill the tmpfs", d->name);
  } else {
    set_ctl(d, 2000, 0);
  }
  int refused = 0, acked_full = 0;
  for (int i = 0; i < 2000 && refused < 6; i++) {
    int rc = push_one(d, c, i % 2, "disk full");
    if (rc)
      refused++;
    else if (refused)
      acked_full++;
  }
  if (!refused)
    dur_fail("%s: 2000 pushes acknowledged on a full disk", d->name);
  else
    dur_note("%s: %d pushes refused with EMBPS_EIO (%s), %d acknowledged "
             "between refusals", d->name, refused,
             embps_client_last_error(c), acked_full);
  check_state(d, "pulls while the disk is full");
  char *err = NULL;
  /* a checkpoint with nothing to write (the server refused every push
   * since the last one: it keeps room for a checkpoint) is that one */
  int news = d->wit_acked + d->ada_acked != d->acked_at_ckpt;
  int rc = checkpoint(d, &err);
  if (!rc && news)
    dur_fail("%s: a checkpoint succeeded on a full disk", d->name);
  else if (!rc)
    dur_note("%s: checkpoint on a full disk: nothing acknowledged since the "
             "last one, which stands", d->name);
  else
    dur_note("%s: checkpoint on a full disk refused: %s", d->name, err);
  free(err);
  check_ckpt_intact(d, "after the failed checkpoint");
  check_state(d, "pulls after the failed checkpoint");

  /* Space again: pushes may resume; after a restart they must. */
  if (mnt)
    unlink(filler);
  else
    set_ctl(d, -1, 0);
  rc = push_one(d, c, 0, "space freed, before a restart");
  dur_note("%s: with space freed and no restart, a push is %s", d->name,
           rc ? "still refused" : "accepted");
  embps_client_destroy(c);
  if (restart(d, "after the disk was full"))
    return;
  check_state(d, "after freeing space and a restart");
  c = dur_connect(d->srv.addr, 10000, DUR_RETRY_DEFAULT, d->name);
  if (c && (push_one(d, c, 0, "after the restart") ||
            push_one(d, c, 1, "after the restart")))
    dur_fail("%s: pushes refused after freeing space and restarting: %s",
             d->name, embps_client_last_error(c));
  embps_client_destroy(c);
  check_state(d, "after freeing space, a restart and two pushes");
  /* What the failed checkpoint and the full disk left must not stop a
   * later start either. */
  if (!restart(d, "once more after the disk was full"))
    check_state(d, "after a second restart");
}

/* fsync failing: the failed state until a restart. */
static void fsync_phase(disk_t *d) {
  embps_client_t *c = dur_connect(d->srv.addr, 10000, DUR_RETRY_DEFAULT,
                                  d->name);
  if (!c)
    return;
  set_ctl(d, -1, 1);
  int rc = push_one(d, c, 0, "fsync fails");
  if (!rc)
    dur_fail("%s: a push was acknowledged although its fsync failed "
             "(--fsync always)", d->name);
  else
    d->wit_maybe++; /* written and maybe applied, not acknowledged */
  set_ctl(d, -1, 0);
  for (int i = 0; i < 4; i++) {
    rc = push_one(d, c, i % 2, "after an fsync error");
    if (!rc)
      dur_fail("%s: push %d after an fsync error was acknowledged: the "
               "server must refuse pushes until restarted", d->name, i);
  }
  const char *msg = embps_client_last_error(c);
  dur_note("%s: after an fsync error, with fsync working again: %s",
           d->name, msg);
  if (!strstr(msg, "fsync"))
    dur_fail("%s: the refusal after an fsync error does not say so: %s",
             d->name, msg);
  check_state(d, "pulls after an fsync error");
  embps_client_destroy(c);
  const char *args[] = {"stats", NULL};
  char *out = NULL;
  dur_cli(d->srv.addr, args, &out, NULL);
  if (!out || !strstr(out, "fsync"))
    dur_fail("%s: `embps stats` does not report the fsync failure: %.600s",
             d->name, out ? out : "");
  free(out);
  char *log = dur_server_log(&d->srv);
  if (!log || !strstr(log, "fsync") || !strcasestr(log, "error"))
    dur_fail("%s: the server's log has no ERROR about the fsync failure",
             d->name);
  free(log);
  if (restart(d, "after the fsync error"))
    return;
  check_state(d, "after the fsync error and a restart");
  c = dur_connect(d->srv.addr, 10000, DUR_RETRY_DEFAULT, d->name);
  if (c && push_one(d, c, 1, "after the restart"))
    dur_fail("%s: pushes still refused after the restart", d->name);
  embps_client_destroy(c);
  check_state(d, "after the restart and one push");
}

/* Runs a case: mnt = tmpfs mount point (NULL: faultfs shim). */
static void run(const char *name, const char *mnt, const char *shim) {
  disk_t d;
  memset(&d, 0, sizeof d);
  d.name = name;
  d.wl = (dur_workload_t){.n_workers = 1, .rows_per_worker = 2048,
                          .seed = 99};
  if (mnt) {
    snprintf(d.data, sizeof d.data, "%s/data", mnt);
    mkdir(d.data, 0755);
  } else {
    use_faultfs(&d, shim);
  }
  dur_server_init(&d.srv, d.data);
  d.srv.fsync = "always";
  for (int i = 0; !mnt && i < 3; i++)
    d.srv.env[i] = d.env[i];
  if (dur_server_start(&d.srv, 20000)) {
    dur_fail("%s: start failed", name);
    dur_server_dump_log(&d.srv);
    goto out;
  }
  embps_client_t *c = dur_connect(d.srv.addr, 10000, DUR_RETRY_DEFAULT,
                                  name);
  if (!c || dur_create_tables(c, &d.wl)) {
    embps_client_destroy(c);
    goto out;
  }
  for (int i = 0; i < 40; i++)
    if (push_one(&d, c, i % 2, "setup"))
      break;
  embps_client_destroy(c);
  char *err = NULL;
  if (checkpoint(&d, &err))
    dur_fail("%s: checkpoint before the fault failed: %s", name, err);
  free(err);
  remember_ckpt(&d);
  disk_full_phase(&d, mnt);
  if (!mnt && d.srv.pid)
    fsync_phase(&d);
out:
  if (dur_failures())
    dur_server_dump_log(&d.srv);
  dur_server_cleanup(&d.srv);
  for (size_t i = 0; i < d.n_ckpt; i++)
    free(d.ckpt_files[i]);
  free(d.ckpt_files);
  free(d.ckpt_hash);
  if (!mnt && dur_failures()) {
    fprintf(stderr, "%s: data dir kept: %s\n", name, d.data);
  } else if (!mnt) {
    dur_rm_rf(d.data);
    unlink(d.ctl);
  }
}

int dur_scenario_faultfs(const char *shim) {
  if (!dur_engine_present()) {
    printf("SKIP: embps-server has no --data-dir in this build\n");
    return DUR_SKIP;
  }
  if (getenv("EMBPS_TEST_NO_PRELOAD")) { /* sanitizer builds */
    printf("SKIP: EMBPS_TEST_NO_PRELOAD is set\n");
    return DUR_SKIP;
  }
  run("faultfs", NULL, shim);
  return dur_failures() ? 1 : 0;
}

int dur_scenario_diskfull(const char *shim) {
  if (!dur_engine_present()) {
    printf("SKIP: embps-server has no --data-dir in this build\n");
    return DUR_SKIP;
  }
  char mnt[256], why[512];
  if (dur_tmpfs_mount(mnt, sizeof mnt, "1m", why, sizeof why)) {
    printf("cannot mount a small tmpfs (%s): running the LD_PRELOAD shim "
           "variant instead\n", why);
    return getenv("EMBPS_TEST_NO_PRELOAD") ? DUR_SKIP
                                           : dur_scenario_faultfs(shim);
  }
  run("tmpfs 1 MiB", mnt, shim);
  dur_tmpfs_unmount(mnt);
  return dur_failures() ? 1 : 0;
}

/* ------------------------------------------------- issue 18.4 and 18.8 */

/* "big": SGD lr 1, zeros; a push of BIG_ROWS rows of BIG_DIM is a record
 * of four pages and more; each adds 1 to every weight. */
#define BIG_DIM 1024
#define BIG_ROWS 4

static int create_big(embps_client_t *c) {
  embps_table_spec_t s;
  embps_table_spec_init(&s, "big", BIG_DIM, EMBPS_OPT_SGD);
  s.rows = BIG_ROWS;
  s.lr = 1;
  int rc = embps_create_table(c, &s);
  if (rc)
    dur_fail("create big: %s", embps_client_last_error(c));
  return rc;
}

/* A push to "big": 0 (acknowledged, counted) or its refusal, which must
 * be EMBPS_EIO with a message. */
static int push_big(disk_t *d, embps_client_t *c, const char *when) {
  static float g[BIG_ROWS * BIG_DIM];
  int64_t ids[BIG_ROWS];
  for (int i = 0; i < BIG_ROWS; i++)
    ids[i] = i;
  for (int i = 0; i < BIG_ROWS * BIG_DIM; i++)
    g[i] = -1.0f;
  int rc = embps_push(c, "big", ids, BIG_ROWS, g, BIG_DIM, 0);
  if (!rc)
    d->big_acked++;
  else if (rc != DUR_EIO)
    dur_fail("%s: %s: big push refused with %s, want EMBPS_EIO: %s",
             d->name, when, embps_err_name(rc), embps_client_last_error(c));
  return rc;
}

/* Every weight of "big" must be the count of its acknowledged pushes. */
static void check_big(disk_t *d, const char *when) {
  embps_client_t *c = dur_connect(d->srv.addr, 10000, DUR_RETRY_DEFAULT,
                                  when);
  static float w[BIG_ROWS * BIG_DIM];
  int64_t ids[BIG_ROWS];
  for (int i = 0; i < BIG_ROWS; i++)
    ids[i] = i;
  if (c && embps_pull(c, "big", ids, BIG_ROWS, w, BIG_DIM))
    dur_fail("%s: %s: pull of big: %s", d->name, when,
             embps_client_last_error(c));
  else if (c)
    for (int i = 0; i < BIG_ROWS * BIG_DIM; i++)
      if (w[i] != (float)d->big_acked) {
        dur_fail("%s: %s: big[%d] = %g but %llu pushes acknowledged (%s)",
                 d->name, when, i, (double)w[i],
                 (unsigned long long)d->big_acked,
                 w[i] < (float)d->big_acked ? "acknowledged push LOST"
                                            : "a FAILED push applied");
        break;
      }
  embps_client_destroy(c);
}

/* /readyz of d's server: its status, the body in body. */
static int readyz(disk_t *d, char *body, size_t cap) {
  int port = it_read_port(d->mport);
  return port > 0 ? it_http_get("127.0.0.1", port, "/readyz", 3000, body, cap)
                  : -1;
}

/* A few acknowledged pushes of each kind (records of many sizes), then a
 * big push whose fsync fails and loses `zero` (faultfs ZERO), which must
 * be refused, then one more push, refused until the restart. */
static int lose_one_sync(disk_t *d, int zero, const char *when) {
  embps_client_t *c = dur_connect(d->srv.addr, 10000, DUR_RETRY_DEFAULT,
                                  when);
  if (!c)
    return -1;
  for (int i = 0; i < 7; i++)
    if ((i % 3 == 2 ? push_big(d, c, when) : push_one(d, c, i % 2, when))) {
      dur_fail("%s: %s: push %d refused: %s", d->name, when, i,
               embps_client_last_error(c));
      embps_client_destroy(c);
      return -1;
    }
  set_ctl_all(d, -1, 1, zero, 0);
  if (!push_big(d, c, when))
    dur_fail("%s: %s: a push was acknowledged although its fsync failed",
             d->name, when);
  set_ctl(d, -1, 0);
  if (!push_one(d, c, 0, when))
    dur_fail("%s: %s: a push after the fsync error was acknowledged",
             d->name, when);
  embps_client_destroy(c);
  char body[512];
  int st = readyz(d, body, sizeof body);
  if (st != 503 || !strstr(body, "fsync"))
    dur_fail("%s: %s: /readyz answers %d \"%s\" after the fsync error, "
             "want 503 naming it", d->name, when, st, body);
  return 0;
}

/* The command in the server's refusal: "truncate -s N 'PATH'". */
static int refusal_command(const char *log, char *cmd, size_t cap) {
  const char *a = strstr(log, "truncate -s ");
  const char *q = a ? strchr(a, '\'') : NULL;
  const char *e = q ? strchr(q + 1, '\'') : NULL;
  if (!e || (size_t)(e + 1 - a) >= cap)
    return -1;
  snprintf(cmd, cap, "%.*s", (int)(e + 1 - a), a);
  return 0;
}

/* The restart after lose_one_sync: by itself (by_itself), or refused
 * naming the command, which is run, and then started. Then all
 * acknowledged pushes are there, the failed ones not, and pushes work. */
static void restart_after_loss(disk_t *d, int by_itself, const char *when) {
  dur_server_kill(&d->srv);
  int rc = dur_server_start(&d->srv, 30000);
  char *log = dur_server_log(&d->srv);
  if (by_itself && rc) {
    dur_fail("%s: %s: the restart failed (status %d): %.600s", d->name, when,
             rc, log);
  } else if (!by_itself) {
    char cmd[900];
    if (!rc)
      dur_fail("%s: %s: started over a log damaged in the middle of a "
               "record", d->name, when);
    else if (refusal_command(log, cmd, sizeof cmd))
      dur_fail("%s: %s: the refusal names no command: %.600s", d->name, when,
               log);
    else if (system(cmd) != 0)
      dur_fail("%s: %s: `%s` failed", d->name, when, cmd);
    else if ((rc = dur_server_start(&d->srv, 30000)) != 0)
      dur_fail("%s: %s: no start after `%s` (status %d)", d->name, when, cmd,
               rc);
    else
      dur_note("%s: %s: refused, then started after `%s`", d->name, when,
               cmd);
  }
  free(log);
  if (rc || !d->srv.pid)
    return;
  check_state(d, when);
  check_big(d, when);
  char body[256];
  int st = readyz(d, body, sizeof body);
  if (st != 200)
    dur_fail("%s: %s: /readyz %d after the restart: %s", d->name, when, st,
             body);
  embps_client_t *c = dur_connect(d->srv.addr, 10000, DUR_RETRY_DEFAULT,
                                  when);
  if (c && (push_one(d, c, 1, when) || push_big(d, c, when)))
    dur_fail("%s: %s: pushes refused after the restart: %s", d->name, when,
             embps_client_last_error(c));
  embps_client_destroy(c);
}

/* A server with faultfs, --fsync always and /readyz, its tables made. */
static int start_faulty(disk_t *d, const char *name, const char *shim) {
  memset(d, 0, sizeof *d);
  d->name = name;
  d->wl = (dur_workload_t){.n_workers = 1, .rows_per_worker = 64, .seed = 7};
  use_faultfs(d, shim);
  dur_server_init(&d->srv, d->data);
  d->srv.fsync = "always";
  for (int i = 0; i < 3; i++)
    d->srv.env[i] = d->env[i];
  snprintf(d->mport, sizeof d->mport, "%s/metrics.port", d->srv.work);
  d->srv.args[0] = "--metrics-listen";
  d->srv.args[1] = "127.0.0.1:0";
  d->srv.args[2] = "--metrics-port-file";
  d->srv.args[3] = d->mport;
  if (dur_server_start(&d->srv, 20000)) {
    dur_fail("%s: start failed", name);
    return -1;
  }
  embps_client_t *c = dur_connect(d->srv.addr, 10000, DUR_RETRY_DEFAULT,
                                  name);
  int rc = !c || dur_create_tables(c, &d->wl) || create_big(c) ? -1 : 0;
  embps_client_destroy(c);
  return rc;
}

static void finish_faulty(disk_t *d) {
  if (dur_failures())
    dur_server_dump_log(&d->srv);
  dur_server_cleanup(&d->srv);
  if (dur_failures()) {
    fprintf(stderr, "%s: data dir kept: %s\n", d->name, d->data);
  } else {
    dur_rm_rf(d->data);
    unlink(d->ctl);
  }
}

int dur_scenario_fsync_lost(const char *shim) {
  if (!dur_engine_present()) {
    printf("SKIP: embps-server has no --data-dir in this build\n");
    return DUR_SKIP;
  }
  if (getenv("EMBPS_TEST_NO_PRELOAD")) { /* sanitizer builds */
    printf("SKIP: EMBPS_TEST_NO_PRELOAD is set\n");
    return DUR_SKIP;
  }
  disk_t d;
  if (!start_faulty(&d, "fsync-lost", shim)) {
    /* the case: the pages written since the last good sync lost */
    if (!lose_one_sync(&d, 1, "dirty pages lost"))
      restart_after_loss(&d, 1, "after losing the dirty pages");
    /* the lost record's first page made it: it is there, torn */
    if (!dur_failures() && !lose_one_sync(&d, 2, "all but the first lost"))
      restart_after_loss(&d, 1, "after losing all but the first page");
    /* only its first page lost: damage a restart cannot tell from other
     * damage, so the operator's one command */
    if (!dur_failures() && !lose_one_sync(&d, 3, "the first page lost"))
      restart_after_loss(&d, 0, "after losing the first page");
    if (!dur_failures() && !restart(&d, "once more")) {
      check_state(&d, "after one more restart");
      check_big(&d, "after one more restart");
    }
  }
  finish_faulty(&d);
  return dur_failures() ? 1 : 0;
}

typedef struct {
  disk_t *d;
  int rc;
  double ms;
} frozen_push_t;

static void *frozen_push(void *arg) {
  frozen_push_t *p = arg;
  double t0 = dur_now_ms();
  embps_client_t *c = dur_connect(p->d->srv.addr, 10000, DUR_RETRY_DEFAULT,
                                  "frozen push");
  p->rc = c ? dur_push_wit(c, &p->d->wl, 0) : -1;
  p->ms = dur_now_ms() - t0;
  embps_client_destroy(c);
  return NULL;
}

int dur_scenario_frozen(const char *shim) {
  if (!dur_engine_present()) {
    printf("SKIP: embps-server has no --data-dir in this build\n");
    return DUR_SKIP;
  }
  if (getenv("EMBPS_TEST_NO_PRELOAD")) {
    printf("SKIP: EMBPS_TEST_NO_PRELOAD is set\n");
    return DUR_SKIP;
  }
  disk_t d;
  char body[512];
  if (start_faulty(&d, "frozen", shim))
    goto out;
  int st = readyz(&d, body, sizeof body);
  if (st != 200) {
    dur_fail("frozen: /readyz %d before the freeze: %s", st, body);
    goto out;
  }
  set_ctl_all(&d, -1, 0, 0, 1); /* every fsync under the dir hangs */
  frozen_push_t p = {.d = &d, .rc = -2};
  pthread_t t;
  pthread_create(&t, NULL, frozen_push, &p);
  double t0 = dur_now_ms(), seen = -1;
  while (dur_now_ms() - t0 < EMBPS_WAL_STALL_MS + 15000) {
    st = readyz(&d, body, sizeof body);
    if (st == 503) {
      seen = dur_now_ms() - t0;
      break;
    }
    dur_sleep_ms(200);
  }
  if (seen < 0)
    dur_fail("frozen: /readyz still %d %.0f ms into a frozen disk (bound "
             "%d ms): %s", st, dur_now_ms() - t0, EMBPS_WAL_STALL_MS, body);
  else if (!strstr(body, "sync"))
    dur_fail("frozen: /readyz 503 does not say the log's sync stalls: %s",
             body);
  else
    dur_note("frozen: /readyz 503 after %.0f ms: %s", seen, body);
  set_ctl_all(&d, -1, 0, 0, 0);
  pthread_join(t, NULL);
  if (p.rc)
    dur_fail("frozen: the push held by the frozen disk failed once it "
             "answered: %d", p.rc);
  t0 = dur_now_ms();
  do {
    st = readyz(&d, body, sizeof body);
  } while (st != 200 && dur_now_ms() - t0 < 10000 && (dur_sleep_ms(100), 1));
  if (st != 200)
    dur_fail("frozen: /readyz %d after the disk came back: %s", st, body);
  if (dur_server_term(&d.srv, 20000) != 0)
    dur_fail("frozen: SIGTERM after the freeze did not exit 0");
out:
  finish_faulty(&d);
  return dur_failures() ? 1 : 0;
}
