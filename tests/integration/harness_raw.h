/* harness_raw.h - frames written by hand to a real server, for what the
 * library never sends (garbage, wrong counts, requests before a hello,
 * foreign rows), built with common/frame.h and common/wire.h. A raw
 * connection is a blocking TCP socket to 127.0.0.1; every read has a
 * deadline, and anything unexpected fails the running test. */
#ifndef EMBPS_TEST_HARNESS_RAW_H
#define EMBPS_TEST_HARNESS_RAW_H
#include "frame.h"
#include "harness_model.h"
#include "wire.h"

typedef struct {
  embps_frame_header_t h;
  uint8_t *body;
  embps_msg_t m;
  int has_msg;
} it_raw_reply_t;

/* A connected socket to 127.0.0.1:port (TCP_NODELAY). */
int it_raw_connect(int port);
/* Writes what it can of n bytes within timeout_ms (no SIGPIPE); returns
 * the bytes written, fewer when the peer stops reading or goes away. */
size_t it_raw_put(int fd, const void *p, size_t n, int timeout_ms);
/* Bytes written to fd that the server has not read yet: what this side's
 * kernel still holds (SIOCOUTQ) plus what waits in the receive queue of
 * the server's socket (its line of /proc/net/tcp). -1 if that line is
 * not found. Lets a test wait until the server has really read what it
 * was sent, without a request (which a server out of budget would not
 * read). */
long it_raw_unread(int fd);
/* Sends m as a frame of `kind` with req_id, followed by bulk, each part
 * within 5 s: 0, or -1 when the server did not take it all. */
int it_raw_try_send(int fd, uint16_t kind, embps_msg_t *m, uint32_t req_id,
                    const void *bulk, size_t bulk_len);
/* The same, failing the test when the frame does not go out. */
void it_raw_send(int fd, uint16_t kind, embps_msg_t *m, uint32_t req_id,
                 const void *bulk, size_t bulk_len);
/* Reads one frame within timeout_ms: 0 (its meta must decode; free it
 * with it_raw_reply_free), 1 if the server closed or reset the connection
 * first, -1 if nothing whole came by then. */
int it_raw_get(int fd, it_raw_reply_t *r, int timeout_ms);
/* A frame that must come within 5 s. */
void it_raw_recv(int fd, it_raw_reply_t *r);
void it_raw_reply_free(it_raw_reply_t *r);
/* Expects an error frame with `code` whose message holds substr (req_id
 * checked unless UINT32_MAX). */
void it_raw_expect_error(int fd, uint32_t req_id, int code,
                         const char *substr);
/* 1 if the server closes the connection within timeout_ms (whatever it
 * sends first is discarded; with timeout_ms 0, what is there already). */
int it_raw_closed(int fd, int timeout_ms);
/* A hello (token may be NULL) that must be answered. */
void it_raw_hello(int fd, const char *token, uint32_t req_id);
/* A push of n rows of dim with bulk as given (its length may lie). */
void it_raw_push(int fd, uint32_t req_id, const char *table, uint32_t n,
                 uint32_t dim, const void *bulk, size_t bulk_len);
/* A pull saying n_ids ids, carrying the first n_sent of ids. */
void it_raw_pull(int fd, uint32_t req_id, const char *table, uint32_t n_ids,
                 uint32_t dim, const int64_t *ids, size_t n_sent);
/* A raw pull that must succeed with the model's rows. */
void it_raw_pull_check(int fd, uint32_t req_id, const char *table,
                       const it_ref_t *ref, const int64_t *ids, size_t n);
#endif
