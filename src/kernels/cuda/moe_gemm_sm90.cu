// moe_gemm_sm90.cu — the BF16 grouped expert GEMM for Hopper (sm_90a): TMA loads into a ring of
// shared-memory slots, wgmma m64n128k16 (or m64n256k16) with FP32 accumulation, one persistent
// warp-specialised kernel for the three passes of moe_gemm.cuh, each computed as
// C[i,j] = sum_l A(i,l) B(j,l) from the tensors as they lie, with no transposed copies: an operand
// whose l runs along memory is loaded K-major (128 x 64 boxes, l contiguous), one whose i or j runs
// along memory MN-major (64 x 64 boxes, "panels" of 64 i or j values by 64 l lines, read by wgmma
// with its transpose bit):
//   fprop  y_e = x_e W_e^T   A = x (R,K) K-major, rows from off[e];  B = W (E*M, K) K-major
//   dgrad  dx_e = dy_e W_e   A = dy (R,M) K-major;                   B = W (E*M, K) MN-major
//   wgrad  dW_e += dy_e^T x_e A = dy (R,M) MN-major, lines from off[e]; B = x (R,K) MN-major
// Tiles of fprop/dgrad cover each expert's rows in 128-row blocks (expert, block) found from the
// device's offsets: no counts come to the host; rows a tile reads past its expert's group are
// computed but never stored. wgrad reduces over an expert's rows: the lines of its last K tile past
// the group (the next expert's rows) are zeroed in A's slot before the wgmmas. Reduction columns
// past a tensor's width load as zeros (TMA's bounds). Every output element is one CTA's (wgrad adds
// into dW): deterministic.
// CTA: warpgroup 0 produces (one thread issues the TMA loads into STAGES slots guarded by full/empty
// mbarriers), warpgroups 1 and 2 consume, each 64 rows of the 128 x BN tile (MwCfg).
// wgrad's epilogue (OUT_TMA): each consumer warpgroup writes its 64 rows of FP32 (128 columns at a
// time) to its own shared staging and one thread hands them to TMA, which adds them into dW in L2
// (cp.reduce.async.bulk .add; a plain store when the caller says dW holds nothing yet) while the
// warpgroup goes on to the next tile's wgmmas; the staging is written again only once the copies
// have read it. The default, with 256-column tiles (DW_MOE_WGRAD=tma: 128 columns; =old: the register
// epilogue, which reads, adds and writes dW while the wgmmas idle). On an H100 (session 19, bench/
// RESULTS.md) the moe-e8 wgrad takes 1.08 ms with it against the register epilogue's 1.54 ms, moe-e64's
// 0.70 against 0.94; tests/gpu/test_ops_cuda_moe_wgrad.c passes all three.
// fprop's and dgrad's BF16 output goes out through TMA too (moe_store_sm90.cuh, dw_moe_store_tma): each
// warpgroup's whole 64-row blocks of a group, staged in shared memory, stored while its next tile's
// wgmmas run; a block cut by the group's end keeps the register epilogue.
// Asked (dw_moe_gemm_args.sumsq, with overwrite), the TMA epilogue also writes the sum of squares of
// each 64 x 128 block it stores, from its registers: the gradient norm's share (compile/
// wgrad_sumsq.h), so the norm need not read the experts' gradients again.
#include <cuda_bf16.h>
#include <string.h>

#include "core/env.h"
#include "core/tensor_map.cuh"
#include "core/wgmma_sm90.cuh"
#include "kernels/cuda/moe_gemm.cuh"
#include "kernels/cuda/moe_gemm_tc.h"
#include "kernels/cuda/moe_store_sm90.cuh"

