/* dur_util.c - see dur_util.h. */
#define _GNU_SOURCE
#include "dur_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static int n_failures;

void dur_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("FAIL: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  fflush(stderr);
  n_failures++;
}

void dur_note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("[dur] ", stdout);
  vprintf(fmt, ap);
  fputc('\n', stdout);
  va_end(ap);
  fflush(stdout);
}

int dur_failures(void) { return n_failures; }

double dur_now_ms(void) { return it_now_ms(); }

void dur_sleep_ms(double ms) { it_sleep_ms(ms); }

int dur_long(void) {
  const char *v = getenv("EMBPS_LONG");
  return v && *v && strcmp(v, "0") != 0;
}

int dur_quick(void) {
  const char *v = getenv("EMBPS_DUR_QUICK");
  return v && *v && strcmp(v, "0") != 0;
}

uint64_t dur_seed(void) {
  const char *v = getenv("EMBPS_SEED");
  uint64_t seed = v && *v ? strtoull(v, NULL, 0)
                          : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  printf("[dur] seed %llu (rerun with EMBPS_SEED=%llu)\n",
         (unsigned long long)seed, (unsigned long long)seed);
  fflush(stdout);
  return seed;
}

/* ------------------------------------------------------------ servers */

int dur_mkdtemp(char *out, size_t cap, const char *what) {
  snprintf(out, cap, "/tmp/embps-dur-%s-XXXXXX", what);
  return mkdtemp(out) ? 0 : -1;
}

int dur_server_init(dur_server_t *s, const char *data_dir) {
  memset(s, 0, sizeof *s);
  if (dur_mkdtemp(s->work, sizeof s->work, "srv"))
    return -1;
  snprintf(s->port_file, sizeof s->port_file, "%s/port", s->work);
  snprintf(s->log_file, sizeof s->log_file, "%s/server.log", s->work);
  if (data_dir)
    snprintf(s->data_dir, sizeof s->data_dir, "%s", data_dir);
  return 0;
}

int dur_server_start(dur_server_t *s, int timeout_ms) {
  char listen[64];
  snprintf(listen, sizeof listen, "127.0.0.1:%d", s->port);
  const char *argv[48];
  int argc = 0;
  argv[argc++] = EMBPS_SERVER_BIN;
  argv[argc++] = "--listen";
  argv[argc++] = listen;
  argv[argc++] = "--port-file";
  argv[argc++] = s->port_file;
  argv[argc++] = "--io-threads";
  argv[argc++] = "1";
  if (s->data_dir[0]) {
    argv[argc++] = "--data-dir";
    argv[argc++] = s->data_dir;
  }
  if (s->fsync) {
    argv[argc++] = "--fsync";
    argv[argc++] = s->fsync;
  }
  for (int i = 0; s->args[i] && argc < 46; i++)
    argv[argc++] = s->args[i];
  argv[argc] = NULL;
  unlink(s->port_file);
  /* test-only switches of this process are not the server's; the wait
   * policy saves the server's re-exec; then the scenario's own */
  const char *env[8 + sizeof s->env / sizeof *s->env];
  int n_env = 0;
  env[n_env++] = "EMBPS_FAILPOINT";
  env[n_env++] = "EMBPS_TEST_UNSAFE_ACK";
  env[n_env++] = "LD_PRELOAD";
  if (!getenv("OMP_WAIT_POLICY"))
    env[n_env++] = "OMP_WAIT_POLICY=passive";
  for (int i = 0; s->env[i]; i++)
    env[n_env++] = s->env[i];
  env[n_env] = NULL;
  pid_t pid = it_spawn(argv, s->log_file, env);
  if (pid < 0)
    return -1;
  s->pid = pid;
  s->starts++;
  int code = -1;
  int r = it_wait_port(pid, s->port_file, timeout_ms, &s->port, &code);
  if (r == 1) {
    snprintf(s->addr, sizeof s->addr, "127.0.0.1:%d", s->port);
    return 0;
  }
  s->pid = 0;
  return r == 0 ? code : -1;
}

void dur_server_kill(dur_server_t *s) {
  if (!s->pid)
    return;
  int st;
  kill(s->pid, SIGKILL);
  while (waitpid(s->pid, &st, 0) < 0 && errno == EINTR) {
  }
  s->pid = 0;
}

