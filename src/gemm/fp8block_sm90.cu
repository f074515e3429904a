// fp8block_sm90.cu — Deepwell's own FP8 block-scaled GEMM for Hopper (sm_90a), the DeepSeek-V3
// recipe: E4M3 codes, A with one FP32 scale per 1x128 (or 128x128) block along K, B with one per
// 1x128 (per output column) or 128x128 block. Not MXFP8 (mxfp8_sm90.cu) and not Blackwell.
//
// Per 128 of K, the 4 m64n128k32 wgmmas of a warpgroup accumulate into one FP32 partial in the
// tensor cores; the partial is then promoted once, acc += partial * (sa[row] * sb), in FP32
// registers. CTA (warp-specialised, persistent): warpgroup 0 is the producer (one thread issues the
// TMA loads of each K tile — A and B codes, A's row scales and B's scales, from K-block-major copies
// of the scales made per call — into a STAGES-deep ring guarded by full/empty mbarriers; setmaxnreg
// gives its registers to the consumers); NC consumer warpgroups own 64 rows each of a (64 NC)x128
// tile and read everything of a K tile from its slot. With PIPE = 2 a consumer takes K tiles in
// pairs, the second's wgmmas running during the first's promotion. With CL = 2, two CTAs of a
// cluster take vertically adjacent tiles and each loads half of the shared B tile, multicast to
// both (half the L2 reads of B). docs/gemm.md has the numbers.
#include "gemm/gemm_cuda.h"
#include "gemm/sm90_common.cuh"

