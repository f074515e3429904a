/* data_callback.h — private: micro-batches from the caller's callbacks (dw_train_opts.next_batch
 * and val_batch) instead of files: the call, its return code and the ids' range check. Not the
 * file reader (data.h) and no shuffling: the order is the caller's. */
#ifndef DW_TRAIN_DATA_CALLBACK_H
#define DW_TRAIN_DATA_CALLBACK_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"

/* What checkpoints record as the data of a run fed by next_batch (and its val_batch). */
#define DW_DATA_CALLBACK "(next_batch)"

typedef int (*dw_batch_fn)(void *user, int64_t index, int32_t *tokens, int32_t *targets, int64_t b, int64_t t);

/* Calls fn for micro-batch `index` into tokens and targets (B, T) and checks every id is in
 * [0, vocab). what names the callback in messages ("next_batch"). *ended (may be NULL: then an
 * end is an error) is set when fn returned 1. DW_ERR_IO when fn failed, DW_ERR_INVALID for an id
 * out of range (the index, row, column and value). */
dw_status dw_batch_call(dw_ctx *ctx, dw_batch_fn fn, void *user, const char *what, int64_t index, int32_t *tokens,
                        int32_t *targets, int64_t B, int64_t T, int64_t vocab, bool *ended);

#endif /* DW_TRAIN_DATA_CALLBACK_H */
