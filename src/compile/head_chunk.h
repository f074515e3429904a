/* head_chunk.h — private: how many rows of logits the fused LM head (ops.def head_xent) holds at a
 * time, one rule for the compiler (fuse.c: the arena's chunk buffer) and the planner's memory
 * model (plan/memory.c). About as many logits as x has elements (Liger-Kernel's rule: N C / V
 * rows), rounded up to a multiple of 256 for the GEMMs, at most N. */
#ifndef DW_COMPILE_HEAD_CHUNK_H
#define DW_COMPILE_HEAD_CHUNK_H

#include <stdint.h>

/* Rows per chunk for N rows of C channels and V classes; want > 0 asks for that many (at most N). */
static inline int64_t dw_head_chunk_rows(int64_t N, int64_t C, int64_t V, int64_t want) {
    int64_t r = want > 0 ? want : ((N * C + V - 1) / (V > 0 ? V : 1) + 255) / 256 * 256;
    if (r < 1) r = 1;
    return r < N ? r : N;
}

#endif /* DW_COMPILE_HEAD_CHUNK_H */
