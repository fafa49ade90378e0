/* harness.c - see harness.h. Servers are forked and exec'd with their
 * stdout and stderr in a log file; PR_SET_PDEATHSIG makes sure no server
 * outlives a test program that crashes. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ; /* it_spawn builds a child's from it */

#define MAX_ARGS 64

double it_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int it_recv_full(int fd, void *p, size_t n, int timeout_ms) {
  char *b = p;
  double deadline = it_now_ms() + timeout_ms;
  while (n) {
    int left = (int)(deadline - it_now_ms());
    if (left <= 0)
      return -1;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int pr = poll(&pfd, 1, left);
    if (pr == 0)
      return -1;
    if (pr < 0 && errno == EINTR)
      continue;
    ssize_t r = recv(fd, b, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (r <= 0)
      return 1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

int it_send_full(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

int it_http_get(const char *ip, int port, const char *path, int timeout_ms,
                char *body, size_t body_cap) {
  return it_http_request(ip, port, path, NULL, timeout_ms, body, body_cap);
}

int it_http_request(const char *ip, int port, const char *path,
                    const char *headers, int timeout_ms, char *body,
                    size_t body_cap) {
  if (body_cap)
    body[0] = 0;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port)};
  double deadline = it_now_ms() + timeout_ms;
  int status = -1;
  if (inet_pton(AF_INET, ip, &a.sin_addr) != 1 ||
      (connect(fd, (struct sockaddr *)&a, sizeof a) && errno != EINPROGRESS))
    goto out;
  struct pollfd pfd = {.fd = fd, .events = POLLOUT};
  int err = 0;
  socklen_t el = sizeof err;
  if (poll(&pfd, 1, timeout_ms) != 1 ||
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) || err)
    goto out;
  char req[1024];
  static _Thread_local char resp[1 << 16];
  int len = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: %s\r\n"
                     "%sConnection: close\r\n\r\n", path, ip,
                     headers ? headers : "");
  if (it_send_full(fd, req, (size_t)len))
    goto out;
  size_t got = 0;
  for (;;) { /* to the end: the server closes */
    int left = (int)(deadline - it_now_ms());
    pfd = (struct pollfd){.fd = fd, .events = POLLIN};
    if (left <= 0 || poll(&pfd, 1, left) != 1)
      goto out;
    ssize_t r = recv(fd, resp + got, sizeof resp - 1 - got, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (r <= 0 || (got += (size_t)r) == sizeof resp - 1)
      break;
  }
  resp[got] = 0;
  if (sscanf(resp, "HTTP/1.%*d %d", &status) != 1) {
    status = -1;
    goto out;
  }
  const char *b = strstr(resp, "\r\n\r\n");
  if (b && body_cap)
    snprintf(body, body_cap, "%s", b + 4);
out:
  close(fd);
  return status;
}

void it_sleep_ms(double ms) {
  long long ns = (long long)(ms * 1e6);
  struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000LL),
                        .tv_nsec = (long)(ns % 1000000000LL)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int it_status_code(int st) {
  if (WIFEXITED(st))
    return WEXITSTATUS(st);
  if (WIFSIGNALED(st))
    return 128 + WTERMSIG(st);
  return -1;
}

/* In a freshly forked child: default signal handling, nothing blocked, and
 * death with the parent. */
void it_child_reset_signals(void) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGINT, SIG_DFL);
  signal(SIGCHLD, SIG_DFL);
}

static void remove_dir(it_server_t *s) {
  if (!s->dir[0])
    return;
  unlink(s->port_file);
  unlink(s->log_file);
  rmdir(s->dir);
  s->dir[0] = 0;
}

void it_server_dump_log(const it_server_t *s) {
  FILE *f = fopen(s->log_file, "r");
  if (!f) {
    fprintf(stderr, "[harness] no log at %s\n", s->log_file);
    return;
  }
  fprintf(stderr, "[harness] ---- log of embps-server %s (pid %d) ----\n",
          s->addr[0] ? s->addr : "?", (int)s->pid);
  char line[1024];
  while (fgets(line, sizeof line, f))
    fprintf(stderr, "[server] %s", line);
  fprintf(stderr, "[harness] ---- end of log ----\n");
  fclose(f);
}

int it_read_port(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  int port = -1;
  if (fscanf(f, "%d", &port) != 1)
    port = -1;
  fclose(f);
  return port > 0 && port < 65536 ? port : -1;
}

