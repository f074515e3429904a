// moe_store_sm90.cuh — the grouped expert GEMMs' BF16 output epilogue through TMA (sm_90a), shared by
// the BF16 kernel (moe_gemm_sm90.cu) and the fp8_block one (moe_gemm_fp8_sm90.cu) for fprop and
// dgrad: a consumer warpgroup's 64 x BN accumulators (the wgmma m64nBN fragment: acc[4 j + 2 h + v]
// at row 16 warp + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + v) rounded to BF16 into its own
// shared staging, then one thread hands the staging to TMA as boxes of 64 rows x 64 columns, and
// the warpgroup goes on to its next tile's wgmmas while the copies drain. The register epilogue it
// replaces stored 4 bytes a thread at a time, with the tensor cores idle meanwhile.
// Only whole 64-row blocks of one expert's group go this way: TMA cannot cut a box at the group's
// end, and the rows past it belong to the next expert's tile (the caller keeps its register
// epilogue for the last, partial block). Columns past the tensor's width are cut by the map.
// Private CUDA C++; compiled for sm_90a only (DW_SM90_BODY).
#ifndef DW_KERNELS_MOE_STORE_SM90_CUH
#define DW_KERNELS_MOE_STORE_SM90_CUH

#include <cuda_bf16.h>
#include <stdint.h>
#include <string.h>

#include "core/async_copy.cuh"
#include "core/env.h"
#include "core/wgmma_sm90.cuh"

constexpr int DW_MOE_STORE_BOX = 64 * 128; // bytes of a 64-row x 64-column BF16 box (128-byte swizzle)

// Whether the kernels store this way: DW_MOE_STORE=reg keeps their register epilogue (an A/B knob).
static inline bool dw_moe_store_tma(void) {
    const char *v = dw_env("DW_MOE_STORE");
    return !(v && !strcmp(v, "reg"));
}

#ifdef DW_SM90_BODY
// Warpgroup cw (named barrier 1 + cw, 128 threads; lt its thread) stores its 64 x BN fragment at
// rows [row0, row0 + 64) and columns [col0, col0 + BN) of the (rows, cols) BF16 map (64 x 64 boxes,
// 128-byte swizzle) through stg, the warpgroup's own staging of SB boxes (1024-byte aligned): SB
// boxes at a time, each round waiting until the copies before it have read stg (SB = BN / 64: one
// round; fewer boxes leave the kernel room for more pipeline slots). Every thread of the warpgroup
// calls it.
template <int BN, int SB>
__device__ __forceinline__ void moe_store_bf16_tma(const float *acc, uint8_t *stg, const CUtensorMap *map,
                                                   int64_t row0, int64_t col0, int64_t cols, int cw, int lt) {
    static_assert(BN % 64 == 0 && SB >= 1 && (BN / 64) % SB == 0, "whole 64-column boxes, whole rounds");
    const int warp = lt / 32, lane = lt % 32, q = lane % 4;
#pragma unroll
    for (int b0 = 0; b0 < BN / 64; b0 += SB) {
        if (col0 + 64 * b0 >= cols) break; // the rest of the tile lies past the tensor
        if (lt == 0) bulk_wait_read();
        asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 16 * warp + lane / 4 + 8 * h; // r % 8 = lane / 4: a store's 8 rows on distinct banks
#pragma unroll
            for (int jj = 0; jj < 8 * SB; jj++) { // columns 8 j + 2 q (+1): box j / 8, 16-byte chunk j % 8
                const int j = 8 * b0 + jj, chunk = (jj % 8) ^ (lane / 4);
                *reinterpret_cast<__nv_bfloat162 *>(stg + (jj / 8) * DW_MOE_STORE_BOX + r * 128 + chunk * 16 + 4 * q) =
                    __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
            }
        }
        fence_proxy_async(); // the writes, before the async proxy's reads
        asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
        if (lt == 0) {
#pragma unroll
            for (int b = 0; b < SB; b++) {
                const int64_t c0 = col0 + 64 * (b0 + b);
                if (c0 >= cols) break;
                tma_store_2d(map, (int)c0, (int)row0, stg + b * DW_MOE_STORE_BOX);
            }
            bulk_commit();
        }
    }
}
#endif // DW_SM90_BODY

#endif // DW_KERNELS_MOE_STORE_SM90_CUH
