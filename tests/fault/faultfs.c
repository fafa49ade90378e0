/* faultfs.c - an LD_PRELOAD shim for the durability tests: makes writes
 * fail with ENOSPC past a byte budget, fsync/fdatasync fail with EIO (and
 * the file lose what the failed sync should have written, as ext4 does)
 * or hang (a frozen disk), only for files under $FAULTFS_DIR, switchable
 * at run time.
 *
 * $FAULTFS_CTL names a control file holding "BUDGET FSYNC_EIO GEN [ZERO
 * [HANG]]": BUDGET bytes may still be written under the dir (-1: no
 * limit), counted from the moment GEN changed; a write crossing it is
 * short, the next one fails with ENOSPC; FSYNC_EIO 1 makes fsync and
 * fdatasync of files (and directories) under the dir fail with EIO.
 * ZERO (with FSYNC_EIO) is what such a failed sync loses of a regular
 * file, read back as zeros from then on. Its dirty pages are those from
 * the 4 KiB page holding the lowest offset written since the file's last
 * good sync (in this process) to its end; ZERO 0 loses nothing, 1 all of
 * them (a failed write-back: ext4 over a device that stopped taking
 * writes read them back as zeros), 2 all but the first, 3 the first
 * only. HANG 1 makes fsync and
 * fdatasync under the dir block until HANG is 0 again. The file is
 * re-read on every intercepted call on such a file, so a test switches
 * faults by rewriting it (write a temporary file and rename it over).
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
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static long long written;   /* bytes since the generation changed */
static long long last_gen = -1;

typedef struct {
  long long budget;
  int fsync_eio, zero, hang;
} ctl_t;

/* Regular files written since their last good sync: the lowest offset
 * written (mu held). */
#define DIRTY_MAX 256
static struct {
  dev_t dev;
  ino_t ino;
  long long from;
} dirty[DIRTY_MAX];
static int n_dirty;

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

/* Reads the control file (raw syscalls: not intercepted). mu held. */
static ctl_t read_ctl(void) {
  ctl_t c = {.budget = -1};
  const char *ctl = getenv("FAULTFS_CTL");
  if (!ctl)
    return c;
  int fd = (int)syscall(SYS_openat, AT_FDCWD, ctl, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return c;
  char buf[128];
  ssize_t n = syscall(SYS_read, fd, buf, sizeof buf - 1);
  syscall(SYS_close, fd);
  if (n <= 0)
    return c;
  buf[n] = 0;
  long long gen = 0;
  if (sscanf(buf, "%lld %d %lld %d %d", &c.budget, &c.fsync_eio, &gen,
             &c.zero, &c.hang) < 3)
    return (ctl_t){.budget = -1};
  if (gen != last_gen) {
    last_gen = gen;
    written = 0;
  }
  return c;
}

static ctl_t ctl_now(void) {
  pthread_mutex_lock(&mu);
  ctl_t c = read_ctl();
  pthread_mutex_unlock(&mu);
  return c;
}

/* How many of `want` bytes may be written now (0: ENOSPC); reserves them. */
static size_t allow_bytes(size_t want) {
  pthread_mutex_lock(&mu);
  long long budget = read_ctl().budget;
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
  long long budget = read_ctl().budget;
  long long left = budget < 0 ? -1 : budget > written ? budget - written : 0;
  pthread_mutex_unlock(&mu);
  return left;
}

/* The dirty entry of the file, or NULL (add: a new one). mu held. */
static long long *dirty_from(const struct stat *st, int add) {
  for (int i = 0; i < n_dirty; i++)
    if (dirty[i].dev == st->st_dev && dirty[i].ino == st->st_ino)
      return &dirty[i].from;
  if (!add || n_dirty == DIRTY_MAX)
    return NULL;
  dirty[n_dirty].dev = st->st_dev;
  dirty[n_dirty].ino = st->st_ino;
  dirty[n_dirty].from = -1;
  return &dirty[n_dirty++].from;
}

/* A write to fd at off (-1: where the descriptor writes: its end with
 * O_APPEND, else its position). */
static void note_write(int fd, long long off) {
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode))
    return;
  if (off < 0)
    off = fcntl(fd, F_GETFL) & O_APPEND ? (long long)st.st_size
                                        : (long long)lseek(fd, 0, SEEK_CUR);
  pthread_mutex_lock(&mu);
  long long *from = dirty_from(&st, 1);
  if (from && (*from < 0 || off < *from))
    *from = off;
  pthread_mutex_unlock(&mu);
}

