// sm90_common.cuh — private device helpers shared by Deepwell's own sm_90a GEMM kernels
// (mxfp8_sm90.cu, fp8block_sm90.cu, kernels/cuda/moe_gemm_fp8_sm90.cu): the m64n128k32 and
// m64n192k32 FP8 wgmmas, the promotion of a 128-K partial with 128x128-block scales, cluster
// multicast, the scalar epilogue; the warpgroup building blocks (descriptors, fences, rings, raster) are
// core/wgmma_sm90.cuh's; mbarriers and TMA loads are core/async_copy.cuh's
// (maps: core/tensor_map.cuh). CUDA C++; not a public header.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "core/async_copy.cuh"
#include "core/tensor_map.cuh"
#include "core/wgmma_sm90.cuh"
#include "gemm/gemm_cuda.h"

namespace {

// Epilogue parameters: D = epi(alpha acc + beta C + bias), pre-activation to aux when set.
struct Epi {
    float alpha, beta;
    const void *c;
    void *d;
    const void *bias;
    void *aux;
    int gelu, out_bf16;
    int64_t m, n;
};
inline Epi make_epi(const dw_sm90_epi &x, int64_t m, int64_t n) {
    return Epi{x.alpha, x.beta, x.c, x.d, x.bias, x.aux, x.gelu, x.out_bf16, m, n};
}

#ifdef DW_SM90_BODY

// D[64x128] = A[64x32] . B[128x32]^T (+ D when scale_d != 0, else overwriting d). The operands are "+f" so that
// the compiler keeps each partial in the same registers ("=f" let it rename them: spills).
template <bool E5A, bool E5B>
__device__ __forceinline__ void wgmma_k32(float *d, uint64_t da, uint64_t db, int scale_d = 0) {
#define DW_WGMMA(TYPES)                                                                         \
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"                                  \
                 " wgmma.mma_async.sync.aligned.m64n128k32.f32" TYPES " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                                                                        \
                 : "l"(da), "l"(db), "r"(scale_d))
    if constexpr (!E5A && !E5B) DW_WGMMA(".e4m3.e4m3");
    else if constexpr (E5A && !E5B) DW_WGMMA(".e5m2.e4m3");
    else if constexpr (!E5A && E5B) DW_WGMMA(".e4m3.e5m2");
    else DW_WGMMA(".e5m2.e5m2");
#undef DW_WGMMA
}

__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}


__device__ __forceinline__ float load_out(const void *p, int bf16, int64_t i) {
    return bf16 ? __bfloat162float(((const __nv_bfloat16 *)p)[i]) : ((const float *)p)[i];
}
__device__ __forceinline__ void store_out(void *p, int bf16, int64_t i, float v) {
    if (bf16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    else ((float *)p)[i] = v;
}

__device__ __forceinline__ float epi_value(const Epi &e, int64_t r, int64_t c, float acc, bool *aux_written) {
    float v = e.alpha * acc;
    if (e.beta != 0.0f) v += e.beta * load_out(e.c, e.out_bf16, r * e.n + c);
    if (e.bias) v += load_out(e.bias, e.out_bf16, c);
    if (e.aux) store_out(e.aux, e.out_bf16, r * e.n + c, v);
    (void)aux_written;
    if (e.gelu) v = gelu_tanh(v);
    return v;
}


// Stores the epilogue of D[r, c] and D[r, c + 1] (c even; c + 1 may be past n): one 4- or 8-byte
// store when both lie inside a row of even length (aligned), else element by element.
__device__ __forceinline__ void epi_store_pair(const Epi &e, int64_t r, int64_t c, float a0, float a1) {
    bool aw = false;
    if (c >= e.n) return;
    float v0 = epi_value(e, r, c, a0, &aw);
    if (c + 1 < e.n && !(e.n & 1)) {
        float v1 = epi_value(e, r, c + 1, a1, &aw);
        if (e.out_bf16) *reinterpret_cast<__nv_bfloat162 *>((__nv_bfloat16 *)e.d + r * e.n + c) = __floats2bfloat162_rn(v0, v1);
        else *reinterpret_cast<float2 *>((float *)e.d + r * e.n + c) = make_float2(v0, v1);
        return;
    }
    store_out(e.d, e.out_bf16, r * e.n + c, v0);
    if (c + 1 < e.n) store_out(e.d, e.out_bf16, r * e.n + c + 1, epi_value(e, r, c + 1, a1, &aw));
}

// ---- clusters (TMA multicast between the CTAs of a cluster) ----
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// All threads of every CTA of the cluster (orders mbarrier inits and smem before remote use).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Arrives on the mbarrier at the same shared-memory offset in CTA `rank` of the cluster. Default
// (CTA-scope) release semantics: what it orders are the arriving warp's wgmma reads of a ring slot,
// complete at its wgmma wait; `.release.cluster` cost a full memory barrier per arrival (ERRBAR:
// 39% of the multicast kernel's stall samples, half its speed).
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *bar, uint32_t rank) {
    asm volatile("{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n"
                 " mbarrier.arrive.shared::cluster.b64 _, [ra];\n}" ::"r"(smem_u32(bar)),
                 "r"(rank)
                 : "memory");
}
// TMA load of one box into the same offset of every CTA in `mask`, completing on each one's `bar`.
__device__ __forceinline__ void tma_load_2d_mc(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                               uint16_t mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_u32(dst)),
                 "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(mask)
                 : "memory");
}

