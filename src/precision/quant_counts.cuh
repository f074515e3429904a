/* quant_counts.cuh — device side of the counters' definitions (quant_counts.h), shared by the
 * counting pass (quant_counts.cu) and the quantisers that count as they quantise (kernels/cuda/
 * quant_kernels.cuh, quant_bulk.cu): the exact dequantisation of one code (element value x block scale
 * [x s_t], FP32 products left to right, as dw_dequantize_cpu), the test of one element, and the
 * per-CTA flush (warp shuffles, shared memory, one atomic per counter, none for a zero). Not the
 * host count (quant_counts.c). CUDA C++ only. */
#ifndef DW_PRECISION_QUANT_COUNTS_CUH
#define DW_PRECISION_QUANT_COUNTS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "precision/quant_counts.h"

namespace dwqc {

/* A recipe's element format for counting: 4-bit E2M1, 8-bit E4M3 or E5M2. */
struct Fmt {
    int bits;
    bool e5m2;
};

/* The element value of a code (NaN for NaN codes). */
__device__ __forceinline__ float elem(Fmt f, unsigned c) {
    if (f.bits == 4) { /* 0, 0.5, 1, 1.5, 2, 3, 4, 6: exponent c>>1 & 3, mantissa c & 1 */
        const unsigned e = (c >> 1) & 3u, m = c & 1u;
        const float v = e ? ldexpf((float)(2u + m), (int)e - 2) : 0.5f * (float)m;
        return (c & 8u) ? -v : v;
    }
    const unsigned m7 = c & 0x7Fu;
    float v;
    if (f.e5m2) {
        const unsigned e = m7 >> 2, m = m7 & 3u;
        if (e == 31u) v = m ? __int_as_float(0x7FC00000) : __int_as_float(0x7F800000);
        else v = e ? ldexpf((float)(4u + m), (int)e - 17) : ldexpf((float)m, -16);
    } else {
        const unsigned e = m7 >> 3, m = m7 & 7u;
        if (m7 == 0x7Fu) v = __int_as_float(0x7FC00000);
        else v = e ? ldexpf((float)(8u + m), (int)e - 10) : ldexpf((float)m, -9);
    }
    return (c & 0x80u) ? -v : v;
}

/* A 1-byte block scale: UE4M3 (nvfp4; 0x7F NaN) or UE8M0 (MX; 0xFF NaN). */
__device__ __forceinline__ float scale8(bool nv, unsigned s) {
    if (nv) {
        if (s == 0x7Fu) return __int_as_float(0x7FC00000);
        const unsigned e = s >> 3, m = s & 7u;
        return e ? ldexpf((float)(8u + m), (int)e - 10) : ldexpf((float)m, -9);
    }
    return s == 0xFFu ? __int_as_float(0x7FC00000) : ldexpf(1.0f, (int)s - 127);
}

/* One thread's counts (a thread's share of one operand copy fits 32 bits). */
struct Acc {
    unsigned over, under;
};

/* Element x (as the quantiser read it) quantised to `code` under block scale s (FP32, or the
 * decoded 1-byte scale) and, nvfp4 (nv), tensor scale st: y = elem x s [x st]; a non-finite x or
 * y counts in neither (quant_counts.h). */
__device__ __forceinline__ void test(Fmt f, bool nv, unsigned code, float x, float s, float st, Acc &a) {
    unsigned mask, top;
    double ratio;
    dw_qc_top(f.bits, f.e5m2, &mask, &top, &ratio);
    float y = elem(f, code) * s;
    if (nv) y = y * st;
    if (!isfinite(x) || !isfinite(y)) return;
    a.over += dw_qc_overflow(code, mask, top, ratio, x, y);
    a.under += dw_qc_underflow(x, y);
}

/* N consecutive elements v[0..N) whose codes are packed in w (8-bit: 4 per word, E2M1: 8 per
 * word, element 0 in the lowest bits), one block scale s. */
template <int N>
__device__ __forceinline__ void test_n(Fmt f, bool nv, const float *v, const uint32_t *w, float s, float st, Acc &a) {
#pragma unroll
    for (int i = 0; i < N; i++) {
        const unsigned c = f.bits == 4 ? (w[i / 8] >> (4 * (i % 8))) & 0xFu : (w[i / 4] >> (8 * (i % 4))) & 0xFFu;
        test(f, nv, c, v[i], s, st, a);
    }
}

__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    return v;
}

/* Adds a CTA's counts of up to two copies (a[0] to cnt[0], a[1] to cnt[1]; a NULL counter takes
 * nothing) with one atomic per non-zero word; CTA 0 also adds each copy's elements n (its
 * DW_QC_N). Called once by each of the WARPS warps that count (all their lanes), sh: 4 WARPS words
 * of shared memory; `sync` a barrier of those warps. */
template <int WARPS, typename Sync>
__device__ __forceinline__ void flush(const Acc (&a)[2], unsigned long long *const (&cnt)[2], unsigned long long n,
                                      unsigned long long *sh, int warp, int lane, Sync sync) {
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const unsigned long long o = warp_sum(a[k].over), u = warp_sum(a[k].under);
        if (lane == 0) sh[4 * warp + 2 * k] = o, sh[4 * warp + 2 * k + 1] = u;
    }
    sync();
    if (warp == 0 && lane < 2 * DW_QC_WORDS) { /* lane: copy lane / 3, word lane % 3 */
        const int k = lane / DW_QC_WORDS, wd = lane % DW_QC_WORDS;
        unsigned long long t = 0;
        if (wd == DW_QC_N) t = blockIdx.x == 0 ? n : 0;
        else
            for (int w = 0; w < WARPS; w++) t += sh[4 * w + 2 * k + wd];
        unsigned long long *c = cnt[k];
        if (c && t) atomicAdd(&c[wd], t);
    }
}

} /* namespace dwqc */

#endif /* DW_PRECISION_QUANT_COUNTS_CUH */
