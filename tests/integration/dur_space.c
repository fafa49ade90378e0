/* dur_space.c - the data dir's disk is bounded by default and a full one
 * recovers by itself (README "Durability", "Disk"; server/space.h). The
 * data dir is on a real 64 MiB tmpfs in a mount namespace of its own (we
 * are root); without one the scenarios are skipped, saying why.
 *
 * space: a push storm (two clients, ~1 MiB records, for 5 s and until 5
 *   times the volume went through the log) against a server with the
 *   default flags. The file system never fills (sampled every 2 ms), no
 *   push fails for want of space (a refusal, if the storm outruns a
 *   checkpoint, must be the reserve's, never ENOSPC), most pushes are
 *   acknowledged, checkpoints are taken for the log's size; afterwards
 *   the log is small, the final checkpoint's line (SIGTERM) names no
 *   trigger, and a restart restores. Without the log-size trigger and the reserve the log fills
 *   the volume within a second and every later push fails.
 * space-full: with --checkpoint-log-bytes 0 (the log may grow), another
 *   file leaves less than the reserve free: pushes go on by themselves once
 *   the server has checkpointed for room (the filler stays), the disk
 *   never fills. Then the disk is filled to the last byte: pushes are
 *   refused with EMBPS_EIO, one ERROR line a second, `embps stats` and
 *   embps_durability_failed say so, pulls go on. The filler is removed:
 *   pushes, `embps checkpoint` and SIGTERM (exit 0) work without a
 *   restart; the restart restores exactly what was acknowledged. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "dur_scenarios.h"
#include "dur_util.h"
#include "http.h"

#define DUR_EIO (-30022)
#define VOLUME_MB 64
#define BIG_ROWS 16384 /* the "big" table: SGD, dense */
#define BIG_DIM 64
#define BIG_BATCH 4096 /* distinct rows per push: a ~1 MiB log record */
#define RESERVE_SAYS "kept for the next checkpoint"

static int create_big(embps_client_t *c) {
  embps_table_spec_t s;
  embps_table_spec_init(&s, "big", BIG_DIM, EMBPS_OPT_SGD);
  s.rows = BIG_ROWS;
  s.lr = 0.001;
  int rc = embps_create_table(c, &s);
  if (rc)
    dur_fail("create table big: %s", embps_client_last_error(c));
  return rc;
}

/* Push j of "big": the (j mod 4)th quarter of its rows, so that any four
 * pushes in a row make every row. */
static float big_vals[BIG_BATCH * BIG_DIM];
static pthread_once_t big_vals_once = PTHREAD_ONCE_INIT;

static void big_vals_fill(void) {
  for (size_t i = 0; i < sizeof big_vals / sizeof *big_vals; i++)
    big_vals[i] = 0.25f;
}

static int push_big(embps_client_t *c, uint64_t j) {
  int64_t ids[BIG_BATCH];
  for (int i = 0; i < BIG_BATCH; i++)
    ids[i] = (int64_t)((j % (BIG_ROWS / BIG_BATCH)) * BIG_BATCH + i);
  pthread_once(&big_vals_once, big_vals_fill); /* the pushers share it */
  return embps_push(c, "big", ids, BIG_BATCH, big_vals, BIG_DIM, 0);
}

static uint64_t free_bytes(const char *mnt) {
  struct statvfs st;
  return statvfs(mnt, &st) ? 0 : (uint64_t)st.f_bavail * st.f_frsize;
}

/* ------------------------------------------------------------ the storm */

typedef struct {
  const char *mnt, *addr;
  atomic_int stop;
  atomic_uint_fast64_t min_free;
  /* per pusher */
  atomic_uint_fast64_t acked[2], refused[2];
  atomic_int enospc[2]; /* a refusal that was not the reserve's */
  char other[2][512];   /* written before enospc is set */
} storm_t;

static void *sample_free(void *arg) {
  storm_t *s = arg;
  while (!atomic_load(&s->stop)) {
    uint64_t f = free_bytes(s->mnt);
    if (f < atomic_load(&s->min_free))
      atomic_store(&s->min_free, f);
    usleep(2000);
  }
  return NULL;
}

typedef struct {
  storm_t *s;
  int k;
} pusher_t;

