/* dur_fsync.c - the --fsync policy observed from outside: tests/fault/
 * faultfs.c, preloaded into the server, appends a line to a file for every
 * fsync and fdatasync under the server's log directory (FAULTFS_SYNC_LOG),
 * and the scenario counts the fdatasyncs of log segments around pushes:
 *   always    every push is synced before it is acknowledged: after the
 *             acknowledgement of push i of a sequence, at least i more;
 *   everysec  a burst of pushes is acknowledged without a sync each, and
 *             within about a second of the last one, with no one waiting
 *             for it, the log thread syncs the log;
 *   never     pushes and then 1.5 s of quiet: no sync; a checkpoint (which
 *             needs the log durable up to its position) syncs it, and so
 *             does SIGTERM (the log is closed).
 * Skipped where nothing may be preloaded (sanitizer builds). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dur_scenarios.h"
#include "dur_util.h"

#define PUSHES 40

/* fdatasyncs of log segments (*.log) logged so far. */
static long segment_syncs(const char *sync_log) {
  FILE *f = fopen(sync_log, "r");
  if (!f)
    return 0;
  char line[4200];
  long n = 0;
  while (fgets(line, sizeof line, f)) {
    size_t len = strcspn(line, "\n");
    line[len] = 0;
    n += !strncmp(line, "fdatasync ", 10) && len > 4 &&
         !strcmp(line + len - 4, ".log");
  }
  fclose(f);
  return n;
}

typedef struct {
  const char *mode;
  char data[256], sync_log[600];
  dur_server_t srv;
  embps_client_t *c;
} fsync_case_t;

static int push(fsync_case_t *k, int i) {
  int64_t ids[2] = {i % 16, (i + 5) % 16};
  float g[2 * 4];
  for (int j = 0; j < 2 * 4; j++)
    g[j] = 0.25f;
  int rc = embps_push(k->c, "f", ids, 2, g, 4, 0);
  if (rc)
    dur_fail("%s: push %d: %s", k->mode, i, embps_client_last_error(k->c));
  return rc;
}

/* Starts the server with --fsync mode under the shim, and a table. */
static int start(fsync_case_t *k, const char *shim) {
  static char preload[600], dir[600], log[700];
  dur_mkdtemp(k->data, sizeof k->data, "fsync-data");
  dur_server_init(&k->srv, k->data);
  snprintf(k->sync_log, sizeof k->sync_log, "%s/syncs", k->srv.work);
  snprintf(preload, sizeof preload, "LD_PRELOAD=%s", shim);
  snprintf(dir, sizeof dir, "FAULTFS_DIR=%s/log", k->data);
  snprintf(log, sizeof log, "FAULTFS_SYNC_LOG=%s", k->sync_log);
  k->srv.env[0] = preload;
  k->srv.env[1] = dir;
  k->srv.env[2] = log;
  k->srv.fsync = k->mode;
  if (dur_server_start(&k->srv, 20000)) {
    dur_fail("%s: start failed", k->mode);
    dur_server_dump_log(&k->srv);
    return -1;
  }
  k->c = dur_connect(k->srv.addr, 10000, DUR_RETRY_DEFAULT, k->mode);
  embps_table_spec_t s;
  embps_table_spec_init(&s, "f", 4, EMBPS_OPT_SGD);
  s.rows = 16;
  if (k->c && embps_create_table(k->c, &s)) {
    dur_fail("%s: create: %s", k->mode, embps_client_last_error(k->c));
    return -1;
  }
  if (k->c && segment_syncs(k->sync_log) == 0) {
    dur_fail("%s: no fdatasync logged at the start: is %s preloaded?",
             k->mode, shim);
    return -1;
  }
  return k->c ? 0 : -1;
}

