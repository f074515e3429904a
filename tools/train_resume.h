/* train_resume.h — `deepwell train --resume RUN`: the run's record (run_record.h) fills every
 * option the command line left out; a given option that contradicts it is refused naming both
 * values. May change: --steps (the schedule keeps its horizon), --keep, --device, --out, sampling
 * (--sample-*: recorded in the run's sampling.json, kept unless given) and logging. Prints what it
 * restored. */
#ifndef DW_TOOLS_TRAIN_RESUME_H
#define DW_TOOLS_TRAIN_RESUME_H

#include <stdbool.h>

#include "deepwell.h"
#include "run_record.h"

/* cmd_train's long options; `given[O_X - O_FIRST]` says whether the command line set O_X. */
enum { O_FIRST = 256, O_MODEL = O_FIRST, O_DATA, O_VAL, O_OUT, O_RESUME, O_STEPS, O_BATCH, O_SEQ, O_GB, O_LR,
       O_MINLR, O_WARMUP, O_SCHED, O_WD, O_CLIP, O_B1, O_B2, O_EVAL, O_EVALB, O_SAMPLE, O_SAMPLEN, O_SAMPLET,
       O_PROMPT, O_CKPT, O_KEEP, O_DEVICE, O_SEED, O_LOGEVERY, O_PRECISION, O_POLICY, O_FALLBACK, O_PROFILE,
       O_DETERMINISTIC, O_CKPTMIN, O_LAST };

/* Before the context exists: o and *device from the record where not given; out_dir defaults to
 * the run directory. False (message printed) when a given option contradicts the record. */
bool train_resume_merge(const char *cmd, const run_record *r, const bool *given, dw_train_opts *o,
                        const char **device);
/* With the context: the recorded precision policy (*pol NULL for FP32) when none was given, else
 * checks that the given one (*pol, built from `flags`, e.g. "--precision bf16") is the recorded one. */
bool train_resume_policy(const char *cmd, dw_ctx *ctx, const run_record *r, const bool *given, const char *flags,
                         dw_policy **pol);
/* One compact summary of what the resumed run continues with, on stderr (once training accepted
 * the options: at its first step). */
void train_resume_print(const char *cmd, const run_record *r, const bool *given, const dw_train_opts *o,
                        const char *device);

#endif /* DW_TOOLS_TRAIN_RESUME_H */
