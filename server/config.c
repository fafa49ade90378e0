/* config.c - embps-server's command line. No config file is ever needed:
 * every setting has a default that serves on 127.0.0.1:7070. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "about.h"
#include "cluster.h"
#include "server.h"
#include "token.h"
#include "util.h"
#include "wal.h"

static const char usage[] =
    "usage: embps-server [options]\n"
    "  --listen HOST:PORT        address to serve (default 127.0.0.1:7070;\n"
    "                            port 0 picks a free port)\n"
    "  --port-file FILE          write the bound port to FILE once listening\n"
    "  --io-threads N            I/O event loops (default 2)\n"
    "  --shards N                row shards per table (default 16)\n"
    "  --omp-threads N           threads applying a push (default: cores/2)\n"
    "  --cluster-size K          servers in the cluster (default 1)\n"
    "  --cluster-index I         this server's slot, 0..K-1 (default 0)\n"
  "  --cluster-servers H:P,... every server in cluster order (the clients'\n"
  "                            list): /readyz waits until this server holds\n"
  "                            every table the others hold\n"
  "  --complete-tables         with --cluster-servers: create such missing\n"
  "                            tables here from a peer's spec (fresh rows)\n"
    "  --auth-token-file FILE    require this token in every client's hello\n"
    "                            (FILE: 0600, or 0440 owned by root with a\n"
    "                            group of the server: a Kubernetes Secret)\n"
    "  --insecure                allow a non-loopback --listen without a token\n"
    "  --max-frame-bytes N       largest request frame (default 64M)\n"
    "  --max-connections N       concurrent connections (default 1024)\n"
    "  --max-tables N            tables per server (default 1024)\n"
    "  --idle-timeout SECONDS    close idle connections (default 600; 0: never)\n"
    "  --hello-timeout SECONDS   close connections with no hello by then\n"
    "                            (default 5)\n"
    "  --max-conn-buffer-bytes N requests and unsent replies one connection\n"
    "                            may hold (default 2 x --max-frame-bytes)\n"
    "  --max-buffer-bytes N      the same for all connections together\n"
    "                            (default a quarter of RAM, at least 1G)\n"
    "  --max-memory BYTES        cap on table storage (default 0: none)\n"
    "  --log-level L             debug|info|warn|error (default info)\n"
    "  --data-dir DIR            keep tables in DIR: checkpoints and a log\n"
    "                            (default: memory only)\n"
    "  --fsync MODE              always|everysec|never (default everysec)\n"
    "  --checkpoint-every SECONDS  periodic checkpoints (default 0: on\n"
    "                            demand and at SIGTERM only)\n"
    "  --log-format F            text|json: one line per event (default text)\n"
    "  --metrics-listen HOST:PORT  serve Prometheus /metrics, /healthz and\n"
    "                            /readyz over HTTP (default: off)\n"
    "  --metrics-port-file FILE  write the bound metrics port to FILE\n"
    "  --version, --help\n"
    "Sizes take K, M or G suffixes.\n";

static int fail(char *err, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
  return -1;
}

/* Parses an unsigned number with an optional K/M/G suffix. */
static int parse_size(const char *s, uint64_t max, uint64_t *out) {
  char *end;
  errno = 0;
  if (*s == '-')
    return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s)
    return -1;
  uint64_t mult = 1;
  if (*end == 'K' || *end == 'k')
    mult = 1ULL << 10;
  else if (*end == 'M' || *end == 'm')
    mult = 1ULL << 20;
  else if (*end == 'G' || *end == 'g')
    mult = 1ULL << 30;
  if (mult != 1)
    end++;
  if (*end || v > max / mult)
    return -1;
  *out = v * mult;
  return 0;
}

/* 1 if every address host resolves to is a loopback one. */
static int host_is_loopback(const char *host) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE};
  struct addrinfo *res;
  if (getaddrinfo(host, NULL, &hints, &res))
    return 0;
  int loopback = 1;
  for (struct addrinfo *a = res; a; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const struct sockaddr_in *in = (const struct sockaddr_in *)a->ai_addr;
      loopback &= (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const struct in6_addr *in6 =
          &((const struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
      loopback &= IN6_IS_ADDR_LOOPBACK(in6) ||
                  (IN6_IS_ADDR_V4MAPPED(in6) && in6->s6_addr[12] == 127);
    } else {
      loopback = 0;
    }
  }
  freeaddrinfo(res);
  return loopback;
}

/* Byte budgets left at 0 by the flags: a connection may hold two of the
 * largest frames; the server a quarter of RAM (at least 1 GiB, and at
 * least one connection's budget). */
static void default_budgets(embps_server_config_t *cfg) {
  if (!cfg->max_conn_buffer_bytes)
    cfg->max_conn_buffer_bytes = 2 * cfg->max_frame_bytes;
  if (!cfg->max_buffer_bytes) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page
                                         : 0;
    cfg->max_buffer_bytes = ram / 4 > (1ULL << 30) ? ram / 4 : 1ULL << 30;
  }
  if (cfg->max_buffer_bytes < cfg->max_conn_buffer_bytes)
    cfg->max_buffer_bytes = cfg->max_conn_buffer_bytes;
}

