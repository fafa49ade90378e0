/* optim.h - per-row sparse optimizer updates. The kernels work on float32
 * weights and the optimizer's float32 state (k x dim floats); in a table
 * both sit in one record (table.h), so an update touches one place.
 * Formulas are DESIGN.md's and match PyTorch (SGD, Adagrad, SparseAdam) and
 * TensorFlow (ApplyFtrl). */
#ifndef EMBPS_OPTIM_H
#define EMBPS_OPTIM_H
#include <stdint.h>

#include "embps/embps.h"

typedef struct {
  embps_optimizer_t kind;
  float lr, eps, beta1, beta2, l1, l2, lr_power, weight_decay;
  float initial_accumulator;
  float adam_step_size; /* lr*sqrt(1-b2^t)/(1-b1^t), set per step */
  float w_max, s_max;   /* the envelope, below */
} embps_optim_t;

/* The envelope: weights within w_max (EMBPS_OPTIM_ENVELOPE_F16 in f16
 * tables, else EMBPS_OPTIM_ENVELOPE), state values within s_max
 * (EMBPS_OPTIM_ENVELOPE) and FTRL's n at least its initial accumulator.
 * While a table's rows lie inside it, embps_optim_bounded can prove a push
 * finite without reading a row (table.c, "envelope"); every update reports
 * whether it wrote a value outside. */
#define EMBPS_OPTIM_ENVELOPE 0x1p40f
#define EMBPS_OPTIM_ENVELOPE_F16 256.0f

void embps_optim_from_spec(embps_optim_t *o, const embps_table_spec_t *spec);
/* State floats per weight: sgd 0, adagrad 1, adam 2, ftrl 2. */
uint32_t embps_optim_state_per_weight(embps_optimizer_t kind);
/* Prepares one step of the table (t = 1 for the first push). */
void embps_optim_begin_step(embps_optim_t *o, uint64_t t);
/* Writes the initial state of a fresh row (state = row + dim). */
void embps_optim_init_state(const embps_optim_t *o, float *state,
                            uint32_t dim);
/* One update of row (weights then state) with merged gradient g. Returns
 * 1 if a value it wrote lies outside the envelope (NaN and inf included),
 * else 0: checked as each value is written, in the kernel's loop. */
int embps_optim_apply(const embps_optim_t *o, float *row, const float *g,
                      uint32_t dim);
/* The same update with the weights w and the state apart (tables that
 * store weights in f16/bf16 update a float32 copy of them: the envelope
 * applies to that copy). */
int embps_optim_apply_split(const embps_optim_t *o, float *w, float *state,
                            const float *g, uint32_t dim);
/* 1 if one update (o prepared for its step) of any row whose weights lie
 * within w_max and state within s_max (FTRL's n at least its initial
 * accumulator), with gradients within g_max, provably leaves every weight
 * within out_max and every state value finite; 0 if that cannot be shown
 * this way (the update may still be fine). */
int embps_optim_bounded(const embps_optim_t *o, double w_max, double s_max,
                        double g_max, double out_max);
#endif
