/* attn_mma_ptx.cuh (CUDA emulator) — host stand-ins for the inline-PTX primitives of
 * src/kernels/cuda/attn_mma.cu (the real ones: src/kernels/cuda/attn_mma_ptx.cuh; this file is found
 * first on the emulator's include path), so that its tensor-core kernels run on the host:
 * mma.sync m16n8k16 BF16 -> FP32 and ldmatrix (x4, plain and .trans) gather every lane's fragments
 * or row addresses through a per-warp exchange (all 32 lanes must take part, as on the GPU), and
 * each lane computes its own part with the PTX fragment layouts; cp.async copies at once (a
 * schedule the asynchronous copy also allows); ex2.approx is exp2f with subnormals flushed. Also
 * the cuda_bf16.h pieces attn_mma.cu uses that the emulator's cuda_bf16.h lacks. 1-D blocks only. */
#ifndef DW_KERNELS_ATTN_MMA_PTX_CUH
#define DW_KERNELS_ATTN_MMA_PTX_CUH

#include <float.h>
#include <stdint.h>
#include <string.h>

#include "cuda_bf16.h"
#include "cuda_runtime.h"

struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
struct alignas(8) float2 {
    float x, y;
};
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
static inline float2 __bfloat1622float2(__nv_bfloat162 v) { return {__bfloat162float(v.x), __bfloat162float(v.y)}; }
static inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- the per-warp exchange: each lane publishes up to 4 words, then reads every lane's. Two
 * buffers used in turn: a lane writes buffer p again only after passing the next exchange, which
 * every lane reaches only once it has read buffer p. -------------------------------------------- */
struct am_emu_slot {
    uint64_t v[4];
};
static am_emu_slot am_emu_buf[2][32][32]; /* [turn][warp][lane] */
static unsigned am_emu_turn[32][32];      /* [warp][lane]: exchanges taken */

static inline const am_emu_slot *am_emu_share(const uint64_t *mine, int n) {
    const unsigned w = threadIdx.x >> 5, lane = threadIdx.x & 31, t = am_emu_turn[w][lane]++ & 1u;
    memcpy(am_emu_buf[t][w][lane].v, mine, (size_t)n * sizeof(uint64_t));
    __syncwarp();
    return am_emu_buf[t][w];
}
/* element `half` (0: low 16 bits, 1: high) of a packed BF16 pair, as FP32 */
static inline float am_emu_bf(uint32_t word, int half) {
    const uint32_t u = half ? (word & 0xffff0000u) : (word << 16);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* c (16x8 C fragment) += A (16x16, row) . B (16x8, col): lane = 4 g + t4 holds A rows g, g+8 at
 * columns 2 t4.. (a[0]: row g cols 0-7 half, a[1]: row g+8, a[2]: row g cols 8-15, a[3]: row g+8),
 * B column g at rows 2 t4.. (b0: k < 8, b1: k >= 8), C rows g, g+8 at columns 2 t4, 2 t4 + 1. */
static inline void am_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    const uint64_t mine[3] = {a[0] | (uint64_t)a[1] << 32, a[2] | (uint64_t)a[3] << 32, b0 | (uint64_t)b1 << 32};
    const am_emu_slot *all = am_emu_share(mine, 3);
    const int lane = (int)(threadIdx.x & 31), g = lane >> 2, t4 = lane & 3;
    float out[4];
    for (int e = 0; e < 4; e++) {
        const int row = g + (e < 2 ? 0 : 8), col = 2 * t4 + (e & 1);
        float acc = c[e];
        for (int k = 0; k < 16; k++) {
            const int la = (row & 7) * 4 + ((k & 7) >> 1), ra = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
            const uint32_t wa = (uint32_t)(all[la].v[ra >> 1] >> (32 * (ra & 1)));
            const int lb = col * 4 + ((k & 7) >> 1);
            const uint32_t wb = (uint32_t)(all[lb].v[2] >> (k >= 8 ? 32 : 0));
            acc += am_emu_bf(wa, k & 1) * am_emu_bf(wb, k & 1);
        }
        out[e] = acc;
    }
    for (int e = 0; e < 4; e++) c[e] = out[e];
}

/* ldmatrix.x4: lanes 8 m .. 8 m + 7 give the row addresses of 8x8 matrix m (8 BF16 each); lane L
 * gets r[m] = matrix m's row L / 4, columns 2 (L % 4), +1 (trans: rows 2 (L % 4), +1 of column L / 4). */
static inline void am_emu_ldsm(uint32_t r[4], const am_bf16 *p, bool trans) {
    const uint64_t mine[1] = {(uint64_t)(uintptr_t)p};
    const am_emu_slot *all = am_emu_share(mine, 1);
    const int lane = (int)(threadIdx.x & 31);
    for (int m = 0; m < 4; m++) {
        uint16_t lo, hi;
        if (!trans) {
            const uint16_t *row = (const uint16_t *)(uintptr_t)all[8 * m + (lane >> 2)].v[0];
            lo = row[2 * (lane & 3)], hi = row[2 * (lane & 3) + 1];
        } else {
            const uint16_t *r0 = (const uint16_t *)(uintptr_t)all[8 * m + 2 * (lane & 3)].v[0];
            const uint16_t *r1 = (const uint16_t *)(uintptr_t)all[8 * m + 2 * (lane & 3) + 1].v[0];
            lo = r0[lane >> 2], hi = r1[lane >> 2];
        }
        r[m] = (uint32_t)lo | (uint32_t)hi << 16;
    }
}
static inline void am_ldsm(uint32_t r[4], const am_bf16 *p) { am_emu_ldsm(r, p, false); }
static inline void am_ldsm_t(uint32_t r[4], const am_bf16 *p) { am_emu_ldsm(r, p, true); }

static inline void am_cp16(am_bf16 *dst, const am_bf16 *src, bool valid) {
    if (valid) memcpy(dst, src, 16);
    else memset(dst, 0, 16);
}
static inline void am_commit(void) {}
template <int N>
static inline void am_wait(void) {}

static inline float am_exp2(float x) {
    const float y = exp2f(x);
    return y < FLT_MIN ? 0.0f : y;
}

#endif /* DW_KERNELS_ATTN_MMA_PTX_CUH */
