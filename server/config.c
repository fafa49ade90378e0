/* config.c - embps-server's command line: one table of flags (flags.h:
 * parsed with getopt_long, printed by --help), then the checks that need
 * several of them. No config file is ever needed: every setting has a
 * default that serves on 127.0.0.1:7070. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "about.h"
#include "cgroup.h"
#include "cluster.h"
#include "feed.h"
#include "flags.h"
#include "server.h"
#include "space.h"
#include "token.h"
#include "util.h"
#include "wal.h"

/* The flags fill a configuration, and --help and --version the rest. */
typedef struct {
  embps_server_config_t cfg;
  int help, version;
} args_t;

static int set_listen(const embps_flag_t *f, const char *v, void *obj,
                      char *err, size_t err_len) {
  embps_server_config_t *cfg = obj;
  return embps_parse_hostport(v, cfg->listen_host, sizeof cfg->listen_host,
                              &cfg->listen_port)
             ? embps_flag_refuse(f, v, err, err_len)
             : 0;
}

static int set_metrics_listen(const embps_flag_t *f, const char *v, void *obj,
                              char *err, size_t err_len) {
  embps_server_config_t *cfg = obj;
  return embps_parse_hostport(v, cfg->metrics_host, sizeof cfg->metrics_host,
                              &cfg->metrics_port)
             ? embps_flag_refuse(f, v, err, err_len)
             : 0;
}

static int set_data_dir(const embps_flag_t *f, const char *v, void *obj,
                        char *err, size_t err_len) {
  embps_server_config_t *cfg = obj;
  if (!*v || strlen(v) >= 900)
    return embps_flag_refuse(f, v, err, err_len);
  snprintf(cfg->data_dir, sizeof cfg->data_dir, "%s", v);
  return 0;
}

static int set_fsync(const embps_flag_t *f, const char *v, void *obj,
                     char *err, size_t err_len) {
  static const struct {
    const char *name;
    int mode;
  } modes[] = {{"always", EMBPS_FSYNC_ALWAYS},
               {"everysec", EMBPS_FSYNC_EVERYSEC},
               {"never", EMBPS_FSYNC_NEVER}};
  for (size_t m = 0; m < sizeof modes / sizeof *modes; m++)
    if (!strcmp(v, modes[m].name)) {
      ((embps_server_config_t *)obj)->fsync = modes[m].mode;
      return 0;
    }
  return embps_flag_refuse(f, v, err, err_len);
}

static int set_log_format(const embps_flag_t *f, const char *v, void *obj,
                          char *err, size_t err_len) {
  if (strcmp(v, "text") && strcmp(v, "json"))
    return embps_flag_refuse(f, v, err, err_len);
  ((embps_server_config_t *)obj)->log_json = !strcmp(v, "json");
  return 0;
}

static int set_log_level(const embps_flag_t *f, const char *v, void *obj,
                         char *err, size_t err_len) {
  return embps_log_parse_level(v, &((embps_server_config_t *)obj)->log_level)
             ? embps_flag_refuse(f, v, err, err_len)
             : 0;
}

static int set_follow(const embps_flag_t *f, const char *v, void *obj,
                      char *err, size_t err_len) {
  embps_server_config_t *cfg = obj;
  char host[256];
  int port;
  if (embps_parse_hostport(v, host, sizeof host, &port) || !port ||
      strlen(v) >= sizeof cfg->follow)
    return embps_flag_refuse(f, v, err, err_len);
  snprintf(cfg->follow, sizeof cfg->follow, "%s", v);
  return 0;
}

static int set_coordinator(const embps_flag_t *f, const char *v, void *obj,
                           char *err, size_t err_len) {
  embps_server_config_t *cfg = obj;
  if (strncmp(v, "etcd://", 7) || !v[7] || strlen(v) >= sizeof cfg->coordinator)
    return embps_flag_refuse(f, v, err, err_len);
  snprintf(cfg->coordinator, sizeof cfg->coordinator, "%s", v);
  return 0;
}

static int set_cluster_name(const embps_flag_t *f, const char *v, void *obj,
                            char *err, size_t err_len) {
  embps_server_config_t *cfg = obj;
  size_t n = strlen(v);
  if (!n || n >= sizeof cfg->cluster_name ||
      strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                "0123456789-_.") != n)
    return embps_flag_refuse(f, v, err, err_len);
  snprintf(cfg->cluster_name, sizeof cfg->cluster_name, "%s", v);
  return 0;
}