int dur_server_wait(dur_server_t *s, int timeout_ms) {
  int code = -1;
  if (!s->pid || it_wait_exit(s->pid, timeout_ms, &code) == 0)
    return -1;
  s->pid = 0;
  return code;
}

int dur_server_term(dur_server_t *s, int timeout_ms) {
  if (!s->pid)
    return -1;
  kill(s->pid, SIGTERM);
  int code = dur_server_wait(s, timeout_ms);
  if (s->pid) {
    dur_server_kill(s);
    return -1;
  }
  return code;
}

char *dur_server_log(const dur_server_t *s) {
  FILE *f = fopen(s->log_file, "r");
  char *buf = NULL;
  size_t len = 0;
  if (f) {
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (n > 0 && (buf = malloc((size_t)n + 1)) != NULL)
      len = fread(buf, 1, (size_t)n, f);
    fclose(f);
  }
  if (!buf)
    buf = malloc(1);
  if (buf)
    buf[len] = 0;
  return buf;
}

void dur_server_dump_log(const dur_server_t *s) {
  char *log = dur_server_log(s);
  fprintf(stderr, "---- log of embps-server %s (start %d) ----\n%s"
          "---- end of log ----\n", s->addr, s->starts, log ? log : "");
  free(log);
}

void dur_server_cleanup(dur_server_t *s) {
  dur_server_kill(s);
  if (s->work[0])
    dur_rm_rf(s->work);
  s->work[0] = 0;
}

int dur_engine_present(void) {
  char dir[128];
  if (dur_mkdtemp(dir, sizeof dir, "probe"))
    return 0;
  int pipefd[2];
  if (pipe(pipefd))
    return 0;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 1);
    dup2(pipefd[1], 2);
    close(pipefd[0]);
    execl(EMBPS_SERVER_BIN, EMBPS_SERVER_BIN, "--data-dir", dir,
          "--version", (char *)NULL);
    _exit(127);
  }
  close(pipefd[1]);
  char out[2048];
  size_t n = 0;
  ssize_t r;
  while (n < sizeof out - 1 &&
         (r = read(pipefd[0], out + n, sizeof out - 1 - n)) > 0)
    n += (size_t)r;
  out[n] = 0;
  close(pipefd[0]);
  int st;
  waitpid(pid, &st, 0);
  dur_rm_rf(dir);
  return strstr(out, "not available") == NULL;
}

int dur_client_retries(void) {
#ifdef EMBPS_TEST_HAVE_RETRY
  return 1;
#else
  return 0;
#endif
}

embps_client_t *dur_connect(const char *addr, int timeout_ms, int retry_ms,
                            const char *what) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = addr;
  o.timeout_ms = timeout_ms;
  o.servers_as_listed = 1; /* that server's own answers, whatever its role */
#ifdef EMBPS_TEST_HAVE_RETRY
  if (retry_ms != DUR_RETRY_DEFAULT)
    o.retry_ms = retry_ms;
#else
  (void)retry_ms;
#endif
  embps_client_t *c = NULL;
  char err[512] = "";
  int rc = embps_client_create(&o, &c, err, sizeof err);
  if (rc && what)
    dur_fail("%s: cannot connect to %s: %s (%s)", what, addr, err,
             embps_err_name(rc));
  return rc ? NULL : c;
}

