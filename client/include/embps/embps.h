/*
 * embps.h - the public API of libembps, the embps client library.
 *
 * A client (embps_client_t) holds one TCP connection per server of a
 * cluster. Every id is routed to exactly one server by a stable hash
 * (jump consistent hash over K servers); a pull or push is split by server,
 * sent to all of them at once, and gathered back in the caller's order.
 *
 * Conventions, as in libuv and LMDB:
 *  - every int-returning call returns 0 or a negative code: -errno for
 *    system errors, EMBPS_E* (their own band, below -30000) for embps errors;
 *    the same codes travel on the wire, so a server's refusal reaches the
 *    caller unchanged, and embps_client_last_error() gives its message;
 *  - the library never aborts and never prints;
 *  - an embps_client_t is used by one thread at a time (make one per thread);
 *  - buffers passed to the asynchronous calls stay owned by the caller and
 *    must stay valid, and unchanged, until embps_wait() returns for that
 *    ticket: a push to a single server is sent straight from them;
 *  - memory the library hands over is released by the library's own call
 *    (embps_tables_free, embps_stats_free, embps_scan_chunk_free).
 *
 * Structs and the ABI. A program built against this header keeps working
 * with a later libembps of the same major version, so a struct that crosses
 * the library boundary grows in one of two ways:
 *  - one the caller fills in for a single call and passes alone
 *    (embps_client_options_t, embps_table_alter_t) begins with `size`, set
 *    to the size of the struct the caller was compiled with by its init
 *    function (embps_client_options_init(), embps_table_alter_init()) or as
 *    `.size = sizeof o`. The library reads only the fields that size covers;
 *    the rest take their defaults. A caller compiled with a newer, larger
 *    struct may leave its new fields zero; bytes the library does not know
 *    that are not zero, or a size of 0, are refused (EMBPS_EINVAL). Such a
 *    struct can grow without limit.
 *  - one that also comes back from the library, or sits in an array or in
 *    another struct (embps_table_spec_t, embps_table_info_t,
 *    embps_server_stats_t, embps_checkpoint_info_t, embps_scan_chunk_t,
 *    embps_slices_t), keeps its size: it ends in `reserved` words, and a
 *    new field takes some of them, so arrays keep their stride and the
 *    fields of an enclosing struct their offsets. Zero there means what
 *    the library did before the field existed; the library writes zeros
 *    there, and refuses a spec whose reserved words are not zero.
 * A size field alone would not do for the second kind: a caller indexes an
 * array of stats with its own sizeof, and a table info holds a spec by value.
 * embps_abi_size() gives each struct's size in this library, for bindings
 * that mirror them (the Python package checks its ctypes mirrors with it).
 *
 * The local NN helpers for workers (lookup, bag lookup, their backward
 * passes, clipping) are in <embps/nn.h>.
 */
#ifndef EMBPS_EMBPS_H
#define EMBPS_EMBPS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <embps/version.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(EMBPS_BUILDING_LIBRARY)
#define EMBPS_EXTERN __attribute__((visibility("default")))
#else
#define EMBPS_EXTERN
#endif

#define EMBPS_PROTOCOL_VERSION 1

/* The library's version, EMBPS_VERSION_HEX and EMBPS_VERSION_STRING of the
 * header it was built with (embps/version.h); compare them with this
 * program's macros to detect a header and a library that differ. */
EMBPS_EXTERN unsigned embps_version(void);
EMBPS_EXTERN const char *embps_version_string(void);

/* The size in bytes of public struct `type_name` ("embps_table_spec_t", and
 * every other struct of embps.h and nn.h) in this library, or 0 for a name
 * it does not know. */
EMBPS_EXTERN size_t embps_abi_size(const char *type_name);

/* X(NAME, code, message). Codes are stable: they are on the wire. */
#define EMBPS_ERRNO_MAP(X)                                                     \
  X(EINVAL, -30001, "invalid argument")                                        \
  X(ENOTABLE, -30002, "unknown table")                                         \
  X(EEXIST, -30003, "table already exists")                                    \
  X(EDIM, -30004, "dimension mismatch")                                        \
  X(ERANGE, -30005, "index out of range")                                      \
  X(ECOUNT, -30006, "indices and values counts disagree")                      \
  X(ENONFINITE, -30007, "non-finite value")                                    \
  X(EFRAMESIZE, -30008, "frame too large")                                     \
  X(EPROTO, -30009, "malformed frame")                                         \
  X(EVERSION, -30010, "unsupported protocol version")                          \
  X(EAUTH, -30011, "authentication failed")                                    \
  X(EWRONGSERVER, -30012, "id belongs to another server")                      \
  X(ENOMEM, -30013, "out of memory")                                           \
  X(ETIMEDOUT, -30014, "timed out")                                            \
  X(ECONN, -30015, "connection failed")                                        \
  X(ESHUTDOWN, -30016, "server shutting down")                                 \
  X(EKIND, -30017, "unknown request kind")                                     \
  X(EPARAM, -30018, "invalid table parameter")                                 \
  X(ELIMIT, -30019, "limit exceeded")                                          \
  X(ESTEP, -30020, "synchronous step error")                                   \
  X(EINTERNAL, -30021, "internal error")                                      \
  X(EIO, -30022, "data dir I/O error")                                         \
  X(ENODATADIR, -30023, "server has no --data-dir")                           \
  X(EBADFILE, -30024, "bad export/import file")                               \
  X(EPARTIAL, -30025, "on some servers only")                                   \
  X(ENOTPRIMARY, -30026, "not the primary: writes go to its primary")          \
  X(ENOREPLICAS, -30027, "not enough followers in sync")                      \
  X(EDIVERGED, -30028, "log diverged from the primary's history")             \
  X(ESNAPSHOT, -30029, "records no longer held: a snapshot is needed")

