/* internal.h - what the library's files share beyond embps.h (nothing
 * here is exported): the client, its connections and its tickets, and
 * the transport (transport.c) that the API operations (client.c) and the
 * export (export.c) are built on.
 *
 * A call becomes a ticket with one part per server it involves; each part
 * is a request frame with its own request id, queued on that server's
 * connection, and its reply comes back to the part. transport.c owns the
 * connections and the life of a part from its submission to its reply;
 * client.c builds the tickets and reads their replies. */
#ifndef EMBPS_CLIENT_INTERNAL_H
#define EMBPS_CLIENT_INTERNAL_H
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "bufpool.h"
#include "embps/embps.h"
#include "framer.h"
#include "merge.h"
#include "wire.h"

/* The largest reply body read at all, and the largest meta of a reply:
 * a reply without bulk (an error, a hello, a push's counts, a table's
 * info) is its meta alone, a few hundred bytes. */
#define EMBPS_REPLY_MAX (1u << 30)
#define EMBPS_REPLY_META_MAX (64u << 10)

typedef struct part part_t;

/* One server of a member, as listed. */
typedef struct {
  char host[256];
  int port;
  char addr[300];
} embps_server_addr_t;

/* One member of the cluster (one entry of the server list): its servers,
 * `|`-separated in the list (servers.c), and the LSN its latest read
 * reply said it read at. alt[n_listed] is room for a primary a follower
 * named that the list does not hold (n_alt is then n_listed + 1). */
typedef struct {
  embps_server_addr_t *alt;
  uint32_t n_listed, n_alt;
  uint64_t read_lsn;
} member_t;

/* What a connection wants of the server it reaches (transport.c,
 * "Members"): anything (a member listed with one server), the member's
 * primary (its writes, and its reads by default), or a follower (reads
 * with EMBPS_READ_FOLLOWER, the primary when no follower answers). */
enum { CONN_ANY, CONN_PRIMARY, CONN_FOLLOWER };

/* A queued request frame: its part's frame and, for a bulk sent from the
 * caller's buffers, up to two borrowed segments after it. seg[] holds the
 * bytes not yet sent; cur is the first segment with bytes left. */
typedef struct out_buf {
  struct iovec seg[3];
  int n_seg, cur;
  part_t *part; /* the part awaiting this frame's reply */
  struct out_buf *next;
} out_buf_t;

/* The connection to one server of the cluster. */
typedef struct {
  struct embps_client *client;
  char host[256]; /* the server it reaches now: m->alt[alt] */
  int port;
  char addr[300];
  uint32_t index; /* its member's, in the cluster */
  member_t *m;
  uint32_t alt;
  int want;      /* CONN_* */
  int role;      /* EMBPS_ROLE_* of the server it reached (its hello) */
  uint32_t epoch; /* and its epoch then */
  uint64_t probe_at_ns; /* a member's primary: when to next ask the others
                         * whether one was elected meanwhile */
  int fd;
  uint64_t max_frame; /* the server's --max-frame-bytes, from its hello */
  out_buf_t *out_head, *out_tail;
  part_t *pending_head, *pending_tail; /* sent, awaiting a reply */
  embps_framer_t framer; /* set up again for every connection */
  uint8_t *body; /* reused across frames: grows, never shrinks */
  size_t body_cap;
  part_t *cur;  /* the part the frame being read answers, or NULL */
  int in_place; /* its bulk goes straight to the part's rows */
  /* Broken (fd < 0) with parts still pending: they are sent again, in
   * their order, once a reconnection at or after retry_at_ns succeeds. */
  uint64_t retry_at_ns;
  int backoff_ms;
  int down_code;      /* why the last connection or attempt failed */
  char down_why[1024];
  uint32_t n_owed; /* owed pushes among the pending parts */
} conn_t;

/* OP_OWED: the owed copy of a push that gave up on this server (see
 * transport.c, "Owed pushes"): a ticket of its own, which no caller
 * waits for. */
typedef enum { OP_HELLO, OP_SIMPLE, OP_PULL, OP_PUSH, OP_OWED } op_t;

