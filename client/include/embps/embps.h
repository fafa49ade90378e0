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
 *    ticket: a push to a single server is sent straight from them.
 *
 * The second half of this header holds local helpers for workers: embedding
 * lookup, bag lookup and their backward passes, which produce the
 * IndexedSlices gradients that embps_push() sends.
 */
#ifndef EMBPS_EMBPS_H
#define EMBPS_EMBPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(EMBPS_BUILDING_LIBRARY)
#define EMBPS_EXTERN __attribute__((visibility("default")))
#else
#define EMBPS_EXTERN
#endif

#define EMBPS_VERSION_STRING "0.1.0"
#define EMBPS_PROTOCOL_VERSION 1

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
  X(EBADFILE, -30024, "bad export/import file")

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

#define EMBPS_TABLE_NAME_MAX 128
#define EMBPS_DIM_MAX 65536

typedef struct {
  char name[EMBPS_TABLE_NAME_MAX]; /* [A-Za-z0-9_.-], 1..127 bytes */
  uint32_t dim;
  uint64_t rows;   /* dense: ids in [0, rows); 0 with dynamic = 1 */
  int dynamic;     /* any int64 id */
  embps_optimizer_t optimizer;
  double lr, eps, beta1, beta2, initial_accumulator, l1, l2, lr_power;
  double weight_decay;
  embps_init_t init;
  double init_value;
  uint64_t seed;
  int has_padding;
  int64_t padding_id;
  embps_dtype_t dtype;
  uint32_t sync_workers; /* 0: asynchronous */
  /* Dynamic tables only (README "Admission and eviction"); 0: off. */
  uint32_t admit_after;        /* a row is made on the Nth push of its id */
  double admit_probability;    /* (0, 1]: admitted iff hash(seed, id) < P */
  uint64_t admit_sketch_bytes; /* count-min sketch per server; 0: 1 MiB */
  uint64_t ttl_steps;          /* rows not pushed in the last S steps go */
  uint64_t max_rows;           /* cluster-wide; each server N / servers */
  uint32_t evict;              /* embps_evict_t: at max_rows, LRU or LFU */
  double evict_l2_below;       /* rows of L2 norm < X go at checkpoint */
} embps_table_spec_t;

typedef enum {
  EMBPS_EVICT_LRU = 0, /* least recently pushed first */
  EMBPS_EVICT_LFU = 1, /* least often pushed first, then LRU */
} embps_evict_t;

/* Fills spec with the defaults of DESIGN.md for `optimizer` (lr 0.01 for
 * every optimizer; adagrad eps 1e-10; adam b1 0.9 b2 0.999 eps 1e-8; ftrl
 * initial accumulator 0.1, lr_power -0.5), init zeros, no padding. */
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

typedef struct {
  unsigned set; /* EMBPS_ALTER_* bits */
  double lr, eps, beta1, beta2, l1, l2, lr_power, weight_decay;
} embps_table_alter_t;

/* Writes the fields of `alter` that are set into spec, then checks spec as
 * embps_table_spec_check does. 0, or EMBPS_EPARAM with `why` (nothing set,
 * an unknown bit, or a value out of range; spec is then unchanged). */
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

typedef struct {
  embps_table_spec_t spec;
  uint64_t rows_allocated; /* rows materialised by a push */
  uint64_t bytes_used;
  uint64_t pushes, pulls;
  uint64_t step;
  /* admission and eviction (dynamic tables) */
  uint64_t rows_admitted;     /* rows materialised by admission so far */
  uint64_t rows_pending;      /* ids counted but not admitted (estimate) */
  uint64_t evicted_ttl, evicted_capacity, evicted_l2;
  uint64_t capacity;          /* max_rows share held here (0: none) */
  uint64_t evict_stall_max_us; /* longest eviction work under a lock */
} embps_table_info_t;

