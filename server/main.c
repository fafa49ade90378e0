/* main.c - the embps-server daemon: the OpenMP wait policy (one re-exec,
 * below), flags, process set-up, the start-up signal guard (signals.h),
 * then the server library (server.c): create, run until SIGTERM or SIGINT
 * (SIGHUP reloads), destroy. */
#include <errno.h>
#include <malloc.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "server.h"
#include "signals.h"

/* OpenMP threads spin for a while after each parallel region by default,
 * taking cores the I/O threads need; passive waiting measured +19% push
 * throughput on 2 cores. The OpenMP runtime reads OMP_WAIT_POLICY once,
 * when it loads (libgomp) or starts (LLVM's libomp), which for libgomp is
 * before main: a setenv in main comes too late. So when the environment
 * does not set a policy, the daemon's first act is to add
 * OMP_WAIT_POLICY=passive to its environment and execute itself again
 * (/proc/self/exe: the same file, even if the path now names another).
 * execve keeps the PID, so a supervisor's PID file and signals reach the
 * server, and keeps argv, so `ps -o args` is unchanged; the variable shows
 * in /proc/PID/environ. Nothing has started then: no thread, no file but
 * stdio. The new image finds the variable set and runs on, so there is
 * one exec at most, and a policy the environment sets (active, or even
 * empty) is never changed. A process that embeds the server library sets
 * the variable itself (server.h). tests/ops/test_process.sh checks what
 * the runtime sees. */
static const char omp_wait_name[] = "OMP_WAIT_POLICY";

/* Returns 0 when the policy is the environment's (set before start, or by
 * the re-exec that brought us here), or the errno of the exec that failed
 * (the server then runs with the runtime's default policy). */
static int omp_passive_reexec(char **argv) {
  if (getenv(omp_wait_name))
    return 0;
  if (setenv(omp_wait_name, "passive", 0))
    return errno;
  execv("/proc/self/exe", argv);
  int err = errno;
  unsetenv(omp_wait_name); /* not the runtime's policy: do not claim it */
  return err;
}

/* The kernel names a process after the file it executes, so after the
 * re-exec `ps -o comm` would show "exe": name it after its binary again. */
static void name_after_binary(void) {
  char comm[17] = "", path[4096];
  if (prctl(PR_GET_NAME, comm) || strcmp(comm, "exe"))
    return;
  static const char deleted[] = " (deleted)"; /* the file was replaced */
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0)
    return;
  path[n] = 0;
  if ((size_t)n > sizeof deleted - 1 &&
      !strcmp(path + n - (sizeof deleted - 1), deleted))
    path[n - (sizeof deleted - 1)] = 0;
  const char *base = strrchr(path, '/');
  prctl(PR_SET_NAME, base ? base + 1 : path);
}

int main(int argc, char **argv) {
  int exec_err = omp_passive_reexec(argv);
  name_after_binary();
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
  if (exec_err)
    LOG_WARN("cannot execute /proc/self/exe again with %s=passive (%s): "
             "OpenMP threads spin after each push; set %s to silence this",
             omp_wait_name, strerror(exec_err), omp_wait_name);
  if (cfg.max_buffer_from == EMBPS_BUDGET_CGROUP)
    LOG_INFO("--max-buffer-bytes %llu: a quarter of the cgroup's memory "
             "limit, %llu bytes (%s)", (unsigned long long)cfg.max_buffer_bytes,
             (unsigned long long)cfg.memory_limit, cfg.memory_limit_file);
  else if (cfg.max_buffer_from == EMBPS_BUDGET_RAM)
    LOG_INFO("--max-buffer-bytes %llu: a quarter of RAM, at least 1 GiB (no "
             "cgroup memory limit below RAM)",
             (unsigned long long)cfg.max_buffer_bytes);
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
  cfg.argv = argv; /* a server the coordinator demotes starts over with it */
  int rc_guard = embps_signals_guard(); /* SIGTERM during the restore */
  if (rc_guard)
    LOG_WARN("cannot guard signals while starting (%s): SIGTERM before "
             "the server serves is not handled", strerror(-rc_guard));
  embps_server_t *srv;
  rc = embps_server_create(&cfg, &srv);
  if (rc)
    return rc == EMBPS_SERVER_EMISFIT ? EMBPS_SERVER_EXIT_CONFIG : 1;
  if (embps_signals_serving())
    embps_server_reload(srv, "SIGHUP (while starting)");
  int status = embps_server_run(srv);
  embps_server_destroy(srv);
  return status;
}
