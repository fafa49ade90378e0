/* main.c - the embps-server daemon: flags, process set-up, then the server
 * library (net.c) runs until SIGTERM or SIGINT. */
#include <malloc.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>

#include "server.h"

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
  signal(SIGPIPE, SIG_IGN);
  /* Request and reply buffers of a few MiB come and go at every batch; keep
   * them on the heap instead of a fresh mmap (and page faults) each time.
   * 32 MiB is the largest threshold glibc accepts on 64-bit machines. */
  if (!mallopt(M_MMAP_THRESHOLD, 32 << 20) ||
      !mallopt(M_TRIM_THRESHOLD, 256 << 20))
    fprintf(stderr, "embps-server: mallopt refused; large buffers will be "
            "mmap'd per request\n");
  if (cfg.omp_threads)
    omp_set_num_threads((int)cfg.omp_threads);
  return embps_server_run(&cfg);
}
