// moe_gemm_fp8_sm90.cu — the fp8_block grouped expert GEMM for Hopper (sm_90a): fprop, dgrad and
// wgrad of the MoE linear layer on E4M3 codes with DeepSeek-V3's block scales (1x128 along the
// rows of the activation, 128x128 per expert for the weight; wgrad: 1x128 along each expert's rows
// of dy^T and x^T), FP32 accumulation. The technique of the dense fp8block_sm90.cu: per 128 of
// the reduction, the 4 m64n128k32 wgmmas of a warpgroup sum into one FP32 partial in the tensor
// cores, then the partial is promoted once, acc += partial * (sa * sb), in FP32 registers. The
// grouped part is moe_gemm_sm90.cu's: a persistent, warp-specialised CTA (warpgroup 0 the TMA
// producer, two consumer warpgroups of 64 rows), 128 x 128 tiles over each expert's rows found
// from the device's offsets (no counts come to the host); rows a tile reads past its expert's
// group are computed and not stored. Both operands are K-major (FP8 wgmma is TN only), so dgrad
// reads W^T's quantised copy, and wgrad the transposed copies of dy and x whose expert groups
// start at multiples of 128 (grouped_fp8.h; moe_gemm_fp8_quant.cu makes them): its tiles are
// (expert, 128 rows of dW_e, 128 columns), its K loop the expert's padded blocks (the same prefix
// of the experts' 128-row tile counts as fprop's row tiles), each partial promoted with its row's
// and its column's scale, and dW added into (every element one CTA's: deterministic; or, with
// overwrite, stored: zeros for experts without rows — compiled only, never run on a GPU). Passed
// tests/gpu/test_grouped_fp8.c on an H100 (fprop, dgrad, wgrad); the registry offers it by default
// (src/gemm/grouped_fp8.c), DW_MOE_FP8=0 keeps the experts' grouped GEMMs BF16.
// fprop and dgrad (fprop_variant): with 128-column tiles they take the K blocks in pairs with two
// partials (the dense kernel's PIPE = 2): block kb+1's wgmmas run on the tensor cores while block
// kb's partial is promoted, in the same order and FP32 operations as one partial at a time
// (DW_MOE_FP8_PIPE=1 keeps that path for comparison); on an H100 (bench/RESULTS.md, session 22:
// three alternating rounds) the pairs take 2-5% off the kernel's time on seven of the presets'
// eight shapes (the eighth even). Where N pads little they take 192-column tiles instead
// (m64n192k32, the dense kernel's n192 promotion across two weight blocks; one partial). Every
// variant gives the same bits. A BF16 output leaves through TMA (moe_store_sm90.cuh, dw_moe_store_tma)
// in whole 64-row blocks of a group, the register epilogue taking the block cut by the group's end.
// wgrad keeps 128 x 128 tiles and takes its K blocks in pairs too, reading a block's 32 column scales
// from the slot during the promotion (in registers they left no room for a second partial; the slot
// is released after its promotion). The scales come through shared memory: the producer's second
// warp copies each K block's (A's 128 rows', B's block scalar or wgrad's 128 columns') into the
// block's ring slot by cp.async, completing on the slot's full barrier beside the TMA tiles; the
// consumers' global scale loads and their address arithmetic had stalled the K loop (Nsight
// Compute, bench/RESULTS.md session 32).
#include <cuda_bf16.h>
#include <string.h>

#include "core/env.h"
#include "gemm/sm90_common.cuh"
#include "kernels/cuda/moe_gemm.cuh"
#include "kernels/cuda/moe_gemm_fp8.h"
#include "kernels/cuda/moe_gemm_tc.h"
#include "kernels/cuda/moe_store_sm90.cuh"