static int set_member(const embps_flag_t *f, const char *v, void *obj,
                      char *err, size_t err_len) {
  embps_server_config_t *cfg = obj;
  char *end;
  errno = 0;
  unsigned long m = strtoul(v, &end, 10);
  if (errno || end == v || *end || v[0] == '-' || m >= 4096)
    return embps_flag_refuse(f, v, err, err_len);
  cfg->member = (uint32_t)m;
  cfg->member_given = 1;
  return 0;
}

static int set_advertise(const embps_flag_t *f, const char *v, void *obj,
                         char *err, size_t err_len) {
  embps_server_config_t *cfg = obj;
  char host[256];
  int port;
  if (embps_parse_hostport(v, host, sizeof host, &port) || !port ||
      strlen(v) >= sizeof cfg->advertise || strchr(v, '/'))
    return embps_flag_refuse(f, v, err, err_len);
  snprintf(cfg->advertise, sizeof cfg->advertise, "%s", v);
  return 0;
}

/* The tokens in FILE (token.c: one per line, the current one first; the
 * file's mode and owner checked). */
static int set_token(const embps_flag_t *f, const char *v, void *obj,
                     char *err, size_t err_len) {
  embps_server_config_t *cfg = obj;
  embps_tokens_t t;
  if (strlen(v) >= sizeof cfg->token_file)
    return embps_flag_refuse(f, v, err, err_len);
  if (embps_tokens_read(v, &t, err, err_len))
    return -1;
  embps_server_config_set_tokens(cfg, &t);
  snprintf(cfg->token_file, sizeof cfg->token_file, "%s", v);
  return 0;
}

void embps_server_config_set_tokens(embps_server_config_t *cfg,
                                    const embps_tokens_t *t) {
  memcpy(cfg->token, t->token[0], t->len[0]);
  cfg->token_len = t->len[0];
  cfg->token_next_len = t->n > 1 ? t->len[1] : 0;
  memcpy(cfg->token_next, t->token[1], cfg->token_next_len);
  cfg->has_token = t->n > 0;
}

void embps_server_config_tokens(const embps_server_config_t *cfg,
                                embps_tokens_t *t) {
  memset(t, 0, sizeof *t);
  if (!cfg->has_token)
    return;
  memcpy(t->token[0], cfg->token, cfg->token_len);
  t->len[0] = cfg->token_len;
  t->n = 1;
  if (cfg->token_next_len) {
    memcpy(t->token[1], cfg->token_next, cfg->token_next_len);
    t->len[1] = cfg->token_next_len;
    t->n = 2;
  }
}

/* The level in FILE (log.c), which a reload reads again. */
static int set_log_level_file(const embps_flag_t *f, const char *v,
                              void *obj, char *err, size_t err_len) {
  embps_server_config_t *cfg = obj;
  if (strlen(v) >= sizeof cfg->log_level_file)
    return embps_flag_refuse(f, v, err, err_len);
  if (embps_log_read_level(v, &cfg->log_level, err, err_len))
    return -1;
  snprintf(cfg->log_level_file, sizeof cfg->log_level_file, "%s", v);
  return 0;
}

/* auto, or a number of bytes (0: off). */
static int set_checkpoint_log(const embps_flag_t *f, const char *v,
                              void *obj, char *err, size_t err_len) {
  if (strcmp(v, "auto"))
    return embps_flag_set_size(f, v, obj, err, err_len);
  ((embps_server_config_t *)obj)->checkpoint_log_bytes =
      EMBPS_CHECKPOINT_LOG_AUTO;
  return 0;
}

#define CFG embps_server_config_t
/* a number with an optional K, M or G suffix, in [lo, hi] */
#define SIZE_(name, arg, field, lo, hi, help)                                  \
  EMBPS_FLAG_NUMBER(name, arg, embps_flag_set_size, CFG, field, lo, hi, NULL,  \
                    help)
/* a flag whose setter above knows its fields */
#define SET_(name, arg, set, what, help)                                       \
  { name, arg, help, set, 0, 0, 0, 0, 0, what }

