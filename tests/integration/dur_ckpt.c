/* dur_ckpt.c - a crash at each named checkpoint failpoint
 * (EMBPS_FAILPOINT=ckpt-...: the server SIGKILLs itself there) while a
 * worker keeps pushing: the data dir then holds the old checkpoint (crash
 * before the rename) or the old and the new one (after it), never a
 * half-written one under a final name; the restart loses no acknowledged
 * push (witness rows exact, Adagrad rows equal to a replay) and leaves no
 * temporary checkpoint behind; a checkpoint of the recovered state and one
 * more restart change nothing. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dur_scenarios.h"
#include "dur_util.h"

static const struct {
  const char *name;
  int new_visible; /* the new checkpoint exists under its final name */
} failpoints[] = {
    {"ckpt-before-write", 0}, {"ckpt-mid-write", 0},
    {"ckpt-before-rename", 0}, {"ckpt-after-rename", 1},
    {"ckpt-before-delete", 1},
};

/* Final (non-.tmp) checkpoint directories of data, as a list. */
static size_t final_ckpts(const char *data, char ***out) {
  char **all;
  size_t n = dur_list_names(data, "ckpt-", &all), k = 0;
  for (size_t i = 0; i < n; i++) {
    if (strstr(all[i], ".tmp")) {
      free(all[i]);
      continue;
    }
    all[k++] = all[i];
  }
  *out = all;
  return k;
}

static size_t tmp_ckpts(const char *data) {
  char **all;
  size_t n = dur_list_names(data, "ckpt-", &all), k = 0;
  for (size_t i = 0; i < n; i++)
    k += strstr(all[i], ".tmp") != NULL;
  dur_free_list(all, n);
  return k;
}

/* Checks the server's state: witness rows within [acked, acked + in flight]
 * of each worker, and the Adagrad rows equal to the replay of the
 * acknowledged pushes, or, when a worker's last Adagrad push is unresolved,
 * of the acknowledged ones plus that one. */
static void check_state(const char *addr, const dur_workload_t *wl,
                        const uint64_t *wit_acked, const int *wit_inflight,
                        const uint64_t *ada_acked, const int *ada_inflight,
                        const char *when, float **dump_out) {
  embps_client_t *c = dur_connect(addr, 10000, DUR_RETRY_DEFAULT, when);
  if (!c)
    return;
  double wit[2 * DUR_MAX_WORKERS];
  if (!dur_pull_wit(c, wl, wit)) {
    for (int w = 0; w < wl->n_workers; w++)
      for (int k = 0; k < 2; k++) {
        double v = wit[k * wl->n_workers + w];
        double hi = (double)(wit_acked[w] + (uint64_t)wit_inflight[w]);
        if (v < (double)wit_acked[w])
          dur_fail("%s: worker %d: witness row %d = %.0f but %llu pushes "
                   "acknowledged: pushes #%.0f..#%llu LOST", when, w,
                   k * wl->n_workers + w, v,
                   (unsigned long long)wit_acked[w], v,
                   (unsigned long long)wit_acked[w] - 1);
        else if (v > hi)
          dur_fail("%s: worker %d: witness row %d = %.0f > %.0f "
                   "acknowledged + in flight: DOUBLED", when, w,
                   k * wl->n_workers + w, v, hi);
      }
  }
  float *got = dur_pull_ada(c, wl);
  embps_client_destroy(c);
  if (!got)
    return;
  uint64_t counts[DUR_MAX_WORKERS];
  int unresolved = -1;
  for (int w = 0; w < wl->n_workers; w++) {
    counts[w] = ada_acked[w];
    if (ada_inflight[w])
      unresolved = w;
  }
  float *exp = dur_replay_ada(wl, counts);
  size_t bytes = (size_t)wl->n_workers * (size_t)wl->rows_per_worker *
                 DUR_ADA_DIM * sizeof(float);
  if (exp && memcmp(exp, got, bytes) != 0 && unresolved >= 0) {
    counts[unresolved]++; /* the unresolved push may have been applied */
    free(exp);
    exp = dur_replay_ada(wl, counts);
    if (exp && memcmp(exp, got, bytes) != 0) {
      counts[unresolved]--;
      free(exp);
      exp = dur_replay_ada(wl, counts);
    }
  }
  if (exp)
    dur_compare_ada(wl, exp, got, when);
  free(exp);
  if (dump_out)
    *dump_out = got;
  else
    free(got);
}

/* The server's start-up line "restored checkpoint DIR/ckpt-S" must name
 * the newest complete checkpoint on disk (old or new, never another). */
