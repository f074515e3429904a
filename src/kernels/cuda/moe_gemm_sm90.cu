// moe_gemm_sm90.cu — the BF16 grouped expert GEMM for Hopper (sm_90a): TMA loads into a ring of
// shared-memory slots, wgmma m64n128k16 or m64n256k16 with FP32 accumulation, one persistent warp-specialised
// kernel for the three passes of moe_gemm.cuh. Each pass is computed as C[i,j] = sum_l A(i,l) B(j,l)
// with both operands K-major (l contiguous), as the 128-byte-swizzled TMA boxes wgmma reads:
//   fprop  A = x (R,K) rows of expert e from off[e],  B = W viewed (E*M, K), rows of e from e*M
//   dgrad  A = dy (R,M),                               B = W^T (E*K, M): transposed here first
//   wgrad  A = dy^T (M, Rp), B = x^T (K, Rp): both transposed here first, each expert's columns
//          padded to a multiple of 64 with zeros (poff), so that no K tile mixes two experts
// The scratch (dw_cuda_moe_gemm_ws_bytes) holds the transposes. Tiles of fprop/dgrad cover each
// expert's rows in 128-row blocks (expert, block) found from the device's offsets: no counts come
// to the host, and rows a tile reads past its expert's group are computed but never stored. Every
// output element is one CTA's (wgrad adds into dW): deterministic.
// CTA: warpgroup 0 produces (one thread issues the TMA loads into STAGES slots guarded by full/empty
// mbarriers), warpgroups 1 and 2 consume, each 64 rows of the 128 x BN tile (MwCfg).
#include <cuda_bf16.h>

#include "core/tensor_map.cuh"
#include "core/wgmma_sm90.cuh"
#include "kernels/cuda/moe_gemm.cuh"
#include "kernels/cuda/moe_gemm_tc.h"

namespace {

constexpr int MW_BM = 128, MW_BK = 64; // BK: 64 BF16 = one 128-byte swizzle row
constexpr int MW_THREADS = 384;
constexpr int MW_A_BYTES = MW_BM * MW_BK * 2;
constexpr int MW_MAX_E = 1024;                 // offsets kept in shared memory
constexpr int MW_PROD_REGS = 40, MW_CONS_REGS = 232;
static_assert(128 * MW_PROD_REGS + 256 * MW_CONS_REGS <= MW_THREADS * (65536 / MW_THREADS / 8 * 8),
              "setmaxnreg would ask for more registers than the CTA holds");

// Tiles of 128 x BN: BN 128 (64 accumulators a thread, 6 slots) or 256 (128 accumulators, 4 slots:
// half the shared-memory reads of A per FLOP), chosen per pass (dw_moe_gemm_sm90).
template <int BN> struct MwCfg {
    static constexpr int B_BYTES = BN * MW_BK * 2, STAGES = BN == 128 ? 6 : 4;
    static constexpr int SMEM = STAGES * (MW_A_BYTES + B_BYTES) + 2 * STAGES * 8 + 2 * (MW_MAX_E + 1) * 4 + 1024;
    static_assert(BN == 128 || BN == 256, "128- or 256-column tiles");
    static_assert(SMEM <= 227 * 1024, "shared memory over the sm_90 limit");
};

struct MwArgs {
    const int32_t *off;  // (E+1) group offsets of the rows
    const int32_t *poff; // wgrad: (E+1) padded offsets of the transposed operands' columns
    void *out;           // fprop/dgrad: (R, J) BF16; wgrad: dW (E, I, J) FP32, added into
    int64_t E, I, J, L;  // wgrad: I = M, J = K; fprop/dgrad: J output columns, L the reduction
    int64_t b_rows;      // rows of B per expert (fprop M, dgrad K; wgrad 0)
    int64_t tiles_n;
    int wgrad;
};

// The tile of work unit u: expert e, rows [row0, row0 + rows) of the output's expert block (fprop
// and dgrad: rows of the group; wgrad: rows of dW_e), n-tile tn, and the TMA coordinates.
struct MwTile {
    int64_t e, tn, row0, rows, a_row, b_row, l0, ktiles;
};

#ifdef DW_SM90_BODY
constexpr int MW_GROUP_M = 16; // raster: 16 row tiles share their B tiles in L2

// D[64xBN] (+)= A[64x16] . B[BNx16]^T, BF16 operands from K-major descriptors.
template <int BN> __device__ __forceinline__ void wgmma_bf16_k16(float *d, uint64_t da, uint64_t db, int scale_d) {
    if constexpr (BN == 128)
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "l"(da), "l"(db), "r"(scale_d));
    else
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
                     " wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 0;\n}"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                     : "l"(da), "l"(db), "r"(scale_d));
}

