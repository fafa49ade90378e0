/* ddl.h - table DDL (CREATE, DROP, ALTER), run on the apply thread so that
 * each takes effect, and is logged, in order with the pushes: a push
 * applied after it sees the new table set and hyperparameters, one before
 * it the old. */
#ifndef EMBPS_DDL_H
#define EMBPS_DDL_H
#include "apply.h"

/* The runs of CREATE, DROP and ALTER requests: each checks its request,
 * changes the registry or the table, logs it with --data-dir, sets the
 * reply or the error (nothing changed then) and completes the request
 * (embps_durable_ack). */
void embps_ddl_create(embps_apply_ctx_t *ctx, embps_request_t *req);
void embps_ddl_drop(embps_apply_ctx_t *ctx, embps_request_t *req);
void embps_ddl_alter(embps_apply_ctx_t *ctx, embps_request_t *req);
#endif
