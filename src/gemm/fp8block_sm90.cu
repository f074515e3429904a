// fp8block_sm90.cu — Deepwell's own FP8 block-scaled GEMM for Hopper (sm_90a), the DeepSeek-V3
// recipe: E4M3 codes, A with one FP32 scale per 1x128 (or 128x128) block along K, B with one per
// 1x128 (per output column) or 128x128 block. Not MXFP8 (mxfp8_sm90.cu) and not Blackwell.
//
// Per 128 of K, the 4 m64n128k32 wgmmas of a warpgroup accumulate into one FP32 partial in the
// tensor cores; the partial is then promoted once, acc += partial * (sa[row] * sb), in FP32
// registers. CTA (warp-specialised, persistent): warpgroup 0 is the producer (one thread issues TMA
// loads of A, B and, for per-column B scales, a K-block-major copy of them into a STAGES-deep ring
// guarded by full/empty mbarriers; setmaxnreg gives its registers to the consumers); NC consumer
// warpgroups own 64 rows each of a (64 NC)x128 tile and read their rows' A scales with ld.global
// one K tile ahead, or (SSM) from the slot, where a second producer warp copies them with cp.async.
// With PIPE = 2 a consumer takes K tiles in pairs, the second's wgmmas running during the first's
// promotion. With CL = 2, two CTAs of a cluster take vertically adjacent tiles and each loads half
// of the shared B tile, multicast to both (half the L2 reads of B). docs/gemm.md has the numbers.
#include "gemm/gemm_cuda.h"
#include "gemm/sm90_common.cuh"

