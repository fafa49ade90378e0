/* dropproxy.c - see dropproxy.h. */
#define _GNU_SOURCE
#include "dropproxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"
#include "wire.h"

typedef struct {
  uint8_t *data;
  size_t len, cap;
} buf_t;

struct dropproxy {
  int listen_fd, port, upstream_port;
  pthread_t thread;
  pthread_mutex_t mu;
  _Atomic int stop;
  int armed;          /* the next push frame is the target */
  int target_live;    /* a target push is on its way */
  uint32_t target_req;
  void (*hook)(void *);
  void *ctx;
  dropproxy_stats_t st;
};

static int buf_add(buf_t *b, const uint8_t *p, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 65536;
    while (cap < b->len + n)
      cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d)
      return -1;
    b->data = d;
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
  return 0;
}

static void buf_drop(buf_t *b, size_t n) {
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Length of the complete frame at the start of b, 0 if incomplete, -1 if
 * it does not parse. */
static long frame_len(const buf_t *b, embps_frame_header_t *h) {
  if (b->len < EMBPS_FRAME_HEADER_LEN)
    return 0;
  if (embps_frame_header_decode(b->data, 1u << 30, h))
    return -1;
  size_t total = EMBPS_FRAME_HEADER_LEN + (size_t)h->body_len;
  return b->len >= total ? (long)total : 0;
}

/* Client -> server frames: counts pushes, marks the target. */
static int from_client(dropproxy_t *p, buf_t *b, int sfd) {
  embps_frame_header_t h;
  long n;
  while ((n = frame_len(b, &h)) > 0) {
    pthread_mutex_lock(&p->mu);
    if (h.kind == EMBPS_KIND_PUSH) {
      p->st.pushes++;
      if (p->armed) {
        p->armed = 0;
        p->target_live = 1;
        p->target_req = h.req_id;
      }
    }
    pthread_mutex_unlock(&p->mu);
    if (write_all(sfd, b->data, (size_t)n))
      return -1;
    buf_drop(b, (size_t)n);
  }
  return n < 0 ? -1 : 0;
}

/* Server -> client frames. Returns 1 when the connection is to be cut. */
static int from_server(dropproxy_t *p, buf_t *b, int cfd) {
  embps_frame_header_t h;
  long n;
  while ((n = frame_len(b, &h)) > 0) {
    int is_push_reply = h.kind == (EMBPS_KIND_PUSH | EMBPS_KIND_REPLY);
    pthread_mutex_lock(&p->mu);
    int cut = p->target_live && h.req_id == p->target_req &&
              (is_push_reply || h.kind == EMBPS_KIND_ERROR);
    void (*hook)(void *) = p->hook;
    void *ctx = p->ctx;
    if (cut) {
      p->target_live = 0;
      p->st.dropped++;
    }
    pthread_mutex_unlock(&p->mu);
    if (cut) {
      if (hook)
        hook(ctx);
      return 1;
    }
    if (is_push_reply) {
      embps_msg_t m;
      int dup = 0;
      if (h.meta_len <= h.body_len &&
          !embps_msg_unpack(h.kind, b->data + EMBPS_FRAME_HEADER_LEN,
                            h.meta_len, &m)) {
        dup = m.u.push_reply.duplicate;
        embps_msg_free(&m);
      }
      pthread_mutex_lock(&p->mu);
      p->st.push_replies++;
      p->st.duplicates += dup != 0;
      pthread_mutex_unlock(&p->mu);
    }
    if (write_all(cfd, b->data, (size_t)n))
      return -1;
    buf_drop(b, (size_t)n);
  }
  return n < 0 ? -1 : 0;
}

static int connect_upstream(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
    return fd;
  if (fd >= 0)
    close(fd);
  return -1;
}

static void relay(dropproxy_t *p, int cfd, int sfd) {
  buf_t cb = {0}, sb = {0};
  uint8_t tmp[65536];
  while (!atomic_load(&p->stop)) {
    struct pollfd pf[2] = {{.fd = cfd, .events = POLLIN},
                           {.fd = sfd, .events = POLLIN}};
    int r = poll(pf, 2, 100);
    if (r < 0 && errno != EINTR)
      break;
    if (r <= 0)
      continue;
    if (pf[0].revents) {
      ssize_t k = recv(cfd, tmp, sizeof tmp, 0);
      if (k <= 0 || buf_add(&cb, tmp, (size_t)k) || from_client(p, &cb, sfd))
        break;
    }
    if (pf[1].revents) {
      ssize_t k = recv(sfd, tmp, sizeof tmp, 0);
      if (k <= 0 || buf_add(&sb, tmp, (size_t)k) || from_server(p, &sb, cfd))
        break;
    }
  }
  pthread_mutex_lock(&p->mu);
  p->target_live = 0; /* a target lost with its connection is not re-aimed */
  pthread_mutex_unlock(&p->mu);
  free(cb.data);
  free(sb.data);
}

static void *proxy_main(void *arg) {
  dropproxy_t *p = arg;
  while (!atomic_load(&p->stop)) {
    struct pollfd pf = {.fd = p->listen_fd, .events = POLLIN};
    if (poll(&pf, 1, 100) <= 0)
      continue;
    int cfd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (cfd < 0)
      continue;
    pthread_mutex_lock(&p->mu);
    p->st.connections++;
    pthread_mutex_unlock(&p->mu);
    int sfd = connect_upstream(p->upstream_port);
    if (sfd >= 0) {
      relay(p, cfd, sfd);
      close(sfd);
    }
    close(cfd);
  }
  return NULL;
}

dropproxy_t *dropproxy_start(const char *upstream) {
  const char *colon = strrchr(upstream, ':');
  dropproxy_t *p = calloc(1, sizeof *p);
  if (!p || !colon)
    goto fail;
  p->upstream_port = atoi(colon + 1);
  pthread_mutex_init(&p->mu, NULL);
  p->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (p->listen_fd < 0 || bind(p->listen_fd, (struct sockaddr *)&a, len) ||
      listen(p->listen_fd, 16) ||
      getsockname(p->listen_fd, (struct sockaddr *)&a, &len))
    goto fail;
  p->port = ntohs(a.sin_port);
  if (pthread_create(&p->thread, NULL, proxy_main, p))
    goto fail;
  return p;
fail:
  if (p && p->listen_fd > 0)
    close(p->listen_fd);
  free(p);
  return NULL;
}

int dropproxy_port(const dropproxy_t *p) { return p->port; }

void dropproxy_arm(dropproxy_t *p, void (*hook)(void *), void *ctx) {
  pthread_mutex_lock(&p->mu);
  p->armed = 1;
  p->hook = hook;
  p->ctx = ctx;
  pthread_mutex_unlock(&p->mu);
}

void dropproxy_stats(dropproxy_t *p, dropproxy_stats_t *out) {
  pthread_mutex_lock(&p->mu);
  *out = p->st;
  pthread_mutex_unlock(&p->mu);
}

void dropproxy_stop(dropproxy_t *p) {
  if (!p)
    return;
  atomic_store(&p->stop, 1);
  pthread_join(p->thread, NULL);
  close(p->listen_fd);
  pthread_mutex_destroy(&p->mu);
  free(p);
}
