/* metrics.c - see metrics.h. Exposition format: Prometheus text 0.0.4. */
#include "metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "cgroup.h"
#include "procstat.h"
#include "server.h"
#include "watchdog.h"

/* ------------------------------------------------------------ figures */

#define TABLE_SLOTS 1024u /* per-table figures kept; a power of two */
#define PROBE_MAX 64u
#define KINDS 32u /* request kinds counted one by one; the rest as "other" */

/* embps codes are EMBPS_EINVAL, EMBPS_EINVAL - 1, ...: one counter each,
 * plus one for system errors (-errno) */
#define COUNT_CODE_(name, code, msg) +1
enum { N_CODES = 0 EMBPS_ERRNO_MAP(COUNT_CODE_) };
#undef COUNT_CODE_

typedef atomic_uint_fast64_t counter_t;

enum { SLOT_EMPTY, SLOT_CLAIMING, SLOT_READY };

typedef struct {
  atomic_int state;
  char name[EMBPS_TABLE_NAME_MAX];
  counter_t pulls, pull_rows, pushes, push_rows, merged;
  counter_t errors[N_CODES + 1];
} table_slot_t;

/* seconds; the +Inf bucket follows */
static const double bucket_s[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                  0.005,  0.01,    0.025,  0.05,  0.1,
                                  0.25,   0.5,     1,      2.5,   5,   10};
#define N_BUCKETS (sizeof bucket_s / sizeof *bucket_s)

typedef struct {
  counter_t bucket[N_BUCKETS + 1]; /* not cumulative; summed at scrape */
  counter_t sum_ns;
} histogram_t;

static struct {
  table_slot_t slot[TABLE_SLOTS];
  table_slot_t none; /* errors naming no table, tables past the slots */
  counter_t kinds[KINDS + 1];
  histogram_t pull, push;
  counter_t refused;
  atomic_uint_fast64_t refused_logged_ns, refused_unlogged;
  atomic_int_fast64_t queue;
  atomic_int ready;
  struct MHD_Daemon *daemon;
  embps_server_t *srv;
  embps_metrics_hooks_t hooks;
  time_t start_s;
} m;

static void add(counter_t *c, uint64_t n) {
  atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}
static uint64_t get(const counter_t *c) {
  return atomic_load_explicit(c, memory_order_relaxed);
}

/* The slot of table `name`, claimed on first use. */
static table_slot_t *slot_of(const char *name) {
  if (!name[0])
    return &m.none;
  uint32_t h = 2166136261u; /* FNV-1a */
  for (const char *p = name; *p; p++)
    h = (h ^ (unsigned char)*p) * 16777619u;
  for (uint32_t i = 0; i < PROBE_MAX;) {
    table_slot_t *s = &m.slot[(h + i) & (TABLE_SLOTS - 1)];
    int st = atomic_load_explicit(&s->state, memory_order_acquire);
    if (st == SLOT_READY) {
      if (!strcmp(s->name, name))
        return s;
      i++;
    } else if (st == SLOT_EMPTY) {
      if (atomic_compare_exchange_strong(&s->state, &st, SLOT_CLAIMING)) {
        snprintf(s->name, sizeof s->name, "%s", name);
        atomic_store_explicit(&s->state, SLOT_READY, memory_order_release);
        return s;
      }
    } else {
      sched_yield(); /* another thread is writing the name: a few ns */
    }
  }
  return &m.none;
}

static void observe(histogram_t *hg, uint64_t start_ns) {
  uint64_t ns = embps_now_ns() - start_ns;
  size_t b = 0;
  while (b < N_BUCKETS && (double)ns > bucket_s[b] * 1e9)
    b++;
  add(&hg->bucket[b], 1);
  add(&hg->sum_ns, ns);
}

uint64_t embps_metrics_request(uint16_t kind) {
  add(&m.kinds[kind < KINDS ? kind : KINDS], 1);
  return embps_now_ns();
}

void embps_metrics_pulled(const char *table, size_t n_rows,
                          uint64_t start_ns) {
  table_slot_t *s = slot_of(table);
  add(&s->pulls, 1);
  add(&s->pull_rows, n_rows);
  observe(&m.pull, start_ns);
}

void embps_metrics_pushed(const embps_request_t *req) {
  const embps_push_t *p = &req->msg.u.push;
  table_slot_t *s = slot_of(p->table);
  add(&s->pushes, 1);
  add(&s->push_rows, p->n);
  add(&s->merged, p->n - req->n_unique);
  observe(&m.push, req->start_ns);
}

void embps_metrics_error(const embps_request_t *req, int code) {
  /* Only a request that reached its table names it: a label per name a
   * client merely sends would let clients grow the scrape without bound. */
  const char *table = "";
  if (code != EMBPS_ENOTABLE && code != EMBPS_EPROTO && code != EMBPS_EKIND &&
      code != EMBPS_EAUTH && code != EMBPS_EVERSION) {
    if (req->hdr.kind == EMBPS_KIND_PULL)
      table = req->msg.u.pull.table;
    else if (req->hdr.kind == EMBPS_KIND_PUSH)
      table = req->msg.u.push.table;
  }
  int i = EMBPS_EINVAL - code;
  add(&slot_of(table)->errors[i >= 0 && i < N_CODES ? i : N_CODES], 1);
}

void embps_metrics_queue(int delta) {
  atomic_fetch_add_explicit(&m.queue, delta, memory_order_relaxed);
}

int embps_metrics_refused(uint64_t *since_last) {
  add(&m.refused, 1);
  add(&m.refused_unlogged, 1);
  uint64_t now = embps_now_ns();
  uint64_t last = atomic_load(&m.refused_logged_ns);
  if (last && now - last < 1000000000ull)
    return 0;
  if (!atomic_compare_exchange_strong(&m.refused_logged_ns, &last, now))
    return 0;
  *since_last = atomic_exchange(&m.refused_unlogged, 0);
  return 1;
}

