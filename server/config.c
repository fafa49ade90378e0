/* config.c - embps-server's command line. No config file is ever needed:
 * every setting has a default that serves on 127.0.0.1:7070. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server.h"
#include "util.h"

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
    "  --auth-token-file FILE    require this token in every client's hello\n"
    "  --max-frame-bytes N       largest request frame (default 64M)\n"
    "  --max-connections N       concurrent connections (default 1024)\n"
    "  --max-tables N            tables per server (default 1024)\n"
    "  --idle-timeout SECONDS    close idle connections (default 0: never)\n"
    "  --max-memory BYTES        cap on table storage (default 0: none)\n"
    "  --log-level L             debug|info|warn|error (default info)\n"
    "  --log-format F            text|json: one line per event (default text)\n"
    "  --metrics-listen HOST:PORT  serve Prometheus /metrics, /healthz and\n"
    "                            /readyz over HTTP (default: off)\n"
    "  --metrics-port-file FILE  write the bound metrics port to FILE\n"
    "  --version, --help\n"
    "Sizes take K, M or G suffixes. The durability flags of the design\n"
    "(--data-dir, --fsync, --checkpoint-every) are not built yet and are\n"
    "refused.\n";

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

int embps_server_config_parse(embps_server_config_t *cfg, int argc,
                              char **argv, char *err, size_t err_len) {
  memset(cfg, 0, sizeof *cfg);
  snprintf(cfg->listen_host, sizeof cfg->listen_host, "127.0.0.1");
  cfg->listen_port = 7070;
  cfg->io_threads = 2;
  cfg->shards = 16;
  cfg->cluster_size = 1;
  cfg->max_frame_bytes = EMBPS_DEFAULT_MAX_FRAME;
  cfg->max_connections = 1024;
  cfg->max_tables = 1024;
  cfg->log_level = EMBPS_LOG_INFO;

  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return 1;
    }
    if (!strcmp(a, "--version")) {
      printf("embps-server %s (protocol %d)\n", EMBPS_VERSION_STRING,
             EMBPS_PROTOCOL_VERSION);
      return 1;
    }
    if (!strcmp(a, "--data-dir") || !strcmp(a, "--fsync") ||
        !strcmp(a, "--checkpoint-every"))
      return fail(err, err_len,
                  "%s: not available in this version of embps-server", a);
    if (strncmp(a, "--", 2) != 0)
      return fail(err, err_len, "unexpected argument \"%s\"", a);
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
#undef NUM_
    if (!strcmp(a, "--listen")) {
      if (embps_parse_hostport(v, cfg->listen_host, sizeof cfg->listen_host,
                               &cfg->listen_port))
        return fail(err, err_len, "--listen: \"%s\" is not HOST:PORT", v);
    } else if (!strcmp(a, "--port-file")) {
      snprintf(cfg->port_file, sizeof cfg->port_file, "%s", v);
    } else if (!strcmp(a, "--auth-token-file")) {
      char *data;
      size_t len;
      int rc = embps_read_file(v, &data, &len);
      if (rc)
        return fail(err, err_len, "--auth-token-file %s: %s", v,
                    strerror(-rc));
      while (len && (data[len - 1] == '\n' || data[len - 1] == '\r'))
        len--;
      if (len == 0 || len > EMBPS_TOKEN_MAX) {
        free(data);
        return fail(err, err_len, "--auth-token-file %s: token must be 1-%d "
                    "bytes", v, EMBPS_TOKEN_MAX);
      }
      memcpy(cfg->token, data, len);
      cfg->token_len = len;
      cfg->has_token = 1;
      free(data);
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
  if (cfg->cluster_index >= cfg->cluster_size)
    return fail(err, err_len, "--cluster-index %u must be below "
                "--cluster-size %u", cfg->cluster_index, cfg->cluster_size);
  return 0;
}
