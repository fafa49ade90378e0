/* test_inflight.c - requests in flight when a server stops or misbehaves
 * (integration.inflight): SIGTERM before a push is sent, while it is being
 * received and while the apply thread holds it: the ticket completes
 * (applied or a connection error, never a hang) and the server exits 0;
 * a server that replies before it has read the whole request fails the
 * connection instead of letting the push return while the client still
 * sends from the caller's arrays. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness_raw.h"

/* Bytes the process pid has read with read(2) and the like (rchar of
 * /proc/PID/io), or -1. */
static long long bytes_read_by(pid_t pid) {
  char path[64], line[128];
  snprintf(path, sizeof path, "/proc/%d/io", (int)pid);
  FILE *f = fopen(path, "r");
  long long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "rchar: %lld", &v) == 1)
      break;
  if (f)
    fclose(f);
  return v;
}

static embps_client_t *client_without_retries(const char *addr) {
  embps_client_options_t o;
  embps_client_options_init(&o);
  o.servers = addr;
  o.timeout_ms = IT_TIMEOUT_MS;
  o.retry_ms = -1; /* the server is not coming back: see the failure */
  embps_client_t *c = NULL;
  assert_int_equal(embps_client_create(&o, &c, NULL, 0), 0);
  return c;
}

/* Waits for ticket t of a push in flight when its server got SIGTERM: it
 * completes within 10 s with a code in ok[] (0: applied), and the server
 * exits 0. */
static void sigterm_outcome(it_fx_t *f, int slot, embps_client_t *c,
                            embps_ticket_t *t, const int *ok, int n_ok,
                            const char *when) {
  double t0 = it_now_ms();
  int rc = embps_wait(c, t);
  double waited = it_now_ms() - t0;
  int fine = 0;
  for (int i = 0; i < n_ok; i++)
    fine |= rc == ok[i];
  if (!fine)
    fail_msg("push in flight at SIGTERM %s: %s (%s) after %.0f ms", when,
             embps_err_name(rc), embps_client_last_error(c), waited);
  assert_true(waited < 10000);
  if (getenv("IT_VERBOSE"))
    fprintf(stderr, "  sigterm %s: push %s after %.1f ms\n", when,
            rc ? embps_err_name(rc) : "applied", waited);
  int code = it_server_wait(&f->srv[slot], 10000);
  if (code != 0)
    fail_msg("server exit status %d after SIGTERM %s (push result: %s)",
             code, when, embps_err_name(rc));
}

/* SIGTERM while a big push (40 MB) is on its way: before the client sends
 * a byte of it (the library sends only inside embps_wait), or once the
 * server has read 1 MiB of it (a forked killer watches what the server
 * read). The ticket completes (applied or a connection error, never a hang
 * or a timeout) and the server exits 0. */
static void sigterm_during_push(it_fx_t *f, int slot, int while_read) {
  embps_client_t *c = client_without_retries(f->srv[slot].addr);
  const uint32_t dim = 64;
  const size_t n = 150000;
  embps_table_spec_t s = it_spec("big", dim, n, EMBPS_OPT_SGD, 1,
                                 EMBPS_INIT_ZEROS, 0, 0);
  it_create(c, &s);
  int64_t *idx = it_xmalloc(n * sizeof *idx);
  float *v = it_xmalloc(n * dim * sizeof *v);
  for (size_t i = 0; i < n; i++)
    idx[i] = (int64_t)i;
  for (size_t i = 0; i < n * dim; i++)
    v[i] = 0.5f;
  /* a small push first, so the connection is in use */
  assert_rc(embps_push(c, "big", idx, 10, v, dim, 0), c);
  embps_ticket_t *t;
  assert_rc(embps_push_async(c, "big", idx, n, v, dim, 0, &t), c);
  pid_t server = f->srv[slot].pid;
  pid_t killer = -1;
  if (!while_read) {
    kill(server, SIGTERM); /* before a byte of the push is sent */
  } else {
    long long base = bytes_read_by(server);
    assert_true(base >= 0);
    killer = fork();
    assert_true(killer >= 0);
    if (killer == 0) {
      double end = it_now_ms() + 10000;
      while (bytes_read_by(server) < base + (1 << 20) && it_now_ms() < end)
        it_sleep_ms(1);
      int late = bytes_read_by(server) < base + (1 << 20);
      kill(server, SIGTERM);
      _exit(late);
    }
  }
  static const int ok[] = {0, EMBPS_ECONN, EMBPS_ESHUTDOWN};
  sigterm_outcome(f, slot, c, t, ok, 3,
                  while_read ? "while the push is read" : "before it is sent");
  if (killer > 0) {
    int st;
    assert_int_equal(waitpid(killer, &st, 0), killer);
    if (!WIFEXITED(st) || WEXITSTATUS(st))
      fail_msg("the server had not read 1 MiB of a 40 MB push within 10 s");
  }
  embps_client_destroy(c);
  free(idx);
  free(v);
}

/* SIGTERM while the apply thread holds a push: one of two workers pushed
 * for step 1 of a synchronous table. A push to another table sent after
 * it on the same connection is applied first, so the held one is at the
 * apply thread. The server fails the held push (EMBPS_ESHUTDOWN; the
 * connection may close first) and exits 0. */