namespace {

constexpr int MW_BM = 128, MW_BK = 64; // BK: 64 BF16 = one 128-byte swizzle line
static_assert(DW_MOE_SUMSQ_BM == 64 && DW_MOE_SUMSQ_BN == 128,
              "the TMA epilogue sums a consumer warpgroup's 64 rows by 128 columns");
constexpr int MW_THREADS = 384;
constexpr int MW_A_BYTES = MW_BM * MW_BK * 2;
constexpr int MW_MAX_E = 1024;                 // offsets kept in shared memory
constexpr int MW_PROD_REGS = 40, MW_CONS_REGS = 232;
static_assert(128 * MW_PROD_REGS + 256 * MW_CONS_REGS <= MW_THREADS * (65536 / MW_THREADS / 8 * 8),
              "setmaxnreg would ask for more registers than the CTA holds");

// Tiles of 128 x BN: BN 128 (64 accumulators a thread, 6 slots) or 256 (128 accumulators, 4 slots:
// half the shared-memory reads of A per FLOP), chosen per pass (dw_moe_gemm_sm90).
// OUT_TMA (wgrad): 2 x 64 x 128 FP32 of epilogue staging (a BN 256 tile goes out in two halves),
// and 4 slots (BN 128) or 3 (BN 256). SB (fprop, dgrad): the BF16 output through TMA
// (moe_store_sm90.cuh), SB boxes of 64 x 64 staged per consumer warpgroup: 1 (the one used) keeps
// the register epilogue's 6 or 4 slots; BN / 64 would leave 5 (BN 128) or 3 (BN 256).
template <int BN, bool OUT_TMA = false, int SB = 0> struct MwCfg {
    static constexpr int B_BYTES = BN * MW_BK * 2;
    static constexpr int STAGES = OUT_TMA ? (BN == 128 ? 4 : 3) : BN == 128 ? (SB > 1 ? 5 : 6) : (SB > 1 ? 3 : 4);
    static constexpr int OUT_BYTES = OUT_TMA ? 2 * 64 * 128 * 4    // [2 warpgroups][4 boxes][64 rows][128 B]
                                             : 2 * SB * DW_MOE_STORE_BOX; // [2 warpgroups][SB boxes]
    static constexpr int SMEM =
        STAGES * (MW_A_BYTES + B_BYTES) + OUT_BYTES + 2 * STAGES * 8 + 2 * (MW_MAX_E + 1) * 4 + 1024;
    static_assert(BN == 128 || BN == 256, "128- or 256-column tiles");
    static_assert(SMEM <= 227 * 1024, "shared memory over the sm_90 limit");
};

struct MwArgs {
    const int32_t *off; // (E+1) group offsets of the rows
    void *out;          // fprop/dgrad: (R, J) BF16; wgrad: dW (E, I, J) FP32, added into
    int64_t E, I, J, L; // wgrad: I = M, J = K; fprop/dgrad: J output columns, L the reduction
    int64_t M;          // rows of W per expert
    int64_t tiles_n;
    int overwrite;      // wgrad: store dW_e instead of adding into it (experts without rows: zeros)
    double *sumsq;      // OUT_TMA wgrad with overwrite, or NULL: each 64 x 128 block's sum of squares
    int64_t sq_mb, sq_kb; // its blocks along M (64 rows) and K (128 columns)
};

// The tile of work unit u: expert e, rows [row0, row0 + rows) of the output's expert block (fprop
// and dgrad: rows of the group; wgrad: rows of dW_e), n-tile tn; each operand's first i (or j) and
// first reduction line in its tensor map; K tiles and the valid lines of the last one (wgrad).
struct MwTile {
    int64_t e, tn, row0, rows, a_mn, a_l, b_mn, b_l, ktiles, last_lines;
};

#ifdef DW_SM90_BODY
constexpr int MW_GROUP_M = 16;          // raster: 16 row tiles share their B tiles in L2
constexpr int MW_PANEL = 64 * MW_BK * 2; // bytes of an MN-major panel: 64 values by 64 lines

// D[64xBN] (+)= A[64x16] . B[BNx16]^T, BF16 operands; TA/TB: A M-major / B N-major (the
// descriptors' layout), else K-major.
template <int BN, int TA, int TB>
__device__ __forceinline__ void wgmma_bf16_k16(float *d, uint64_t da, uint64_t db, int scale_d) {
    if constexpr (BN == 128)
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, %67, %68;\n}"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));
    else
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, %131, %132;\n}"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                     : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));
}

