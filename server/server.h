/* server.h - the embps server: its configuration, its lifecycle (create,
 * run, stop, destroy: a library that main.c and tests embed), the state
 * every thread shares, and dispatch, where a request read by an I/O thread
 * begins (the request object itself: request.h).
 *
 * Threading model:
 *   main thread   the thread that calls embps_server_run: its libuv loop
 *                 accepts connections (round-robin to the I/O threads),
 *                 takes the stop call (and the daemon's signals), shuts
 *                 down.
 *   I/O threads   one libuv loop each (--io-threads); own their connections
 *                 for life: read frames, decode, validate, serve pulls
 *                 (gather under shard read locks), merge push duplicates in
 *                 place, write replies.
 *   apply thread  runs, in arrival order, every request that changes tables
 *                 (validated, merged pushes; imports; DDL; evictions;
 *                 checkpoint markers), pushes' shards in parallel with
 *                 OpenMP (apply.h); each reply goes back to the owning loop
 *                 (queue + uv_async_send).
 *   log thread, checkpoint thread   with --data-dir (durable.h).
 *   feed thread   held FETCHes and acknowledgement deadlines (feed.h).
 *   follower thread   --follow: fetches its primary's records and hands
 *                 them to the apply thread (follow.h).
 * A request crosses threads only through those queues.
 *
 * Files, top down: each calls only files after it (no two call each
 * other, directly or around a loop: tests/ops/test_layers.sh checks it
 * from the object files):
 *   main.c signals.c   the daemon: its start-up signal guard
 *   server.c reload.c   lifecycle, listener, the main loop; SIGHUP
 *   conn.c         connections and their budgets, the I/O threads' loops
 *   dispatch.c     each request kind on its I/O thread
 *   apply.c        the apply thread: runs req->run, in order
 *   push.c rows.c ddl.c evict.c   what runs there (rows.c: scans too)
 *   follow.c       --follow: the follower thread, promotion
 *   copy.c         a follower's copy of its primary (a snapshot session)
 *   snapshot.c     snapshot sessions: the tables as a checkpoint stream
 *   durable.c      --data-dir: log records, acks, checkpoints, restore
 *   feed.c         records shipped to followers, their acknowledgements
 *   space.c        the data dir's disk: log-size trigger, checkpoint room
 *   redo.c         one log record applied to the tables
 *   ckpt.c dio.c wal.c   checkpoint directories; the log's segments
 *   marker.c       the state a checkpoint or a snapshot starts from
 *   sync.c request.c metrics.c seen.c cluster.c auth.c   helpers of the
 *                  above; procstat.c cgroup.c watchdog.c below metrics.c
 *   registry.c table_io.c table.c policy.c hstore.c ...   the tables */
#ifndef EMBPS_SERVER_H
#define EMBPS_SERVER_H
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "bufpool.h"
#include "frame.h"
#include "log.h"
#include "merge.h"
#include "metrics.h"
#include "registry.h"
#include "request.h"
#include "util.h"
#include "wire.h"