void embps_metrics_set_ready(int ready) { atomic_store(&m.ready, ready); }

/* ------------------------------------------------------------ exposition */

typedef struct {
  char *p;
  size_t len, cap;
  int failed;
} text_t;

static void put(text_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void put(text_t *t, const char *fmt, ...) {
  for (int pass = 0; pass < 2 && !t->failed; pass++) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->p ? t->p + t->len : NULL, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = 1;
    } else if ((size_t)n < t->cap - t->len) {
      t->len += (size_t)n;
      return;
    } else {
      size_t cap = 2 * (t->cap + (size_t)n) + 4096;
      char *q = realloc(t->p, cap);
      if (!q)
        t->failed = 1;
      t->p = q ? q : t->p;
      t->cap = q ? cap : t->cap;
    }
  }
}

static void head(text_t *t, const char *name, const char *type,
                 const char *help) {
  put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static const char *kind_name(unsigned k, char *buf, size_t len) {
  if (k == KINDS)
    return "other";
  if (embps_kind_name(k))
    return embps_kind_name(k);
  snprintf(buf, len, "%u", k); /* a kind newer than this table */
  return buf;
}

static void put_histogram(text_t *t, const char *op, const histogram_t *hg) {
  uint64_t cum = 0;
  for (size_t b = 0; b <= N_BUCKETS; b++) {
    cum += get(&hg->bucket[b]);
    if (b < N_BUCKETS)
      put(t, "embps_request_duration_seconds_bucket{op=\"%s\",le=\"%g\"} "
          "%llu\n", op, bucket_s[b], (unsigned long long)cum);
    else
      put(t, "embps_request_duration_seconds_bucket{op=\"%s\",le=\"+Inf\"} "
          "%llu\n", op, (unsigned long long)cum);
  }
  put(t, "embps_request_duration_seconds_sum{op=\"%s\"} %.9f\n", op,
      (double)get(&hg->sum_ns) / 1e9);
  put(t, "embps_request_duration_seconds_count{op=\"%s\"} %llu\n", op,
      (unsigned long long)cum);
}

/* The slots in use, the catch-all last. */
static size_t used_slots(table_slot_t **out) {
  size_t n = 0;
  for (size_t i = 0; i < TABLE_SLOTS; i++)
    if (atomic_load_explicit(&m.slot[i].state, memory_order_acquire) ==
        SLOT_READY)
      out[n++] = &m.slot[i];
  out[n++] = &m.none;
  return n;
}

/* The label of slot s's table: its name, or with named 0 "#" and the
 * slot's number (the same in every series of a scrape; "" stays ""). */
static const char *slot_label(const table_slot_t *s, int named, char *buf,
                              size_t len) {
  if (named || s == &m.none)
    return s->name;
  snprintf(buf, len, "#%u", (unsigned)(s - m.slot));
  return buf;
}

/* One line per used slot for the counter at `offset` in table_slot_t (the
 * catch-all only when non-zero). */
static void put_per_table(text_t *t, table_slot_t **slots, size_t n,
                          const char *metric, const char *op, size_t offset,
                          int named) {
  char buf[16];
  for (size_t i = 0; i < n; i++) {
    uint64_t v = get((const counter_t *)((const char *)slots[i] + offset));
    if (v || slots[i] != &m.none)
      put(t, "%s{table=\"%s\"%s%s%s} %llu\n", metric,
          slot_label(slots[i], named, buf, sizeof buf), op ? ",op=\"" : "",
          op ? op : "", op ? "\"" : "", (unsigned long long)v);
  }
}

/* Admission and eviction of dynamic tables (issue 12), from the tables'
 * own counters (kept across restarts by checkpoints and the log). */
static void put_dynamic(text_t *t, const embps_table_info_t *info, size_t n) {
  static const struct {
    const char *metric, *type, *help, *label;
    size_t offset;
  } figures[] = {
      {"embps_table_rows_admitted_total", "counter",
       "Rows made by admission (--admit-after, --admit-probability).", NULL,
       offsetof(embps_table_info_t, rows_admitted)},
      {"embps_table_rows_pending", "gauge",
       "Ids counted for admission but not admitted (an estimate).", NULL,
       offsetof(embps_table_info_t, rows_pending)},
      {"embps_table_rows_evicted_total", "counter",
       "Rows evicted, by reason.", "reason=\"ttl\"",
       offsetof(embps_table_info_t, evicted_ttl)},
      {"embps_table_rows_evicted_total", NULL, NULL, "reason=\"capacity\"",
       offsetof(embps_table_info_t, evicted_capacity)},
      {"embps_table_rows_evicted_total", NULL, NULL, "reason=\"l2\"",
       offsetof(embps_table_info_t, evicted_l2)},
      {"embps_table_capacity_rows", "gauge",
       "--max-rows share held on this server (0: no capacity).", NULL,
       offsetof(embps_table_info_t, capacity)},
  };
  for (size_t k = 0; k < sizeof figures / sizeof *figures; k++) {
    if (figures[k].help)
      head(t, figures[k].metric, figures[k].type, figures[k].help);
    for (size_t i = 0; i < n; i++) {
      uint64_t v;
      memcpy(&v, (const char *)&info[i] + figures[k].offset, sizeof v);
      put(t, "%s{table=\"%s\"%s%s} %llu\n", figures[k].metric,
          info[i].spec.name, figures[k].label ? "," : "",
          figures[k].label ? figures[k].label : "", (unsigned long long)v);
    }
  }
  head(t, "embps_table_evict_stall_max_seconds", "gauge",
       "Longest eviction work done under one shard lock.");
  for (size_t i = 0; i < n; i++)
    put(t, "embps_table_evict_stall_max_seconds{table=\"%s\"} %.6f\n",
        info[i].spec.name, (double)info[i].evict_stall_max_us / 1e6);
}

static void put_tables(text_t *t, embps_server_t *srv, int named) {
  table_slot_t *slots[TABLE_SLOTS + 1];
  size_t n = used_slots(slots);
  static const struct {
    const char *metric, *help, *op;
    size_t offset;
  } counters[] = {
      {"embps_table_requests_total",
       "Pulls and pushes served, by table (pushes: applied).", "pull",
       offsetof(table_slot_t, pulls)},
      {"embps_table_requests_total", NULL, "push",
       offsetof(table_slot_t, pushes)},
      {"embps_table_rows_total",
       "Rows pulled, and rows pushed as sent (duplicates included).", "pull",
       offsetof(table_slot_t, pull_rows)},
      {"embps_table_rows_total", NULL, "push",
       offsetof(table_slot_t, push_rows)},
      {"embps_push_merged_duplicates_total",
       "Pushed rows summed into another row of the same push.", NULL,
       offsetof(table_slot_t, merged)},
  };
  for (size_t k = 0; k < sizeof counters / sizeof *counters; k++) {
    if (counters[k].help) /* the first series of a metric */
      head(t, counters[k].metric, "counter", counters[k].help);
    put_per_table(t, slots, n, counters[k].metric, counters[k].op,
                  counters[k].offset, named);
  }
  char buf[16];
  head(t, "embps_errors_total", "counter",
       "Refused requests by error code and table (table=\"\": none named).");
  for (size_t i = 0; i < n; i++)
    for (int c = 0; c <= N_CODES; c++)
      if (get(&slots[i]->errors[c]))
        put(t, "embps_errors_total{code=\"%s\",table=\"%s\"} %llu\n",
            c < N_CODES ? embps_err_name(EMBPS_EINVAL - c) : "system",
            slot_label(slots[i], named, buf, sizeof buf),
            (unsigned long long)get(&slots[i]->errors[c]));

  embps_table_info_t *info = NULL;
  size_t n_info = 0;
  if (embps_registry_list(&srv->registry, &info, &n_info))
    n_info = 0;
  for (size_t i = 0; !named && i < n_info; i++) /* this copy's names */
    snprintf(info[i].spec.name, sizeof info[i].spec.name, "%s",
             slot_label(slot_of(info[i].spec.name), 0, buf, sizeof buf));
  head(t, "embps_table_rows", "gauge", "Rows a table holds on this server.");
  for (size_t i = 0; i < n_info; i++)
    put(t, "embps_table_rows{table=\"%s\"} %llu\n", info[i].spec.name,
        (unsigned long long)info[i].rows_allocated);
  head(t, "embps_table_bytes", "gauge",
       "Bytes of storage a table holds on this server.");
  for (size_t i = 0; i < n_info; i++)
    put(t, "embps_table_bytes{table=\"%s\"} %llu\n", info[i].spec.name,
        (unsigned long long)info[i].bytes_used);
  head(t, "embps_table_dim", "gauge", "Floats per row.");
  for (size_t i = 0; i < n_info; i++)
    put(t, "embps_table_dim{table=\"%s\"} %u\n", info[i].spec.name,
        info[i].spec.dim);
  put_dynamic(t, info, n_info);
  free(info);
}

static void put_server(text_t *t, embps_server_t *srv) {
  const embps_counters_t *c = &srv->counters;
  head(t, "embps_build_info", "gauge", "Version of this embps-server.");
  put(t, "embps_build_info{version=\"%s\",protocol=\"%d\"} 1\n",
      EMBPS_VERSION_STRING, EMBPS_PROTOCOL_VERSION);
  head(t, "embps_ready", "gauge",
       "1 once the server serves (restored, listening); /readyz also needs "
       "embps_cluster_missing_tables 0.");
  put(t, "embps_ready %d\n", atomic_load(&m.ready));
  head(t, "embps_start_time_seconds", "gauge",
       "Unix time the server started.");
  put(t, "embps_start_time_seconds %lld\n", (long long)m.start_s);
  head(t, "embps_cluster_size", "gauge", "Servers in the cluster.");
  put(t, "embps_cluster_size %u\n", srv->cfg.cluster_size);
  head(t, "embps_cluster_index", "gauge", "This server's --cluster-index.");
  put(t, "embps_cluster_index %u\n", srv->cfg.cluster_index);
  size_t missing, unreachable, peers;
  if (m.hooks.cluster_counts &&
      m.hooks.cluster_counts(&missing, &unreachable, &peers)) {
    head(t, "embps_cluster_missing_tables", "gauge",
         "Tables another server holds and this one lacks (--cluster-servers;"
         " /readyz is 503 while above 0).");
    put(t, "embps_cluster_missing_tables %zu\n", missing);
    head(t, "embps_cluster_peers_unreachable", "gauge",
         "Other servers that did not answer the last table check.");
    put(t, "embps_cluster_peers_unreachable %zu\n", unreachable);
  }
  head(t, "embps_connections", "gauge", "Open client connections.");
  put(t, "embps_connections %llu\n",
      (unsigned long long)atomic_load(&c->connections));
  head(t, "embps_connections_refused_total", "counter",
       "Connections refused at --max-connections.");
  put(t, "embps_connections_refused_total %llu\n",
      (unsigned long long)get(&m.refused));
  head(t, "embps_apply_queue_depth", "gauge",
       "Pushes validated and waiting for the apply thread.");
  put(t, "embps_apply_queue_depth %lld\n", (long long)atomic_load(&m.queue));
  head(t, "embps_received_bytes_total", "counter", "Bytes read from clients.");
  put(t, "embps_received_bytes_total %llu\n",
      (unsigned long long)atomic_load(&c->bytes_in));
  head(t, "embps_sent_bytes_total", "counter", "Bytes written to clients.");
  put(t, "embps_sent_bytes_total %llu\n",
      (unsigned long long)atomic_load(&c->bytes_out));
  head(t, "embps_requests_total", "counter", "Requests received, by kind.");
  char buf[16];
  for (unsigned k = 0; k <= KINDS; k++)
    if (get(&m.kinds[k]))
      put(t, "embps_requests_total{kind=\"%s\"} %llu\n",
          kind_name(k, buf, sizeof buf), (unsigned long long)get(&m.kinds[k]));
  head(t, "embps_request_duration_seconds", "histogram",
       "Time from a request's dispatch to its reply: pulls, and pushes "
       "through the apply queue until applied.");
  put_histogram(t, "pull", &m.pull);
  put_histogram(t, "push", &m.push);
}

/* The data dir's disk (--data-dir only). */
static void put_space(text_t *t, embps_server_t *srv) {
  embps_metrics_space_t sp;
  memset(&sp, 0, sizeof sp);
  m.hooks.durable_space(srv->dur, &sp);
  static const struct {
    const char *metric, *type, *help;
    size_t offset;
  } figures[] = {
      {"embps_data_dir_free_bytes", "gauge",
       "Bytes free for the server in the data dir's file system.",
       offsetof(embps_metrics_space_t, free_bytes)},
      {"embps_data_dir_size_bytes", "gauge",
       "Size of the data dir's file system.",
       offsetof(embps_metrics_space_t, size_bytes)},
      {"embps_checkpoint_reserve_bytes", "gauge",
       "Bytes kept free for the next checkpoint: the log grows only into "
       "the rest.",
       offsetof(embps_metrics_space_t, reserve_bytes)},
      {"embps_checkpoint_log_limit_bytes", "gauge",
       "Log bytes since the last checkpoint that start one "
       "(--checkpoint-log-bytes; 0: never).",
       offsetof(embps_metrics_space_t, log_limit_bytes)},
      {"embps_log_refused_total", "counter",
       "Pushes and imports refused for want of room in the data dir.",
       offsetof(embps_metrics_space_t, refused_total)},
  };
  for (size_t k = 0; k < sizeof figures / sizeof *figures; k++) {
    uint64_t v;
    memcpy(&v, (const char *)&sp + figures[k].offset, sizeof v);
    head(t, figures[k].metric, figures[k].type, figures[k].help);
    put(t, "%s %llu\n", figures[k].metric, (unsigned long long)v);
  }
}

/* The process (procstat.h), its memory limits, its threads' liveness. */
static void put_thread_stall(const char *name, double seconds, void *ctx) {
  put(ctx, "embps_thread_stall_seconds{thread=\"%s\"} %.3f\n", name,
      seconds);
}

static void put_process(text_t *t, embps_server_t *srv) {
  embps_procstat_t p;
  embps_procstat_read(&p);
  head(t, "process_resident_memory_bytes", "gauge",
       "Resident memory size in bytes.");
  put(t, "process_resident_memory_bytes %llu\n",
      (unsigned long long)p.resident_bytes);
  head(t, "process_virtual_memory_bytes", "gauge",
       "Virtual memory size in bytes.");
  put(t, "process_virtual_memory_bytes %llu\n",
      (unsigned long long)p.virtual_bytes);
  head(t, "process_cpu_seconds_total", "counter",
       "Total user and system CPU time spent in seconds.");
  put(t, "process_cpu_seconds_total %.3f\n", p.cpu_seconds);
  head(t, "process_open_fds", "gauge", "Number of open file descriptors.");
  put(t, "process_open_fds %llu\n", (unsigned long long)p.open_fds);
  if (p.max_fds) {
    head(t, "process_max_fds", "gauge",
         "Maximum number of open file descriptors.");
    put(t, "process_max_fds %llu\n", (unsigned long long)p.max_fds);
  }
  head(t, "process_start_time_seconds", "gauge",
       "Start time of the process since unix epoch in seconds.");
  put(t, "process_start_time_seconds %.2f\n", p.start_time_seconds);
  head(t, "embps_max_memory_bytes", "gauge",
       "--max-memory: the cap on table storage (0: none).");
  put(t, "embps_max_memory_bytes %llu\n",
      (unsigned long long)srv->cfg.max_memory);
  head(t, "embps_memory_limit_bytes", "gauge",
       "The memory limit of the server's cgroup (0: none).");
  put(t, "embps_memory_limit_bytes %llu\n",
      (unsigned long long)embps_cgroup_memory_limit(NULL, 0));
  head(t, "embps_max_buffer_bytes", "gauge",
       "--max-buffer-bytes: requests and replies held, all connections.");
  put(t, "embps_max_buffer_bytes %llu\n",
      (unsigned long long)srv->cfg.max_buffer_bytes);
  head(t, "embps_thread_stall_seconds", "gauge",
       "How long a thread has had work in hand without progress (0: idle; "
       "/healthz fails past --stall-timeout).");
  embps_watch_each(put_thread_stall, t);
}

/* Checkpoint and log figures (--data-dir only). */
static void put_durability(text_t *t, embps_server_t *srv) {
  if (!srv->dur || !m.hooks.durable_stats)
    return;
  embps_server_stats_t s;
  memset(&s, 0, sizeof s);
  m.hooks.durable_stats(srv->dur, &s);
  head(t, "embps_checkpoint_time_seconds", "gauge",
       "Unix time of the last durable checkpoint (0: none yet).");
  put(t, "embps_checkpoint_time_seconds %llu\n",
      (unsigned long long)s.checkpoint_unix_s);
  head(t, "embps_checkpoint_bytes", "gauge", "Size of the last checkpoint.");
  put(t, "embps_checkpoint_bytes %llu\n",
      (unsigned long long)s.checkpoint_bytes);
  head(t, "embps_checkpoint_duration_seconds", "gauge",
       "How long the last checkpoint took.");
  put(t, "embps_checkpoint_duration_seconds %.3f\n",
      (double)s.checkpoint_ms / 1e3);
  head(t, "embps_checkpoint_lsn", "gauge",
       "Log position the last checkpoint covers.");
  put(t, "embps_checkpoint_lsn %llu\n", (unsigned long long)s.checkpoint_lsn);
  head(t, "embps_log_bytes", "gauge",
       "Bytes of push log since the last checkpoint.");
  put(t, "embps_log_bytes %llu\n", (unsigned long long)s.log_bytes);
  head(t, "embps_durability_failed", "gauge",
       "1 while pushes are refused: an fsync failed (until a restart), or "
       "the data dir is full (until a checkpoint or freed space makes "
       "room).");
  put(t, "embps_durability_failed %d\n", s.durability_failed[0] != 0);
  if (m.hooks.durable_space)
    put_space(t, srv);
  if (m.hooks.durable_stall_ms) {
    head(t, "embps_log_stall_seconds", "gauge",
         "How long the log's oldest write or sync in progress has taken (0: "
         "none); /readyz is 503 past 5 s.");
    put(t, "embps_log_stall_seconds %.3f\n",
        (double)m.hooks.durable_stall_ms(srv->dur) / 1e3);
  }
}

/* /readyz's data dir part (the server is ready, so srv->dur is set when
 * it has one): 1 when it takes pushes, else 0 with the reason in why. */
static int durable_ready(char *why, size_t len) {
  embps_server_t *srv = m.srv;
  if (!srv->dur)
    return 1;
  if (m.hooks.durable_stats) {
    embps_server_stats_t s;
    memset(&s, 0, sizeof s);
    m.hooks.durable_stats(srv->dur, &s);
    if (s.durability_failed[0]) {
      snprintf(why, len, "%s", s.durability_failed);
      return 0;
    }
  }
  uint64_t ms = m.hooks.durable_stall_ms ? m.hooks.durable_stall_ms(srv->dur)
                                         : 0;
  if (ms > EMBPS_WAL_STALL_MS) {
    snprintf(why, len, "the log's write or sync has been in progress for %llu"
             " ms (more than %d): the data dir's disk is not taking writes, "
             "pushes wait", (unsigned long long)ms, EMBPS_WAL_STALL_MS);
    return 0;
  }
  return 1;
}

/* --sync-degrade-ms: whether acknowledgements go on without followers
 * now, and how many times they began to. */
static void put_sync_degrade(text_t *t, embps_server_t *srv) {
  int degraded;
  uint64_t n;
  if (!m.hooks.sync_degrade || !m.hooks.sync_degrade(srv, &degraded, &n))
    return;
  head(t, "embps_sync_degraded", "gauge",
       "1 while this primary acknowledges writes without its "
       "--sync-followers followers (--sync-degrade-ms), else 0.");
  put(t, "embps_sync_degraded %d\n", degraded);
  head(t, "embps_sync_degradations_total", "counter",
       "Times this primary began to acknowledge without its followers.");
  put(t, "embps_sync_degradations_total %llu\n", (unsigned long long)n);
}

/* Replication figures (issue 21): this server's role and position, and a
 * primary's followers one by one. */
static void put_replication(text_t *t, embps_server_t *srv) {
  if (!m.hooks.repl_stats)
    return;
  embps_server_stats_t s;
  memset(&s, 0, sizeof s);
  m.hooks.repl_stats(srv, &s);
  head(t, "embps_repl_role", "gauge", "0 a primary (or alone), 1 a follower.");
  put(t, "embps_repl_role %u\n", s.role);
  head(t, "embps_repl_epoch", "gauge", "The epoch this server's log is in.");
  put(t, "embps_repl_epoch %u\n", s.epoch);
  head(t, "embps_repl_applied_lsn", "gauge",
       "The LSN of the last log record applied.");
  put(t, "embps_repl_applied_lsn %llu\n", (unsigned long long)s.applied_lsn);
  head(t, "embps_repl_lag_records", "gauge",
       "A follower: records behind its primary; a primary: the largest of "
       "its followers'.");
  put(t, "embps_repl_lag_records %llu\n", (unsigned long long)s.lag_records);
  head(t, "embps_repl_lag_seconds", "gauge",
       "The same as a time: how long the oldest record not applied waits.");
  put(t, "embps_repl_lag_seconds %.3f\n", (double)s.lag_ms / 1e3);
  head(t, "embps_repl_bytes_total", "counter",
       "Log bytes shipped to followers (a follower: received).");
  put(t, "embps_repl_bytes_total %llu\n",
      (unsigned long long)s.bytes_shipped);
  if (s.role != 0 || !m.hooks.repl_followers)
    return;
  head(t, "embps_repl_followers", "gauge",
       "Followers fetching, and of them in sync (counted by "
       "--sync-followers).");
  put(t, "embps_repl_followers{state=\"fetching\"} %u\n", s.followers);
  put(t, "embps_repl_followers{state=\"in_sync\"} %u\n",
      s.followers_in_sync);
  embps_follower_info_t v[16];
  size_t n = m.hooks.repl_followers(srv, v, sizeof v / sizeof *v);
  if (!n)
    return;
  head(t, "embps_repl_follower_lag_records", "gauge",
       "Each follower's lag in records.");
  for (size_t i = 0; i < n; i++)
    put(t, "embps_repl_follower_lag_records{follower=\"%s\"} %llu\n",
        v[i].name, (unsigned long long)v[i].lag_records);
  head(t, "embps_repl_follower_lag_seconds", "gauge",
       "Each follower's lag in time.");
  for (size_t i = 0; i < n; i++)
    put(t, "embps_repl_follower_lag_seconds{follower=\"%s\"} %.3f\n",
        v[i].name, (double)v[i].lag_ms / 1e3);
  head(t, "embps_repl_follower_durable_lsn", "gauge",
       "The LSN each follower holds durable (its acknowledgement).");
  for (size_t i = 0; i < n; i++)
    put(t, "embps_repl_follower_durable_lsn{follower=\"%s\"} %llu\n",
        v[i].name, (unsigned long long)v[i].durable_lsn);
  head(t, "embps_repl_follower_bytes_total", "counter",
       "Log bytes shipped to each follower.");
  for (size_t i = 0; i < n; i++)
    put(t, "embps_repl_follower_bytes_total{follower=\"%s\"} %llu\n",
        v[i].name, (unsigned long long)v[i].bytes_shipped);
}

/* The coordinator (issue 22): the role it gives this server, the epoch,
 * the lease's renewals, elections won and lost, and how long writes may
 * still be acknowledged. */
static void put_coordinator(text_t *t, embps_server_t *srv) {
  embps_coord_status_t s;
  if (!m.hooks.coord_status || !m.hooks.coord_status(srv, &s))
    return;
  static const embps_coord_role_t roles[] = {
      EMBPS_COORD_STARTING, EMBPS_COORD_FOLLOWER, EMBPS_COORD_CANDIDATE,
      EMBPS_COORD_PRIMARY};
  head(t, "embps_coord_role", "gauge",
       "1 for the role the coordinator gives this server in its member.");
  for (size_t i = 0; i < sizeof roles / sizeof *roles; i++)
    put(t, "embps_coord_role{role=\"%s\"} %d\n",
        embps_coord_role_name(roles[i]), s.role == roles[i]);
  head(t, "embps_coord_epoch", "gauge",
       "The epoch of the member's primary as elected in etcd.");
  put(t, "embps_coord_epoch %u\n", s.epoch);
  head(t, "embps_coord_lease_renewals_total", "counter",
       "Lease keepalives etcd answered.");
  put(t, "embps_coord_lease_renewals_total %llu\n",
      (unsigned long long)s.renewals);
  head(t, "embps_coord_lease_renewal_failures_total", "counter",
       "Lease keepalives that failed (etcd unreachable, or the lease gone).");
  put(t, "embps_coord_lease_renewal_failures_total %llu\n",
      (unsigned long long)s.renewal_failures);
  head(t, "embps_coord_failovers_total", "counter",
       "Elections this server won (it became primary).");
  put(t, "embps_coord_failovers_total %llu\n",
      (unsigned long long)s.elections_won);
  head(t, "embps_coord_demotions_total", "counter",
       "Times this server, primary, found another elected.");
  put(t, "embps_coord_demotions_total %llu\n",
      (unsigned long long)s.demotions);
  uint64_t now = embps_coord_clock_ns();
  head(t, "embps_coord_write_fence_seconds", "gauge",
       "How long this primary may still acknowledge writes without renewing "
       "its lease (0: it may not).");
  put(t, "embps_coord_write_fence_seconds %.3f\n",
      s.fence_ns > now ? (double)(s.fence_ns - now) / 1e9 : 0.0);
}

/* A label value: \, " and newline escaped (the exposition format). */
static void put_label(text_t *t, const char *v) {
  for (; *v; v++)
    if (*v == '\\' || *v == '"')
      put(t, "\\%c", *v);
    else if (*v == '\n')
      put(t, "\\n");
    else
      put(t, "%c", *v);
}

/* The primary of every member slot the coordinator knows (stats' members:
 * at most EMBPS_STATS_MEMBERS_MAX), so that any server shows a dashboard
 * the whole cluster; primary="" and 0 while a slot elects. */
static void put_members(text_t *t, embps_server_t *srv) {
  embps_server_stats_t s;
  memset(&s, 0, sizeof s);
  if (!m.hooks.coord_members)
    return;
  m.hooks.coord_members(srv, &s);
  if (!s.n_members)
    return;
  head(t, "embps_member_primary_epoch", "gauge",
       "The epoch of each member slot's primary as this server last read "
       "etcd, labelled with its address (0 and \"\": an election).");
  for (uint32_t i = 0; i < s.n_members && i < EMBPS_STATS_MEMBERS_MAX; i++) {
    put(t, "embps_member_primary_epoch{member=\"%u\",primary=\"",
        s.members[i].member);
    put_label(t, s.members[i].primary);
    put(t, "\"} %u\n", s.members[i].epoch);
  }
  free(s.members);
}

/* ------------------------------------------------------------ HTTP */

/* The listener answers probes whatever its peers do. It is
 * libmicrohttpd on epoll, run by a thread of its own (the loop below), so
 * one thread sees every connection: each is tracked from its accept, and
 * one that has not sent a whole request within HTTP_REQUEST_MS is closed
 * however it trickles bytes (HAProxy's `timeout http-request`, nginx's
 * client_header_timeout), as is one still taking its answer after
 * HTTP_ANSWER_MS; above HTTP_CONN_KEEP open connections the ones waiting
 * longest for their request are closed to make room (then the ones
 * taking their answer longest), so a probe, which sends its request at
 * once, always gets in: slow connections from any number of addresses
 * only ever displace each other. HTTP_CONN_MAX leaves room for the
 * connections one turn of the loop accepts. */
#define HTTP_CONN_MAX 64       /* libmicrohttpd's limit */
#define HTTP_CONN_KEEP 48      /* above: the slowest connections closed */
#define HTTP_REQUEST_MS 5000   /* a request must arrive whole within this */
#define HTTP_ANSWER_MS 30000   /* and its answer be taken within this */
#define HTTP_IDLE_S 10         /* libmicrohttpd's inactivity timeout */
#define HTTP_LOOP_MS 100       /* the loop wakes at least this often */

/* A connection of the listener (its socket context); HTTP thread only. */
typedef struct hconn {
  struct hconn *prev, *next; /* in its list, oldest first */
  int list;                  /* 0 none, WAITING, ANSWERING */
  int fd;
  int doomed;                /* shut down, its close not seen yet */
  uint64_t since_ns;         /* in its list since */
} hconn_t;

enum { WAITING = 1, ANSWERING = 2 }; /* for a request; taking the answer */

static struct {
  pthread_t thread;
  atomic_int stopping;
  struct {
    hconn_t *head, *tail;
  } list[3];
  unsigned open, doomed;
} hl;

static void conn_unlink(hconn_t *h) {
  if (!h->list)
    return;
  hconn_t **head = &hl.list[h->list].head, **tail = &hl.list[h->list].tail;
  *(h->prev ? &h->prev->next : head) = h->next;
  *(h->next ? &h->next->prev : tail) = h->prev;
  h->prev = h->next = NULL;
  h->list = 0;
}

/* h is in list from now on. */
static void conn_move(hconn_t *h, int list) {
  conn_unlink(h);
  h->since_ns = embps_now_ns();
  h->prev = hl.list[list].tail;
  *(h->prev ? &h->prev->next : &hl.list[list].head) = h;
  hl.list[list].tail = h;
  h->list = list;
}

static void on_connection(void *cls, struct MHD_Connection *conn,
                          void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  hconn_t *h = *socket_context;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci || !(h = calloc(1, sizeof *h)))
      return; /* untracked: libmicrohttpd's timeout still closes it */
    h->fd = ci->connect_fd;
    *socket_context = h;
    hl.open++;
    conn_move(h, WAITING);
  } else if (h) { /* closed */
    conn_unlink(h);
    hl.open--;
    hl.doomed -= h->doomed;
    free(h);
    *socket_context = NULL;
  }
}

