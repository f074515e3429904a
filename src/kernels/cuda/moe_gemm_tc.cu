// moe_gemm_tc.cu — the BF16 grouped expert GEMM on the tensor cores (mma.sync m16n8k16, FP32
// accumulation), one kernel for the three passes of moe_gemm.cuh. A CTA of 8 warps computes a
// 128x128 tile of one expert's product, each warp 64x32 (4 x 4 mma tiles); K tiles of 32 are staged
// through registers into a double-buffered shared tile stored [i][l] (l contiguous, rows padded to
// 40 values: the fragment loads are free of bank conflicts). Operands whose unit stride runs along
// l (fprop's x and W, dgrad's dy) move 16 bytes at a time; the others (dgrad's W, wgrad's dy and
// x) are transposed on the way into shared memory. Rows outside the expert's group and columns
// past the edges load as zero. A first version for correctness and the CUDA path of the MoE
// layer; the wgmma/TMA grouped GEMM of the MoE speed work replaces it.
#include <cuda_bf16.h>

#include "kernels/cuda/moe_gemm.cuh"
#include "kernels/cuda/moe_gemm_tc.h"

namespace {

typedef __nv_bfloat16 bf16;
constexpr int BM = 128, BN = 128, BK = 32, LDS = BK + 8, THREADS = 256;

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

// The pieces tc_fetch loaded, into the shared tile s[i][l].
template <bool LC> __device__ __forceinline__ void tc_store(bf16 (*s)[LDS], const uint4 (&r)[2]) {
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const int v = threadIdx.x + THREADS * q;
        const int i = LC ? v / 4 : (v % 16) * 8, l = LC ? (v % 4) * 8 : v / 16;
        if (LC) {
            *reinterpret_cast<uint4 *>(&s[i][l]) = r[q];
        } else {
            const bf16 *t = reinterpret_cast<const bf16 *>(&r[q]);
#pragma unroll
            for (int u = 0; u < 8; u++) s[i + u][l] = t[u];
        }
    }
}

__device__ __forceinline__ uint32_t lds32(const bf16 *p) { return *reinterpret_cast<const uint32_t *>(p); }

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
    __shared__ alignas(16) bf16 As[2][BM][LDS];
    __shared__ alignas(16) bf16 Bs[2][BN][LDS];
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
            for (int m = 0; m < 4; m++) {
                const bf16 *r0 = &As[cur][wi * 64 + m * 16 + gq][ks + 2 * tq];
                af[m][0] = lds32(r0), af[m][1] = lds32(r0 + 8 * LDS);
                af[m][2] = lds32(r0 + 8), af[m][3] = lds32(r0 + 8 * LDS + 8);
            }
#pragma unroll
            for (int n = 0; n < 4; n++) {
                const bf16 *c0 = &Bs[cur][wj * 32 + n * 8 + gq][ks + 2 * tq];
                bfr[n][0] = lds32(c0), bfr[n][1] = lds32(c0 + 8);
            }
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
                    if (g.pass == DW_MOE_WGRAD) ((float *)p.c)[i * p.ldc + j] += v;
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