typedef struct {
  char listen_host[256];
  int listen_port;
  char port_file[1024];
  uint32_t io_threads;
  uint32_t shards;
  uint32_t cluster_size, cluster_index;
  char token[EMBPS_TOKEN_MAX]; /* the current token: the file's first line */
  size_t token_len;
  int has_token;
  char token_next[EMBPS_TOKEN_MAX]; /* a second accepted one (rotation) */
  size_t token_next_len;            /* 0: none */
  char token_file[1024];      /* --auth-token-file: re-read at a reload */
  char log_level_file[1024];  /* --log-level-file: likewise */
  uint64_t max_frame_bytes;
  uint32_t max_connections;
  uint32_t max_tables;
  uint32_t idle_timeout_s; /* 0: never */
  uint64_t max_memory;     /* bytes of table storage; 0: no limit */
  uint32_t omp_threads;    /* 0: OpenMP's default */
  embps_log_level_t log_level;
  char data_dir[1024];     /* empty: nothing is durable */
  int fsync;               /* embps_fsync_t (wal.h) */
  uint32_t checkpoint_every_s; /* 0: on demand and at SIGTERM only */
  /* log bytes since the last checkpoint that start one (space.h):
   * EMBPS_CHECKPOINT_LOG_AUTO (the default), 0: never */
  uint64_t checkpoint_log_bytes;
  uint32_t hello_timeout_s;       /* a connection's time to say hello */
  uint32_t stall_timeout_s;       /* /healthz: a wedged thread (watchdog.h) */
  uint64_t max_buffer_bytes;      /* requests and replies held, server */
  int max_buffer_from;            /* EMBPS_BUDGET_*: where it came from */
  uint64_t memory_limit;          /* the cgroup's at start (0: none) */
  char memory_limit_file[256];    /* the file that set it */
  uint64_t max_conn_buffer_bytes; /* the same, one connection */
  int insecure; /* may listen beyond loopback without a token */
  char metrics_host[256]; /* --metrics-listen; empty: no HTTP endpoint */
  int metrics_port;
  char metrics_port_file[1024];
  int log_json; /* --log-format json */
  const char *cluster_servers; /* --cluster-servers (in argv), or NULL */
  int complete_tables;         /* --complete-tables */
  /* replication (issue 21) */
  char follow[EMBPS_ADDR_MAX];  /* --follow HOST:PORT; empty: a primary */
  uint32_t sync_followers;      /* --sync-followers */
  uint32_t sync_timeout_ms;     /* --sync-timeout-ms */
  uint32_t sync_degrade_ms;     /* --sync-degrade-ms: 0 strict */
  uint64_t repl_backlog_bytes;  /* --repl-backlog-bytes */
  uint32_t repl_retain_ms;      /* --repl-retain-ms: log kept for followers */
  uint32_t max_lag_ms;          /* --max-lag-ms: a follower's readiness */
  /* automatic failover (issue 22, failover.h) */
  char coordinator[1024];       /* --coordinator etcd://...; empty: none */
  char cluster_name[64];        /* --cluster-name */
  uint32_t member;              /* --member: the slot this server serves */
  int member_given;
  uint32_t lease_ms;            /* --lease-ms */
  char advertise[EMBPS_ADDR_MAX]; /* --advertise HOST:PORT; empty: derived */
  int handle_signals; /* not a flag: SIGTERM/SIGINT stop it (the daemon) */
  /* not a flag: the daemon's argv, with which a server demoted by the
   * coordinator executes itself again to rejoin (NULL: it cannot) */
  char **argv;
} embps_server_config_t;

/* Where --max-buffer-bytes came from: the flag, RAM, the cgroup's limit. */
enum { EMBPS_BUDGET_FLAG = 0, EMBPS_BUDGET_RAM = 1, EMBPS_BUDGET_CGROUP = 2 };

/* Largest frame accepted from a connection before its hello succeeds. */
#define EMBPS_PREAUTH_FRAME_MAX 4096u

/* Fills cfg with defaults, then parses argv. Returns 0 to run, 1 when
 * --help or --version was printed, -1 on an error (message in err). */
int embps_server_config_parse(embps_server_config_t *cfg, int argc,
                              char **argv, char *err, size_t err_len);
/* The tokens of cfg (its current token first), and cfg's from t. */
void embps_server_config_tokens(const embps_server_config_t *cfg,
                                embps_tokens_t *t);
void embps_server_config_set_tokens(embps_server_config_t *cfg,
                                    const embps_tokens_t *t);

typedef struct {
  atomic_uint_fast64_t connections, requests, pulls, pushes, pull_rows,
      push_rows, errors, bytes_in, bytes_out;
} embps_counters_t;

typedef struct embps_server embps_server_t;

/* Buffers below this come from the heap (main.c sets malloc's mmap
 * threshold to it, the largest glibc takes); larger request bodies are
 * kept in srv->bodies, up to EMBPS_BODY_POOL_BYTES in all. */
#define EMBPS_MMAP_THRESHOLD (32u << 20)
#define EMBPS_BODY_POOL_BYTES ((size_t)256 << 20)