static void always(fsync_case_t *k) {
  long c0 = segment_syncs(k->sync_log);
  for (int i = 1; i <= PUSHES; i++) {
    if (push(k, i))
      return;
    long c = segment_syncs(k->sync_log);
    if (c < c0 + i) {
      dur_fail("always: %ld fdatasyncs of the log by the acknowledgement of "
               "push %d (want one per push at least)", c - c0, i);
      return;
    }
  }
  dur_note("always: %ld fdatasyncs for %d pushes",
           segment_syncs(k->sync_log) - c0, PUSHES);
}

static void everysec(fsync_case_t *k) {
  long c0 = segment_syncs(k->sync_log), before_last = c0;
  for (int i = 1; i <= PUSHES; i++) {
    if (i == PUSHES)
      before_last = segment_syncs(k->sync_log);
    if (push(k, i))
      return;
  }
  double t0 = dur_now_ms();
  long burst = segment_syncs(k->sync_log) - c0;
  if (burst >= PUSHES / 2)
    dur_fail("everysec: %ld fdatasyncs for a burst of %d pushes (one a "
             "second expected)", burst, PUSHES);
  while (segment_syncs(k->sync_log) <= before_last &&
         dur_now_ms() - t0 < 3000)
    dur_sleep_ms(10);
  if (segment_syncs(k->sync_log) <= before_last)
    dur_fail("everysec: no fdatasync of the log within 3 s of the last "
             "push, with no one waiting for it");
  else
    dur_note("everysec: %ld fdatasyncs during %d pushes, then one %.0f ms "
             "after the last", burst, PUSHES, dur_now_ms() - t0);
}

static void never(fsync_case_t *k) {
  long c0 = segment_syncs(k->sync_log);
  for (int i = 1; i <= PUSHES; i++)
    if (push(k, i))
      return;
  dur_sleep_ms(1500); /* a negative check: everysec would have synced */
  long c1 = segment_syncs(k->sync_log);
  if (c1 != c0)
    dur_fail("never: %ld fdatasyncs of the log after %d pushes", c1 - c0,
             PUSHES);
  const char *args[] = {"checkpoint", NULL};
  char *err = NULL;
  if (dur_cli(k->srv.addr, args, NULL, &err))
    dur_fail("never: checkpoint failed: %s", err);
  free(err);
  long c2 = segment_syncs(k->sync_log);
  if (c2 <= c1)
    dur_fail("never: a checkpoint did not fdatasync the log it covers");
  embps_client_destroy(k->c);
  k->c = NULL;
  int st = dur_server_term(&k->srv, 10000);
  if (st != 0)
    dur_fail("never: exit status %d after SIGTERM", st);
  if (segment_syncs(k->sync_log) <= c2)
    dur_fail("never: SIGTERM closed the log without an fdatasync");
  dur_note("never: 0 fdatasyncs for %d pushes, %ld at the checkpoint, %ld "
           "at SIGTERM", PUSHES, c2 - c1, segment_syncs(k->sync_log) - c2);
}

int dur_scenario_fsync(const char *shim) {
  if (!dur_engine_present()) {
    printf("SKIP: embps-server has no --data-dir in this build\n");
    return DUR_SKIP;
  }
  if (getenv("EMBPS_TEST_NO_PRELOAD")) { /* sanitizer builds */
    printf("SKIP: EMBPS_TEST_NO_PRELOAD is set\n");
    return DUR_SKIP;
  }
  static const char *const modes[] = {"always", "everysec", "never"};
  void (*const runs[])(fsync_case_t *) = {always, everysec, never};
  for (int m = 0; m < 3; m++) {
    fsync_case_t k;
    memset(&k, 0, sizeof k);
    k.mode = modes[m];
    int failed = dur_failures();
    if (!start(&k, shim))
      runs[m](&k);
    embps_client_destroy(k.c);
    if (dur_failures() != failed)
      dur_server_dump_log(&k.srv);
    dur_server_cleanup(&k.srv);
    dur_rm_rf(k.data);
  }
  return dur_failures() ? 1 : 0;
}