int dur_cli(const char *addr, const char *const *args, char **out,
            char **err) {
  const char *argv[40];
  int n = 0;
  argv[n++] = "--servers";
  argv[n++] = addr;
  for (int i = 0; args[i] && n < 39; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  it_cli_result_t r;
  int st = it_cli_run(&r, argv);
  if (out)
    *out = r.out, r.out = NULL;
  if (err)
    *err = r.err, r.err = NULL;
  it_cli_result_free(&r);
  return st;
}

/* ------------------------------------------------------------ workload */

void dur_wit_spec(const dur_workload_t *wl, embps_table_spec_t *spec) {
  embps_table_spec_init(spec, "wit", DUR_WIT_DIM, EMBPS_OPT_SGD);
  spec->lr = 1.0;
  spec->rows = 2 * (uint64_t)wl->n_workers;
}

void dur_ada_spec(const dur_workload_t *wl, embps_table_spec_t *spec) {
  embps_table_spec_init(spec, "ada", DUR_ADA_DIM, EMBPS_OPT_ADAGRAD);
  spec->lr = 0.05;
  spec->rows = (uint64_t)wl->n_workers * (uint64_t)wl->rows_per_worker;
  spec->init = EMBPS_INIT_UNIFORM;
  spec->init_value = 0.1;
  spec->seed = wl->seed | 1;
}

int dur_create_tables(embps_client_t *c, const dur_workload_t *wl) {
  embps_table_spec_t s;
  dur_wit_spec(wl, &s);
  int rc = embps_create_table(c, &s);
  if (rc) {
    dur_fail("create table wit: %s", embps_client_last_error(c));
    return rc;
  }
  dur_ada_spec(wl, &s);
  rc = embps_create_table(c, &s);
  if (rc)
    dur_fail("create table ada: %s", embps_client_last_error(c));
  return rc;
}

int dur_push_wit(embps_client_t *c, const dur_workload_t *wl, int w) {
  int64_t ids[2] = {w, wl->n_workers + w};
  float vals[2 * DUR_WIT_DIM];
  for (int i = 0; i < 2 * DUR_WIT_DIM; i++)
    vals[i] = -1.0f;
  return embps_push(c, "wit", ids, 2, vals, DUR_WIT_DIM, 0);
}

void dur_ada_push_rows(const dur_workload_t *wl, int w, uint64_t j,
                       int64_t *ids, float *vals) {
  uint64_t st = wl->seed ^ ((uint64_t)w << 40) ^ (j * 0x2545f4914f6cdd1dULL);
  uint64_t r = (uint64_t)wl->rows_per_worker;
  uint64_t start = rng_next(&st) % r;
  uint64_t stride = (rng_next(&st) % r) | 1; /* odd: distinct mod 2^k */
  for (int i = 0; i < DUR_ADA_K; i++)
    ids[i] = (int64_t)((uint64_t)w * r + (start + (uint64_t)i * stride) % r);
  for (int i = 0; i < DUR_ADA_K * DUR_ADA_DIM; i++) {
    int64_t q = (int64_t)(rng_next(&st) % 257) - 128;
    vals[i] = (float)q / 64.0f;
  }
}

int dur_push_ada(embps_client_t *c, const dur_workload_t *wl, int w,
                 uint64_t j) {
  int64_t ids[DUR_ADA_K];
  float vals[DUR_ADA_K * DUR_ADA_DIM];
  dur_ada_push_rows(wl, w, j, ids, vals);
  return embps_push(c, "ada", ids, DUR_ADA_K, vals, DUR_ADA_DIM, 0);
}

int dur_pull_wit(embps_client_t *c, const dur_workload_t *wl, double *wit) {
  size_t n = 2 * (size_t)wl->n_workers;
  int64_t *ids = calloc(n ? n : 1, sizeof *ids);
  float *rows = malloc(n * DUR_WIT_DIM * sizeof *rows);
  if (!ids || !rows) {
    free(ids);
    free(rows);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n; i++)
    ids[i] = (int64_t)i;
  int rc = embps_pull(c, "wit", ids, n, rows, DUR_WIT_DIM);
  if (rc)
    dur_fail("pull of the witness rows: %s", embps_client_last_error(c));
  for (size_t i = 0; !rc && i < n; i++) {
    wit[i] = rows[i * DUR_WIT_DIM];
    for (int e = 1; e < DUR_WIT_DIM; e++)
      if (rows[i * DUR_WIT_DIM + e] != rows[i * DUR_WIT_DIM])
        dur_fail("witness row %zu is torn: element 0 = %g, element %d = %g",
                 i, (double)rows[i * DUR_WIT_DIM], e,
                 (double)rows[i * DUR_WIT_DIM + e]);
  }
  free(ids);
  free(rows);
  return rc;
}

float *dur_pull_ada(embps_client_t *c, const dur_workload_t *wl) {
  size_t n = (size_t)wl->n_workers * (size_t)wl->rows_per_worker;
  int64_t *ids = calloc(n ? n : 1, sizeof *ids);
  float *rows = malloc(n * DUR_ADA_DIM * sizeof *rows);
  if (!ids || !rows) {
    free(ids);
    free(rows);
    return NULL;
  }
  for (size_t i = 0; i < n; i++)
    ids[i] = (int64_t)i;
  int rc = embps_pull(c, "ada", ids, n, rows, DUR_ADA_DIM);
  free(ids);
  if (rc) {
    dur_fail("pull of the Adagrad rows: %s", embps_client_last_error(c));
    free(rows);
    return NULL;
  }
  return rows;
}

int dur_replay_open(const dur_workload_t *wl, const uint64_t *counts,
                    it_server_t *ref, embps_client_t **out) {
  *out = NULL;
  if (it_server_start(ref, NULL)) {
    dur_fail("cannot start the reference server for the replay");
    return -1;
  }
  embps_client_t *c = dur_connect(ref->addr, 30000, DUR_RETRY_DEFAULT,
                                  "replay");
  int rc = c ? dur_create_tables(c, wl) : -1;
  for (int w = 0; !rc && w < wl->n_workers; w++)
    for (uint64_t j = 0; !rc && j < counts[w]; j++)
      if ((rc = dur_push_ada(c, wl, w, j)) != 0)
        dur_fail("replay of push %llu of worker %d failed: %s",
                 (unsigned long long)j, w, embps_client_last_error(c));
  if (rc) {
    dur_replay_close(ref, c);
    return -1;
  }
  *out = c;
  return 0;
}

void dur_replay_close(it_server_t *ref, embps_client_t *c) {
  embps_client_destroy(c);
  it_server_stop(ref);
}

float *dur_replay_ada(const dur_workload_t *wl, const uint64_t *counts) {
  it_server_t ref;
  embps_client_t *c;
  if (dur_replay_open(wl, counts, &ref, &c))
    return NULL;
  float *rows = dur_pull_ada(c, wl);
  dur_replay_close(&ref, c);
  return rows;
}

int dur_compare_ada(const dur_workload_t *wl, const float *expected,
                    const float *got, const char *what) {
  size_t n = (size_t)wl->n_workers * (size_t)wl->rows_per_worker;
  int bad = 0;
  for (size_t r = 0; r < n; r++) {
    const float *e = expected + r * DUR_ADA_DIM, *g = got + r * DUR_ADA_DIM;
    if (!memcmp(e, g, DUR_ADA_DIM * sizeof *e))
      continue;
    if (bad++ >= 10)
      continue;
    int k = 0;
    while (k < DUR_ADA_DIM && !memcmp(&e[k], &g[k], sizeof *e))
      k++;
    dur_fail("%s: Adagrad row %zu (worker %zu) element %d: expected %.9g "
             "got %.9g (replay of the acknowledged pushes vs server)",
             what, r, r / (size_t)wl->rows_per_worker, k, (double)e[k],
             (double)g[k]);
  }
  if (bad > 10)
    dur_fail("%s: %d Adagrad rows differ in all", what, bad);
  return bad;
}

int dur_probe_accumulators(const dur_workload_t *wl, embps_client_t *a,
                           embps_client_t *b, const char *what) {
  size_t n = (size_t)wl->n_workers * (size_t)wl->rows_per_worker;
  int64_t *ids = calloc(n ? n : 1, sizeof *ids);
  float *vals = malloc(n * DUR_ADA_DIM * sizeof *vals);
  if (!ids || !vals) {
    free(ids);
    free(vals);
    return -1;
  }
  int rc = 0;
  for (size_t i = 0; i < n; i++)
    ids[i] = (int64_t)i;
  for (size_t i = 0; i < n * DUR_ADA_DIM; i++)
    vals[i] = 0.5f;
  if ((embps_push(a, "ada", ids, n, vals, DUR_ADA_DIM, 0) ||
              embps_push(b, "ada", ids, n, vals, DUR_ADA_DIM, 0))) {
    dur_fail("%s: probe push failed", what);
    rc = -1;
  }
  free(ids);
  free(vals);
  if (rc)
    return -1;
  float *ra = dur_pull_ada(a, wl), *rb = dur_pull_ada(b, wl);
  char label[256];
  snprintf(label, sizeof label, "%s, after one more push (accumulators)",
           what);
  int bad = ra && rb ? dur_compare_ada(wl, ra, rb, label) : -1;
  free(ra);
  free(rb);
  return bad;
}

/* ------------------------------------------------------------ workers */

dur_shared_t *dur_shared_new(void) {
  int fd = memfd_create("embps-dur-workers", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, sizeof(dur_shared_t))) {
    if (fd >= 0)
      close(fd);
    return NULL;
  }
  dur_shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                          MAP_SHARED, fd, 0);
  if (sh == MAP_FAILED) {
    close(fd);
    return NULL;
  }
  memset(sh, 0, sizeof *sh);
  sh->fd = fd;
  return sh;
}