typedef struct {
  char address[64]; /* host:port of the server these come from */
  char version[32];
  uint32_t cluster_size, cluster_index, io_threads, shards;
  uint64_t uptime_ms, connections, requests, pulls, pushes;
  uint64_t pull_rows, push_rows, errors, bytes_in, bytes_out;
  size_t n_tables;
  embps_table_info_t *tables; /* owned by the embps_stats_t */
  /* durability: empty / 0 without --data-dir */
  char data_dir[256];
  char fsync[16];             /* always, everysec, never */
  uint64_t checkpoint_unix_s; /* the last checkpoint: when (0: none yet), */
  uint64_t checkpoint_bytes;  /* its size, */
  uint64_t checkpoint_ms;     /* how long it took, */
  uint64_t checkpoint_lsn;    /* the log position it covers */
  uint64_t log_bytes;         /* log since then */
  char durability_failed[256]; /* why pushes are refused, or empty */
} embps_server_stats_t;

/* What one server's checkpoint covers (embps_checkpoint). */
typedef struct {
  uint64_t lsn, bytes, duration_ms, unix_s;
} embps_checkpoint_info_t;

/* ------------------------------------------------------------------ client */

typedef struct embps_client embps_client_t;
typedef struct embps_ticket embps_ticket_t;

typedef struct {
  /* "host:port[,host:port...]"; NULL: $EMBPS_SERVERS, else 127.0.0.1:7070.
   * The order is the cluster order: entry I is --cluster-index I. */
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
} embps_client_options_t;

/* Connects to every server and says hello (protocol version, token).
 * opts may be NULL. On success *out owns the connections; on failure *out is
 * set to NULL and, if errbuf is not NULL, a message is written there. */
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
 * valid as long as c. */
EMBPS_EXTERN const char *embps_client_server_address(const embps_client_t *c,
                                                     size_t index);

/* Create flags. */
#define EMBPS_CREATE_EXIST_OK 1u /* a table that exists with this spec: 0 */

/* Creates the table on every server of the cluster that lacks it (a
 * member restarted empty is completed). A server that holds it with
 * another spec makes it EMBPS_EEXIST, naming the server and the first
 * field that differs, and nothing is created; one that holds it on every
 * server with this spec is EMBPS_EEXIST too, or 0 with
 * EMBPS_CREATE_EXIST_OK. */
EMBPS_EXTERN int embps_create_table_ex(embps_client_t *c,
                                       const embps_table_spec_t *spec,
                                       unsigned flags);
/* embps_create_table_ex(c, spec, 0). */
EMBPS_EXTERN int embps_create_table(embps_client_t *c,
                                    const embps_table_spec_t *spec);
EMBPS_EXTERN int embps_drop_table(embps_client_t *c, const char *name);
/* The spec and counters of one table, summed over the servers. */
EMBPS_EXTERN int embps_describe_table(embps_client_t *c, const char *name,
                                      embps_table_info_t *out);
/* All tables held by any server (counters summed over the servers that
 * hold each); free with free(). */
EMBPS_EXTERN int embps_list_tables(embps_client_t *c,
                                   embps_table_info_t **out, size_t *n);
/* embps_list_tables, and which servers hold each table: *held (may be
 * NULL; else malloc'd, free with free()) has n x n_servers bytes, and
 * (*held)[i * n_servers + s] is 1 when server s holds table i, 0 when it
 * is missing there (a member client asks its member only: the others
 * read as holding every table it lists). */
EMBPS_EXTERN int embps_list_tables_held(embps_client_t *c,
                                        embps_table_info_t **out, size_t *n,
                                        uint8_t **held);
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
 * and a retried push is never applied twice. */
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

/* ------------------------------------------------- local backprop helpers */

/*
 * An IndexedSlices gradient held by the caller: n rows of dim floats,
 * values[i*dim..] is the gradient for row indices[i]. Indices may repeat.
 */
typedef struct {
  int64_t *indices;
  float *values;
  size_t n;
  size_t cap; /* rows allocated */
  uint32_t dim;
} embps_slices_t;

/* Initialises s empty; embps_slices_free() releases it (NULL accepted). */
EMBPS_EXTERN void embps_slices_init(embps_slices_t *s, uint32_t dim);
EMBPS_EXTERN void embps_slices_free(embps_slices_t *s);
/* Makes room for `n` rows in total; returns 0 or -ENOMEM. */
EMBPS_EXTERN int embps_slices_reserve(embps_slices_t *s, size_t n);

