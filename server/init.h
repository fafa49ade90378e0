/* init.h - deterministic initial rows. A row never pushed reads as a pure
 * function of (table seed, row id, element), so it is the same on any number
 * of shards or servers and after a restart, and a pull never has to store
 * it. Each element draws from a counter-based generator (splitmix64 of
 * seed, id and element index): no state, any element in O(1). */
#ifndef EMBPS_INIT_H
#define EMBPS_INIT_H
#include <stdint.h>

#include "embps/embps.h"

/* Writes the initial weights of row `id` into w[0..spec->dim). */
void embps_init_row(const embps_table_spec_t *spec, int64_t id, float *w);
#endif
