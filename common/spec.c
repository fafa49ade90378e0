/* spec.c - table specs: defaults, validation, optimizer and dtype names. The server
 * runs embps_table_spec_check() on every create, the client before sending. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "abi.h"
#include "embps/embps.h"
#include "util.h"

static const char *const optimizer_names[] = {"sgd", "adagrad", "adam",
                                              "ftrl"};

const char *embps_optimizer_name(embps_optimizer_t opt) {
  if ((unsigned)opt < sizeof optimizer_names / sizeof *optimizer_names)
    return optimizer_names[opt];
  return "unknown";
}

int embps_optimizer_parse(const char *s, embps_optimizer_t *out) {
  for (unsigned i = 0; i < sizeof optimizer_names / sizeof *optimizer_names;
       i++) {
    if (strcmp(s, optimizer_names[i]) == 0) {
      *out = (embps_optimizer_t)i;
      return 0;
    }
  }
  return EMBPS_EINVAL;
}

uint32_t embps_optimizer_state_slots(embps_optimizer_t opt,
                                     const char *const **names) {
  static const char *const adagrad[] = {"accumulator"}, *const adam[] = {
      "m", "v"}, *const ftrl[] = {"n", "z"};
  const char *const *v = NULL;
  uint32_t n = 0;
  switch (opt) {
  case EMBPS_OPT_ADAGRAD:
    v = adagrad;
    n = 1;
    break;
  case EMBPS_OPT_ADAM:
    v = adam;
    n = 2;
    break;
  case EMBPS_OPT_FTRL:
    v = ftrl;
    n = 2;
    break;
  default:
    break;
  }
  if (names)
    *names = v;
  return n;
}

static const char *const dtype_names[] = {"f32", "f16", "bf16"};

const char *embps_dtype_name(embps_dtype_t dtype) {
  if ((unsigned)dtype < sizeof dtype_names / sizeof *dtype_names)
    return dtype_names[dtype];
  return "unknown";
}

int embps_dtype_parse(const char *s, embps_dtype_t *out) {
  for (unsigned i = 0; i < sizeof dtype_names / sizeof *dtype_names; i++) {
    if (strcmp(s, dtype_names[i]) == 0) {
      *out = (embps_dtype_t)i;
      return 0;
    }
  }
  return EMBPS_EINVAL;
}

void embps_table_spec_init(embps_table_spec_t *spec, const char *name,
                           uint32_t dim, embps_optimizer_t optimizer) {
  memset(spec, 0, sizeof *spec);
  if (name)
    snprintf(spec->name, sizeof spec->name, "%s", name);
  spec->dim = dim;
  spec->optimizer = optimizer;
  spec->lr = 0.01;
  spec->beta1 = 0.9;
  spec->beta2 = 0.999;
  spec->lr_power = -0.5;
  switch (optimizer) {
  case EMBPS_OPT_ADAGRAD:
    spec->eps = 1e-10;
    break;
  case EMBPS_OPT_ADAM:
    spec->eps = 1e-8;
    break;
  case EMBPS_OPT_FTRL:
    spec->initial_accumulator = 0.1;
    break;
  default:
    break;
  }
  spec->init = EMBPS_INIT_ZEROS;
}

/* The largest finite value of a dtype (every row is stored in it). */
static double dtype_max(embps_dtype_t dtype) {
  switch (dtype) {
  case EMBPS_DTYPE_F16:
    return 65504.0;
  case EMBPS_DTYPE_BF16:
    return 3.3895313892515355e38; /* 0x7f7f */
  default:
    return FLT_MAX;
  }
}

/* The largest |z| init.c's normal draws can give: the Box-Muller radius
 * sqrt(-2 ln u) at its smallest uniform, u = 2^-54. */
#define NORMAL_Z_MAX 8.66

/* Initial rows must be finite in the table's dtype: a bound on
 * init_value for each init (after the dtype is known good). */