// Work unit u's tile; false when u is past the last one. s_off/s_mt: the offsets and (fprop, dgrad)
// the prefix sums of the experts' row-tile counts, in shared memory.
template <int BN>
__device__ __forceinline__ bool mw_tile(const MwArgs &p, const int32_t *s_off, const int32_t *s_mt, int64_t u,
                                        MwTile *t) {
    if (p.wgrad) {
        const int64_t tiles_m = (p.I + MW_BM - 1) / MW_BM, per = tiles_m * p.tiles_n;
        if (u >= p.E * per) return false;
        int64_t tm;
        t->e = u / per;
        tile_coords(u % per, tiles_m, p.tiles_n, MW_GROUP_M, &tm, &t->tn);
        t->row0 = tm * MW_BM, t->rows = p.I - t->row0;
        t->a_row = t->row0, t->b_row = t->tn * BN;
        t->l0 = p.poff[t->e], t->ktiles = (p.poff[t->e + 1] - t->l0) / MW_BK;
        return true;
    }
    const int64_t tiles_m = s_mt[p.E];
    if (u >= tiles_m * p.tiles_n) return false;
    int64_t gm;
    tile_coords(u, tiles_m, p.tiles_n, MW_GROUP_M, &gm, &t->tn);
    int64_t e = 0;
    while (s_mt[e + 1] <= gm) e++; // the expert whose row tiles hold gm (empty experts have none)
    t->e = e;
    const int64_t g0 = s_off[e], mt = gm - s_mt[e];
    t->row0 = g0 + mt * MW_BM, t->rows = s_off[e + 1] - t->row0;
    t->a_row = t->row0, t->b_row = e * p.b_rows + t->tn * BN;
    t->l0 = 0, t->ktiles = (p.L + MW_BK - 1) / MW_BK;
    return true;
}
#endif // DW_SM90_BODY

template <int BN>
__global__ void __launch_bounds__(MW_THREADS, 1)
    moe_gemm_sm90_kernel(const __grid_constant__ CUtensorMap tA, const __grid_constant__ CUtensorMap tB, MwArgs p) {
#ifdef DW_SM90_BODY
    using C = MwCfg<BN>;
    constexpr int ST = C::STAGES, NACC = BN / 2; // NACC accumulators a thread
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_align_1024(smem_raw);
    uint8_t *sA = smem;                           // [ST][128 rows][128 B], 128B swizzle
    uint8_t *sB = sA + ST * MW_A_BYTES;           // [ST][BN rows][128 B]
    uint64_t *full = (uint64_t *)(sB + ST * C::B_BYTES), *empty = full + ST;
    int32_t *s_off = (int32_t *)(empty + ST), *s_mt = s_off + MW_MAX_E + 1;
    const int tid = threadIdx.x, wg = warpgroup_index();
    if (!p.wgrad) {
        for (int64_t e = tid; e <= p.E; e += MW_THREADS) s_off[e] = p.off[e];
        __syncthreads();
        if (tid == 0) { // prefix of row tiles per expert
            s_mt[0] = 0;
            for (int64_t e = 0; e < p.E; e++) s_mt[e + 1] = s_mt[e] + (s_off[e + 1] - s_off[e] + MW_BM - 1) / MW_BM;
        }
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
            for (int64_t u = blockIdx.x; mw_tile<BN>(p, s_off, s_mt, u, &t); u += gridDim.x)
                for (int64_t kt = 0; kt < t.ktiles; kt++) {
                    const int s = r.slot;
                    if (!first_round) mbar_wait<true>(&empty[s], r.phase ^ 1);
                    mbar_expect_tx(&full[s], MW_A_BYTES + C::B_BYTES);
                    const int l = (int)(t.l0 + kt * MW_BK);
                    tma_load_2d(sA + s * MW_A_BYTES, &tA, &full[s], l, (int)t.a_row);
                    tma_load_2d(sB + s * C::B_BYTES, &tB, &full[s], l, (int)t.b_row);
                    r.next<ST>();
                    if (r.slot == 0) first_round = false;
                }
        }
        return;
    }
    // consumers: warpgroup wg owns rows [64 (wg-1), +64) of the tile
    regs_inc<MW_CONS_REGS>();
    const int cw = wg - 1, lt = tid % 128, warp = lt / 32, lane = lt % 32;
    const int rl = 64 * cw + 16 * warp + lane / 4, q = lane % 4; // rows rl, rl + 8; cols 8 j + 2 q (+1)
    const uint64_t da0 = make_desc(sA + cw * 64 * 128), db0 = make_desc(sB);
    float acc[NACC];