/* The environment with env's changes applied (it_spawn's contract), in
 * one allocation; NULL when out of memory. Made in the parent: a child of
 * a process running threads calls nothing that may take a lock (an
 * allocator's) before its exec. */
static char **env_build(const char *const *env) {
  size_t n = 0, m = 0;
  while (environ[n])
    n++;
  while (env[m])
    m++;
  char **out = calloc(n + m + 1, sizeof *out);
  if (!out)
    return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int changed = 0;
    for (size_t j = 0; j < m && !changed; j++) {
      size_t len = strcspn(env[j], "=");
      changed = strncmp(environ[i], env[j], len) == 0 &&
                environ[i][len] == '=';
    }
    if (!changed)
      out[k++] = environ[i];
  }
  for (size_t j = 0; j < m; j++)
    if (strchr(env[j], '='))
      out[k++] = (char *)env[j];
  out[k] = NULL;
  return out;
}

/* In the child of it_spawn: stdio, then the exec with envp. */
static void exec_logged(const char *const *argv, const char *log_file,
                        char **envp) {
  int log = open(log_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int null = open("/dev/null", O_RDONLY);
  if (log < 0 || null < 0)
    _exit(127);
  dup2(null, 0);
  dup2(log, 1);
  dup2(log, 2);
  execve(argv[0], (char *const *)argv, envp);
  dprintf(2, "exec %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

pid_t it_spawn(const char *const *argv, const char *log_file,
               const char *const *env) {
  char **envp = env ? env_build(env) : environ;
  if (!envp) {
    fprintf(stderr, "[harness] spawn of %s: out of memory\n", argv[0]);
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(127);
    it_child_reset_signals();
    exec_logged(argv, log_file, envp);
  }
  if (pid < 0)
    fprintf(stderr, "[harness] fork: %s\n", strerror(errno));
  if (envp != environ)
    free(envp);
  return pid;
}

int it_server_start(it_server_t *s, const char *const *extra_args) {
  memset(s, 0, sizeof *s);
  snprintf(s->dir, sizeof s->dir, "/tmp/embps-it-XXXXXX");
  if (!mkdtemp(s->dir)) {
    fprintf(stderr, "[harness] mkdtemp: %s\n", strerror(errno));
    s->dir[0] = 0;
    return -1;
  }
  snprintf(s->port_file, sizeof s->port_file, "%s/port", s->dir);
  snprintf(s->log_file, sizeof s->log_file, "%s/server.log", s->dir);

  const char *argv[MAX_ARGS];
  int argc = 0;
  argv[argc++] = EMBPS_SERVER_BIN;
  argv[argc++] = "--listen";
  argv[argc++] = "127.0.0.1:0";
  argv[argc++] = "--port-file";
  argv[argc++] = s->port_file;
  for (size_t i = 0; extra_args && extra_args[i]; i++) {
    if (argc >= MAX_ARGS - 1) {
      fprintf(stderr, "[harness] too many server arguments\n");
      remove_dir(s);
      return -1;
    }
    argv[argc++] = extra_args[i];
  }
  argv[argc] = NULL;

  pid_t pid = it_spawn(argv, s->log_file, NULL);
  if (pid < 0) {
    remove_dir(s);
    return -1;
  }
  s->pid = pid;

  int code = -1;
  int r = it_wait_port(pid, s->port_file, 10000, &s->port, &code);
  if (r == 1) {
    snprintf(s->addr, sizeof s->addr, "127.0.0.1:%d", s->port);
    return 0;
  }
  if (r == 0)
    fprintf(stderr, "[harness] embps-server exited during start-up "
            "(status %d)\n", code);
  else
    fprintf(stderr, "[harness] no port file after 10 s\n");
  s->pid = 0;
  it_server_dump_log(s);
  remove_dir(s);
  return -1;
}

int it_wait_port(pid_t pid, const char *port_file, int timeout_ms,
                 int *port, int *code) {
  double deadline = it_now_ms() + timeout_ms;
  for (;;) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      *code = it_status_code(st);
      return 0;
    }
    int p = it_read_port(port_file);
    if (p > 0) {
      *port = p;
      return 1;
    }
    if (it_now_ms() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      return -1;
    }
    it_sleep_ms(2);
  }
}

int it_wait_exit(pid_t pid, int timeout_ms, int *code) {
  double deadline = it_now_ms() + timeout_ms;
  for (;;) {
    int st;
    pid_t w = waitpid(pid, &st, WNOHANG);
    if (w == pid) {
      *code = it_status_code(st);
      return 1;
    }
    if (w < 0 && errno != EINTR)
      return -1;
    if (it_now_ms() > deadline)
      return 0;
    it_sleep_ms(1);
  }
}

void it_dump_stacks(pid_t pid, const char *who) {
  if (access("/usr/bin/gdb", X_OK))
    return;
  char cmd[256];
  snprintf(cmd, sizeof cmd, "/usr/bin/gdb -p %d -batch -nx -q -ex "
           "'thread apply all bt full' </dev/null 1>&2 2>/dev/null",
           (int)pid);
  fprintf(stderr, "---- stacks of %s (pid %d) ----\n", who, (int)pid);
  fflush(stderr);
  if (system(cmd))
    fprintf(stderr, "(gdb could not attach)\n");
  fprintf(stderr, "---- end of stacks ----\n");
}

int it_server_wait(it_server_t *s, int timeout_ms) {
  if (!s->pid)
    return -1;
  int code = -1;
  int r = it_wait_exit(s->pid, timeout_ms, &code);
  if (r == 0)
    return -1;
  s->pid = 0;
  if (r > 0 && code != 0)
    it_server_dump_log(s);
  remove_dir(s);
  return code;
}

int it_server_stop(it_server_t *s) {
  if (!s->pid) {
    remove_dir(s);
    return -1;
  }
  kill(s->pid, SIGTERM);
  int code = it_server_wait(s, 10000);
  if (s->pid) { /* still running after 10 s */
    fprintf(stderr, "[harness] embps-server %s ignored SIGTERM for 10 s; "
            "killing it\n", s->addr);
    it_server_dump_log(s);
    it_server_kill(s);
    return -1;
  }
  return code;
}

void it_server_kill(it_server_t *s) {
  if (s->pid) {
    int st;
    kill(s->pid, SIGKILL);
    while (waitpid(s->pid, &st, 0) < 0 && errno == EINTR) {
    }
    s->pid = 0;
  }
  remove_dir(s);
}

/* ------------------------------------------------------------ CLI */

static int temp_file(char *path, size_t cap, const char *what) {
  snprintf(path, cap, "/tmp/embps-it-%s-XXXXXX", what);
  int fd = mkstemp(path);
  if (fd >= 0)
    fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
}

static char *slurp(int fd, size_t *len) {
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap + 1);
  if (!buf)
    return NULL;
  lseek(fd, 0, SEEK_SET);
  for (;;) {
    if (n == cap) {
      char *b = realloc(buf, 2 * cap + 1);
      if (!b)
        break;
      buf = b;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    n += (size_t)r;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

int it_cli_run(it_cli_result_t *r, const char *const *args) {
  memset(r, 0, sizeof *r);
  r->status = -1;
  char out_path[64], err_path[64];
  int out = temp_file(out_path, sizeof out_path, "out");
  int err = temp_file(err_path, sizeof err_path, "err");
  const char *argv[MAX_ARGS];
  int argc = 0;
  argv[argc++] = EMBPS_CLI_BIN;
  for (size_t i = 0; args && args[i] && argc < MAX_ARGS - 1; i++)
    argv[argc++] = args[i];
  argv[argc] = NULL;
  pid_t pid = out >= 0 && err >= 0 ? fork() : -1;
  if (pid == 0) {
    it_child_reset_signals();
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0)
      dup2(null, 0);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  if (pid > 0) {
    double deadline = it_now_ms() + 30000;
    int st;
    for (;;) {
      pid_t w = waitpid(pid, &st, WNOHANG);
      if (w == pid) {
        r->status = it_status_code(st);
        break;
      }
      if (w < 0 && errno != EINTR)
        break;
      if (it_now_ms() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        r->status = 128 + SIGKILL;
        break;
      }
      it_sleep_ms(1);
    }
  }
  if (out >= 0) {
    r->out = slurp(out, &r->out_len);
    close(out);
    unlink(out_path);
  }
  if (err >= 0) {
    r->err = slurp(err, &r->err_len);
    close(err);
    unlink(err_path);
  }
  if (!r->out)
    r->out = calloc(1, 1);
  if (!r->err)
    r->err = calloc(1, 1);
  return r->status;
}

void it_cli_result_free(it_cli_result_t *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}