namespace {

constexpr int FB_BK = 128;

// Floats of B's scales a K tile's TMA box brings: the BN column scales, or the 128x128 blocks'
// scalars as a box of 4 (16 bytes, the least TMA moves: the group of 4 blocks holding a 128-column
// tile's block) or 8 (the two blocks a 192-column tile spans, from the group holding the first).
__host__ __device__ constexpr int fb_sb_box(bool sbcol, int bn) { return sbcol ? bn : bn == 128 ? 4 : 8; }

// NC consumer warpgroups (tile BM = 64 NC rows), SBCOL: B scales per column (BN per K tile)
// rather than one scalar per 128x128 block; CL CTAs per cluster sharing B; PIPE partial
// accumulators per consumer (2: the next K tile's wgmmas run during this one's promotion); BN
// tile columns (128, or 192 with 2 warpgroups: 96 + 96 accumulator registers per thread).
template <int NC, bool SBCOL, int CL, int PIPE = 1, int BN = 128> struct FbCfg {
    static constexpr int BM = 64 * NC, THREADS = 128 * (NC + 1);
    static constexpr int STAGES = NC == 3 || BN == 192 ? 5 : 6;
    static constexpr int A_BYTES = BM * FB_BK, B_BYTES = BN * FB_BK;
    // a slot's scales: A's BM row scales; B's box (fb_sb_box), its block scalars padded to 128 bytes
    // (TMA's alignment)
    static constexpr int SA_BYTES = BM * 4, SB_BYTES = SBCOL ? BN * 4 : 128;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES + SA_BYTES + SB_BYTES;
    static constexpr int SMEM = STAGES * STAGE_BYTES + 2 * STAGES * 8 + 1024;
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
    static_assert(PIPE == 1 || (PIPE == 2 && NC == 2 && BN == 128),
                  "two partials fit the registers of 2 consumer warpgroups only, 128-column tiles");
    static_assert(BN == 128 || (BN == 192 && NC == 2), "192-column tiles: 2 consumer warpgroups");
    static_assert(A_BYTES % 1024 == 0 && SA_BYTES % 128 == 0, "slot parts keep TMA's alignment");
    static_assert(4 * fb_sb_box(SBCOL, BN) <= SB_BYTES, "B's scale box fits its part of the slot");
};

// Kernel parameters besides the tensor maps and the epilogue.
struct FbArgs {
    int64_t kb; // k / 128
    int64_t tiles_m, tiles_n;
};

#ifdef DW_SM90_BODY
constexpr int FB_GROUP_M = 16; // tile raster: 16 M-tiles share the B tiles in L2

// acc += part * (sa[row] * sb[col]) for rows r0 (a0), r0 + 8 (a1) and columns 8 j + 2 q (+1), whose
// B scales (per column: 1x128 blocks) are bc(j), a float2 from registers or from the slot.
template <int BN, class BC>
__device__ __forceinline__ void promote_col(float *acc, float *part, float a0, float a1, BC bc) {
    fence_part<BN>(part);
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        const float2 bb = bc(j);
        acc[4 * j + 0] = fmaf(part[4 * j + 0], a0 * bb.x, acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(part[4 * j + 1], a0 * bb.y, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(part[4 * j + 2], a1 * bb.x, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(part[4 * j + 3], a1 * bb.y, acc[4 * j + 3]);
    }
}

// Stores rows row0, row0 + 8, columns col0 + 8 j (+1): the plain case (alpha acc, even n) with
// one paired store each, unrolled; the general one (beta C, bias, GELU, aux, odd n) from a local
// copy in a rolled loop, so that its large code stays out of the instruction cache every tile.
template <int BN> __device__ __forceinline__ void epilogue(const Epi &e, const float *acc, int64_t row0, int64_t col0) {
    if (e.beta != 0.0f || e.bias || e.aux || e.gelu || (e.n & 1)) {
        float t[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; i++) t[i] = acc[i];
#pragma unroll 1
        for (int i = 0; i < BN / 4; i++) {
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
        for (int j = 0; j < BN / 8; j++) {
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

template <int NC, bool SBCOL, int CL, int PIPE, int BN>
__global__ void __launch_bounds__(FbCfg<NC, SBCOL, CL, PIPE, BN>::THREADS, 1)
    fp8block_kernel(const __grid_constant__ CUtensorMap tA, const __grid_constant__ CUtensorMap tB,
                    const __grid_constant__ CUtensorMap tSA, const __grid_constant__ CUtensorMap tSB, FbArgs p,
                    Epi e) {
#ifdef DW_SM90_BODY
    using C = FbCfg<NC, SBCOL, CL, PIPE, BN>;
    constexpr int BM = C::BM, ST = C::STAGES;
    // bytes a K tile's TMA loads bring: all, and A's part (codes and row scales)
    constexpr int A_TX = C::A_BYTES + C::SA_BYTES, STAGE_TX = A_TX + C::B_BYTES + 4 * fb_sb_box(SBCOL, BN);
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_align_1024(smem_raw);
    uint8_t *sA = smem;                                 // [ST][BM rows][128 B], 128B swizzle
    uint8_t *sB = sA + ST * C::A_BYTES;                 // [ST][BN rows][128 B]
    float *sSA = (float *)(sB + ST * C::B_BYTES);       // [ST][BM] A row scales
    float *sSB = sSA + ST * C::SA_BYTES / 4;            // [ST][BN] B column scales, or [ST][32] (block scalars)
    uint64_t *full = (uint64_t *)(sSB + ST * C::SB_BYTES / 4);
    uint64_t *empty = full + ST;

    const int tid = threadIdx.x, wg = warpgroup_index();
    const uint32_t rank = CL > 1 ? cluster_rank() : 0;
    // work units: CL vertically adjacent tiles (one per CTA of the cluster) sharing one B tile
    const int64_t units_m = (p.tiles_m + CL - 1) / CL, units = units_m * p.tiles_n;
    const int64_t u0 = blockIdx.x / CL, ustep = gridDim.x / CL;
    const int ktiles = (int)p.kb;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(&full[s], 1);            // the TMA thread
            mbar_init(&empty[s], 4 * NC * CL); // one arrival per consumer warp of the cluster
        }
        mbar_init_fence();
    }
    if constexpr (CL > 1) cluster_sync();
    else __syncthreads();

    if (wg == 0) { // producer
        regs_dec<C::PROD_REGS>();
        if (tid == 0) {
            Ring r;
            bool first_round = true;
            for (int64_t u = u0; u < units; u += ustep) {
                int64_t um, tn;
                tile_coords(u, units_m, p.tiles_n, FB_GROUP_M / CL, &um, &tn);
                // with CL = 2 the second tile may lie past tiles_m: no A for it (nothing of it is
                // stored), but its B half still goes to the peer
                const int64_t tm = um * CL + rank;
                const bool a_in = tm < p.tiles_m;
                for (int kt = 0; kt < ktiles; kt++) {
                    const int s = r.slot;
                    if (!first_round) mbar_wait(&empty[s], r.phase ^ 1);
                    mbar_expect_tx(&full[s], a_in ? STAGE_TX : STAGE_TX - A_TX);
                    if (a_in) {
                        tma_load_2d(sA + s * C::A_BYTES, &tA, &full[s], kt * FB_BK, (int)(tm * BM));
                        tma_load_2d(sSA + s * BM, &tSA, &full[s], (int)(tm * BM), kt);
                    }
                    if constexpr (CL == 1) tma_load_2d(sB + s * C::B_BYTES, &tB, &full[s], kt * FB_BK, (int)(tn * BN));
                    else // this CTA's half of the B tile, into both CTAs
                        tma_load_2d_mc(sB + s * C::B_BYTES + rank * (BN / 2) * FB_BK, &tB, &full[s], kt * FB_BK,
                                       (int)(tn * BN + rank * (BN / 2)), (uint16_t)3);
                    // (TMA's innermost coordinate must be a multiple of 16 bytes: the scalars' box
                    // starts at the 4-block group holding the tile's first block)
                    tma_load_2d(sSB + s * C::SB_BYTES / 4, &tSB, &full[s], (int)(SBCOL ? tn * BN : (tn * BN / 128) & ~3ll),
                                kt);
                    r.next<ST>();
                    if (r.slot == 0) first_round = false;
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
        // slot s's scales for this thread: A's rows rl, rl + 8, and B's scalar or 16 column pairs.
        // The column pairs are read before the wgmma wait (the slot is then released before the
        // promotion) where their 32 registers fit, 2 warpgroups with one partial; else the
        // promotion reads them from the slot, which is released after it.
        constexpr bool BC_REGS = SBCOL && NC == 2 && PIPE == 1 && BN == 128, LATE_RELEASE = SBCOL && !BC_REGS;
        struct Scales {
            float a0, a1, b, b_hi; // b_hi: BN = 192, the second 128-column block's scalar
            float2 bc[BC_REGS ? 16 : 1];
            const float *vb;
        };
        auto scales = [&](int s, int64_t tn) {
            Scales x;
            const float *va = sSA + s * BM;
            x.vb = sSB + s * C::SB_BYTES / 4;
            const int blk = SBCOL ? 0 : (int)((tn * BN / 128) & 3);
            x.a0 = va[rl], x.a1 = va[rl + 8], x.b = x.vb[blk], x.b_hi = BN == 192 ? x.vb[blk + 1] : 0.0f;
            if constexpr (BC_REGS)
#pragma unroll
                for (int j = 0; j < 16; j++) x.bc[j] = *reinterpret_cast<const float2 *>(x.vb + 8 * j + 2 * q);
            return x;
        };
        // the slot's wgmma descriptors: this warpgroup's 64 rows of A, all of B (start addresses
        // advance by s * bytes / 16 in the descriptor's address field)
        const uint64_t da0 = make_desc(sA + cw * 64 * FB_BK), db0 = make_desc(sB);
        auto descs = [&](int s, uint64_t *da, uint64_t *db) {
            *da = da0 + (uint64_t)(s * (C::A_BYTES >> 4)), *db = db0 + (uint64_t)(s * (C::B_BYTES >> 4));
        };
        auto promote = [&](float *acc, float *part, const Scales &x, int64_t tn) {
            if constexpr (BC_REGS) promote_col<BN>(acc, part, x.a0, x.a1, [&](int j) { return x.bc[j]; });
            else if constexpr (SBCOL)
                promote_col<BN>(acc, part, x.a0, x.a1,
                                [&](int j) { return *reinterpret_cast<const float2 *>(x.vb + 8 * j + 2 * q); });
            else
                promote_blk<BN>(acc, part, make_float2(x.a0 * x.b, x.a1 * x.b),
                                make_float2(x.a0 * x.b_hi, x.a1 * x.b_hi), tn & 1);
        };
        // the tile of work unit u: B column block and the first row of this thread
        auto open = [&](int64_t u, int64_t *tn, int64_t *row0) {
            int64_t um;
            tile_coords(u, units_m, p.tiles_n, FB_GROUP_M / CL, &um, tn);
            *row0 = (um * CL + rank) * BM + rl;
        };
        constexpr int NACC = BN / 2; // accumulators per thread
        float acc[NACC];
        Ring r;
        if constexpr (PIPE == 1) {
            float part[NACC];
#pragma unroll
            for (int i = 0; i < NACC; i++) part[i] = 0.0f;
            for (int64_t u = u0; u < units; u += ustep) {
                int64_t tn, row0;
                open(u, &tn, &row0);
#pragma unroll
                for (int i = 0; i < NACC; i++) acc[i] = 0.0f;
                for (int kt = 0; kt < ktiles; kt++) {
                    const int s = r.slot;
                    mbar_wait(&full[s], r.phase);
                    // the scales first: read after the wgmmas, ptxas put their product, waiting
                    // for the loads, before the last wgmma
                    const Scales x = scales(s, tn);
                    uint64_t da, db;
                    descs(s, &da, &db);
                    wgmma_k128<BN>(part, da, db);
                    wg_wait<0>();
                    if constexpr (!LATE_RELEASE) release(s);
                    promote(acc, part, x, tn);
                    if constexpr (LATE_RELEASE) release(s);
                    r.next<ST>();
                }
                // epilogue straight from registers (the producer already fills the ring for the next tile)
                epilogue<BN>(e, acc, row0, tn * BN + 2 * q);
            }
        } else {
            // Two partials, K tiles in pairs: tile kt+1's wgmmas run on the tensor cores while tile
            // kt's partial is promoted. No wgmma group stays in flight across a loop iteration or
            // inside a branch (ptxas would serialise them); with an odd count the last pair's
            // second issue re-reads the first's slot into the spare partial, and is not promoted.
            float p0[64], p1[64];
#pragma unroll
            for (int i = 0; i < 64; i++) p0[i] = p1[i] = 0.0f;
            for (int64_t u = u0; u < units; u += ustep) {
                int64_t tn, row0;
                open(u, &tn, &row0);
#pragma unroll
                for (int i = 0; i < 64; i++) acc[i] = 0.0f;
                for (int kt = 0; kt < ktiles; kt += 2) {
                    const bool has_b = kt + 1 < ktiles;
                    const int sa = r.slot;
                    Ring r2 = r;
                    r2.next<ST>();
                    const int sb = has_b ? r2.slot : sa;
                    uint64_t da, db;
                    mbar_wait(&full[sa], r.phase);
                    const Scales x0 = scales(sa, tn);
                    descs(sa, &da, &db);
                    wgmma_k128<BN>(p0, da, db);
                    if (has_b) mbar_wait(&full[sb], r2.phase);
                    const Scales x1 = scales(sb, tn);
                    descs(sb, &da, &db);
                    wgmma_k128<BN>(p1, da, db);
                    wg_wait<1>();
                    if (!LATE_RELEASE && has_b) release(sa); // (else the spare group still reads it)
                    promote(acc, p0, x0, tn);
                    wg_wait<0>();
                    if (LATE_RELEASE && has_b) release(sa);
                    if constexpr (!LATE_RELEASE) release(sb);
                    if (has_b) promote(acc, p1, x1, tn);
                    if constexpr (LATE_RELEASE) release(sb);
                    r = r2;
                    if (has_b) r.next<ST>();
                }
                epilogue<BN>(e, acc, row0, tn * BN + 2 * q);
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

// The four tensor maps of a launch.
struct FbMaps {
    CUtensorMap a, b, sa, sb;
};

template <int NC, bool SBCOL, int CL, int PIPE, int BN>
cudaError_t launch(const FbMaps &m, const FbArgs &p, const Epi &e, cudaStream_t st) {
    using C = FbCfg<NC, SBCOL, CL, PIPE, BN>;
    auto kern = fp8block_kernel<NC, SBCOL, CL, PIPE, BN>;
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
    cudaError_t err = cudaLaunchKernelEx(&cfg, kern, m.a, m.b, m.sa, m.sb, p, e);
    return err != cudaSuccess ? err : cudaGetLastError();
}

template <int NC, int CL, int PIPE = 1, int BN = 128>
cudaError_t launch_sb(const FbMaps &m, const FbArgs &p, const Epi &e, bool sbcol, cudaStream_t st) {
    return sbcol ? launch<NC, true, CL, PIPE, BN>(m, p, e, st) : launch<NC, false, CL, PIPE, BN>(m, p, e, st);
}

} // namespace

extern "C" int dw_gemm_fp8block_sm90_launch(const dw_fp8block_sm90_args *p, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    const int v = p->variant; // the instantiated combinations (gemm_cuda.h)
    if (p->k % FB_BK || p->m <= 0 || p->n <= 0 || p->k <= 0 || v < 0 || v > 6) return (int)cudaErrorInvalidValue;
    // 0-4: bit 0 three warpgroups, bit 1 clusters, 4 pairs; 5, 6: 192-column tiles (6 with clusters)
    const bool wide = v >= 5;
    const int nc = !wide && (v & 1) ? 3 : 2, bm = 64 * nc, cl = v == 6 || (!wide && (v & 2)) ? 2 : 1, bn = wide ? 192 : 128;
    const bool sbcol = !p->b_2d;
    // K-block-major copies of the scales, one row per K tile, for TMA: A's per row [kb][lda]
    // (128x128 blocks expanded to their rows), B's per column [kb][ldb] or per 128-column block
    // [kb][ldb]; rows padded with 0 to a multiple of 4 (16-byte TMA strides)
    const int64_t kb = p->k / FB_BK, nblk = (p->n + 127) / 128;
    const int64_t lda = (p->m + 3) / 4 * 4, ldb = ((sbcol ? p->n : nblk) + 3) / 4 * 4;
    float *sat = nullptr;
    cudaError_t err = cudaMallocAsync((void **)&sat, (size_t)(kb * (lda + ldb)) * sizeof(float), st);
    if (err != cudaSuccess) return (int)err;
    float *sbt = sat + kb * lda;
    if ((err = (cudaError_t)dw_gemm_cuda_transpose_scales_rows(p->sa, p->m, p->a_2d ? 7 : 0, kb, lda, sat, st)) ==
        cudaSuccess)
        err = (cudaError_t)dw_gemm_cuda_transpose_scales_rows(p->sb, sbcol ? p->n : nblk, 0, kb, ldb, sbt, st);
    FbMaps m;
    const bool ok =
        err == cudaSuccess &&
        dw_make_map_2d(&m.a, p->a, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p->m, p->k, p->k, FB_BK, (uint32_t)bm,
                       CU_TENSOR_MAP_SWIZZLE_128B) &&
        dw_make_map_2d(&m.b, p->b, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p->n, p->k, p->k, FB_BK, (uint32_t)(bn / cl),
                       CU_TENSOR_MAP_SWIZZLE_128B) &&
        dw_make_map_2d(&m.sa, sat, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, kb, p->m, lda, (uint32_t)bm, 1,
                       CU_TENSOR_MAP_SWIZZLE_NONE) &&
        dw_make_map_2d(&m.sb, sbt, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, kb, sbcol ? p->n : nblk, ldb,
                       (uint32_t)fb_sb_box(sbcol, bn), 1,
                       CU_TENSOR_MAP_SWIZZLE_NONE);
    if (!ok) {
        cudaFreeAsync(sat, st);
        return (int)(err != cudaSuccess ? err : cudaErrorInvalidValue);
    }
    const FbArgs fa{kb, (p->m + bm - 1) / bm, (p->n + bn - 1) / bn};
    const Epi e = make_epi(p->epi, p->m, p->n);
    switch (v) {
    case 0: err = launch_sb<2, 1>(m, fa, e, sbcol, st); break;
    case 1: err = launch_sb<3, 1>(m, fa, e, sbcol, st); break;
    case 2: err = launch_sb<2, 2>(m, fa, e, sbcol, st); break;
    case 3: err = launch_sb<3, 2>(m, fa, e, sbcol, st); break;
    case 4: err = launch_sb<2, 1, 2>(m, fa, e, sbcol, st); break;
    case 5: err = launch_sb<2, 1, 1, 192>(m, fa, e, sbcol, st); break;
    default: err = launch_sb<2, 2, 1, 192>(m, fa, e, sbcol, st); break; // 6
    }
    const cudaError_t ferr = cudaFreeAsync(sat, st);
    return (int)(err != cudaSuccess ? err : ferr);
}
