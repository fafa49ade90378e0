/* token.c - reads --auth-token-file, once its owner and mode show that only
 * the server and the processes placed beside it can read the token, and
 * only root or the server can change it.
 *
 * The rule (PostgreSQL checks its key files the same way, so that keys a
 * platform manages, root-owned and group-readable, are accepted):
 *   - others get no access at all (o-rwx) and the group may not write (g-w);
 *   - the group may read only when the server does not run as root, the
 *     file belongs to root or to the server's own uid, and the file's group
 *     is one the server holds (its effective gid or a supplementary one);
 *   - otherwise the file is the owner's alone (0600, 0400).
 * The second case is how the kubelet mounts a Secret: root-owned, mode
 * `defaultMode` (0440), group the pod's fsGroup, which every process of the
 * pod holds as a supplementary group; the path is a symlink chain
 * (token -> ..data/token, ..data -> ..2026_11_25_...), followed here.
 * It stays safe because the group grant reaches exactly the processes the
 * operator started with the server's group (the pod's containers; a unit's
 * own group), never a third user: a group the server does not hold could
 * have other members, so it is refused, as is any owner but root or the
 * server (a third user could chmod the file open or rewrite it later). A
 * server running as root needs no group grant to read, so there the grant
 * could only widen access and is refused too. systemd's LoadCredential=
 * gives the service user a 0400 copy: the first case.
 *
 * The file is opened once and checked through that descriptor (fstat), so
 * what is read is what was checked. */
#include "token.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The fix offered with every refusal of a mode. */
#define FIX "make it 0600 (or 0400) for the server's user, or, for a server " \
            "that is not root, 0440 owned by root with a group the server "   \
            "holds (a Kubernetes Secret: defaultMode: 0440 and the pod's "    \
            "fsGroup)"

int embps_token_reader_self(embps_token_reader_t *r) {
  r->uid = geteuid();
  r->groups[0] = getegid();
  r->n_groups = 1;
  const int cap = (int)(sizeof r->groups / sizeof r->groups[0]) - 1;
  int n = getgroups(cap, r->groups + 1);
  if (n < 0) /* more groups than fit: only the effective gid counts, which
                can refuse a file but never admit one wrongly */
    return -errno;
  r->n_groups += n;
  return 0;
}

static int holds_group(const embps_token_reader_t *r, gid_t gid) {
  for (int i = 0; i < r->n_groups; i++)
    if (r->groups[i] == gid)
      return 1;
  return 0;
}

int embps_token_check(const char *path, const struct stat *st,
                      const embps_token_reader_t *r, char *err,
                      size_t err_len) {
  const unsigned mode = (unsigned)(st->st_mode & 07777);
  const unsigned long uid = (unsigned long)st->st_uid;
  const unsigned long gid = (unsigned long)st->st_gid;
  if (!S_ISREG(st->st_mode)) {
    snprintf(err, err_len, "--auth-token-file %s is not a regular file",
             path);
    return -1;
  }
  if (mode & 0007) {
    snprintf(err, err_len, "--auth-token-file %s: mode %04o lets every user "
             "of the machine %s the token; " FIX, path, mode,
             (mode & 0006) == 0006 ? "read and change"
             : mode & 0004         ? "read"
             : mode & 0002         ? "change"
                                   : "reach");
    return -1;
  }
  if (mode & 0020) {
    snprintf(err, err_len, "--auth-token-file %s: mode %04o lets group %lu "
             "change the token; " FIX, path, mode, gid);
    return -1;
  }
  if (!(mode & 0040))
    return 0;
  if (r->uid == 0) {
    snprintf(err, err_len, "--auth-token-file %s: mode %04o lets group %lu "
             "read the token, and a server running as root needs no group "
             "to read it; make it 0600 (or run the server as its own user)",
             path, mode, gid);
    return -1;
  }
  if (st->st_uid != 0 && st->st_uid != r->uid) {
    snprintf(err, err_len, "--auth-token-file %s: mode %04o lets group %lu "
             "read the token, and it belongs to uid %lu: a group-readable "
             "token must belong to root or to the server's uid %lu; " FIX,
             path, mode, gid, uid, (unsigned long)r->uid);
    return -1;
  }
  if (!holds_group(r, st->st_gid)) {
    snprintf(err, err_len, "--auth-token-file %s: mode %04o lets group %lu "
             "read the token, a group the server (uid %lu) does not hold, so "
             "others may; " FIX, path, mode, gid, (unsigned long)r->uid);
    return -1;
  }
  return 0;
}

