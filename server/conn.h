/* conn.h - connection I/O (conn.c): the I/O threads, each a libuv loop
 * that owns its connections for life, reads their frames, runs their
 * requests within their budgets and writes the replies.
 *
 * The server's lifecycle (server.c) is the only caller: it starts the
 * threads, hands them accepted sockets, asks them to make room under
 * --max-connections or to drain at shutdown, joins and frees them. What
 * the threads of one server share is in embps_io_shared_t, owned by the
 * lifecycle and passed in. */
#ifndef EMBPS_CONN_H
#define EMBPS_CONN_H
#include <stdatomic.h>
#include <stddef.h>
#include <uv.h>

#include "server.h"

/* One I/O thread. */
typedef struct embps_io embps_io_t;

/* State of one server that all its I/O threads update. */
typedef struct {
  /* sockets accepted and not closed yet: the listener counts them in
   * before it hands them over, the I/O threads count them out */
  atomic_uint open_conns;
  /* bytes held by all connections (conn.c's "Budgets") */
  atomic_size_t run_bytes, queued_bytes;
} embps_io_shared_t;

/* Sets up an I/O thread's loop and starts it, for srv's connections,
 * sharing *shared (which must outlive it). 0 with *out set, or a negative
 * code with nothing left set up. */
int embps_io_start(embps_server_t *srv, embps_io_shared_t *shared,
                   embps_io_t **out);
/* Gives accepted socket fd (counted in open_conns) to io; from any
 * thread. io opens it as a connection, or closes it when draining. */
void embps_io_add(embps_io_t *io, int fd);
/* Connections of io without a hello that it was not asked to close yet
 * (from any thread). */
unsigned embps_io_strangers(const embps_io_t *io);
/* Asks io to close its oldest connection without a hello (any thread). */
void embps_io_evict(embps_io_t *io);
/* Asks io to stop reading, finish every request already read, flush the
 * replies, close its connections and end its loop (any thread, once
 * nothing may give it sockets any more). */
void embps_io_drain(embps_io_t *io);
/* Waits for io's thread to end (after embps_io_drain). */
void embps_io_join(embps_io_t *io);
/* Frees io, whose thread was joined. */
void embps_io_close(embps_io_t *io);

/* Closes every handle still open on loop (which is not running), then the
 * loop; what names it in the warnings. */
void embps_loop_close(uv_loop_t *loop, const char *what);
#endif