static void *pusher(void *arg) {
  pusher_t *p = arg;
  storm_t *s = p->s;
  embps_client_t *c = dur_connect(s->addr, 30000, DUR_RETRY_DEFAULT,
                                  "storm");
  for (uint64_t j = (uint64_t)p->k << 32; c && !atomic_load(&s->stop); j++) {
    int rc = push_big(c, j);
    if (!rc) {
      atomic_fetch_add(&s->acked[p->k], 1);
      continue;
    }
    atomic_fetch_add(&s->refused[p->k], 1);
    const char *msg = embps_client_last_error(c);
    if (rc != DUR_EIO || !strstr(msg, RESERVE_SAYS)) {
      snprintf(s->other[p->k], sizeof s->other[p->k], "%s: %s",
               embps_err_name(rc), msg);
      atomic_store(&s->enospc[p->k], 1);
      break;
    }
  }
  embps_client_destroy(c);
  return NULL;
}

static int count_lines(const char *log, const char *what) {
  int n = 0;
  for (const char *p = log; (p = strstr(p, what)); p++)
    n++;
  return n;
}

int dur_scenario_space(void) {
  if (!dur_engine_present()) {
    printf("SKIP: embps-server has no --data-dir in this build\n");
    return DUR_SKIP;
  }
  char mnt[256], why[512], data[400];
  if (dur_tmpfs_mount(mnt, sizeof mnt, "64m", why, sizeof why)) {
    printf("SKIP: cannot mount a small tmpfs: %s\n", why);
    return DUR_SKIP;
  }
  snprintf(data, sizeof data, "%s/data", mnt);
  dur_server_t srv;
  dur_server_init(&srv, data); /* the default flags: no checkpoint flag */
  storm_t s = {.mnt = mnt, .addr = srv.addr};
  atomic_init(&s.min_free, UINT64_MAX);
  embps_client_t *c = NULL;
  if (dur_server_start(&srv, 20000)) {
    dur_fail("space: start failed");
    goto out;
  }
  c = dur_connect(srv.addr, 30000, DUR_RETRY_DEFAULT, "space");
  if (!c || create_big(c))
    goto out;
  pthread_t sampler, th[2];
  pusher_t ps[2] = {{&s, 0}, {&s, 1}};
  pthread_create(&sampler, NULL, sample_free, &s);
  for (int k = 0; k < 2; k++)
    pthread_create(&th[k], NULL, pusher, &ps[k]);
  /* at least 5 s, and until 5 x the volume went through the log (a slow
   * build, a busy machine), 120 s at most */
  const uint64_t want = 5 * (VOLUME_MB << 20) /
                        ((uint64_t)BIG_BATCH * (8 + 4 * BIG_DIM));
  for (double t0 = dur_now_ms();
       !atomic_load(&s.enospc[0]) && !atomic_load(&s.enospc[1]) &&
       dur_now_ms() - t0 < 120000 &&
       (dur_now_ms() - t0 < 5000 ||
        atomic_load(&s.acked[0]) + atomic_load(&s.acked[1]) < want);)
    dur_sleep_ms(50);
  atomic_store(&s.stop, 1);
  for (int k = 0; k < 2; k++)
    pthread_join(th[k], NULL);
  pthread_join(sampler, NULL);
  uint64_t acked = atomic_load(&s.acked[0]) + atomic_load(&s.acked[1]);
  uint64_t refused = atomic_load(&s.refused[0]) + atomic_load(&s.refused[1]);
  double pushed_mb = (double)acked * BIG_BATCH * (8 + 4 * BIG_DIM) / 1048576;
  dur_note("space: %llu pushes acknowledged (%.0f MB of log through a %d "
           "MB volume), %llu refused (for the reserve); least free seen %llu "
           "bytes", (unsigned long long)acked, pushed_mb, VOLUME_MB,
           (unsigned long long)refused,
           (unsigned long long)atomic_load(&s.min_free));
  for (int k = 0; k < 2; k++)
    if (s.enospc[k])
      dur_fail("space: a push failed for want of space with the default "
               "flags: %s", s.other[k]);
  if (atomic_load(&s.min_free) == 0)
    dur_fail("space: the data dir's file system filled up");
  if (pushed_mb < 4 * VOLUME_MB)
    dur_fail("space: the storm pushed only %.0f MB of log in 120 s, less "
             "than 4 x the volume: it proves nothing", pushed_mb);
  if (acked < 2 * refused)
    dur_fail("space: %llu pushes refused against %llu acknowledged",
             (unsigned long long)refused, (unsigned long long)acked);
  char *log = dur_server_log(&srv);
  if (!count_lines(log, "for the log's size"))
    dur_fail("space: no checkpoint was taken for the log's size");
  free(log);
  /* the checkpoint due at the end of the storm leaves at most a quarter of
   * the volume (the default limit on it) */
  uint64_t log_bytes = UINT64_MAX;
  for (double t0 = dur_now_ms();
       log_bytes > (VOLUME_MB << 20) / 4 && dur_now_ms() - t0 < 10000;) {
    embps_server_stats_t *st;
    size_t n;
    if (!embps_stats(c, &st, &n)) {
      log_bytes = st[0].log_bytes;
      embps_stats_free(st, n);
    }
    if (log_bytes > (VOLUME_MB << 20) / 4)
      dur_sleep_ms(100);
  }
  if (log_bytes > (VOLUME_MB << 20) / 4)
    dur_fail("space: the log still holds %llu bytes 10 s after the storm",
             (unsigned long long)log_bytes);
  embps_client_destroy(c);
  c = NULL;
  int code = dur_server_term(&srv, 30000);
  if (code)
    dur_fail("space: SIGTERM after the storm: exit %d", code);
  /* the final checkpoint has no trigger: its line must not name the last
   * periodic one's */
  log = dur_server_log(&srv);
  const char *last = NULL;
  for (const char *p = log; p && (p = strstr(p, "checkpoint at LSN")); p++)
    last = p;
  const char *eol = last ? strchr(last, '\n') : NULL;
  if (!last)
    dur_fail("space: no final checkpoint line after SIGTERM");
  else if (strstr(last, ", for ") &&
           (!eol || strstr(last, ", for ") < eol))
    dur_fail("space: the final checkpoint's line names a trigger: %.*s",
             eol ? (int)(eol - last) : 200, last);
  free(log);
  if (dur_server_start(&srv, 30000))
    dur_fail("space: restart after the storm failed");
out:
  embps_client_destroy(c);
  if (dur_failures())
    dur_server_dump_log(&srv);
  dur_server_kill(&srv);
  dur_server_cleanup(&srv);
  dur_tmpfs_unmount(mnt);
  return dur_failures() ? 1 : 0;
}

