/* faultfs.c - an LD_PRELOAD shim for the durability tests: makes writes
 * fail with ENOSPC past a byte budget and fsync/fdatasync fail with EIO,
 * only for files under $FAULTFS_DIR, switchable at run time.
 *
 * $FAULTFS_CTL names a control file holding "BUDGET FSYNC_EIO GEN":
 * BUDGET bytes may still be written under the dir (-1: no limit), counted
 * from the moment GEN changed; a write crossing it is short, the next one
 * fails with ENOSPC; FSYNC_EIO 1 makes fsync and fdatasync of files (and
 * directories) under the dir fail with EIO. The file is re-read on every
 * intercepted call on such a file, so a test switches faults by rewriting
 * it (write a temporary file and rename it over).
 *
 * $FAULTFS_SYNC_LOG names a file to which every fsync and fdatasync of a
 * file or directory under the dir appends one line once it returns:
 * "fdatasync 0 PATH" (the call, its return value, the file), so a test
 * counts the syncs a process makes and of what, whatever it makes them
 * fail with. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long long written;   /* bytes since the generation changed */
static long long last_gen = -1;

/* 1 if fd is a file under $FAULTFS_DIR; its path in path (cap bytes). */
static int fd_under_dir(int fd, char *path, size_t cap) {
  const char *dir = getenv("FAULTFS_DIR");
  if (!dir || !*dir || fd < 0)
    return 0;
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, cap - 1);
  if (n <= 0)
    return 0;
  path[n] = 0;
  size_t dl = strlen(dir);
  return !strncmp(path, dir, dl) && (path[dl] == '/' || path[dl] == 0);
}

static int faulty_fd(int fd) {
  char path[4096];
  return fd_under_dir(fd, path, sizeof path);
}

/* Appends "CALL RC PATH" to $FAULTFS_SYNC_LOG (raw syscalls: the write
 * is not intercepted; one write of O_APPEND, whole among threads). */
