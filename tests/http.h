/* http.h - a GET over loopback for the tests that read a server's
 * /metrics, /healthz or /readyz (header-only, like rng.h). */
#ifndef EMBPS_TEST_HTTP_H
#define EMBPS_TEST_HTTP_H
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* GET http://127.0.0.1:port/path (HTTP/1.0, 10 s at most): the status code
 * with the body (malloc'd, NUL-terminated) in *body, or -1 with *body
 * NULL when the server cannot be asked. */
static inline int test_http_get(int port, const char *path, char **body) {
  *body = NULL;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char req[512];
  int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\n\r\n", path);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) ||
      write(fd, req, (size_t)n) != n) {
    close(fd);
    return -1;
  }
  size_t len = 0, cap = 65536;
  char *buf = malloc(cap);
  for (ssize_t k; buf && (k = read(fd, buf + len, cap - len - 1)) > 0;) {
    len += (size_t)k;
    if (cap - len < 4096) {
      char *more = realloc(buf, cap *= 2);
      if (!more)
        free(buf);
      buf = more;
    }
  }
  close(fd);
  if (!buf)
    return -1;
  buf[len] = 0;
  int status = -1;
  char *start = strstr(buf, "\r\n\r\n");
  if (sscanf(buf, "HTTP/%*s %d", &status) != 1 || !start) {
    free(buf);
    return -1;
  }
  *body = strdup(start + 4);
  free(buf);
  return *body ? status : -1;
}
#endif
