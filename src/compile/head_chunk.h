/* head_chunk.h — private: how many rows of logits the fused LM head (ops.def head_xent) holds at a
 * time, one rule for the compiler (fuse.c: the arena's chunk buffer) and the planner's memory
 * model (plan/memory.c). About as many logits as x has elements (Liger-Kernel's rule: N C / V
 * rows), rounded up to a multiple of 256 for the GEMMs, but at least DW_HEAD_CHUNK_MIN_ROWS, at
 * most N. The floor: each chunk's weight-gradient GEMM reads and writes the head's whole FP32
 * gradient (8 V C bytes) for 2 r V C FLOPs, memory bound below r ~ 1200 on a Hopper; at Liger's
 * 512 rows (llama-1b, 32 chunks) the fused head cost 22 ms a step more than the unfused one on an
 * H100 (bench/RESULTS.md, session 17). 4096 rows keep that traffic near 1/4 of the GEMM's time. */
#ifndef DW_COMPILE_HEAD_CHUNK_H
#define DW_COMPILE_HEAD_CHUNK_H

#include <stdint.h>

/* Rows per chunk for N rows of C channels and V classes; want > 0 asks for that many (at most N). */
enum { DW_HEAD_CHUNK_MIN_ROWS = 4096 };

static inline int64_t dw_head_chunk_rows(int64_t N, int64_t C, int64_t V, int64_t want) {
    int64_t r = want > 0 ? want : ((N * C + V - 1) / (V > 0 ? V : 1) + 255) / 256 * 256;
    if (want <= 0 && r < DW_HEAD_CHUNK_MIN_ROWS) r = DW_HEAD_CHUNK_MIN_ROWS;
    if (r < 1) r = 1;
    return r < N ? r : N;
}

#endif /* DW_COMPILE_HEAD_CHUNK_H */
