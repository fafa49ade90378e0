/* evict.h - evictions that run on the apply thread (issue 12): `embps
 * evict TABLE` (wire kind EVICT) and the L2-norm eviction at each
 * checkpoint. Both are logged (EMBPS_WAL_EVICT) before they run, so the
 * log replays them in order with the pushes. */
#ifndef EMBPS_EVICT_H
#define EMBPS_EVICT_H
#include <stdint.h>

#include "server.h"

/* Runs an EVICT request: sets its reply (rows evicted) or its error.
 * *lsn is the apply thread's last LSN, advanced when a record is logged.
 * Returns the LSN the reply must wait for (0: none). */
uint64_t embps_evict_request(embps_server_t *srv, embps_request_t *req,
                             uint64_t *lsn);
/* At a checkpoint marker: evicts, and logs, the rows of every table with
 * --evict-l2-below whose norm is below it (and its expired rows). */
void embps_evict_at_checkpoint(embps_server_t *srv, uint64_t *lsn);
#endif
