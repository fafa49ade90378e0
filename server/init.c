/* init.c - see init.h. Normal draws use Box-Muller on two uniforms taken
 * from the element's own counter, so element j never depends on j-1. */
#include "init.h"

#include <math.h>
#include <string.h>

#include "route.h"

/* A uniform double in (0, 1) from 53 bits of a mixed counter. */
static double unit(uint64_t bits) {
  return ((double)(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

void embps_init_row(const embps_table_spec_t *spec, int64_t id, float *w) {
  uint32_t dim = spec->dim;
  switch (spec->init) {
  case EMBPS_INIT_ZEROS:
    memset(w, 0, dim * sizeof *w);
    return;
  case EMBPS_INIT_CONSTANT:
    for (uint32_t j = 0; j < dim; j++)
      w[j] = (float)spec->init_value;
    return;
  default:
    break;
  }
  uint64_t base = embps_mix64(spec->seed ^ 0x9e3779b97f4a7c15ULL) ^
                  embps_mix64((uint64_t)id);
  for (uint32_t j = 0; j < dim; j++) {
    uint64_t a = embps_mix64(base + 2 * (uint64_t)j + 1);
    if (spec->init == EMBPS_INIT_UNIFORM) {
      /* [-A, A): the double is below A, but rounding to float can reach it */
      const float hi = (float)spec->init_value;
      float v = (float)((2.0 * unit(a) - 1.0) * spec->init_value);
      w[j] = v < hi ? v : nextafterf(hi, 0.0f);
    } else {
      uint64_t b = embps_mix64(a ^ 0xd1b54a32d192ed03ULL);
      double r = sqrt(-2.0 * log(unit(a)));
      w[j] = (float)(r * cos(6.283185307179586 * unit(b)) * spec->init_value);
    }
  }
}
