/* request.h - one request, from the frame that carried it to the reply
 * sent for it, and what every handler answers it with.
 *
 * A request is owned by its connection (conn.c). The I/O thread that read
 * it dispatches it (dispatch.c); a request that changes tables is handed
 * to the apply thread with req->run set to its handler (apply.h) and comes
 * back through req->complete once its reply is set, after its log record
 * is durable when it must be (durable.h). Its reply is either the reply
 * frame of its kind or an error frame; a handler never sends, it sets
 * req->reply with the helpers below. */
#ifndef EMBPS_REQUEST_H
#define EMBPS_REQUEST_H
#include <stddef.h>
#include <stdint.h>

#include "bufpool.h"
#include "frame.h"
#include "table.h"
#include "wal.h"
#include "wire.h"

struct embps_server;
struct embps_apply_ctx;
typedef struct embps_conn embps_conn_t;

typedef struct embps_request {
  embps_conn_t *conn;
  embps_frame_header_t hdr;
  uint8_t *body; /* the frame body (owned); bulk arrays are read in place */
  size_t body_cap;         /* bytes allocated at body */
  embps_bufpool_t *bodies; /* where body goes back to */
  embps_msg_t msg;
  uint8_t *reply; /* the reply frame (owned until handed to the writer) */
  size_t reply_len;
  /* a push or an import on its way to the apply thread */
  embps_table_t *table; /* referenced */
  int64_t *idx;         /* merged, in place in body */
  float *vals;
  size_t n_unique;
  int vals_small; /* every value of vals within EMBPS_TABLE_G_SCREEN */
  uint64_t start_ns; /* when dispatch began (latency metrics) */
  struct embps_request *next;
  /* Set by whoever submits it to the apply thread: run there, with the
   * thread's context, to do the work and set the reply (apply.h). */
  void (*run)(struct embps_apply_ctx *ctx, struct embps_request *req);
  /* Set by the request's owner: called once a deferred request has its
   * reply (on the apply, log or checkpoint thread); owner is the owner's
   * context. */
  void (*complete)(struct embps_request *req);
  void *owner;
  embps_wal_waiter_t wal; /* while it waits for the log (durable.c) */
  uint64_t ack_lsn;       /* its reply waits until this LSN is durable */
  uint64_t deadline_ns;   /* parked or held: when it gives up (monotonic) */
} embps_request_t;

/* Frees req and what it owns, and lets go of req->table; NULL-safe. */
void embps_request_free(embps_request_t *req);
/* Sets req->reply to an error frame (code, printf-style message; the
 * message is escaped, it may echo a peer's bytes) and counts the error. */
void embps_request_fail(struct embps_server *srv, embps_request_t *req,
                        int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same, the error naming an LSN (EMBPS_EDIVERGED: the last one the
 * two logs share). */
void embps_request_fail_at(struct embps_server *srv, embps_request_t *req,
                           int code, uint64_t lsn, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Sets req->reply to the reply frame of kind|REPLY for m (NULL: an empty
 * message) with bulk_len bulk bytes; returns where the bulk goes, or NULL
 * with req failed (out of memory). */
void *embps_request_reply(struct embps_server *srv, embps_request_t *req,
                          uint16_t kind, const embps_msg_t *m,
                          size_t bulk_len);
/* The request's bulk arrays (in place in its body) and their bytes. */
uint8_t *embps_request_bulk(const embps_request_t *req, size_t *len);
/* The table named, referenced; NULL with req failed (unknown table). */
embps_table_t *embps_request_table(struct embps_server *srv,
                                   embps_request_t *req, const char *name);
/* 0 when dim is t's, else non-zero with req failed. */
int embps_request_check_dim(struct embps_server *srv, embps_request_t *req,
                            const embps_table_t *t, uint32_t dim);
/* Fails req for id after embps_table_check_ids refused it with rc. */
void embps_request_fail_id(struct embps_server *srv, embps_request_t *req,
                           const embps_table_t *t, int rc, int64_t id);
#endif