enum embps_errno {
#define EMBPS_ERRNO_ENUM_(name, code, msg) EMBPS_##name = (code),
  EMBPS_ERRNO_MAP(EMBPS_ERRNO_ENUM_)
#undef EMBPS_ERRNO_ENUM_
};

/* The message for a code (embps or -errno); never NULL, static storage. */
EMBPS_EXTERN const char *embps_strerror(int code);
/* The symbolic name ("EMBPS_ERANGE", "ECONNREFUSED", ...); never NULL. */
EMBPS_EXTERN const char *embps_err_name(int code);

/* ------------------------------------------------------------------ tables */

typedef enum {
  EMBPS_OPT_SGD = 0,
  EMBPS_OPT_ADAGRAD = 1,
  EMBPS_OPT_ADAM = 2,
  EMBPS_OPT_FTRL = 3,
} embps_optimizer_t;

typedef enum {
  EMBPS_INIT_ZEROS = 0,
  EMBPS_INIT_CONSTANT = 1, /* every element = init_value */
  EMBPS_INIT_UNIFORM = 2,  /* U(-init_value, init_value) */
  EMBPS_INIT_NORMAL = 3,   /* N(0, init_value^2) */
} embps_init_t;

/* Storage type of a table's weights (optimizer state is always float32).
 * Pulls and pushes carry float32 either way: the server widens on pull
 * (exact) and rounds to nearest even on push. */
typedef enum {
  EMBPS_DTYPE_F32 = 0,
  EMBPS_DTYPE_F16 = 1,  /* IEEE 754 binary16 */
  EMBPS_DTYPE_BF16 = 2, /* bfloat16: float32's upper 16 bits */
} embps_dtype_t;

/* Which rows go first when a dynamic table is at max_rows. */
typedef enum {
  EMBPS_EVICT_LRU = 0, /* least recently pushed first */
  EMBPS_EVICT_LFU = 1, /* least often pushed first, then LRU */
} embps_evict_t;

#define EMBPS_TABLE_NAME_MAX 128
#define EMBPS_DIM_MAX 65536
/* The largest step counter a table reaches (2^53: exact in a double, as
 * Adam's bias correction computes with it; ~285 years at a million pushes
 * a second). Setting a larger one is refused; a push at it fails with
 * EMBPS_ELIMIT. */
#define EMBPS_STEP_MAX (1ULL << 53)

/*
 * The fields of a table spec after its name and dim, written once as
 * X(type, name, kind, doc); kind is NUM (an integer), REAL (a double), FLAG
 * (0 or 1) or ENUM (one of the enums above). The struct below, the wire
 * codec and the comparison of two specs are generated from it. The last
 * seven apply to dynamic tables only (README "Admission and eviction");
 * 0 turns each off.
 */
#define EMBPS_TABLE_SPEC_FIELDS(X)                                             \
  X(uint64_t, rows, NUM, "dense: ids in [0, rows); 0 with dynamic")            \
  X(int, dynamic, FLAG, "any int64 id")                                        \
  X(embps_optimizer_t, optimizer, ENUM, "the update rule")                     \
  X(double, lr, REAL, "learning rate")                                         \
  X(double, eps, REAL, "adagrad, adam: added to the denominator")             \
  X(double, beta1, REAL, "adam: first-moment decay")                           \
  X(double, beta2, REAL, "adam: second-moment decay")                          \
  X(double, initial_accumulator, REAL, "adagrad, ftrl: state of a new row")   \
  X(double, l1, REAL, "ftrl: L1 regularisation")                               \
  X(double, l2, REAL, "ftrl: L2 regularisation")                               \
  X(double, lr_power, REAL, "ftrl: learning-rate power (<= 0)")                \
  X(double, weight_decay, REAL, "adam: decoupled weight decay (AdamW)")        \
  X(embps_init_t, init, ENUM, "how a row never pushed starts")                 \
  X(double, init_value, REAL, "the init's constant, bound or std")             \
  X(uint64_t, seed, NUM, "seed of random inits and admission")                 \
  X(int, has_padding, FLAG, "padding_id is on")                                \
  X(int64_t, padding_id, NUM, "an id whose row stays as initialised")          \
  X(embps_dtype_t, dtype, ENUM, "storage type of the weights")                 \
  X(uint32_t, sync_workers, NUM, "workers per synchronous step; 0: async")     \
  X(uint32_t, admit_after, NUM, "a row is made on the Nth push of its id")     \
  X(double, admit_probability, REAL, "(0, 1]: admitted iff hash < P")          \
  X(uint64_t, admit_sketch_bytes, NUM, "count-min sketch per server; 0: 1 MiB")\
  X(uint64_t, ttl_steps, NUM, "rows not pushed in the last S steps go")        \
  X(uint64_t, max_rows, NUM, "cluster-wide; each server N / servers")          \
  X(embps_evict_t, evict, ENUM, "at max_rows: LRU or LFU")                     \
  X(double, evict_l2_below, REAL, "rows of L2 norm < X go at a checkpoint")

