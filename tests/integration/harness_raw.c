/* harness_raw.c - see harness_raw.h. */
#include "harness_raw.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <linux/sockios.h>

int it_raw_connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(fd >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
    fail_msg("raw connect to port %d: %s", port, strerror(errno));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

size_t it_raw_put(int fd, const void *p, size_t n, int timeout_ms) {
  const uint8_t *b = p;
  size_t done = 0;
  double end = it_now_ms() + timeout_ms;
  while (done < n) {
    int left = (int)(end - it_now_ms());
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    if (left <= 0 || poll(&pfd, 1, left) <= 0)
      break;
    ssize_t w = send(fd, b + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (w <= 0)
      break;
    done += (size_t)w;
  }
  return done;
}

long it_raw_unread(int fd) {
  struct sockaddr_in me, peer;
  socklen_t len = sizeof me;
  int outq = 0;
  if (getsockname(fd, (struct sockaddr *)&me, &len) ||
      (len = sizeof peer, getpeername(fd, (struct sockaddr *)&peer, &len)) ||
      ioctl(fd, SIOCOUTQ, &outq))
    return -1;
  FILE *f = fopen("/proc/net/tcp", "r");
  if (!f)
    return -1;
  char line[512];
  long unread = -1;
  while (unread < 0 && fgets(line, sizeof line, f)) {
    unsigned lip, lport, rip, rport, st;
    unsigned long tx, rx;
    if (sscanf(line, " %*u: %x:%x %x:%x %x %lx:%lx", &lip, &lport, &rip,
               &rport, &st, &tx, &rx) != 7)
      continue; /* the heading */
    /* addresses as the kernel prints them: in network order, read as a
     * host-order word */
    if (lip == peer.sin_addr.s_addr && lport == ntohs(peer.sin_port) &&
        rip == me.sin_addr.s_addr && rport == ntohs(me.sin_port))
      unread = (long)rx + outq;
  }
  fclose(f);
  return unread;
}

int it_raw_try_send(int fd, uint16_t kind, embps_msg_t *m, uint32_t req_id,
                    const void *bulk, size_t bulk_len) {
  uint8_t *head;
  size_t head_len;
  m->kind = kind;
  assert_int_equal(
      embps_frame_build_head(m, req_id, bulk_len, &head, &head_len), 0);
  int ok = it_raw_put(fd, head, head_len, 5000) == head_len &&
           it_raw_put(fd, bulk, bulk_len, 5000) == bulk_len;
  free(head);
  return ok ? 0 : -1;
}

void it_raw_send(int fd, uint16_t kind, embps_msg_t *m, uint32_t req_id,
                 const void *bulk, size_t bulk_len) {
  if (it_raw_try_send(fd, kind, m, req_id, bulk, bulk_len))
    fail_msg("raw send of kind %u: %s", kind, strerror(errno));
}

int it_raw_get(int fd, it_raw_reply_t *r, int timeout_ms) {
  memset(r, 0, sizeof *r);
  double end = it_now_ms() + timeout_ms;
  uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
  int rc = it_recv_full(fd, hdr, sizeof hdr, timeout_ms);
  if (rc)
    return rc;
  assert_int_equal(embps_frame_header_decode(hdr, 1u << 30, &r->h), 0);
  r->body = it_xmalloc(r->h.body_len);
  int left = (int)(end - it_now_ms());
  rc = it_recv_full(fd, r->body, r->h.body_len, left > 0 ? left : 1);
  if (rc) {
    it_raw_reply_free(r);
    return rc;
  }
  if (embps_msg_unpack(r->h.kind, r->body, r->h.meta_len, &r->m))
    fail_msg("raw reply of kind %u does not decode", r->h.kind);
  r->has_msg = 1;
  return 0;
}

void it_raw_recv(int fd, it_raw_reply_t *r) {
  int rc = it_raw_get(fd, r, 5000);
  if (rc)
    fail_msg("raw reply: %s", rc > 0 ? "connection closed" : "timed out");
}

void it_raw_reply_free(it_raw_reply_t *r) {
  if (r->has_msg)
    embps_msg_free(&r->m);
  free(r->body);
  memset(r, 0, sizeof *r);
}

void it_raw_expect_error(int fd, uint32_t req_id, int code,
                         const char *substr) {
  it_raw_reply_t r;
  it_raw_recv(fd, &r);
  if (r.h.kind != EMBPS_KIND_ERROR)
    fail_msg("expected an error frame (%s), got kind 0x%x",
             embps_err_name(code), r.h.kind);
  if (r.m.u.error.code != code)
    fail_msg("expected %s, got %s: %s", embps_err_name(code),
             embps_err_name(r.m.u.error.code), r.m.u.error.message);
  if (!strstr(r.m.u.error.message, substr))
    fail_msg("error message \"%s\" does not name the problem (\"%s\")",
             r.m.u.error.message, substr);
  if (req_id != UINT32_MAX)
    assert_int_equal(r.h.req_id, req_id);
  it_raw_reply_free(&r);
}

int it_raw_closed(int fd, int timeout_ms) {
  double end = it_now_ms() + timeout_ms;
  uint8_t buf[4096];
  for (int first = 1;; first = 0) {
    int left = (int)(end - it_now_ms());
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (left <= 0 && !first)
      return 0;
    if (poll(&pfd, 1, left > 0 ? left : 0) <= 0)
      continue;
    ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN))
      return 1;
  }
}

