/* dur_corrupt.c - damaged data dirs. A data dir with a checkpoint and a log
 * tail is built once; then, each on a fresh copy:
 *  - a byte flipped at every header offset and ~100 sampled offsets of every
 *    checkpoint and log file: the server must refuse to start (non-zero
 *    exit) with a message naming the file and an offset at or before the
 *    flipped byte;
 *  - the log truncated at many offsets (and a zero-filled tail appended):
 *    start succeeds, a WARN names the file and the offset it truncated to
 *    (when it truncated anything), and the state equals the checkpoint plus
 *    the log records before the cut (whole records, in order);
 *  - a checkpoint file truncated or missing: refused, naming the file. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dur_scenarios.h"
#include "dur_util.h"

#define SETUP_PUSHES 30 /* before the checkpoint */
#define TAIL_PUSHES 12  /* after it: 2 records each (witness, Adagrad) */

typedef struct {
  dur_workload_t wl;
  char data[256];      /* the pristine data dir */
  char trial[300];     /* copy under test */
  dur_server_t srv;
  float *ada_after[TAIL_PUSHES + 1]; /* Adagrad rows after SETUP + i pushes */
  float *full;         /* the state before the kill */
  int trials;
} corrupt_t;

static int fresh_copy(corrupt_t *t) {
  dur_rm_rf(t->trial);
  if (dur_copy_tree(t->data, t->trial)) {
    dur_fail("cannot copy %s to %s", t->data, t->trial);
    return -1;
  }
  return 0;
}

/* Starts the server on the trial dir (port 0). Returns as
 * dur_server_start; the log text in *log (malloc'd). */
static int start_trial(corrupt_t *t, char **log) {
  t->srv.port = 0;
  t->trials++;
  int rc = dur_server_start(&t->srv, 20000);
  *log = dur_server_log(&t->srv);
  return rc;
}

/* The message must name the file (path relative to the data dir) and a
 * byte offset ("offset N"). The offset is that of the damaged structure's
 * checksum or start, which for a whole-file checksum (the MANIFEST's) lies
 * after the damaged byte, so it is not compared with it. */
static void check_refusal(const char *what, const char *rel,
                          const char *log) {
  if (!strstr(log, rel)) {
    dur_fail("%s: refused, but the message does not name %s: %.400s", what,
             rel, log);
    return;
  }
  const char *o = strstr(log, "offset ");
  long long n;
  if (!o || sscanf(o, "offset %lld", &n) != 1)
    dur_fail("%s: refused, but the message names no offset: %.400s", what,
             log);
}

static void flip_trial(corrupt_t *t, const char *rel, long long off,
                       uint64_t *rng) {
  if (fresh_copy(t))
    return;
  char path[700];
  snprintf(path, sizeof path, "%s/%s", t->trial, rel);
  int fd = open(path, O_RDWR);
  unsigned char b;
  if (fd < 0 || pread(fd, &b, 1, off) != 1) {
    dur_fail("cannot read %s at %lld", path, off);
    if (fd >= 0)
      close(fd);
    return;
  }
  unsigned char x = (unsigned char)(1 + rng_next(rng) % 255);
  unsigned char nb = b ^ x;
  if (pwrite(fd, &nb, 1, off) != 1)
    dur_fail("cannot write %s", path);
  close(fd);
  char *log = NULL;
  int rc = start_trial(t, &log);
  char what[512];
  snprintf(what, sizeof what, "byte %lld of %s flipped (0x%02x -> 0x%02x)",
           off, rel, b, nb);
  if (rc == 0) {
    dur_fail("%s: NOT DETECTED: the server started on the damaged dir", what);
    dur_server_kill(&t->srv);
  } else if (rc < 0) {
    dur_fail("%s: the server neither started nor exited in 20 s", what);
  } else {
    check_refusal(what, rel, log);
  }
  free(log);
}

static int truncate_file(const char *path, long long len) {
  return truncate(path, (off_t)len);
}