/* A good sync of fd: what the file holds now is on disk. */
static void note_synced(int fd) {
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode))
    return;
  pthread_mutex_lock(&mu);
  long long *from = dirty_from(&st, 0);
  if (from)
    *from = -1;
  pthread_mutex_unlock(&mu);
}

/* A failed sync of fd: the pages it should have written read back as
 * zeros from now on (ZERO, see the top). */
static void lose_unsynced(int fd, int zero) {
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode))
    return;
  pthread_mutex_lock(&mu);
  long long *dirty_off = dirty_from(&st, 0);
  long long from = dirty_off && *dirty_off >= 0 ? *dirty_off / 4096 * 4096
                                                : (long long)st.st_size;
  pthread_mutex_unlock(&mu);
  long long to = (long long)st.st_size;
  if (zero == 2)
    from += 4096;
  else if (zero == 3 && from + 4096 < to)
    to = from + 4096;
  if (zero < 1 || zero > 3 || from >= to)
    return;
  /* a descriptor of its own: fd may be O_APPEND, where pwrite appends */
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  int w = (int)syscall(SYS_openat, AT_FDCWD, link, O_WRONLY | O_CLOEXEC);
  if (w < 0)
    return;
  static const char z[4096];
  for (long long off = from; off < to;) {
    long long n = to - off;
    if (n > (long long)sizeof z)
      n = sizeof z;
    if (syscall(SYS_pwrite64, w, z, (size_t)n, (off_t)off) <= 0)
      break;
    off += n;
  }
  syscall(SYS_close, w);
}

/* The fsync (call) of fd, the file path under the dir: hangs while HANG,
 * fails (EIO, with the loss ZERO says) while FSYNC_EIO, else real_sync;
 * then logs the call. */
static int faulty_sync(int fd, int (*real_sync)(int), const char *call,
                       const char *path) {
  ctl_t c = ctl_now();
  while (c.hang) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
    c = ctl_now();
  }
  int rc = -1, e = EIO;
  if (c.fsync_eio) {
    lose_unsynced(fd, c.zero);
  } else {
    rc = real_sync(fd);
    e = errno;
    if (!rc)
      note_synced(fd);
  }
  log_sync(call, rc, path);
  errno = e;
  return rc;
}

#define REAL(name)                                                             \
  static __typeof__(&name) real_##name;                                        \
  if (!real_##name)                                                            \
    real_##name = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

/* Shared body of write and pwrite: limits count, fixes the budget after. */
#define LIMITED(call, at)                                                      \
  do {                                                                         \
    if (!count || !faulty_fd(fd))                                              \
      return call;                                                             \
    note_write(fd, at);                                                        \
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
  LIMITED(real_write(fd, buf, count), -1);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t off) {
  REAL(pwrite);
  LIMITED(real_pwrite(fd, buf, count, off), off);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t off) {
  REAL(pwrite64);
  LIMITED(real_pwrite64(fd, buf, count, off), off);
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
#define LIMITED_V(callexpr, at)                                                \
  do {                                                                         \
    size_t count = cnt > 0 ? iov_total(iov, cnt) : 0;                          \
    if (!count || cnt > 1024 || !faulty_fd(fd)) {                              \
      const struct iovec *v = iov;                                             \
      int n = cnt;                                                             \
      return callexpr;                                                         \
    }                                                                          \
    note_write(fd, at);                                                        \
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
  LIMITED_V(real_writev(fd, v, n), -1);
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
  REAL(pwritev);
  LIMITED_V(real_pwritev(fd, v, n, off), off);
}

ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off,
                 int flags) {
  REAL(pwritev2);
  LIMITED_V(real_pwritev2(fd, v, n, off, flags), off < 0 ? -1 : off);
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

int fsync(int fd) {
  REAL(fsync);
  char path[4096];
  if (fd_under_dir(fd, path, sizeof path))
    return faulty_sync(fd, real_fsync, "fsync", path);
  return real_fsync(fd);
}

int fdatasync(int fd) {
  REAL(fdatasync);
  char path[4096];
  if (fd_under_dir(fd, path, sizeof path))
    return faulty_sync(fd, real_fdatasync, "fdatasync", path);
  return real_fdatasync(fd);
}