/* ------------------------------------------------------------ full */

typedef struct {
  dur_server_t srv;
  dur_workload_t wl;
  int mport;
  uint64_t wit_acked;
} full_t;

static double metric(full_t *f, const char *name) {
  char *body;
  int st = test_http_get(f->mport, "/metrics", &body);
  double v = st == 200 ? dur_metric(body, name) : -1;
  free(body);
  return v;
}

/* A witness push: 0 (counted) or its code; refusals must be EMBPS_EIO. */
static int push_wit(full_t *f, embps_client_t *c, const char *when) {
  int rc = dur_push_wit(c, &f->wl, 0);
  if (!rc)
    f->wit_acked++;
  else if (rc != DUR_EIO)
    dur_fail("space-full: %s: push refused with %s, want EMBPS_EIO: %s",
             when, embps_err_name(rc), embps_client_last_error(c));
  return rc;
}

/* The witness must count exactly the acknowledged pushes. */
static void check_wit(full_t *f, embps_client_t *c, const char *when) {
  double wit[2];
  if (dur_pull_wit(c, &f->wl, wit))
    dur_fail("space-full: %s: pull refused: %s", when,
             embps_client_last_error(c));
  else if (wit[0] != (double)f->wit_acked)
    dur_fail("space-full: %s: witness %.0f, %llu pushes acknowledged", when,
             wit[0], (unsigned long long)f->wit_acked);
}

/* Writes n bytes more to path. */
static int grow_file(const char *path, uint64_t n) {
  FILE *fp = fopen(path, "a");
  static char block[65536];
  while (fp && n) {
    size_t k = n < sizeof block ? (size_t)n : sizeof block;
    if (fwrite(block, 1, k, fp) != k)
      break;
    n -= k;
  }
  return fp && !fclose(fp) && !n ? 0 : -1;
}

/* Less than the reserve free, more than a checkpoint: the server must
 * make room itself (the pushes are small: those the server lets in before
 * it sees the filler, within 100 ms, must not eat the checkpoint's room). */