static void log_sync(const char *call, int rc, const char *path) {
  const char *log = getenv("FAULTFS_SYNC_LOG");
  if (!log || !*log)
    return;
  char line[4200];
  int n = snprintf(line, sizeof line, "%s %d %s\n", call, rc, path);
  if (n <= 0 || (size_t)n >= sizeof line)
    return;
  int fd = (int)syscall(SYS_openat, AT_FDCWD, log,
                        O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    return;
  ssize_t w = syscall(SYS_write, fd, line, (size_t)n);
  (void)w;
  syscall(SYS_close, fd);
}

/* Reads the control file (raw syscalls: not intercepted). */
static void read_ctl(long long *budget, int *fsync_eio) {
  *budget = -1;
  *fsync_eio = 0;
  const char *ctl = getenv("FAULTFS_CTL");
  if (!ctl)
    return;
  int fd = (int)syscall(SYS_openat, AT_FDCWD, ctl, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return;
  char buf[128];
  ssize_t n = syscall(SYS_read, fd, buf, sizeof buf - 1);
  syscall(SYS_close, fd);
  if (n <= 0)
    return;
  buf[n] = 0;
  long long gen = 0;
  if (sscanf(buf, "%lld %d %lld", budget, fsync_eio, &gen) != 3) {
    *budget = -1;
    *fsync_eio = 0;
    return;
  }
  if (gen != last_gen) {
    last_gen = gen;
    written = 0;
  }
}

/* How many of `want` bytes may be written now (0: ENOSPC); reserves them. */
static size_t allow_bytes(size_t want) {
  pthread_mutex_lock(&mu);
  long long budget;
  int eio;
  read_ctl(&budget, &eio);
  size_t ok = want;
  if (budget >= 0) {
    long long left = budget - written;
    if (left <= 0)
      ok = 0;
    else if ((long long)want > left)
      ok = (size_t)left;
  }
  written += (long long)ok;
  pthread_mutex_unlock(&mu);
  return ok;
}

static void unreserve(size_t n) {
  pthread_mutex_lock(&mu);
  written -= (long long)n;
  pthread_mutex_unlock(&mu);
}

/* Bytes left in the budget, or -1 for no limit. */
static long long budget_left(void) {
  pthread_mutex_lock(&mu);
  long long budget;
  int eio;
  read_ctl(&budget, &eio);
  long long left = budget < 0 ? -1 : budget > written ? budget - written : 0;
  pthread_mutex_unlock(&mu);
  return left;
}

static int fsync_fails(void) {
  pthread_mutex_lock(&mu);
  long long budget;
  int eio;
  read_ctl(&budget, &eio);
  pthread_mutex_unlock(&mu);
  return eio;
}

#define REAL(name)                                                             \
  static __typeof__(&name) real_##name;                                        \
  if (!real_##name)                                                            \
    real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

/* Shared body of write and pwrite: limits count, fixes the budget after. */
#define LIMITED(call)                                                          \
  do {                                                                         \
    if (!count || !faulty_fd(fd))                                              \
      return call;                                                             \
    size_t ok = allow_bytes(count);                                            \
    if (!ok) {                                                                 \
      errno = ENOSPC;                                                          \
      return -1;                                                               \
    }                                                                          \
    count = ok;                                                                \
    ssize_t r = call;                                                          \
    unreserve(r < 0 ? ok : ok - (size_t)r);                                    \
    return r;                                                                  \
  } while (0)

ssize_t write(int fd, const void *buf, size_t count) {
  REAL(write);
  LIMITED(real_write(fd, buf, count));
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t off) {
  REAL(pwrite);
  LIMITED(real_pwrite(fd, buf, count, off));
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t off) {
  REAL(pwrite64);
  LIMITED(real_pwrite64(fd, buf, count, off));
}

/* The iovec prefix holding at most `limit` bytes, in out[] (cnt entries). */
static int iov_prefix(const struct iovec *iov, int cnt, size_t limit,
                      struct iovec *out) {
  int k = 0;
  for (int i = 0; i < cnt && limit; i++, k++) {
    out[k] = iov[i];
    if (out[k].iov_len > limit)
      out[k].iov_len = limit;
    limit -= out[k].iov_len;
  }
  return k;
}

static size_t iov_total(const struct iovec *iov, int cnt) {
  size_t t = 0;
  for (int i = 0; i < cnt; i++)
    t += iov[i].iov_len;
  return t;
}

/* Shared body of the vector writes. */
#define LIMITED_V(callexpr)                                                    \
  do {                                                                         \
    size_t count = cnt > 0 ? iov_total(iov, cnt) : 0;                          \
    if (!count || cnt > 1024 || !faulty_fd(fd)) {                              \
      const struct iovec *v = iov;                                             \
      int n = cnt;                                                             \
      return callexpr;                                                         \
    }                                                                          \
    size_t ok = allow_bytes(count);                                            \
    if (!ok) {                                                                 \
      errno = ENOSPC;                                                          \
      return -1;                                                               \
    }                                                                          \
    struct iovec cut[1024];                                                    \
    const struct iovec *v = cut;                                               \
    int n = iov_prefix(iov, cnt, ok, cut);                                     \
    ssize_t r = callexpr;                                                      \
    unreserve(r < 0 ? ok : ok - (size_t)r);                                    \
    return r;                                                                  \
  } while (0)

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
  REAL(writev);
  LIMITED_V(real_writev(fd, v, n));
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
  REAL(pwritev);
  LIMITED_V(real_pwritev(fd, v, n, off));
}

ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off,
                 int flags) {
  REAL(pwritev2);
  LIMITED_V(real_pwritev2(fd, v, n, off, flags));
}

int fallocate(int fd, int mode, off_t off, off_t len) {
  REAL(fallocate);
  long long left;
  if (faulty_fd(fd) && len > 0 && (left = budget_left()) >= 0 && left < len) {
    errno = ENOSPC;
    return -1;
  }
  return real_fallocate(fd, mode, off, len);
}

/* Shared body of fsync and fdatasync: fails with EIO when the control
 * file says so, then logs the call. */
#define SYNCED(name)                                                           \
  do {                                                                         \
    char path[4096];                                                           \
    if (!fd_under_dir(fd, path, sizeof path))                                  \
      return real_##name(fd);                                                  \
    int rc = -1, e = EIO;                                                      \
    if (!fsync_fails()) {                                                      \
      rc = real_##name(fd);                                                    \
      e = errno;                                                               \
    }                                                                          \
    log_sync(#name, rc, path);                                                 \
    errno = e;                                                                 \
    return rc;                                                                 \
  } while (0)

int fsync(int fd) {
  REAL(fsync);
  SYNCED(fsync);
}

int fdatasync(int fd) {
  REAL(fdatasync);
  SYNCED(fdatasync);
}