struct part {
  embps_ticket_t *t;
  uint32_t server; /* its member (cluster index) */
  uint32_t conn;   /* the connection it is sent on (c->conns[conn]) */
  uint32_t req_id;
  uint16_t kind; /* the request's kind */
  /* The request frame (owned) and its borrowed bulk, kept until the reply
   * so that a retry sends the very same bytes (client id, seq, req id). */
  uint8_t *frame;
  size_t frame_len;
  struct iovec bulk[2];
  int n_bulk;
  uint32_t *pos; /* push: positions in the caller's arrays (K > 1) */
  size_t base;   /* pull: first position in the ticket's unique list */
  size_t n;
  /* The largest reply body this request can produce; 0: what its kind
   * allows (transport.c, reply_max). A reply announcing more is refused
   * at its header, before its body is read. */
  size_t max_reply;
  embps_msg_t reply; /* OP_SIMPLE/OP_HELLO: the decoded reply */
  int has_reply;
  uint8_t *rbulk; /* OP_SIMPLE: the reply's bulk (malloc'd), or NULL */
  size_t rbulk_len;
  uint8_t *rdst;  /* OP_SIMPLE: where a reply's bulk up to rdst_cap goes */
  size_t rdst_cap;
  uint8_t acked;   /* a reply that is not an error came */
  uint8_t written; /* its whole frame went out: the server may act on it */
  /* push: a server answered EMBPS_ENOREPLICAS with the record's LSN (it
   * applied the push but could not acknowledge it: too few followers in
   * time); from then on the push is owed, never refused */
  uint8_t applied;
  /* A push part given up: orphan is its owed copy, until that completes
   * (owed_done then says how: 1 applied or acknowledged, -1 refused). An
   * owed copy's origin is the part it stands for, while that lives. */
  part_t *orphan, *origin;
  int owed_done;
  part_t *next;
};

struct embps_ticket {
  op_t op;
  int result;
  uint64_t retry_until_ns; /* 0: never retried */
  uint64_t sent_ns;        /* last (re)send of a part: one attempt's start */
  char error[EMBPS_MESSAGE_MAX + 64];
  uint32_t n_parts, n_done;
  part_t *parts;
  uint32_t dim;
  /* pull */
  float *out;
  size_t n;
  int64_t *uniq;
  uint32_t *inverse;
  float *urows; /* n_unique x dim, grouped by server; or == out */
  size_t n_unique;
  size_t uniq_cap, inverse_cap, urows_cap; /* bytes, for the pool */
  /* push: merged copies when EMBPS_PUSH_MERGE */
  int64_t *m_idx;
  float *m_vals;
  uint64_t seq; /* a push's sequence (0: not a push) */
  /* a read that a follower may serve (a pull, a scan, the description a
   * pull or scan needs), sent to the members' read connections */
  uint8_t reads;
  embps_ticket_t *owed_prev, *owed_next; /* OP_OWED: the client's list */
};

typedef struct {
  char name[EMBPS_TABLE_NAME_MAX];
  embps_table_spec_t spec;
} cached_table_t;

struct embps_client {
  /* n_conns connections: conns[i] for member i's primary (or its only
   * server), and with EMBPS_READ_FOLLOWER conns[n + i] for its reads */
  conn_t *conns;
  uint32_t n, n_conns;
  member_t *members; /* n */
  int read_from;     /* EMBPS_READ_* */
  int servers_as_listed; /* an entry of one server is that server alone */
  char token[EMBPS_TOKEN_MAX];
  size_t token_len;
  int timeout_ms;
  int retry_ms; /* < 0: never */
  uint32_t next_req_id;
  uint64_t client_id, seq;
  char last_error[EMBPS_MESSAGE_MAX + 128];
  cached_table_t *tables;
  size_t n_tables;
  embps_dedup_t dedup;
  embps_bufpool_t pool; /* the buffers of finished pulls, for the next */
  uint32_t member; /* < n: whole-cluster requests ask this server alone */
  /* owed pushes (OP_OWED tickets), oldest first, and their bytes */
  embps_ticket_t *owed_head, *owed_tail;
  uint32_t n_owed;
  size_t owed_bytes;
  /* an owed push a server refused since the last embps_push_resume */
  int owed_lost_code;
  char owed_lost[EMBPS_MESSAGE_MAX + 128];
  int peer; /* embps_client_create_peer_ (peer.c): any place in a cluster */
};

