/* optim.c - the update kernels. Each is a straight element-wise loop over
 * restrict pointers so gcc vectorises it; sqrtf vectorises only with
 * -fno-math-errno, which the build sets for this file. FTRL's powers are
 * computed with sqrtf when lr_power is -0.5 (the default), powf otherwise. */
#include "optim.h"

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
