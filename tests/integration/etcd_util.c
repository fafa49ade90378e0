/* etcd_util.c - real etcd members for the tests (etcd_util.h). Ports are
 * found by binding port 0 and releasing it; a member that could not bind
 * (another process took the port meanwhile) is started again on new
 * ports. Health is /health over libcurl. */
#include "etcd_util.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#ifndef EMBPS_ETCD_BIN
#error "define EMBPS_ETCD_BIN as the path of etcd"
#endif

int it_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
      !getsockname(fd, (struct sockaddr *)&a, &len))
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

void it_etcd_dump_log(const it_etcd_t *m) {
  FILE *f = fopen(m->log_file, "r");
  if (!f)
    return;
  fprintf(stderr, "---- etcd %s log (%s) ----\n", m->name, m->log_file);
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f) && n++ < 60)
    fputs(line, stderr);
  fclose(f);
}

static size_t sink(char *p, size_t size, size_t n, void *ud) {
  char *buf = ud;
  size_t len = strlen(buf), k = size * n;
  if (len + k < 256) {
    memcpy(buf + len, p, k);
    buf[len + k] = 0;
  }
  return k;
}

int it_etcd_wait_healthy(const it_etcd_t *m, int timeout_ms) {
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/health", m->client_port);
  const double end = it_now_ms() + timeout_ms;
  CURL *c = curl_easy_init();
  int ok = 0;
  while (c && !ok && it_now_ms() < end) {
    char body[256] = "";
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, body);
    if (curl_easy_perform(c) == CURLE_OK && strstr(body, "\"health\":\"true\""))
      ok = 1;
    else if (m->pid && waitpid(m->pid, NULL, WNOHANG) == m->pid)
      break; /* it exited */
    else
      it_sleep_ms(50);
  }
  if (c)
    curl_easy_cleanup(c);
  return ok ? 0 : -1;
}

static int spawn(it_etcd_t *m) {
  char data[300], client[64], peer[64];
  snprintf(data, sizeof data, "%s/data", m->dir);
  snprintf(client, sizeof client, "http://127.0.0.1:%d", m->client_port);
  snprintf(peer, sizeof peer, "http://127.0.0.1:%d", m->peer_port);
  const char *argv[] = {EMBPS_ETCD_BIN, "--name", m->name, "--data-dir", data,
                        "--listen-client-urls", client,
                        "--advertise-client-urls", client,
                        "--listen-peer-urls", peer,
                        "--initial-advertise-peer-urls", peer,
                        "--initial-cluster", m->cluster,
                        "--initial-cluster-state", "new",
                        "--initial-cluster-token", m->token,
                        "--logger", "zap", "--log-level", "warn", NULL};
  if (access(EMBPS_ETCD_BIN, X_OK)) {
    fprintf(stderr, "[etcd] %s: %s (scripts/install-deps.sh installs "
            "etcd-server)\n", EMBPS_ETCD_BIN, strerror(errno));
    return -1;
  }
  m->pid = it_spawn(argv, m->log_file, NULL);
  return m->pid > 0 ? 0 : -1;
}

void it_etcd_kill(it_etcd_t *m) {
  if (!m->pid)
    return;
  kill(m->pid, SIGKILL);
  waitpid(m->pid, NULL, 0);
  m->pid = 0;
}

static void remove_tree(const char *dir) {
  if (!dir[0])
    return;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    fprintf(stderr, "[etcd] could not remove %s\n", dir);
}

void it_etcd_destroy(it_etcd_t *m, int n) {
  for (int i = 0; i < n; i++) {
    it_etcd_kill(&m[i]);
    remove_tree(m[i].dir);
    m[i].dir[0] = 0;
  }
}

int it_etcd_restart(it_etcd_t *m, int wait) {
  if (m->pid)
    return 0;
  if (spawn(m))
    return -1;
  if (wait && it_etcd_wait_healthy(m, 30000)) {
    fprintf(stderr, "[etcd] %s did not come back\n", m->name);
    it_etcd_dump_log(m);
    return -1;
  }
  return 0;
}

int it_etcd_start(it_etcd_t *m, int n, char *url, size_t cap) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  memset(m, 0, (size_t)n * sizeof *m);
  for (int attempt = 0; attempt < 3; attempt++) {
    char cluster[1024] = "";
    size_t len = 0, ulen = 0;
    for (int i = 0; i < n; i++) {
      if (!m[i].dir[0]) {
        snprintf(m[i].dir, sizeof m[i].dir, "/tmp/embps-etcd-XXXXXX");
        if (!mkdtemp(m[i].dir)) {
          perror("[etcd] mkdtemp");
          m[i].dir[0] = 0;
          it_etcd_destroy(m, n);
          return -1;
        }
      }
      snprintf(m[i].name, sizeof m[i].name, "m%d", i);
      snprintf(m[i].log_file, sizeof m[i].log_file, "%s/etcd.log", m[i].dir);
      m[i].client_port = it_free_port();
      m[i].peer_port = it_free_port();
      snprintf(m[i].url, sizeof m[i].url, "etcd://127.0.0.1:%d",
               m[i].client_port);
      len += (size_t)snprintf(cluster + len, sizeof cluster - len,
                              "%sm%d=http://127.0.0.1:%d", i ? "," : "", i,
                              m[i].peer_port);
      ulen += (size_t)snprintf(url + ulen, cap - ulen, "%s127.0.0.1:%d",
                               i ? "," : "etcd://", m[i].client_port);
    }
    int ok = 1;
    for (int i = 0; i < n; i++) {
      snprintf(m[i].cluster, sizeof m[i].cluster, "%s", cluster);
      snprintf(m[i].token, sizeof m[i].token, "%s", m[0].dir);
      char cmd[400];
      snprintf(cmd, sizeof cmd, "rm -rf '%s/data'", m[i].dir);
      if (system(cmd) != 0 || spawn(&m[i]))
        ok = 0;
    }
    for (int i = 0; ok && i < n; i++)
      if (it_etcd_wait_healthy(&m[i], 30000))
        ok = 0;
    if (ok)
      return 0;
    for (int i = 0; i < n; i++) {
      it_etcd_dump_log(&m[i]);
      it_etcd_kill(&m[i]);
    }
    fprintf(stderr, "[etcd] start failed (attempt %d): new ports\n",
            attempt + 1);
  }
  it_etcd_destroy(m, n);
  return -1;
}
