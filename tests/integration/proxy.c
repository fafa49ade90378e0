/* proxy.c - see proxy.h. Each proxied connection is a pair of sockets and
 * two threads; a thread copies one direction frame by frame (header, then
 * body in chunks) with blocking I/O, and ends the pair when its side
 * closes or a fault fires by shutting both sockets down, which wakes the
 * other thread. The thread that ends second closes the sockets, so a cut
 * never touches a descriptor number that was reused. */
#define _GNU_SOURCE /* accept4, pipe2 */
#include "proxy.h"
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"
#include "wire.h"

typedef struct pair {
  struct it_proxy *proxy;
  int cfd, sfd;
  uint32_t victim; /* DROP_REPLY: the request whose reply is not passed */
  int victim_set;
  int ended, closed;
  pthread_t up, down;
  struct pair *next;
} pair_t;

struct it_proxy {
  int lfd, wake[2];
  char addr[32];
  char upstream[64];
  pthread_t acceptor;
  pthread_mutex_t mu;
  pthread_cond_t released; /* hold_kind changed, or a pair ended */
  uint16_t hold_kind;      /* 0: none */
  int stopping;
  it_proxy_fault_t fault;
  uint16_t fault_kind;
  unsigned fault_nth, fault_seen;
  it_proxy_counts_t counts;
  pair_t *pairs;
};

