/* dial.c - reaching a server: a TCP connection made within a timeout
 * (every connection of the transport), the HELLO a client says on each,
 * and a one-off HELLO over a connection of its own, outside the client's
 * connections and tickets, that says what a server is now (its role and
 * epoch).
 *
 * The one-off hello is how a client waiting on a member's primary learns
 * that another server of the member was elected meanwhile (transport.c,
 * "Members"): it blocks for at most its timeout, on one socket, and
 * touches nothing of the client but its token and request ids. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "embps/embps.h"
#include "internal.h"
#include "util.h"
#include "wire.h"

int embps_dial_(const char *host, int port, int timeout_ms, char *why,
                size_t why_len) {
  char service[16];
  snprintf(service, sizeof service, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_NUMERICSERV};
  struct addrinfo *res;
  int rc = getaddrinfo(host, service, &hints, &res);
  if (rc) {
    snprintf(why, why_len, "cannot resolve %s: %s", host, gai_strerror(rc));
    return -1;
  }
  int err = ECONNREFUSED;
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 || errno == EINPROGRESS) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int n = poll(&pfd, 1, timeout_ms);
      socklen_t sl = sizeof err;
      if (n == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) == 0 &&
          err == 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        freeaddrinfo(res);
        return fd;
      }
      if (n == 0)
        err = ETIMEDOUT;
    } else {
      err = errno;
    }
    close(fd);
  }
  freeaddrinfo(res);
  snprintf(why, why_len, "cannot connect: %s", strerror(err));
  return -1;
}

/* Waits until fd is ready for `events` or deadline_ns passes: 1 or 0. */
static int ready(int fd, short events, uint64_t deadline_ns) {
  for (;;) {
    uint64_t now = embps_now_ns();
    if (now >= deadline_ns)
      return 0;
    struct pollfd pfd = {.fd = fd, .events = events};
    int ms = (int)((deadline_ns - now + 999999) / 1000000);
    int n = poll(&pfd, 1, ms);
    if (n > 0)
      return 1;
    if (n < 0 && errno != EINTR)
      return 0;
  }
}

/* Sends or receives exactly n bytes on non-blocking fd before
 * deadline_ns: 0 or -1. */
static int io_full(int fd, uint8_t *p, size_t n, int out,
                   uint64_t deadline_ns) {
  while (n) {
    ssize_t r = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
    } else if (r == 0 ||
               (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return -1;
    } else if (!ready(fd, out ? POLLOUT : POLLIN, deadline_ns)) {
      return -1;
    }
  }
  return 0;
}

void embps_hello_msg_(const embps_client_t *c, embps_msg_t *m) {
  memset(m, 0, sizeof *m);
  m->kind = EMBPS_KIND_HELLO;
  m->u.hello.version = EMBPS_PROTOCOL_VERSION;
  memcpy(m->u.hello.token, c->token, c->token_len);
  m->u.hello.token_len = c->token_len;
}

int embps_dial_hello_(embps_client_t *c, const char *host, int port,
                      int timeout_ms, embps_hello_reply_t *out) {
  const uint64_t deadline =
      embps_now_ns() + (uint64_t)timeout_ms * 1000000ULL;
  char why[256];
  int fd = embps_dial_(host, port, timeout_ms, why, sizeof why);
  if (fd < 0)
    return EMBPS_ECONN;
  embps_msg_t m;
  embps_hello_msg_(c, &m);
  const uint32_t req_id = ++c->next_req_id;
  uint8_t *frame = NULL, *body = NULL;
  size_t len = 0;
  int rc = embps_frame_build(&m, req_id, 0, &frame, &len, NULL);
  uint8_t head[EMBPS_FRAME_HEADER_LEN];
  embps_frame_header_t h;
  if (!rc && (io_full(fd, frame, len, 1, deadline) ||
              io_full(fd, head, sizeof head, 0, deadline)))
    rc = EMBPS_ETIMEDOUT;
  /* a hello's reply is its meta alone: a few hundred bytes */
  if (!rc && (embps_frame_header_decode(head, EMBPS_REPLY_META_MAX, &h) ||
              h.req_id != req_id ||
              h.kind != (EMBPS_KIND_HELLO | EMBPS_KIND_REPLY)))
    rc = EMBPS_EPROTO;
  if (!rc && !(body = malloc(h.body_len ? h.body_len : 1)))
    rc = -ENOMEM;
  if (!rc && io_full(fd, body, h.body_len, 0, deadline))
    rc = EMBPS_ETIMEDOUT;
  embps_msg_t r;
  if (!rc && embps_msg_unpack(h.kind, body, h.meta_len, &r))
    rc = EMBPS_EPROTO;
  if (!rc) {
    *out = r.u.hello_reply;
    embps_msg_free(&r);
  }
  free(body);
  free(frame);
  close(fd);
  return rc;
}
