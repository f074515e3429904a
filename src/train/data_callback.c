/* data_callback.c — one micro-batch from the caller's callback, checked (data_callback.h). */
#include "core/error.h"
#include "train/data_callback.h"

/* The first id of ids (B, T) outside [0, vocab): its flat position, or -1. */
static int64_t first_out_of_range(const int32_t *ids, int64_t n, int64_t vocab) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) return i;
    return -1;
}

dw_status dw_batch_call(dw_ctx *ctx, dw_batch_fn fn, void *user, const char *what, int64_t index, int32_t *tokens,
                        int32_t *targets, int64_t B, int64_t T, int64_t vocab, bool *ended) {
    if (ended) *ended = false;
    const int rc = fn(user, index, tokens, targets, B, T);
    if (rc == 1 && ended) {
        *ended = true;
        return DW_OK;
    }
    if (rc != 0)
        return dw_set_error(ctx, DW_ERR_IO, "%s failed (returned %d) for micro-batch %lld: training stopped before "
                            "finishing the step", what, rc, (long long)index);
    const int32_t *ids[2] = {tokens, targets};
    const char *names[2] = {"tokens", "targets"};
    for (int k = 0; k < 2; k++) {
        int64_t i = first_out_of_range(ids[k], B * T, vocab);
        if (i >= 0)
            return dw_set_error(ctx, DW_ERR_INVALID, "%s: micro-batch %lld: %s[%lld][%lld] = %d is outside the "
                                "model's vocabulary [0, %lld)", what, (long long)index, names[k],
                                (long long)(i / T), (long long)(i % T), ids[k][i], (long long)vocab);
    }
    return DW_OK;
}