void it_raw_hello(int fd, const char *token, uint32_t req_id) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.u.hello.version = EMBPS_PROTOCOL_VERSION;
  if (token) {
    m.u.hello.token_len = strlen(token);
    memcpy(m.u.hello.token, token, m.u.hello.token_len);
  }
  it_raw_send(fd, EMBPS_KIND_HELLO, &m, req_id, NULL, 0);
  it_raw_reply_t r;
  it_raw_recv(fd, &r);
  if (r.h.kind != (EMBPS_KIND_HELLO | EMBPS_KIND_REPLY))
    fail_msg("hello refused: %s",
             r.h.kind == EMBPS_KIND_ERROR ? r.m.u.error.message : "?");
  assert_int_equal(r.h.req_id, req_id);
  assert_int_equal(r.m.u.hello_reply.version, EMBPS_PROTOCOL_VERSION);
  it_raw_reply_free(&r);
}

void it_raw_push(int fd, uint32_t req_id, const char *table, uint32_t n,
                 uint32_t dim, const void *bulk, size_t bulk_len) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  snprintf(m.u.push.table, sizeof m.u.push.table, "%s", table);
  m.u.push.n = n;
  m.u.push.dim = dim;
  it_raw_send(fd, EMBPS_KIND_PUSH, &m, req_id, bulk, bulk_len);
}

void it_raw_pull(int fd, uint32_t req_id, const char *table,
                 uint32_t n_ids, uint32_t dim, const int64_t *ids,
                 size_t n_sent) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  snprintf(m.u.pull.table, sizeof m.u.pull.table, "%s", table);
  m.u.pull.n_ids = n_ids;
  m.u.pull.dim = dim;
  it_raw_send(fd, EMBPS_KIND_PULL, &m, req_id, ids, n_sent * sizeof *ids);
}

void it_raw_pull_check(int fd, uint32_t req_id, const char *table,
                       const it_ref_t *ref, const int64_t *ids, size_t n) {
  it_raw_pull(fd, req_id, table, (uint32_t)n, ref->dim, ids, n);
  it_raw_reply_t r;
  it_raw_recv(fd, &r);
  if (r.h.kind != (EMBPS_KIND_PULL | EMBPS_KIND_REPLY))
    fail_msg("raw pull refused: %s",
             r.h.kind == EMBPS_KIND_ERROR ? r.m.u.error.message : "?");
  assert_int_equal(r.h.req_id, req_id);
  assert_int_equal(r.m.u.pull_reply.n_rows, n);
  size_t off = embps_bulk_offset(r.h.meta_len);
  assert_int_equal(r.h.body_len - off, n * ref->dim * sizeof(float));
  float *want = it_xmalloc(n * ref->dim * sizeof *want);
  it_ref_expect(ref, ids, n, want);
  assert_memory_equal(r.body + off, want, n * ref->dim * sizeof(float));
  free(want);
  it_raw_reply_free(&r);
}