static hconn_t *hconn_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

/* A request is done: a kept-alive connection waits for the next one. */
static void on_completed(void *cls, struct MHD_Connection *conn,
                         void **state, enum MHD_RequestTerminationCode toe) {
  hconn_t *h = hconn_of(conn);
  if (h && !h->doomed && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK)
    conn_move(h, WAITING);
}

/* Closes h (shutdown: libmicrohttpd sees the end on its next turn and
 * closes the socket itself). */
static void doom(hconn_t *h) {
  conn_unlink(h);
  h->doomed = 1;
  hl.doomed++;
  shutdown(h->fd, SHUT_RDWR);
}

/* Closes the connections past their time, then, above HTTP_CONN_KEEP,
 * the slowest: waiting longest for a request, then taking an answer
 * longest. */
static void sweep(void) {
  const uint64_t now = embps_now_ns();
  const uint64_t limit[3] = {0, HTTP_REQUEST_MS * 1000000ull,
                             HTTP_ANSWER_MS * 1000000ull};
  for (int l = WAITING; l <= ANSWERING; l++)
    while (hl.list[l].head && now - hl.list[l].head->since_ns > limit[l])
      doom(hl.list[l].head);
  for (int l = WAITING; l <= ANSWERING; l++)
    while (hl.list[l].head && hl.open - hl.doomed > HTTP_CONN_KEEP)
      doom(hl.list[l].head);
}