/* Sums duplicates in place: afterwards s holds each index once, in the order
 * of first appearance, with the sum of its rows (TensorFlow's
 * unsorted_segment_sum over unique indices; PyTorch's coalesce() up to
 * order). Returns 0 or -ENOMEM (s unchanged). */
EMBPS_EXTERN int embps_slices_merge(embps_slices_t *s);

/* Embedding lookup (tf.nn.embedding_lookup): given the rows pulled for
 * `unique_ids` (n_unique x dim, e.g. by embps_pull) and, for each of the n
 * positions of an id array of any shape, inverse[i] = its row in that list,
 * writes out[i*dim..] = rows[inverse[i]*dim..]. */
EMBPS_EXTERN void embps_lookup(const float *rows, uint32_t dim,
                               const uint32_t *inverse, size_t n, float *out);

/* Unique ids of an array with the inverse map: unique_out gets the distinct
 * ids in order of first appearance (at most n), inverse_out[i] the position
 * of ids[i] in it. Returns the number of unique ids, or -ENOMEM. */
EMBPS_EXTERN int64_t embps_unique(const int64_t *ids, size_t n,
                                  int64_t *unique_out, uint32_t *inverse_out);

/* Backward of a lookup: d out / d rows as IndexedSlices. Appends, for every
 * position i whose id is not the padding id, the row grad[i*dim..] with
 * index ids[i] to `g` (scatter-add semantics: repeated ids accumulate once
 * merged). has_padding = 0 disables the padding id. Returns 0 or -ENOMEM. */
EMBPS_EXTERN int embps_lookup_backward(const int64_t *ids, size_t n,
                                       const float *grad, uint32_t dim,
                                       int has_padding, int64_t padding_id,
                                       embps_slices_t *g);

typedef enum {
  EMBPS_COMBINER_SUM = 0,
  EMBPS_COMBINER_MEAN = 1,  /* sum(w*x) / sum(w) */
  EMBPS_COMBINER_SQRTN = 2, /* sum(w*x) / sqrt(sum(w^2)) */
} embps_combiner_t;

/*
 * Bag lookup (tf.nn.embedding_lookup_sparse, torch EmbeddingBag): bag b
 * covers ids[offsets[b] .. offsets[b+1]) (offsets has n_bags+1 entries,
 * non-decreasing, offsets[n_bags] = number of ids); `rows` holds the row of
 * each id position (n_ids x dim, e.g. from embps_pull on the ids array) and
 * weights (NULL: all 1) one weight per id position. Padding ids contribute
 * nothing and count for nothing. An empty bag gives zeros.
 * out is n_bags x dim.
 */
EMBPS_EXTERN void embps_bag_forward(const float *rows, uint32_t dim,
                                    const int64_t *ids, const size_t *offsets,
                                    size_t n_bags, const float *weights,
                                    embps_combiner_t combiner, int has_padding,
                                    int64_t padding_id, float *out);
/* Backward of embps_bag_forward: given d loss / d out (n_bags x dim),
 * appends one gradient row per non-padding id position to g. */
EMBPS_EXTERN int embps_bag_backward(const float *grad_out, uint32_t dim,
                                    const int64_t *ids, const size_t *offsets,
                                    size_t n_bags, const float *weights,
                                    embps_combiner_t combiner, int has_padding,
                                    int64_t padding_id, embps_slices_t *g);

/* Clips a list of gradients by their global norm (tf.clip_by_global_norm),
 * merging duplicates in every slices first, so the norm is that of the
 * dense gradient the slices stand for (TensorFlow's clipping of IndexedSlices
 * does not merge and overstates it). Scales every value by
 * clip_norm / max(global_norm, clip_norm). *norm_out (may be NULL) gets the
 * norm before clipping. Returns 0, -ENOMEM or EMBPS_EINVAL. */
EMBPS_EXTERN int embps_clip_by_global_norm(embps_slices_t *const *list,
                                           size_t n_list, double clip_norm,
                                           double *norm_out);

#ifdef __cplusplus
}
#endif
#endif /* EMBPS_EMBPS_H */
