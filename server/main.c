/* main.c - the embps-server daemon: flags, process set-up, then the server
 * library (net.c) runs until SIGTERM or SIGINT. */
#include <malloc.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "server.h"

/* OpenMP threads spin for a while after each parallel region by default,
 * taking cores the I/O threads need; passive waiting measured +19% push
 * throughput on 2 cores. libgomp reads OMP_WAIT_POLICY once, when it is
 * loaded, so unless the user chose a policy the process re-executes itself
 * once with it set. */
static void omp_wait_passive(char **argv) {
  if (getenv("OMP_WAIT_POLICY"))
    return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);
  /* exec failed (no /proc?): carry on with the default policy */
}

int main(int argc, char **argv) {
  omp_wait_passive(argv);
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
  signal(SIGPIPE, SIG_IGN);
  /* Request and reply buffers of a few MiB come and go at every batch; keep
   * them on the heap instead of a fresh mmap (and page faults) each time;
   * larger request bodies go back to a pool (server.h). */
  if (!mallopt(M_MMAP_THRESHOLD, EMBPS_MMAP_THRESHOLD) ||
      !mallopt(M_TRIM_THRESHOLD, 256 << 20))
    fprintf(stderr, "embps-server: mallopt refused; large buffers will be "
            "mmap'd per request\n");
  /* Default: half the cores apply, the other half serve I/O (measured on
   * 2 cores: README, "Threads"). */
  int cores = omp_get_num_procs();
  /* the apply thread sets it where its parallel regions run (apply.c);
   * OMP_NUM_THREADS stands when no flag is given */
  if (!cfg.omp_threads && !getenv("OMP_NUM_THREADS"))
    cfg.omp_threads = cores > 1 ? (uint32_t)cores / 2 : 1;
  if (cfg.omp_threads)
    omp_set_num_threads((int)cfg.omp_threads);
  return embps_server_run(&cfg);
}