// D[64x192] += A[64x32] . B[192x32]^T (scale_d 0: overwrite), E4M3 both.
__device__ __forceinline__ void wgmma_n192_k32(float *d, uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %98, 0;\n"
                 " wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}, %96, %97, p, 1, 1;\n}"
                 : "+f"(d[0]),"+f"(d[1]),"+f"(d[2]),"+f"(d[3]),"+f"(d[4]),"+f"(d[5]),"+f"(d[6]),"+f"(d[7]),"+f"(d[8]),"+f"(d[9]),"+f"(d[10]),"+f"(d[11]),"+f"(d[12]),"+f"(d[13]),"+f"(d[14]),"+f"(d[15]),"+f"(d[16]),"+f"(d[17]),"+f"(d[18]),"+f"(d[19]),"+f"(d[20]),"+f"(d[21]),"+f"(d[22]),"+f"(d[23]),"+f"(d[24]),"+f"(d[25]),"+f"(d[26]),"+f"(d[27]),"+f"(d[28]),"+f"(d[29]),"+f"(d[30]),"+f"(d[31]),"+f"(d[32]),"+f"(d[33]),"+f"(d[34]),"+f"(d[35]),"+f"(d[36]),"+f"(d[37]),"+f"(d[38]),"+f"(d[39]),"+f"(d[40]),"+f"(d[41]),"+f"(d[42]),"+f"(d[43]),"+f"(d[44]),"+f"(d[45]),"+f"(d[46]),"+f"(d[47]),"+f"(d[48]),"+f"(d[49]),"+f"(d[50]),"+f"(d[51]),"+f"(d[52]),"+f"(d[53]),"+f"(d[54]),"+f"(d[55]),"+f"(d[56]),"+f"(d[57]),"+f"(d[58]),"+f"(d[59]),"+f"(d[60]),"+f"(d[61]),"+f"(d[62]),"+f"(d[63]),"+f"(d[64]),"+f"(d[65]),"+f"(d[66]),"+f"(d[67]),"+f"(d[68]),"+f"(d[69]),"+f"(d[70]),"+f"(d[71]),"+f"(d[72]),"+f"(d[73]),"+f"(d[74]),"+f"(d[75]),"+f"(d[76]),"+f"(d[77]),"+f"(d[78]),"+f"(d[79]),"+f"(d[80]),"+f"(d[81]),"+f"(d[82]),"+f"(d[83]),"+f"(d[84]),"+f"(d[85]),"+f"(d[86]),"+f"(d[87]),"+f"(d[88]),"+f"(d[89]),"+f"(d[90]),"+f"(d[91]),"+f"(d[92]),"+f"(d[93]),"+f"(d[94]),"+f"(d[95])
                 : "l"(da), "l"(db), "r"(scale_d));
}

// Ties N accumulator registers to this point of the program (see reg_fence).
template <int N> __device__ __forceinline__ void reg_fence_n(float *d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// The 4 k32 wgmmas of one 128-K tile: part = A[64x128] . B[BNx128]^T (descriptors advance 32 B).
template <int BN> __device__ __forceinline__ void wgmma_k128(float *part, uint64_t da, uint64_t db) {
    wg_fence();
#pragma unroll
    for (int c = 0; c < 4; c++) {
        if constexpr (BN == 128) wgmma_k32<false, false>(part, da + 2 * c, db + 2 * c, c);
        else wgmma_n192_k32(part, da + 2 * c, db + 2 * c, c);
    }
    wg_commit();
}

template <int BN> __device__ __forceinline__ void fence_part(float *part) {
    if constexpr (BN == 128) reg_fence(part);
    else reg_fence_n<BN / 2>(part);
}

// acc += part * s for rows r0 (s.x) and r0 + 8 (s.y), s = (sa[r0] sb, sa[r0 + 8] sb) with sb the
// scalar of the 128x128 B block holding the column: a 128-column tile has one block (lo); a
// 192-column tile spans two, columns c = 8 j + 2 q (+1) below `split` (64 for an odd tile, 128 for
// an even one) taking lo, the rest hi (j < 8 always below, j >= 16 always above).
template <int BN> __device__ __forceinline__ void promote_blk(float *acc, float *part, float2 lo, float2 hi, bool odd) {
    fence_part<BN>(part);
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        const float2 sc = BN == 128 || j < 8 ? lo : j >= 16 ? hi : odd ? hi : lo;
        acc[4 * j + 0] = fmaf(part[4 * j + 0], sc.x, acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(part[4 * j + 1], sc.x, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(part[4 * j + 2], sc.y, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(part[4 * j + 3], sc.y, acc[4 * j + 3]);
    }
}

#endif // DW_SM90_BODY

} // namespace