namespace {

constexpr int MF_BM = 128, MF_BN = 128, MF_BK = 128; // BK: 128 E4M3 = one swizzle line = one scale block
constexpr int MF_THREADS = 384;
constexpr int MF_TILE = 128 * 128; // bytes of an A tile (and of a 128-column B tile)
constexpr int MF_MAX_E = 1024;     // offsets kept in shared memory
constexpr int MF_PROD_REGS = 56, MF_CONS_REGS = 224; // the producer: the TMA thread and the scale warp (40 spilled it)
// Tiles of 128 x BN: BN 128 (wgrad always), or 192 for fprop/dgrad where N pads little
// (fprop_variant: a sixth fewer operand bytes per FLOP from L2 — Nsight Compute had the 128-column
// kernel at 73% of the L2's throughput with the tensor pipe at 46%, bench/RESULTS.md session 22 —
// and 96 + 96 accumulator registers, so one partial). SB (fprop, dgrad with a BF16 output): the
// output through TMA (moe_store_sm90.cuh), SB boxes of 64 x 64 staged per consumer warpgroup (BN /
// 64: the whole tile's); 5 pipeline slots, 4 where 192-column tiles stage their 3 boxes.
// SC: a slot's scales, staged by the producer's second warp (MF_SC floats: A's 128 rows' at [0, 128);
// B's at 128: the 128 columns' (wgrad), or the tile's weight-block scalar (and at 129 the second
// one of a 192-column tile).
constexpr int MF_SC = 256;
template <int BN, int SB = 0> struct MfCfg {
    static constexpr int B_BYTES = BN * MF_BK, STAGES = BN == 192 && SB == 3 ? 4 : 5;
    static constexpr int OUT_BYTES = 2 * SB * DW_MOE_STORE_BOX; // [2 warpgroups][SB boxes]
    static constexpr int SMEM = STAGES * (MF_TILE + B_BYTES + MF_SC * 4) + OUT_BYTES + 2 * STAGES * 8 +
                                2 * (MF_MAX_E + 1) * 4 + 1024;
    static_assert(BN == 128 || BN == 192, "128- or 192-column tiles");
    static_assert(SMEM <= 227 * 1024, "shared memory over the sm_90 limit");
};
static_assert(128 * MF_PROD_REGS + 256 * MF_CONS_REGS <= MF_THREADS * (65536 / MF_THREADS / 8 * 8),
              "setmaxnreg would ask for more registers than the CTA holds");

struct MfArgs {
    const int32_t *off;
    const float *sa, *sb;
    void *out;
    int64_t R, E, N, L, LB, tiles_n; // LB = L / 128
    int64_t M, tiles_m;              // wgrad: dW's rows per expert and their 128-row tiles
    int out_f32;
    int overwrite;                   // wgrad: store dW_e instead of adding into it (no rows: zeros)
};

#ifdef DW_SM90_BODY
// Work unit u: expert e, tile column tn, first row row0 (of A: the group's, or wgrad's row of
// dW_e) and the rows of the group from there; the K blocks kb0 .. kb0 + nkb of the reduction.
struct MfTile {
    int64_t e, tn, row0, rows, kb0, nkb;
};
template <bool WG>
__device__ __forceinline__ MfTile mf_tile(const MfArgs &p, const int32_t *s_off, const int32_t *s_mt, int64_t u) {
    MfTile t;
    if constexpr (WG) { // expert outer, then dW_e's row tiles, then its column tiles
        const int64_t per = p.tiles_m * p.tiles_n, v = u % per;
        t.e = u / per, t.tn = v % p.tiles_n, t.row0 = v / p.tiles_n * MF_BM, t.rows = MF_BM;
        t.kb0 = s_mt[t.e], t.nkb = s_mt[t.e + 1] - s_mt[t.e]; // the expert's padded blocks
        return t;
    }
    t.kb0 = 0, t.nkb = p.LB;
    const int64_t gm = u / p.tiles_n; // row tiles outer: the CTAs running at once share A's tiles
    t.tn = u % p.tiles_n;
    const int64_t e = dw_moe_expert_of_tile(s_mt, p.E, gm);
    t.e = e;
    t.row0 = s_off[e] + (gm - s_mt[e]) * MF_BM;
    t.rows = s_off[e + 1] - t.row0;
    return t;
}
#endif // DW_SM90_BODY

// PIPE: partials per consumer (2: K blocks in pairs; fprop and dgrad only); BN: the tile's columns;
// SB: boxes of the BF16 output's TMA staging (0: the register epilogue), tC its (R, N) map.
template <bool WG, int PIPE, int BN, int SB>
__global__ void __launch_bounds__(MF_THREADS, 1)
    moe_gemm_fp8_sm90_kernel(const __grid_constant__ CUtensorMap tA, const __grid_constant__ CUtensorMap tB,
                             const __grid_constant__ CUtensorMap tC, MfArgs p) {
#ifdef DW_SM90_BODY
    static_assert(PIPE == 1 || (PIPE == 2 && BN == 128), "two partials: 128 columns");
    static_assert(BN == 128 || !WG, "wgrad's tiles are 128 x 128");
    static_assert(SB == 0 || !WG, "the BF16 store through TMA is fprop's and dgrad's");
    using C = MfCfg<BN, SB>;
    constexpr int MF_STAGES = C::STAGES;
    constexpr int NACC = BN / 2; // accumulators a thread
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_align_1024(smem_raw);
    uint8_t *sA = smem;                       // [ST][128 rows][128 B], 128B swizzle
    uint8_t *sB = sA + MF_STAGES * MF_TILE;   // [ST][BN rows][128 B]
    uint8_t *sOut = sB + MF_STAGES * C::B_BYTES; // SB: [2 warpgroups][SB boxes], 1024-aligned
    float *sSc = (float *)(sOut + C::OUT_BYTES);  // [ST][MF_SC]
    uint64_t *full = (uint64_t *)(sSc + MF_STAGES * MF_SC), *empty = full + MF_STAGES;
    int32_t *s_off = (int32_t *)(empty + MF_STAGES), *s_mt = s_off + MF_MAX_E + 1;
    const int tid = threadIdx.x, wg = warpgroup_index();
    for (int64_t e = tid; e <= p.E; e += MF_THREADS) s_off[e] = p.off[e];
    __syncthreads();
    if (tid == 0) { // prefix of row tiles per expert; the ring's barriers
        s_mt[0] = 0;
        for (int64_t e = 0; e < p.E; e++) s_mt[e + 1] = s_mt[e] + (s_off[e + 1] - s_off[e] + MF_BM - 1) / MF_BM;
        // full: the TMA thread's arrival with the tiles' bytes and the scale warp's 32 lanes' copies;
        // empty: the 8 consumer warps
        for (int s = 0; s < MF_STAGES; s++) mbar_init(&full[s], 1 + 32), mbar_init(&empty[s], 8);
        mbar_init_fence();
    }
    __syncthreads();
    const int64_t units = WG ? p.E * p.tiles_m * p.tiles_n : (int64_t)s_mt[p.E] * p.tiles_n;

    if (wg == 0) { // producer: one thread issues both tiles of each K block
        regs_dec<MF_PROD_REGS>();
        if (tid == 0) {
            Ring r;
            bool first_round = true;
            for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
                const MfTile t = mf_tile<WG>(p, s_off, s_mt, u);
                const int64_t brow = WG ? t.tn * MF_BN : t.e * p.N + t.tn * BN; // wgrad: x^T is every expert's
                for (int64_t kb = t.kb0; kb < t.kb0 + t.nkb; kb++) {
                    const int s = r.slot;
                    if (!first_round) mbar_wait<true>(&empty[s], r.phase ^ 1);
                    mbar_expect_tx(&full[s], MF_TILE + C::B_BYTES);
                    tma_load_2d(sA + s * MF_TILE, &tA, &full[s], (int)(kb * MF_BK), (int)t.row0);
                    tma_load_2d(sB + s * C::B_BYTES, &tB, &full[s], (int)(kb * MF_BK), (int)brow);
                    r.next<MF_STAGES>();
                    if (r.slot == 0) first_round = false;
                }
            }
        } else if (tid / 32 == 1) { // the scale warp: each K block's scales into its slot, by cp.async
            const int lane = tid % 32;
            Ring r;
            bool first_round = true;
            for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
                const MfTile t = mf_tile<WG>(p, s_off, s_mt, u);
                // this lane's rows of A, lane + 32 i (fprop/dgrad: a row past the tensor reads the
                // last one, its results not stored); B: wgrad's columns likewise, else the block
                // scalars (a 192-column tile's second past the expert's last block: the last one).
                // 32-bit rows and blocks (the launch checks R, M, N, L < 2^31): the producer's 40
                // registers spilled with 64-bit addresses.
                int ra[4];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    ra[i] = (int)(WG ? t.row0 + lane + 32 * i : min(t.row0 + lane + 32 * i, p.R - 1));
                const int kend = (int)(t.kb0 + t.nkb);
                const float *gcol = p.sb + (t.tn * MF_BN + lane) * p.LB; // wgrad's columns
                const int64_t nb = p.N / MF_BN, b0 = t.tn * BN / MF_BN, b1 = min(b0 + 1, nb - 1);
                const float *gblk = p.sb + (t.e * nb + (lane == 1 ? b1 : b0)) * p.LB;
                for (int kb = (int)t.kb0; kb < kend; kb++) {
                    const int s = r.slot;
                    if (!first_round) mbar_wait<true>(&empty[s], r.phase ^ 1);
                    float *sc = sSc + s * MF_SC;
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        cp_async_4(sc + lane + 32 * i, p.sa + (int64_t)ra[i] * p.LB + kb);
                        if constexpr (WG) cp_async_4(sc + 128 + lane + 32 * i, gcol + 32 * i * p.LB + kb);
                    }
                    if constexpr (!WG)
                        if (lane < (BN == 192 ? 2 : 1)) cp_async_4(sc + 128 + lane, gblk + kb);
                    cp_async_arrive(&full[s]);
                    r.next<MF_STAGES>();
                    if (r.slot == 0) first_round = false;
                }
            }
        }
        return;
    }
    // consumers: warpgroup wg owns rows [64 (wg-1), +64) of the tile
    regs_inc<MF_CONS_REGS>();
    const int cw = wg - 1, lt = tid % 128, warp = lt / 32, lane = lt % 32;
    const int rl = 64 * cw + 16 * warp + lane / 4, q = lane % 4; // rows rl, rl + 8; cols 8 j + 2 q (+1)
    const uint64_t da0 = make_desc(sA + cw * 64 * 128), db0 = make_desc(sB);
    // the slot's 4 wgmmas of 128 K into part (the first overwrites it), as one commit group
    auto issue = [&](float *part, int s) {
        wgmma_k128<BN>(part, da0 + (uint64_t)(s * (MF_TILE >> 4)), db0 + (uint64_t)(s * (C::B_BYTES >> 4)));
    };
    auto release = [&](int s) { // the slot is read: the producer may refill it
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
    };
    // fprop/dgrad, 128 columns: acc += part * the rows' scales (s0: row rl, s1: rl + 8), one weight
    // block across the tile (sm90_common.cuh's promote_blk, as the dense kernel's)
    auto promote_rows = [&](float *acc, float *part, float s0, float s1) {
        promote_blk<128>(acc, part, make_float2(s0, s1), make_float2(s0, s1), false);
    };
    // wgrad: acc += part * (row scale * column scale), the products in FP32 as the reference forms
    // them; the slot's scales read here (pairs: the slot is released after its promotion)
    auto promote_cols = [&](float *acc, float *part, const float *sc) {
        reg_fence(part);
        const float s0 = sc[rl], s1 = sc[rl + 8];
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const float2 c = *reinterpret_cast<const float2 *>(sc + 128 + 8 * j + 2 * q); // columns 8 j + 2 q (+1)
            acc[4 * j] = fmaf(part[4 * j], s0 * c.x, acc[4 * j]);
            acc[4 * j + 1] = fmaf(part[4 * j + 1], s0 * c.y, acc[4 * j + 1]);
            acc[4 * j + 2] = fmaf(part[4 * j + 2], s1 * c.x, acc[4 * j + 2]);
            acc[4 * j + 3] = fmaf(part[4 * j + 3], s1 * c.y, acc[4 * j + 3]);
        }
    };
    float acc[NACC], part[NACC], part2[PIPE == 2 ? 64 : 1];