#pragma unroll
    for (int i = 0; i < NACC; i++) acc[i] = 0.0f;
    Ring r;
    MwTile t;
    for (int64_t u = blockIdx.x; mw_tile<BN>(p, s_off, s_mt, u, &t); u += gridDim.x) {
        if (t.ktiles == 0) continue; // wgrad: an expert without rows adds nothing
        int prev = -1;
        for (int64_t kt = 0; kt < t.ktiles; kt++) {
            const int s = r.slot;
            mbar_wait(&full[s], r.phase);
            const uint64_t da = da0 + (uint64_t)(s * (MW_A_BYTES >> 4)), db = db0 + (uint64_t)(s * (C::B_BYTES >> 4));
            wg_fence();
#pragma unroll
            for (int c = 0; c < 4; c++) wgmma_bf16_k16<BN>(acc, da + 2 * c, db + 2 * c, kt > 0 || c > 0);
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
        // epilogue from registers (the producer already fills the ring for the next tile)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t rr = rl + 8 * h; // row within the tile
            if (rr >= t.rows || rr >= MW_BM) continue;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                const int64_t col = t.tn * BN + 8 * j + 2 * q;
                if (col >= p.J) continue; // J is even: col + 1 < J too
                const float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
                if (p.wgrad) {
                    float2 *d = reinterpret_cast<float2 *>((float *)p.out + (t.e * p.I + t.row0 + rr) * p.J + col);
                    float2 o = *d;
                    o.x += v0, o.y += v1;
                    *d = o;
                } else {
                    *reinterpret_cast<__nv_bfloat162 *>((__nv_bfloat16 *)p.out + (t.row0 + rr) * p.J + col) =
                        __floats2bfloat162_rn(v0, v1);
                }
            }
        }
    }
#endif
}

// ---- the transposes feeding dgrad and wgrad ----------------------------------------------------
// A block moves a 64 x 64 tile: 64 source rows (dst columns p0 + j) of 64 values (dst rows c0 + c)
// come in as 16-byte vectors, pass through shared memory (rows of 66 values: the column reads hit
// at most two banks per word) and leave as 16-byte vectors along the destination's rows. Widths
// are multiples of 8 (the wgmma path's condition), so a vector is wholly inside or outside.
constexpr int TT = 64, TT_LD = TT + 2, TT_THREADS = 256;

// dst (C, ld) [c][p] = src row of column p (srow[j], -1: zero), value c; c < C, p < P.
__device__ __forceinline__ void moe_transpose_tile(__nv_bfloat16 *dst, int64_t ld, int64_t P, const __nv_bfloat16 *src,
                                                   int64_t C, const int64_t *srow, int64_t p0, int64_t c0,
                                                   __nv_bfloat16 (*s)[TT_LD]) {
    for (int v = threadIdx.x; v < TT * TT / 8; v += TT_THREADS) {
        const int j = v / 8, q = v % 8;
        const int64_t row = srow[j], c = c0 + 8 * q;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (row >= 0 && c < C) x = *reinterpret_cast<const uint4 *>(src + row * C + c);
        const __nv_bfloat16 *e = reinterpret_cast<const __nv_bfloat16 *>(&x);
#pragma unroll
        for (int i = 0; i < 8; i++) s[j][8 * q + i] = e[i];
    }
    __syncthreads();
    for (int v = threadIdx.x; v < TT * TT / 8; v += TT_THREADS) {
        const int cc = v / 8, q = v % 8;
        const int64_t c = c0 + cc, p = p0 + 8 * q;
        if (c >= C || p >= P) continue;
        alignas(16) __nv_bfloat16 e[8];
#pragma unroll
        for (int i = 0; i < 8; i++) e[i] = s[8 * q + i][cc];
        *reinterpret_cast<uint4 *>(dst + c * ld + p) = *reinterpret_cast<const uint4 *>(e);
    }
}

