/* harness.h - helpers for the integration tests: start real embps-server
 * processes (EMBPS_SERVER_BIN, a compile-time path) on 127.0.0.1 port 0,
 * learn their port from --port-file, stop them with SIGTERM (reporting the
 * exit status) or kill -9, and run the embps CLI (EMBPS_CLI_BIN) capturing
 * its stdout, stderr and exit code. Each server gets a private temporary
 * directory holding its port file and its log (stderr), which is printed
 * when a start fails or on request. */
#ifndef EMBPS_TEST_HARNESS_H
#define EMBPS_TEST_HARNESS_H
#include <stddef.h>
#include <sys/types.h>

#ifndef EMBPS_SERVER_BIN
#error "define EMBPS_SERVER_BIN as the path of embps-server"
#endif
#ifndef EMBPS_CLI_BIN
#error "define EMBPS_CLI_BIN as the path of the embps CLI"
#endif

typedef struct {
  pid_t pid;         /* 0 when not running */
  int port;
  char addr[32];     /* "127.0.0.1:PORT" */
  char dir[256];     /* private temporary directory */
  char port_file[300];
  char log_file[300];
} it_server_t;

/* Starts embps-server with `--listen 127.0.0.1:0 --port-file F` followed by
 * extra_args (NULL-terminated; may be NULL) and waits up to 10 s for the port
 * file. Returns 0, or -1 (the server's log is printed to stderr and nothing
 * is left running). */
int it_server_start(it_server_t *s, const char *const *extra_args);

/* Sends SIGTERM and waits up to 10 s. Returns the exit code (0..255),
 * 128 + signal if a signal ended it, or -1 if it had to be killed after the
 * timeout (or was not running). Removes the temporary directory. */
int it_server_stop(it_server_t *s);

/* kill -9 and reap; removes the temporary directory. */
void it_server_kill(it_server_t *s);

/* Prints the server's log to stderr (for diagnosing a failure). */
void it_server_dump_log(const it_server_t *s);

/* Waits up to timeout_ms for the server to exit by itself; returns its
 * status as it_server_stop() does, or -1 if still running. */
int it_server_wait(it_server_t *s, int timeout_ms);

typedef struct {
  int status;   /* exit code, 128 + signal, or -1 if it could not run */
  char *out;    /* stdout, NUL-terminated (malloc'd) */
  size_t out_len;
  char *err;    /* stderr, NUL-terminated (malloc'd) */
  size_t err_len;
} it_cli_result_t;

/* Runs EMBPS_CLI_BIN with args (NULL-terminated, without argv[0]), stdin
 * from /dev/null, with a 30 s limit (then killed: status 128+9).
 * Returns r->status. Free with it_cli_result_free(). */
int it_cli_run(it_cli_result_t *r, const char *const *args);
void it_cli_result_free(it_cli_result_t *r);

/* Monotonic milliseconds. */
double it_now_ms(void);
void it_sleep_ms(double ms);
/* A waitpid status as an exit code, 128 + signal, or -1. */
int it_status_code(int wait_status);
/* The port in a --port-file, or -1 (missing, partial, out of range). */
int it_read_port(const char *path);
/* Waits up to timeout_ms for child pid to write its --port-file: 1 (the
 * port in *port), 0 (it exited: its status in *code) or -1 (timed out: it
 * was killed and reaped). */
int it_wait_port(pid_t pid, const char *port_file, int timeout_ms,
                 int *port, int *code);
/* Waits up to timeout_ms for child pid to exit: 1 (its status in *code, as
 * it_status_code), 0 (still running) or -1 (no such child). */
int it_wait_exit(pid_t pid, int timeout_ms, int *code);
/* Prints to stderr the stacks of every thread of pid, with their locals
 * (gdb, when installed), as `who`: what a hung child was waiting for. */
void it_dump_stacks(pid_t pid, const char *who);
/* Forks and execs argv (argv[0] the program's path): stdin from
 * /dev/null, stdout and stderr to log_file (truncated), default signal
 * handling, and death with this process (PR_SET_PDEATHSIG). env, when not
 * NULL, is applied to the child's environment in order: "NAME=VALUE" sets
 * a variable, a bare "NAME" removes it. stdio is flushed first. Returns the
 * child's pid, or -1 if fork failed. */
pid_t it_spawn(const char *const *argv, const char *log_file,
               const char *const *env);
/* In a freshly forked child: default signal handling, nothing blocked. */
void it_child_reset_signals(void);

/* Reads exactly n bytes from the socket fd within timeout_ms: returns 0,
 * 1 on EOF or reset, -1 on timeout. */
int it_recv_full(int fd, void *p, size_t n, int timeout_ms);
/* Writes all n bytes to the socket fd (no SIGPIPE): 0, or -1 once the peer
 * is gone. */
int it_send_full(int fd, const void *p, size_t n);
/* GET path from an HTTP server at ip:port (IPv4), the whole exchange
 * within timeout_ms: the status code (the body, cut to body_cap, in
 * body), or -1 when no whole answer came in time. */
int it_http_get(const char *ip, int port, const char *path, int timeout_ms,
                char *body, size_t body_cap);
/* The same with more header lines (each ending in "\r\n"; may be NULL). */
int it_http_request(const char *ip, int port, const char *path,
                    const char *headers, int timeout_ms, char *body,
                    size_t body_cap);
#endif