typedef struct {
  char name[EMBPS_TABLE_NAME_MAX]; /* [A-Za-z0-9_.-], 1..127 bytes */
  uint32_t dim;
#define EMBPS_MEMBER_(type, name, kind, doc) type name;
  EMBPS_TABLE_SPEC_FIELDS(EMBPS_MEMBER_)
#undef EMBPS_MEMBER_
  uint64_t reserved[16]; /* zero ("Structs and the ABI" above) */
} embps_table_spec_t;

/* Fills spec with the defaults of DESIGN.md for `optimizer` (lr 0.01 for
 * every optimizer; adagrad eps 1e-10; adam b1 0.9 b2 0.999 eps 1e-8; ftrl
 * initial accumulator 0.1, lr_power -0.5), init zeros, no padding; every
 * other field, reserved words included, 0. */
EMBPS_EXTERN void embps_table_spec_init(embps_table_spec_t *spec,
                                        const char *name, uint32_t dim,
                                        embps_optimizer_t optimizer);
/* Checks every field; returns 0 or EMBPS_EPARAM with a message in `why`
 * (may be NULL) of at most why_len bytes. The server runs the same check. */
EMBPS_EXTERN int embps_table_spec_check(const embps_table_spec_t *spec,
                                        char *why, size_t why_len);
/* What embps_alter_table may change during training: the hyperparameters
 * that leave a table's rows and optimizer state as they are (never the
 * optimizer, dim, dtype, rows, init, seed, padding, sync workers, nor the
 * initial accumulator, which fresh rows' state starts from). A bit in `set`
 * per field to change. */
#define EMBPS_ALTER_LR (1u << 0)
#define EMBPS_ALTER_EPS (1u << 1)
#define EMBPS_ALTER_BETA1 (1u << 2)
#define EMBPS_ALTER_BETA2 (1u << 3)
#define EMBPS_ALTER_L1 (1u << 4)
#define EMBPS_ALTER_L2 (1u << 5)
#define EMBPS_ALTER_LR_POWER (1u << 6)
#define EMBPS_ALTER_WEIGHT_DECAY (1u << 7)
#define EMBPS_ALTER_ALL 0xffu

/* The alterable fields, X(name, bit), in the order of their bits: each is
 * the spec field of the same name (a double). */
#define EMBPS_TABLE_ALTER_FIELDS(X)                                            \
  X(lr, EMBPS_ALTER_LR)                                                        \
  X(eps, EMBPS_ALTER_EPS)                                                      \
  X(beta1, EMBPS_ALTER_BETA1)                                                  \
  X(beta2, EMBPS_ALTER_BETA2)                                                  \
  X(l1, EMBPS_ALTER_L1)                                                        \
  X(l2, EMBPS_ALTER_L2)                                                        \
  X(lr_power, EMBPS_ALTER_LR_POWER)                                            \
  X(weight_decay, EMBPS_ALTER_WEIGHT_DECAY)

typedef struct {
  size_t size;  /* sizeof(embps_table_alter_t): embps_table_alter_init() */
  unsigned set; /* EMBPS_ALTER_* bits */
#define EMBPS_MEMBER_(name, bit) double name;
  EMBPS_TABLE_ALTER_FIELDS(EMBPS_MEMBER_)
#undef EMBPS_MEMBER_
} embps_table_alter_t;

/* Nothing set, and a->size the size of the struct this program has. */
static inline void embps_table_alter_init(embps_table_alter_t *a) {
  memset(a, 0, sizeof *a);
  a->size = sizeof *a;
}

/* Writes the fields of `alter` that are set into spec, then checks spec as
 * embps_table_spec_check does. 0, EMBPS_EPARAM with `why` (nothing set, an
 * unknown bit, or a value out of range) or EMBPS_EINVAL with `why` (a size
 * of 0, a bit set for a field past alter->size, or unknown bytes past the
 * fields this library knows); spec is then unchanged. */
EMBPS_EXTERN int embps_table_spec_alter(embps_table_spec_t *spec,
                                        const embps_table_alter_t *alter,
                                        char *why, size_t why_len);
EMBPS_EXTERN const char *embps_optimizer_name(embps_optimizer_t opt);
/* Parses "sgd", "adagrad", ...; returns 0 or EMBPS_EINVAL. */
EMBPS_EXTERN int embps_optimizer_parse(const char *s, embps_optimizer_t *out);
/* "f32", "f16", "bf16" ("unknown" otherwise); never NULL. */
EMBPS_EXTERN const char *embps_dtype_name(embps_dtype_t dtype);
/* Parses "f32", "f16", "bf16"; returns 0 or EMBPS_EINVAL. */
EMBPS_EXTERN int embps_dtype_parse(const char *s, embps_dtype_t *out);

/* A table's counters after its spec, X(type, name, merge, doc): merge says
 * how a cluster's servers combine into one figure (SUM, or the MAX). */
#define EMBPS_TABLE_INFO_FIELDS(X)                                             \
  X(uint64_t, rows_allocated, SUM, "rows materialised by a push")              \
  X(uint64_t, bytes_used, SUM, "memory the table holds")                       \
  X(uint64_t, pushes, SUM, "pushes applied")                                   \
  X(uint64_t, pulls, SUM, "pulls served")                                      \
  X(uint64_t, step, MAX, "the step counter (Adam's t)")                        \
  X(uint64_t, rows_admitted, SUM, "rows materialised by admission so far")     \
  X(uint64_t, rows_pending, SUM, "ids counted but not admitted (estimate)")    \
  X(uint64_t, evicted_ttl, SUM, "rows evicted for their age (ttl_steps)")      \
  X(uint64_t, evicted_capacity, SUM, "rows evicted at max_rows")               \
  X(uint64_t, evicted_l2, SUM, "rows evicted for a small L2 norm")             \
  X(uint64_t, capacity, SUM, "max_rows share held here (0: none)")             \
  X(uint64_t, evict_stall_max_us, MAX, "longest eviction work under a lock")