static int read_full(int fd, void *buf, size_t n) {
  uint8_t *b = buf;
  while (n) {
    ssize_t r = read(fd, b, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

/* Copies n bytes from one socket to the other. */
static int copy_bytes(int from, int to, size_t n) {
  uint8_t chunk[64 << 10];
  while (n) {
    size_t want = n < sizeof chunk ? n : sizeof chunk;
    ssize_t r = read(from, chunk, want);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0 || it_send_full(to, chunk, (size_t)r))
      return -1;
    n -= (size_t)r;
  }
  return 0;
}

static void pair_end(pair_t *pr) {
  it_proxy_t *p = pr->proxy;
  pthread_mutex_lock(&p->mu);
  if (!pr->closed) {
    shutdown(pr->cfd, SHUT_RDWR);
    shutdown(pr->sfd, SHUT_RDWR);
  }
  pthread_cond_broadcast(&p->released);
  if (++pr->ended == 2) {
    close(pr->cfd);
    close(pr->sfd);
    pr->closed = 1;
  }
  pthread_mutex_unlock(&p->mu);
}

/* Client to server: counts requests and fires armed faults. */
static void *up_main(void *arg) {
  pair_t *pr = arg;
  it_proxy_t *p = pr->proxy;
  uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
  embps_frame_header_t h;
  while (!read_full(pr->cfd, hdr, sizeof hdr) &&
         !embps_frame_header_decode(hdr, UINT32_MAX, &h)) {
    it_proxy_fault_t fault = 0;
    pthread_mutex_lock(&p->mu);
    p->counts.requests[h.kind & 0xff]++;
    if (p->fault && h.kind == p->fault_kind &&
        ++p->fault_seen == p->fault_nth) {
      fault = p->fault;
      p->fault = 0;
      if (fault == IT_PROXY_DROP_REPLY) {
        pr->victim = h.req_id;
        pr->victim_set = 1;
      } else {
        p->counts.faults_fired++;
      }
      if (fault == IT_PROXY_DROP_REQUEST_THEN_DOWN) {
        snprintf(p->upstream, sizeof p->upstream, "127.0.0.1:1");
        fault = IT_PROXY_DROP_REQUEST;
      }
    }
    if (p->hold_kind && h.kind == p->hold_kind) {
      p->counts.held++;
      while (p->hold_kind == h.kind && !pr->ended)
        pthread_cond_wait(&p->released, &p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    size_t first = fault == IT_PROXY_DROP_REQUEST ? h.body_len / 2
                                                  : h.body_len;
    if (it_send_full(pr->sfd, hdr, sizeof hdr) ||
        copy_bytes(pr->cfd, pr->sfd, first) ||
        fault == IT_PROXY_DROP_REQUEST ||
        copy_bytes(pr->cfd, pr->sfd, h.body_len - first))
      break;
  }
  pair_end(pr);
  return NULL;
}

/* Server to client: counts push replies, drops the victim's reply. */
static void *down_main(void *arg) {
  pair_t *pr = arg;
  it_proxy_t *p = pr->proxy;
  uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
  embps_frame_header_t h;
  while (!read_full(pr->sfd, hdr, sizeof hdr) &&
         !embps_frame_header_decode(hdr, UINT32_MAX, &h)) {
    pthread_mutex_lock(&p->mu);
    int drop = pr->victim_set && h.req_id == pr->victim;
    if (drop) {
      pr->victim_set = 0;
      p->counts.faults_fired++;
    }
    pthread_mutex_unlock(&p->mu);
    if (drop)
      break;
    if (h.kind != (EMBPS_KIND_PUSH | EMBPS_KIND_REPLY)) {
      if (it_send_full(pr->cfd, hdr, sizeof hdr) ||
          copy_bytes(pr->sfd, pr->cfd, h.body_len))
        break;
      continue;
    }
    uint8_t *body = malloc(h.body_len ? h.body_len : 1);
    embps_msg_t m;
    if (!body || read_full(pr->sfd, body, h.body_len)) {
      free(body);
      break;
    }
    if (!embps_msg_unpack(h.kind, body, h.meta_len, &m)) {
      pthread_mutex_lock(&p->mu);
      p->counts.push_replies++;
      p->counts.push_duplicates += m.u.push_reply.duplicate != 0;
      pthread_mutex_unlock(&p->mu);
      embps_msg_free(&m);
    }
    int bad = it_send_full(pr->cfd, hdr, sizeof hdr) ||
              it_send_full(pr->cfd, body, h.body_len);
    free(body);
    if (bad)
      break;
  }
  pair_end(pr);
  return NULL;
}

static int connect_upstream(const char *upstream) {
  char host[64];
  int port = 0;
  const char *colon = strrchr(upstream, ':');
  if (!colon || (size_t)(colon - upstream) >= sizeof host)
    return -1;
  memcpy(host, upstream, (size_t)(colon - upstream));
  host[colon - upstream] = 0;
  port = atoi(colon + 1);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
    return -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/* Accepts connections; one that cannot reach the upstream is closed at
 * once (the client sees the server as down). */
static void *accept_main(void *arg) {
  it_proxy_t *p = arg;
  for (;;) {
    struct pollfd pfd[2] = {{.fd = p->lfd, .events = POLLIN},
                            {.fd = p->wake[0], .events = POLLIN}};
    if (poll(pfd, 2, -1) < 0 && errno != EINTR)
      break;
    if (pfd[1].revents)
      break;
    if (!(pfd[0].revents & POLLIN))
      continue;
    int cfd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (cfd < 0)
      continue;
    char upstream[64];
    pthread_mutex_lock(&p->mu);
    snprintf(upstream, sizeof upstream, "%s", p->upstream);
    p->counts.connections++;
    pthread_mutex_unlock(&p->mu);
    int one = 1;
    setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int sfd = connect_upstream(upstream);
    pair_t *pr = sfd >= 0 ? calloc(1, sizeof *pr) : NULL;
    if (!pr) {
      if (sfd >= 0)
        close(sfd);
      close(cfd);
      continue;
    }
    pr->proxy = p;
    pr->cfd = cfd;
    pr->sfd = sfd;
    pthread_mutex_lock(&p->mu);
    pr->next = p->pairs;
    p->pairs = pr;
    pthread_mutex_unlock(&p->mu);
    pthread_create(&pr->up, NULL, up_main, pr);
    pthread_create(&pr->down, NULL, down_main, pr);
  }
  return NULL;
}

int it_proxy_start(it_proxy_t **out, const char *upstream) {
  *out = NULL;
  it_proxy_t *p = calloc(1, sizeof *p);
  if (!p)
    return -1;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->released, NULL);
  snprintf(p->upstream, sizeof p->upstream, "%s", upstream);
  p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&a, sizeof a) ||
      listen(p->lfd, 64) ||
      getsockname(p->lfd, (struct sockaddr *)&a, &al) ||
      pipe2(p->wake, O_CLOEXEC)) {
    if (p->lfd >= 0)
      close(p->lfd);
    free(p);
    return -1;
  }
  snprintf(p->addr, sizeof p->addr, "127.0.0.1:%d", ntohs(a.sin_port));
  if (pthread_create(&p->acceptor, NULL, accept_main, p)) {
    close(p->lfd);
    close(p->wake[0]);
    close(p->wake[1]);
    free(p);
    return -1;
  }
  *out = p;
  return 0;
}

const char *it_proxy_addr(const it_proxy_t *p) { return p->addr; }

void it_proxy_set_upstream(it_proxy_t *p, const char *upstream) {
  pthread_mutex_lock(&p->mu);
  snprintf(p->upstream, sizeof p->upstream, "%s", upstream);
  pthread_mutex_unlock(&p->mu);
}

void it_proxy_arm(it_proxy_t *p, it_proxy_fault_t fault, uint16_t kind,
                  unsigned nth) {
  pthread_mutex_lock(&p->mu);
  p->fault = fault;
  p->fault_kind = kind;
  p->fault_nth = nth;
  p->fault_seen = 0;
  pthread_mutex_unlock(&p->mu);
}

void it_proxy_hold(it_proxy_t *p, uint16_t kind) {
  pthread_mutex_lock(&p->mu);
  p->hold_kind = kind;
  pthread_cond_broadcast(&p->released);
  pthread_mutex_unlock(&p->mu);
}

void it_proxy_cut(it_proxy_t *p) {
  pthread_mutex_lock(&p->mu);
  for (pair_t *pr = p->pairs; pr; pr = pr->next) {
    if (!pr->closed) {
      shutdown(pr->cfd, SHUT_RDWR);
      shutdown(pr->sfd, SHUT_RDWR);
    }
  }
  pthread_mutex_unlock(&p->mu);
}

void it_proxy_counts(it_proxy_t *p, it_proxy_counts_t *out) {
  pthread_mutex_lock(&p->mu);
  *out = p->counts;
  pthread_mutex_unlock(&p->mu);
}

void it_proxy_stop(it_proxy_t *p) {
  if (!p)
    return;
  if (write(p->wake[1], "x", 1) != 1) {
    /* the acceptor also ends when the listening socket is shut down */
    shutdown(p->lfd, SHUT_RDWR);
  }
  pthread_join(p->acceptor, NULL);
  it_proxy_cut(p);
  for (pair_t *pr = p->pairs, *next; pr; pr = next) {
    next = pr->next;
    pthread_join(pr->up, NULL);
    pthread_join(pr->down, NULL);
    free(pr);
  }
  close(p->lfd);
  close(p->wake[0]);
  close(p->wake[1]);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->released);
  free(p);
}
