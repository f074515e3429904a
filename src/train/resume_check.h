/* resume_check.h — private: a resumed run's options against the record of its checkpoint. Every
 * setting the run recorded (data, validation, batch shape, schedule, optimizer, eval and
 * checkpoint cadence) must be the same; only --steps, --keep, the device, the run directory,
 * sampling and logging may change. Not the loading itself (trainer.c). */
#ifndef DW_TRAIN_RESUME_CHECK_H
#define DW_TRAIN_RESUME_CHECK_H

#include "deepwell.h"
#include "train/ckpt.h"

/* DW_ERR_INVALID naming the first contradicting option with both values ("ckpt-6 was trained
 * with --lr 0.003; --lr 0.001 contradicts it"). data_abs and val_abs: the options' patterns made
 * absolute (dw_abs_pattern; val_abs "" when there is none). */
dw_status dw_resume_check(dw_ctx *ctx, const char *cdir, const dw_ckpt_state *s, const dw_train_opts *o,
                          const char *data_abs, const char *val_abs);

#endif /* DW_TRAIN_RESUME_CHECK_H */