static void room_phase(full_t *f, embps_client_t *c, const char *mnt) {
  double ckpt = metric(f, "embps_checkpoint_bytes");
  double reserve = metric(f, "embps_checkpoint_reserve_bytes");
  uint64_t free_now = free_bytes(mnt);
  uint64_t target = (uint64_t)(ckpt + reserve) / 2;
  char filler[600];
  snprintf(filler, sizeof filler, "%s/filler", mnt);
  if (ckpt <= 0 || reserve <= ckpt || free_now <= target ||
      grow_file(filler, (free_now - target) / 4096 * 4096)) {
    dur_fail("space-full: cannot leave %llu bytes free (checkpoint %.0f, "
             "reserve %.0f, free %llu)", (unsigned long long)target, ckpt,
             reserve, (unsigned long long)free_now);
    return;
  }
  dur_note("space-full: %llu bytes free, a checkpoint takes %.0f, %.0f kept "
           "for one", (unsigned long long)free_bytes(mnt), ckpt, reserve);
  uint64_t acked = 0, refused = 0;
  int last = -1;
  for (double t0 = dur_now_ms(); dur_now_ms() - t0 < 3000;) {
    last = push_wit(f, c, "short of the reserve");
    if (!last) {
      acked++;
    } else if (last == DUR_EIO &&
               (strstr(embps_client_last_error(c), RESERVE_SAYS) ||
                strstr(embps_client_last_error(c), "No space left"))) {
      refused++; /* the reserve, or a write before statvfs showed the
                    filler (the server looks again within 100 ms) */
    } else {
      dur_fail("space-full: with the disk short of the reserve, a push "
               "failed otherwise than for want of space: %s: %s",
               embps_err_name(last), embps_client_last_error(c));
      return;
    }
    if (free_bytes(mnt) == 0) {
      dur_fail("space-full: the disk filled up");
      return;
    }
  }
  char *log = dur_server_log(&f->srv);
  int room = count_lines(log, "for room in the data dir");
  free(log);
  dur_note("space-full: %llu pushes acknowledged, %llu refused for the "
           "reserve, %d checkpoints for room", (unsigned long long)acked,
           (unsigned long long)refused, room);
  if (!room)
    dur_fail("space-full: the server took no checkpoint to make room");
  if (last || acked < 10)
    dur_fail("space-full: pushes did not resume by themselves (%llu "
             "acknowledged, the last push: %s)", (unsigned long long)acked,
             last ? embps_client_last_error(c) : "acknowledged");
  unlink(filler);
}

/* Full to the last byte, then space back. */
static void full_phase(full_t *f, embps_client_t *c, const char *mnt) {
  char filler[600];
  if (dur_fill_fs(mnt, filler, sizeof filler) || free_bytes(mnt)) {
    dur_fail("space-full: cannot fill the tmpfs");
    return;
  }
  char *log = dur_server_log(&f->srv);
  const char *said = " more refused since the last such line)";
  int errors_before = count_lines(log, said);
  free(log);
  int refused = 0, tries = 0;
  double t0 = dur_now_ms();
  for (; dur_now_ms() - t0 < 2500; tries++)
    if (push_wit(f, c, "disk full"))
      refused++;
  double secs = (dur_now_ms() - t0) / 1000;
  log = dur_server_log(&f->srv);
  int errors = count_lines(log, said) - errors_before;
  long skipped = 0; /* the most a line says it left out */
  for (const char *p = log; (p = strstr(p, " more refused since")); p++) {
    const char *q = p;
    while (q > log && q[-1] >= '0' && q[-1] <= '9')
      q--;
    if (atol(q) > skipped)
      skipped = atol(q);
  }
  free(log);
  dur_note("space-full: disk full: %d of %d pushes refused in %.1f s, %d "
           "ERROR lines about them", refused, tries, secs, errors);
  /* a few may fit the room left in the log file's last page */
  if (refused < tries / 2)
    dur_fail("space-full: %d of %d pushes acknowledged on a full disk",
             tries - refused, tries);
  if (errors > (int)secs + 2 || errors < 1)
    dur_fail("space-full: %d ERROR lines for %d refused pushes in %.1f s: "
             "want one a second", errors, refused, secs);
  if (refused > errors && !skipped)
    dur_fail("space-full: no ERROR line counts the refusals it left out");
  if (metric(f, "embps_durability_failed") != 1)
    dur_fail("space-full: embps_durability_failed is not 1 on a full disk");
  if (metric(f, "embps_log_refused_total") < refused)
    dur_fail("space-full: embps_log_refused_total below the refusals");
  const char *args[] = {"stats", NULL};
  char *out = NULL;
  dur_cli(f->srv.addr, args, &out, NULL);
  if (!out || !strstr(out, "DURABILITY FAILED") || !strstr(out, mnt))
    dur_fail("space-full: `embps stats` does not say the data dir is full: "
             "%.600s", out ? out : "");
  free(out);
  check_wit(f, c, "pulls on a full disk");

  unlink(filler); /* space again: no restart, no command */
  int rc = -1;
  for (t0 = dur_now_ms(); rc && dur_now_ms() - t0 < 10000;)
    if ((rc = push_wit(f, c, "space freed")))
      dur_sleep_ms(50);
  if (rc)
    dur_fail("space-full: pushes still refused 10 s after space returned: "
             "%s", embps_client_last_error(c));
  if (metric(f, "embps_durability_failed") != 0)
    dur_fail("space-full: embps_durability_failed stays 1 with space back");
  const char *ck[] = {"checkpoint", NULL};
  char *err = NULL;
  if (dur_cli(f->srv.addr, ck, NULL, &err))
    dur_fail("space-full: checkpoint with space back failed: %s", err);
  free(err);
  check_wit(f, c, "with space back");
}

