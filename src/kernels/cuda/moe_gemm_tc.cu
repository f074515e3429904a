// moe_gemm_tc.cu — the BF16 grouped expert GEMM on the tensor cores (mma.sync m16n8k16, FP32
// accumulation), one kernel for the three passes of moe_gemm.cuh. A CTA of 8 warps computes a
// 128x128 tile of one expert's product, each warp 64x32 (4 x 4 mma tiles); K tiles of 32 are staged
// through registers into double-buffered shared tiles, 16 bytes at a time, in the operand's own
// layout: [i][l] for operands whose unit stride runs along l (fprop's x and W, dgrad's dy; rows
// padded to 40 values, fragments read with 32-bit loads), [l][i] for the others (dgrad's W, wgrad's
// dy and x; rows padded to 136 values, fragments transposed by ldmatrix.trans). Both are free of
// bank conflicts. Rows outside the expert's group and columns past the edges load as zero. A first version for correctness and the CUDA path of the MoE
// layer; the wgmma/TMA grouped GEMM of the MoE speed work replaces it.
#include <cuda_bf16.h>

#include "kernels/cuda/moe_gemm.cuh"
#include "kernels/cuda/moe_gemm_tc.h"

namespace {

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ uint32_t lds32(const bf16 *p) { return *reinterpret_cast<const uint32_t *>(p); }
constexpr int BM = 128, BN = 128, BK = 32, THREADS = 256;
constexpr int LDS = BK + 8;  // [i][l] tiles: row length
constexpr int LDT = BM + 8;  // [l][i] tiles: row length
constexpr int TILE = BM * LDS > BK * LDT ? BM * LDS : BK * LDT; // values of one buffer, either layout
static_assert(BM == BN, "one tile size for both operands");

// This thread's 2 of the 512 eight-value pieces of a 128 x 32 tile, X(i,l) = p[i*si + l*sl], into
// registers. LC: l is the unit-stride dimension (pieces run along l), else i is.
template <bool LC>
__device__ __forceinline__ void tc_fetch(uint4 (&r)[2], const bf16 *p, int64_t si, int64_t sl, int64_t i0, int64_t I,
                                         int64_t l0, int64_t L, bool vec) {
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int v = threadIdx.x + THREADS * q;
        const int i = LC ? v / 4 : (v % 16) * 8, l = LC ? (v % 4) * 8 : v / 16;
        const int64_t gi = i0 + i, gl = l0 + l;
        const bool full = LC ? gi < I && gl + 8 <= L : gi + 8 <= I && gl < L;
        if (vec && full) {
            r[q] = *reinterpret_cast<const uint4 *>(p + gi * si + gl * sl);
            continue;
        }
        alignas(16) bf16 t[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int64_t ii = LC ? gi : gi + u, ll = LC ? gl + u : gl;
            t[u] = ii < I && ll < L ? p[ii * si + ll * sl] : __float2bfloat16_rn(0.0f);
        }
        r[q] = *reinterpret_cast<const uint4 *>(t);
    }
}

// The pieces tc_fetch loaded, into the shared tile: s[i*LDS + l] (LC) or s[l*LDT + i].
template <bool LC> __device__ __forceinline__ void tc_store(bf16 *s, const uint4 (&r)[2]) {
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int v = threadIdx.x + THREADS * q;
        const int i = LC ? v / 4 : (v % 16) * 8, l = LC ? (v % 4) * 8 : v / 16;
        *reinterpret_cast<uint4 *>(s + (LC ? i * LDS + l : l * LDT + i)) = r[q];
    }
}

// Four 8x8 BF16 matrices from shared memory, each transposed: lane L gives the address of row L % 8
// of matrix L / 8; register q gets matrix q.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16 *p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
#endif
}

// The A fragments (16 x 16 at rows i0, reduction ks) of a tile: a0 (i, l), a1 (i+8, l), a2 (i, l+8),
// a3 (i+8, l+8) with i = lane/4, l = 2 (lane%4).
template <bool LC> __device__ __forceinline__ void tc_frag_a(uint32_t (&a)[4], const bf16 *s, int i0, int ks, int lane) {
    if (LC) {
        const bf16 *r0 = s + (i0 + lane / 4) * LDS + ks + 2 * (lane % 4);
        a[0] = lds32(r0), a[1] = lds32(r0 + 8 * LDS), a[2] = lds32(r0 + 8), a[3] = lds32(r0 + 8 * LDS + 8);
    } else { // matrix q: reduction rows ks + 8 (q / 2) + lane % 8, columns i0 + 8 (q % 2)
        const int q = lane / 8;
        ldsm_x4_trans(a, s + (ks + 8 * (q / 2) + lane % 8) * LDT + i0 + 8 * (q % 2));
    }
}