/* State shared by all threads. */
struct embps_server {
  embps_server_config_t cfg;
  embps_registry_t registry;
  embps_counters_t counters;
  embps_bufpool_t bodies; /* request bodies past malloc's mmap threshold */
  uint64_t start_ns;
  embps_auth_t auth; /* the tokens hellos are checked against (reload) */
  struct embps_apply *apply;
  struct embps_durable *dur; /* NULL without --data-dir */
  /* replication (issue 21) */
  struct embps_feed *feed;     /* records for followers (feed.h) */
  struct embps_follow *follow; /* --follow: the follower thread (follow.h) */
  atomic_int role;             /* EMBPS_ROLE_*: a follower until promoted */
  /* automatic failover (issue 22): the coordinator's side (failover.h),
   * and how a follower whose log left its primary's starts over */
  struct embps_failover *failover;
  void (*rejoin)(struct embps_server *srv, const char *why);
  struct embps_snapshots *snap; /* snapshot sessions (snapshot.h) */
  /* what run returns when set (a follower that finds its primary's
   * layout is not its own stops with EMBPS_SERVER_EXIT_CONFIG), and how
   * a module below server.c stops the server (embps_server_stop) */
  atomic_int exit_status;
  void (*stop)(struct embps_server *srv);

};

/* Per-thread scratch, reused by every request of that thread. */
typedef struct {
  embps_table_scratch_t table;
  embps_dedup_t dedup;
} embps_scratch_t;

/* ---- dispatch.c: runs on an I/O thread ---- */
typedef enum {
  EMBPS_DISPATCH_REPLY,    /* req->reply is set: send it, free req */
  EMBPS_DISPATCH_DEFERRED, /* handed on; answered through req->complete */
  EMBPS_DISPATCH_CLOSE,    /* send req->reply, then close the connection */
} embps_dispatch_t;

/* Handles a complete frame. `authed` says whether this connection's hello
 * succeeded; a successful hello sets it. scratch is the thread's own. */
embps_dispatch_t embps_dispatch(embps_server_t *srv, embps_request_t *req,
                                int *authed, embps_scratch_t *scratch);

/* ---- server.c: a server's lifecycle, in libuv's shape ----
 * create   (cfg is copied) restores --data-dir, starts the apply, metrics,
 *          checkpoint and I/O threads, listens, writes --port-file and
 *          prints the ready line. 0 with *out set, or a negative code
 *          (-errno, EMBPS_EIO for the data dir, EMBPS_EINVAL when
 *          --metrics-listen or --cluster-servers cannot be served,
 *          EMBPS_SERVER_EMISFIT when the primary it would follow has
 *          another --shards or cluster slot; the reason is logged) with
 *          everything it did undone and *out NULL.
 * port     the port it listens on (the one bound for --listen port 0).
 * run      serves, on the calling thread, until stopped; then finishes
 *          every request already read, takes the final checkpoint (with
 *          --data-dir) and stops the threads. Called at most once. Returns
 *          the exit status: 0, 1 when the final checkpoint failed, or
 *          EMBPS_SERVER_EXIT_CONFIG when a follower stopped the server
 *          because its primary's layout is not its own.
 * stop     from any thread or a signal handler, any number of times
 *          before destroy (before run too): run drains and returns, as on
 *          SIGTERM.
 * reload   (reload.c; the daemon's SIGHUP) reads --auth-token-file and
 *          --log-level-file again and applies what they hold now; a file
 *          that cannot be read or is refused leaves its part as it was.
 *          Logs one line saying what was reloaded, whatever the log level
 *          (why names the cause). 0, or -1 when a part was refused. Any
 *          thread, while the server exists.
 * destroy  stops what run did not, frees everything; NULL-safe.
 * Process-wide rather than per server: the log level and format, the
 *   /metrics counters (summed over the process's servers), and the table
 *   bytes --max-memory limits (likewise summed); at most one server of a
 *   process may serve --metrics-listen, and one --cluster-servers, at a
 *   time. The process must ignore SIGPIPE (main.c does).
 * The process should also start with OMP_WAIT_POLICY=passive in its
 *   environment: the OpenMP runtime reads it once, as it loads, and
 *   without it the apply's team threads spin after every push, taking
 *   cores from the I/O threads. The daemon re-executes itself to set it
 *   (main.c); an embedder sets it before its process starts. */
#define EMBPS_SERVER_EMISFIT (-29000) /* create: a configuration error */
#define EMBPS_SERVER_EXIT_CONFIG 2    /* as a command line refused */
int embps_server_create(const embps_server_config_t *cfg,
                        embps_server_t **out);
int embps_server_port(const embps_server_t *srv);
int embps_server_run(embps_server_t *srv);
void embps_server_stop(embps_server_t *srv);
int embps_server_reload(embps_server_t *srv, const char *why);
void embps_server_destroy(embps_server_t *srv);
#endif
