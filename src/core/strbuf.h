/* strbuf.h — private: a growable text buffer for building reports and documents (graph listings,
 * SVG). Appends never fail loudly: on out-of-memory the buffer is marked and later appends do
 * nothing, so callers check `oom` once at the end. */
#ifndef DW_CORE_STRBUF_H
#define DW_CORE_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *s;    /* NUL-terminated once anything was appended; caller frees */
    size_t len, cap;
    bool oom;   /* an append failed (allocation or formatting) */
} dw_strbuf;

/* Appends printf-formatted text, growing the buffer as needed. */
void dw_strbuf_printf(dw_strbuf *b, const char *fmt, ...) DW_PRINTF(2, 3);

#ifdef __cplusplus
}
#endif

#endif /* DW_CORE_STRBUF_H */
