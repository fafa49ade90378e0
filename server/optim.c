/* optim.c - the update kernels. Each is a straight element-wise loop over
 * restrict pointers so gcc vectorises it; sqrtf vectorises only with
 * -fno-math-errno, which the build sets for this file. FTRL's powers are
 * computed with sqrtf when lr_power is -0.5 (the default), powf otherwise. */
#include "optim.h"

#include <float.h>
#include <math.h>
#include <string.h>

void embps_optim_from_spec(embps_optim_t *o, const embps_table_spec_t *s) {
  memset(o, 0, sizeof *o);
  o->kind = s->optimizer;
  o->lr = (float)s->lr;
  o->eps = (float)s->eps;
  o->beta1 = (float)s->beta1;
  o->beta2 = (float)s->beta2;
  o->l1 = (float)s->l1;
  o->l2 = (float)s->l2;
  o->lr_power = (float)s->lr_power;
  o->weight_decay = (float)s->weight_decay;
  o->initial_accumulator = (float)s->initial_accumulator;
}

uint32_t embps_optim_state_per_weight(embps_optimizer_t kind) {
  switch (kind) {
  case EMBPS_OPT_ADAGRAD:
    return 1;
  case EMBPS_OPT_ADAM:
  case EMBPS_OPT_FTRL:
    return 2;
  default:
    return 0;
  }
}

void embps_optim_begin_step(embps_optim_t *o, uint64_t t) {
  if (o->kind != EMBPS_OPT_ADAM)
    return;
  double bc1 = 1.0 - pow((double)o->beta1, (double)t);
  double bc2 = 1.0 - pow((double)o->beta2, (double)t);
  o->adam_step_size = (float)((double)o->lr * sqrt(bc2) / bc1);
}

void embps_optim_init_state(const embps_optim_t *o, float *state,
                            uint32_t dim) {
  switch (o->kind) {
  case EMBPS_OPT_ADAGRAD:
    for (uint32_t j = 0; j < dim; j++)
      state[j] = o->initial_accumulator;
    break;
  case EMBPS_OPT_ADAM:
    memset(state, 0, 2 * (size_t)dim * sizeof *state);
    break;
  case EMBPS_OPT_FTRL:
    for (uint32_t j = 0; j < dim; j++)
      state[j] = o->initial_accumulator; /* n */
    memset(state + dim, 0, (size_t)dim * sizeof *state); /* z */
    break;
  default:
    break;
  }
}

static void sgd(float *restrict w, const float *restrict g, uint32_t dim,
                float lr) {
  for (uint32_t j = 0; j < dim; j++)
    w[j] -= lr * g[j];
}

static void adagrad(float *restrict w, float *restrict acc,
                    const float *restrict g, uint32_t dim, float lr,
                    float eps) {
  for (uint32_t j = 0; j < dim; j++) {
    float a = acc[j] + g[j] * g[j];
    acc[j] = a;
    w[j] -= lr * g[j] / (sqrtf(a) + eps);
  }
}

/* Lazy Adam (PyTorch SparseAdam), with optional decoupled weight decay. */
static void adam(float *restrict w, float *restrict m, float *restrict v,
                 const float *restrict g, uint32_t dim, const embps_optim_t *o) {
  const float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
  const float step = o->adam_step_size, decay = o->lr * o->weight_decay;
  for (uint32_t j = 0; j < dim; j++) {
    float mj = b1 * m[j] + (1.0f - b1) * g[j];
    float vj = b2 * v[j] + (1.0f - b2) * g[j] * g[j];
    m[j] = mj;
    v[j] = vj;
    w[j] = w[j] - decay * w[j] - step * mj / (sqrtf(vj) + eps);
  }
}

/* FTRL's closed-form weight: (sign(z)*l1 - z)/quadratic where |z| > l1,
 * else +0. Branch-free (an integer mask), so the caller's loop vectorises:
 * gcc will not if-convert a float compare under the default -ftrapping-math. */
static inline float ftrl_weight(float z, float quadratic, float l1) {
  float w = (copysignf(l1, z) - z) / quadratic;
  uint32_t bits;
  memcpy(&bits, &w, sizeof bits);
  bits &= -(uint32_t)(fabsf(z) > l1);
  memcpy(&w, &bits, sizeof w);
  return w;
}