static void sigterm_with_push_held(it_fx_t *f, int slot) {
  embps_client_t *c = client_without_retries(f->srv[slot].addr);
  embps_table_spec_t s = it_spec("sync", 4, 16, EMBPS_OPT_SGD, 1,
                                 EMBPS_INIT_ZEROS, 0, 0);
  s.sync_workers = 2;
  it_create(c, &s);
  embps_table_spec_t p = it_spec("plain", 4, 16, EMBPS_OPT_SGD, 1,
                                 EMBPS_INIT_ZEROS, 0, 0);
  it_create(c, &p);
  const int64_t ids[2] = {3, 9};
  const float g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  embps_ticket_t *held, *after;
  assert_rc(embps_push_step_async(c, "sync", ids, 2, g, 4, 0, 1, &held), c);
  assert_rc(embps_push_async(c, "plain", ids, 2, g, 4, 0, &after), c);
  assert_rc(embps_wait(c, after), c);
  kill(f->srv[slot].pid, SIGTERM);
  static const int ok[] = {EMBPS_ECONN, EMBPS_ESHUTDOWN};
  sigterm_outcome(f, slot, c, held, ok, 2, "with a push held");
  embps_client_destroy(c);
}

/* A fake server, forked: answers the hello, then replies to the next
 * request after reading only its header, and reads nothing more until it
 * is killed, so the client cannot finish sending that request. */
static void fake_early_replier(int lfd) {
  int fd = accept(lfd, NULL, NULL);
  if (fd < 0)
    _exit(2);
  uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
  embps_frame_header_t h;
  if (it_recv_full(fd, hdr, sizeof hdr, 10000) ||
      embps_frame_header_decode(hdr, 1u << 20, &h))
    _exit(3);
  uint8_t *body = malloc(h.body_len ? h.body_len : 1);
  if (!body || it_recv_full(fd, body, h.body_len, 10000))
    _exit(4);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.u.hello_reply.version = EMBPS_PROTOCOL_VERSION;
  m.u.hello_reply.cluster_size = 1;
  m.u.hello_reply.max_frame_bytes = 1u << 30;
  m.kind = EMBPS_KIND_HELLO | EMBPS_KIND_REPLY;
  uint8_t *frame;
  size_t len;
  if (embps_frame_build(&m, h.req_id, 0, &frame, &len, NULL) ||
      it_send_full(fd, frame, len))
    _exit(5);
  free(frame);
  if (it_recv_full(fd, hdr, sizeof hdr, 10000) ||
      embps_frame_header_decode(hdr, 1u << 30, &h))
    _exit(6);
  memset(&m, 0, sizeof m);
  m.kind = (uint16_t)(h.kind | EMBPS_KIND_REPLY);
  if (embps_frame_build(&m, h.req_id, 0, &frame, &len, NULL) ||
      it_send_full(fd, frame, len))
    _exit(7);
  free(frame);
  for (;;)
    pause();
}

/* A push goes out from the caller's arrays; a server that replies before
 * it has read the whole request must not let embps_push() return while
 * the client still has the rest of those arrays queued: the connection
 * fails with EMBPS_EPROTO instead. */
static void test_early_reply_fails_connection(void **state) {
  (void)state;
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  assert_true(lfd >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(lfd, 1), 0);
  socklen_t al = sizeof a;
  assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    fake_early_replier(lfd);
  close(lfd);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
  embps_client_t *c = it_client_ok(addr, NULL);
  /* 72 MB: far more than the socket buffers hold */
  enum { N = 2 << 20, DIM = 7 };
  int64_t *idx = it_xmalloc((size_t)N * sizeof *idx);
  float *vals = it_xmalloc((size_t)N * DIM * sizeof *vals);
  for (size_t i = 0; i < N; i++)
    idx[i] = (int64_t)i;
  for (size_t i = 0; i < (size_t)N * DIM; i++)
    vals[i] = 0.25f;
  int rc = embps_push(c, "t", idx, N, vals, DIM, 0);
  if (rc != EMBPS_EPROTO)
    fail_msg("push answered early: got %s: %s", embps_err_name(rc),
             embps_client_last_error(c));
  assert_non_null(strstr(embps_client_last_error(c), "before reading"));
  free(idx);
  free(vals);
  embps_client_destroy(c);
  /* the fake server got as far as its pause(), or it exited with the step
   * that failed */
  int status;
  assert_int_equal(waitpid(pid, &status, WNOHANG), 0);
  kill(pid, SIGKILL);
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status));
}

static void test_sigterm_in_flight(void **state) {
  it_fx_t *f = *state;
  embps_client_destroy(f->c);
  f->c = NULL;
  sigterm_during_push(f, 0, 1);
  it_fx_start(f, 1, NULL);
  sigterm_during_push(f, 1, 0);
  it_fx_start(f, 2, NULL);
  sigterm_with_push_held(f, 2);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  unsetenv("EMBPS_SERVERS");
  unsetenv("EMBPS_TOKEN_FILE");
#define T(f) cmocka_unit_test_setup_teardown(f, it_fx_setup_one, it_fx_teardown)
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_early_reply_fails_connection),
      T(test_sigterm_in_flight),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
