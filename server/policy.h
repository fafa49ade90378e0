/* policy.h - admission and eviction bookkeeping of a table's shards
 * (issue 12), for table.c and table_io.c only (see table_impl.h).
 *
 * Per shard, under its write lock, for tables with hashed storage:
 *  - admission: a count-min sketch (admit.h) counts pushes of ids without a
 *    row; the push that brings an id's count to admit_after makes the row
 *    (initial value) and applies that push's gradient only. Earlier
 *    gradients are counted, never applied (DeepRec's counter filter does
 *    the same). --admit-probability admits by a hash of (seed, id).
 *  - recency: a doubly linked list of slots, least recently pushed first,
 *    in push order (rows of one push in the order the push lists them);
 *    TTL expiry and LRU eviction take its head. LFU keeps a min-heap keyed
 *    (pushes, last step, id).
 *  - ttl: a row whose last push is ttl_steps or more steps old reads as
 *    its initial value at once (pulls and pushes check its step); its
 *    memory is reclaimed from the list head by later pushes to the shard
 *    (a bounded number per push), or all at once by embps_table_evict.
 *  - capacity: each shard holds at most cap_shard = ceil(max_rows /
 *    servers / shards) rows; a push that passes it evicts after applying,
 *    never a row of the push itself. What a push evicts (capacity, and
 *    the expired rows it reclaims) is decided at its prepare and recorded
 *    in its log record, so a replay or a follower evicts exactly those.
 * Evicted slots go on the shard's free list; the next new rows reuse them,
 * so memory stays at the capacity plus one push. Every decision depends
 * only on the table's state and the order of pushes, so replaying the log
 * from a checkpoint decides the same way.
 *
 * policy.c also holds embps_table_evict and embps_table_row_live
 * (table.h). It calls nothing of table.c: the bytes it allocates are
 * returned for the caller to count. */
#ifndef EMBPS_POLICY_H
#define EMBPS_POLICY_H
#include <stdint.h>

#include "table_impl.h"

/* Sketch bytes of a table on a server: --admit-sketch-bytes (default
 * 1 MiB), which the shards share (admit.h). */
size_t embps_policy_sketch_bytes(const embps_table_spec_t *spec);

/* Sets up the admission and eviction state of a new table whose shards
 * exist (t->policy, has_meta, admit_count, the capacities, the sketches).
 * *added = bytes allocated. 0 or -ENOMEM (then the caller destroys t). */
int embps_policy_setup(embps_table_t *t, uint32_t cluster_size,
                       int64_t *added);
/* Frees a shard's policy state (destroy). */
void embps_policy_shard_close(shard_t *sh);

/* Bytes that room for `rows` slots would add to sh's slot bookkeeping. */
uint64_t embps_policy_growth_bytes(const embps_table_t *t, const shard_t *sh,
                                   uint32_t rows);
/* Grows sh's slot bookkeeping (and LFU heap) to hold `rows` slots; the
 * meta array is swapped in under the write lock (pulls read it), so call
 * without it. *added = bytes allocated. The applying thread. 0, -ENOMEM. */
int embps_policy_grow(embps_table_t *t, shard_t *sh, uint32_t rows,
                      int64_t *added);

/* A new row in slot of sh, pushed once at `step`. Write lock held. */
void embps_policy_on_insert_locked(const embps_table_t *t, shard_t *sh,
                                   uint32_t slot, int64_t id, uint64_t step);
/* A push at `step` of the row in slot (restart: count it as new). Write
 * lock held. */
void embps_policy_on_push_locked(const embps_table_t *t, shard_t *sh,
                                 uint32_t slot, uint64_t step, int restart);
/* Restore: the row in slot was last pushed at last_step, freq times (0
 * read as 1); its heap place follows. Write lock held. */
void embps_policy_set_row_locked(const embps_table_t *t, shard_t *sh,
                                 uint32_t slot, uint64_t last_step,
                                 uint32_t freq);
/* Evicts the row in slot: out of the list, the heap, the store (onto its
 * free list). Write lock held. */
void embps_policy_evict_slot_locked(const embps_table_t *t, shard_t *sh,
                                    uint32_t slot);

/* The fate (W_*) of every position of shard k in a push grouped in s
 * (s->what, s->slot, s->rec), judged at table step `now` (before the
 * push). Returns the rows the push makes in the shard. The applying
 * thread, no lock (it is the only writer). */
uint32_t embps_policy_find_shard(const embps_table_t *t,
                                 embps_table_scratch_t *s, uint32_t k,
                                 const int64_t *ids, uint64_t now);
/* Counts a push of id not admitted into sh's sketch: the shard's pending
 * ids (c) go up by one for an id the sketch did not know, halve when the
 * sketch ages. Write lock held. */
void embps_policy_count_pending_locked(shard_t *sh, int64_t id,
                                       dyn_count_t *c);
/* After embps_policy_find_shard of a push grouped in s (fates, slots),
 * plans the evictions that follow it in shard k once applied at table
 * step `now` (the push's): a bounded number of expired rows (8 + 2 x its
 * positions there) from the head of the recency list, then the rows past
 * the shard's capacity (never a row of the push), as s->plan_slot from
 * plan_start[k] (the first plan_ttl[k] TTL reclaims; policy.c says how
 * each is chosen). Shards are planned in order, 0 first. The applying
 * thread, no lock (the only writer). 0 or -ENOMEM. */
int embps_policy_plan_shard(const embps_table_t *t, embps_table_scratch_t *s,
                            uint32_t k, uint64_t now);
/* Evicts shard k's planned rows (after the push's rows were applied),
 * counting them in c; the time taken is an eviction stall. Write lock
 * held. */
void embps_policy_evict_planned_locked(embps_table_t *t, shard_t *sh,
                                       const embps_table_scratch_t *s,
                                       uint32_t k, dyn_count_t *c);
/* Adds the counters c of a push's (or an eviction's, or a restore's) part
 * in shard sh to the shard's, under its write lock, and to the table's.
 * The shard's pending count stays >= 0; c->pending becomes the change
 * made. Rows evicted leave rows_allocated. */
void embps_policy_add_counts_locked(embps_table_t *t, shard_t *sh,
                                    dyn_count_t *c);
/* Raises the table's longest eviction stall to ns. Any thread. */
void embps_policy_note_stall(embps_table_t *t, uint64_t ns);
#endif