static void check_restored(const dur_server_t *srv, const char *fp,
                           const char *newest) {
  char *log = dur_server_log(srv);
  const char *r = log ? strstr(log, "restored checkpoint") : NULL;
  const char *name = r ? strstr(r, "/ckpt-") : NULL;
  if (name)
    name++;
  if (!name) {
    dur_note("%s: the start-up log names no restored checkpoint", fp);
  } else if (!newest || strncmp(name, newest, strlen(newest)) != 0 ||
             name[strlen(newest)] == '.') {
    dur_fail("%s: the restart restored %.40s, but the newest complete "
             "checkpoint on disk is %s", fp, name, newest ? newest : "none");
  }
  free(log);
}

static void run_failpoint(const char *fp, int new_visible, uint64_t seed) {
  dur_workload_t wl = {.n_workers = 2, .rows_per_worker = 4096,
                       .seed = seed};
  char data[256], when[160];
  dur_mkdtemp(data, sizeof data, "ckpt-data");
  dur_server_t srv;
  dur_server_init(&srv, data);
  srv.fsync = "always";
  srv.args[0] = "--shards";
  srv.args[1] = "4";
  uint64_t wit_acked[2] = {0, 0}, ada_acked[2] = {0, 0};
  int wit_infl[2] = {0, 0}, ada_infl[2] = {0, 0};
  dur_shared_t *sh = NULL;
  pid_t pids[2] = {0, 0};
  char **old = NULL, **now = NULL;
  size_t n_old = 0, n_now = 0;
  const int setup = 40;

  if (dur_server_start(&srv, 20000)) {
    dur_fail("%s: first start failed", fp);
    dur_server_dump_log(&srv);
    goto out;
  }
  /* Worker 0 (this process): pushes, a checkpoint (the old one), pushes. */
  embps_client_t *c = dur_connect(srv.addr, 10000, DUR_RETRY_DEFAULT, fp);
  if (!c || dur_create_tables(c, &wl))
    goto out;
  for (int j = 0; j < 2 * setup; j++) {
    if (j == setup) {
      const char *args[] = {"checkpoint", NULL};
      char *err = NULL;
      if (dur_cli(srv.addr, args, NULL, &err))
        dur_fail("%s: embps checkpoint failed: %s", fp, err);
      free(err);
    }
    if (dur_push_wit(c, &wl, 0) || dur_push_ada(c, &wl, 0, (uint64_t)j)) {
      dur_fail("%s: setup push %d: %s", fp, j, embps_client_last_error(c));
      break;
    }
    wit_acked[0]++;
    ada_acked[0]++;
  }
  embps_client_destroy(c);
  dur_server_kill(&srv);
  n_old = final_ckpts(data, &old);
  if (n_old != 1)
    dur_fail("%s: after one checkpoint the data dir holds %zu checkpoints",
             fp, n_old);

  /* Restart armed; worker 1 pushes while a checkpoint hits the failpoint. */
  static char env[128];
  snprintf(env, sizeof env, "EMBPS_FAILPOINT=%s", fp);
  srv.env[0] = env;
  if (dur_server_start(&srv, 20000)) {
    dur_fail("%s: restart (armed) failed", fp);
    dur_server_dump_log(&srv);
    goto out;
  }
  sh = dur_shared_new();
  pids[1] = dur_worker_spawn(sh, &wl, 1, srv.addr, NULL, 60000);
  /* the checkpoint starts while the worker pushes */
  if (dur_worker_wait_acked(sh, 1, 3, 20000) < 0)
    dur_fail("%s: worker 1 had no 3 pushes acknowledged within 20 s", fp);
  {
    const char *args[] = {"checkpoint", NULL};
    int st = dur_cli(srv.addr, args, NULL, NULL);
    if (st == 0)
      dur_fail("%s: embps checkpoint succeeded although the server must "
               "have died at the failpoint", fp);
  }
  int st = dur_server_wait(&srv, 15000);
  if (st != 128 + 9) {
    dur_fail("%s: the server did not die at the failpoint (status %d, "
             "want 137 = SIGKILL)", fp, st);
    dur_server_dump_log(&srv);
    dur_server_kill(&srv);
  }
  n_now = final_ckpts(data, &now);
  snprintf(when, sizeof when, "%s: after the crash", fp);
  if (new_visible) {
    int has_old = 0, has_new = 0;
    for (size_t i = 0; i < n_now; i++) {
      if (n_old && !strcmp(now[i], old[0]))
        has_old = 1;
      else if (n_old && strcmp(now[i], old[0]) > 0)
        has_new = 1;
    }
    if (!has_new)
      dur_fail("%s: the new checkpoint is not in the data dir (crash after "
               "its rename)", when);
    (void)has_old; /* the old one may be gone (before-delete) or not */
  } else if (n_now != n_old || (n_now && strcmp(now[0], old[0]))) {
    dur_fail("%s: the data dir holds %zu final checkpoints (first %s), want "
             "only the old one %s: a checkpoint not completely written "
             "appeared under its final name", when, n_now,
             n_now ? now[0] : "-", n_old ? old[0] : "-");
  }
  dur_note("%s: %zu checkpoint(s) on disk after the crash (newest %s)", fp,
           n_now, n_now ? now[n_now - 1] : "none");

  /* Restart unarmed: the worker's retry resolves its last push. */
  srv.env[0] = NULL;
  if (dur_server_start(&srv, 30000)) {
    dur_fail("%s: restart after the crash failed", fp);
    dur_server_dump_log(&srv);
    goto out;
  }
  if (tmp_ckpts(data))
    dur_fail("%s: a temporary checkpoint directory is left after restart",
             fp);
  check_restored(&srv, fp, n_now ? now[n_now - 1] : NULL);
  /* the worker's push in flight at the crash resolves, and two more are
   * acknowledged by the recovered server (unless it stopped on the one in
   * flight: reported below) */
  uint64_t at_crash = atomic_load(&sh->w[1].acked_ada);
  if (dur_worker_wait_acked(sh, 1, at_crash + 3, 60000) < 0)
    dur_fail("%s: worker 1 made no progress within 60 s of the restart", fp);
  dur_workers_finish(sh, pids, 2, 60000, 0);
  wit_acked[1] = atomic_load(&sh->w[1].acked_wit);
  ada_acked[1] = atomic_load(&sh->w[1].acked_ada);
  wit_infl[1] = atomic_load(&sh->w[1].inflight_wit);
  ada_infl[1] = atomic_load(&sh->w[1].inflight_ada);
  if (sh->w[1].failed)
    dur_note("%s: worker 1 stopped on an unresolved push: %s", fp,
             sh->w[1].error);
  dur_note("%s: worker 1 had %llu witness pushes acknowledged", fp,
           (unsigned long long)wit_acked[1]);
  snprintf(when, sizeof when, "%s: after the restart", fp);
  float *dump = NULL;
  check_state(srv.addr, &wl, wit_acked, wit_infl, ada_acked, ada_infl, when,
              &dump);

  /* A checkpoint of the recovered state, a crash, a restart: same state. */
  {
    const char *args[] = {"checkpoint", NULL};
    char *err = NULL;
    if (dur_cli(srv.addr, args, NULL, &err))
      dur_fail("%s: checkpoint of the recovered state failed: %s", fp, err);
    free(err);
  }
  dur_server_kill(&srv);
  if (dur_server_start(&srv, 30000)) {
    dur_fail("%s: restart after the second checkpoint failed", fp);
    dur_server_dump_log(&srv);
  } else if (dump) {
    embps_client_t *c2 = dur_connect(srv.addr, 10000, DUR_RETRY_DEFAULT, fp);
    float *again = c2 ? dur_pull_ada(c2, &wl) : NULL;
    snprintf(when, sizeof when, "%s: after a new checkpoint and kill -9", fp);
    if (again)
      dur_compare_ada(&wl, dump, again, when);
    free(again);
    embps_client_destroy(c2);
  }
  free(dump);
out:
  if (sh) {
    dur_workers_finish(sh, pids, 2, 5000, 0);
    dur_shared_free(sh);
  }
  dur_free_list(old, n_old);
  dur_free_list(now, n_now);
  dur_server_cleanup(&srv);
  dur_rm_rf(data);
}

int dur_scenario_ckpt(void) {
  if (!dur_engine_present()) {
    printf("SKIP: embps-server has no --data-dir in this build\n");
    return DUR_SKIP;
  }
  uint64_t seed = dur_seed();
  int rounds = dur_long() ? 5 : 1;
  for (int r = 0; r < rounds; r++)
    for (size_t i = 0; i < sizeof failpoints / sizeof *failpoints; i++) {
      dur_note("failpoint %s (round %d)", failpoints[i].name, r);
      run_failpoint(failpoints[i].name, failpoints[i].new_visible,
                    seed + (uint64_t)r * 7919 + i);
    }
  return dur_failures() ? 1 : 0;
}
