/* cli_backup.c - `embps backup --out DIR`: an online backup of every
 * member of a cluster (or of the one --member names) while it serves.
 *
 * Each member's snapshot stream (client/snapshot.h, with the log records
 * after its checkpoint) becomes a data dir, DIR/member-I: its checkpoint
 * ckpt-<S>/ (MANIFEST and table files, byte for byte what the server's
 * checkpoint writer would write) and log/ with the records from S + 1 to
 * the highest shard LSN the copy saw, so `embps-server --data-dir
 * DIR/member-I` (same --cluster-size and --cluster-index, any --shards)
 * restores exactly the member's state at that LSN. A member is written as
 * DIR/member-I.tmp, every file and directory fsynced, then renamed and DIR
 * fsynced; DIR/BACKUP (members, LSNs, bytes) is written the same way once
 * every member is, so a backup with a BACKUP file is complete.
 *
 * DIR must not exist, or be an empty directory. Everything in it is made
 * with mkdirat and openat(O_CREAT | O_EXCL | O_NOFOLLOW) relative to
 * directories opened with O_NOFOLLOW: nothing planted in DIR (a symlink,
 * a file of the same name) is followed or overwritten. A failure removes
 * what this run made. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "snapshot.h"
#include "util.h"

#define FLUSH_BYTES (64u << 20) /* write-behind: at most this much dirty */

typedef struct {
  int dir_fd;            /* DIR */
  int member_fd;         /* DIR/member-I.tmp */
  int ckpt_fd, log_fd;   /* its ckpt-S and log directories */
  int file_fd;           /* the file being written */
  uint64_t file_off, flushed;
  uint64_t total;        /* bytes of the files written */
  char member[64];       /* "member-I" */
  char path[1400];       /* the file, for messages */
  const char *out;       /* DIR as given */
} backup_t;

static int sys_err(char *err, size_t err_len, const char *what,
                   const char *path) {
  snprintf(err, err_len, "%s %.900s: %s", what, path, strerror(errno));
  return -1;
}

/* A directory made in parent (mkdirat, 0700) and opened without
 * following a symlink; -1 with err. */
static int make_dir(int parent, const char *name, const char *shown,
                    char *err, size_t err_len) {
  if (mkdirat(parent, name, 0700))
    return sys_err(err, err_len, "cannot create", shown);
  int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
                                    O_CLOEXEC);
  if (fd < 0)
    sys_err(err, err_len, "cannot open", shown);
  return fd;
}

/* Removes what is in the directory fd (files, and directories it holds,
 * recursively), never following a symlink; closes fd. */
static void empty_dir(int fd) {
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return;
  }
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    int sub = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
                                        O_CLOEXEC);
    if (sub >= 0) {
      empty_dir(sub);
      unlinkat(fd, e->d_name, AT_REMOVEDIR);
    } else {
      unlinkat(fd, e->d_name, 0);
    }
  }
  closedir(d);
}

/* ---- the sink: a member's stream into DIR/member-I.tmp ---- */

static int b_head(void *ctx, const embps_snapstream_head_t *h, char *err,
                  size_t err_len) {
  backup_t *b = ctx;
  char name[64], shown[1400];
  snprintf(name, sizeof name, "ckpt-%016" PRIx64, h->lsn);
  snprintf(shown, sizeof shown, "%s/%s.tmp/%s", b->out, b->member, name);
  if ((b->ckpt_fd = make_dir(b->member_fd, name, shown, err, err_len)) < 0)
    return -1;
  snprintf(shown, sizeof shown, "%s/%s.tmp/log", b->out, b->member);
  b->log_fd = make_dir(b->member_fd, "log", shown, err, err_len);
  return b->log_fd < 0 ? -1 : 0;
}

static int b_file(void *ctx, const embps_snapstream_entry_t *e,
                  const char *name, char *err, size_t err_len) {
  backup_t *b = ctx;
  const int log = e->type == EMBPS_SNAPSTREAM_LOG;
  snprintf(b->path, sizeof b->path, "%s/%s.tmp/%s/%s", b->out, b->member,
           log ? "log" : "ckpt", name);
  b->file_fd = openat(log ? b->log_fd : b->ckpt_fd, name,
                      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                      0600);
  b->file_off = b->flushed = 0;
  return b->file_fd < 0 ? sys_err(err, err_len, "cannot create", b->path)
                        : 0;
}