// Work unit u's tile; false when u is past the last one. s_off/s_mt: the offsets and (fprop, dgrad)
// the prefix sums of the experts' row-tile counts, in shared memory.
template <int BN, dw_moe_pass PASS>
__device__ __forceinline__ bool mw_tile(const MwArgs &p, const int32_t *s_off, const int32_t *s_mt, int64_t u,
                                        MwTile *t) {
    if constexpr (PASS == DW_MOE_WGRAD) {
        const int64_t tiles_m = (p.I + MW_BM - 1) / MW_BM, per = tiles_m * p.tiles_n;
        if (u >= p.E * per) return false;
        int64_t tm;
        t->e = u / per;
        tile_coords(u % per, tiles_m, p.tiles_n, MW_GROUP_M, &tm, &t->tn);
        const int64_t g0 = s_off[t->e], cnt = s_off[t->e + 1] - g0;
        t->row0 = tm * MW_BM, t->rows = p.I - t->row0;
        t->a_mn = t->row0, t->a_l = g0, t->b_mn = t->tn * BN, t->b_l = g0;
        t->ktiles = (cnt + MW_BK - 1) / MW_BK, t->last_lines = cnt - (t->ktiles - 1) * MW_BK;
        return true;
    }
    const int64_t tiles_m = s_mt[p.E];
    if (u >= tiles_m * p.tiles_n) return false;
    int64_t gm;
    tile_coords(u, tiles_m, p.tiles_n, MW_GROUP_M, &gm, &t->tn);
    const int64_t e = dw_moe_expert_of_tile(s_mt, p.E, gm);
    t->e = e;
    const int64_t g0 = s_off[e], mt = gm - s_mt[e];
    t->row0 = g0 + mt * MW_BM, t->rows = s_off[e + 1] - t->row0;
    t->a_mn = t->row0, t->a_l = 0;
    if constexpr (PASS == DW_MOE_FPROP) t->b_mn = e * p.M + t->tn * BN, t->b_l = 0; // W rows of e, K-major
    else t->b_mn = t->tn * BN, t->b_l = e * p.M;                                    // W lines of e, MN-major
    t->ktiles = (p.L + MW_BK - 1) / MW_BK, t->last_lines = MW_BK;
    return true;
}

// K tile kt of an operand of `rows` i (or j) values into its slot: one K-major box, or rows / 64
// MN-major panels.
template <bool MN, int ROWS>
__device__ __forceinline__ void mw_load(uint8_t *dst, const CUtensorMap *map, uint64_t *bar, int64_t mn, int64_t l) {
    if constexpr (!MN) tma_load_2d(dst, map, bar, (int)l, (int)mn);
    else
#pragma unroll
        for (int q = 0; q < ROWS / 64; q++) tma_load_2d(dst + q * MW_PANEL, map, bar, (int)(mn + 64 * q), (int)l);
}

// A shared box (1024-byte aligned, swizzled as the map says) into dW's map at (k, m, e): stored, or
// added to what dW holds (the add done by TMA in L2), in this thread's current bulk group.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap *map, int c0, int c1, int c2, const void *src) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(src))
                 : "memory");
}
__device__ __forceinline__ void tma_add_3d(const CUtensorMap *map, int c0, int c1, int c2, const void *src) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(
                     map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(src))
                 : "memory");
}