// W (E, M, K) -> WT (E, K, M), expert e = blockIdx.z.
__global__ void __launch_bounds__(TT_THREADS) moe_transpose_w_kernel(__nv_bfloat16 *wt, const __nv_bfloat16 *w,
                                                                     int64_t M, int64_t K) {
    __shared__ __nv_bfloat16 s[TT][TT_LD];
    __shared__ int64_t srow[TT];
    const int64_t e = blockIdx.z, p0 = (int64_t)blockIdx.x * TT, c0 = (int64_t)blockIdx.y * TT;
    if (threadIdx.x < TT) srow[threadIdx.x] = p0 + threadIdx.x < M ? p0 + threadIdx.x : -1;
    __syncthreads();
    moe_transpose_tile(wt + e * M * K, M, M, w + e * M * K, K, srow, p0, c0, s);
}

// poff (E+1): each expert's row count rounded up to 64, summed. One thread: E is small.
__global__ void moe_pad_offsets_kernel(int32_t *poff, const int32_t *off, int64_t E) {
    int32_t acc = 0;
    poff[0] = 0;
    for (int64_t e = 0; e < E; e++) poff[e + 1] = acc += (off[e + 1] - off[e] + MW_BK - 1) / MW_BK * MW_BK;
}

// src (R, C) rows grouped by expert -> dst (C, Rp): column p of dst, inside expert e's padded range
// [poff[e], poff[e+1]), is row off[e] + (p - poff[e]) of src, or zero past the expert's rows.
__global__ void __launch_bounds__(TT_THREADS) moe_transpose_rows_kernel(__nv_bfloat16 *dst, const __nv_bfloat16 *src,
                                                                        const int32_t *off, const int32_t *poff,
                                                                        int64_t E, int64_t C, int64_t Rp) {
    __shared__ __nv_bfloat16 s[TT][TT_LD];
    __shared__ int64_t srow[TT];
    const int64_t p0 = (int64_t)blockIdx.x * TT, c0 = (int64_t)blockIdx.y * TT, used = poff[E];
    if (p0 >= used) return; // columns no expert's K tiles read
    if (threadIdx.x < TT) {
        const int64_t pcol = p0 + threadIdx.x;
        int64_t lo = 0, hi = E; // the expert e with poff[e] <= pcol < poff[e+1] (binary search)
        while (hi - lo > 1) {
            const int64_t mid = (lo + hi) / 2;
            if (poff[mid] <= pcol) lo = mid;
            else hi = mid;
        }
        const int64_t i = pcol - poff[lo];
        srow[threadIdx.x] = pcol < used && i < off[lo + 1] - off[lo] ? off[lo] + i : -1;
    }
    __syncthreads();
    moe_transpose_tile(dst, Rp, Rp, src, C, srow, p0, c0, s);
}

static_assert(MW_BK == 64, "dw_cuda_moe_padded_rows pads the groups to the K tile");

// Streaming multiprocessors of the current device and whether it is an sm_90 part; cached.
bool sm90_device(int *sms) {
    static int cached_dev = -1, cached_sms = 0, cached_ok = 0;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (dev != cached_dev) {
        int major = 0, minor = 0, n = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            return false;
        cached_ok = major == 9 && minor == 0, cached_sms = n, cached_dev = dev;
    }
    *sms = cached_sms;
    return cached_ok;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

template <int BN>
cudaError_t launch(int64_t grid, const CUtensorMap &tA, const CUtensorMap &tB, const MwArgs &p, cudaStream_t stream) {
    static bool attr_set = false; // the shared memory beyond 48 KiB, asked for once per tile shape
    if (!attr_set) {
        const cudaError_t err =
            cudaFuncSetAttribute(moe_gemm_sm90_kernel<BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, MwCfg<BN>::SMEM);
        if (err != cudaSuccess) return err;
        attr_set = true;
    }
    moe_gemm_sm90_kernel<BN><<<(unsigned)grid, MW_THREADS, MwCfg<BN>::SMEM, stream>>>(tA, tB, p);
    return cudaGetLastError();
}

} // namespace