static int b_write(void *ctx, const uint8_t *p, size_t n, char *err,
                   size_t err_len) {
  backup_t *b = ctx;
  while (n) {
    ssize_t k = write(b->file_fd, p, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return sys_err(err, err_len, "cannot write", b->path);
    p += k;
    n -= (size_t)k;
    b->file_off += (uint64_t)k;
  }
  if (b->file_off - b->flushed >= FLUSH_BYTES) { /* no GBs of dirty pages */
    sync_file_range(b->file_fd, (off64_t)b->flushed,
                    (off64_t)(b->file_off - b->flushed),
                    SYNC_FILE_RANGE_WRITE);
    b->flushed = b->file_off;
  }
  return 0;
}

static int b_file_end(void *ctx, uint64_t bytes, char *err, size_t err_len) {
  backup_t *b = ctx;
  int rc = 0;
  if (bytes != b->file_off) {
    snprintf(err, err_len, "%s: %" PRIu64 " bytes written, the stream says %"
             PRIu64, b->path, b->file_off, bytes);
    rc = -1;
  } else if (fsync(b->file_fd)) {
    rc = sys_err(err, err_len, "cannot fsync", b->path);
  }
  b->total += bytes;
  close(b->file_fd);
  b->file_fd = -1;
  return rc;
}

static const embps_snapshot_sink_t sink = {b_head, b_file, b_write,
                                           b_file_end};

/* ---- the command ---- */

typedef struct {
  uint32_t index;
  uint64_t lsn, end_lsn, bytes;
  double seconds;
} done_t;

/* Backs member i up into DIR/member-I (dir_fd: DIR). 0, or 1 with a
 * message printed. */
static int backup_member(embps_client_t *c, uint32_t i, backup_t *b,
                         done_t *done) {
  char err[1024], tmp[80];
  snprintf(b->member, sizeof b->member, "member-%u", i);
  snprintf(tmp, sizeof tmp, "%s.tmp", b->member);
  b->ckpt_fd = b->log_fd = b->file_fd = -1;
  char shown[1400];
  snprintf(shown, sizeof shown, "%s/%s", b->out, tmp);
  b->member_fd = make_dir(b->dir_fd, tmp, shown, err, sizeof err);
  if (b->member_fd < 0) {
    fprintf(stderr, "embps: backup: %s\n", err);
    return 1;
  }
  embps_snapshot_options_t o = {.with_log = 1};
  b->total = 0;
  embps_snapshot_info_t info;
  embps_snapstream_end_t end;
  const uint64_t t0 = embps_now_ns();
  int rc = embps_snapshot_copy(c, i, &o, &sink, b, &info, &end);
  if (b->file_fd >= 0) { /* a file the failure cut short */
    close(b->file_fd);
    b->file_fd = -1;
  }
  if (rc)
    snprintf(err, sizeof err, "%s", embps_client_last_error(c));
  if (!rc && info.cluster_index != i) {
    snprintf(err, sizeof err, "server %s is member %u, not %u",
             embps_client_server_address(c, i), info.cluster_index, i);
    rc = -1;
  }
  const int fds[] = {b->ckpt_fd, b->log_fd, b->member_fd};
  for (int k = 0; k < 3; k++)
    if (!rc && fds[k] >= 0 && fsync(fds[k]))
      rc = sys_err(err, sizeof err, "cannot fsync a directory of", shown);
  if (b->ckpt_fd >= 0)
    close(b->ckpt_fd);
  if (b->log_fd >= 0)
    close(b->log_fd);
  if (!rc && renameat(b->dir_fd, tmp, b->dir_fd, b->member))
    rc = sys_err(err, sizeof err, "cannot rename", shown);
  if (!rc && fsync(b->dir_fd))
    rc = sys_err(err, sizeof err, "cannot fsync", b->out);
  if (rc) {
    empty_dir(b->member_fd); /* closes it */
    unlinkat(b->dir_fd, tmp, AT_REMOVEDIR);
    fprintf(stderr, "embps: backup of member %u (%s): %s\n", i,
            embps_client_server_address(c, i), err);
    return 1;
  }
  close(b->member_fd);
  done->index = i;
  done->lsn = info.lsn;
  done->end_lsn = end.lsn;
  done->bytes = b->total;
  done->seconds = (double)(embps_now_ns() - t0) / 1e9;
  return 0;
}

/* DIR opened: created (0700), or an existing empty directory. *made: it
 * was created here. -1 with a message printed. */
static int open_out(const char *out, int *made) {
  *made = 0;
  if (!mkdir(out, 0700)) {
    *made = 1;
    int fd = open(out, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
      fprintf(stderr, "embps: backup: cannot open %s: %s\n", out,
              strerror(errno));
    return fd;
  }
  if (errno != EEXIST) {
    fprintf(stderr, "embps: backup: cannot create %s: %s\n", out,
            strerror(errno));
    return -1;
  }
  int fd = open(out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "embps: backup: %s exists and is not a directory we can "
            "open: %s\n", out, strerror(errno));
    return -1;
  }
  int probe = dup(fd);
  DIR *d = probe >= 0 ? fdopendir(probe) : NULL;
  int entries = d ? 0 : -1;
  for (struct dirent *e; d && (e = readdir(d));)
    entries += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (d)
    closedir(d);
  else if (probe >= 0)
    close(probe);
  if (entries) {
    fprintf(stderr, "embps: backup: %s is not empty (it may hold a data dir "
            "or an earlier backup): give a new or empty directory\n", out);
    close(fd);
    return -1;
  }
  return fd;
}

/* DIR/BACKUP, written last: what the backup holds, one member a line. */
static int write_index(int dir_fd, const char *out, const done_t *done,
                       uint32_t n, uint32_t cluster_size) {
  char buf[256 * 1024];
  size_t len = (size_t)snprintf(buf, sizeof buf, "embps backup\n"
                                "cluster_size %u\n", cluster_size);
  for (uint32_t i = 0; i < n && len < sizeof buf - 200; i++)
    len += (size_t)snprintf(buf + len, sizeof buf - len, "member %u dir "
                            "member-%u checkpoint_lsn %" PRIu64 " lsn %" PRIu64
                            " bytes %" PRIu64 "\n", done[i].index,
                            done[i].index, done[i].lsn, done[i].end_lsn,
                            done[i].bytes);
  int fd = openat(dir_fd, "BACKUP.tmp",
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  int rc = fd < 0 || write(fd, buf, len) != (ssize_t)len || fsync(fd) ? -1 : 0;
  if (fd >= 0)
    close(fd);
  if (!rc && (renameat(dir_fd, "BACKUP.tmp", dir_fd, "BACKUP") ||
              fsync(dir_fd)))
    rc = -1;
  if (rc) {
    fprintf(stderr, "embps: backup: cannot write %s/BACKUP: %s\n", out,
            strerror(errno));
    unlinkat(dir_fd, "BACKUP.tmp", 0);
  }
  return rc;
}

int embps_cli_backup(embps_client_t *c, uint32_t member, const char *out) {
  const uint32_t n = (uint32_t)embps_client_n_servers(c);
  done_t *done = calloc(n, sizeof *done);
  int made;
  backup_t b = {.out = out};
  b.dir_fd = done ? open_out(out, &made) : -1;
  if (b.dir_fd < 0) {
    if (!done)
      fprintf(stderr, "embps: out of memory\n");
    free(done);
    return 1;
  }
  uint32_t n_done = 0;
  int rc = 0;
  for (uint32_t i = 0; !rc && i < n; i++) {
    if (member < n && i != member)
      continue;
    rc = backup_member(c, i, &b, &done[n_done]);
    if (!rc) {
      const done_t *d = &done[n_done++];
      printf("member %u (%s): checkpoint at LSN %" PRIu64 ", log to LSN %"
             PRIu64 ", %" PRIu64 " bytes in %.2f s -> %s/member-%u\n", i,
             embps_client_server_address(c, i), d->lsn, d->end_lsn, d->bytes,
             d->seconds, out, i);
    }
  }
  if (!rc)
    rc = write_index(b.dir_fd, out, done, n_done, n) ? 1 : 0;
  if (rc) { /* nothing of this run stays */
    char name[64];
    for (uint32_t i = 0; i < n_done; i++) {
      snprintf(name, sizeof name, "member-%u", done[i].index);
      int fd = openat(b.dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
                                          O_CLOEXEC);
      if (fd >= 0) {
        empty_dir(fd);
        unlinkat(b.dir_fd, name, AT_REMOVEDIR);
      }
    }
    if (made)
      rmdir(out);
  }
  close(b.dir_fd);
  free(done);
  return rc ? 1 : 0;
}
