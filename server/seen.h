/* seen.h - the exactly-once table: the highest seq applied per client.
 *
 * A push may carry (client_id, seq); a push at or below its client's
 * highest applied seq is a retry of one already applied, acknowledged as a
 * duplicate without being applied again. The table is open addressing on
 * the client id (0: an empty slot), kept at most half full; past
 * EMBPS_SEEN_MAX clients it is reset (and logged), so exactly-once then
 * degrades to at-least-once for the clients forgotten. Checkpoints keep
 * it, and the log's PUSH records carry their pairs, so a restart restores
 * it. Not locked: one thread owns a table (the apply thread's, or the
 * restore's before it). */
#ifndef EMBPS_SEEN_H
#define EMBPS_SEEN_H
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

#define EMBPS_SEEN_MAX (1u << 20) /* clients remembered before a reset */

typedef struct {
  embps_ckpt_seen_t *v;
  size_t cap, n;
} embps_seen_t;

void embps_seen_init(embps_seen_t *s);
void embps_seen_close(embps_seen_t *s);
/* 1 when seq of client was applied already (at or below its highest);
 * 0 when not, or when client or seq is 0 (no exactly-once asked). */
int embps_seen_applied(const embps_seen_t *s, uint64_t client, uint64_t seq);
/* seq is client's highest applied now (client 0: nothing kept). On
 * allocation failure exactly-once degrades to at-least-once for that
 * client, which the log says. */
void embps_seen_record(embps_seen_t *s, uint64_t client, uint64_t seq);
/* Restore: as record, unless a higher seq of client is known already. */
void embps_seen_note(embps_seen_t *s, uint64_t client, uint64_t seq);
/* Every entry, for a checkpoint: malloc'd (the caller frees), *n set; NULL
 * when out of memory. */
embps_ckpt_seen_t *embps_seen_copy(const embps_seen_t *s, size_t *n);
/* Moves src's entries into dst (whose own are freed); src is left empty. */
void embps_seen_move(embps_seen_t *dst, embps_seen_t *src);
#endif