typedef struct {
  embps_table_spec_t spec;
#define EMBPS_MEMBER_(type, name, merge, doc) type name;
  EMBPS_TABLE_INFO_FIELDS(EMBPS_MEMBER_)
#undef EMBPS_MEMBER_
  uint64_t reserved[8]; /* zero */
} embps_table_info_t;

/*
 * The figures of a server's stats, written once as X(type, name, source,
 * doc): the struct below, the wire codec, the server's stats reply and the
 * CLI's `stats --json` are generated from it. source: CONFIG (the server's
 * flags), UPTIME, TRAFFIC (counted since the server started, but
 * connections: open now), DURABLE (the data dir: 0 without --data-dir).
 */
#define EMBPS_SERVER_STATS_FIELDS(X)                                           \
  X(uint32_t, cluster_index, CONFIG, "its place in the cluster")               \
  X(uint32_t, cluster_size, CONFIG, "servers in the cluster")                  \
  X(uint32_t, io_threads, CONFIG, "threads serving connections")               \
  X(uint32_t, shards, CONFIG, "lock stripes per table")                        \
  X(uint64_t, uptime_ms, UPTIME, "time since it started")                      \
  X(uint64_t, connections, TRAFFIC, "connections open now")                    \
  X(uint64_t, requests, TRAFFIC, "requests received")                          \
  X(uint64_t, pulls, TRAFFIC, "pulls served")                                  \
  X(uint64_t, pushes, TRAFFIC, "pushes applied")                               \
  X(uint64_t, pull_rows, TRAFFIC, "rows pulled")                               \
  X(uint64_t, push_rows, TRAFFIC, "unique rows pushed")                        \
  X(uint64_t, errors, TRAFFIC, "requests refused")                             \
  X(uint64_t, bytes_in, TRAFFIC, "bytes read from clients")                    \
  X(uint64_t, bytes_out, TRAFFIC, "bytes sent to clients")                     \
  X(uint64_t, checkpoint_unix_s, DURABLE, "last checkpoint: when (0: none)")   \
  X(uint64_t, checkpoint_bytes, DURABLE, "its size")                           \
  X(uint64_t, checkpoint_ms, DURABLE, "how long it took")                      \
  X(uint64_t, checkpoint_lsn, DURABLE, "the log position it covers")           \
  X(uint64_t, log_bytes, DURABLE, "log written since then")

/*
 * Replication figures (issue 21), X(type, name, doc), after the durability
 * fields (they took reserved words). A primary's lag figures are the
 * largest of its followers' (each follower's own: /metrics).
 */
#define EMBPS_SERVER_REPL_FIELDS(X)                                            \
  X(uint32_t, role, "0 primary (or alone), 1 follower")                        \
  X(uint32_t, epoch, "the epoch its log is in")                                \
  X(uint64_t, applied_lsn, "the LSN of the last record applied")              \
  X(uint32_t, followers, "primary: followers fetching")                        \
  X(uint32_t, followers_in_sync, "primary: of them, caught up")                \
  X(uint64_t, lag_records, "records a follower is behind its primary")        \
  X(uint64_t, lag_ms, "how long a follower is behind its primary")            \
  X(uint64_t, bytes_shipped, "log bytes sent to followers (or received)")

/* The primary of one member slot, as a coordinated server (issue 22,
 * --coordinator) knows it (embps_server_stats_t.members). */
typedef struct {
  uint32_t member;  /* its slot (the index of its entry in the list) */
  uint32_t epoch;   /* the primary's epoch (0 with no primary) */
  char primary[128]; /* its host:port; empty while an election is on */
} embps_member_primary_t;
/* The most member primaries a stats reply carries. */
#define EMBPS_STATS_MEMBERS_MAX 1024

typedef struct {
  char address[64]; /* host:port of the server these come from */
  char version[32];
#define EMBPS_MEMBER_(type, name, source, doc) type name;
  EMBPS_SERVER_STATS_FIELDS(EMBPS_MEMBER_)
#undef EMBPS_MEMBER_
  size_t n_tables;
  embps_table_info_t *tables; /* released by embps_stats_free */
  /* durability: empty without --data-dir */
  char data_dir[256];
  char fsync[16];              /* always, everysec, never */
  char durability_failed[256]; /* why pushes are refused, or empty */
  /* replication: zero on a server that neither follows nor is followed */
#define EMBPS_MEMBER_(type, name, doc) type name;
  EMBPS_SERVER_REPL_FIELDS(EMBPS_MEMBER_)
#undef EMBPS_MEMBER_
  char primary[64];      /* a follower's primary (host:port), else empty */
  /* coordinated (--coordinator): the primary of every member slot of its
   * cluster as the server last read them from etcd, n_members of them in
   * slot order (released by embps_stats_free); else NULL and 0 */
  union {
    embps_member_primary_t *members;
    uint64_t members_word_; /* keeps the struct's size on 32-bit targets */
  };
  uint32_t n_members;
  /* a primary with --sync-degrade-ms: 1 while it acknowledges writes
   * without its --sync-followers followers (degraded), else 0 */
  uint32_t sync_degraded;
} embps_server_stats_t;

