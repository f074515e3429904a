/* optim.h — private: the trainer's learning-rate schedules. The optimizer itself is the engine's
 * (dw_engine_step; CPU reference kernels/cpu/optim_cpu.c, CUDA kernels/cuda/adamw.cu). */
#ifndef DW_TRAIN_OPTIM_H
#define DW_TRAIN_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

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
