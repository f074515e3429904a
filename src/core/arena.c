/* arena.c — host/device bump allocators (see arena.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "core/error.h"

#if DW_HAVE_CUDA
#include "core/cuda_check.h"
#endif

dw_status dw_arena_init(dw_ctx *ctx, dw_arena *a, dw_arena_kind kind, size_t capacity,
                        const char *name) {
    memset(a, 0, sizeof *a);
    a->kind = kind;
    a->name = name ? name : "arena";
    if (kind == DW_ARENA_MEASURE) {
        a->capacity = SIZE_MAX;
        return DW_OK;
    }
    a->capacity = capacity;
    if (capacity == 0) return DW_OK;
    if (kind == DW_ARENA_HOST) {
        void *p = NULL;
        if (posix_memalign(&p, DW_ARENA_DEFAULT_ALIGN, capacity) != 0)
            return dw_set_error(ctx, DW_ERR_NOMEM, "arena '%s': cannot allocate %zu bytes of host memory",
                                a->name, capacity);
        a->base = p;
        return DW_OK;
    }
#if DW_HAVE_CUDA
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, capacity);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return dw_set_error(ctx, e == cudaErrorMemoryAllocation ? DW_ERR_NOMEM : DW_ERR_CUDA,
                            "arena '%s': cudaMalloc of %zu bytes failed: %s", a->name, capacity,
                            cudaGetErrorString(e));
    }
    a->base = p;
    return DW_OK;
#else
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "arena '%s': device memory needs a CUDA build",
                        a->name);
#endif
}

void dw_arena_release(dw_arena *a) {
    if (!a) return;
    if (a->base) {
        if (a->kind == DW_ARENA_HOST) free(a->base);
#if DW_HAVE_CUDA
        else if (a->kind == DW_ARENA_DEVICE) cudaFree(a->base);
#endif
    }
    memset(a, 0, sizeof *a);
}

size_t dw_arena_reserve(dw_arena *a, size_t bytes, size_t align) {
    DW_ASSERT(align != 0 && (align & (align - 1)) == 0);
    size_t start = (a->used + align - 1) & ~(align - 1);
    if (start < a->used || start > a->capacity || bytes > a->capacity - start) return SIZE_MAX;
    a->used = start + bytes;
    if (a->used > a->high_water) a->high_water = a->used;
    return start;
}

dw_status dw_arena_alloc(dw_ctx *ctx, dw_arena *a, size_t bytes, size_t align, void **out) {
    *out = NULL;
    size_t off = dw_arena_reserve(a, bytes, align);
    if (off == SIZE_MAX)
        return dw_set_error(ctx, DW_ERR_NOMEM,
                            "arena '%s' is full: %zu bytes requested, %zu of %zu in use", a->name,
                            bytes, a->used, a->capacity);
    if (a->base) *out = a->base + off;
    return DW_OK;
}

void dw_arena_rewind(dw_arena *a, size_t mark) {
    DW_ASSERT(mark <= a->used);
    a->used = mark;
}

void dw_arena_reset(dw_arena *a) { a->used = 0; }