static int spec_check_init(const embps_table_spec_t *s, char *why,
                           size_t why_len) {
  const double max = dtype_max(s->dtype), v = fabs(s->init_value);
  const char *dt = embps_dtype_name(s->dtype);
  if (s->init == EMBPS_INIT_NORMAL && v * NORMAL_Z_MAX > max)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "init normal std %g too large for %s: draws "
                  "reach %.2f std, past %s's largest value %g (max std %g)",
                  s->init_value, dt, NORMAL_Z_MAX, dt, max,
                  max / NORMAL_Z_MAX);
  if ((s->init == EMBPS_INIT_UNIFORM || s->init == EMBPS_INIT_CONSTANT) &&
      v > max)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "init %s value %g does not fit %s (largest "
                  "%g)", s->init == EMBPS_INIT_UNIFORM ? "uniform" : "constant",
                  s->init_value, dt, max);
  return 0;
}

static int name_ok(const char *name) {
  size_t n = strnlen(name, EMBPS_TABLE_NAME_MAX);
  if (n == 0 || n >= EMBPS_TABLE_NAME_MAX)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
      return 0;
  }
  return 1;
}

/* Admission and eviction (issue 12): dynamic tables only. */
static int spec_check_dynamic(const embps_table_spec_t *s, char *why,
                              size_t why_len) {
  int any = s->admit_after || s->admit_probability != 0 ||
            s->admit_sketch_bytes || s->ttl_steps || s->max_rows ||
            s->evict || s->evict_l2_below != 0;
  if (!any)
    return 0;
  if (!s->dynamic)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "admission and eviction need --dynamic");
  if (s->admit_after > 65535)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "admit-after %u too large (max 65535)",
                  s->admit_after);
  if (!(s->admit_probability >= 0 && s->admit_probability <= 1))
    return embps_refuse(EMBPS_EPARAM, why, why_len, "admit-probability must be in [0, 1] "
                  "(0: off)");
  if (s->admit_sketch_bytes > (1ULL << 34))
    return embps_refuse(EMBPS_EPARAM, why, why_len, "admit-sketch-bytes too large (max 2^34)");
  if ((unsigned)s->evict > EMBPS_EVICT_LFU)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "unknown evict policy %u", (unsigned)s->evict);
  if (!(s->evict_l2_below >= 0) || !isfinite(s->evict_l2_below))
    return embps_refuse(EMBPS_EPARAM, why, why_len, "evict-l2-below must be finite and >= 0");
  return 0;
}