static void ckpt_truncate_trial(corrupt_t *t, const char *rel, long long len) {
  if (fresh_copy(t))
    return;
  char path[700], what[512];
  snprintf(path, sizeof path, "%s/%s", t->trial, rel);
  if (len < 0) {
    unlink(path);
    snprintf(what, sizeof what, "%s deleted", rel);
  } else {
    truncate_file(path, len);
    snprintf(what, sizeof what, "%s truncated to %lld bytes", rel, len);
  }
  char *log = NULL;
  int rc = start_trial(t, &log);
  if (rc == 0) {
    dur_fail("%s: NOT DETECTED: the server started", what);
    dur_server_kill(&t->srv);
  } else if (rc < 0) {
    dur_fail("%s: the server neither started nor exited in 20 s", what);
  } else if (!strstr(log, rel)) {
    dur_fail("%s: refused, but the message does not name the file: %.400s",
             what, log);
  }
  free(log);
}

/* Log cut at len (or, with zeros > 0, that many zero bytes appended): the
 * server must start with the records before the cut; returns the number
 * of tail records it kept, or -1. */
static int log_trial(corrupt_t *t, const char *rel, long long len,
                     int zeros) {
  if (fresh_copy(t))
    return -1;
  char path[700], what[512];
  snprintf(path, sizeof path, "%s/%s", t->trial, rel);
  long long size = dur_file_size(path);
  if (zeros) {
    int fd = open(path, O_WRONLY | O_APPEND);
    char z[4096] = {0};
    if (fd < 0 || write(fd, z, (size_t)zeros) != zeros)
      dur_fail("cannot append to %s", path);
    if (fd >= 0)
      close(fd);
    len = size + zeros;
    snprintf(what, sizeof what, "%s with %d zero bytes appended", rel, zeros);
  } else {
    truncate_file(path, len);
    snprintf(what, sizeof what, "%s cut at %lld of %lld bytes", rel, len,
             size);
  }
  char *log = NULL;
  int rc = start_trial(t, &log);
  int kept = -1;
  if (rc != 0) {
    if (!zeros && len < 64)
      dur_note("%s: refused (the cut is inside the segment's first 64 "
               "bytes; accepted): %.200s", what, log);
    else
      dur_fail("%s: a torn log tail must be forgiven, but the server did "
               "not start (status %d): %.400s", what, rc, log);
    free(log);
    return -1;
  }
  long long after = dur_file_size(path);
  if (after < len) { /* it truncated: the WARN must say where */
    char want[64];
    snprintf(want, sizeof want, "offset %lld", after);
    if (!strstr(log, rel) || !strstr(log, want))
      dur_fail("%s: the server truncated the log to %lld bytes but its "
               "warning does not name the file and \"%s\": %.400s", what,
               after, want, log);
  }
  embps_client_t *c = dur_connect(t->srv.addr, 10000, DUR_RETRY_DEFAULT, what);
  double wit[2];
  if (c && !dur_pull_wit(c, &t->wl, wit)) {
    float *ada = dur_pull_ada(c, &t->wl);
    long long w = (long long)wit[0] - SETUP_PUSHES;
    /* records alternate witness, Adagrad: k kept = w witness + a Adagrad */
    long long a = -1;
    for (int i = 0; ada && i <= TAIL_PUSHES; i++)
      if (!memcmp(ada, t->ada_after[i], (size_t)t->wl.rows_per_worker *
                                            DUR_ADA_DIM * sizeof(float))) {
        a = i;
        break;
      }
    if (w < 0 || w > TAIL_PUSHES)
      dur_fail("%s: witness = %.0f, outside [%d, %d]: acknowledged pushes "
               "of the checkpoint lost or doubled", what, wit[0],
               SETUP_PUSHES, SETUP_PUSHES + TAIL_PUSHES);
    else if (a < 0)
      dur_fail("%s: the Adagrad rows equal no prefix of the log's pushes "
               "(a record applied partly, twice or out of order)", what);
    else if (a != w && a != w - 1)
      dur_fail("%s: %lld witness pushes but %lld Adagrad pushes kept: not "
               "a prefix of the log (records go witness, Adagrad, ...)",
               what, w, a);
    else
      kept = (int)(w + a);
    free(ada);
  }
  embps_client_destroy(c);
  dur_server_kill(&t->srv);
  free(log);
  return kept;
}

