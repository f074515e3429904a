/* sized.h — private: the `size_t size` convention of deepwell.h's growable structs (options the
 * caller fills, results the library fills). A caller built against an older header passes a
 * smaller size; the library reads or writes only that many bytes and takes defaults for the rest.
 * Not a general serialisation helper: the struct's first member must be `size_t size`. */
#ifndef DW_CORE_SIZED_H
#define DW_CORE_SIZED_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* Overlays the caller's struct `src` (its first src->size bytes) on `dst`, n bytes that already
 * hold the defaults; dst->size becomes n. False when src->size is smaller than the size field
 * itself (never set: the caller skipped dw_<x>_opts_init). */
static inline bool dw_sized_read(void *dst, size_t n, const void *src) {
    size_t have;
    memcpy(&have, src, sizeof have);
    if (have < sizeof(size_t)) return false;
    memcpy(dst, src, have < n ? have : n);
    memcpy(dst, &n, sizeof n);
    return true;
}

/* Copies the library's full struct `src` (n bytes) into the caller's `dst`, at most dst->size
 * bytes; dst->size is kept. False when dst->size was never set. */
static inline bool dw_sized_write(void *dst, const void *src, size_t n) {
    size_t want;
    memcpy(&want, dst, sizeof want);
    if (want < sizeof(size_t)) return false;
    size_t k = want < n ? want : n;
    memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t), k - sizeof(size_t));
    return true;
}

/* Zeroes the caller's result struct `dst` (NULL allowed) past its size field, at most dst->size
 * bytes: what a getter leaves on error. */
static inline void dw_sized_clear(void *dst) {
    size_t want;
    if (!dst) return;
    memcpy(&want, dst, sizeof want);
    if (want > sizeof(size_t)) memset((char *)dst + sizeof(size_t), 0, want - sizeof(size_t));
}

/* Fills the caller's options struct `dst` of `size` bytes with the defaults in `defaults` (n
 * bytes): what dw_<x>_opts_init does. */
static inline void dw_sized_init(void *dst, size_t size, const void *defaults, size_t n) {
    if (size < sizeof(size_t)) return;
    memset(dst, 0, size);
    memcpy(dst, defaults, size < n ? size : n);
    memcpy(dst, &size, sizeof size);
}

#endif /* DW_CORE_SIZED_H */
