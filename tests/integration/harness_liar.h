/* harness_liar.h - a lying embps server for the client's tests: a forked
 * process listening on 127.0.0.1 port 0 that answers the hello (a
 * cluster of one, --max-frame-bytes 64 MiB) and DESCRIBE of its one
 * table truthfully, and hands every other request to the test's
 * callback, which may answer anything a broken or hostile server could:
 * the wrong kind, counts or sizes, flags that never end a loop, text with
 * control bytes, raw bytes. The child serves one connection at a time
 * until it is stopped (kill -9), and dies with the test. */
#ifndef EMBPS_TEST_HARNESS_LIAR_H
#define EMBPS_TEST_HARNESS_LIAR_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "embps/embps.h"
#include "frame.h"
#include "wire.h"

/* Answers request req (header h, its bulk in bulk) on fd, in the child.
 * Returns 0 to go on reading requests, -1 to close the connection. */
typedef int (*it_liar_fn)(int fd, const embps_frame_header_t *h,
                          const embps_msg_t *req, const uint8_t *bulk,
                          void *arg);

typedef struct {
  pid_t pid;
  char addr[32]; /* "127.0.0.1:PORT" */
} it_liar_t;

/* Forks the liar for table spec (DESCRIBE of spec->name answers it, with
 * rows_allocated 0), lie answering the rest with arg; fails the test if it
 * cannot listen. */
void it_liar_start(it_liar_t *l, const embps_table_spec_t *spec,
                   it_liar_fn lie, void *arg);
/* kill -9 and reap. */
void it_liar_stop(it_liar_t *l);
/* In the child: a frame of m with req_id, then bulk_len bytes of bulk
 * (the header counts them). 0, or -1 once the client is gone. */
int it_liar_reply(int fd, const embps_msg_t *m, uint32_t req_id,
                  const void *bulk, size_t bulk_len);
/* In the child: an ERROR frame of code and message. */
int it_liar_error(int fd, uint32_t req_id, int code, const char *message);
#endif
