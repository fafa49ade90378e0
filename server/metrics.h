/* metrics.h - the server's Prometheus endpoint (--metrics-listen): counters
 * the request path bumps, and an HTTP server (libmicrohttpd) answering
 * /metrics, /healthz and /readyz.
 *
 * The hooks run on the I/O and apply threads and take no lock: every figure
 * is a relaxed atomic, per-table figures live in a fixed table of slots
 * claimed once by name (compare-and-swap), so a request costs a hash of its
 * table name and a few atomic adds. The hooks work whether or not the HTTP
 * server was started. The counters are the process's (summed over its
 * servers); one server of a process at a time serves HTTP.
 *
 * What other parts of the server know (durability, the cluster) is pulled
 * at scrape time through hooks the core registers at start: this file
 * calls nothing above it. */
#ifndef EMBPS_METRICS_H
#define EMBPS_METRICS_H
#include <stddef.h>
#include <stdint.h>

#include "coord.h"
#include "embps/embps.h"

struct embps_server;
struct embps_request;
struct embps_durable;

/* One follower of a primary, as /metrics shows it (issue 21). */
typedef struct {
  char name[300]; /* its address */
  uint64_t applied_lsn, durable_lsn, lag_records, lag_ms, bytes_shipped;
  int in_sync;
} embps_follower_info_t;

/* The data dir's disk (durable.h, space.h). */
typedef struct {
  uint64_t free_bytes, size_bytes, reserve_bytes, log_limit_bytes,
      refused_total;
} embps_metrics_space_t;

/* Figures the HTTP thread pulls from elsewhere; any may be NULL (then
 * not shown, and /readyz needs only the server ready). */
typedef struct {
  /* The durability fields of a stats reply; called while the server is
   * ready, with its data dir (srv->dur) when it has one. */
  void (*durable_stats)(struct embps_durable *d, embps_server_stats_t *s);
  /* The data dir's disk, called as durable_stats is. */
  void (*durable_space)(struct embps_durable *d, embps_metrics_space_t *out);
  /* How long the log's oldest write or sync in progress has taken (ms);
   * with durable_stats, /readyz's durability part. */
  uint64_t (*durable_stall_ms)(struct embps_durable *d);
  /* 0 without --cluster-servers, else 1 with the tables missing here, the
   * peers that could not be asked, and the peers. */
  int (*cluster_counts)(size_t *missing, size_t *unreachable,
                        size_t *peers);
  /* /readyz's cluster part: 1 when it holds, else 0; *body (malloc'd,
   * NULL when out of memory) says why. */
  int (*cluster_ready)(char **body, size_t *len);
  /* Replication (issue 21): the replication fields of a stats reply; a
   * primary's followers (at most cap, how many returned); /readyz's
   * replication part (1 when it holds, else 0 with why). */
  void (*repl_stats)(struct embps_server *srv, embps_server_stats_t *s);
  size_t (*repl_followers)(struct embps_server *srv,
                           embps_follower_info_t *v, size_t cap);
  int (*repl_ready)(struct embps_server *srv, char *why, size_t why_len);
  /* --sync-degrade-ms: 0 without it, else 1 with whether this primary
   * acknowledges without followers now and how often it began to. */
  int (*sync_degrade)(struct embps_server *srv, int *degraded,
                      uint64_t *degradations);
  /* The coordinator (issue 22): 1 with *s filled, 0 when there is none. */
  int (*coord_status)(struct embps_server *srv, embps_coord_status_t *s);
  /* s->members (malloc'd, at most EMBPS_STATS_MEMBERS_MAX): the primary of
   * every member slot the coordinator knows; none without one. */
  void (*coord_members)(struct embps_server *srv, embps_server_stats_t *s);
} embps_metrics_hooks_t;

/* Starts the HTTP server on cfg->metrics_host:metrics_port (when set) and
 * writes cfg->metrics_port_file; hooks is copied. Returns 0 or -1 with a
 * logged reason (also when another server of the process serves HTTP). */
int embps_metrics_start(struct embps_server *srv,
                        const embps_metrics_hooks_t *hooks);
/* Stops the HTTP server; NULL-safe, idempotent. */
void embps_metrics_stop(void);
/* /readyz answers 200 from set_ready(1) on, 503 before and after
 * set_ready(0) (shutdown has begun). /healthz is 200 while serving HTTP. */
void embps_metrics_set_ready(int ready);

/* A request of `kind` entered dispatch; returns the time (CLOCK_MONOTONIC
 * ns) its latency is measured from. */
uint64_t embps_metrics_request(uint16_t kind);
/* A pull of n_rows rows of `table` was served; start_ns from
 * embps_metrics_request. */
void embps_metrics_pulled(const char *table, size_t n_rows, uint64_t start_ns);
/* req, a push, was applied: its rows, the duplicates merged out of them
 * and its latency from dispatch to the applied reply. */
void embps_metrics_pushed(const struct embps_request *req);
/* req failed with `code` (its table, when it names an existing one). */
void embps_metrics_error(const struct embps_request *req, int code);
/* The apply queue grew (+1) or shrank (-1). */
void embps_metrics_queue(int delta);
/* A connection was refused at --max-connections. Returns 1 when it should
 * be logged (at most one line per second, with the count since the last). */
int embps_metrics_refused(uint64_t *since_last);
#endif
