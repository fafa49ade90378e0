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
 *   so, pulls keep working; the restart recovers everything acknowledged. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dur_scenarios.h"
#include "dur_util.h"

#define DUR_EIO (-30022) /* EMBPS_EIO of the durability contract */

typedef struct {
  const char *name;
  dur_server_t srv;
  dur_workload_t wl;
  char data[512];
  char ctl[600];          /* faultfs control file ("" for tmpfs) */
  int ctl_gen;
  uint64_t wit_acked, ada_acked;
  uint64_t wit_maybe;     /* unacknowledged witness pushes (fsync error) */
  char **ckpt_files;      /* the last good checkpoint and its hashes */
  uint64_t *ckpt_hash;
  size_t n_ckpt;
  uint64_t acked_at_ckpt; /* pushes acknowledged when it was taken */
} disk_t;

static void set_ctl(disk_t *d, long long budget, int fsync_eio) {
  char tmp[700], line[96];
  snprintf(tmp, sizeof tmp, "%s.tmp", d->ctl);
  snprintf(line, sizeof line, "%lld %d %d\n", budget, fsync_eio,
           ++d->ctl_gen);
  FILE *f = fopen(tmp, "w");
  if (!f || fputs(line, f) < 0 || fclose(f) || rename(tmp, d->ctl))
    dur_fail("%s: cannot write the control file %s", d->name, d->ctl);
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
  char ctlenv[700], direnv[600], preload[600];
  if (mnt) {
    snprintf(d.data, sizeof d.data, "%s/data", mnt);
    mkdir(d.data, 0755);
  } else {
    dur_mkdtemp(d.data, sizeof d.data, "faultfs-data");
    snprintf(d.ctl, sizeof d.ctl, "%s.ctl", d.data);
    set_ctl(&d, -1, 0);
  }
  dur_server_init(&d.srv, d.data);
  d.srv.fsync = "always";
  if (!mnt) {
    snprintf(preload, sizeof preload, "LD_PRELOAD=%s", shim);
    snprintf(direnv, sizeof direnv, "FAULTFS_DIR=%s", d.data);
    snprintf(ctlenv, sizeof ctlenv, "FAULTFS_CTL=%s", d.ctl);
    d.srv.env[0] = preload;
    d.srv.env[1] = direnv;
    d.srv.env[2] = ctlenv;
  }
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