/* What one server's checkpoint covers (embps_checkpoint), X(name, doc). */
#define EMBPS_CHECKPOINT_INFO_FIELDS(X)                                        \
  X(lsn, "the log position it covers")                                         \
  X(bytes, "its size")                                                         \
  X(duration_ms, "how long it took")                                           \
  X(unix_s, "when it was taken")

typedef struct {
#define EMBPS_MEMBER_(name, doc) uint64_t name;
  EMBPS_CHECKPOINT_INFO_FIELDS(EMBPS_MEMBER_)
#undef EMBPS_MEMBER_
  uint64_t reserved[4]; /* zero */
} embps_checkpoint_info_t;

/* ------------------------------------------------------------------ client */

typedef struct embps_client embps_client_t;
typedef struct embps_ticket embps_ticket_t;

/* The servers one entry of a server list may name (a member's primary and
 * its followers). */
#define EMBPS_MEMBER_SERVERS_MAX 8

/* Where reads go (embps_client_options_t.read_from). */
#define EMBPS_READ_PRIMARY 0  /* every request to the member's primary */
#define EMBPS_READ_FOLLOWER 1 /* pulls, scans, describes to a follower */

typedef struct {
  /* sizeof(embps_client_options_t): embps_client_options_init() sets it */
  size_t size;
  /* "host:port[,host:port...]"; NULL: $EMBPS_SERVERS, else 127.0.0.1:7070.
   * The order is the cluster order: entry I is --cluster-index I. An entry
   * may list the servers of one member, its primary and its followers, in
   * any order, separated by `|` ("a:7070|b:7070,c:7070|d:7070"; at most
   * EMBPS_MEMBER_SERVERS_MAX). Every request then goes to the member's
   * primary: the first server listed at first; a server that says it is
   * a follower (in its hello, or refusing a write with EMBPS_ENOTPRIMARY)
   * sends the client to the primary it names, listed or not; a server
   * that cannot be reached to the member's next server. Both happen
   * inside the retry window (retry_ms), and a push sent again keeps its
   * (client id, sequence), so a push retried across a promotion is
   * applied once. An entry of one server is a member too (a seed: a
   * follower listed alone sends the client to the primary it names, e.g.
   * a Kubernetes Service in front of a member's servers), unless
   * servers_as_listed is set. */
  const char *servers;
  /* the auth token; NULL: read $EMBPS_TOKEN_FILE if set, else none */
  const char *token;
  int timeout_ms; /* per attempt of a call; 0: 30000 */
  /* How long a call may go on retrying after its connection broke, timed
   * out or its server said it is shutting down: the library reconnects
   * (with a short backoff) and sends the same requests again, in their
   * order. Pushes keep their (client id, sequence), so a push the server
   * already applied is acknowledged as a duplicate, never applied twice;
   * pulls and describe/list/stats are reads. A server's answer (validation
   * errors, EMBPS_EIO, ...) is never retried, nor are create and drop.
   * 0: 30000; negative: never retry. */
  int retry_ms;
  /* EMBPS_READ_PRIMARY (0) or EMBPS_READ_FOLLOWER: pulls, scans and
   * embps_describe_table (and the description a pull needs) of a member listing several servers
   * go to one of its followers, the primary when none answers; each reply
   * says the LSN it read at (embps_client_read_lsn). A follower's rows are
   * the primary's at that LSN, which may be behind the primary's (and
   * behind this client's own pushes). Everything else goes to the
   * primary. */
  int read_from;
  /* Nonzero: an entry of one server is that server alone, whatever its
   * role: a follower listed alone serves reads and refuses writes
   * (EMBPS_ENOTPRIMARY) rather than sending the client to its primary.
   * For tools that address one server (embps promote, stats, tables,
   * checkpoint, backup). Entries of several servers are members either
   * way. */
  int servers_as_listed;
} embps_client_options_t;

/* Every option at its default (0, NULL), and o->size the size of the struct
 * this program has. */
static inline void embps_client_options_init(embps_client_options_t *o) {
  memset(o, 0, sizeof *o);
  o->size = sizeof *o;
}

/* Connects to every server and says hello (protocol version, token).
 * opts may be NULL (every default); otherwise opts->size must be set
 * (embps_client_options_init): EMBPS_EINVAL, before any connection, for a
 * size of 0 or unknown bytes past the fields this library knows. On success
 * *out owns the connections; on failure *out is set to NULL and, if errbuf
 * is not NULL, a message is written there. */
EMBPS_EXTERN int embps_client_create(const embps_client_options_t *opts,
                                     embps_client_t **out, char *errbuf,
                                     size_t errbuf_len);
/* Like embps_client_create, but connects only to server `member` (its
 * cluster index: its position in the list, which must still be the whole
 * cluster) and sends it alone the whole-cluster requests: stats, list,
 * describe, create, drop. Pulls and pushes still go to each id's owner
 * (connecting on first use). Refuses a member past the list (EMBPS_EINVAL). */
EMBPS_EXTERN int embps_client_create_member(const embps_client_options_t *opts,
                                            uint32_t member,
                                            embps_client_t **out,
                                            char *errbuf, size_t errbuf_len);
/* Closes every connection; NULL is accepted. Pending tickets are freed. */
EMBPS_EXTERN void embps_client_destroy(embps_client_t *c);
/* The message of the last failed call on c: the server's own text when the
 * server refused. Valid until the next call on c. Never NULL. */