void dur_shared_free(dur_shared_t *sh) {
  if (!sh)
    return;
  int fd = sh->fd;
  munmap(sh, sizeof *sh);
  close(fd);
}

static void worker_failed(dur_worker_state_t *ws, embps_client_t *c, int w,
                          const char *what, uint64_t j, int rc) {
  snprintf(ws->error, sizeof ws->error, "worker %d %s push #%llu not "
           "acknowledged: %s (%s)", w, what, (unsigned long long)j,
           c ? embps_client_last_error(c) : "no connection",
           embps_err_name(rc));
  atomic_store(&ws->failed, 1);
  _exit(1);
}

static _Noreturn void worker_main(dur_shared_t *sh, const dur_workload_t *wl,
                                  int w, const char *addr,
                                  const char *ack_dir, int retry_ms) {
  dur_worker_state_t *ws = &sh->w[w];
  FILE *acks = NULL;
  if (ack_dir) {
    char path[600];
    snprintf(path, sizeof path, "%s/worker-%d.acks", ack_dir, w);
    acks = fopen(path, "w");
  }
  atomic_store(&ws->inflight_wit, 1); /* nothing sent yet, but unresolved */
  /* The scenario may kill the server before a worker first connects (a
   * slow fork under a sanitizer): like a trainer's launcher, try again for
   * as long as the worker's calls may retry. */
  const double give_up_ms = dur_now_ms() + (retry_ms > 0 ? retry_ms : 0);
  embps_client_t *c;
  while (!(c = dur_connect(addr, 5000, retry_ms, NULL)) &&
         dur_now_ms() < give_up_ms)
    dur_sleep_ms(50);
  if (!c)
    worker_failed(ws, c, w, "first", 0, EMBPS_ECONN);
  atomic_store(&ws->inflight_wit, 0);
  for (uint64_t j = 0; !atomic_load(&sh->stop); j++) {
    atomic_store(&ws->inflight_wit, 1);
    int rc = dur_push_wit(c, wl, w);
    if (rc)
      worker_failed(ws, c, w, "witness", j, rc);
    atomic_fetch_add(&ws->acked_wit, 1);
    atomic_store(&ws->inflight_wit, 0);
    atomic_store(&ws->inflight_ada, 1);
    rc = dur_push_ada(c, wl, w, j);
    if (rc)
      worker_failed(ws, c, w, "Adagrad", j, rc);
    atomic_fetch_add(&ws->acked_ada, 1);
    atomic_store(&ws->inflight_ada, 0);
    if (acks) {
      fprintf(acks, "%llu\n", (unsigned long long)j);
      fflush(acks);
    }
  }
  embps_client_destroy(c);
  if (acks)
    fclose(acks);
  _exit(0);
}