namespace {

constexpr int FB_BN = 128, FB_BK = 128;

// NC consumer warpgroups (tile BM = 64 NC rows), SBCOL: B scales per column (staged by TMA) rather
// than one scalar per 128x128 block (read from global memory); CL CTAs per cluster sharing B; PIPE
// partial accumulators per consumer (2: the next K tile's wgmmas run during this one's promotion);
// SSM: a producer warp stages each K tile's A scales (and a 128x128 B block's scalar) in shared
// memory beside the codes, instead of the consumers loading them from global memory.
template <int NC, bool SBCOL, int CL, int PIPE = 1, bool SSM = false> struct FbCfg {
    static constexpr int BM = 64 * NC, THREADS = 128 * (NC + 1);
    static constexpr int STAGES = NC == 3 ? 5 : 6;
    static constexpr int A_BYTES = BM * FB_BK, B_BYTES = FB_BN * FB_BK, SB_BYTES = SBCOL ? FB_BN * 4 : 0;
    static constexpr int SA_FLOATS = SSM ? BM + 4 : 0; // [BM] A scales, then B's scalar
    static constexpr int STAGE_TX = A_BYTES + B_BYTES + SB_BYTES;
    static constexpr int SMEM = STAGES * (STAGE_TX + 4 * SA_FLOATS) + 2 * STAGES * 8 + 1024;
    // registers per thread after setmaxnreg: producer / consumers. setmaxnreg only moves registers
    // within what the CTA got at launch (THREADS x the per-thread count __launch_bounds__(THREADS, 1)
    // yields: 65536 / THREADS rounded down to 8), so an increase beyond what the decrease freed
    // waits forever.
    static constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
    static constexpr int PROD_REGS = NC == 3 ? 56 : 40, CONS_REGS = NC == 3 ? 152 : 232;
    static_assert(SMEM <= 227 * 1024, "shared memory over the sm_90 limit");
    static_assert(128 * PROD_REGS + 128 * NC * CONS_REGS <= THREADS * LAUNCH_REGS,
                  "setmaxnreg would ask for more registers than the CTA holds");
    static_assert(CL == 1 || CL == 2, "clusters of 1 or 2 CTAs");
    static_assert(PIPE == 1 || (PIPE == 2 && NC == 2), "two partials fit the registers of 2 consumer warpgroups only");
};

// Kernel parameters besides the tensor maps and the epilogue.
struct FbArgs {
    const float *sa;  // A scales: [m, kb] (a_shift 0) or [ceil(m/128), kb] (a_shift 7)
    const float *sb;  // B scales when !SBCOL: [ceil(n/128), kb]
    int64_t kb;       // k / 128
    int a_shift;
    int64_t tiles_m, tiles_n;
};

#ifdef DW_SM90_BODY
constexpr int FB_GROUP_M = 16; // tile raster: 16 M-tiles share the B tiles in L2

// 4 bytes global -> shared, asynchronously (zero fill when !valid); cp_async_arrive makes the
// barrier's pending count drop once all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}
__device__ __forceinline__ void cp_async_arrive(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// The 4 k32 wgmmas of one 128-K tile: part = A[64x128] . B[128x128]^T (descriptors advance 32 B).
__device__ __forceinline__ void wgmma_k128(float *part, uint64_t da, uint64_t db) {
    wg_fence();
#pragma unroll
    for (int c = 0; c < 4; c++) wgmma_k32<false, false>(part, da + 2 * c, db + 2 * c, c);
    wg_commit();
}

// acc += part * (sa[row] * sb) for rows r0 (a0) and r0 + 8 (a1); sb a scalar, or per column from
// shared memory (sbs [128], columns 8 j + 2 q, +1).
template <bool SBCOL>
__device__ __forceinline__ void promote128(float *acc, float *part, float a0, float a1, float b, const float *sbs,
                                           int q) {
    reg_fence(part);
    if constexpr (!SBCOL) {
        const float s0 = a0 * b, s1 = a1 * b;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            acc[4 * j + 0] = fmaf(part[4 * j + 0], s0, acc[4 * j + 0]);
            acc[4 * j + 1] = fmaf(part[4 * j + 1], s0, acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(part[4 * j + 2], s1, acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(part[4 * j + 3], s1, acc[4 * j + 3]);
        }
    } else {
        (void)b;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            float2 bb = *reinterpret_cast<const float2 *>(sbs + 8 * j + 2 * q);
            acc[4 * j + 0] = fmaf(part[4 * j + 0], a0 * bb.x, acc[4 * j + 0]);
            acc[4 * j + 1] = fmaf(part[4 * j + 1], a0 * bb.y, acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(part[4 * j + 2], a1 * bb.x, acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(part[4 * j + 3], a1 * bb.y, acc[4 * j + 3]);
        }
    }
}

// Stores rows row0, row0 + 8, columns col0 + 8 j (+1): the plain case (alpha acc, even n) with
// one paired store each, unrolled; the general one (beta C, bias, GELU, aux, odd n) from a local
// copy in a rolled loop, so that its large code stays out of the instruction cache every tile.
__device__ __forceinline__ void epilogue(const Epi &e, const float *acc, int64_t row0, int64_t col0) {
    if (e.beta != 0.0f || e.bias || e.aux || e.gelu || (e.n & 1)) {
        float t[64];
#pragma unroll
        for (int i = 0; i < 64; i++) t[i] = acc[i];
#pragma unroll 1
        for (int i = 0; i < 32; i++) {
            const int h = i & 1, j = i >> 1;
            const int64_t row = row0 + 8 * h;
            if (row < e.m) epi_store_pair(e, row, col0 + 8 * j, t[4 * j + 2 * h], t[4 * j + 2 * h + 1]);
        }
        return;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t row = row0 + 8 * h;
        if (row >= e.m) continue;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int64_t col = col0 + 8 * j;
            if (col >= e.n) continue;
            const float v0 = e.alpha * acc[4 * j + 2 * h], v1 = e.alpha * acc[4 * j + 2 * h + 1];
            if (e.out_bf16)
                *reinterpret_cast<__nv_bfloat162 *>((__nv_bfloat16 *)e.d + row * e.n + col) = __floats2bfloat162_rn(v0, v1);
            else *reinterpret_cast<float2 *>((float *)e.d + row * e.n + col) = make_float2(v0, v1);
        }
    }
}
#endif // DW_SM90_BODY

template <int NC, bool SBCOL, int CL, int PIPE, bool SSM>
__global__ void __launch_bounds__(FbCfg<NC, SBCOL, CL, PIPE, SSM>::THREADS, 1)
    fp8block_kernel(const __grid_constant__ CUtensorMap tA, const __grid_constant__ CUtensorMap tB,
                    const __grid_constant__ CUtensorMap tSB, FbArgs p, Epi e) {
#ifdef DW_SM90_BODY
    using C = FbCfg<NC, SBCOL, CL, PIPE, SSM>;
    constexpr int BM = C::BM, ST = C::STAGES;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sA = smem;                                  // [ST][BM rows][128 B], 128B swizzle
    uint8_t *sB = sA + ST * C::A_BYTES;                  // [ST][128 rows][128 B]
    float *sSB = (float *)(sB + ST * C::B_BYTES);        // [ST][128] when SBCOL
    float *sSA = sSB + ST * C::SB_BYTES / 4;             // [ST][BM + 4] when SSM
    uint64_t *full = (uint64_t *)(sSA + ST * C::SA_FLOATS);
    uint64_t *empty = full + ST;

    const int tid = threadIdx.x, wg = tid / 128;
    const uint32_t rank = CL > 1 ? cluster_rank() : 0;
    // work units: CL vertically adjacent tiles (one per CTA of the cluster) sharing one B tile
    const int64_t units_m = (p.tiles_m + CL - 1) / CL, units = units_m * p.tiles_n;
    const int64_t u0 = blockIdx.x / CL, ustep = gridDim.x / CL;
    const int ktiles = (int)p.kb;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(&full[s], SSM ? 33 : 1); // the TMA thread (+ the scale warp's 32 lanes)
            mbar_init(&empty[s], 4 * NC * CL); // one arrival per consumer warp of the cluster
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (CL > 1) cluster_sync();
    else __syncthreads();

    if (wg == 0) { // producer
        regs_dec<C::PROD_REGS>();
        if (tid == 0) {
            int64_t it = 0; // K tiles issued so far by this CTA (ring position)
            for (int64_t u = u0; u < units; u += ustep) {
                int64_t um, tn;
                tile_coords(u, units_m, p.tiles_n, FB_GROUP_M / CL, &um, &tn);
                // with CL = 2 the second tile may lie past tiles_m: no A for it (nothing of it is
                // stored), but its B half still goes to the peer
                const int64_t tm = um * CL + rank;
                const bool a_in = tm < p.tiles_m;
                for (int kt = 0; kt < ktiles; kt++, it++) {
                    const int s = (int)(it % ST);
                    if (it >= ST) mbar_wait(&empty[s], (uint32_t)((it / ST - 1) & 1));
                    mbar_expect_tx(&full[s], a_in ? C::STAGE_TX : C::STAGE_TX - C::A_BYTES);
                    if (a_in) tma_load_2d(sA + s * C::A_BYTES, &tA, &full[s], kt * FB_BK, (int)(tm * BM));
                    if constexpr (CL == 1) tma_load_2d(sB + s * C::B_BYTES, &tB, &full[s], kt * FB_BK, (int)(tn * FB_BN));
                    else // this CTA's half of the B tile, into both CTAs
                        tma_load_2d_mc(sB + s * C::B_BYTES + rank * (FB_BN / 2) * FB_BK, &tB, &full[s], kt * FB_BK,
                                       (int)(tn * FB_BN + rank * (FB_BN / 2)), (uint16_t)3);
                    if constexpr (SBCOL) tma_load_2d(sSB + s * FB_BN, &tSB, &full[s], (int)(tn * FB_BN), kt);
                }
            }
        } else if (SSM && tid / 32 == 1) { // the scale warp: A's row scales (+ B's scalar) per slot
            // 4-byte cp.async copies, each lane's completing on the slot's full barrier (noinc: the
            // barrier counts the 32 lanes), so the warp runs ahead of the consumers like the TMA thread
            const int lane = tid % 32;
            int64_t it = 0;
            for (int64_t u = u0; u < units; u += ustep) {
                int64_t um, tn;
                tile_coords(u, units_m, p.tiles_n, FB_GROUP_M / CL, &um, &tn);
                const int64_t r0 = (um * CL + rank) * BM;
                for (int kt = 0; kt < ktiles; kt++, it++) {
                    const int s = (int)(it % ST);
                    if (it >= ST) mbar_wait(&empty[s], (uint32_t)((it / ST - 1) & 1));
                    float *dst = sSA + s * C::SA_FLOATS;
#pragma unroll
                    for (int i = 0; i < BM / 32; i++) { // rows past m: zero fill (never stored)
                        const int64_t row = r0 + 32 * i + lane;
                        const bool in = row < e.m;
                        cp_async4(dst + 32 * i + lane, in ? p.sa + (row >> p.a_shift) * p.kb + kt : p.sa, in);
                    }
                    if (!SBCOL && lane == 0) cp_async4(dst + BM, p.sb + tn * p.kb + kt, true);
                    cp_async_arrive(&full[s]);
                }
            }
        }
    } else { // consumers: warpgroup wg owns rows [64 (wg-1), +64) of the tile
        regs_inc<C::CONS_REGS>();
        const int cw = wg - 1, lt = tid % 128, warp = lt / 32, lane = lt % 32;
        const int rl = 64 * cw + 16 * warp + lane / 4, q = lane % 4; // rows rl, rl + 8; cols 8 j + 2 q (+1)
        // frees ring slot s in every CTA of the cluster (their producers write into this CTA's slot)
        auto release = [&](int s) {
            __syncwarp();
            if (lane == 0) {
                if constexpr (CL == 1) mbar_arrive(&empty[s]);
                else
                    for (uint32_t r = 0; r < CL; r++) mbar_arrive_cluster(&empty[s], r);
            }
        };
        auto ldsa = [&](const float *pa, int kt) { return pa ? __ldg(pa + kt) : 0.0f; };
        // the tile of work unit u: B column block, first row of this thread, scale rows (rows past
        // m read no scale: their A codes are TMA zero fill and they are never stored)
        struct Tile {
            int64_t tn, row0;
            const float *pa0, *pa1, *pb;
        };
        auto open = [&](int64_t u) {
            int64_t um, tn;
            tile_coords(u, units_m, p.tiles_n, FB_GROUP_M / CL, &um, &tn);
            Tile t;
            t.tn = tn, t.row0 = (um * CL + rank) * BM + rl;
            t.pa0 = t.row0 < e.m ? p.sa + (t.row0 >> p.a_shift) * p.kb : nullptr;
            t.pa1 = t.row0 + 8 < e.m ? p.sa + ((t.row0 + 8) >> p.a_shift) * p.kb : nullptr;
            t.pb = SBCOL ? nullptr : p.sb + tn * p.kb;
            return t;
        };
        // this thread's A scales (rows rl, rl + 8) and B's scalar, as the scale warp staged them in slot s
        auto slot_scales = [&](int s, float *a0, float *a1, float *b) {
            const float *v = sSA + s * C::SA_FLOATS;
            *a0 = v[rl], *a1 = v[rl + 8], *b = SBCOL ? 1.0f : v[BM];
        };
        auto descs = [&](int s, uint64_t *da, uint64_t *db) {
            *da = make_desc(sA + s * C::A_BYTES + cw * 64 * FB_BK), *db = make_desc(sB + s * C::B_BYTES);
        };
        float acc[64];
        if constexpr (PIPE == 1) {
            float part[64];
#pragma unroll
            for (int i = 0; i < 64; i++) part[i] = 0.0f;
            int64_t it = 0;
            for (int64_t u = u0; u < units; u += ustep) {
                const Tile t = open(u);
#pragma unroll
                for (int i = 0; i < 64; i++) acc[i] = 0.0f;
                float na0 = 0.0f, na1 = 0.0f, nb = 1.0f;
                if constexpr (!SSM) na0 = ldsa(t.pa0, 0), na1 = ldsa(t.pa1, 0), nb = SBCOL ? 1.0f : __ldg(t.pb);
                for (int kt = 0; kt < ktiles; kt++, it++) {
                    const int s = (int)(it % ST);
                    float a0 = na0, a1 = na1, b = nb;
                    if (!SSM && kt + 1 < ktiles) { // the next tile's scales, one tile ahead
                        na0 = ldsa(t.pa0, kt + 1), na1 = ldsa(t.pa1, kt + 1);
                        if constexpr (!SBCOL) nb = __ldg(t.pb + kt + 1);
                    }
                    mbar_wait(&full[s], (uint32_t)((it / ST) & 1));
                    if constexpr (SSM) slot_scales(s, &a0, &a1, &b);
                    uint64_t da, db;
                    descs(s, &da, &db);
                    wgmma_k128(part, da, db);
                    wg_wait<0>();
                    if constexpr (!SBCOL) release(s); // the slot is free once the wgmmas are done
                    promote128<SBCOL>(acc, part, a0, a1, b, sSB + s * FB_BN, q);
                    if constexpr (SBCOL) release(s); // after the promotion has read the slot's B scales
                }
                // epilogue straight from registers (the producer already fills the ring for the next tile)
                epilogue(e, acc, t.row0, t.tn * FB_BN + 2 * q);
            }
        } else {
            // Two partials, K tiles in pairs: tile kt+1's wgmmas run on the tensor cores while tile
            // kt's partial is promoted. No wgmma group stays in flight across a loop iteration or
            // inside a branch (ptxas would serialise them); with an odd count the last pair's
            // second issue re-reads the first's slot into the spare partial, and is not promoted.
            float p0[64], p1[64];
#pragma unroll
            for (int i = 0; i < 64; i++) p0[i] = p1[i] = 0.0f;
            int64_t it = 0;
            for (int64_t u = u0; u < units; u += ustep) {
                const Tile t = open(u);
#pragma unroll
                for (int i = 0; i < 64; i++) acc[i] = 0.0f;
                for (int kt = 0; kt < ktiles; kt += 2) {
                    const bool has_b = kt + 1 < ktiles;
                    const int sa = (int)(it % ST), sb = has_b ? (int)((it + 1) % ST) : sa;
                    float a0 = 0.0f, a1 = 0.0f, b = 1.0f, c0 = 0.0f, c1 = 0.0f, cb = 1.0f;
                    if constexpr (!SSM) {
                        a0 = ldsa(t.pa0, kt), a1 = ldsa(t.pa1, kt), b = SBCOL ? 1.0f : __ldg(t.pb + kt);
                        c0 = has_b ? ldsa(t.pa0, kt + 1) : 0.0f, c1 = has_b ? ldsa(t.pa1, kt + 1) : 0.0f;
                        cb = SBCOL || !has_b ? 1.0f : __ldg(t.pb + kt + 1);
                    }
                    uint64_t da, db;
                    mbar_wait(&full[sa], (uint32_t)((it / ST) & 1));
                    if constexpr (SSM) slot_scales(sa, &a0, &a1, &b);
                    descs(sa, &da, &db);
                    wgmma_k128(p0, da, db);
                    if (has_b) {
                        mbar_wait(&full[sb], (uint32_t)(((it + 1) / ST) & 1));
                        if constexpr (SSM) slot_scales(sb, &c0, &c1, &cb);
                    }
                    descs(sb, &da, &db);
                    wgmma_k128(p1, da, db);
                    wg_wait<1>();
                    promote128<SBCOL>(acc, p0, a0, a1, b, sSB + sa * FB_BN, q);
                    wg_wait<0>();
                    if (has_b) promote128<SBCOL>(acc, p1, c0, c1, cb, sSB + sb * FB_BN, q);
                    release(sa);
                    if (has_b) release(sb);
                    it += has_b ? 2 : 1;
                }
                epilogue(e, acc, t.row0, t.tn * FB_BN + 2 * q);
            }
        }
    }
    if constexpr (CL > 1) cluster_sync(); // no CTA leaves while its peer may still signal or write into it
#else
    __trap(); // selected only on sm_90 by the registry
#endif
}

int sm_count() {
    static int n = 0;
    if (!n) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            n = 132;
    }
    return n;
}

template <int NC, bool SBCOL, int CL, int PIPE, bool SSM>
cudaError_t launch(const CUtensorMap &a, const CUtensorMap &b, const CUtensorMap &sb, const FbArgs &p, const Epi &e,
                   cudaStream_t st) {
    using C = FbCfg<NC, SBCOL, CL, PIPE, SSM>;
    auto kern = fp8block_kernel<NC, SBCOL, CL, PIPE, SSM>;
    static int resident = 0; // CTAs that run at once (whole clusters)
    if (!resident) {
        cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
        if (err != cudaSuccess) return err;
        resident = sm_count();
        if (CL > 1) {
            if ((err = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 0)) != cudaSuccess)
                return err;
            cudaLaunchConfig_t q = {};
            cudaLaunchAttribute at = {};
            at.id = cudaLaunchAttributeClusterDimension;
            at.val.clusterDim.x = CL, at.val.clusterDim.y = 1, at.val.clusterDim.z = 1;
            q.gridDim = dim3((unsigned)resident), q.blockDim = dim3(C::THREADS), q.dynamicSmemBytes = C::SMEM;
            q.attrs = &at, q.numAttrs = 1;
            int clusters = 0;
            if (cudaOccupancyMaxActiveClusters(&clusters, kern, &q) == cudaSuccess && clusters > 0)
                resident = clusters * CL;
            else
                resident = resident / CL * CL;
        }
    }
    const int64_t units = (p.tiles_m + CL - 1) / CL * p.tiles_n;
    const int64_t grid = (units * CL < resident ? units * CL : resident);
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at = {};
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = CL, at.val.clusterDim.y = 1, at.val.clusterDim.z = 1;
    cfg.gridDim = dim3((unsigned)grid), cfg.blockDim = dim3(C::THREADS), cfg.dynamicSmemBytes = C::SMEM;
    cfg.stream = st, cfg.attrs = &at, cfg.numAttrs = CL > 1 ? 1 : 0; // CL = 1: a plain launch
    cudaError_t err = cudaLaunchKernelEx(&cfg, kern, a, b, sb, p, e);
    return err != cudaSuccess ? err : cudaGetLastError();
}

template <int NC, int CL, int PIPE = 1, bool SSM = false>
cudaError_t launch_sb(const CUtensorMap &a, const CUtensorMap &b, const CUtensorMap &sb, const FbArgs &p,
                      const Epi &e, bool sbcol, cudaStream_t st) {
    return sbcol ? launch<NC, true, CL, PIPE, SSM>(a, b, sb, p, e, st)
                 : launch<NC, false, CL, PIPE, SSM>(a, b, sb, p, e, st);
}

} // namespace