/* TensorFlow ApplyFtrl, lr_power = -0.5: n^(-p) = sqrt(n). */
static void ftrl_sqrt(float *restrict w, float *restrict n, float *restrict z,
                      const float *restrict g, uint32_t dim,
                      const embps_optim_t *o) {
  const float lr = o->lr, l1 = o->l1, two_l2 = 2.0f * o->l2;
  for (uint32_t j = 0; j < dim; j++) {
    float nn = n[j] + g[j] * g[j];
    float sn = sqrtf(nn);
    float zz = z[j] + g[j] - (sn - sqrtf(n[j])) / lr * w[j];
    z[j] = zz;
    n[j] = nn;
    w[j] = ftrl_weight(zz, sn / lr + two_l2, l1);
  }
}

static void ftrl_pow(float *restrict w, float *restrict n, float *restrict z,
                     const float *restrict g, uint32_t dim,
                     const embps_optim_t *o) {
  const float lr = o->lr, l1 = o->l1, two_l2 = 2.0f * o->l2;
  const float p = -o->lr_power;
  for (uint32_t j = 0; j < dim; j++) {
    float nn = n[j] + g[j] * g[j];
    float pn = powf(nn, p);
    float zz = z[j] + g[j] - (pn - powf(n[j], p)) / lr * w[j];
    z[j] = zz;
    n[j] = nn;
    w[j] = ftrl_weight(zz, pn / lr + two_l2, l1);
  }
}

void embps_optim_apply(const embps_optim_t *o, float *row, const float *g,
                       uint32_t dim) {
  embps_optim_apply_split(o, row, row + dim, g, dim);
}

void embps_optim_apply_split(const embps_optim_t *o, float *w, float *state,
                             const float *g, uint32_t dim) {
  switch (o->kind) {
  case EMBPS_OPT_SGD:
    sgd(w, g, dim, o->lr);
    break;
  case EMBPS_OPT_ADAGRAD:
    adagrad(w, state, g, dim, o->lr, o->eps);
    break;
  case EMBPS_OPT_ADAM:
    adam(w, state, state + dim, g, dim, o);
    break;
  case EMBPS_OPT_FTRL:
    if (o->lr_power == -0.5f)
      ftrl_sqrt(w, state, state + dim, g, dim, o);
    else
      ftrl_pow(w, state, state + dim, g, dim, o);
    break;
  }
}

/* The bounds, in double (they cannot overflow there): the weight moves by
 * at most `step` and every state value stays below FLT_MAX / 2. */
int embps_optim_bounded(const embps_optim_t *o, double w_max, double s_max,
                        double g_max, double out_max) {
  const double lr = o->lr, lim = FLT_MAX / 2, g2 = g_max * g_max;
  double step = 0;
  if (!(g_max <= 0x1p40)) /* NaN too */
    return 0;
  switch (o->kind) {
  case EMBPS_OPT_SGD:
    step = lr * g_max;
    break;
  case EMBPS_OPT_ADAGRAD: /* |g| / (sqrt(acc + g^2) + eps) <= 1 (acc >= 0) */
    if (!(o->eps > 0 || o->initial_accumulator > 0) || s_max + g2 > lim)
      return 0; /* 0 / 0 when acc, g and eps are 0 */
    step = 2 * lr;
    break;
  case EMBPS_OPT_ADAM: { /* |m| <= max(s, g), v >= 0 */
    const double m = s_max > g_max ? s_max : g_max;
    if (!(o->eps > 0) || s_max + g2 > lim)
      return 0;
    step = (double)o->adam_step_size * m / o->eps +
           lr * o->weight_decay * w_max;
    break;
  }
  case EMBPS_OPT_FTRL: { /* n >= n0 > 0: the quadratic >= n0^p / lr */
    const double p = -(double)o->lr_power;
    const double pn = pow(s_max + g2, p), pn0 = pow(o->initial_accumulator, p);
    const double z = s_max + g_max + pn / lr * w_max;
    if (!(pn <= lim && pn0 > 0 && z <= lim))
      return 0;
    step = (o->l1 + z) * lr / pn0; /* |w'| <= (l1 + |z|) lr / n0^p */
    break;
  }
  }
  return w_max + step <= out_max;
}
