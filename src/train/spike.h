/* spike.h — private: loss-spike detection for the trainer's rollback (docs/precision.md, "Loss
 * spikes"). A window of the last W applied steps' losses; once it is full, a step whose loss is
 * more than Z standard deviations above the window's mean is a spike: the trainer restores its
 * last checkpoint and skips that step's batch (a pending skip: the data positions [from, to)).
 * The window and the pending skips are state.json's "spike" (hex floats: exact), so a resumed or
 * rolled-back run decides alike. Every rank decides alike: the loss is the ranks' mean already.
 * Not the restore itself (train/trainer.c). */
#ifndef DW_TRAIN_SPIKE_H
#define DW_TRAIN_SPIKE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/json.h"
#include "deepwell.h"

typedef struct {
    uint64_t from, to; /* data positions: a step that starts at `from` continues from `to` */
} dw_spike_skip;

typedef struct {
    double zscore;         /* Z; 0: off */
    int64_t window;        /* W */
    int64_t max_rollbacks; /* the run stops at the spike after this many rollbacks */
    double *loss;          /* (W) ring of the losses, oldest at head when full */
    int64_t n, head;       /* losses held, next slot written */
    dw_spike_skip *skip;   /* pending skips, at most `cap` */
    int n_skip, cap;
    int64_t rollbacks;     /* this process's */
} dw_spike;

/* zscore 0 leaves the detector off (nothing allocated). */
dw_status dw_spike_init(dw_ctx *ctx, dw_spike *s, double zscore, int64_t window, int64_t max_rollbacks);
void dw_spike_free(dw_spike *s);

/* The z-score of `loss` against the window: (loss - mean) / std (population std over the W losses,
 * summed in double oldest first; std 0: 0 when loss equals the mean, else +-inf); NaN while the
 * window is not full. True: a spike (z > Z). */
bool dw_spike_test(const dw_spike *s, double loss, double *z);
/* An applied step's loss enters the window (the oldest leaves). */
void dw_spike_push(dw_spike *s, double loss);

/* A pending skip of the batch at data positions [from, to). */
dw_status dw_spike_add_skip(dw_ctx *ctx, dw_spike *s, uint64_t from, uint64_t to);
/* Whether a skip starts at `pos`: *to is where the data continues, and the skip is done. */
bool dw_spike_take_skip(dw_spike *s, uint64_t pos, uint64_t *to);

/* state.json's "spike": {"window": [hex floats, oldest first], "skip": [["0x from", "0x to"]]}
 * (malloc'd text; NULL when off or out of memory). */
char *dw_spike_state_json(const dw_spike *s);
/* Window and pending skips from a "spike" object (NULL: the checkpoint has none, both empty);
 * `what` names the file in errors. */
dw_status dw_spike_state_load(dw_ctx *ctx, dw_spike *s, const json_t *spike, const char *what);

#endif /* DW_TRAIN_SPIKE_H */
