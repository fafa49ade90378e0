/* admit.h - feature admission for dynamic tables (issue 12): a count-min
 * sketch with conservative update that counts the pushes of ids not yet
 * materialised, and the (seed, id) hash behind --admit-probability.
 *
 * Everything is a pure function of the table seed and the order of the
 * pushes, so every server and every replay of the log decides alike.
 *
 * Layout: one count-min sketch of depth d = 4 and width W per server
 * (--admit-sketch-bytes / 8 counters a row), cut into G = W / 64 groups of
 * 64 counters. An id's group is fixed by the hash that picks its shard
 * (route.h: the id's position in [0, 1)), its counter inside the group by
 * one hash per row. A shard holds only the groups its part of [0, 1)
 * overlaps (at most one group more than its share), each shard's copy of
 * a group counting only its own ids. So the shards together are one sketch
 * whatever their number, and a restore into another shard count rebuilds
 * each new shard's groups from the old copies (embps_sketch_merge).
 *
 * Error: an estimate is never below the true count (since the last aging);
 * with L_g pushes counted in the id's group (on average L x 64 / W for L
 * pushes counted) it exceeds it by more than e L_g / 64 with probability
 * below e^-d (about 2%). An id is admitted early ("false admission") only
 * when all its d counters were raised by other ids: for admit_after 2, at
 * most (1 - e^(-L_g/64))^4. The sketch ages: after as many counted pushes
 * as a shard has counters in a row, every counter of that shard is halved
 * (as TinyLFU does), so L_g <= 64 on average and the rate stays below 16%
 * (about 4% averaged over the window) however long the stream, instead of
 * the counters saturating. After a restore into another shard count a
 * group copied from two old shards takes the larger counter of each pair:
 * never below either's ids' counts, never above one sketch of the whole
 * stream, so the same bounds hold.
 *
 * Sketches of checkpoints of format 2 (before the groups) used one plain
 * width-W/S sketch per shard (`legacy`); a table restored from one into
 * the same shard count keeps that layout. */
#ifndef EMBPS_ADMIT_H
#define EMBPS_ADMIT_H
#include <stddef.h>
#include <stdint.h>

#define EMBPS_SKETCH_DEPTH 4u
#define EMBPS_SKETCH_MIN_WIDTH 64u
#define EMBPS_SKETCH_GROUP 64u /* counters of a group, per row */
#define EMBPS_SKETCH_MAX 65535u /* a counter saturates there */

typedef struct {
  uint16_t *c;       /* depth x width counters */
  uint32_t width;    /* counters a row: n_groups x EMBPS_SKETCH_GROUP */
  uint32_t groups;   /* G, groups of the server's sketch; 0: legacy */
  uint32_t g0;       /* the first group held */
  uint64_t seed;
  uint64_t adds;     /* counted pushes since the last aging */
} embps_sketch_t;

/* Shard k of n_shards of a sketch of about `bytes` bytes (at least one
 * group a shard) seeded from the table seed. 0 or -ENOMEM. */
int embps_sketch_init(embps_sketch_t *s, size_t bytes, uint64_t seed,
                      uint32_t k, uint32_t n_shards);
/* A legacy sketch (format 2) of `width` counters a row. 0 or -ENOMEM. */
int embps_sketch_init_legacy(embps_sketch_t *s, uint32_t width,
                             uint64_t seed);
void embps_sketch_free(embps_sketch_t *s);
size_t embps_sketch_bytes(const embps_sketch_t *s);
/* The estimated pushes of id (never below the true count). */
uint32_t embps_sketch_estimate(const embps_sketch_t *s, int64_t id);
/* Counts one push of id (conservative update: only the counters at the
 * minimum grow) and ages the sketch when due. Returns the estimate before
 * the push. */
uint32_t embps_sketch_add(embps_sketch_t *s, int64_t id);
/* Restore into another shard count: takes into dst (a grouped sketch of
 * the same G and seed) the larger of its and src's counter for every
 * group both hold, and src's adds in proportion to the groups taken.
 * src's counters are those of n_src groups from group g0_src, depth x
 * n_src x EMBPS_SKETCH_GROUP of them. */
void embps_sketch_merge(embps_sketch_t *dst, const uint16_t *src,
                        uint32_t g0_src, uint32_t n_src, uint64_t adds_src);

/* --admit-probability: 1 if id passes, a fixed function of (seed, id):
 * the same id gets the same answer on every push and every server. */
int embps_admit_by_hash(uint64_t seed, int64_t id, double p);
#endif
