/* notify.c - tells a service manager how the server is doing, the protocol
 * of sd_notify(3) written out rather than linked from libsystemd: one
 * datagram of newline-separated KEY=VALUE assignments sent to the unix
 * socket named by $NOTIFY_SOCKET ("@name": the abstract namespace, the
 * '@' standing for the leading NUL byte). systemd identifies the sender by
 * the credentials the kernel attaches (its socket sets SO_PASSCRED), so
 * nothing else goes with the message.
 *
 * The server sends READY=1 once, after its ready line (it listens, and has
 * restored its data directory: systemd's Type=notify then counts the start
 * as done), and STOPPING=1 when the drain begins (SIGTERM or a stop call).
 * Without $NOTIFY_SOCKET nothing is sent. A manager that is gone or a bad
 * address costs one warning, never the server. */
#include "notify.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

static atomic_int warned;

static int warn_once(const char *where, int rc) {
  if (!atomic_exchange(&warned, 1))
    LOG_WARN("NOTIFY_SOCKET=%s: cannot notify the service manager: %s", where,
             strerror(-rc));
  return rc;
}

int embps_notify(const char *state) {
  const char *where = getenv("NOTIFY_SOCKET");
  if (!where || !*where)
    return 0;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t n = strlen(where);
  if ((where[0] != '/' && where[0] != '@') || n < 2 ||
      n > sizeof sa.sun_path - (where[0] == '/'))
    return warn_once(where, -EINVAL); /* vsock: and relative names too */
  memcpy(sa.sun_path, where, n);
  if (where[0] == '@')
    sa.sun_path[0] = '\0';
  socklen_t sa_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return warn_once(where, -errno);
  ssize_t sent;
  do
    sent = sendto(fd, state, strlen(state), MSG_NOSIGNAL,
                  (const struct sockaddr *)&sa, sa_len);
  while (sent < 0 && errno == EINTR);
  int rc = sent < 0 ? -errno : 1;
  close(fd);
  return rc < 0 ? warn_once(where, rc) : rc;
}

int embps_notify_ready(const char *host, int port) {
  char msg[384];
  snprintf(msg, sizeof msg, "READY=1\nSTATUS=serving on %s:%d", host, port);
  return embps_notify(msg);
}

int embps_notify_stopping(void) {
  return embps_notify("STOPPING=1\nSTATUS=finishing in-flight requests, "
                      "then the final checkpoint");
}
