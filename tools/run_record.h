/* run_record.h — `deepwell train --resume RUN`: what the run recorded in its newest checkpoint's
 * state.json (docs/training.md), read before anything else so that the resumed run can be set up
 * from it. Only the fields a command line sets; the library validates the whole checkpoint
 * (sizes, CRC-32) when it loads it. */
#ifndef DW_TOOLS_RUN_RECORD_H
#define DW_TOOLS_RUN_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *ckpt_dir;        /* the checkpoint: RUN itself, or RUN/<latest> */
    char *run_dir;         /* its run directory when RUN is one (or latest of RUN/.. names it), else NULL */
    int64_t step, total_steps;
    char *data, *val;      /* val: "" none (or NULL in a record without "run") */
    char *schedule;        /* cosine, linear, constant */
    double lr, min_lr, weight_decay, clip, beta1, beta2;
    int64_t warmup, horizon; /* horizon: schedule.total, the step the schedule ends at */
    int64_t batch, seq, global_batch;
    uint64_t seed;
    char *precision;       /* "fp32", "bf16", ..., "policy" */
    char *policy_json;     /* the policy document, NULL in FP32 */
    bool has_run;          /* the "run" group below is present (newer records) */
    int64_t eval_every, eval_batches, ckpt_every, keep;
    char *device;          /* "cpu" or "cuda" */
    /* sampling during training: the run directory's sampling.json (deepwell train writes it at a
     * run's first step; absent before runs recorded it: then has_sampling is false) */
    bool has_sampling;
    int64_t sample_every, sample_tokens;
    double sample_temp;
    char *sample_prompt;   /* NULL: the trainer's default prompt */
} run_record;

/* Reads RUN's record; on failure writes "<file>: <what is wrong>" into err and returns false. */
bool run_record_read(const char *run, run_record *r, char *err, size_t cap);
void run_record_free(run_record *r);
/* Writes DIR/sampling.json (through a temporary name and a rename) with o's sampling options;
 * false (message in err) when it cannot. */
bool run_record_write_sampling(const char *dir, int64_t every, int64_t tokens, double temp, const char *prompt,
                               char *err, size_t cap);

#endif /* DW_TOOLS_RUN_RECORD_H */