int embps_table_spec_check(const embps_table_spec_t *s, char *why,
                           size_t why_len) {
  if (!name_ok(s->name))
    return embps_refuse(EMBPS_EPARAM, why, why_len,
                  "table name must be 1-127 characters of [A-Za-z0-9_.-]");
  for (size_t i = 0; i < sizeof s->reserved / sizeof *s->reserved; i++)
    if (s->reserved[i])
      return embps_refuse(EMBPS_EPARAM, why, why_len, "reserved word %zu of the spec is not 0: a "
                    "field libembps %s does not know (start a spec with "
                    "embps_table_spec_init)", i, EMBPS_VERSION_STRING);
  if (s->dim == 0 || s->dim > EMBPS_DIM_MAX)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "dim %u out of range [1, %u]", s->dim,
                  EMBPS_DIM_MAX);
  if (s->dynamic && s->rows)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "a table is either --rows N or --dynamic");
  if (!s->dynamic && s->rows == 0)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "a dense table needs rows > 0");
  if (!s->dynamic && s->rows > (1ULL << 40))
    return embps_refuse(EMBPS_EPARAM, why, why_len, "rows %llu too large for a dense table "
                  "(max 2^40; use --dynamic)", (unsigned long long)s->rows);
  if ((unsigned)s->optimizer > EMBPS_OPT_FTRL)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "unknown optimizer %u", (unsigned)s->optimizer);
  const double params[] = {s->lr, s->eps, s->beta1, s->beta2,
                           s->initial_accumulator, s->l1, s->l2, s->lr_power,
                           s->weight_decay, s->init_value};
  for (size_t i = 0; i < sizeof params / sizeof *params; i++)
    if (!isfinite(params[i]))
      return embps_refuse(EMBPS_EPARAM, why, why_len, "table parameters must be finite");
  /* the optimizers keep them as float32: a larger one would be inf
   * (init_value, the last, is bounded for its init below) */
  for (size_t i = 0; i + 1 < sizeof params / sizeof *params; i++)
    if (fabs(params[i]) > FLT_MAX)
      return embps_refuse(EMBPS_EPARAM, why, why_len, "table parameter %g does not fit a "
                    "float32 (largest %g)", params[i], (double)FLT_MAX);
  if (s->lr <= 0)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "lr must be > 0 (got %g)", s->lr);
  if (s->eps < 0)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "eps must be >= 0 (got %g)", s->eps);
  if (s->beta1 < 0 || s->beta1 >= 1)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "beta1 must be in [0, 1) (got %g)", s->beta1);
  if (s->beta2 < 0 || s->beta2 >= 1)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "beta2 must be in [0, 1) (got %g)", s->beta2);
  if (s->initial_accumulator < 0)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "initial-accumulator must be >= 0 (got %g)",
                  s->initial_accumulator);
  if (s->optimizer == EMBPS_OPT_FTRL && s->initial_accumulator <= 0)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "ftrl needs initial-accumulator > 0 (got %g)",
                  s->initial_accumulator);
  if (s->l1 < 0 || s->l2 < 0)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "l1 and l2 must be >= 0");
  if (s->lr_power > 0)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "lr-power must be <= 0 (got %g)", s->lr_power);
  if (s->weight_decay < 0)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "weight-decay must be >= 0 (got %g)",
                  s->weight_decay);
  if ((unsigned)s->init > EMBPS_INIT_NORMAL)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "unknown init %u", (unsigned)s->init);
  if ((s->init == EMBPS_INIT_UNIFORM || s->init == EMBPS_INIT_NORMAL) &&
      s->init_value < 0)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "init scale must be >= 0");
  if ((unsigned)s->dtype > EMBPS_DTYPE_BF16)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "unknown dtype %u", (unsigned)s->dtype);
  if (spec_check_init(s, why, why_len))
    return EMBPS_EPARAM;
  if (s->sync_workers > 4096)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "sync-workers %u too large (max 4096)",
                  s->sync_workers);
  if (s->has_padding && !s->dynamic &&
      (s->padding_id < 0 || (uint64_t)s->padding_id >= s->rows))
    return embps_refuse(EMBPS_EPARAM, why, why_len, "padding id %lld outside [0, %llu)",
                  (long long)s->padding_id, (unsigned long long)s->rows);
  return spec_check_dynamic(s, why, why_len);
}

int embps_table_spec_alter(embps_table_spec_t *spec,
                           const embps_table_alter_t *alter, char *why,
                           size_t why_len) {
  embps_table_alter_t a; /* the caller's, at this library's size */
  int rc = embps_table_alter_read(alter, &a, why, why_len);
  if (rc)
    return rc;
  if (!a.set)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "nothing to alter: give at least one of lr, "
                  "eps, beta1, beta2, l1, l2, lr-power, weight-decay");
  if (a.set & ~EMBPS_ALTER_ALL)
    return embps_refuse(EMBPS_EPARAM, why, why_len, "unknown alter field bits 0x%x",
                  a.set & ~EMBPS_ALTER_ALL);
  embps_table_spec_t s = *spec;
#define ALTER_SET_(field, bit)                                                 \
  if (a.set & (bit))                                                           \
    s.field = a.field;
  EMBPS_TABLE_ALTER_FIELDS(ALTER_SET_)
#undef ALTER_SET_
  rc = embps_table_spec_check(&s, why, why_len);
  if (!rc)
    *spec = s;
  return rc;
}