/* Every flag of embps-server, in the order --help lists them. */
static const embps_flag_t server_flags[] = {
    SET_("listen", "HOST:PORT", set_listen, "HOST:PORT",
         "address to serve (default 127.0.0.1:7070; port 0 picks a free "
         "port)"),
    EMBPS_FLAG_TEXT("port-file", "FILE", CFG, port_file,
                    "write the bound port to FILE once listening"),
    SIZE_("io-threads", "N", io_threads, 1, 64, "I/O event loops (default 2)"),
    SIZE_("shards", "N", shards, 1, 4096, "row shards per table (default 16)"),
    SIZE_("omp-threads", "N", omp_threads, 1, 1024,
          "threads applying a push (default: $OMP_NUM_THREADS, else half "
          "the cores)"),
    SIZE_("cluster-size", "K", cluster_size, 1, 65536,
          "servers in the cluster (default 1)"),
    SIZE_("cluster-index", "I", cluster_index, 0, 65535,
          "this server's slot, 0..K-1 (default 0)"),
    EMBPS_FLAG_STRING("cluster-servers", "H:P,...", CFG, cluster_servers,
                      "every server in cluster order (the clients' list): "
                      "/readyz waits until this server holds every table "
                      "the others hold"),
    EMBPS_FLAG_TRUE("complete-tables", CFG, complete_tables,
                    "with --cluster-servers: create such missing tables "
                    "here from a peer's spec (fresh rows)"),
    SET_("auth-token-file", "FILE", set_token, "a path of 1-1023 bytes",
         "require the token in FILE in every client's hello: its first line, "
         "or a second one during a rotation; read again at SIGHUP (FILE: "
         "0600, or 0440 owned by root with a group of the server: a "
         "Kubernetes Secret)"),
    EMBPS_FLAG_TRUE("insecure", CFG, insecure,
                    "allow a non-loopback --listen without a token"),
    SIZE_("max-frame-bytes", "N", max_frame_bytes, 1024, 1ULL << 31,
          "largest request frame (default 64M)"),
    SIZE_("max-connections", "N", max_connections, 1, 1000000,
          "concurrent connections (default 1024)"),
    SIZE_("max-tables", "N", max_tables, 1, 1000000,
          "tables per server (default 1024)"),
    SIZE_("idle-timeout", "SECONDS", idle_timeout_s, 0, 86400 * 365,
          "close idle connections (default 600; 0: never)"),
    SIZE_("hello-timeout", "SECONDS", hello_timeout_s, 1, 3600,
          "close connections with no hello by then (default 5)"),
    SIZE_("stall-timeout", "SECONDS", stall_timeout_s, 0, 86400,
          "/healthz fails once the apply or an I/O thread has had work in "
          "hand this long without progress (default 60; 0: never)"),
    SIZE_("max-conn-buffer-bytes", "N", max_conn_buffer_bytes, 1ULL << 16,
          UINT64_MAX,
          "requests and unsent replies one connection may hold (default "
          "2 x --max-frame-bytes)"),
    SIZE_("max-buffer-bytes", "N", max_buffer_bytes, 1ULL << 20, UINT64_MAX,
          "the same for all connections together (default a quarter of "
          "the cgroup's memory limit, else of RAM and at least 1G)"),
    SIZE_("max-memory", "BYTES", max_memory, 0, UINT64_MAX,
          "cap on table storage (default 0: none)"),
    SET_("log-level", "L", set_log_level, "debug|info|warn|error",
         "debug|info|warn|error (default info)"),
    SET_("log-level-file", "FILE", set_log_level_file,
         "a path of 1-1023 bytes",
         "the log level in FILE (debug|info|warn|error), read at start and "
         "at each SIGHUP; overrides --log-level"),
    SET_("log-format", "F", set_log_format, "text|json",
         "text|json: one line per event (default text)"),
    SET_("data-dir", "DIR", set_data_dir, "a directory name of 1-899 bytes",
         "keep tables in DIR: checkpoints and a log (default: memory only)"),
    SET_("fsync", "MODE", set_fsync, "always|everysec|never",
         "always|everysec|never: when a push's log record is synced "
         "(default everysec)"),
    SIZE_("checkpoint-every", "SECONDS", checkpoint_every_s, 0, 86400 * 365,
          "periodic checkpoints (default 0: on demand and at SIGTERM only)"),
    {"checkpoint-log-bytes", "N|auto",
     "a checkpoint once the log since the last one holds N bytes (default "
     "auto: the last checkpoint's size, at least 64M, at most a quarter of "
     "the data dir's file system; 0: never)",
     set_checkpoint_log, EMBPS_FLAG_FIELD_(CFG, checkpoint_log_bytes), 0,
     1ULL << 60, 0, "auto or a number of bytes in [0, 2^60]"},
    SET_("metrics-listen", "HOST:PORT", set_metrics_listen, "HOST:PORT",
         "serve Prometheus /metrics, /healthz and /readyz over HTTP "
         "(default: off)"),
    EMBPS_FLAG_TEXT("metrics-port-file", "FILE", CFG, metrics_port_file,
                    "write the bound metrics port to FILE"),
    SET_("follow", "HOST:PORT", set_follow, "HOST:PORT",
         "follow that primary: apply its log, serve reads, refuse writes "
         "(default: a primary)"),
    SIZE_("sync-followers", "N", sync_followers, 0, EMBPS_FEED_FOLLOWERS_MAX,
          "acknowledge a write once N followers have its record (default 0: "
          "asynchronous)"),
    SIZE_("sync-timeout-ms", "MS", sync_timeout_ms, 1, 3600 * 1000,
          "how long a write waits for them, then is refused (default 5000)"),
    SIZE_("sync-degrade-ms", "MS", sync_degrade_ms, 0, 3600 * 1000,
          "with --sync-followers: after MS with too few followers in sync, "
          "acknowledge writes without them until they are back (recorded "
          "in etcd first with --coordinator: no follower is elected "
          "meanwhile; 100 to 3600000; default 0: never)"),
    SIZE_("repl-backlog-bytes", "N", repl_backlog_bytes, 1ULL << 20,
          1ULL << 40, "log records kept for followers (default 256M)"),
    SIZE_("repl-retain-ms", "MS", repl_retain_ms, 1000, 7 * 86400 * 1000,
          "with --data-dir: checkpoints keep the log records a follower "
          "that fetched in the last MS lacks (default 300000)"),
    SIZE_("max-lag-ms", "MS", max_lag_ms, 1, 86400 * 1000,
          "a follower is ready within MS of its primary (default 5000)"),
    SET_("coordinator", "etcd://HOST:PORT[,HOST:PORT...]", set_coordinator,
         "etcd://HOST:PORT[,HOST:PORT...]",
         "elect the primary of this member in etcd: a lease, a key per "
         "member, automatic failover (default: none)"),
    SET_("cluster-name", "NAME", set_cluster_name,
         "1-63 letters, digits, '-', '_' or '.'",
         "with --coordinator: the cluster's name in etcd"),
    SET_("member", "I", set_member, "a member slot below 4096",
         "with --coordinator: the member slot this server serves (default "
         "and only value: --cluster-index)"),
    SIZE_("lease-ms", "MS", lease_ms, 1000, 600000,
          "with --coordinator: the lease; a primary stops acknowledging "
          "writes before it could have ended (default 3000)"),
    SET_("advertise", "HOST:PORT", set_advertise, "HOST:PORT",
         "with --coordinator: the address others reach this server at "
         "(default: --listen's host, or the host name, and the bound port)"),
    EMBPS_FLAG_END};