extern "C" int dw_gemm_fp8block_sm90_launch(const dw_fp8block_sm90_args *p, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    const int v = p->variant; // the instantiated combinations (gemm_cuda.h)
    const bool known = v == 0 || v == 1 || v == 2 || v == 3 || v == 4 || v == 9 || v == 12;
    if (p->k % FB_BK || p->m <= 0 || p->n <= 0 || p->k <= 0 || !known) return (int)cudaErrorInvalidValue;
    const int nc = p->variant & 1 ? 3 : 2, bm = 64 * nc, cl = p->variant & 2 ? 2 : 1;
    const int64_t kb = p->k / FB_BK, ldb = (p->n + 3) / 4 * 4;
    const bool sbcol = !p->b_2d;
    // per-column B scales: K-block-major copy [kb][ldb] for TMA (columns past n are 0)
    float *sbt = nullptr;
    cudaError_t err = cudaSuccess;
    if (sbcol) {
        if ((err = cudaMallocAsync((void **)&sbt, (size_t)(kb * ldb) * sizeof(float), st)) != cudaSuccess) return (int)err;
        if ((err = (cudaError_t)dw_gemm_cuda_transpose_scales(p->sb, p->n, kb, ldb, sbt, st)) != cudaSuccess) {
            cudaFreeAsync(sbt, st);
            return (int)err;
        }
    }
    CUtensorMap ta, tb, tsb;
    bool ok = make_map(&ta, p->a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p->m, p->k, p->k, FB_BK, (uint32_t)bm,
                       CU_TENSOR_MAP_SWIZZLE_128B) &&
              make_map(&tb, p->b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p->n, p->k, p->k, FB_BK, (uint32_t)(FB_BN / cl),
                       CU_TENSOR_MAP_SWIZZLE_128B);
    if (ok && sbcol)
        ok = make_map(&tsb, sbt, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, kb, p->n, ldb, FB_BN, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
    else
        tsb = ta; // unused
    if (!ok) {
        if (sbt) cudaFreeAsync(sbt, st);
        return (int)cudaErrorInvalidValue;
    }
    FbArgs fa{p->sa, p->sb, kb, p->a_2d ? 7 : 0, (p->m + bm - 1) / bm, (p->n + FB_BN - 1) / FB_BN};
    const Epi e = make_epi(p->epi, p->m, p->n);
    switch (p->variant) {
    case 0: err = launch_sb<2, 1>(ta, tb, tsb, fa, e, sbcol, st); break;
    case 1: err = launch_sb<3, 1>(ta, tb, tsb, fa, e, sbcol, st); break;
    case 2: err = launch_sb<2, 2>(ta, tb, tsb, fa, e, sbcol, st); break;
    case 3: err = launch_sb<3, 2>(ta, tb, tsb, fa, e, sbcol, st); break;
    case 4: err = launch_sb<2, 1, 2>(ta, tb, tsb, fa, e, sbcol, st); break;
    case 9: err = launch_sb<3, 1, 1, true>(ta, tb, tsb, fa, e, sbcol, st); break;
    case 12: err = launch_sb<2, 1, 2, true>(ta, tb, tsb, fa, e, sbcol, st); break;
    default: err = cudaErrorInvalidValue; break; // other combinations are not instantiated
    }
    cudaError_t ferr = sbt ? cudaFreeAsync(sbt, st) : cudaSuccess;
    return (int)(err != cudaSuccess ? err : ferr);
}
