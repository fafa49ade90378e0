/* push.h - a push on the apply thread: the second half of a push, after
 * dispatch.c validated and merged it on its I/O thread. */
#ifndef EMBPS_PUSH_H
#define EMBPS_PUSH_H
#include "apply.h"

/* The run of a PUSH (req->table, idx, vals, n_unique set): a duplicate
 * (exactly once) is acknowledged again; an asynchronous push is one
 * optimizer step; a synchronous one is held until its step has every
 * worker's push (sync.h), then the averaged step is applied and all of
 * them answered. With --data-dir a step is logged between table prepare
 * and commit. Completes what it answers (embps_durable_ack). */
void embps_push_run(embps_apply_ctx_t *ctx, embps_request_t *req);
#endif
