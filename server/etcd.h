/* etcd.h - a client of etcd's v3 API through its HTTP/JSON gateway
 * (etcd 3.4: POST /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke,
 * /v3/kv/range, /v3/kv/put, /v3/kv/deleterange, /v3/kv/txn, /v3/watch),
 * over libcurl: no gRPC. What the coordinator (coord.h) needs and no more.
 *
 * Endpoints. "etcd://HOST:PORT[,HOST:PORT...]" (plain HTTP; [v6]:port
 * too). A call goes to the endpoint that answered last; when it cannot be
 * reached, times out, or answers that it is unavailable (gRPC UNAVAILABLE
 * or DEADLINE_EXCEEDED: no leader, a member cut off), the call goes on
 * to the next endpoint within the same deadline. The whole call, every
 * endpoint tried, is bounded by the timeout given at creation (the
 * coordinator makes it shorter than a lease). A call that timed out may
 * still have been applied by etcd: the coordinator's writes are made so
 * that doing one twice, or reading back the result of one, is harmless
 * (a campaign that finds the key under its own lease has won).
 *
 * Bounds. A response is read into a buffer that stops growing at
 * EMBPS_ETCD_REPLY_MAX (the transfer is cut past it); a key, a value and
 * the number of keys of a range are bounded too, and checked before
 * anything of that size is allocated.
 *
 * Errors. Every call returns 0 or a negative errno-style code, and leaves
 * a message naming the endpoint(s) and the cause in embps_etcd_error:
 *   -ETIMEDOUT / -ECONNREFUSED / -EHOSTUNREACH   no endpoint answered
 *   -ENOENT    etcd: not found (a lease that expired or was revoked)
 *   -EPROTO    a response that is not what the gateway sends
 *   -EMSGSIZE  a response, key or value past its bound
 *   -EINVAL, -EACCES, -ENOSPC, -ERANGE, -EIO   etcd refused (the gRPC code
 *              and etcd's message are in the error)
 *
 * Threads. A client is used by one thread at a time. A watch has its own
 * connection and may be read on another thread; embps_etcd_watch_wakeup
 * may be called from any thread. */
#ifndef EMBPS_ETCD_H
#define EMBPS_ETCD_H
#include <stddef.h>
#include <stdint.h>

#define EMBPS_ETCD_ENDPOINTS_MAX 16
#define EMBPS_ETCD_KEY_MAX 1024
#define EMBPS_ETCD_VALUE_MAX 65536
#define EMBPS_ETCD_KVS_MAX 1024
#define EMBPS_ETCD_REPLY_MAX (4u << 20)
#define EMBPS_ETCD_ERR_MAX 512

typedef struct embps_etcd embps_etcd_t;
typedef struct embps_etcd_watch embps_etcd_watch_t;

/* One key as etcd holds it. key and value are malloc'd with a NUL after
 * their bytes (so text prints as is); embps_etcd_kvs_free frees them. */
typedef struct {
  char *key, *value;
  size_t key_len, value_len;
  int64_t create_rev, mod_rev, version, lease;
} embps_etcd_kv_t;

/* The keys a range (or a transaction's ranges) returned, and the store's
 * revision when it answered. */
typedef struct {
  embps_etcd_kv_t *v;
  size_t n;
  int64_t revision;
  int more; /* a range held more than EMBPS_ETCD_KVS_MAX keys */
} embps_etcd_kvs_t;

void embps_etcd_kvs_free(embps_etcd_kvs_t *kvs);

/* Parses url and sets up a client whose every call takes at most
 * timeout_ms (>= 10). Nothing is sent yet. 0, or -1 with err saying what
 * is wrong with url. */
int embps_etcd_create(const char *url, uint32_t timeout_ms,
                      embps_etcd_t **out, char *err, size_t err_len);
void embps_etcd_destroy(embps_etcd_t *e); /* NULL-safe */
/* The message of the last failed call ("" before any). Valid until the
 * next call. */
const char *embps_etcd_error(const embps_etcd_t *e);
/* The endpoint calls go to now ("host:port"). */
const char *embps_etcd_endpoint(const embps_etcd_t *e);
size_t embps_etcd_endpoints(const embps_etcd_t *e);

/* ---- leases ---- */
/* A new lease of ttl_s seconds: *id, and *ttl_s_out the TTL etcd gave
 * (it raises one below its minimum). */
int embps_etcd_lease_grant(embps_etcd_t *e, int64_t ttl_s, int64_t *id,
                           int64_t *ttl_s_out);
/* Renews lease id: etcd restarts its TTL when it receives this; *ttl_s_out
 * gets it. -ENOENT when the lease no longer exists. */
int embps_etcd_lease_keepalive(embps_etcd_t *e, int64_t id,
                               int64_t *ttl_s_out);
/* Ends lease id now; its keys are deleted. -ENOENT: no such lease. */
int embps_etcd_lease_revoke(embps_etcd_t *e, int64_t id);

/* ---- keys ---- */
/* key[0, key_len); with prefix, every key starting with those bytes. */
int embps_etcd_range(embps_etcd_t *e, const void *key, size_t key_len,
                     int prefix, embps_etcd_kvs_t *out);
/* The keys in [key, end), at most EMBPS_ETCD_KVS_MAX of them (out->more
 * says whether there are others past the last one: read on from the last
 * key plus a NUL byte), as of revision rev (0: the latest; a fixed one
 * keeps the pages of one read consistent; -ERANGE once etcd compacted
 * it). */
