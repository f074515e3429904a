/* arena.h — private: bump allocators over one backing allocation, for host or device memory.
 * One arena per memory pool (weights, grads, optimizer state, activations, workspace): the
 * memory planner sizes it once, the step loop never allocates. A "measure" arena has no
 * backing store and only records the high-water mark (dry runs, planning). */
#ifndef DW_CORE_ARENA_H
#define DW_CORE_ARENA_H

#include <stddef.h>

#include "deepwell.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DW_ARENA_HOST = 0, DW_ARENA_DEVICE, DW_ARENA_MEASURE } dw_arena_kind;

typedef struct {
    dw_arena_kind kind;
    unsigned char *base; /* host or device pointer; NULL for MEASURE */
    size_t capacity;     /* bytes; SIZE_MAX for MEASURE */
    size_t used;         /* bytes handed out so far (including alignment padding) */
    size_t high_water;   /* largest `used` ever reached */
    const char *name;    /* for messages: "activations", ... (static string) */
} dw_arena;

#define DW_ARENA_DEFAULT_ALIGN 256 /* cudaMalloc's alignment; enough for TMA and vector loads */

/* Creates the arena's single backing allocation. DEVICE needs a CUDA context. */
dw_status dw_arena_init(dw_ctx *ctx, dw_arena *a, dw_arena_kind kind, size_t capacity,
                        const char *name);
void dw_arena_release(dw_arena *a);

/* Reserves `bytes` aligned to `align` (a power of two). Returns the offset from the base, or
 * SIZE_MAX when the arena is full (the caller reports; see dw_arena_alloc_or_error). */
size_t dw_arena_reserve(dw_arena *a, size_t bytes, size_t align);
/* Like reserve, but returns a pointer (NULL for MEASURE arenas) and sets an error naming the
 * arena when it is full. */
dw_status dw_arena_alloc(dw_ctx *ctx, dw_arena *a, size_t bytes, size_t align, void **out);

/* Rewinds to a mark taken with a->used (stack discipline); keeps high_water. */
void dw_arena_rewind(dw_arena *a, size_t mark);
void dw_arena_reset(dw_arena *a);

#ifdef __cplusplus
}
#endif

#endif /* DW_CORE_ARENA_H */