pid_t dur_worker_spawn(dur_shared_t *sh, const dur_workload_t *wl, int w,
                       const char *addr, const char *ack_dir, int retry_ms) {
  /* everything the child needs is made here: between fork and exec it
   * calls nothing that could take a lock */
  char bin[4096];
  ssize_t n = readlink("/proc/self/exe", bin, sizeof bin - 32);
  char *slash = n > 0 ? memrchr(bin, '/', (size_t)n) : NULL;
  if (!slash) {
    fprintf(stderr, "dur_worker_spawn: cannot read /proc/self/exe\n");
    return -1;
  }
  strcpy(slash + 1, "dur_worker");
  char a_fd[16], a_n[16], a_rows[16], a_seed[24], a_w[16], a_retry[16];
  snprintf(a_fd, sizeof a_fd, "%d", sh->fd);
  snprintf(a_n, sizeof a_n, "%d", wl->n_workers);
  snprintf(a_rows, sizeof a_rows, "%d", wl->rows_per_worker);
  snprintf(a_seed, sizeof a_seed, "%llu", (unsigned long long)wl->seed);
  snprintf(a_w, sizeof a_w, "%d", w);
  snprintf(a_retry, sizeof a_retry, "%d", retry_ms);
  char *const argv[] = {bin,  a_fd, a_n,   a_rows, a_seed,
                        a_w,  (char *)addr, (char *)(ack_dir ? ack_dir : "-"),
                        a_retry, NULL};
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    fcntl(sh->fd, F_SETFD, 0);
    execv(bin, argv);
    _exit(127);
  }
  if (pid < 0)
    fprintf(stderr, "dur_worker_spawn: fork: %s\n", strerror(errno));
  return pid;
}