// wgrad's epilogue through TMA: warpgroup cw's 64 x BN accumulators (rows 64 cw.. of the tile), 128
// columns at a time, into its staging stg, 4 boxes of 64 rows x 32 FP32 (128 B, 128-byte swizzle:
// 16-byte chunk c of row r at chunk c ^ (r % 8), so a warp's float2 writes take the minimum two
// wavefronts), then thread 0 of the warpgroup stores or adds them into dW. Rows past M and columns
// past K are cut by the map's bounds. Called by all 128 threads of the warpgroup. With p.sumsq, each
// 128 columns' squares too (compile/wgrad_sumsq.h): a thread's 64 values in order, in double, the
// warp's tree, then thread 0 adds the four warps' in order (wsq: the warpgroup's 4 doubles); rows
// past M and columns past K hold zeros (their operands load as zeros).
template <int BN, bool SQ>
__device__ __forceinline__ void mw_epilogue_tma(const float *acc, uint8_t *stg, const CUtensorMap *map,
                                                const MwArgs &p, const MwTile &t, int cw, int lt, double *wsq) {
    const int warp = lt / 32, lane = lt % 32, q = lane % 4;
#pragma unroll
    for (int hf = 0; hf < BN / 128; hf++) { // columns [128 hf, +128) of the tile
        if (lt == 0) bulk_wait_read(); // the earlier copies have read the staging
        asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = 16 * warp + lane / 4 + 8 * h; // row within the warpgroup's 64; r % 8 = lane / 4
#pragma unroll
            for (int j = 0; j < 16; j++) { // columns 8 j + 2 q (+1): box j / 4, 16-byte chunk 2 (j % 4) + q / 2
                const int chunk = (2 * (j % 4) + q / 2) ^ (lane / 4), a = 4 * (16 * hf + j) + 2 * h;
                *reinterpret_cast<float2 *>(stg + (j / 4) * 8192 + r * 128 + chunk * 16 + (q % 2) * 8) =
                    make_float2(acc[a], acc[a + 1]);
            }
        }
        if constexpr (SQ) {
            double sq = 0.0;
#pragma unroll
            for (int i = 0; i < 64; i++) {
                const double v = acc[64 * hf + i];
                sq += v * v;
            }
#pragma unroll
            for (int o = 16; o > 0; o /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, o);
            if (lane == 0) wsq[warp] = sq;
        }
        fence_proxy_async(); // the writes, before the async proxy's reads
        asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
        const int64_t kb = (t.tn * BN + 128 * hf) / 128;
        if (SQ && lt == 0 && t.row0 + 64 * cw < p.I && kb * 128 < p.J)
            p.sumsq[(t.e * p.sq_mb + (t.row0 + 64 * cw) / 64) * p.sq_kb + kb] = ((wsq[0] + wsq[1]) + wsq[2]) + wsq[3];
        if (lt == 0 && t.row0 + 64 * cw < p.I) {
            const int m0 = (int)(t.row0 + 64 * cw), e = (int)t.e;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int64_t k0 = t.tn * BN + 128 * hf + 32 * b;
                if (k0 >= p.J) break;
                if (p.overwrite) tma_store_3d(map, (int)k0, m0, e, stg + b * 8192);
                else tma_add_3d(map, (int)k0, m0, e, stg + b * 8192);
            }
            bulk_commit();
        }
    }
}
#endif // DW_SM90_BODY

