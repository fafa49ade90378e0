/* admit.h - feature admission for dynamic tables (issue 12): a count-min
 * sketch with conservative update that counts the pushes of ids not yet
 * materialised, and the (seed, id) hash behind --admit-probability.
 *
 * Everything is a pure function of the table seed and the order of the
 * pushes, so every server and every replay of the log decides alike.
 *
 * Error: an estimate is never below the true count (since the last aging);
 * with width w and depth d = 4 it exceeds it by more than e/w times the
 * pushes counted with probability below e^-d (about 2%). An id is admitted
 * early ("false admission") only when all its d counters were raised by
 * other ids: for admit_after 2, with L = pushes counted since the last
 * aging, at most (1 - e^(-L/w))^4. The sketch ages: after w counted pushes
 * every counter is halved (as TinyLFU does), so L <= w and the rate stays
 * below 16% (about 4% averaged over the window) however long the stream,
 * instead of the counters saturating. */
#ifndef EMBPS_ADMIT_H
#define EMBPS_ADMIT_H
#include <stddef.h>
#include <stdint.h>

#define EMBPS_SKETCH_DEPTH 4u
#define EMBPS_SKETCH_MIN_WIDTH 64u
#define EMBPS_SKETCH_MAX 65535u /* a counter saturates there */

typedef struct {
  uint16_t *c;       /* depth x width counters */
  uint32_t width;
  uint64_t seed;
  uint64_t adds;     /* counted pushes since the last aging */
} embps_sketch_t;

/* A sketch of about `bytes` bytes (at least EMBPS_SKETCH_MIN_WIDTH counters
 * a row) seeded from the table seed. 0 or -ENOMEM. */
int embps_sketch_init(embps_sketch_t *s, size_t bytes, uint64_t seed);
void embps_sketch_free(embps_sketch_t *s);
size_t embps_sketch_bytes(const embps_sketch_t *s);
/* The estimated pushes of id (never below the true count). */
uint32_t embps_sketch_estimate(const embps_sketch_t *s, int64_t id);
/* Counts one push of id (conservative update: only the counters at the
 * minimum grow) and ages the sketch when due. Returns the estimate before
 * the push. */
uint32_t embps_sketch_add(embps_sketch_t *s, int64_t id);

/* --admit-probability: 1 if id passes, a fixed function of (seed, id):
 * the same id gets the same answer on every push and every server. */
int embps_admit_by_hash(uint64_t seed, int64_t id, double p);
#endif
