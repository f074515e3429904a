// mxfp8_sm90.cu — Deepwell's own MXFP8 GEMM for Hopper (sm_90a): Blackwell's MXFP8 arithmetic
// (E4M3/E5M2 elements, one UE8M0 scale per 32 elements of K) on FP8 wgmma (QGMMA). Each 32-wide
// K chunk is one m64n128k32 wgmma into a fresh FP32 accumulator; the partial is then promoted,
// acc += (sa * sb) * partial, in FP32 registers. Not a Blackwell kernel (sm_100 uses cuBLASLt).
//
// CTA: 128x128 output tile, K step 128 (4 chunks), 2 warpgroups (64 rows each); thread 0 issues
// the TMA copies (codes with 128B swizzle, and decoded FP32 scales) into a
// STAGES-deep ring guarded by full/empty mbarriers. A pre-pass decodes the UE8M0 scales into
// FP32, K-block-major ([k/32][m] and [k/32][n]), so that the producer can TMA them too.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "gemm/gemm_cuda.h"

namespace {

constexpr int BM = 128, BN = 128, BK = 128, STAGES = 6;
constexpr int TILE_BYTES = BM * BK;            // A or B codes per stage (16 KiB)
constexpr int SCALE_FLOATS = 4 * BM;           // 4 chunks x 128 rows (2 KiB)
constexpr int THREADS = 256;                   // 2 warpgroups; thread 0 also issues the copies
constexpr int SMEM_BYTES = STAGES * (2 * TILE_BYTES + 2 * SCALE_FLOATS * 4) + 2 * STAGES * 8 + 1024;
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory over the sm_90 limit");

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

// Device code exists for sm_90a only; the sm_100a pass sees an empty kernel (never selected there).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ == 900
#define DW_MX_SM90_BODY 1
constexpr int GROUP_M = 16;                    // tile raster: 16 M-tiles share the B tiles in L2

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    asm volatile(
        "{\n .reg .pred P1;\n WAIT_%=:\n"
        " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
        " @P1 bra DONE_%=;\n bra WAIT_%=;\n DONE_%=:\n}" ::"r"(smem_u32(bar)),
        "r"(parity)
        : "memory");
}
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
            smem_u32(dst)),
        "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
        : "memory");
}