EMBPS_EXTERN const char *embps_client_last_error(const embps_client_t *c);
EMBPS_EXTERN size_t embps_client_n_servers(const embps_client_t *c);

/* The address ("host:port") of server `index` of the cluster, or NULL;
 * valid until the next call on c. For a member listing several servers:
 * the one its writes go to now (its primary, once one answered). */
EMBPS_EXTERN const char *embps_client_server_address(const embps_client_t *c,
                                                     size_t index);

/* The LSN the latest pull or scan reply of member `index` said it read at
 * (every row it held was the member's primary's at that LSN); 0 before
 * any, or from a server that does not say. */
EMBPS_EXTERN uint64_t embps_client_read_lsn(const embps_client_t *c,
                                            size_t index);
/* The address ("host:port") member `index`'s pulls and scans go to now: a
 * follower's with EMBPS_READ_FOLLOWER once one answered, else the
 * primary's (embps_client_server_address); NULL past the list. */
EMBPS_EXTERN const char *embps_client_read_address(const embps_client_t *c,
                                                   size_t index);

/* Create flags. */
#define EMBPS_CREATE_EXIST_OK 1u /* a table that exists with this spec: 0 */

/* Creates the table on every server of the cluster. It first describes
 * the table on every server: a server that holds it with another spec
 * makes it EMBPS_EEXIST, naming the server and the first field that
 * differs; a table every server holds with this spec is EMBPS_EEXIST too,
 * or 0 with EMBPS_CREATE_EXIST_OK. A table some servers hold and others
 * lack (a member that came back without its data) is EMBPS_EPARTIAL,
 * flag or not, naming the servers that lack it and those that hold it:
 * completing a member starts its rows again from the initializer, so it
 * is an explicit act (embps_complete_table). In each failure nothing is
 * created. A member client (embps_client_create_member) asks and creates
 * on its member alone. */
EMBPS_EXTERN int embps_create_table_ex(embps_client_t *c,
                                       const embps_table_spec_t *spec,
                                       unsigned flags);
/* embps_create_table_ex(c, spec, 0). */
EMBPS_EXTERN int embps_create_table(embps_client_t *c,
                                    const embps_table_spec_t *spec);
/* Completes table `name` on the servers that lack it while others hold it
 * (a member that came back without its data): creates it there with the
 * spec the holders agree on. The rows (and step counter) there start
 * again from the table's initializer: what that member held is not
 * recovered. *created (may be NULL) gets the servers it was created on (0
 * when every server holds it). EMBPS_ENOTABLE when no server holds it;
 * EMBPS_EEXIST when the holders' specs differ (nothing is created). */
EMBPS_EXTERN int embps_complete_table(embps_client_t *c, const char *name,
                                      uint32_t *created);
EMBPS_EXTERN int embps_drop_table(embps_client_t *c, const char *name);
/* The spec and counters of one table, summed over the servers. */
EMBPS_EXTERN int embps_describe_table(embps_client_t *c, const char *name,
                                      embps_table_info_t *out);
/* All tables held by any server (counters summed over the servers that
 * hold each); release *out with embps_tables_free(). */
EMBPS_EXTERN int embps_list_tables(embps_client_t *c,
                                   embps_table_info_t **out, size_t *n);
/* embps_list_tables, and which servers hold each table: *held (may be
 * NULL; else release it with embps_tables_free()) has n x n_servers bytes, and
 * (*held)[i * n_servers + s] is 1 when server s holds table i, 0 when it
 * is missing there (a member client asks its member only: the others
 * read as holding every table it lists). */
EMBPS_EXTERN int embps_list_tables_held(embps_client_t *c,
                                        embps_table_info_t **out, size_t *n,
                                        uint8_t **held);
/* Releases what embps_list_tables or embps_list_tables_held returned;
 * either may be NULL. */
EMBPS_EXTERN void embps_tables_free(embps_table_info_t *tables, uint8_t *held);
/* One entry per server; free with embps_stats_free(). */
EMBPS_EXTERN int embps_stats(embps_client_t *c, embps_server_stats_t **out,
                             size_t *n_servers);
EMBPS_EXTERN void embps_stats_free(embps_server_stats_t *s, size_t n_servers);
/* Takes a checkpoint on every server (--data-dir) and returns once each is
 * durable. info, if not NULL, gets one entry per server (cluster order).
 * EMBPS_ENODATADIR if a server has no data dir. */
EMBPS_EXTERN int embps_checkpoint(embps_client_t *c,
                                  embps_checkpoint_info_t *info);
/* Changes hyperparameters of a table on every server of the cluster (see
 * embps_table_alter_t), in order with the pushes: a push sent after this
 * returns uses the new values; logged and checkpointed with --data-dir.
 * Values are checked as a create checks them (EMBPS_EPARAM, naming the
 * field; nothing changes). out, if not NULL, gets the new spec and the
 * counters summed over the servers. */
EMBPS_EXTERN int embps_alter_table(embps_client_t *c, const char *name,
                                   const embps_table_alter_t *alter,
                                   embps_table_info_t *out);
/* embps_alter_table of the learning rate alone. */
EMBPS_EXTERN int embps_set_lr(embps_client_t *c, const char *name, double lr);
/* Evicts now, on every server, the table's rows that expired (ttl_steps)
 * and, with evict_l2_below, those whose weights' L2 norm is below it; logged
 * like a push. *evicted (may be NULL) gets the rows evicted in all. */
EMBPS_EXTERN int embps_evict(embps_client_t *c, const char *table,
                             uint64_t *evicted);

