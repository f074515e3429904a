/* error.h — private: setting error messages, DW_ASSERT, and the CUDA check macro.
 * Environment failures return dw_status with a message (dw_set_error); programmer errors
 * hit DW_ASSERT, which prints file:line and calls a hookable abort. */
#ifndef DW_CORE_ERROR_H
#define DW_CORE_ERROR_H

#include "deepwell.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DW_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))
#else
#define DW_PRINTF(fmt_idx, arg_idx)
#endif

/* Records a formatted message on ctx (or the thread-local fallback when ctx is NULL) and
 * returns status, so callers write `return dw_set_error(ctx, DW_ERR_IO, "%s: ...", path);`. */
dw_status dw_set_error(dw_ctx *ctx, dw_status status, const char *fmt, ...) DW_PRINTF(3, 4);
/* Prepends "prefix: " to the message already recorded (keeps the status). */
dw_status dw_prefix_error(dw_ctx *ctx, dw_status status, const char *fmt, ...) DW_PRINTF(3, 4);
void dw_clear_error(dw_ctx *ctx);

/* Calls the assert handler (deepwell.h: dw_set_assert_handler), then abort(). */
void dw_assert_fail(const char *expr, const char *file, int line, const char *msg);

#define DW_ASSERT(cond)                                                                     \
    do {                                                                                    \
        if (!(cond)) dw_assert_fail(#cond, __FILE__, __LINE__, NULL);                       \
    } while (0)
#define DW_ASSERT_MSG(cond, msg)                                                            \
    do {                                                                                    \
        if (!(cond)) dw_assert_fail(#cond, __FILE__, __LINE__, (msg));                      \
    } while (0)

/* Returns early from a dw_status function when a call failed. */
#define DW_TRY(expr)                                                                        \
    do {                                                                                    \
        dw_status dw_try_status_ = (expr);                                                  \
        if (dw_try_status_ != DW_OK) return dw_try_status_;                                 \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* DW_CORE_ERROR_H */