int embps_etcd_range_between(embps_etcd_t *e, const void *key,
                             size_t key_len, const void *end, size_t end_len,
                             int64_t rev, embps_etcd_kvs_t *out);
/* Puts key = value, attached to lease (0: none). *rev (may be NULL): the
 * revision of the put. */
int embps_etcd_put(embps_etcd_t *e, const void *key, size_t key_len,
                   const void *value, size_t value_len, int64_t lease,
                   int64_t *rev);
/* Deletes key (or the keys under it, with prefix); *deleted (may be NULL)
 * gets how many there were. */
int embps_etcd_delete(embps_etcd_t *e, const void *key, size_t key_len,
                      int prefix, int64_t *deleted);

/* ---- transactions ---- */
typedef enum {
  EMBPS_ETCD_CREATE, /* create revision (0: the key does not exist) */
  EMBPS_ETCD_MOD,    /* revision of its last change */
  EMBPS_ETCD_VERSION /* changes since it was created */
} embps_etcd_target_t;
typedef enum {
  EMBPS_ETCD_EQUAL,
  EMBPS_ETCD_GREATER,
  EMBPS_ETCD_LESS,
  EMBPS_ETCD_NOT_EQUAL
} embps_etcd_result_t;
/* target(key) result number; with prefix, for every key under it (a
 * range with no keys compares true). */
typedef struct {
  const void *key;
  size_t key_len;
  int prefix;
  embps_etcd_target_t target;
  embps_etcd_result_t result;
  int64_t number;
} embps_etcd_cmp_t;
typedef enum { EMBPS_ETCD_OP_PUT, EMBPS_ETCD_OP_RANGE, EMBPS_ETCD_OP_DELETE } embps_etcd_op_kind_t;
typedef struct {
  embps_etcd_op_kind_t kind;
  const void *key;
  size_t key_len;
  int prefix;        /* range, delete */
  const void *value; /* put */
  size_t value_len;
  int64_t lease;     /* put */
} embps_etcd_op_t;
#define EMBPS_ETCD_TXN_MAX 8 /* compares, and ops of each branch */

/* If every compare holds, runs then[], else otherwise[] (atomically).
 * *succeeded says which; kvs (may be NULL) gets the keys of the branch's
 * ranges, in order, and the revision. */
int embps_etcd_txn(embps_etcd_t *e, const embps_etcd_cmp_t *cmp, size_t n_cmp,
                   const embps_etcd_op_t *then, size_t n_then,
                   const embps_etcd_op_t *otherwise, size_t n_otherwise,
                   int *succeeded, embps_etcd_kvs_t *kvs);
/* Creates key = value under lease if the key does not exist (*created =
 * 1), else reads it (*created = 0, kvs holds it). kvs->revision: the
 * revision after the transaction. */
int embps_etcd_create_or_get(embps_etcd_t *e, const void *key, size_t key_len,
                             const void *value, size_t value_len,
                             int64_t lease, int *created,
                             embps_etcd_kvs_t *kvs);

/* ---- watches ---- */
typedef enum { EMBPS_ETCD_EV_PUT, EMBPS_ETCD_EV_DELETE } embps_etcd_ev_kind_t;
typedef struct {
  embps_etcd_ev_kind_t kind;
  embps_etcd_kv_t kv; /* a delete: the key and mod_rev only */
} embps_etcd_event_t;
void embps_etcd_event_free(embps_etcd_event_t *ev);

/* Watches key (or the keys under it) from revision start_rev on (0: from
 * now), on a connection of its own to the client's endpoint (or the next
 * ones), and returns once etcd confirmed it (within the client's
 * timeout). e is not used after this returns. 0 or an error (in e's). */
int embps_etcd_watch_open(embps_etcd_t *e, const void *key, size_t key_len,
                          int prefix, int64_t start_rev,
                          embps_etcd_watch_t **out);
/* The next change, in revision order: 1 with *ev filled (free it), 0
 * when none came within timeout_ms (or the watch was woken), or a
 * negative code once the watch ended (the stream closed, the connection
 * broke: open a new one from the last revision seen + 1): -ECANCELED
 * when etcd cancelled it, e.g. because start_rev was compacted
 * (embps_etcd_watch_compacted). The message: embps_etcd_watch_error. */
int embps_etcd_watch_next(embps_etcd_watch_t *w, uint32_t timeout_ms,
                          embps_etcd_event_t *ev);
/* Any thread: makes a waiting embps_etcd_watch_next return 0 now. */
void embps_etcd_watch_wakeup(embps_etcd_watch_t *w);
const char *embps_etcd_watch_error(const embps_etcd_watch_t *w);
/* The compact revision etcd named when it cancelled (0: none). */
int64_t embps_etcd_watch_compacted(const embps_etcd_watch_t *w);
void embps_etcd_watch_close(embps_etcd_watch_t *w); /* NULL-safe */

/* The end of a prefix range: key with its last byte below 0xff plus one,
 * the bytes after it dropped (an all-0xff key: "\0", every key). *len
 * gets the length; end holds at least key_len bytes. */
void embps_etcd_prefix_end(const void *key, size_t key_len, uint8_t *end,
                           size_t *len);
#endif