/* Builds the pristine data dir and the expected states. */
static int build(corrupt_t *t) {
  dur_server_t s;
  dur_server_init(&s, t->data);
  s.fsync = "always";
  s.args[0] = "--shards";
  s.args[1] = "3";
  if (dur_server_start(&s, 20000)) {
    dur_fail("corruption setup: start failed");
    dur_server_dump_log(&s);
    return -1;
  }
  embps_client_t *c = dur_connect(s.addr, 10000, DUR_RETRY_DEFAULT,
                                  "corruption setup");
  int rc = c ? dur_create_tables(c, &t->wl) : -1;
  for (int j = 0; !rc && j < SETUP_PUSHES + TAIL_PUSHES; j++) {
    if (j == SETUP_PUSHES) {
      const char *args[] = {"checkpoint", NULL};
      char *err = NULL;
      if ((rc = dur_cli(s.addr, args, NULL, &err)) != 0)
        dur_fail("corruption setup: embps checkpoint: %s", err);
      free(err);
    }
    if (!rc && (dur_push_wit(c, &t->wl, 0) ||
                dur_push_ada(c, &t->wl, 0, (uint64_t)j))) {
      dur_fail("corruption setup: push %d: %s", j,
               embps_client_last_error(c));
      rc = -1;
    }
  }
  if (!rc)
    t->full = dur_pull_ada(c, &t->wl);
  embps_client_destroy(c);
  dur_server_kill(&s);
  dur_server_cleanup(&s);
  for (int i = 0; !rc && i <= TAIL_PUSHES; i++) {
    uint64_t n = SETUP_PUSHES + (uint64_t)i;
    if (!(t->ada_after[i] = dur_replay_ada(&t->wl, &n)))
      rc = -1;
  }
  if (!rc && t->full &&
      memcmp(t->full, t->ada_after[TAIL_PUSHES],
             (size_t)t->wl.rows_per_worker * DUR_ADA_DIM * sizeof(float)))
    dur_fail("corruption setup: the server's rows differ from the replay");
  return rc || !t->full ? -1 : 0;
}