#pragma unroll
    for (int i = 0; i < NACC; i++) part[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < (PIPE == 2 ? 64 : 1); i++) part2[i] = 0.0f;
    Ring r;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        const MfTile t = mf_tile<WG>(p, s_off, s_mt, u);
        if (WG && t.nkb == 0 && !p.overwrite) continue; // wgrad: an expert without rows adds nothing (overwrite:
                                                        // its zeros stored, the K loop empty)
#pragma unroll
        for (int i = 0; i < NACC; i++) acc[i] = 0.0f;
        // the slot's scales (sSc, staged by the scale warp): this thread's two rows' 1x128 scales
        // and the tile's 128x128 weight block(s); wgrad: its two rows of dy^T and its 32 columns'
        // (rows of x^T), columns 8 j + 2 q + v. Read before the slot is released.
        if constexpr (BN == 192) {
            // the tile's columns span two 128x128 weight blocks: lo from column 0, hi from 128 (an
            // even tile) or 64 (an odd one)
            for (int64_t kb = t.kb0; kb < t.kb0 + t.nkb; kb++) {
                const int s = r.slot;
                const float *sc = sSc + s * MF_SC;
                mbar_wait(&full[s], r.phase);
                const float a0 = sc[rl], a1 = sc[rl + 8], lo = sc[128], hi = sc[129];
                issue(part, s);
                wg_wait<0>();
                release(s);
                promote_blk<BN>(acc, part, make_float2(a0 * lo, a1 * lo), make_float2(a0 * hi, a1 * hi), t.tn & 1);
                r.next<MF_STAGES>();
            }
        } else if constexpr (PIPE == 2) {
            // Pairs: no wgmma group stays in flight across an iteration (ptxas would serialise
            // them); with an odd count the last pair's second group re-reads the first's slot into
            // the spare partial, which is not promoted. fprop/dgrad read the rows' scale products
            // before the wgmmas and release a slot at its wait; wgrad reads its slot's scales during
            // the promotion and releases the slot after it. The same FP32 operations in the same
            // order as one block at a time (DW_MOE_FP8_PIPE=1, DW_MOE_FP8_WGRAD_PIPE=1).
            const int64_t kend = t.kb0 + t.nkb;
            for (int64_t kb = t.kb0; kb < kend; kb += 2) {
                const bool has_b = kb + 1 < kend;
                const int sa = r.slot;
                Ring r2 = r;
                r2.next<MF_STAGES>();
                const int sb2 = has_b ? r2.slot : sa;
                const float *sc0 = sSc + sa * MF_SC, *sc1 = sSc + sb2 * MF_SC;
                float s00 = 0.0f, s10 = 0.0f, s01 = 0.0f, s11 = 0.0f;
                mbar_wait(&full[sa], r.phase);
                if constexpr (!WG) s00 = sc0[rl] * sc0[128], s10 = sc0[rl + 8] * sc0[128];
                issue(part, sa);
                if (has_b) mbar_wait(&full[sb2], r2.phase);
                if constexpr (!WG) s01 = sc1[rl] * sc1[128], s11 = sc1[rl + 8] * sc1[128];
                issue(part2, sb2);
                wg_wait<1>();
                if constexpr (WG) promote_cols(acc, part, sc0);
                if (has_b) release(sa); // (else the spare group still reads it)
                if constexpr (!WG) promote_rows(acc, part, s00, s10);
                wg_wait<0>();
                if constexpr (WG) {
                    if (has_b) promote_cols(acc, part2, sc1);
                    release(sb2);
                } else {
                    release(sb2);
                    if (has_b) promote_rows(acc, part2, s01, s11);
                }
                r = r2;
                if (has_b) r.next<MF_STAGES>();
            }
        } else {
            for (int64_t kb = t.kb0; kb < t.kb0 + t.nkb; kb++) {
                const int s = r.slot;
                const float *sc = sSc + s * MF_SC;
                float s0, s1, cs[32]; // fprop/dgrad: the rows' products with the block's; wgrad: the columns'
                mbar_wait(&full[s], r.phase);
                if constexpr (WG) {
                    s0 = sc[rl], s1 = sc[rl + 8];
#pragma unroll
                    for (int j = 0; j < 16; j++) cs[2 * j] = sc[128 + 8 * j + 2 * q], cs[2 * j + 1] = sc[129 + 8 * j + 2 * q];
                } else {
                    s0 = sc[rl] * sc[128], s1 = sc[rl + 8] * sc[128];
                }
                issue(part, s);
                wg_wait<0>();
                reg_fence(part);
                release(s);
                if constexpr (WG) {
#pragma unroll
                    for (int j = 0; j < 16; j++) { // the scale products in FP32, as the reference forms them
                        acc[4 * j] = fmaf(part[4 * j], s0 * cs[2 * j], acc[4 * j]);
                        acc[4 * j + 1] = fmaf(part[4 * j + 1], s0 * cs[2 * j + 1], acc[4 * j + 1]);
                        acc[4 * j + 2] = fmaf(part[4 * j + 2], s1 * cs[2 * j], acc[4 * j + 2]);
                        acc[4 * j + 3] = fmaf(part[4 * j + 3], s1 * cs[2 * j + 1], acc[4 * j + 3]);
                    }
                } else {
                    promote_rows(acc, part, s0, s1);
                }
                r.next<MF_STAGES>();
            }
        }
        if constexpr (SB > 0) {
            if (!p.out_f32 && t.rows >= 64 * (cw + 1)) { // the warpgroup's 64 rows all in the group
                moe_store_bf16_tma<BN, SB>(acc, sOut + cw * SB * DW_MOE_STORE_BOX, &tC, t.row0 + 64 * cw, t.tn * BN,
                                           p.N, cw, lt);
                continue;
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t rr = rl + 8 * h;
            if (rr >= t.rows) continue; // past the expert's group (or the tensor)
            const int64_t row = t.row0 + rr;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                const int64_t col = t.tn * BN + 8 * j + 2 * q; // N is even: col + 1 < N
                if (BN != MF_BN && col >= p.N) continue;        // a 192-column tile past N
                const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
                if constexpr (WG) { // dW_e (M, N) FP32, added into (overwrite: into 0); every element one CTA's
                    float2 *d = reinterpret_cast<float2 *>((float *)p.out + (t.e * p.M + row) * p.N + col);
                    float2 o = p.overwrite ? make_float2(0.0f, 0.0f) : *d;
                    o.x += v0, o.y += v1;
                    *d = o;
                } else if (p.out_f32) *reinterpret_cast<float2 *>((float *)p.out + row * p.N + col) = make_float2(v0, v1);
                else
                    *reinterpret_cast<__nv_bfloat162 *>((__nv_bfloat16 *)p.out + row * p.N + col) =
                        __floats2bfloat162_rn(v0, v1);
            }
        }
    }
    if constexpr (SB > 0)
        if (lt == 0) bulk_wait_all(); // the staging must outlive the copies that read it