int dur_worker_main(int argc, char **argv) {
  if (argc != 9) {
    fprintf(stderr, "usage: dur_worker SHARED_FD N_WORKERS ROWS_PER_WORKER "
            "SEED W ADDR ACK_DIR|- RETRY_MS (started by the durability "
            "tests)\n");
    return 2;
  }
  dur_workload_t wl = {.n_workers = atoi(argv[2]),
                       .rows_per_worker = atoi(argv[3]),
                       .seed = strtoull(argv[4], NULL, 10)};
  const int w = atoi(argv[5]);
  if (w < 0 || w >= DUR_MAX_WORKERS) {
    fprintf(stderr, "dur_worker: worker %s out of range\n", argv[5]);
    return 2;
  }
  dur_shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                          MAP_SHARED, atoi(argv[1]), 0);
  if (sh == MAP_FAILED) {
    fprintf(stderr, "dur_worker: shared memory (fd %s): %s\n", argv[1],
            strerror(errno));
    return 2;
  }
  worker_main(sh, &wl, w, argv[6], strcmp(argv[7], "-") ? argv[7] : NULL,
              atoi(argv[8]));
}

int dur_worker_wait_acked(dur_shared_t *sh, int w, uint64_t want,
                          int timeout_ms) {
  double deadline = dur_now_ms() + timeout_ms;
  for (;;) {
    if (atomic_load(&sh->w[w].acked_ada) >= want)
      return 1;
    if (atomic_load(&sh->w[w].failed))
      return 0;
    if (dur_now_ms() > deadline)
      return -1;
    dur_sleep_ms(2);
  }
}

void dur_workers_finish(dur_shared_t *sh, pid_t *pids, int n, int timeout_ms,
                        int report_errors) {
  atomic_store(&sh->stop, 1);
  double deadline = dur_now_ms() + timeout_ms;
  for (int w = 0; w < n; w++) {
    if (pids[w] <= 0)
      continue;
    int code = -1;
    int left = (int)(deadline - dur_now_ms());
    if (it_wait_exit(pids[w], left > 0 ? left : 0, &code) == 0) {
      char who[32];
      snprintf(who, sizeof who, "worker %d", w);
      it_dump_stacks(pids[w], who);
      kill(pids[w], SIGKILL);
      it_wait_exit(pids[w], 10000, &code);
      dur_fail("worker %d did not finish within %d ms", w, timeout_ms);
    } else if (code != 0 && report_errors) {
      dur_fail("%s", sh->w[w].error[0] ? sh->w[w].error : "worker failed");
    }
    pids[w] = 0;
  }
}

/* ------------------------------------------------------------ files */

static int rm_rf_at(const char *path) {
  struct stat st;
  if (lstat(path, &st))
    return errno == ENOENT ? 0 : -1;
  if (!S_ISDIR(st.st_mode))
    return unlink(path);
  DIR *d = opendir(path);
  if (!d)
    return -1;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
    rm_rf_at(sub);
  }
  closedir(d);
  return rmdir(path);
}

int dur_rm_rf(const char *path) { return rm_rf_at(path); }