static const embps_flag_t info_flags[] = {
    EMBPS_FLAG_TRUE("help", args_t, help, "print this help and exit (or -h)"),
    EMBPS_FLAG_TRUE("version", args_t, version,
                    "print the version (and the protocol's) and exit"),
    EMBPS_FLAG_END};

static const embps_flag_group_t groups[] = {
    {server_flags, offsetof(args_t, cfg)}, {info_flags, 0}, {NULL, 0}};

static void print_help(void) {
  printf("usage: embps-server [options]\n");
  embps_flags_print(stdout, groups, 2, 30);
  printf("Numbers take K, M or G suffixes (binary multiples). A value "
         "follows its flag or\njoins it: --shards 8, --shards=8.\n");
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
 * largest frames; the server a quarter of the memory it may use: its
 * cgroup's limit when there is one below RAM (a container's, a unit's
 * MemoryMax=), else RAM, and then at least 1 GiB; always at least one
 * connection's budget. */
static void default_budgets(embps_server_config_t *cfg) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page
                                       : 0;
  cfg->memory_limit = embps_cgroup_memory_limit(cfg->memory_limit_file,
                                                sizeof cfg->memory_limit_file);
  int limited = cfg->memory_limit && (!ram || cfg->memory_limit < ram);
  if (!cfg->max_conn_buffer_bytes)
    cfg->max_conn_buffer_bytes = 2 * cfg->max_frame_bytes;
  if (!cfg->max_buffer_bytes) {
    cfg->max_buffer_from = limited ? EMBPS_BUDGET_CGROUP : EMBPS_BUDGET_RAM;
    if (limited)
      cfg->max_buffer_bytes = cfg->memory_limit / 4;
    else
      cfg->max_buffer_bytes = ram / 4 > (1ULL << 30) ? ram / 4 : 1ULL << 30;
  }
  if (cfg->max_buffer_bytes < cfg->max_conn_buffer_bytes)
    cfg->max_buffer_bytes = cfg->max_conn_buffer_bytes;
}