static void *http_main(void *arg) {
  (void)arg;
  while (!atomic_load(&hl.stopping)) {
    MHD_run_wait(m.daemon, HTTP_LOOP_MS);
    sweep();
  }
  return NULL;
}

/* owned: 0 body is static text, 1 the malloc'd exposition, 2 malloc'd
 * text. */
static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status,
                               char *body, size_t len, int owned) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      len, body, owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
  if (!r) {
    if (owned)
      free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                          status == MHD_HTTP_OK && owned == 1
                              ? "text/plain; version=0.0.4; charset=utf-8"
                              : "text/plain; charset=utf-8");
  enum MHD_Result rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

#define STATIC_(conn, status, text)                                            \
  respond((conn), (status), (char *)(text), sizeof(text) - 1, 0)

/* Whether the request may see table names: always without a token; with
 * one, when it carries "Authorization: Bearer TOKEN" (a token the server
 * accepts now: either during a rotation, the new one after a reload). */
static int names_allowed(struct MHD_Connection *conn) {
  const embps_server_config_t *cfg = &m.srv->cfg;
  if (!cfg->has_token)
    return 1;
  const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                              MHD_HTTP_HEADER_AUTHORIZATION);
  if (!a || strncasecmp(a, "Bearer ", 7))
    return 0;
  return embps_auth_check(&m.srv->auth, a + 7, strlen(a + 7));
}