int dur_scenario_corrupt(void) {
  if (!dur_engine_present()) {
    printf("SKIP: embps-server has no --data-dir in this build\n");
    return DUR_SKIP;
  }
  uint64_t seed = dur_seed(), rng = seed;
  corrupt_t t;
  memset(&t, 0, sizeof t);
  t.wl = (dur_workload_t){.n_workers = 1, .rows_per_worker = 256,
                          .seed = seed};
  dur_mkdtemp(t.data, sizeof t.data, "corrupt-data");
  snprintf(t.trial, sizeof t.trial, "%s.trial", t.data);
  dur_server_init(&t.srv, t.trial);
  if (build(&t))
    goto out;

  char **files;
  size_t n = dur_list_files(t.data, &files);
  int n_log = 0, n_ckpt = 0;
  for (size_t i = 0; i < n; i++) {
    int is_log = !strncmp(files[i], "log/", 4);
    n_log += is_log;
    n_ckpt += !strncmp(files[i], "ckpt-", 5);
    char path[700];
    snprintf(path, sizeof path, "%s/%s", t.data, files[i]);
    dur_note("data dir file %s: %lld bytes", files[i], dur_file_size(path));
  }
  if (!n_log || !n_ckpt)
    dur_fail("the data dir should hold a checkpoint and a log: %d checkpoint"
             " files, %d log files", n_ckpt, n_log);
  /* every byte of the file headers (64 B at most: table 64, MANIFEST 48,
   * log segment 32 + the first record's 32) and samples elsewhere */
  int header = 64, samples = dur_long() ? 1000 : dur_quick() ? 20 : 100;
  int header_step = dur_quick() ? 4 : 1;

  /* 1. flipped bytes, every file */
  int before = dur_failures();
  for (size_t i = 0; i < n; i++) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", t.data, files[i]);
    long long size = dur_file_size(path);
    int start_fail = dur_failures();
    for (long long off = 0; off < size && off < header; off += header_step)
      flip_trial(&t, files[i], off, &rng);
    for (int k = 0; size > header && k < samples; k++)
      flip_trial(&t, files[i],
                 header + (long long)(rng_next(&rng) %
                                      (uint64_t)(size - header)), &rng);
    flip_trial(&t, files[i], size - 1, &rng);
    dur_note("flips in %s: %d undetected or badly reported", files[i],
             dur_failures() - start_fail);
  }
  dur_note("%d flip trials, %d failures", t.trials,
           dur_failures() - before);

  /* 2. log truncations: forgiven, state = records before the cut */
  for (size_t i = 0; i < n; i++) {
    if (strncmp(files[i], "log/", 4))
      continue;
    char path[700];
    snprintf(path, sizeof path, "%s/%s", t.data, files[i]);
    long long size = dur_file_size(path);
    int cuts = dur_long() ? 400 : dur_quick() ? 15 : 60;
    long long *offs = malloc(((size_t)cuts + 8) * sizeof *offs);
    int m = 0;
    for (int k = 0; k < cuts; k++)
      offs[m++] = (long long)(rng_next(&rng) % (uint64_t)size);
    offs[m++] = 0;
    offs[m++] = size - 1;
    offs[m++] = size / 2;
    for (int a = 1; a < m; a++) /* ascending */
      for (int b = a; b > 0 && offs[b - 1] > offs[b]; b--) {
        long long x = offs[b];
        offs[b] = offs[b - 1];
        offs[b - 1] = x;
      }
    int last_kept = 0;
    long long last_off = 0;
    for (int k = 0; k < m; k++) {
      int kept = log_trial(&t, files[i], offs[k], 0);
      if (kept < 0)
        continue;
      if (kept < last_kept)
        dur_fail("%s cut at %lld kept %d records, but cut at %lld kept %d: "
                 "a longer log gave fewer records", files[i], offs[k], kept,
                 last_off, last_kept);
      if (kept >= 2 * TAIL_PUSHES)
        dur_fail("%s cut at %lld of %lld kept all %d records: the cut "
                 "record was applied anyway", files[i], offs[k], size, kept);
      last_kept = kept;
      last_off = offs[k];
    }
    free(offs);
    int kept = log_trial(&t, files[i], 0, 4096);
    if (kept >= 0 && kept != 2 * TAIL_PUSHES)
      dur_fail("%s with a zero tail: %d of %d records kept", files[i], kept,
               2 * TAIL_PUSHES);
    kept = log_trial(&t, files[i], size, 0);
    if (kept >= 0 && kept != 2 * TAIL_PUSHES)
      dur_fail("%s intact: %d of %d records restored", files[i], kept,
               2 * TAIL_PUSHES);
  }

  /* 3. checkpoint files truncated or missing: refused */
  for (size_t i = 0; i < n; i++) {
    if (strncmp(files[i], "ckpt-", 5))
      continue;
    char path[700];
    snprintf(path, sizeof path, "%s/%s", t.data, files[i]);
    long long size = dur_file_size(path);
    int cuts = dur_long() ? 100 : dur_quick() ? 5 : 20;
    ckpt_truncate_trial(&t, files[i], 0);
    ckpt_truncate_trial(&t, files[i], size - 1);
    for (int k = 0; k < cuts; k++)
      ckpt_truncate_trial(&t, files[i],
                          (long long)(rng_next(&rng) % (uint64_t)size));
    ckpt_truncate_trial(&t, files[i], -1);
  }
  dur_note("%d server starts on damaged copies", t.trials);
  dur_free_list(files, n);
out:
  for (int i = 0; i <= TAIL_PUSHES; i++)
    free(t.ada_after[i]);
  free(t.full);
  dur_server_cleanup(&t.srv);
  int bad = dur_failures();
  dur_rm_rf(t.trial);
  if (bad)
    fprintf(stderr, "pristine data dir kept: %s\n", t.data);
  else
    dur_rm_rf(t.data);
  return bad ? 1 : 0;
}