// The B fragments of two 8-column tiles at j0 and j0 + 8: b[n][0] (l, j), b[n][1] (l+8, j) with
// j = lane/4, l = 2 (lane%4).
template <bool LC>
__device__ __forceinline__ void tc_frag_b2(uint32_t (&b)[4][2], int n, const bf16 *s, int j0, int ks, int lane) {
    if (LC) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const bf16 *c0 = s + (j0 + 8 * h + lane / 4) * LDS + ks + 2 * (lane % 4);
            b[n + h][0] = lds32(c0), b[n + h][1] = lds32(c0 + 8);
        }
    } else { // matrix q: reduction rows ks + 8 (q % 2) + lane % 8, columns j0 + 8 (q / 2)
        const int q = lane / 8;
        uint32_t r[4];
        ldsm_x4_trans(r, s + (ks + 8 * (q % 2) + lane % 8) * LDT + j0 + 8 * (q / 2));
        b[n][0] = r[0], b[n][1] = r[1], b[n + 1][0] = r[2], b[n + 1][1] = r[3];
    }
}


// c (16x8 FP32) += a (16x16 BF16, row) . b (16x8 BF16, col)
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

template <bool ALC, bool BLC> __global__ void __launch_bounds__(THREADS) moe_gemm_tc_kernel(dw_moe_gemm_args g, int vec) {
    __shared__ alignas(16) bf16 As[2][TILE];
    __shared__ alignas(16) bf16 Bs[2][TILE];
    int64_t e, g0, cnt, i0;
    if (!dw_moe_tile(g, BM, e, g0, cnt, i0)) return;
    const dw_moe_prob<bf16> p = dw_moe_problem<bf16>(g, e, g0, cnt);
    const int64_t j0 = (int64_t)blockIdx.y * BN;
    if (j0 >= p.J) return;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
    const int wi = warp / 4, wj = warp % 4; // the warp's 64 x 32 part of the tile
    float acc[4][4][4];
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int u = 0; u < 4; u++) acc[m][n][u] = 0.0f;
    uint4 ra[2], rb[2];
    const int64_t nk = (p.L + BK - 1) / BK;
    if (nk > 0) {
        tc_fetch<ALC>(ra, p.a, p.sai, p.sal, i0, p.I, 0, p.L, vec);
        tc_fetch<BLC>(rb, p.b, p.sbj, p.sbl, j0, p.J, 0, p.L, vec);
        tc_store<ALC>(As[0], ra);
        tc_store<BLC>(Bs[0], rb);
    }
    __syncthreads();
    for (int64_t kt = 0; kt < nk; kt++) {
        const int cur = (int)(kt & 1);
        if (kt + 1 < nk) { // next tile in flight during this one's mma
            tc_fetch<ALC>(ra, p.a, p.sai, p.sal, i0, p.I, (kt + 1) * BK, p.L, vec);
            tc_fetch<BLC>(rb, p.b, p.sbj, p.sbl, j0, p.J, (kt + 1) * BK, p.L, vec);
        }
#pragma unroll
        for (int ks = 0; ks < BK; ks += 16) {
            uint32_t af[4][4], bfr[4][2];
#pragma unroll
            for (int m = 0; m < 4; m++) tc_frag_a<ALC>(af[m], As[cur], wi * 64 + m * 16, ks, lane);
#pragma unroll
            for (int n = 0; n < 4; n += 2) tc_frag_b2<BLC>(bfr, n, Bs[cur], wj * 32 + n * 8, ks, lane);
#pragma unroll
            for (int m = 0; m < 4; m++)
#pragma unroll
                for (int n = 0; n < 4; n++) mma_bf16(acc[m][n], af[m], bfr[n]);
        }
        if (kt + 1 < nk) {
            tc_store<ALC>(As[cur ^ 1], ra);
            tc_store<BLC>(Bs[cur ^ 1], rb);
        }
        __syncthreads();
    }
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t i = i0 + wi * 64 + m * 16 + gq + 8 * h;
                if (i >= p.I) continue;
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int64_t j = j0 + wj * 32 + n * 8 + 2 * tq + u;
                    if (j >= p.J) continue;
                    const float v = acc[m][n][2 * h + u];
                    if (g.pass == DW_MOE_WGRAD) {
                        float *c = (float *)p.c + i * p.ldc + j;
                        *c = g.overwrite ? v : *c + v;
                    }
                    else ((bf16 *)p.c)[i * p.ldc + j] = __float2bfloat16_rn(v);
                }
            }
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

} // namespace

cudaError_t dw_moe_gemm_tc(const dw_moe_gemm_args *a, cudaStream_t s) {
    const int vec = a->K % 8 == 0 && a->M % 8 == 0 && aligned16(a->x) && aligned16(a->w) && aligned16(a->dy);
    const int64_t J = a->pass == DW_MOE_FPROP ? a->M : a->K;
    if (a->pass == DW_MOE_WGRAD) {
        const dim3 grid((unsigned)((a->M + BM - 1) / BM), (unsigned)((a->K + BN - 1) / BN), (unsigned)a->E);
        moe_gemm_tc_kernel<false, false><<<grid, THREADS, 0, s>>>(*a, vec);
    } else {
        const dim3 grid((unsigned)((a->R + BM - 1) / BM + a->E), (unsigned)((J + BN - 1) / BN), 1);
        if (a->pass == DW_MOE_FPROP) moe_gemm_tc_kernel<true, true><<<grid, THREADS, 0, s>>>(*a, vec);
        else moe_gemm_tc_kernel<true, false><<<grid, THREADS, 0, s>>>(*a, vec);
    }
    return cudaGetLastError();
}