int dur_scenario_space_full(void) {
  if (!dur_engine_present()) {
    printf("SKIP: embps-server has no --data-dir in this build\n");
    return DUR_SKIP;
  }
  char mnt[256], why[512], data[400], mport_file[600];
  if (dur_tmpfs_mount(mnt, sizeof mnt, "64m", why, sizeof why)) {
    printf("SKIP: cannot mount a small tmpfs: %s\n", why);
    return DUR_SKIP;
  }
  snprintf(data, sizeof data, "%s/data", mnt);
  full_t f;
  memset(&f, 0, sizeof f);
  f.wl = (dur_workload_t){.n_workers = 1, .rows_per_worker = 64, .seed = 7};
  dur_server_init(&f.srv, data);
  snprintf(mport_file, sizeof mport_file, "%s/mport", f.srv.work);
  const char *args[] = {"--checkpoint-log-bytes", "0", "--metrics-listen",
                        "127.0.0.1:0", "--metrics-port-file", mport_file,
                        NULL};
  memcpy(f.srv.args, args, sizeof args);
  embps_client_t *c = NULL;
  if (dur_server_start(&f.srv, 20000) ||
      (f.mport = it_read_port(mport_file)) <= 0) {
    dur_fail("space-full: start failed");
    goto out;
  }
  c = dur_connect(f.srv.addr, 30000, DUR_RETRY_DEFAULT, "space-full");
  if (!c || dur_create_tables(c, &f.wl) || create_big(c))
    goto out;
  /* every row of big, a checkpoint (its size is what the next one takes:
   * no row is made after it), then 20 MB of log */
  for (uint64_t j = 0; j < BIG_ROWS / BIG_BATCH + 20; j++) {
    const char *ck[] = {"checkpoint", NULL};
    if (j == BIG_ROWS / BIG_BATCH && dur_cli(f.srv.addr, ck, NULL, NULL))
      dur_fail("space-full: the first checkpoint failed");
    if (push_big(c, j) || push_wit(&f, c, "setup"))
      dur_fail("space-full: setup push refused: %s",
               embps_client_last_error(c));
  }
  if (dur_failures())
    goto out;
  room_phase(&f, c, mnt);
  if (!dur_failures())
    full_phase(&f, c, mnt);
  embps_client_destroy(c);
  c = NULL;
  int code = dur_server_term(&f.srv, 30000);
  if (code)
    dur_fail("space-full: SIGTERM: exit %d, want 0", code);
  if (dur_server_start(&f.srv, 30000)) {
    dur_fail("space-full: restart failed");
    goto out;
  }
  c = dur_connect(f.srv.addr, 30000, DUR_RETRY_DEFAULT, "space-full");
  if (c)
    check_wit(&f, c, "after the restart");
out:
  embps_client_destroy(c);
  if (dur_failures())
    dur_server_dump_log(&f.srv);
  dur_server_kill(&f.srv);
  dur_server_cleanup(&f.srv);
  dur_tmpfs_unmount(mnt);
  return dur_failures() ? 1 : 0;
}