int embps_server_config_parse(embps_server_config_t *cfg, int argc,
                              char **argv, char *err, size_t err_len) {
  args_t a;
  memset(&a, 0, sizeof a);
  embps_server_config_t *d = &a.cfg; /* the defaults */
  snprintf(d->listen_host, sizeof d->listen_host, "127.0.0.1");
  d->listen_port = 7070;
  d->io_threads = 2;
  d->shards = 16;
  d->max_frame_bytes = EMBPS_DEFAULT_MAX_FRAME;
  d->max_connections = 1024;
  d->max_tables = 1024;
  d->log_level = EMBPS_LOG_INFO;
  d->fsync = EMBPS_FSYNC_EVERYSEC;
  d->hello_timeout_s = 5;
  d->sync_timeout_ms = 5000;
  d->repl_backlog_bytes = 256ULL << 20;
  d->repl_retain_ms = 300 * 1000;
  d->max_lag_ms = 5000;
  d->lease_ms = 3000;
  d->stall_timeout_s = 60;
  d->checkpoint_log_bytes = EMBPS_CHECKPOINT_LOG_AUTO;
  d->idle_timeout_s = 600; /* idle workers reconnect on their next call */

  embps_flags_t p;
  int rc = embps_flags_parse(&p, groups, &a, argc, argv, NULL, err, err_len);
  *cfg = a.cfg;
  if (rc) {
    if (!strncmp(err, "unknown option", 14)) {
      size_t n = strlen(err);
      snprintf(err + n, err_len - n, " (see --help)");
    }
    return -1;
  }
  if (a.help) {
    print_help();
    return 1;
  }
  if (a.version) {
    embps_server_version_print(stdout);
    return 1;
  }
  if (p.next < argc)
    return embps_refuse(-1, err, err_len, "unexpected argument \"%s\"",
                        argv[p.next]);
  /* the file's level wins over --log-level, wherever that came */
  if (cfg->log_level_file[0] &&
      embps_log_read_level(cfg->log_level_file, &cfg->log_level, err,
                           err_len))
    return -1;
  if (embps_cluster_config_check(cfg, err, err_len))
    return -1;
  if (cfg->coordinator[0] && !cfg->cluster_name[0])
    return embps_refuse(-1, err, err_len, "--coordinator needs --cluster-name: the "
                "cluster's keys in etcd");
  if (!cfg->member_given) /* the member slot is the rows' slot */
    cfg->member = cfg->cluster_index;
  else if (cfg->member != cfg->cluster_index)
    return embps_refuse(-1, err, err_len, "--member %u and --cluster-index %u: a "
                "member's servers hold its rows (--cluster-index) and are "
                "elected in its slot (--member), the same number",
                cfg->member, cfg->cluster_index);
  if (!cfg->coordinator[0]) {
    static const char *const only[] = {"cluster-name", "member", "lease-ms",
                                       "advertise"};
    for (size_t i = 0; i < sizeof only / sizeof *only; i++)
      if (embps_flags_given(&p, only[i]))
        return embps_refuse(-1, err, err_len, "--%s is a setting of --coordinator, "
                    "which is not given", only[i]);
  }
  if (cfg->sync_degrade_ms && cfg->sync_degrade_ms < 100)
    return embps_refuse(-1, err, err_len, "--sync-degrade-ms %u: 0 (never) "
                        "or 100 to 3600000", cfg->sync_degrade_ms);
  if (cfg->sync_degrade_ms && !cfg->sync_followers)
    return embps_refuse(-1, err, err_len, "--sync-degrade-ms needs "
                        "--sync-followers 1 or more: without them writes "
                        "never wait for followers");
  if (cfg->coordinator[0] && cfg->follow[0])
    return embps_refuse(-1, err, err_len, "--follow with --coordinator: the coordinator "
                "says which server to follow");
  if (cfg->cluster_index >= cfg->cluster_size)
    return embps_refuse(-1, err, err_len, "--cluster-index %u must be below "
                "--cluster-size %u", cfg->cluster_index, cfg->cluster_size);
  if (!cfg->has_token && !cfg->insecure && !host_is_loopback(cfg->listen_host))
    return embps_refuse(-1, err, err_len, "--listen %s is not a loopback address and "
                "there is no --auth-token-file: anyone who can reach it "
                "could read, change and drop every table (give a token, or "
                "--insecure to serve anyway; README, Security)",
                cfg->listen_host);
  default_budgets(cfg);
  return 0;
}
