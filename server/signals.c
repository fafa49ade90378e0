/* signals.c - see signals.h. */
#define _GNU_SOURCE /* pipe2 */
#include "signals.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#include "log.h"

static int pipe_fd[2] = {-1, -1};
static atomic_int hup, serving;

static void on_signal(int signum) {
  int saved = errno;
  unsigned char b = (unsigned char)signum;
  ssize_t w = write(pipe_fd[1], &b, 1); /* async-signal-safe */
  (void)w;
  errno = saved;
}

static void *guard_main(void *arg) {
  (void)arg;
  for (unsigned char b; read(pipe_fd[0], &b, 1) == 1;) {
    if (b == SIGHUP) {
      atomic_store(&hup, 1);
      LOG_INFO("SIGHUP while starting: the reload follows once serving");
      continue;
    }
    if (atomic_load(&serving)) /* the loop's handlers took over */
      continue;
    LOG_INFO("signal %d while starting (restoring the data dir): exiting "
             "without serving; the next start restores it again", b);
    _exit(0);
  }
  return NULL;
}

int embps_signals_guard(void) {
  if (pipe2(pipe_fd, O_CLOEXEC))
    return -errno;
  pthread_t tid;
  sigset_t all, old;
  sigfillset(&all); /* the guard's thread takes no signal itself */
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&tid, NULL, guard_main, NULL);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc)
    return -rc;
  pthread_detach(tid);
  struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGTERM, &sa, NULL) || sigaction(SIGINT, &sa, NULL) ||
      sigaction(SIGHUP, &sa, NULL))
    return -errno;
  return 0;
}

int embps_signals_serving(void) {
  atomic_store(&serving, 1);
  return atomic_exchange(&hup, 0);
}