static enum MHD_Result readyz(struct MHD_Connection *conn) {
  if (!atomic_load(&m.ready))
    return STATIC_(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "not ready\n");
  char why[400];
  if (!durable_ready(why, sizeof why)) {
    char *body = malloc(sizeof why + 16);
    if (!body)
      return STATIC_(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    int n = snprintf(body, sizeof why + 16, "not ready: %s\n", why);
    return respond(conn, MHD_HTTP_SERVICE_UNAVAILABLE, body, (size_t)n, 2);
  }
  if (m.hooks.repl_ready && !m.hooks.repl_ready(m.srv, why, sizeof why)) {
    char *body = malloc(sizeof why + 16);
    if (!body)
      return STATIC_(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    int n = snprintf(body, sizeof why + 16, "not ready: %s\n", why);
    return respond(conn, MHD_HTTP_SERVICE_UNAVAILABLE, body, (size_t)n, 2);
  }
  if (!m.hooks.cluster_ready)
    return STATIC_(conn, MHD_HTTP_OK, "ready\n");
  char *body;
  size_t len;
  int ready = m.hooks.cluster_ready(&body, &len);
  if (!body)
    return STATIC_(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  if (!names_allowed(conn)) { /* the body names tables */
    free(body);
    return ready ? STATIC_(conn, MHD_HTTP_OK, "ready\n")
                 : STATIC_(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                           "not ready: the cluster's tables are not all "
                           "here (the body names them for a request with "
                           "the token)\n");
  }
  return respond(conn, ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE,
                 body, len, 2);
}

static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn,
                               const char *url, const char *method,
                               const char *version, const char *upload,
                               size_t *upload_len, void **state) {
  hconn_t *h = hconn_of(conn);
  if (h && h->list == WAITING) /* a whole request: its answer comes */
    conn_move(h, ANSWERING);
  if (strcmp(method, MHD_HTTP_METHOD_GET) &&
      strcmp(method, MHD_HTTP_METHOD_HEAD))
    return STATIC_(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "GET only\n");
  if (*upload_len) /* a GET with a body: ignore the body */
    *upload_len = 0;
  if (!strcmp(url, "/healthz")) {
    char why[160];
    if (!embps_watch_check((uint64_t)m.srv->cfg.stall_timeout_s * 1000, why,
                           sizeof why))
      return STATIC_(conn, MHD_HTTP_OK, "ok\n");
    text_t t = {0};
    put(&t, "%s\n", why);
    if (t.failed) {
      free(t.p);
      return STATIC_(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    }
    return respond(conn, MHD_HTTP_SERVICE_UNAVAILABLE, t.p, t.len, 2);
  }
  if (!strcmp(url, "/readyz"))
    return readyz(conn);
  if (strcmp(url, "/metrics"))
    return STATIC_(conn, MHD_HTTP_NOT_FOUND,
                   "not found: try /metrics, /healthz, /readyz\n");
  text_t t = {0};
  put_server(&t, m.srv);
  put_process(&t, m.srv);
  if (atomic_load(&m.ready)) { /* srv->dur is set up once restored */
    put_durability(&t, m.srv);
    put_replication(&t, m.srv);
    put_sync_degrade(&t, m.srv);
    put_coordinator(&t, m.srv);
    put_members(&t, m.srv);
  }
  put_tables(&t, m.srv, names_allowed(conn));
  if (t.failed) {
    free(t.p);
    return STATIC_(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  }
  return respond(conn, MHD_HTTP_OK, t.p, t.len, 1);
}

static int write_port_file(const char *path, unsigned port) {
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f)
    return -1;
  fprintf(f, "%u\n", port);
  if (fclose(f) || rename(tmp, path)) {
    remove(tmp);
    return -1;
  }
  return 0;
}

static int is_loopback(const struct sockaddr *a) {
  if (a->sa_family == AF_INET)
    return ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24 == 127;
  if (a->sa_family != AF_INET6)
    return 0;
  const struct in6_addr *in6 = &((const struct sockaddr_in6 *)a)->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(in6) ||
         (IN6_IS_ADDR_V4MAPPED(in6) && in6->s6_addr[12] == 127);
}

int embps_metrics_start(embps_server_t *srv,
                        const embps_metrics_hooks_t *hooks) {
  const embps_server_config_t *cfg = &srv->cfg;
  if (!cfg->metrics_host[0])
    return 0;
  if (m.daemon) {
    LOG_ERROR("--metrics-listen: another server of this process serves "
              "/metrics");
    return -1;
  }
  m.srv = srv;
  m.hooks = *hooks;
  m.start_s = time(NULL);
  char port[16];
  snprintf(port, sizeof port, "%d", cfg->metrics_port);
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *res;
  int rc = getaddrinfo(cfg->metrics_host, port, &hints, &res);
  if (rc) {
    LOG_ERROR("--metrics-listen: cannot resolve %s: %s", cfg->metrics_host,
              gai_strerror(rc));
    return -1;
  }
  if (!cfg->has_token && !cfg->insecure && !is_loopback(res->ai_addr)) {
    LOG_ERROR("--metrics-listen %s is not a loopback address and there is "
              "no --auth-token-file: anyone who can reach it could read "
              "every table's name and traffic (give a token: then only "
              "requests carrying it see table names; or --insecure to serve "
              "anyway; README, Security)", cfg->metrics_host);
    freeaddrinfo(res);
    return -1;
  }
  unsigned flags = MHD_USE_EPOLL; /* run by http_main */
  if (res->ai_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  memset(&hl, 0, sizeof hl);
  m.daemon = MHD_start_daemon(
      flags, 0, NULL, NULL, on_http, NULL, MHD_OPTION_SOCK_ADDR, res->ai_addr,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_CONN_MAX,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_S,
      MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
  freeaddrinfo(res);
  if (!m.daemon) {
    LOG_ERROR("--metrics-listen: cannot serve HTTP on %s:%d (address in "
              "use?)", cfg->metrics_host, cfg->metrics_port);
    return -1;
  }
  if (pthread_create(&hl.thread, NULL, http_main, NULL)) {
    LOG_ERROR("--metrics-listen: cannot start the HTTP thread");
    MHD_stop_daemon(m.daemon);
    m.daemon = NULL;
    return -1;
  }
  const union MHD_DaemonInfo *di =
      MHD_get_daemon_info(m.daemon, MHD_DAEMON_INFO_BIND_PORT);
  unsigned bound = di ? di->port : (unsigned)cfg->metrics_port;
  if (cfg->metrics_port_file[0] &&
      write_port_file(cfg->metrics_port_file, bound)) {
    LOG_ERROR("cannot write --metrics-port-file %s", cfg->metrics_port_file);
    embps_metrics_stop();
    return -1;
  }
  LOG_INFO("metrics on http://%s:%u/metrics (and /healthz, /readyz)",
           cfg->metrics_host, bound);
  return 0;
}

void embps_metrics_stop(void) {
  if (!m.daemon)
    return;
  atomic_store(&hl.stopping, 1);
  pthread_join(hl.thread, NULL);
  MHD_stop_daemon(m.daemon); /* closes the connections: hconns freed */
  m.daemon = NULL;
}
