/* optim.h — private: the optimizer's arithmetic on FP32 host arrays: AdamW with bias correction
 * (decoupled weight decay, as torch.optim.AdamW), the global gradient norm and clipping factor,
 * and learning-rate schedules. CPU reference: double arithmetic, FP32 storage. Not the step loop
 * (trainer.c) and not the GPU optimizer (a later engine brings its own kernel). */
#ifndef DW_TRAIN_OPTIM_H
#define DW_TRAIN_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    double lr;           /* this step's learning rate */
    double beta1, beta2; /* 0.9, 0.95 */
    double eps;          /* 1e-8 */
    double weight_decay; /* applied only where decay is true */
} dw_adamw_hparams;

/* One AdamW step t (1-based) over n elements, in place:
 *   g' = g * grad_scale;  p -= lr * wd * p (decay only);
 *   m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2;
 *   p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 * p, m, v (n) FP32 in/out; g (n) FP32. */
void dw_adamw_step_cpu(float *p, const float *g, float *m, float *v, int64_t n,
                       const dw_adamw_hparams *h, int64_t t, bool decay, double grad_scale);

/* Sum of squares of g (n) in double (accumulate over tensors, sqrt at the end). */
double dw_sumsq_cpu(const float *g, int64_t n);
/* Factor to multiply gradients by so that their global norm is at most max_norm
 * (1 when max_norm <= 0 or the norm is already within it). */
double dw_clip_factor(double norm, double max_norm);

typedef enum { DW_SCHED_COSINE = 0, DW_SCHED_LINEAR, DW_SCHED_CONSTANT, DW_SCHED_COUNT } dw_schedule_kind;

typedef struct {
    dw_schedule_kind kind;
    double lr;        /* peak */
    double min_lr;    /* reached at the last step (cosine, linear) */
    int64_t warmup;   /* steps of linear warmup from lr/warmup to lr */
    int64_t total;    /* total optimizer steps */
} dw_schedule;

/* The learning rate of optimizer step `step` (0-based):
 *   step < warmup:  lr * (step + 1) / warmup
 *   afterwards, with p = (step - warmup) / max(1, total - 1 - warmup) in [0, 1]:
 *   cosine: min + (lr - min) * (1 + cos(pi p)) / 2;  linear: lr + (min - lr) p;  constant: lr. */
double dw_schedule_lr(const dw_schedule *s, int64_t step);
const char *dw_schedule_name(dw_schedule_kind k);
bool dw_schedule_parse(const char *name, dw_schedule_kind *out);

#endif /* DW_TRAIN_OPTIM_H */