int embps_server_config_parse(embps_server_config_t *cfg, int argc,
                              char **argv, char *err, size_t err_len) {
  memset(cfg, 0, sizeof *cfg);
  snprintf(cfg->listen_host, sizeof cfg->listen_host, "127.0.0.1");
  cfg->listen_port = 7070;
  cfg->io_threads = 2;
  cfg->shards = 16;
  cfg->max_frame_bytes = EMBPS_DEFAULT_MAX_FRAME;
  cfg->max_connections = 1024;
  cfg->max_tables = 1024;
  cfg->log_level = EMBPS_LOG_INFO;
  cfg->fsync = EMBPS_FSYNC_EVERYSEC;
  cfg->hello_timeout_s = 5;
  cfg->idle_timeout_s = 600; /* idle workers reconnect on their next call */

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return 1;
    }
    if (!strcmp(a, "--version")) {
      embps_server_version_print(stdout);
      return 1;
    }
    if (strncmp(a, "--", 2) != 0)
      return fail(err, err_len, "unexpected argument \"%s\"", a);
    if (!strcmp(a, "--insecure")) {
      cfg->insecure = 1;
      continue;
    }
    if (!strcmp(a, "--complete-tables")) {
      cfg->complete_tables = 1;
      continue;
    }
    if (i + 1 >= argc)
      return fail(err, err_len, "%s needs a value", a);
    const char *v = argv[++i];
    uint64_t n;
#define NUM_(flag, lo, hi, field)                                              \
  if (!strcmp(a, flag)) {                                                      \
    if (parse_size(v, hi, &n) || n + 1 < (uint64_t)(lo) + 1)                   \
      return fail(err, err_len, "%s: \"%s\" is not a number in [%llu, %llu]",  \
                  a, v, (unsigned long long)(lo), (unsigned long long)(hi));   \
    cfg->field = n;                                                            \
    continue;                                                                  \
  }
    NUM_("--io-threads", 1, 64, io_threads)
    NUM_("--shards", 1, 4096, shards)
    NUM_("--omp-threads", 1, 1024, omp_threads)
    NUM_("--cluster-size", 1, 65536, cluster_size)
    NUM_("--cluster-index", 0, 65535, cluster_index)
    NUM_("--max-frame-bytes", 1024, 1ULL << 31, max_frame_bytes)
    NUM_("--max-connections", 1, 1000000, max_connections)
    NUM_("--max-tables", 1, 1000000, max_tables)
    NUM_("--idle-timeout", 0, 86400 * 365, idle_timeout_s)
    NUM_("--max-memory", 0, UINT64_MAX, max_memory)
    NUM_("--checkpoint-every", 0, 86400 * 365, checkpoint_every_s)
    NUM_("--hello-timeout", 1, 3600, hello_timeout_s)
    NUM_("--max-buffer-bytes", 1ULL << 20, UINT64_MAX, max_buffer_bytes)
    NUM_("--max-conn-buffer-bytes", 1ULL << 16, UINT64_MAX,
         max_conn_buffer_bytes)
#undef NUM_
    if (!strcmp(a, "--listen")) {
      if (embps_parse_hostport(v, cfg->listen_host, sizeof cfg->listen_host,
                               &cfg->listen_port))
        return fail(err, err_len, "--listen: \"%s\" is not HOST:PORT", v);
    } else if (!strcmp(a, "--data-dir")) {
      if (!*v || strlen(v) >= 900)
        return fail(err, err_len, "--data-dir: \"%s\" is empty or too long",
                    v);
      snprintf(cfg->data_dir, sizeof cfg->data_dir, "%s", v);
    } else if (!strcmp(a, "--fsync")) {
      if (!strcmp(v, "always"))
        cfg->fsync = EMBPS_FSYNC_ALWAYS;
      else if (!strcmp(v, "everysec"))
        cfg->fsync = EMBPS_FSYNC_EVERYSEC;
      else if (!strcmp(v, "never"))
        cfg->fsync = EMBPS_FSYNC_NEVER;
      else
        return fail(err, err_len, "--fsync: \"%s\" is not "
                    "always|everysec|never", v);
    } else if (!strcmp(a, "--port-file")) {
      snprintf(cfg->port_file, sizeof cfg->port_file, "%s", v);
    } else if (!strcmp(a, "--auth-token-file")) {
      if (embps_token_read(v, cfg->token, sizeof cfg->token, &cfg->token_len,
                           err, err_len))
        return -1;
      cfg->has_token = 1;
    } else if (!strcmp(a, "--cluster-servers")) {
      cfg->cluster_servers = v;
    } else if (!strcmp(a, "--metrics-listen")) {
      if (embps_parse_hostport(v, cfg->metrics_host, sizeof cfg->metrics_host,
                               &cfg->metrics_port))
        return fail(err, err_len, "--metrics-listen: \"%s\" is not "
                    "HOST:PORT", v);
    } else if (!strcmp(a, "--metrics-port-file")) {
      snprintf(cfg->metrics_port_file, sizeof cfg->metrics_port_file, "%s", v);
    } else if (!strcmp(a, "--log-format")) {
      if (strcmp(v, "text") && strcmp(v, "json"))
        return fail(err, err_len, "--log-format: \"%s\" is not text|json", v);
      cfg->log_json = !strcmp(v, "json");
    } else if (!strcmp(a, "--log-level")) {
      if (embps_log_parse_level(v, &cfg->log_level))
        return fail(err, err_len, "--log-level: \"%s\" is not "
                    "debug|info|warn|error", v);
    } else {
      return fail(err, err_len, "unknown option %s (see --help)", a);
    }
  }
  if (embps_cluster_config_check(cfg, err, err_len))
    return -1;
  if (cfg->cluster_index >= cfg->cluster_size)
    return fail(err, err_len, "--cluster-index %u must be below "
                "--cluster-size %u", cfg->cluster_index, cfg->cluster_size);
  if (!cfg->has_token && !cfg->insecure && !host_is_loopback(cfg->listen_host))
    return fail(err, err_len, "--listen %s is not a loopback address and "
                "there is no --auth-token-file: anyone who can reach it "
                "could read, change and drop every table (give a token, or "
                "--insecure to serve anyway; README, Security)",
                cfg->listen_host);
  default_budgets(cfg);
  return 0;
}