#endif
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <bool WG, int PIPE, int BN, int SB = 0>
cudaError_t launch(int64_t grid, const CUtensorMap &tA, const CUtensorMap &tB, const CUtensorMap &tC, const MfArgs &p,
                   cudaStream_t stream) {
    constexpr int smem = MfCfg<BN, SB>::SMEM;
    static bool attr_set = false; // the shared memory beyond 48 KiB, asked for once per kernel
    if (!attr_set) {
        const cudaError_t err = cudaFuncSetAttribute(moe_gemm_fp8_sm90_kernel<WG, PIPE, BN, SB>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (err != cudaSuccess) return err;
        attr_set = true;
    }
    moe_gemm_fp8_sm90_kernel<WG, PIPE, BN, SB><<<(unsigned)grid, MF_THREADS, smem, stream>>>(tA, tB, tC, p);
    return cudaGetLastError();
}

// fprop/dgrad's kernel for N output columns: 192-column tiles (192) where their padding past N
// is at most 4% of N, else 128-column tiles with the K blocks in pairs (2). On an H100 (bench/
// RESULTS.md, session 22) the 192 tiles took 2.6-5% off N = 2048, up to 1% off N = 5632, and
// added 3.5-3.9% at N = 1024 (12.5% padding). DW_MOE_FP8_TILE=128 or =192 picks one;
// DW_MOE_FP8_PIPE=1 takes 128 columns one K block at a time (1). All give the same bits.
int fprop_variant(int64_t N) {
    const char *t = dw_env("DW_MOE_FP8_TILE"), *v = dw_env("DW_MOE_FP8_PIPE");
    if (v && !strcmp(v, "1")) return 1;
    if (t && !strcmp(t, "128")) return 2;
    if (t && !strcmp(t, "192")) return 192;
    return ((N + 191) / 192 * 192 - N) * 25 <= N ? 192 : 2;
}

// wgrad's kernel: K blocks in pairs (2; its column scales read from the slot during the promotion,
// which leaves the registers for a second partial), or one at a time (DW_MOE_FP8_WGRAD_PIPE=1: 1).
// The same bits.
int wgrad_variant(void) {
    const char *v = dw_env("DW_MOE_FP8_WGRAD_PIPE");
    return v && !strcmp(v, "1") ? 1 : 2;
}

// fprop's and dgrad's BF16 output through TMA (moe_store_sm90.cuh), every box of the tile staged in
// one round (192-column tiles then keep 4 ring slots instead of 5); DW_MOE_STORE=reg keeps the
// register epilogue (an A/B knob; DW_MOE_FP8_PIPE=1's path always does). On an H100 (bench/
// RESULTS.md, session 26 call A) TMA took 14-15% off moe-e8's fprop and down dgrad, 9-18% off
// moe-e64's four, 0-3% off the other two; one box at a time (the BF16 kernel's way) 0-4 points less.

} // namespace

