/* dur_kill.c - the kill -9 loop: worker processes push to their witness
 * rows (SGD lr 1, gradient -1: the row counts applied pushes) and to their
 * own Adagrad rows while the server (--fsync always, a data dir) is killed
 * at random moments and restarted on the same port and dir. After every
 * restart, with the workers stopped (SIGSTOP), each witness must lie in
 * [acknowledged, acknowledged + in flight]; at the end, once the workers'
 * retries resolved their last push, witness == acknowledged exactly and the
 * Adagrad rows equal, bit for bit, a replay of the acknowledged pushes.
 *
 * The negative control (unsafe = 1) runs the server with
 * EMBPS_TEST_UNSAFE_ACK=1 (acks before the log record is written) and
 * succeeds only when the check above detects a lost acknowledged push. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dur_scenarios.h"
#include "dur_util.h"

#define MAX_WORKERS DUR_MAX_WORKERS

typedef dur_shared_t shared_t;

int dur_scenario_kill(int unsafe) {
  if (!dur_engine_present()) {
    printf("SKIP: embps-server has no --data-dir in this build\n");
    return DUR_SKIP;
  }
  if (!dur_client_retries()) {
    printf("SKIP: the client library has no push retries "
           "(embps_client_options_t.retry_ms) in this build\n");
    return DUR_SKIP;
  }
  uint64_t seed = dur_seed();
  uint64_t rng = seed;
  dur_workload_t wl = {.n_workers = 4, .rows_per_worker = 64, .seed = seed};
  int cycles = dur_long() ? 300 : 30;
  if (unsafe)
    cycles = dur_long() ? 200 : 60; /* stops at the first detected loss */
  double storm_max_ms = dur_long() ? 3000 : 500;

  char data[256], acks[256];
  dur_mkdtemp(data, sizeof data, "kill-data");
  dur_mkdtemp(acks, sizeof acks, "kill-acks");
  dur_server_t srv;
  dur_server_init(&srv, data);
  srv.fsync = "always";
  srv.args[0] = "--checkpoint-every";
  srv.args[1] = "1";
  srv.args[2] = "--shards";
  srv.args[3] = "4";
  if (unsafe)
    srv.env[0] = "EMBPS_TEST_UNSAFE_ACK=1";
  if (dur_server_start(&srv, 20000)) {
    dur_fail("first start failed");
    dur_server_dump_log(&srv);
    return 1;
  }
  embps_client_t *c = dur_connect(srv.addr, 10000, DUR_RETRY_DEFAULT, "setup");
  if (!c || dur_create_tables(c, &wl))
    return 1;
  embps_client_destroy(c);
  /* The tables in a checkpoint: with the unsafe ack even the creation's
   * log record may be lost, and the control is about pushes. */
  const char *ckpt_args[] = {"checkpoint", NULL};
  char *ckpt_err = NULL;
  if (dur_cli(srv.addr, ckpt_args, NULL, &ckpt_err) != 0)
    dur_fail("embps checkpoint after creating the tables: %s", ckpt_err);
  free(ckpt_err);

  shared_t *sh = dur_shared_new();
  if (!sh)
    return 1;
  pid_t pids[MAX_WORKERS] = {0};
  for (int w = 0; w < wl.n_workers; w++)
    pids[w] = dur_worker_spawn(sh, &wl, w, srv.addr, acks, 60000);

  int detected = 0;
  int cycle;
  for (cycle = 0; cycle < cycles && !dur_failures(); cycle++) {
    double storm = 50 + (double)(rng_next(&rng) % 1000) / 1000.0 *
                            storm_max_ms;
    if (rng_next(&rng) % 4 == 0) { /* a checkpoint on demand too */
      dur_sleep_ms(storm / 2);
      const char *args[] = {"checkpoint", NULL};
      char *err = NULL;
      if (dur_cli(srv.addr, args, NULL, &err) != 0)
        dur_fail("cycle %d: embps checkpoint failed: %s", cycle, err);
      free(err);
      dur_sleep_ms(storm / 2);
    } else {
      dur_sleep_ms(storm);
    }
    dur_server_kill(&srv);
    int rc = dur_server_start(&srv, 30000);
    if (rc) {
      dur_fail("cycle %d: restart after kill -9 failed (status %d)", cycle,
               rc);
      dur_server_dump_log(&srv);
      break;
    }
    dur_workers_stop(pids, wl.n_workers);
    char when[64];
    snprintf(when, sizeof when, "cycle %d (after restart)", cycle);
    embps_client_t *chk = dur_connect(srv.addr, 10000, DUR_RETRY_DEFAULT, when);
    if (chk) {
      int lost = dur_check_witness(chk, &wl, sh, when, 0, !unsafe);
      if (lost && unsafe)
        detected = 1;
    }
    embps_client_destroy(chk);
    dur_workers_alive(pids, wl.n_workers, sh);
    dur_workers_cont(pids, wl.n_workers);
    if (detected) {
      cycle++;
      break;
    }
  }
  uint64_t total = 0;
  for (int w = 0; w < wl.n_workers; w++)
    total += atomic_load(&sh->w[w].acked_wit);
  dur_note("%d kill -9 cycles, %llu witness pushes acknowledged", cycle,
           (unsigned long long)total);

  /* The end: each worker's push in flight at the last kill resolves and
   * one more is acknowledged (or the worker failed: reported by finish),
   * then the workers stop. */
  for (int w = 0; w < wl.n_workers; w++) {
    uint64_t at = atomic_load(&sh->w[w].acked_ada);
    if (dur_worker_wait_acked(sh, w, at + 2, 60000) < 0)
      dur_fail("worker %d made no progress within 60 s of the last restart",
               w);
  }
  dur_workers_finish(sh, pids, wl.n_workers, 90000, 1);

  if (unsafe) {
    dur_server_kill(&srv);
    if (!detected)
      dur_fail("negative control: %d kill -9 cycles with "
               "EMBPS_TEST_UNSAFE_ACK=1 and no lost acknowledged push was "
               "detected: the loss detector does not fire", cycle);
    else
      dur_note("negative control: the check detected lost acknowledged "
               "pushes, as it must");
    int bad = dur_failures();
    dur_server_cleanup(&srv);
    dur_rm_rf(data);
    dur_rm_rf(acks);
    dur_shared_free(sh);
    return bad ? 1 : 0;
  }

  /* Exact final check, then a graceful restart must change nothing. */
  embps_client_t *chk = dur_connect(srv.addr, 10000, DUR_RETRY_DEFAULT,
                                    "final check");
  uint64_t counts[MAX_WORKERS];
  for (int w = 0; w < wl.n_workers; w++)
    counts[w] = atomic_load(&sh->w[w].acked_ada);
  float *before = NULL;
  if (chk) {
    dur_check_witness(chk, &wl, sh, "end (workers finished)", 1, 1);
    before = dur_pull_ada(chk, &wl);
    embps_client_destroy(chk);
    chk = NULL;
  }
  for (int w = 0; w < wl.n_workers; w++) { /* the workers' own records */
    char path[600], line[64];
    snprintf(path, sizeof path, "%s/worker-%d.acks", acks, w);
    FILE *f = fopen(path, "r");
    uint64_t lines = 0;
    while (f && fgets(line, sizeof line, f))
      if (strtoull(line, NULL, 10) == lines)
        lines++;
    if (f)
      fclose(f);
    if (lines != counts[w])
      dur_fail("worker %d: its record %s lists %llu acknowledged pushes in "
               "order, the shared counter %llu", w, path,
               (unsigned long long)lines, (unsigned long long)counts[w]);
  }
  float *replay = dur_replay_ada(&wl, counts);
  if (before && replay)
    dur_compare_ada(&wl, replay, before, "end of the kill -9 loop");

  int rc = dur_server_term(&srv, 30000);
  if (rc != 0)
    dur_fail("SIGTERM at the end: exit status %d (want 0)", rc);
  if (dur_server_start(&srv, 30000)) {
    dur_fail("restart after SIGTERM failed");
    dur_server_dump_log(&srv);
  } else if ((chk = dur_connect(srv.addr, 10000, DUR_RETRY_DEFAULT,
                                 "after SIGTERM")) != NULL) {
    dur_check_witness(chk, &wl, sh, "after SIGTERM and restart", 1, 1);
    float *after = dur_pull_ada(chk, &wl);
    if (after && before)
      dur_compare_ada(&wl, before, after, "after SIGTERM and restart");
    free(after);
    /* Accumulators: one more push to this server and to a replay. */
    it_server_t ref;
    embps_client_t *rc2;
    if (!dur_replay_open(&wl, counts, &ref, &rc2)) {
      dur_probe_accumulators(&wl, rc2, chk, "end of the kill -9 loop");
      dur_replay_close(&ref, rc2);
    }
    embps_client_destroy(chk);
  }
  free(before);
  free(replay);
  int bad = dur_failures();
  if (bad)
    dur_server_dump_log(&srv);
  dur_server_cleanup(&srv);
  if (!bad) {
    dur_rm_rf(data);
    dur_rm_rf(acks);
  } else {
    fprintf(stderr, "data dir kept: %s; acknowledged pushes per worker: "
            "%s/worker-*.acks\n", data, acks);
  }
  dur_shared_free(sh);
  return bad ? 1 : 0;
}
