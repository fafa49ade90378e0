/* rows.h - export (SCAN, kind 10) and import (WRITE_ROWS, kind 11) of a
 * table's rows on the server; see rows.c. */
#ifndef EMBPS_ROWS_H
#define EMBPS_ROWS_H
#include "apply.h"

struct embps_server;

/* I/O thread: answers a SCAN with one chunk of rows (req->reply set). */
void embps_rows_scan(struct embps_server *srv, embps_request_t *req);
/* I/O thread: validates a WRITE_ROWS whole: 0 with req->table, idx, vals
 * and n_unique set, for the apply thread (embps_rows_run), or -1 with req
 * failed and nothing changed. */
int embps_rows_write_check(struct embps_server *srv, embps_request_t *req);
/* The run of a checked WRITE_ROWS: sets the rows (logged first with
 * --data-dir), replies and completes req (embps_durable_ack). */
void embps_rows_run(embps_apply_ctx_t *ctx, embps_request_t *req);
#endif