cudaError_t dw_moe_gemm_sm90(const dw_moe_gemm_args *a, cudaStream_t stream) {
    int sms = 0;
    const int64_t R = a->R, E = a->E, K = a->K, M = a->M;
    if (!sm90_device(&sms) || E > MW_MAX_E || K % 8 || M % 8 || !aligned16(a->x ? a->x : a->dy) ||
        !aligned16(a->out) || (a->w && !aligned16(a->w)) || (a->dy && !aligned16(a->dy)) ||
        a->ws_bytes < dw_cuda_moe_gemm_ws_bytes(a->pass, R, E, K, M) || (a->pass != DW_MOE_FPROP && !aligned16(a->ws)) ||
        R >= (int64_t)1 << 30 || E * (M > K ? M : K) >= (int64_t)1 << 31)
        return cudaErrorNotSupported;
    const CUtensorMapDataType bf = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const CUtensorMapSwizzle sw = CU_TENSOR_MAP_SWIZZLE_128B;
    CUtensorMap tA, tB;
    MwArgs p = {};
    p.off = a->offsets, p.out = a->out, p.E = E;
    int64_t units;
    // 256-column tiles for a forward at least that wide, else 128. Measured on an H200 (bench/
    // RESULTS.md, session 13) with 256 in every pass: moe-e8's forward 33.2 -> 27.8 ms a step, but
    // its backward 88.4 -> 92.4 ms and moe-e64's step 8 ms slower (the wgrad tiles' K loops are
    // short, 16 K tiles for moe-e64, and half as many tiles balance worse)
    const int64_t J = a->pass == DW_MOE_FPROP ? M : K;
    const int BN = a->pass == DW_MOE_FPROP && J >= 256 ? 256 : 128;
    if (a->pass == DW_MOE_WGRAD) {
        const int64_t Rp = dw_cuda_moe_padded_rows(R, E);
        int32_t *poff = (int32_t *)a->ws;
        __nv_bfloat16 *dyT = (__nv_bfloat16 *)((uint8_t *)a->ws + dw_cuda_moe_poff_bytes(E)), *xT = dyT + M * Rp;
        moe_pad_offsets_kernel<<<1, 1, 0, stream>>>(poff, a->offsets, E);
        moe_transpose_rows_kernel<<<dim3((unsigned)(Rp / TT), (unsigned)((M + TT - 1) / TT)), TT_THREADS, 0, stream>>>(
            dyT, (const __nv_bfloat16 *)a->dy, a->offsets, poff, E, M, Rp);
        moe_transpose_rows_kernel<<<dim3((unsigned)(Rp / TT), (unsigned)((K + TT - 1) / TT)), TT_THREADS, 0, stream>>>(
            xT, (const __nv_bfloat16 *)a->x, a->offsets, poff, E, K, Rp);
        if (!dw_make_map_2d(&tA, dyT, bf, 2, M, Rp, Rp, MW_BK, MW_BM, sw) ||
            !dw_make_map_2d(&tB, xT, bf, 2, K, Rp, Rp, MW_BK, (uint32_t)BN, sw))
            return cudaErrorNotSupported;
        p.poff = poff, p.wgrad = 1, p.I = M, p.J = K, p.L = 0, p.b_rows = 0;
        p.tiles_n = (K + BN - 1) / BN;
        units = E * ((M + MW_BM - 1) / MW_BM) * p.tiles_n;
    } else {
        const bool fprop = a->pass == DW_MOE_FPROP;
        const void *A = fprop ? a->x : a->dy, *B = a->w;
        const int64_t L = fprop ? K : M;
        if (!fprop) { // W^T (E, K, M) into the scratch
            moe_transpose_w_kernel<<<dim3((unsigned)((M + TT - 1) / TT), (unsigned)((K + TT - 1) / TT), (unsigned)E),
                                     TT_THREADS, 0, stream>>>((__nv_bfloat16 *)a->ws, (const __nv_bfloat16 *)a->w, M, K);
            B = a->ws;
        }
        if (!dw_make_map_2d(&tA, A, bf, 2, R, L, L, MW_BK, MW_BM, sw) ||
            !dw_make_map_2d(&tB, B, bf, 2, E * J, L, L, MW_BK, (uint32_t)BN, sw))
            return cudaErrorNotSupported;
        p.wgrad = 0, p.J = J, p.L = L, p.b_rows = J;
        p.tiles_n = (J + BN - 1) / BN;
        units = ((R + MW_BM - 1) / MW_BM + E) * p.tiles_n; // at most: row tiles of every group
    }
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    const int64_t grid = units < sms ? units : sms;
    if (grid == 0) return cudaSuccess;
    return BN == 256 ? launch<256>(grid, tA, tB, p, stream) : launch<128>(grid, tA, tB, p, stream);
}
