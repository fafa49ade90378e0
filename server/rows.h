/* rows.h - export (SCAN, kind 10) and import (WRITE_ROWS, kind 11) of a
 * table's rows on the server; see rows.c. */
#ifndef EMBPS_ROWS_H
#define EMBPS_ROWS_H
#include <stdint.h>

#include "server.h"

/* I/O thread: answers a SCAN with one chunk of rows (req->reply set). */
void embps_rows_scan(embps_server_t *srv, embps_request_t *req);
/* I/O thread: validates a WRITE_ROWS whole and hands it to the apply
 * thread (DEFERRED), or fails it (REPLY) with nothing changed. */
embps_dispatch_t embps_rows_write_check(embps_server_t *srv,
                                        embps_request_t *req);
/* Apply thread: applies a checked WRITE_ROWS (logged at next_lsn with
 * --data-dir) and sets req->reply. Returns the LSN used (0: none, e.g.
 * refused or no data dir). */
uint64_t embps_rows_apply(embps_server_t *srv, embps_request_t *req,
                          embps_table_scratch_t *s, uint64_t next_lsn);
#endif
