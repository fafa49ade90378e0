/* dur_util.h - shared pieces of the durability tests (test_dur_faults.c and
 * its dur_*.c scenarios): embps-server processes on a fixed port and a data
 * dir that survive kill -9 and restarts, the exactly checkable workload
 * (SGD lr=1 witness rows counting applied pushes, Adagrad rows compared bit
 * for bit with a replay), state dumps, file helpers and failure reporting.
 *
 * Every check that fails calls dur_fail(), which prints one line saying what
 * was lost or doubled; a scenario returns the number of failures. */
#ifndef EMBPS_DUR_UTIL_H
#define EMBPS_DUR_UTIL_H
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "embps/embps.h"
#include "harness.h"
#include "rng.h"

#define DUR_SKIP 77 /* ctest SKIP_RETURN_CODE */
#define DUR_RETRY_DEFAULT (-1000000)

/* ------------------------------------------------------------ reporting */

void dur_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void dur_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int dur_failures(void);

/* -------------------------------------------------------------- servers */

typedef struct {
  pid_t pid;              /* 0: not running */
  int port;               /* 0 until the first start; then kept */
  char addr[32];
  char data_dir[512];     /* "" : no --data-dir */
  char work[512];         /* private dir: port file, logs */
  char log_file[600];     /* stderr of the latest start */
  char port_file[600];
  const char *fsync;      /* NULL: server default */
  const char *args[16];   /* more flags, NULL-terminated */
  const char *env[8];     /* "NAME=VALUE" set in the child, NULL-terminated */
  int starts;
} dur_server_t;

/* Prepares s (work dir under /tmp); data_dir may be NULL. */
int dur_server_init(dur_server_t *s, const char *data_dir);
/* Starts the server on s->port (0 the first time: learnt from the port file)
 * and waits up to timeout_ms for it to listen. Returns 0 when listening;
 * otherwise the process's exit status (exit code, or 128 + signal) when it
 * exited (refused to start), or -1 on a timeout (it is killed). */
int dur_server_start(dur_server_t *s, int timeout_ms);
/* kill -9 and reap. */
void dur_server_kill(dur_server_t *s);
/* SIGTERM; returns the exit status, or -1 if killed after timeout_ms. */
int dur_server_term(dur_server_t *s, int timeout_ms);
/* Waits for the process to exit by itself: status, or -1 after timeout_ms. */
int dur_server_wait(dur_server_t *s, int timeout_ms);
/* The log (stderr) of the latest start, malloc'd, "" when unreadable. */
char *dur_server_log(const dur_server_t *s);
void dur_server_dump_log(const dur_server_t *s);
/* Removes the work dir (not the data dir). */
void dur_server_cleanup(dur_server_t *s);

/* 1 when embps-server accepts --data-dir, 0 when it refuses it by name
 * (the engine is not in this build: the caller skips). */
int dur_engine_present(void);
/* 1 when the client library retries pushes (embps_client_options_t has
 * retry_ms in this build). */
int dur_client_retries(void);

/* A client on addr; retry_ms DUR_RETRY_DEFAULT: the library's default
 * (other values are set when the library retries: < 0 never). An entry of
 * one server is that server (servers_as_listed): its own answers, a
 * follower's refusals included. NULL on failure (reported with dur_fail
 * when `what` is not NULL). */
embps_client_t *dur_connect(const char *addr, int timeout_ms, int retry_ms,
                            const char *what);

/* Runs the embps CLI with --servers addr and args (NULL-terminated).
 * Returns its exit status; out/err (malloc'd, may be NULL) get its output. */
int dur_cli(const char *addr, const char *const *args, char **out, char **err);

/* -------------------------------------------------------------- workload */

/* Tables of the workload: "wit" SGD lr 1, dim DUR_WIT_DIM, rows 2 per
 * worker (w and n_workers + w: two witness rows, so a torn push shows as
 * rows that disagree), zeros; "ada" Adagrad dim DUR_ADA_DIM, rows_per_worker
 * disjoint rows per worker, uniform init. */