// wgmma shared-memory descriptor: K-major tile, rows of 128 bytes, 128-byte swizzle, 8-row atoms
// 1024 bytes apart.
__device__ __forceinline__ uint64_t make_desc(const void *p) {
    uint64_t a = smem_u32(p);
    return ((a & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Ties the accumulator registers to this point of the program (no reads move above a wait).
__device__ __forceinline__ void reg_fence(float *d) {
    asm volatile("" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) :: "memory");
}

// D[64x128] = A[64x32] . B[128x32]^T, overwriting d (scale-d = 0). The operands are "+f" so that
// the compiler keeps each partial in the same registers ("=f" let it rename them: spills).
template <bool E5A, bool E5B>
__device__ __forceinline__ void wgmma_k32(float *d, uint64_t da, uint64_t db) {
#define DW_WGMMA(TYPES)                                                                         \
    asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"                                  \
                 " wgmma.mma_async.sync.aligned.m64n128k32.f32" TYPES " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                                                                        \
                 : "l"(da), "l"(db), "r"(0))
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

// Promotion of one 32-K chunk: acc += sa[row] * (part * sb[col]). Both scales are powers of two,
// so this equals (sa * sb) * part exactly; multiplying the partial first keeps the products from
// being computed ahead of the wgmma wait (64 extra live registers, which spilled).
__device__ __forceinline__ void promote(float *acc, float *part, const float *sa, const float *sb, int r0, int q) {
    reg_fence(part);
    float a0 = sa[r0], a1 = sa[r0 + 8];
#pragma unroll
    for (int j = 0; j < 16; j++) {
        float2 b = *reinterpret_cast<const float2 *>(sb + 8 * j + 2 * q);
        acc[4 * j + 0] = fmaf(part[4 * j + 0] * b.x, a0, acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(part[4 * j + 1] * b.y, a0, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(part[4 * j + 2] * b.x, a1, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(part[4 * j + 3] * b.y, a1, acc[4 * j + 3]);
    }
}

#endif // DW_MX_SM90_BODY

template <bool E5A, bool E5B, bool DB>
__global__ void __launch_bounds__(THREADS, 1)
    mxfp8_gemm_kernel(const __grid_constant__ CUtensorMap tA, const __grid_constant__ CUtensorMap tB,
                      const __grid_constant__ CUtensorMap tSA, const __grid_constant__ CUtensorMap tSB, int64_t k,
                      Epi e) {
#ifdef DW_MX_SM90_BODY
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sA = smem;                                        // [STAGES][128 rows][128 B]
    uint8_t *sB = sA + STAGES * TILE_BYTES;                    // [STAGES][128 rows][128 B]
    float *sSA = (float *)(sB + STAGES * TILE_BYTES);          // [STAGES][4 chunks][128]
    float *sSB = sSA + STAGES * SCALE_FLOATS;                  // [STAGES][4 chunks][128]
    uint64_t *full = (uint64_t *)(sSB + STAGES * SCALE_FLOATS);
    uint64_t *empty = full + STAGES;

    const int tid = threadIdx.x;
    const int64_t tiles_m = (e.m + BM - 1) / BM, tiles_n = (e.n + BN - 1) / BN;
    const int64_t bid = blockIdx.x, per_group = (int64_t)GROUP_M * tiles_n;
    const int64_t first_m = (bid / per_group) * GROUP_M;
    const int64_t gm = min((int64_t)GROUP_M, tiles_m - first_m);
    const int64_t tm = first_m + (bid % per_group) % gm, tn = (bid % per_group) / gm;
    const int ktiles = (int)((k + BK - 1) / BK);

    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    // thread 0 keeps STAGES tiles in flight: tile t goes to slot t % STAGES once both warpgroups
    // released the slot's previous tile (empty barrier). (A polling variant that never blocks
    // measured slower: 255 vs 304 TFLOP/s at 8192^3, more spills.)
    auto issue = [&](int kt) {
        int s = kt % STAGES;
        mbar_expect_tx(&full[s], 2 * TILE_BYTES + 2 * SCALE_FLOATS * 4);
        tma_load_2d(sA + s * TILE_BYTES, &tA, &full[s], kt * BK, (int)(tm * BM));
        tma_load_2d(sB + s * TILE_BYTES, &tB, &full[s], kt * BK, (int)(tn * BN));
        tma_load_2d(sSA + s * SCALE_FLOATS, &tSA, &full[s], (int)(tm * BM), kt * 4);
        tma_load_2d(sSB + s * SCALE_FLOATS, &tSB, &full[s], (int)(tn * BN), kt * 4);
    };
    if (tid == 0)
        for (int t = 0; t < STAGES && t < ktiles; t++) issue(t);

    // consumers: warpgroup wg owns rows [64 wg, 64 wg + 64) of the tile
    const int wg = tid / 128, lt = tid % 128, warp = lt / 32, lane = lt % 32;
    const int r0 = 64 * wg + 16 * warp + lane / 4, q = lane % 4;
    float acc[64], p0[64], p1[DB ? 64 : 1];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = p0[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < (DB ? 64 : 1); i++) p1[i] = 0.0f;

    for (int kt = 0; kt < ktiles; kt++) {
        int s = kt % STAGES;
        mbar_wait(&full[s], (kt / STAGES) & 1);
        const uint8_t *a = sA + s * TILE_BYTES + wg * 64 * BK;
        const uint8_t *b = sB + s * TILE_BYTES;
        const float *sa = sSA + s * SCALE_FLOATS, *sb = sSB + s * SCALE_FLOATS;
        uint64_t da = make_desc(a), db = make_desc(b);
        // chunk c advances the descriptors by 32 bytes (2 in 16-byte units)
        if constexpr (!DB) { // one partial buffer: the other warpgroup's wgmma overlaps this promotion
#pragma unroll
            for (int c = 0; c < 4; c++) {
                wg_fence();
                wgmma_k32<E5A, E5B>(p0, da + 2 * c, db + 2 * c);
                wg_commit();
                wg_wait<0>();
                promote(acc, p0, sa + 128 * c, sb + 128 * c, r0, q);
            }
        } else { // two: chunk c+1 runs on the tensor cores while chunk c is promoted
            wg_fence();
            wgmma_k32<E5A, E5B>(p0, da, db);
            wg_commit();
            wg_fence();
            wgmma_k32<E5A, E5B>(p1, da + 2, db + 2);
            wg_commit();
            wg_wait<1>();
            promote(acc, p0, sa, sb, r0, q);
            wg_fence();
            wgmma_k32<E5A, E5B>(p0, da + 4, db + 4);
            wg_commit();
            wg_wait<1>();
            promote(acc, p1, sa + 128, sb + 128, r0, q);
            wg_fence();
            wgmma_k32<E5A, E5B>(p1, da + 6, db + 6);
            wg_commit();
            wg_wait<1>();
            promote(acc, p0, sa + 256, sb + 256, r0, q);
            wg_wait<0>();
            promote(acc, p1, sa + 384, sb + 384, r0, q);
        }
        mbar_arrive(&empty[s]);
        if (tid == 0 && kt + STAGES < ktiles) { // refill this slot once both warpgroups are done with it
            mbar_wait(&empty[s], (kt / STAGES) & 1);
            issue(kt + STAGES);
        }
    }

    // epilogue: rows r0, r0 + 8; columns 8 j + 2 q (+1)
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int64_t row = tm * BM + r0 + 8 * h;
        if (row >= e.m) continue;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int64_t col = tn * BN + 8 * j + 2 * q;
            bool aw = false;
            if (col < e.n) store_out(e.d, e.out_bf16, row * e.n + col, epi_value(e, row, col, acc[4 * j + 2 * h], &aw));
            if (col + 1 < e.n)
                store_out(e.d, e.out_bf16, row * e.n + col + 1, epi_value(e, row, col + 1, acc[4 * j + 2 * h + 1], &aw));
        }
    }
#else
    __trap(); // selected only on sm_90 by the registry
#endif
}

// UE8M0 codes [rows, kb] -> FP32 [kb][ld] (K-block-major; rows..ld padded with 0).
__global__ void decode_scales_kernel(const uint8_t *src, int64_t rows, int64_t kb, int64_t ld, float *dst) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= kb * ld) return;
    int64_t c = idx / ld, r = idx % ld;
    float v = 0.0f;
    if (r < rows) {
        uint32_t code = src[r * kb + c];
        v = code == 0xFF ? __int_as_float(0x7fc00000) : code == 0 ? __int_as_float(0x00400000) : __int_as_float(code << 23);
    }
    dst[idx] = v;
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (!fn) {
        cudaDriverEntryPointQueryResult q;
        void *p = nullptr;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}

// 2-D tensor map over row-major [rows, cols] elements of `esize` bytes, row stride `ld` elements.
bool make_map(CUtensorMap *m, const void *base, CUtensorMapDataType t, int esize, int64_t rows, int64_t cols,
              int64_t ld, uint32_t box_c, uint32_t box_r, CUtensorMapSwizzle sw) {
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)(ld * esize)};
    cuuint32_t box[2] = {box_c, box_r};
    cuuint32_t es[2] = {1, 1};
    PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
    if (!fn) return false;
    return fn(m, t, 2, (void *)base, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <bool E5A, bool E5B, bool DB>
cudaError_t launch(const CUtensorMap &a, const CUtensorMap &b, const CUtensorMap &sa, const CUtensorMap &sb,
                   int64_t k, const Epi &e, cudaStream_t st) {
    auto kern = mxfp8_gemm_kernel<E5A, E5B, DB>;
    static bool attr = false;
    if (!attr) {
        cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES);
        if (err != cudaSuccess) return err;
        attr = true;
    }
    int64_t tiles = ((e.m + BM - 1) / BM) * ((e.n + BN - 1) / BN);
    kern<<<(unsigned)tiles, THREADS, SMEM_BYTES, st>>>(a, b, sa, sb, k, e);
    return cudaGetLastError();
}

} // namespace