/* ---- errors ---- */

/* Sets c's last error (printf-style); returns code. */
int embps_client_error_(embps_client_t *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same with the message as it is. */
int embps_client_set_error_(embps_client_t *c, int code, const char *msg);
/* The smallest --max-frame-bytes a server of c announced (0: none). */
uint64_t embps_client_max_frame_(const embps_client_t *c);

/* ---- the server list (servers.c) ---- */

/* Parses list ("a:1|b:1,c:1": members in cluster order, `|` between the
 * servers of one member) into c's members and connections (read
 * connections too when c->read_from is EMBPS_READ_FOLLOWER). 0, or
 * EMBPS_EINVAL / -ENOMEM with err naming the bad entry. */
int embps_servers_parse_(embps_client_t *c, const char *list, char *err,
                         size_t err_len);
/* Frees what embps_servers_parse_ made. */
void embps_servers_free_(embps_client_t *c);
/* The connection (index into c->conns) a request to member s goes on:
 * its read connection for a read t when c reads from followers and s
 * lists more than one server, else its primary's. */
uint32_t embps_client_conn_for_(const embps_client_t *c, uint32_t s,
                                const embps_ticket_t *t);

/* ---- tickets ---- */

/* A ticket of n_parts parts, zeroed but for their ticket; NULL when out
 * of memory. */
embps_ticket_t *embps_ticket_new_(op_t op, uint32_t n_parts);
/* Frees t and everything its parts own; NULL-safe. None of its parts may
 * still be queued on a connection (embps_ticket_run_ returned). */
void embps_ticket_free_(embps_ticket_t *t);
/* Fails t with code and a message, unless it failed already (the first
 * error is the one reported). */
void embps_ticket_fail_(embps_ticket_t *t, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Part p is answered, failed, or was never sent. */
static inline void embps_part_done_(part_t *p) { p->t->n_done++; }
/* Lets t's parts be sent again after a connection failure, until the
 * client's retry time from now is over. */
void embps_ticket_allow_retry_(const embps_client_t *c, embps_ticket_t *t);
/* Runs I/O until every part of t is done; returns t's result (0 or the
 * first error, with t->error). */
int embps_ticket_run_(embps_client_t *c, embps_ticket_t *t);
/* Ends t's retries: its parts still pending anywhere fail with code, so
 * none stays linked once t is freed. */
void embps_ticket_cancel_(embps_client_t *c, embps_ticket_t *t, int code);

/* ---- sending ---- */

/* Sends part p, its frame built, to member s (on the connection
 * embps_client_conn_for_ picks): now when connected (or it
 * connects), later when the connection is down and p's ticket may retry;
 * otherwise p fails. */
void embps_part_submit_(embps_client_t *c, uint32_t s, part_t *p);
/* Builds the frame for message m (no bulk) into p and sends it to server
 * s. Returns 0 (a failure to send is p's ticket's) or the build error. */
int embps_part_send_msg_(embps_client_t *c, uint32_t s, part_t *p,
                         const embps_msg_t *m);
/* 0, or EMBPS_EFRAMESIZE (c's last error set) when a frame of frame_len
 * bytes is larger than server s accepts. */
int embps_client_frame_fits_(embps_client_t *c, uint32_t s,
                             size_t frame_len);

/* ---- connections ---- */

/* Makes sure connection ki (an index into c->conns) is connected
 * (reconnecting after a failure, with the hello; a member's connection
 * tries its servers until one has the role it wants); a new connection
 * first sends again, in their order, the requests still pending from the
 * broken one. 0, or an error (c's last error set) with the next attempt
 * scheduled. */
int embps_client_connect_(embps_client_t *c, uint32_t ki);
/* Closes k, if open, failing every part waiting on it with code (or
 * keeping those that may retry when may_retry: then a push given up
 * leaves its owed copy in its place); frees its buffers. */
void embps_conn_drop_(conn_t *k, int code, const char *why, int may_retry);

/* ---- reaching a server (dial.c) ---- */

/* A TCP connection to host:port (non-blocking, TCP_NODELAY) made within
 * timeout_ms: its descriptor, or -1 with why. */
int embps_dial_(const char *host, int port, int timeout_ms, char *why,
                size_t why_len);
/* The HELLO c says on every connection (its protocol version, its
 * token) into *m. */
void embps_hello_msg_(const embps_client_t *c, embps_msg_t *m);
/* A HELLO with c's token to host:port on a connection of its own, the
 * whole exchange within timeout_ms, closed after: 0 with *out (the
 * server's role and epoch now), or an error. Uses c's request ids only. */
int embps_dial_hello_(embps_client_t *c, const char *host, int port,
                      int timeout_ms, embps_hello_reply_t *out);

/* ---- a server talking to another (peer.c; issue 21: a follower and its
 * primary) ---- */

/* A client of the one server at addr ("HOST:PORT"), whatever its place in
 * its cluster, saying hello with token; each call gets timeout_ms, none
 * is retried. 0, or an error with err. */
int embps_client_create_peer_(const char *addr, const char *token,
                              size_t token_len, int timeout_ms,
                              embps_client_t **out, char *err,
                              size_t err_len);
/* Sends request m (no bulk) to the peer; *t is the ticket to wait on
 * (several may be in flight). 0 or an error (c's last error). */
int embps_client_send_(embps_client_t *c, const embps_msg_t *m,
                       embps_ticket_t **t);
/* Waits for t and frees it: 0 with *reply (release with embps_msg_free)
 * and *bulk (malloc'd, NULL when none; the caller frees it), or an error
 * (an ERROR reply's code, its message c's last error, its LSN in
 * *err_lsn when err_lsn is not NULL). */
int embps_client_wait_(embps_client_t *c, embps_ticket_t *t,
                       embps_msg_t *reply, uint8_t **bulk, size_t *bulk_len,
                       uint64_t *err_lsn);
/* Frees t without waiting (a reply still owed drops its connection);
 * NULL-safe. c may be NULL once destroyed. */
void embps_client_cancel_(embps_client_t *c, embps_ticket_t *t);
/* ---- a request of any kind (snapshot.c) ---- */

/* Sends m (no bulk) to server s now, as a ticket of its own; the bulk of
 * its reply, when it fits dst_cap bytes, is read straight into dst, which
 * must stay valid until embps_client_reply_ (dst NULL: no bulk expected).
 * Not sent again after a broken connection. 0 with *out, or an error
 * (c's last error set). */
int embps_client_request_(embps_client_t *c, uint32_t server,
                          const embps_msg_t *m, uint8_t *dst, size_t dst_cap,
                          embps_ticket_t **out);
/* Waits for t (embps_client_request_'s) and frees it: 0 with *reply (the
 * decoded reply: embps_msg_free it) and *bulk_len (its bulk bytes, in
 * dst), or the server's error or a transport error (c's last error set).
 * A reply whose bulk did not fit dst is EMBPS_EPROTO. Every ticket must be
 * waited for before its dst is reused. */
int embps_client_reply_(embps_client_t *c, embps_ticket_t *t,
                        embps_msg_t *reply, size_t *bulk_len);

/* ---- owed pushes ---- */

/* After push ticket t ran (rc its result): 0 when every server applied
 * it (its owed copies, if any, completed meanwhile); otherwise c's last
 * error says which servers applied it and which did not, and the code is
 * EMBPS_EPARTIAL when some did. A push no server can have applied (none
 * acknowledged it, none was sent it whole) keeps rc and owes nothing. */
int embps_push_outcome_(embps_client_t *c, embps_ticket_t *t, int rc);
/* Frees every owed push (the client is destroyed). */
void embps_owed_free_all_(embps_client_t *c);
#endif