extern "C" int dw_moe_gemm_fp8_sm90(const dw_moe_fp8_args *a, void *stream) {
    const int64_t R = a->R, E = a->E, N = a->N, L = a->L;
    int dev = 0, sms = 0;
    if (dw_moe_gemm_device_sm() != 90 || cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return (int)cudaErrorNotSupported;
    const bool wg = a->wgrad != 0;
    const int64_t M = wg ? a->M : 0, arows = wg ? M : R, brows = wg ? N : E * N; // rows of A's and B's maps
    if (E < 1 || E > MF_MAX_E || N % MF_BN || L % MF_BK || N < MF_BN || L < MF_BK || !aligned16(a->a) ||
        !aligned16(a->b) || ((uintptr_t)a->out & 7) || R >= (int64_t)1 << 31 || brows >= (int64_t)1 << 31 ||
        L >= (int64_t)1 << 31 || (wg && (M % MF_BM || M < MF_BM || M >= (int64_t)1 << 31 || !a->out_f32)))
        return (int)cudaErrorNotSupported;
    if (R == 0) // nothing to multiply; an overwritten dW is zeros
        return (int)(wg && a->overwrite ? cudaMemsetAsync(a->out, 0, (size_t)(E * M * N) * sizeof(float),
                                                          (cudaStream_t)stream)
                                        : cudaSuccess);
    const int variant = wg ? wgrad_variant() : fprop_variant(N);
    const int64_t bn = variant == 192 ? 192 : MF_BN; // the B tile's rows, the output tile's columns
    CUtensorMap tA, tB;
    const CUtensorMapDataType u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
    if (!dw_make_map_2d(&tA, a->a, u8, 1, arows, L, L, MF_BK, MF_BM, CU_TENSOR_MAP_SWIZZLE_128B) ||
        !dw_make_map_2d(&tB, a->b, u8, 1, brows, L, L, MF_BK, bn, CU_TENSOR_MAP_SWIZZLE_128B))
        return (int)cudaErrorNotSupported;
    MfArgs p = {};
    p.off = a->offsets, p.sa = a->sa, p.sb = a->sb, p.out = a->out, p.out_f32 = a->out_f32;
    p.overwrite = wg && a->overwrite;
    p.R = R, p.E = E, p.N = N, p.L = L, p.LB = L / MF_BK, p.tiles_n = (N + bn - 1) / bn, p.M = M, p.tiles_m = M / MF_BM;
    // at most: row tiles of every group (fprop, dgrad); every expert's dW tiles (wgrad)
    const int64_t units = wg ? E * p.tiles_m * p.tiles_n : ((R + MF_BM - 1) / MF_BM + E) * p.tiles_n;
    const int64_t grid = units < sms ? units : sms;
    const cudaStream_t st = (cudaStream_t)stream;
    // the BF16 output through TMA (dw_moe_store_tma), its map of (R, N) in 64 x 64 boxes
    const bool ts = !wg && !a->out_f32 && aligned16(a->out) && dw_moe_store_tma();
    CUtensorMap tC = tA;
    if (ts && !dw_make_map_2d(&tC, a->out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, R, N, N, 64, 64,
                              CU_TENSOR_MAP_SWIZZLE_128B))
        return (int)cudaErrorNotSupported;
    return (int)(wg ? (variant == 2 ? launch<true, 2, 128>(grid, tA, tB, tC, p, st)
                          : launch<true, 1, 128>(grid, tA, tB, tC, p, st))
                 : variant == 192 ? (ts ? launch<false, 1, 192, 3>(grid, tA, tB, tC, p, st)
                                        : launch<false, 1, 192>(grid, tA, tB, tC, p, st))
                 : variant == 2 ? (ts ? launch<false, 2, 128, 2>(grid, tA, tB, tC, p, st)
                                      : launch<false, 2, 128>(grid, tA, tB, tC, p, st))
                                : launch<false, 1, 128>(grid, tA, tB, tC, p, st));
}