/* Why path cannot be opened: the mode rule's refusal when the file breaks
 * it (the usual cause of EACCES), else the system's reason with the owner
 * and mode to compare with the server's uid. */
static void explain_open(const char *path, int e,
                         const embps_token_reader_t *r, char *err,
                         size_t err_len) {
  struct stat st;
  if (stat(path, &st) == 0 && embps_token_check(path, &st, r, err, err_len))
    return;
  if (e == EACCES && stat(path, &st) == 0) {
    snprintf(err, err_len, "--auth-token-file %s: %s (owner uid %lu, group "
             "%lu, mode %04o; the server runs as uid %lu)", path, strerror(e),
             (unsigned long)st.st_uid, (unsigned long)st.st_gid,
             (unsigned)(st.st_mode & 07777), (unsigned long)r->uid);
    return;
  }
  snprintf(err, err_len, "--auth-token-file %s: %s", path, strerror(e));
}

int embps_token_read(const char *path, char *token, size_t cap, size_t *len,
                     char *err, size_t err_len) {
  embps_token_reader_t self;
  (void)embps_token_reader_self(&self); /* a failure leaves the egid alone */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    explain_open(path, errno, &self, err, err_len);
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st)) {
    snprintf(err, err_len, "--auth-token-file %s: %s", path, strerror(errno));
    close(fd);
    return -1;
  }
  if (embps_token_check(path, &st, &self, err, err_len)) {
    close(fd);
    return -1;
  }
  /* the token, a line end, and one byte more to tell a longer file */
  char buf[1024];
  if (cap > sizeof buf - 3)
    cap = sizeof buf - 3;
  size_t n = 0, want = cap + 3;
  while (n < want) {
    ssize_t got = read(fd, buf + n, want - n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0) {
      snprintf(err, err_len, "--auth-token-file %s: %s", path,
               strerror(errno));
      close(fd);
      return -1;
    }
    if (got == 0)
      break;
    n += (size_t)got;
  }
  close(fd);
  while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
    n--;
  if (n == 0 || n > cap) {
    snprintf(err, err_len, "--auth-token-file %s: token must be 1-%zu bytes "
             "(a trailing line end does not count)%s", path, cap,
             n ? ", this one is longer" : ", this file holds none");
    return -1;
  }
  memcpy(token, buf, n);
  *len = n;
  return 0;
}

int embps_tokens_read(const char *path, embps_tokens_t *out, char *err,
                      size_t err_len) {
  char data[EMBPS_TOKENS_MAX * (EMBPS_TOKEN_MAX + 2) - 2]; /* CRLF between */
  size_t len;
  if (embps_token_read(path, data, sizeof data, &len, err, err_len))
    return -1;
  embps_tokens_t t = {.n = 0};
  for (size_t at = 0; at <= len;) {
    const char *nl = memchr(data + at, '\n', len - at);
    size_t end = nl ? (size_t)(nl - data) : len, n = end - at;
    if (n && data[at + n - 1] == '\r')
      n--;
    if (t.n == EMBPS_TOKENS_MAX) {
      snprintf(err, err_len, "--auth-token-file %s: line %d: a third token "
               "(the file holds the current token, and during a rotation "
               "one more)", path, t.n + 1);
      return -1;
    }
    if (!n || n > EMBPS_TOKEN_MAX) {
      snprintf(err, err_len, "--auth-token-file %s: line %d: %s (a token "
               "is 1-%d bytes, one per line)", path, t.n + 1,
               n ? "too long" : "empty", EMBPS_TOKEN_MAX);
      return -1;
    }
    memcpy(t.token[t.n], data + at, n);
    t.len[t.n++] = n;
    at = end + 1;
  }
  *out = t;
  return 0;
}

int embps_token_equal(const char *token, size_t token_len, const void *given,
                      size_t len) {
  const unsigned char *g = given;
  unsigned diff = len != token_len;
  for (size_t i = 0; i < token_len; i++)
    diff |= (unsigned)((unsigned char)token[i] ^ (i < len ? g[i] : 0));
  return diff == 0;
}