/* Promotes a follower (issue 21): the server c addresses (its member, see
 * embps_client_create_member, or its only server) stops following its
 * primary, applies what it received, and becomes the primary of a new
 * epoch from the next LSN, recorded before this returns. epoch and lsn
 * (may be NULL) get the new epoch and the last LSN of the old one.
 * EMBPS_EINVAL when c addresses no single server, or it is no follower. */
EMBPS_EXTERN int embps_promote(embps_client_t *c, uint32_t *epoch,
                               uint64_t *lsn);

/* Pulls rows: out[i*dim .. i*dim+dim) = row ids[i], for i < n. Duplicated
 * ids are sent once. dim must be the table's dim (checked by the server). */
EMBPS_EXTERN int embps_pull(embps_client_t *c, const char *table,
                            const int64_t *ids, size_t n, float *out,
                            uint32_t dim);

/* Push flags. */
#define EMBPS_PUSH_MERGE 1u /* merge duplicate indices before sending */

/* Pushes one IndexedSlices gradient: indices[n], values[n*dim] row-major.
 * Duplicates are summed (here with EMBPS_PUSH_MERGE, otherwise on the
 * server), then each server applies one optimizer step to its rows. The
 * whole push is validated first (finite values, dims, ranges), so a refused
 * push changes nothing. Exactly once: a push carries (client id, sequence),
 * and a retried push is never applied twice.
 *
 * A push goes to every server. One that stops answering for longer than
 * retry_ms makes the push fail after the others applied it: the error is
 * EMBPS_EPARTIAL, naming the servers that applied it and those it is owed
 * to. Do not push it again (the others would apply it twice): the library
 * keeps it and sends it again to those servers alone, under the same
 * (client id, sequence), before anything else it sends there, or at
 * embps_push_resume(); each applies it exactly once (one that had applied
 * it acknowledges a duplicate). A push no server can have applied (none
 * acknowledged it, none was sent it whole) fails with the connection's
 * error, owes nothing, and may be pushed again.
 *
 * EMBPS_ENOREPLICAS (a primary with --sync-followers): refused before it
 * was applied ("nothing changed"), the push owes nothing and may be
 * pushed again; applied but not on enough followers within the server's
 * --sync-timeout-ms ("was applied but not acknowledged"), it is retried
 * within retry_ms, then kept as an owed push on that server exactly as
 * above (embps_push_owed() counts it; do not push it again): sent again,
 * the server acknowledges it as a duplicate once its followers have it. */
EMBPS_EXTERN int embps_push(embps_client_t *c, const char *table,
                            const int64_t *indices, size_t n,
                            const float *values, uint32_t dim, unsigned flags);
/* For tables with sync_workers > 0: the push for synchronous step `step`;
 * returns once the step (all workers' pushes, averaged) is applied. */
EMBPS_EXTERN int embps_push_step(embps_client_t *c, const char *table,
                                 const int64_t *indices, size_t n,
                                 const float *values, uint32_t dim,
                                 unsigned flags, uint64_t step);

/* Asynchronous forms: they send at once and return a ticket; the arrays
 * stay owned by the caller and must stay valid, and `out` must not be read,
 * until embps_wait() on the ticket returns. Many tickets may be in flight. */
EMBPS_EXTERN int embps_pull_async(embps_client_t *c, const char *table,
                                  const int64_t *ids, size_t n, float *out,
                                  uint32_t dim, embps_ticket_t **ticket);
EMBPS_EXTERN int embps_push_async(embps_client_t *c, const char *table,
                                  const int64_t *indices, size_t n,
                                  const float *values, uint32_t dim,
                                  unsigned flags, embps_ticket_t **ticket);
EMBPS_EXTERN int embps_push_step_async(embps_client_t *c, const char *table,
                                       const int64_t *indices, size_t n,
                                       const float *values, uint32_t dim,
                                       unsigned flags, uint64_t step,
                                       embps_ticket_t **ticket);
/* Waits for the ticket's replies from every server and frees the ticket.
 * Returns the call's result. */
EMBPS_EXTERN int embps_wait(embps_client_t *c, embps_ticket_t *ticket);

/* Completes now the pushes owed to servers that stopped answering (see
 * embps_push): connects to them and sends each owed push again, oldest
 * first, retrying for retry_ms (once with a negative retry_ms). 0 once
 * every server has every push; EMBPS_EPARTIAL if a server refused an owed
 * push meanwhile (it stays applied on the others only: the message says
 * which); otherwise the error of a server still unreachable, naming it and
 * the oldest push it lacks: they stay owed. A client destroyed with pushes
 * owed leaves them applied on some servers only. */
EMBPS_EXTERN int embps_push_resume(embps_client_t *c);
/* The pushes owed now (0: every push sent is on every server that
 * answered it, or failed everywhere). */
EMBPS_EXTERN size_t embps_push_owed(const embps_client_t *c);

/* ------------------------------------------------------- export/import */

/* Optimizer state slots per weight (sgd 0, adagrad 1, adam 2, ftrl 2) and,
 * if names is not NULL, their names in record order: adagrad
 * "accumulator"; adam "m", "v"; ftrl "n", "z". Adam's step t is the
 * table's step counter (embps_table_info_t.step), not per row. */
EMBPS_EXTERN uint32_t embps_optimizer_state_slots(embps_optimizer_t opt,
                                                  const char *const **names);

/* One chunk of one server's rows (embps_scan). ids, weights and state
 * point into one buffer owned by the chunk: release it with
 * embps_scan_chunk_free(). */