// tC: OUT_TMA's map of dW (E, M, K) FP32 in 64 x 32 boxes; with SB, the output's (R, J) BF16 map in
// 64 x 64 boxes (else unused). SQ (OUT_TMA): p.sumsq too.
template <int BN, dw_moe_pass PASS, bool OUT_TMA, bool SQ, int SB>
__global__ void __launch_bounds__(MW_THREADS, 1)
    moe_gemm_sm90_kernel(const __grid_constant__ CUtensorMap tA, const __grid_constant__ CUtensorMap tB,
                         const __grid_constant__ CUtensorMap tC, MwArgs p) {
#ifdef DW_SM90_BODY
    static_assert(!OUT_TMA || PASS == DW_MOE_WGRAD, "the TMA epilogue is wgrad's");
    static_assert(!SQ || OUT_TMA, "the sums of squares come with the TMA epilogue");
    static_assert(SB == 0 || (PASS != DW_MOE_WGRAD && !OUT_TMA), "the BF16 store through TMA is fprop's and dgrad's");
    using C = MwCfg<BN, OUT_TMA, SB>;
    constexpr int ST = C::STAGES, NACC = BN / 2; // NACC accumulators a thread
    constexpr bool AMN = PASS == DW_MOE_WGRAD, BMN = PASS != DW_MOE_FPROP;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_align_1024(smem_raw);
    uint8_t *sA = smem;                           // [ST][128 rows][128 B] or [ST][2 panels], 128B swizzle
    uint8_t *sB = sA + ST * MW_A_BYTES;           // [ST][BN rows][128 B] or [ST][BN / 64 panels]
    uint8_t *sOut = sB + ST * C::B_BYTES;         // OUT_TMA: [2 warpgroups][64 x 128 FP32]; SB: [2][SB boxes]
    uint64_t *full = (uint64_t *)(sOut + C::OUT_BYTES), *empty = full + ST;
    int32_t *s_off = (int32_t *)(empty + ST), *s_mt = s_off + MW_MAX_E + 1;
    __shared__ double s_wsq[2][4]; // OUT_TMA with sumsq: each consumer warpgroup's warps' squares
    const int tid = threadIdx.x, wg = warpgroup_index();
    for (int64_t e = tid; e <= p.E; e += MW_THREADS) s_off[e] = p.off[e];
    __syncthreads();
    if (tid == 0 && PASS != DW_MOE_WGRAD) { // prefix of row tiles per expert
        s_mt[0] = 0;
        for (int64_t e = 0; e < p.E; e++) s_mt[e + 1] = s_mt[e] + (s_off[e + 1] - s_off[e] + MW_BM - 1) / MW_BM;
    }
    if (tid == 0) {
        for (int s = 0; s < ST; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 8); // 8 consumer warps
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) { // producer
        regs_dec<MW_PROD_REGS>();
        if (tid == 0) {
            Ring r;
            bool first_round = true;
            MwTile t;
            for (int64_t u = blockIdx.x; mw_tile<BN, PASS>(p, s_off, s_mt, u, &t); u += gridDim.x)
                for (int64_t kt = 0; kt < t.ktiles; kt++) {
                    const int s = r.slot;
                    if (!first_round) mbar_wait<true>(&empty[s], r.phase ^ 1);
                    mbar_expect_tx(&full[s], MW_A_BYTES + C::B_BYTES);
                    mw_load<AMN, MW_BM>(sA + s * MW_A_BYTES, &tA, &full[s], t.a_mn, t.a_l + kt * MW_BK);
                    mw_load<BMN, BN>(sB + s * C::B_BYTES, &tB, &full[s], t.b_mn, t.b_l + kt * MW_BK);
                    r.next<ST>();
                    if (r.slot == 0) first_round = false;
                }
        }
        return;
    }
    // consumers: warpgroup wg owns rows [64 (wg-1), +64) of the tile (MN-major A: its panel)
    regs_inc<MW_CONS_REGS>();
    const int cw = wg - 1, lt = tid % 128, warp = lt / 32, lane = lt % 32;
    const int rl = 64 * cw + 16 * warp + lane / 4, q = lane % 4; // rows rl, rl + 8; cols 8 j + 2 q (+1)
    // descriptors, and their step per 16 of K: 32 bytes along a K-major line, 16 lines of a panel
    const uint64_t da0 = AMN ? make_desc_mn(sA + cw * MW_PANEL, MW_PANEL) : make_desc(sA + cw * 64 * 128);
    const uint64_t db0 = BMN ? make_desc_mn(sB, MW_PANEL) : make_desc(sB);
    constexpr uint64_t KA = AMN ? 16 * 128 / 16 : 2, KB = BMN ? 16 * 128 / 16 : 2;
    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; i++) acc[i] = 0.0f;
    Ring r;
    MwTile t;
    for (int64_t u = blockIdx.x; mw_tile<BN, PASS>(p, s_off, s_mt, u, &t); u += gridDim.x) {
        if (t.ktiles == 0) { // wgrad: an expert without rows adds nothing (overwrite: stores zeros)
            if (!p.overwrite) continue;
#pragma unroll
            for (int i = 0; i < NACC; i++) acc[i] = 0.0f;
        } else {
            int prev = -1;
            for (int64_t kt = 0; kt < t.ktiles; kt++) {
                const int s = r.slot;
                mbar_wait(&full[s], r.phase);
                if (AMN && kt == t.ktiles - 1 && t.last_lines < MW_BK) {
                    // the lines past the expert's rows belong to the next expert: zero this warpgroup's
                    // panel there (whole 128-byte lines, so the swizzle does not matter), then hand the
                    // writes to the async proxy that wgmma reads through
                    uint4 *z = reinterpret_cast<uint4 *>(sA + s * MW_A_BYTES + cw * MW_PANEL + t.last_lines * 128);
                    for (int v = lt; v < (MW_BK - t.last_lines) * 8; v += 128) z[v] = make_uint4(0, 0, 0, 0);
                    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                    asm volatile("bar.sync %0, 128;" ::"r"(1 + cw) : "memory");
                }
                const uint64_t da = da0 + (uint64_t)(s * (MW_A_BYTES >> 4)), db = db0 + (uint64_t)(s * (C::B_BYTES >> 4));
                wg_fence();
#pragma unroll
                for (int c = 0; c < 4; c++)
                    wgmma_bf16_k16<BN, AMN, BMN>(acc, da + KA * c, db + KB * c, kt > 0 || c > 0);
                wg_commit();
                // the previous K tile's wgmmas are done once at most this one's group is in flight
                wg_wait<1>();
                if (prev >= 0) {
                    __syncwarp();
                    if (lane == 0) mbar_arrive(&empty[prev]);
                }
                prev = s;
                r.next<ST>();
            }
            wg_wait<0>();
#pragma unroll
            for (int i = 0; i < NACC; i++) asm volatile("" : "+f"(acc[i])::"memory"); // no read above the wait
            __syncwarp();
            if (lane == 0) mbar_arrive(&empty[prev]);
        }
        if constexpr (OUT_TMA) {
            mw_epilogue_tma<BN, SQ>(acc, sOut + cw * (C::OUT_BYTES / 2), &tC, p, t, cw, lt, s_wsq[cw]);
        } else if (SB > 0 && t.rows >= 64 * (cw + 1)) { // the warpgroup's 64 rows all in the group
            if constexpr (SB > 0)
                moe_store_bf16_tma<BN, SB>(acc, sOut + cw * (C::OUT_BYTES / 2), &tC, t.row0 + 64 * cw, t.tn * BN, p.J,
                                           cw, lt);
        } else { // epilogue from registers (the producer already fills the ring for the next tile)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t rr = rl + 8 * h; // row within the tile
                if (rr >= t.rows || rr >= MW_BM) continue;
#pragma unroll
                for (int j = 0; j < BN / 8; j++) {
                    const int64_t col = t.tn * BN + 8 * j + 2 * q;
                    if (col >= p.J) continue; // J is even: col + 1 < J too
                    const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
                    if constexpr (PASS == DW_MOE_WGRAD) {
                        float2 *d = reinterpret_cast<float2 *>((float *)p.out + (t.e * p.I + t.row0 + rr) * p.J + col);
                        float2 o = p.overwrite ? make_float2(0.0f, 0.0f) : *d;
                        o.x += v0, o.y += v1;
                        *d = o;
                    } else {
                        *reinterpret_cast<__nv_bfloat162 *>((__nv_bfloat16 *)p.out + (t.row0 + rr) * p.J + col) =
                            __floats2bfloat162_rn(v0, v1);
                    }
                }
            }
        }
    }
    if constexpr (OUT_TMA || SB > 0)
        if (lt == 0) bulk_wait_all(); // the staging must outlive the copies that read it