extern "C" int dw_gemm_mxfp8_sm90_launch(const dw_mxfp8_sm90_args *p, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t kb = p->k / 32, lda = (p->m + 3) / 4 * 4, ldb = (p->n + 3) / 4 * 4;
    float *scales = nullptr;
    cudaError_t err = cudaMallocAsync((void **)&scales, (size_t)(kb * (lda + ldb)) * sizeof(float), st);
    if (err != cudaSuccess) return (int)err;
    float *fa = scales, *fb = scales + kb * lda;
    decode_scales_kernel<<<(unsigned)((kb * lda + 255) / 256), 256, 0, st>>>(p->sa, p->m, kb, lda, fa);
    decode_scales_kernel<<<(unsigned)((kb * ldb + 255) / 256), 256, 0, st>>>(p->sb, p->n, kb, ldb, fb);
    CUtensorMap ta, tb, tsa, tsb;
    bool ok = make_map(&ta, p->a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p->m, p->k, p->k, BK, BM,
                       CU_TENSOR_MAP_SWIZZLE_128B) &&
              make_map(&tb, p->b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p->n, p->k, p->k, BK, BN,
                       CU_TENSOR_MAP_SWIZZLE_128B) &&
              make_map(&tsa, fa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, kb, p->m, lda, BM, 4, CU_TENSOR_MAP_SWIZZLE_NONE) &&
              make_map(&tsb, fb, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, kb, p->n, ldb, BN, 4, CU_TENSOR_MAP_SWIZZLE_NONE);
    if (!ok) {
        cudaFreeAsync(scales, st);
        return (int)cudaErrorInvalidValue;
    }
    Epi e{p->alpha, p->beta, p->c, p->d, p->bias, p->aux, p->gelu, p->out_bf16, p->m, p->n};
    if (p->double_buffer) {
        if (!p->e5m2_a && !p->e5m2_b) err = launch<false, false, true>(ta, tb, tsa, tsb, p->k, e, st);
        else if (p->e5m2_a && !p->e5m2_b) err = launch<true, false, true>(ta, tb, tsa, tsb, p->k, e, st);
        else if (!p->e5m2_a && p->e5m2_b) err = launch<false, true, true>(ta, tb, tsa, tsb, p->k, e, st);
        else err = launch<true, true, true>(ta, tb, tsa, tsb, p->k, e, st);
    } else {
        if (!p->e5m2_a && !p->e5m2_b) err = launch<false, false, false>(ta, tb, tsa, tsb, p->k, e, st);
        else if (p->e5m2_a && !p->e5m2_b) err = launch<true, false, false>(ta, tb, tsa, tsb, p->k, e, st);
        else if (!p->e5m2_a && p->e5m2_b) err = launch<false, true, false>(ta, tb, tsa, tsb, p->k, e, st);
        else err = launch<true, true, false>(ta, tb, tsa, tsb, p->k, e, st);
    }
    cudaError_t ferr = cudaFreeAsync(scales, st);
    return (int)(err != cudaSuccess ? err : ferr);
}