double dur_metric(const char *body, const char *name) {
  size_t n = strlen(name);
  for (const char *p = body; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
    if (!strncmp(p, name, n) && p[n] == ' ')
      return strtod(p + n + 1, NULL);
  return -1;
}

int dur_tmpfs_mount(char *mnt, size_t cap, const char *size, char *why,
                    size_t why_len) {
  char opts[64];
  snprintf(opts, sizeof opts, "size=%s", size);
  why[0] = 0;
  if (dur_mkdtemp(mnt, cap, "tmpfs"))
    snprintf(why, why_len, "mkdtemp: %s", strerror(errno));
  else if (unshare(CLONE_NEWNS))
    snprintf(why, why_len, "unshare(CLONE_NEWNS): %s", strerror(errno));
  else if (mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL))
    snprintf(why, why_len, "mount --make-rprivate /: %s", strerror(errno));
  else if (mount("tmpfs", mnt, "tmpfs", 0, opts))
    snprintf(why, why_len, "mount -t tmpfs: %s", strerror(errno));
  if (!why[0])
    return 0;
  rmdir(mnt);
  return -1;
}

void dur_tmpfs_unmount(const char *mnt) {
  umount2(mnt, MNT_DETACH);
  rmdir(mnt);
}

int dur_fill_fs(const char *dir, char *path, size_t cap) {
  snprintf(path, cap, "%s/filler", dir);
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0)
    return -1;
  static char block[65536];
  size_t sz = sizeof block;
  while (sz >= 1) {
    ssize_t w = write(fd, block, sz);
    if (w < 0 && errno == ENOSPC)
      sz /= 2;
    else if (w < 0)
      break;
  }
  close(fd);
  return 0;
}

static int copy_file(const char *src, const char *dst, mode_t mode) {
  int in = open(src, O_RDONLY);
  if (in < 0)
    return -1;
  int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, mode & 0777);
  if (out < 0) {
    close(in);
    return -1;
  }
  char buf[65536];
  ssize_t r;
  int rc = 0;
  while ((r = read(in, buf, sizeof buf)) > 0)
    if (write(out, buf, (size_t)r) != r) {
      rc = -1;
      break;
    }
  if (r < 0)
    rc = -1;
  close(in);
  close(out);
  return rc;
}

int dur_copy_tree(const char *src, const char *dst) {
  struct stat st;
  if (stat(src, &st))
    return -1;
  if (!S_ISDIR(st.st_mode))
    return copy_file(src, dst, st.st_mode);
  if (mkdir(dst, st.st_mode & 0777) && errno != EEXIST)
    return -1;
  DIR *d = opendir(src);
  if (!d)
    return -1;
  struct dirent *e;
  int rc = 0;
  while (!rc && (e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/%s", src, e->d_name);
    snprintf(b, sizeof b, "%s/%s", dst, e->d_name);
    rc = dur_copy_tree(a, b);
  }
  closedir(d);
  return rc;
}

typedef struct {
  char **v;
  size_t n, cap;
} strlist_t;

static void strlist_add(strlist_t *l, const char *s) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    char **v = realloc(l->v, cap * sizeof *v);
    if (!v)
      return;
    l->v = v;
    l->cap = cap;
  }
  char *d = strdup(s);
  if (d)
    l->v[l->n++] = d;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void list_rec(const char *root, const char *rel, strlist_t *l) {
  char path[4096];
  snprintf(path, sizeof path, "%s%s%s", root, rel[0] ? "/" : "", rel);
  DIR *d = opendir(path);
  if (!d)
    return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    char sub[4096], full[8192];
    snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
    snprintf(full, sizeof full, "%s/%s", root, sub);
    struct stat st;
    if (lstat(full, &st))
      continue;
    if (S_ISDIR(st.st_mode))
      list_rec(root, sub, l);
    else if (S_ISREG(st.st_mode) && strcmp(sub, "LOCK") != 0)
      strlist_add(l, sub);
  }
  closedir(d);
}

size_t dur_list_files(const char *dir, char ***out) {
  strlist_t l = {0};
  list_rec(dir, "", &l);
  if (l.n)
    qsort(l.v, l.n, sizeof *l.v, cmp_str);
  *out = l.v;
  return l.n;
}