#define DUR_WIT_DIM 4
#define DUR_ADA_DIM 8
#define DUR_ADA_K 6 /* rows per Adagrad push */

typedef struct {
  int n_workers;
  int rows_per_worker; /* a power of two */
  uint64_t seed;
} dur_workload_t;

void dur_wit_spec(const dur_workload_t *wl, embps_table_spec_t *spec);
void dur_ada_spec(const dur_workload_t *wl, embps_table_spec_t *spec);
int dur_create_tables(embps_client_t *c, const dur_workload_t *wl);

/* Witness push of worker w: rows w and n_workers + w, gradient -1. */
int dur_push_wit(embps_client_t *c, const dur_workload_t *wl, int w);
/* Adagrad push number j of worker w (a deterministic function of the seed). */
int dur_push_ada(embps_client_t *c, const dur_workload_t *wl, int w,
                 uint64_t j);
/* Rows of push (w, j): ids[DUR_ADA_K], vals[DUR_ADA_K * DUR_ADA_DIM]. */
void dur_ada_push_rows(const dur_workload_t *wl, int w, uint64_t j,
                       int64_t *ids, float *vals);

/* Witness values: wit[i] = element 0 of row i, i < 2 * n_workers, with a
 * check that all elements of a row agree. Returns 0 or a code. */
int dur_pull_wit(embps_client_t *c, const dur_workload_t *wl, double *wit);
/* All Adagrad rows, n_workers * rows_per_worker * DUR_ADA_DIM floats. */
float *dur_pull_ada(embps_client_t *c, const dur_workload_t *wl);

/* The Adagrad rows after applying, into a fresh server without a data dir,
 * pushes 0..counts[w]-1 of each worker w (in order). NULL on failure. */
float *dur_replay_ada(const dur_workload_t *wl, const uint64_t *counts);

/* The same replay left running: *ref a server, *out a client on it (for
 * more pushes); returns 0 or -1 (reported). Close with dur_replay_close. */
int dur_replay_open(const dur_workload_t *wl, const uint64_t *counts,
                    it_server_t *ref, embps_client_t **out);
void dur_replay_close(it_server_t *ref, embps_client_t *c);

/* Compares Adagrad rows bit for bit; reports up to 10 differing rows as
 * "<what>: row R (worker W) element E: expected X got Y". Returns the
 * number of differing rows. */
int dur_compare_ada(const dur_workload_t *wl, const float *expected,
                    const float *got, const char *what);

/* Pushes one more gradient (0.5 everywhere) to every Adagrad row of both
 * clients and compares again: equal weights with different accumulators
 * differ after it. Returns differing rows, or -1 if a push failed. */
int dur_probe_accumulators(const dur_workload_t *wl, embps_client_t *a,
                           embps_client_t *b, const char *what);

/* Worker processes of the workload, with their counters in shared memory
 * (read by the parent while the workers are stopped or gone). */
#define DUR_MAX_WORKERS 16
typedef struct {
  _Atomic uint64_t acked_wit, acked_ada; /* acknowledged pushes (a prefix) */
  _Atomic int inflight_wit, inflight_ada; /* 1 while a push is unresolved */
  _Atomic int failed;
  char error[512];
} dur_worker_state_t;

typedef struct {
  _Atomic int stop;
  int fd; /* the memory's file (close-on-exec but in a worker's exec) */
  dur_worker_state_t w[DUR_MAX_WORKERS];
} dur_shared_t;

/* Shared memory for the workers: a memfd mapped by the parent and each
 * worker. NULL when it cannot be made. */
dur_shared_t *dur_shared_new(void);
void dur_shared_free(dur_shared_t *sh);
/* Starts worker w, a process of its own: the dur_worker program beside
 * this one, exec'd straight after fork. A forked copy of a test that runs
 * threads (the proxy's) could inherit a lock (ASan's allocator's) that
 * one of them held, and hang on its next allocation. It pushes (witness,
 * then Adagrad push j, for j = 0, 1, ...) to addr until sh->stop,
 * counting acknowledged pushes; on the first push that fails (after the
 * library's retries, retry_ms) it records the error and exits 1, leaving
 * that push marked in flight. Each acknowledged j is appended to
 * ack_dir/worker-W.acks when ack_dir is not NULL. -1 when it could not be
 * started (said on stderr). */
