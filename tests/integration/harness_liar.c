/* harness_liar.c - see harness_liar.h. */
#include "harness_liar.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "harness.h"

#define LIAR_MAX_FRAME (1u << 26)

int it_liar_reply(int fd, const embps_msg_t *m, uint32_t req_id,
                  const void *bulk, size_t bulk_len) {
  uint8_t *head;
  size_t len;
  if (embps_frame_build_head(m, req_id, bulk_len, &head, &len))
    return -1;
  int rc = it_send_full(fd, head, len);
  free(head);
  if (!rc && bulk_len)
    rc = it_send_full(fd, bulk, bulk_len);
  return rc;
}

int it_liar_error(int fd, uint32_t req_id, int code, const char *message) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_ERROR;
  m.u.error.code = code;
  snprintf(m.u.error.message, sizeof m.u.error.message, "%s", message);
  return it_liar_reply(fd, &m, req_id, NULL, 0);
}

/* The truthful answers: hello and DESCRIBE. 1 if h was one of them (0 or
 * -1 in *rc), 0 otherwise. */
static int answer_truth(int fd, const embps_frame_header_t *h,
                        const embps_msg_t *req,
                        const embps_table_spec_t *spec, int *rc) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  if (h->kind == EMBPS_KIND_HELLO) {
    m.kind = EMBPS_KIND_HELLO | EMBPS_KIND_REPLY;
    m.u.hello_reply.version = EMBPS_PROTOCOL_VERSION;
    m.u.hello_reply.cluster_size = 1;
    m.u.hello_reply.max_frame_bytes = LIAR_MAX_FRAME;
  } else if (h->kind == EMBPS_KIND_DESCRIBE &&
             !strcmp(req->u.name, spec->name)) {
    m.kind = EMBPS_KIND_DESCRIBE | EMBPS_KIND_REPLY;
    m.u.info.spec = *spec;
  } else {
    return 0;
  }
  *rc = it_liar_reply(fd, &m, h->req_id, NULL, 0);
  return 1;
}

static void serve(int lfd, const embps_table_spec_t *spec, it_liar_fn lie,
                  void *arg) {
  for (;;) {
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
      _exit(2);
    uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
    embps_frame_header_t h;
    uint8_t *body = NULL;
    while (!it_recv_full(fd, hdr, sizeof hdr, 60000) &&
           !embps_frame_header_decode(hdr, LIAR_MAX_FRAME, &h)) {
      free(body);
      body = malloc(h.body_len ? h.body_len : 1);
      if (!body || it_recv_full(fd, body, h.body_len, 60000))
        break;
      embps_msg_t m;
      if (embps_msg_unpack(h.kind, body, h.meta_len, &m))
        break;
      int rc;
      if (!answer_truth(fd, &h, &m, spec, &rc))
        rc = lie(fd, &h, &m, body + embps_bulk_offset(h.meta_len), arg);
      embps_msg_free(&m);
      if (rc)
        break;
    }
    free(body);
    close(fd);
  }
}

void it_liar_start(it_liar_t *l, const embps_table_spec_t *spec,
                   it_liar_fn lie, void *arg) {
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(lfd >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(lfd, 8), 0);
  assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    signal(SIGPIPE, SIG_IGN);
    serve(lfd, spec, lie, arg);
  }
  close(lfd);
  l->pid = pid;
  snprintf(l->addr, sizeof l->addr, "127.0.0.1:%d", ntohs(a.sin_port));
}

void it_liar_stop(it_liar_t *l) {
  if (l->pid <= 0)
    return;
  kill(l->pid, SIGKILL);
  int status;
  assert_int_equal(waitpid(l->pid, &status, 0), l->pid);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  l->pid = 0;
}
