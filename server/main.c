/* main.c - the embps-server daemon: flags, process set-up, then the server
 * library (server.c): create, run until SIGTERM or SIGINT, destroy. */
#include <malloc.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

#include "server.h"

/* OpenMP threads spin for a while after each parallel region by default,
 * taking cores the I/O threads need; passive waiting measured +19% push
 * throughput on 2 cores. libgomp reads OMP_WAIT_POLICY in its constructor,
 * which runs before any code of ours can call setenv (libc's own start-up
 * resets the environment after .preinit_array). So the daemon defines
 * getenv and secure_getenv itself: a shared library's reference binds to
 * the executable's definition, and these answer "passive" for
 * OMP_WAIT_POLICY when the environment does not set it, and read the
 * environment unchanged for every other name. The process keeps its name
 * (no re-exec). tests/integration/test_process.sh checks libgomp's view. */
extern char **environ;

static const char omp_wait_name[] = "OMP_WAIT_POLICY";

char *getenv(const char *name) {
  size_t len = strlen(name);
  for (char **e = environ; e && *e; e++)
    if (!strncmp(*e, name, len) && (*e)[len] == '=')
      return *e + len + 1;
  if (!strcmp(name, omp_wait_name))
    return (char *)"passive";
  return NULL;
}

/* glibc declares it only under _GNU_SOURCE */
char *secure_getenv(const char *name);
char *secure_getenv(const char *name) {
  return getauxval(AT_SECURE) ? NULL : getenv(name);
}

int main(int argc, char **argv) {
  embps_server_config_t cfg;
  char err[512];
  int rc = embps_server_config_parse(&cfg, argc, argv, err, sizeof err);
  if (rc > 0)
    return 0;
  if (rc < 0) {
    fprintf(stderr, "embps-server: %s\n", err);
    return 2;
  }
  embps_log_set_level(cfg.log_level);
  embps_log_set_json(cfg.log_json);
  signal(SIGPIPE, SIG_IGN);
  /* Request and reply buffers of a few MiB come and go at every batch; keep
   * them on the heap instead of a fresh mmap (and page faults) each time;
   * larger request bodies go back to a pool (server.h). One arena: the
   * I/O threads' own arenas are heaps that glibc unmaps once they empty,
   * so their next reply faulted in again, page by page (a third of the
   * pull rate here; README "Admission and eviction"); allocations are per
   * request, not per row, so sharing the arena costs nothing measurable. */
  if (!mallopt(M_MMAP_THRESHOLD, EMBPS_MMAP_THRESHOLD) ||
      !mallopt(M_TRIM_THRESHOLD, 256 << 20) || !mallopt(M_ARENA_MAX, 1))
    LOG_WARN("mallopt refused; large buffers will be mmap'd per request");
  /* Default: half the cores apply, the other half serve I/O (measured on
   * 2 cores: README, "Threads"). */
  int cores = omp_get_num_procs();
  /* the apply thread sets it where its parallel regions run (apply.c);
   * OMP_NUM_THREADS stands when no flag is given */
  if (!cfg.omp_threads && !getenv("OMP_NUM_THREADS"))
    cfg.omp_threads = cores > 1 ? (uint32_t)cores / 2 : 1;
  if (cfg.omp_threads)
    omp_set_num_threads((int)cfg.omp_threads);
  cfg.handle_signals = 1;
  embps_server_t *srv;
  if (embps_server_create(&cfg, &srv))
    return 1;
  int status = embps_server_run(srv);
  embps_server_destroy(srv);
  return status;
}
