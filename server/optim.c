/* optim.c - the update kernels. Each is a straight element-wise loop over
 * restrict pointers so gcc vectorises it; sqrtf vectorises only with
 * -fno-math-errno, which the build sets for this file. FTRL's powers are
 * computed with sqrtf when lr_power is -0.5 (the default), powf otherwise.
 * Each kernel also tells whether a value it wrote left the envelope
 * (optim.h), checking each value as it writes it, in the same loop. */
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
  o->w_max = s->dtype == EMBPS_DTYPE_F16 ? EMBPS_OPTIM_ENVELOPE_F16
                                         : EMBPS_OPTIM_ENVELOPE;
  o->s_max = EMBPS_OPTIM_ENVELOPE;
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

/* 1 if x lies outside [-bound, bound] or is NaN (the compare is false for
 * NaN): one compare and one or per value, in the caller's loop, which gcc
 * vectorises with it. */
static inline int outside(float x, float bound) {
  return !(fabsf(x) <= bound);
}

static int sgd(float *restrict w, const float *restrict g, uint32_t dim,
               const embps_optim_t *o) {
  const float lr = o->lr, w_max = o->w_max;
  int out = 0;
  for (uint32_t j = 0; j < dim; j++) {
    const float wj = w[j] - lr * g[j];
    w[j] = wj;
    out |= outside(wj, w_max);
  }
  return out;
}

static int adagrad(float *restrict w, float *restrict acc,
                   const float *restrict g, uint32_t dim,
                   const embps_optim_t *o) {
  const float lr = o->lr, eps = o->eps, w_max = o->w_max, s_max = o->s_max;
  int out = 0;
  for (uint32_t j = 0; j < dim; j++) {
    const float a = acc[j] + g[j] * g[j];
    const float wj = w[j] - lr * g[j] / (sqrtf(a) + eps);
    acc[j] = a;
    w[j] = wj;
    out |= outside(wj, w_max) | outside(a, s_max);
  }
  return out;
}

/* Lazy Adam (PyTorch SparseAdam), with optional decoupled weight decay. */
static int adam(float *restrict w, float *restrict m, float *restrict v,
                const float *restrict g, uint32_t dim, const embps_optim_t *o) {
  const float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
  const float step = o->adam_step_size, decay = o->lr * o->weight_decay;
  const float w_max = o->w_max, s_max = o->s_max;
  int out = 0;
  for (uint32_t j = 0; j < dim; j++) {
    const float mj = b1 * m[j] + (1.0f - b1) * g[j];
    const float vj = b2 * v[j] + (1.0f - b2) * g[j] * g[j];
    const float wj = w[j] - decay * w[j] - step * mj / (sqrtf(vj) + eps);
    m[j] = mj;
    v[j] = vj;
    w[j] = wj;
    out |= outside(wj, w_max) | outside(mj, s_max) | outside(vj, s_max);
  }
  return out;
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

/* TensorFlow ApplyFtrl; n^(-lr_power) by sqrtf when sqrt_power (lr_power
 * -0.5), else by powf. Called with a constant sqrt_power, so each caller
 * gets its own loop without the branch. Besides the envelope, n below the
 * initial accumulator counts as outside. */
static inline int ftrl(float *restrict w, float *restrict n,
                       float *restrict z, const float *restrict g,
                       uint32_t dim, const embps_optim_t *o, int sqrt_power) {
  const float lr = o->lr, l1 = o->l1, two_l2 = 2.0f * o->l2;
  const float p = -o->lr_power, n0 = o->initial_accumulator;
  const float w_max = o->w_max, s_max = o->s_max;
  int out = 0;
  for (uint32_t j = 0; j < dim; j++) {
    const float nn = n[j] + g[j] * g[j];
    const float pn = sqrt_power ? sqrtf(nn) : powf(nn, p);
    const float pn_old = sqrt_power ? sqrtf(n[j]) : powf(n[j], p);
    const float zz = z[j] + g[j] - (pn - pn_old) / lr * w[j];
    const float wj = ftrl_weight(zz, pn / lr + two_l2, l1);
    z[j] = zz;
    n[j] = nn;
    w[j] = wj;
    out |= outside(wj, w_max) | outside(zz, s_max) | outside(nn, s_max) |
           !(nn >= n0);
  }
  return out;
}

int embps_optim_apply(const embps_optim_t *o, float *row, const float *g,
                      uint32_t dim) {
  return embps_optim_apply_split(o, row, row + dim, g, dim);
}

int embps_optim_apply_split(const embps_optim_t *o, float *w, float *state,
                            const float *g, uint32_t dim) {
  switch (o->kind) {
  case EMBPS_OPT_SGD:
    return sgd(w, g, dim, o);
  case EMBPS_OPT_ADAGRAD:
    return adagrad(w, state, g, dim, o);
  case EMBPS_OPT_ADAM:
    return adam(w, state, state + dim, g, dim, o);
  case EMBPS_OPT_FTRL:
    if (o->lr_power == -0.5f)
      return ftrl(w, state, state + dim, g, dim, o, 1);
    return ftrl(w, state, state + dim, g, dim, o, 0);
  }
  return 0;
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