#endif
}

// Streaming multiprocessors of the current device and whether it is an sm_90 part; cached.
bool sm90_device(int *sms) {
    static int cached_dev = -1, cached_sms = 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (dev != cached_dev) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return false;
        cached_sms = n, cached_dev = dev;
    }
    *sms = cached_sms;
    return dw_moe_gemm_device_sm() == 90;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <int BN, dw_moe_pass PASS, bool OUT_TMA = false, bool SQ = false, int SB = 0>
cudaError_t launch(int64_t grid, const CUtensorMap &tA, const CUtensorMap &tB, const CUtensorMap &tC, const MwArgs &p,
                   cudaStream_t stream) {
    constexpr int smem = MwCfg<BN, OUT_TMA, SB>::SMEM;
    static bool attr_set = false; // the shared memory beyond 48 KiB, asked for once per kernel
    if (!attr_set) {
        const cudaError_t err = cudaFuncSetAttribute(moe_gemm_sm90_kernel<BN, PASS, OUT_TMA, SQ, SB>,
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (err != cudaSuccess) return err;
        attr_set = true;
    }
    moe_gemm_sm90_kernel<BN, PASS, OUT_TMA, SQ, SB><<<(unsigned)grid, MW_THREADS, smem, stream>>>(tA, tB, tC, p);
    return cudaGetLastError();
}

// dW (E, M, K) FP32 as a 3-D map in boxes of 64 rows x 32 columns (128 bytes, 128-byte swizzle), so
// a box at an expert's last rows is cut at M rather than spilling into the next expert's.
bool make_map_dw(CUtensorMap *m, void *dw, int64_t E, int64_t M, int64_t K) {
    const PFN_cuTensorMapEncodeTiled_v12000 fn = dw_tensor_map_encoder();
    if (!fn) return false;
    const cuuint64_t dims[3] = {(cuuint64_t)K, (cuuint64_t)M, (cuuint64_t)E};
    const cuuint64_t strides[2] = {(cuuint64_t)(K * 4), (cuuint64_t)(M * K * 4)};
    const cuuint32_t box[3] = {32, 64, 1}, es[3] = {1, 1, 1};
    return fn(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, dw, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// wgrad's kernel: TMA's epilogue with tiles of 256 columns (the default, or DW_MOE_WGRAD=256: a third
// fewer operand bytes per FLOP than 128), or of 128 (DW_MOE_WGRAD=tma), or 0, the register epilogue
// (DW_MOE_WGRAD=old: read, add, write dW). Other values keep the default.
int wgrad_variant(void) {
    const char *v = dw_env("DW_MOE_WGRAD");
    return v && !strcmp(v, "old") ? 0 : v && !strcmp(v, "tma") ? 128 : 256;
}

// dgrad's tiles for a dx at least 256 wide: 256 columns (the default: half the operand bytes of dy
// per FLOP, as the forward's), or 128 with DW_MOE_DGRAD=128. On an H100 (bench/RESULTS.md, session
// 22, alternating) 256 took 15-20% off moe-e8's dgrads and moe-e64-down's, 7% off moe-e64's;
// moe-e8 bf16 +3.4% a step. (Session 13 had measured 256 slower in the backward, when dgrad still
// read transposed copies.)
int dgrad_variant(void) {
    const char *v = dw_env("DW_MOE_DGRAD");
    return v && !strcmp(v, "128") ? 128 : 256;
}

// fprop's and dgrad's BF16 output through TMA (moe_store_sm90.cuh), one 64 x 64 box at a time per
// consumer warpgroup, so the ring keeps the register epilogue's slots; DW_MOE_STORE=reg keeps the
// register epilogue (an A/B knob). On an H100 (bench/RESULTS.md, session 26 call A) TMA took 15%
// off moe-e8's fprop, 4% off its dgrad, 7% and 17% off moe-e8-down's, 13-24% off moe-e64's four;
// the whole 64 x BN staged in one round (a ring slot fewer) was within 4% of that either way.

} // namespace

int dw_moe_gemm_device_sm(void) {
    static int cached_dev = -1, cached_sm = 0;
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return (void)cudaGetLastError(), 0;
    if (dev != cached_dev) {
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
            return (void)cudaGetLastError(), 0;
        cached_sm = major * 10 + minor, cached_dev = dev;
    }
    return cached_sm;
}

cudaError_t dw_moe_gemm_sm90(const dw_moe_gemm_args *a, cudaStream_t stream, bool *sumsq_done) {
    *sumsq_done = false;
    int sms = 0;
    const int64_t R = a->R, E = a->E, K = a->K, M = a->M;
    if (!sm90_device(&sms) || E > MW_MAX_E || K % 8 || M % 8 || !aligned16(a->x ? a->x : a->dy) ||
        !aligned16(a->out) || (a->w && !aligned16(a->w)) || (a->dy && !aligned16(a->dy)) || R >= (int64_t)1 << 30 ||
        E * M >= (int64_t)1 << 31)
        return cudaErrorNotSupported;
    const CUtensorMapDataType bf = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const CUtensorMapSwizzle sw = CU_TENSOR_MAP_SWIZZLE_128B;
    CUtensorMap tA, tB;
    MwArgs p = {};
    p.off = a->offsets, p.out = a->out, p.E = E, p.M = M, p.overwrite = a->overwrite;
    // 256-column tiles for a forward or a dgrad (dgrad_variant) at least that wide, else 128.
    // Measured on an H200 (bench/RESULTS.md, session 13) with 256 in every pass: moe-e8's forward
    // 33.2 -> 27.8 ms a step, but its backward 88.4 -> 92.4 ms and moe-e64's step 8 ms slower (the
    // wgrad tiles' K loops are short, 16 K tiles for moe-e64, and half as many tiles balance worse;
    // that wgrad still had the register epilogue, dgrad transposed copies). wgrad: 256 through TMA's
    // epilogue by default (wgrad_variant).
    const bool fprop = a->pass == DW_MOE_FPROP;
    const int64_t J = fprop ? M : K;
    const int wv = a->pass == DW_MOE_WGRAD ? wgrad_variant() : 0;
    const bool dgrad256 = a->pass == DW_MOE_DGRAD && J >= 256 && dgrad_variant() == 256;
    const int BN = (fprop && J >= 256) || wv == 256 || dgrad256 ? 256 : 128;
    bool maps;
    int64_t units;
    if (a->pass == DW_MOE_WGRAD) { // A = dy (R, M), B = x (R, K), both MN-major panels
        maps = dw_make_map_2d(&tA, a->dy, bf, 2, R, M, M, 64, MW_BK, sw) &&
               dw_make_map_2d(&tB, a->x, bf, 2, R, K, K, 64, MW_BK, sw);
        p.I = M, p.J = K, p.L = 0, p.tiles_n = (K + BN - 1) / BN;
        units = E * ((M + MW_BM - 1) / MW_BM) * p.tiles_n;
    } else { // A = x (R, K) or dy (R, M) K-major; B = W (E*M, K): fprop K-major rows, dgrad MN-major panels
        const int64_t L = fprop ? K : M;
        maps = dw_make_map_2d(&tA, fprop ? a->x : a->dy, bf, 2, R, L, L, MW_BK, MW_BM, sw) &&
               (fprop ? dw_make_map_2d(&tB, a->w, bf, 2, E * M, K, K, MW_BK, (uint32_t)BN, sw)
                      : dw_make_map_2d(&tB, a->w, bf, 2, E * M, K, K, 64, MW_BK, sw));
        p.J = J, p.L = L, p.tiles_n = (J + BN - 1) / BN;
        units = ((R + MW_BM - 1) / MW_BM + E) * p.tiles_n; // at most: row tiles of every group
    }
    if (!maps) return cudaErrorNotSupported;
    const int64_t grid = units < sms ? units : sms;
    if (grid == 0) return cudaSuccess;
    if (a->pass == DW_MOE_WGRAD) {
        if (wv == 0) return launch<128, DW_MOE_WGRAD>(grid, tA, tB, tA, p, stream);
        CUtensorMap tC;
        if (!make_map_dw(&tC, a->out, E, M, K)) return cudaErrorNotSupported;
        if (a->sumsq && a->overwrite) /* the epilogue's squares, from the values it stores */
            p.sumsq = a->sumsq, p.sq_mb = dw_moe_sumsq_mb(M), p.sq_kb = dw_moe_sumsq_kb(K);
        const cudaError_t err = p.sumsq ? (BN == 256 ? launch<256, DW_MOE_WGRAD, true, true>(grid, tA, tB, tC, p, stream)
                                                     : launch<128, DW_MOE_WGRAD, true, true>(grid, tA, tB, tC, p, stream))
                                : BN == 256 ? launch<256, DW_MOE_WGRAD, true>(grid, tA, tB, tC, p, stream)
                                            : launch<128, DW_MOE_WGRAD, true>(grid, tA, tB, tC, p, stream);
        *sumsq_done = err == cudaSuccess && p.sumsq;
        return err;
    }
    const bool st = dw_moe_store_tma();
    CUtensorMap tC = tA;
    if (st && !dw_make_map_2d(&tC, a->out, bf, 2, R, J, J, 64, 64, sw)) return cudaErrorNotSupported;
    if (a->pass == DW_MOE_DGRAD)
        return BN == 256 ? (st ? launch<256, DW_MOE_DGRAD, false, false, 1>(grid, tA, tB, tC, p, stream)
                               : launch<256, DW_MOE_DGRAD>(grid, tA, tB, tC, p, stream))
                         : (st ? launch<128, DW_MOE_DGRAD, false, false, 1>(grid, tA, tB, tC, p, stream)
                               : launch<128, DW_MOE_DGRAD>(grid, tA, tB, tC, p, stream));
    return BN == 256 ? (st ? launch<256, DW_MOE_FPROP, false, false, 1>(grid, tA, tB, tC, p, stream)
                           : launch<256, DW_MOE_FPROP>(grid, tA, tB, tC, p, stream))
                     : (st ? launch<128, DW_MOE_FPROP, false, false, 1>(grid, tA, tB, tC, p, stream)
                           : launch<128, DW_MOE_FPROP>(grid, tA, tB, tC, p, stream));
}