pid_t dur_worker_spawn(dur_shared_t *sh, const dur_workload_t *wl, int w,
                       const char *addr, const char *ack_dir, int retry_ms);
/* The dur_worker program's main: its arguments as dur_worker_spawn
 * passes them (usage on stderr and 2 when they are not). */
int dur_worker_main(int argc, char **argv);
/* Waits up to timeout_ms until worker w has at least `want` Adagrad pushes
 * acknowledged: 1, or 0 once it has failed, or -1 on the timeout. */
int dur_worker_wait_acked(dur_shared_t *sh, int w, uint64_t want,
                          int timeout_ms);
/* Sets sh->stop and reaps the workers (killed after timeout_ms); with
 * report_errors, a worker that failed is reported with dur_fail. */
void dur_workers_finish(dur_shared_t *sh, pid_t *pids, int n, int timeout_ms,
                        int report_errors);

/* SIGSTOPs the workers (waiting until each is stopped; one that exited is
 * marked by negating its pid), and SIGCONTs them. */
void dur_workers_stop(pid_t *pids, int n);
void dur_workers_cont(pid_t *pids, int n);
/* Reports (dur_fail) every worker that exited early; returns how many. */
int dur_workers_alive(pid_t *pids, int n, dur_shared_t *sh);
/* Checks the witness rows on c against the workers' counts: each in
 * [acknowledged, acknowledged + in flight], or exactly acknowledged with
 * `exact` (every push resolved). A lost push is a failure when
 * report_loss (else a note); a doubled one always. Returns the lost. */
int dur_check_witness(embps_client_t *c, const dur_workload_t *wl,
                      dur_shared_t *sh, const char *when, int exact,
                      int report_loss);

/* -------------------------------------------------------------- files */

/* Mounts a tmpfs of `size` (mount's size=, e.g. "1m") on a new directory
 * under /tmp (its path in mnt), in a mount namespace of this process's own
 * (root only): 0, or -1 with why saying what was refused. Undo with
 * dur_tmpfs_unmount. */
int dur_tmpfs_mount(char *mnt, size_t cap, const char *size, char *why,
                    size_t why_len);
void dur_tmpfs_unmount(const char *mnt);
/* Fills the file system holding dir with the file dir/filler until a
 * write fails with ENOSPC; returns 0 (its path in path) or -1. */
int dur_fill_fs(const char *dir, char *path, size_t cap);

/* The value of the sample `name` (no labels) in a Prometheus text body, or
 * -1 when it is not there. */
double dur_metric(const char *body, const char *name);

/* mkdtemp under /tmp with a prefix; returns 0 or -1. */
int dur_mkdtemp(char *out, size_t cap, const char *what);
int dur_rm_rf(const char *path);
/* Copies a directory tree (regular files and dirs). */
int dur_copy_tree(const char *src, const char *dst);
/* Regular files under dir (recursively, LOCK excluded), sorted, as paths
 * relative to dir; returns the count, *out malloc'd array of malloc'd
 * strings (free with dur_free_list). */
size_t dur_list_files(const char *dir, char ***out);
void dur_free_list(char **v, size_t n);
/* Names of the entries of dir matching prefix (sorted). */
size_t dur_list_names(const char *dir, const char *prefix, char ***out);
long long dur_file_size(const char *path);
/* FNV-1a of a file's content, 0 if unreadable. */
uint64_t dur_file_hash(const char *path);

void dur_sleep_ms(double ms);
double dur_now_ms(void);
/* $EMBPS_LONG set and not "0". */
int dur_long(void);
/* EMBPS_DUR_QUICK=1 (sanitizer builds, where a server start costs ~10x):
 * fewer corruption trials. */
int dur_quick(void);
/* The run's seed: $EMBPS_SEED or the clock; printed. */
uint64_t dur_seed(void);
#endif