typedef struct {
  size_t n;             /* rows in this chunk */
  uint32_t dim;
  uint32_t state_slots; /* 0 without EMBPS_SCAN_STATE (or for sgd) */
  int64_t *ids;         /* n */
  float *weights;       /* n x dim, float32 (f16/bf16 tables: widened) */
  float *state;         /* n x state_slots x dim (each row's slots in
                         * turn), or NULL */
  uint64_t next_cursor; /* pass to the next call */
  int done;             /* no row left on that server */
  uint64_t step;        /* the table's step counter on that server */
  void *priv;
  uint64_t reserved[4]; /* zero */
} embps_scan_chunk_t;

#define EMBPS_SCAN_STATE 1u /* with each row's optimizer state */

/* Reads one chunk of at most max_rows rows (0: as many as a reply frame
 * holds) of `table` on server `server` (cluster index), from `cursor` (0:
 * the start; then the chunk's next_cursor) until a chunk says done. The
 * server copies a chunk under one shard's read lock at a time, so pushes
 * go on; rows a push changes while a scan runs are seen either before or
 * after that push, each row whole. On success release *out with
 * embps_scan_chunk_free(). */
EMBPS_EXTERN int embps_scan(embps_client_t *c, uint32_t server,
                            const char *table, uint64_t cursor,
                            uint32_t max_rows, unsigned flags,
                            embps_scan_chunk_t *out);
EMBPS_EXTERN void embps_scan_chunk_free(embps_scan_chunk_t *chunk);

/* Sets n distinct rows of a table to weights[n*dim] (float32; rounded to
 * the table's dtype) and, if state is not NULL, their optimizer state
 * (n x slots x dim as embps_scan gives it); without state the rows' state
 * is reset to its initial value. Each row goes to its owning server; each
 * server applies its rows as one mutation in order with pushes (logged in
 * its --data-dir like a push) after checking all of them (dim, ranges,
 * distinct ids, finite values, non-negative accumulators). With set_step,
 * every server sets the table's step counter to `step` (Adam's t). */
EMBPS_EXTERN int embps_write_rows(embps_client_t *c, const char *table,
                                  const int64_t *ids, size_t n,
                                  const float *weights, uint32_t dim,
                                  const float *state, int set_step,
                                  uint64_t step);

/* Export/import flags. */
#define EMBPS_EXPORT_STATE 1u  /* also the optimizer state (and step) */
#define EMBPS_EXPORT_DENSE 2u  /* fixed-size table: every row, by id */
#define EMBPS_IMPORT_STATE 1u  /* set the state from the files too */
#define EMBPS_IMPORT_CREATE 2u /* create the table from spec.json if missing */

/* Writes every row every server of the cluster holds of `table` (rows
 * never pushed are not stored: they read as their initial value) into
 * directory dir (created if missing), as numpy .npy files: ids.npy (<i8,
 * [n]), weights.npy (<f4, [n, dim]), spec.json (the table's spec, and its
 * step counter), and with EMBPS_EXPORT_STATE one <f4 [n, dim] file per
 * optimizer slot named <optimizer>_<slot>.npy (adagrad_accumulator.npy,
 * adam_m.npy, adam_v.npy, ftrl_n.npy, ftrl_z.npy). Rows are streamed in
 * chunks (memory bounded by a chunk, not the table); files are written
 * under temporary names and renamed once complete. With pushes going on,
 * the export is consistent per chunk, not a snapshot of one instant.
 * With EMBPS_EXPORT_DENSE (not with EMBPS_EXPORT_STATE), a table of fixed
 * size gets weights.npy [rows, dim] with row i the row of id i for every
 * id, pushed or not (as a pull returns it: a row never pushed as the
 * server initialises it), and spec.json, and no ids.npy: what
 * np.load and nn.Embedding.from_pretrained read with no server. A dynamic
 * table has no row count: it gets the files above (ids.npy, weights.npy).
 * *rows_out (may be NULL) gets the rows written. */
EMBPS_EXTERN int embps_export_table(embps_client_t *c, const char *table,
                                    const char *dir, unsigned flags,
                                    uint64_t *rows_out);
/* Reads what embps_export_table wrote (or .npy files written by numpy:
 * weights.npy as <f4 or <f8 [n, dim], ids.npy as <i8 or <i4 [n]; without
 * ids.npy a dense table gets rows 0..n-1) and writes the rows into
 * `table`, chunk by chunk, after reading every file through once to check
 * it (dtype, shape, fortran_order, finite values, ids in range): a bad
 * file changes nothing, and its error names the file. With
 * EMBPS_IMPORT_STATE the state files and the step must be there and are
 * set too; otherwise the imported rows get their initial state. With
 * EMBPS_IMPORT_CREATE a missing table is created from spec.json (renamed
 * to `table`). An id given twice: the later row wins. *rows_out (may be
 * NULL) gets the rows written. */
EMBPS_EXTERN int embps_import_table(embps_client_t *c, const char *table,
                                    const char *dir, unsigned flags,
                                    uint64_t *rows_out);

/* ------------------------------------------------------- routing (shared) */

/* The server (0..n_servers-1) that owns id: jump consistent hash of a
 * 64-bit mix of the id. Servers use the same function to refuse ids that
 * are not theirs. */
EMBPS_EXTERN uint32_t embps_route(int64_t id, uint32_t n_servers);

#ifdef __cplusplus
}
#endif
#endif /* EMBPS_EMBPS_H */