size_t dur_list_names(const char *dir, const char *prefix, char ***out) {
  strlist_t l = {0};
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
      if (!strncmp(e->d_name, prefix, strlen(prefix)))
        strlist_add(&l, e->d_name);
    closedir(d);
  }
  if (l.n)
    qsort(l.v, l.n, sizeof *l.v, cmp_str);
  *out = l.v;
  return l.n;
}

void dur_free_list(char **v, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(v[i]);
  free(v);
}

long long dur_file_size(const char *path) {
  struct stat st;
  return stat(path, &st) ? -1 : (long long)st.st_size;
}

uint64_t dur_file_hash(const char *path) {
  int fd = open(path, O_RDONLY);
  if (fd < 0)
    return 0;
  uint64_t h = 0xcbf29ce484222325ULL;
  unsigned char buf[65536];
  ssize_t r;
  while ((r = read(fd, buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < r; i++)
      h = (h ^ buf[i]) * 0x100000001b3ULL;
  close(fd);
  return h;
}

/* ------------------------------------------------------------ checks */

void dur_workers_stop(pid_t *pids, int n) {
  for (int i = 0; i < n; i++)
    if (pids[i] > 0)
      kill(pids[i], SIGSTOP);
  for (int i = 0; i < n; i++) {
    if (pids[i] <= 0)
      continue;
    int st;
    while (waitpid(pids[i], &st, WUNTRACED) < 0 && errno == EINTR) {
    }
    if (!WIFSTOPPED(st))
      pids[i] = -pids[i]; /* it exited: dur_workers_alive reports it */
  }
}

void dur_workers_cont(pid_t *pids, int n) {
  for (int i = 0; i < n; i++)
    if (pids[i] > 0)
      kill(pids[i], SIGCONT);
}

int dur_check_witness(embps_client_t *c, const dur_workload_t *wl,
                      dur_shared_t *sh, const char *when, int exact,
                      int report_loss) {
  double wit[2 * DUR_MAX_WORKERS];
  if (dur_pull_wit(c, wl, wit))
    return 0;
  int lost = 0;
  for (int w = 0; w < wl->n_workers; w++) {
    uint64_t acked = atomic_load(&sh->w[w].acked_wit);
    int inflight = atomic_load(&sh->w[w].inflight_wit);
    uint64_t hi = exact ? acked : acked + (uint64_t)inflight;
    for (int k = 0; k < 2; k++) {
      int row = k * wl->n_workers + w;
      double v = wit[row];
      if (v < (double)acked) {
        lost++;
        if (report_loss)
          dur_fail("%s: worker %d: witness row %d = %.0f but %llu pushes "
                   "acknowledged: acknowledged witness pushes #%.0f..#%llu "
                   "LOST", when, w, row, v, (unsigned long long)acked, v,
                   (unsigned long long)acked - 1);
        else
          dur_note("%s: worker %d: witness row %d = %.0f < %llu "
                   "acknowledged: loss detected", when, w, row, v,
                   (unsigned long long)acked);
      } else if (v > (double)hi) {
        dur_fail("%s: worker %d: witness row %d = %.0f but only %llu "
                 "acknowledged + %llu in flight: %.0f push(es) DOUBLED or "
                 "applied without being sent", when, w, row, v,
                 (unsigned long long)acked, (unsigned long long)(hi - acked),
                 v - (double)hi);
      }
    }
    if (wit[w] != wit[wl->n_workers + w])
      dur_fail("%s: worker %d: its two witness rows disagree (%.0f vs %.0f): "
               "a push was applied to one shard only", when, w, wit[w],
               wit[wl->n_workers + w]);
  }
  return lost;
}

int dur_workers_alive(pid_t *pids, int n, dur_shared_t *sh) {
  int dead = 0;
  for (int i = 0; i < n; i++) {
    if (pids[i] > 0) {
      int st;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i])
        pids[i] = -pids[i];
    }
    if (pids[i] < 0) {
      dur_fail("%s", sh->w[i].error[0] ? sh->w[i].error
                                         : "a worker exited early");
      dead++;
      pids[i] = 0;
    }
  }
  return dead;
}
