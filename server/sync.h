/* sync.h - synchronous tables (--sync-workers N), as TensorFlow's sparse
 * conditional accumulator: the pushes of one step from N distinct workers
 * are held, then merged (duplicates summed across workers), divided by N
 * and applied as one optimizer step; only then are all N acknowledged.
 *
 * Steps are numbered from 1: step k is the table's k-th synchronous step.
 * A push for a step already applied, for a step ahead of the current one,
 * or a second push from the same worker (client id) in a step is refused;
 * but a retry of a held push (same client id and seq: its connection
 * broke) replaces it, the old one completed without a reply. (A retry of a
 * push whose step was applied is a duplicate: push.c acknowledges it.)
 * A push whose table was dropped, or that arrives once shutdown began, is
 * refused; drop and shutdown also fail the pushes already held.
 * Used only by the apply thread, so nothing here locks. */
#ifndef EMBPS_SYNC_H
#define EMBPS_SYNC_H
#include <stddef.h>
#include <stdint.h>

#include "merge.h"
#include "request.h"

struct embps_server;

typedef struct embps_sync_step embps_sync_step_t;

typedef struct {
  embps_sync_step_t *steps; /* one open step per synchronous table */
  size_t n, cap;
  int64_t *idx;             /* scratch for the combined gradient */
  float *vals;
  size_t scratch_rows;
  embps_dedup_t dedup;
  int draining;             /* shutdown began: nothing is held any more */
} embps_sync_t;

void embps_sync_init(embps_sync_t *s);
/* Shutdown has begun: every held push fails (EMBPS_ESHUTDOWN) and is
 * completed, and from now on embps_sync_offer refuses, so no connection
 * waits for a step that cannot complete. */
void embps_sync_drain(embps_sync_t *s, struct embps_server *srv);
/* Drains, then frees everything. */
void embps_sync_close(embps_sync_t *s, struct embps_server *srv);
/* A table was dropped: the open step of every table that is no longer the
 * one its name designates closes, each held push failing (EMBPS_ENOTABLE)
 * and completed, and the step lets go of the table. */
void embps_sync_forget_dropped(embps_sync_t *s, struct embps_server *srv);

/* Offers a push (req->table synchronous, merged, step set). Returns:
 *   0  held: the step still waits for other workers;
 *   1  the step is complete: *ready is the list (linked by ->next) of its
 *      N requests, and *idx / *vals / *n the averaged merged gradient
 *      (valid until the next call);
 *   2  the step is complete but could not be combined (out of memory):
 *      *ready's requests all hold that error as their reply;
 *   <0 refused: req->reply holds the error (EMBPS_ESHUTDOWN once drained,
 *      EMBPS_ENOTABLE when its table was dropped, EMBPS_ESTEP or
 *      -ENOMEM); req is not completed. */
int embps_sync_offer(embps_sync_t *s, struct embps_server *srv,
                     embps_request_t *req, embps_request_t **ready,
                     const int64_t **idx, const float **vals, size_t *n);
#endif
