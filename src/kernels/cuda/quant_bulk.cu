/* quant_bulk.cu — the transposing quantiser for BF16 input in whole 128x128 tiles (mxfp8,
 * mxfp8_e5m2, fp8_block; rows and cols multiples of 128): a persistent kernel whose producer warp
 * streams tiles into a ring of shared-memory buffers (one lane issues a tensor-map copy per tile,
 * or 128 row copies, completing on an mbarrier), while 8 consumer warps each take an 8x8 piece per
 * thread into registers and compute row-wise and transposed codes and scales, which leave from
 * registers or staged in shared memory and out as whole rows, by tensor stores by default
 * (dw_quant_tuning.t_store) from a staging buffer of the CTA's own; a CTA may take blocks of up to
 * 4x4 tiles whose scales leave as one run per scale row (tile_block). The same
 * ring, fed 32 KiB runs of the flat tensor, also quantises row-wise only (quant_bulk_rows_kernel;
 * cols a multiple of the block). Same rules and encoders as quant_kernels.cuh (quant_common.cuh), some
 * recoded here without divisions (bulk_rule, enc8: fp8_block's quotient in two FP32 operations,
 * formats/rules.h, exact on BF16 data): bit-identical to the CPU reference. Builds with CNT also
 * count each copy's overflows and underflows from the values, codes and scales in registers
 * (precision/quant_counts.cuh; the row-wise ring, and the transposing kernel with stores from
 * registers or tensor stores from its own staging, 2 CTAs per SM). Not the other recipes, FP32
 * input or ragged tiles: quant_kernels.cuh's kernels run those. */
#include <cuda_runtime.h>
#include <cudaTypedefs.h> /* CUtensorMap */
#include <stdint.h>
#include <string.h>

#include "core/async_copy.cuh"
#include "core/tensor_map.cuh"
#include "kernels/cuda/quant_common.cuh"

namespace dwq {
namespace {

constexpr int BK_CONS = 256;               /* 8 consumer warps: 16 x 16 pieces of 8 x 8 */
constexpr int BK_THREADS = BK_CONS + 32;   /* + the producer warp */
constexpr int BK_ROW = TILE * 2;           /* bytes of one tile row in shared memory */
constexpr int BK_TILE = TILE * BK_ROW;     /* 32 KiB */

/* The transposing kernel's tensor maps (kernel parameters): x in 128x128 boxes (loads), and for
 * tensor stores (ST_TMA) the row-wise and transposed codes in 32-row boxes of 128 bytes. */
struct TileMaps {
    CUtensorMap x, o, t;
};

/* the warp index, known to the compiler as warp-uniform (a broadcast from lane 0) */
__device__ __forceinline__ int warp_uniform() { return __shfl_sync(0xFFFFFFFFu, (int)threadIdx.x >> 5, 0); }
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(BK_CONS) : "memory"); }

/* Stores under an L2 policy that keeps their lines resident (evict_last). For the scales: their
 * rows are written in 4- to 16-byte pieces by several CTAs; kept in L2 the pieces meet there as
 * whole sectors, where streamed out (evict-first, as the codes are) they would leave in parts. */
__device__ __forceinline__ uint64_t l2_keep_policy() {
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
__device__ __forceinline__ void st_keep(void *d, uint32_t v, uint64_t pol) {
    asm volatile("st.global.L2::cache_hint.b32 [%0], %1, %2;" ::"l"(d), "r"(v), "l"(pol) : "memory");
}
__device__ __forceinline__ void st_keep(void *d, uint2 v, uint64_t pol) {
    asm volatile("st.global.L2::cache_hint.v2.b32 [%0], {%1, %2}, %3;" ::"l"(d), "r"(v.x), "r"(v.y), "l"(pol) : "memory");
}
__device__ __forceinline__ void st_keep(void *d, uint4 v, uint64_t pol) {
    asm volatile("st.global.L2::cache_hint.v4.b32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(d), "r"(v.x), "r"(v.y), "r"(v.z),
                 "r"(v.w), "l"(pol)
                 : "memory");
}

/* ---- packed BF16 helpers: |x| bit patterns compare as unsigned integers (NaN above Inf) ---- */

__device__ __forceinline__ uint32_t vmax2(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ uint32_t word(const uint4 &v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }
/* element j (0..7) of 8 BF16 codes as a float */
__device__ __forceinline__ float elem(const uint4 &v, int j) {
    const uint32_t w = word(v, j >> 1);
    return __uint_as_float((j & 1) ? (w & 0xFFFF0000u) : (w << 16));
}
/* a[i] for a run-time i, by selects (a run-time index would put a[] in local memory) */
__device__ __forceinline__ uint32_t pick4(const uint32_t a[4], int i) {
    const uint32_t lo = (i & 1) ? a[1] : a[0], hi = (i & 1) ? a[3] : a[2];
    return (i & 2) ? hi : lo;
}
/* the 16-bit amax of element `half` (0 low, 1 high) of a packed pair, as FP32 amax bits */
__device__ __forceinline__ uint32_t amax_f32(uint32_t packed, int half) {
    return half ? (packed & 0xFFFF0000u) : (packed << 16);
}

/* amax bits of each of 8 groups of 8 BF16 (w[g]), packed in pairs: group 2i low, 2i + 1 high */
__device__ __forceinline__ void pair_amax(const uint4 (&w)[8], uint32_t out[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t m[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint4 &v = w[2 * i + h];
            m[h] = vmax2(vmax2(v.x & 0x7FFF7FFFu, v.y & 0x7FFF7FFFu), vmax2(v.z & 0x7FFF7FFFu, v.w & 0x7FFF7FFFu));
        }
        out[i] = vmax2(__byte_perm(m[0], m[1], 0x5410), __byte_perm(m[0], m[1], 0x7632));
    }
}

/* The ring's barriers after `stages` buffers of stage_bytes: full[s] (the producer's bytes landed)
 * and empty[s] (each consumer warp is done with buffer s); initialised by thread 0, then a CTA
 * barrier. */
__device__ __forceinline__ uint64_t *ring_init(unsigned char *smem, int stages, uint32_t stage_bytes = BK_TILE) {
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + (size_t)stages * stage_bytes);
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&full[stages + s], BK_CONS / 32);
        }
        mbar_init_fence();
    }
    __syncthreads();
    return full;
}

/* A block rule as it moves between lanes: one word for MX, two for fp8_block, the mode folded
 * into the values so that the common case costs one comparison (block_q's Q, recoded):
 *   MX         a = 2^-e > 0: codes of x a; a = +0: a zero block (codes +0); a = NaN: a non-finite
 *              block (codes NaN);
 *   fp8_block  a not NaN: codes of RN(x a + RN(x b)) — quot_q's mode 3 as a = RD(1/s), b >= 0
 *              the rest (dw_rule_recip_split; dw_rule_quot_split gives the codes of x / s on BF16
 *              data), mode 1 as a = 2^-k, b = 0; a = NaN: x / b by division (mode 2, tiny b), or
 *              b = NaN too: a non-finite block (codes NaN). */
struct Rule {
    float a, b;
};
template <int R> __device__ __forceinline__ Rule rule_of(const Q &q) {
    const float nan = __uint_as_float(0x7FFFFFFFu);
    if constexpr (Traits<R>::kind == K_MX) return Rule{q.mode == 1 ? q.f : q.konst ? nan : 0.0f, 0.0f};
    if (q.mode == 3) {
        Rule o;
        dw_rule_recip_split(q.f, q.r, &o.a, &o.b); /* q.r = RN(1/s) */
        return o;
    }
    return q.mode == 1 ? Rule{q.f, 0.0f} : q.mode == 2 ? Rule{nan, q.f} : Rule{nan, nan};
}
template <int R> __device__ __forceinline__ Rule shfl_rule(const Rule &q, int src) {
    Rule o;
    o.a = __shfl_sync(0xFFFFFFFFu, q.a, src);
    if constexpr (Traits<R>::kind != K_MX) o.b = __shfl_sync(0xFFFFFFFFu, q.b, src);
    else o.b = 0.0f;
    return o;
}

/* The rule (and scale: *s32 FP32, *s8 a 1-byte code) of a block with amax bits `amax`: block_q's,
 * recoded. fp8_block without pow2 and with a finite amax takes s = RN(amax / 448) without the
 * IEEE division (dw_rule_fp8_scale_bf16, BF16 amax only). */
template <int R> __device__ __forceinline__ Rule bulk_rule(uint32_t amax, const Params &p, float *s32, uint32_t *s8) {
    if constexpr (Traits<R>::kind == K_BLOCK) {
        if (!p.pow2 && !dw_rule_nonfinite(amax)) {
            float sc = dw_rule_fp8_scale_bf16(amax);
            if (sc == 0.0f) sc = 1.0f; /* amax = 0 (no BF16 amax > 0 gives 0) */
            *s32 = sc;
            return rule_of<R>(quot_q(sc));
        }
    }
    return rule_of<R>(block_q<R>(amax, 0.0f, p, s32, s8));
}

/* enc8's rare fp8_block cases, out of line: x / b by IEEE division (a tiny divisor), or NaN codes
 * (a non-finite block, b = NaN). Inlined, the division's code and slow-path calls would be
 * repeated in each of a tile's 16 encodes (and the kernel's code would outgrow the instruction
 * cache). */
template <int FMT>
__device__ __noinline__ uint2 enc8_div(float b, float v0, float v1, float v2, float v3, float v4, float v5, float v6,
                                       float v7) {
    if (b != b) return make_uint2(0x7F7F7F7Fu, 0x7F7F7F7Fu);
    const float t[8] = {__fdiv_rn(v0, b), __fdiv_rn(v1, b), __fdiv_rn(v2, b), __fdiv_rn(v3, b),
                        __fdiv_rn(v4, b), __fdiv_rn(v5, b), __fdiv_rn(v6, b), __fdiv_rn(v7, b)};
    return make_uint2(enc_x2<FMT>(t[0], t[1]) | enc_x2<FMT>(t[2], t[3]) << 16,
                      enc_x2<FMT>(t[4], t[5]) | enc_x2<FMT>(t[6], t[7]) << 16);
}

/* 8 codes of the BF16 values v[0..7] under q, as 2 words: the same codes as encode_n under
 * block_q's Q. */
template <int R> __device__ __forceinline__ uint2 enc8(const Rule &q, const float v[8]) {
    constexpr int fmt = Traits<R>::fmt;
    float t[8];
    if constexpr (Traits<R>::kind == K_MX) {
#pragma unroll
        for (int i = 0; i < 8; i++) t[i] = v[i] * q.a;
    } else {
        if (q.a != q.a) return enc8_div<fmt>(q.b, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
#pragma unroll
        for (int i = 0; i < 8; i++) t[i] = dw_rule_quot_split(v[i], q.a, q.b);
    }
    uint32_t w[2];
#pragma unroll
    for (int j = 0; j < 2; j++) w[j] = enc_x2<fmt>(t[4 * j], t[4 * j + 1]) | enc_x2<fmt>(t[4 * j + 2], t[4 * j + 3]) << 16;
    if constexpr (Traits<R>::kind == K_MX)
        if (!(q.a > 0.0f)) w[0] = w[1] = q.a == q.a ? 0u : 0x7F7F7F7Fu;
    return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ void put_scale8(const OutDesc &o, int64_t sr, int64_t sc, uint32_t s8) {
    static_cast<uint8_t *>(o.scales)[sr * o.scols + sc] = (uint8_t)s8;
    if (o.swz) o.swz[dw_rule_swizzle_offset(sr, sc, o.scols)] = (uint8_t)s8;
}

/* Tile t's origin: tiles go in bands of p.group tile rows (the last band may be lower), column
 * by column within a band (group 1: row by row), so that the tiles in flight at once cover
 * p.group x (CTAs / p.group) tiles: runs of that many tiles in x's rows and in x^T's rows. */
__device__ __forceinline__ void tile_origin(uint32_t t, const Params &p, int64_t *r0, int64_t *c0) {
    const uint32_t tc = (uint32_t)p.tiles_c, g = (uint32_t)p.group, per = g * tc, band = t / per, in = t - band * per;
    const uint32_t left = (uint32_t)(p.rows / TILE) - band * g, gh = g < left ? g : left;
    *r0 = (int64_t)(band * g + in % gh) * TILE;
    *c0 = (int64_t)(in / gh) * TILE;
}

/* A CTA's unit of work in the transposing kernel: p.tblock x p.tblock tiles from (r0, c0), gh x gw
 * of them at the tensor's edges, taken column by column (tile k at row k % gh, column k / gh of
 * the unit); units go to the CTAs by grid stride, row by row. p.tblock 1: unit u is tile u in
 * tile_origin's order. Several tiles per unit let their scales leave as runs of 4 p.tblock bytes
 * per scale row (flush_scales) instead of 4 bytes per tile. */
struct Unit {
    int64_t r0, c0;
    uint32_t gh, gw;
};
__device__ __forceinline__ Unit unit_of(uint32_t u, const Params &p) {
    Unit t;
    if (p.tblock == 1) {
        tile_origin(u, p, &t.r0, &t.c0);
        t.gh = t.gw = 1;
        return t;
    }
    const uint32_t g = (uint32_t)p.tblock, tr = (uint32_t)(p.rows / TILE), tc = (uint32_t)p.tiles_c;
    const uint32_t per_row = (tc + g - 1) / g, ur = u / per_row, uc = u - ur * per_row;
    t.r0 = (int64_t)(ur * g) * TILE, t.c0 = (int64_t)(uc * g) * TILE;
    t.gh = tr - ur * g < g ? tr - ur * g : g, t.gw = tc - uc * g < g ? tc - uc * g : g;
    return t;
}

/* Where a tile's codes go (dw_quant_tuning.t_store for this kernel): ST_REG straight from
 * registers, 8 bytes per store (each warp store touches 4 rows, transposed 8 rows, of x's
 * outputs; scales one byte or float at a time); ST_BULK and ST_V16 first into shared memory,
 * written over the tile's own ring buffer once every consumer has read its piece (row-wise and
 * transposed codes, 128 rows of 128 bytes each, and the tile's scales collected per row), then
 * out as whole 128-byte rows: ST_BULK by bulk copies (one row per consumer thread; the buffer
 * goes back to the producer when they have read it, checked at the next tile), ST_V16 by 16-byte
 * stores (a warp writes 4 whole rows per store); ST_TMA by tensor stores (each warp one box of
 * 32 rows, released as ST_BULK's); ST_TMA_OWN the same from a staging buffer of the CTA's own
 * (the ring buffer goes back as soon as the tile is in registers; the staging is written again
 * once the previous tile's stores have read it). Scales 4 bytes per row (MX: the tile's 4 codes
 * of a row; fp8_block: one float) and a 512-byte run of the swizzled copy, kept in L2 (st_keep)
 * until the neighbouring tiles' pieces complete their sectors. */
enum { ST_REG = 1, ST_BULK = 2, ST_V16 = 3, ST_TMA = 4, ST_TMA_OWN = 5 };
/* ST_TMA and ST_TMA_OWN: tensor stores, from the tile's ring buffer or from a staging buffer of
 * the CTA's own (the ring buffer then goes back to the producer as soon as the tile is read) */
__host__ __device__ constexpr bool tensor_stores(int st) { return st == ST_TMA || st == ST_TMA_OWN; }
/* staged code rows: ST_BULK, ST_V16: row r of a block at r * 128 + 32 (r / 8) (8-row groups
 * shifted by 32 bytes, so that both the row-wise and the transposed 8-byte stores of a warp hit
 * each bank twice, the least for 256 bytes); ST_TMA: dense rows (a tensor store's box; the
 * transposed stores then hit each bank 8 times, the row-wise ones 4 times); the transposed block
 * follows the row-wise one */
__host__ __device__ constexpr int out_block(int st) { return tensor_stores(st) ? TILE * 128 : TILE * 128 + 32 * (TILE / 8); }
__device__ __forceinline__ uint32_t out_off(int st, uint32_t r) {
    return tensor_stores(st) ? r * 128u : r * 128u + 32u * (r >> 3);
}
/* a ring buffer: the tile (32768 bytes), staged in place 33792 (ST_BULK, ST_V16) */
__host__ __device__ constexpr size_t stage_bytes_of(int st) {
    return st == ST_REG || st == ST_TMA_OWN ? (size_t)BK_TILE : 2 * (size_t)out_block(st);
}
/* Defaults of the transposing kernel, from the H200 medians in bench/RESULTS.md (session 10,
 * 2026-11-23; bench/quant_sweep.py): codes leave by tensor stores from a staging buffer of the
 * CTA's own, a 2-deep ring, one tile at a time, 2 CTAs per SM (mxfp8 0.82 of copy, fp8_block
 * 0.82 since its two-operation quotient; over the tile's ring buffer 0.77 / 3 stages 0.78,
 * 16-byte stores 0.77, tile blocks of 2 or 4 0.78 / 0.67); tiles row by row (bands changed
 * nothing measurable). */
constexpr int BULK_STORE_DEFAULT = ST_TMA_OWN;
template <int R> constexpr int bulk_stages_default(int store, bool three) {
    constexpr bool mx = Traits<R>::kind == K_MX;
    return store == ST_REG || store == ST_TMA_OWN || three || (store == ST_TMA && !mx) ? 2
           : (store == ST_V16 || store == ST_TMA) && mx ? 4 : 3;
}
/* tile block asked for when the caller leaves it (0: the widest that keeps the grid as busy) */
constexpr int bulk_tblock_default(int store) { return store == ST_TMA_OWN ? 1 : 0; }
constexpr int BULK_GROUP_DEFAULT = 1;

/* Where bulk_tile puts a tile's scales: nowhere in shared memory (row == NULL: straight to the
 * outputs), or 4 bytes per row of the tile (MX: its 4 codes, byte b = block column b; fp8_block:
 * the float) at row[i * stride] for row i of x, col[j * stride] for row j of x^T: the tile's own
 * staging (stride 1) or its place in the unit's (flush_scales). */
struct ScaleSink {
    uint32_t *row, *col;
    uint32_t stride;
};

/* One tile [r0 .. r0+128) x [c0 .. c0+128): this thread holds rows 8 tr .. 8 tr + 7, columns
 * 8 tc .. 8 tc + 7 of it in w[row] (8 BF16 each). Lanes: tc = lane % 8 + 8 (warp % 2), tr =
 * lane / 8 + 4 (warp / 2), so a warp covers 32 rows x 64 columns: an MX block of a row is 4
 * neighbouring lanes (xor 1, 2), an MX block of a column the 4 lanes lane % 8 (xor 8, 16).
 * fp8_block's 128-blocks add the partner warps through part_r / part_c (one consumer barrier).
 * Staged (ST != ST_REG): codes go to stg (the tile's ring buffer: every consumer must be past its
 * loads, which the caller's or fp8_block's barrier ensures). Scales: to sk (after this function's
 * barrier where it has one). */
template <int R, int ST, bool CNT>
__device__ __forceinline__ void bulk_tile(const Params &p, int64_t r0, int64_t c0, const uint4 (&w)[8], int lane,
                                          int cw, uint32_t (*part_r)[TILE / 2], uint32_t (*part_c)[TILE / 2],
                                          unsigned char *stg, const ScaleSink &sk, dwqc::Acc (&acc)[2]) {
    constexpr int kind = Traits<R>::kind;
    constexpr bool mx = kind == K_MX, staged = ST != ST_REG;
    const int tc = (lane & 7) + 8 * (cw & 1), tr = (lane >> 3) + 4 * (cw >> 1);
    if constexpr (ST == ST_TMA_OWN) { /* the staging's previous tensor stores have read it (the */
        bulk_wait_read();             /* consumer barrier below, before any staging write, */
        __syncwarp();                 /* extends this to every warp) */
    }
    /* amax: rows packed in pairs (row 2i low half, 2i+1 high), columns packed as in the data */
    uint32_t rm[4], cm[4];
    pair_amax(w, rm);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t m = word(w[0], j) & 0x7FFF7FFFu;
#pragma unroll
        for (int k = 1; k < 8; k++) m = vmax2(m, word(w[k], j) & 0x7FFF7FFFu);
        cm[j] = m;
    }
#pragma unroll
    for (int o = 1; o <= (mx ? 2 : 4); o <<= 1)
#pragma unroll
        for (int i = 0; i < 4; i++) rm[i] = vmax2(rm[i], __shfl_xor_sync(0xFFFFFFFFu, rm[i], o));
#pragma unroll
    for (int o = 8; o <= 16; o <<= 1)
#pragma unroll
        for (int j = 0; j < 4; j++) cm[j] = vmax2(cm[j], __shfl_xor_sync(0xFFFFFFFFu, cm[j], o));
    if constexpr (!mx) { /* 128-blocks: rows span the warp pair, columns the 4 warps cw % 2 */
        if ((lane & 7) < 4) part_r[cw & 1][4 * tr + (lane & 7)] = pick4(rm, lane & 3);
        part_c[cw >> 1][4 * tc + (lane >> 3)] = pick4(cm, lane >> 3);
        consumers_sync();
        const uint4 a = reinterpret_cast<const uint4 *>(part_r[0])[tr], b = reinterpret_cast<const uint4 *>(part_r[1])[tr];
        rm[0] = vmax2(a.x, b.x), rm[1] = vmax2(a.y, b.y), rm[2] = vmax2(a.z, b.z), rm[3] = vmax2(a.w, b.w);
        uint4 c = reinterpret_cast<const uint4 *>(part_c[0])[tc];
#pragma unroll
        for (int q = 1; q < 4; q++) {
            const uint4 d = reinterpret_cast<const uint4 *>(part_c[q])[tc];
            c.x = vmax2(c.x, d.x), c.y = vmax2(c.y, d.y), c.z = vmax2(c.z, d.z), c.w = vmax2(c.w, d.w);
        }
        cm[0] = c.x, cm[1] = c.y, cm[2] = c.z, cm[3] = c.w;
    } else if constexpr (staged) {
        consumers_sync(); /* every consumer has read its piece: the buffer takes the codes */
    }
    /* Block rules, each computed by one lane and broadcast. Rows: G lanes share 8 rows, lane
     * lane % G takes rows RPL (lane % G) .. +RPL-1. Columns: the 4 lanes lane % 8 share 8 columns,
     * lane / 8 takes columns 2 (lane / 8), +1. */
    constexpr int G = mx ? 4 : 8, RPL = 8 / G;
    const int gl = lane & (G - 1), q4 = lane >> 3;
    /* packed amax pairs this lane rules (selects, not run-time indexing: that would go to local memory) */
    const uint32_t rpk = pick4(rm, mx ? gl : gl >> 1), cpk = pick4(cm, q4);
    const uint32_t orb = (uint32_t)p.o.row_bytes, trb = (uint32_t)p.t.row_bytes;
    Rule qr[RPL], qc[2];
    float csr[RPL], csc[2]; /* CNT: the blocks' scales as stored, for counting */
#pragma unroll
    for (int s = 0; s < RPL; s++) {
        const int k = RPL * gl + s;
        float s32 = 0.0f;
        uint32_t s8 = 0;
        qr[s] = bulk_rule<R>(amax_f32(rpk, mx ? s : gl & 1), p, &s32, &s8);
        csr[s] = CNT ? count_scale<R>(s32, s8) : 0.0f;
        if (staged || sk.row) { /* staged kernels always have a sink */
            uint32_t *const d = sk.row + (uint32_t)(8 * tr + k) * sk.stride;
            if constexpr (mx) reinterpret_cast<uint8_t *>(d)[tc >> 2] = (uint8_t)s8;
            else if ((cw & 1) == 0) *reinterpret_cast<float *>(d) = s32;
        } else {
            const int64_t r = r0 + 8 * tr + k;
            if (!p.o.codes) continue; /* the transposed copy only */
            if constexpr (mx) put_scale8(p.o, r, (c0 >> 5) + (tc >> 2), s8);
            else if ((cw & 1) == 0) static_cast<float *>(p.o.scales)[r * p.o.scols + (c0 >> 7)] = s32;
        }
    }
#pragma unroll
    for (int s = 0; s < 2; s++) {
        const int j = 2 * q4 + s;
        float s32 = 0.0f;
        uint32_t s8 = 0;
        qc[s] = bulk_rule<R>(amax_f32(cpk, s), p, &s32, &s8);
        csc[s] = CNT ? count_scale<R>(s32, s8) : 0.0f;
        if (staged || sk.col) {
            uint32_t *const d = sk.col + (uint32_t)(8 * tc + j) * sk.stride;
            if constexpr (mx) reinterpret_cast<uint8_t *>(d)[tr >> 2] = (uint8_t)s8;
            else if ((cw >> 1) == 0) *reinterpret_cast<float *>(d) = s32;
        } else {
            const int64_t cg = c0 + 8 * tc + j;
            if constexpr (mx) put_scale8(p.t, cg, (r0 >> 5) + (tr >> 2), s8);
            else if ((cw >> 1) == 0) static_cast<float *>(p.t.scales)[cg * p.t.scols + (r0 >> 7)] = s32;
        }
    }
    /* row-wise codes: row k, 8 bytes at column c0 + 8 tc (none for the transposed copy only: the
     * condition is the same for the whole grid, so the shuffles below stay converged) */
    uint8_t *const ob = p.o.codes + (r0 + 8 * tr) * p.o.row_bytes + c0 + 8 * tc;
    unsigned char *const sob = stg + out_off(ST, 8 * tr) + 8 * tc;
#pragma unroll
    for (int k = 0; k < 8 && p.o.codes; k++) {
        const Rule q = shfl_rule<R>(qr[k % RPL], (lane & ~(G - 1)) | (k / RPL));
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = elem(w[k], j);
        const uint2 e = enc8<R>(q, v);
        if constexpr (staged) *reinterpret_cast<uint2 *>(sob + 128 * k) = e;
        else __stcs(reinterpret_cast<uint2 *>(ob + (uint32_t)k * orb), e);
        if constexpr (CNT) {
            const float cs = __shfl_sync(0xFFFFFFFFu, csr[k % RPL], (lane & ~(G - 1)) | (k / RPL));
            const uint32_t ew[2] = {e.x, e.y};
            dwqc::test_n<8>(count_fmt<R>(), false, v, ew, cs, 1.0f, acc[0]);
        }
    }
    /* transposed codes: column j of x = row c0 + 8 tc + j of x^T, 8 bytes at r0 + 8 tr */
    uint8_t *const tb = p.t.codes + (c0 + 8 * tc) * p.t.row_bytes + r0 + 8 * tr;
    unsigned char *const stb = stg + out_block(ST) + out_off(ST, 8 * tc) + 8 * tr;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const Rule q = shfl_rule<R>(qc[j & 1], (lane & 7) | ((j >> 1) << 3));
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = elem(w[k], j);
        const uint2 e = enc8<R>(q, v);
        if constexpr (staged) *reinterpret_cast<uint2 *>(stb + 128 * j) = e;
        else __stcs(reinterpret_cast<uint2 *>(tb + (uint32_t)j * trb), e);
        if constexpr (CNT) {
            const float cs = __shfl_sync(0xFFFFFFFFu, csc[j & 1], (lane & 7) | ((j >> 1) << 3));
            const uint32_t ew[2] = {e.x, e.y};
            dwqc::test_n<8>(count_fmt<R>(), false, v, ew, cs, 1.0f, acc[1]);
        }
    }
}

/* The staged tile out of shared memory (after the consumer barrier that follows bulk_tile):
 * consumer thread tid takes row tid % 128 of the row-wise (tid < 128) or transposed block:
 * ST_BULK: one lane of each warp copies its warp's 32 rows (128 codes each) in one bulk group;
 * ST_TMA: the same 32 rows in one tensor store (maps m.o, m.t); ST_V16: chunks tid + 256 i (i < 8)
 * of the 2048 16-byte chunks of both blocks. Then, scs not NULL (the tile's own scale staging), the row's scales (4 bytes) and, MX with a swizzled copy,
 * threads 0-31 / 128-159 one 16-byte piece of the tile's 512-byte run in cuBLAS's 128x4 layout. */
template <int R, int ST>
__device__ __forceinline__ void flush_tile(const Params &p, const TileMaps &m, int64_t r0, int64_t c0,
                                           const unsigned char *stg, const uint32_t *scs, int tid) {
    constexpr bool mx = Traits<R>::kind == K_MX;
    const bool side = tid >= TILE; /* the transposed block */
    const uint32_t u = (uint32_t)tid & (TILE - 1);
    /* the output this thread's row belongs to (fields chosen one by one: a run-time choice of
     * the whole descriptor would copy the parameters to local memory) */
    void *const scales = side ? p.t.scales : p.o.scales;
    uint8_t *const swz = side ? p.t.swz : p.o.swz;
    const int64_t scols = side ? p.t.scols : p.o.scols;
    const int64_t rb = side ? c0 : r0, cb = side ? r0 : c0; /* the tile's origin in that output's [R, C] */
    if constexpr (ST == ST_BULK) { /* warp w's 32 rows, issued by one lane with warp-uniform operands */
        const int w = warp_uniform();
        const bool wside = w >= 4;
        const uint32_t u0 = 32u * (uint32_t)(w & 3);
        if (elect_one() && (wside || p.o.codes)) {
            uint8_t *const wcodes = wside ? p.t.codes : p.o.codes;
            const int64_t wrb = wside ? c0 : r0, wcb = wside ? r0 : c0, wrow = wside ? p.t.row_bytes : p.o.row_bytes;
            const unsigned char *src = stg + (wside ? out_block(ST) : 0);
#pragma unroll 4
            for (uint32_t i = u0; i < u0 + 32; i++) bulk_s2g(wcodes + (wrb + i) * wrow + wcb, src + out_off(ST, i), 128);
            bulk_commit();
        }
        __syncwarp();
    } else if constexpr (tensor_stores(ST)) { /* warp w's 32 rows, one box of 32 x 128 bytes */
        const int w = warp_uniform(), u0 = 32 * (w & 3);
        if (elect_one() && (w >= 4 || p.o.codes)) {
            if (w >= 4) tma_store_2d(&m.t, (int)r0, (int)c0 + u0, stg + out_block(ST) + u0 * 128);
            else tma_store_2d(&m.o, (int)c0, (int)r0 + u0, stg + u0 * 128);
            bulk_commit();
        }
        __syncwarp();
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) { /* chunk 256 (i % 4) + tid of block i / 4: row chunk / 8, bytes 16 (chunk % 8) */
            if (i < 4 && !p.o.codes) continue; /* the transposed copy only */
            const uint32_t c = (uint32_t)(256 * (i & 3) + tid), row = c >> 3, ch = c & 7u;
            const uint4 v = *reinterpret_cast<const uint4 *>(stg + (i >> 2) * out_block(ST) + out_off(ST, row) + 16 * ch);
            uint8_t *dst = i < 4 ? p.o.codes + (r0 + row) * p.o.row_bytes + c0 : p.t.codes + (c0 + row) * p.t.row_bytes + r0;
            __stcs(reinterpret_cast<uint4 *>(dst + 16 * ch), v);
        }
    }
    if (!scs || (!side && !p.o.codes)) return; /* scales staged per unit, or no row-wise copy */
    const uint64_t keep = l2_keep_policy();
    if constexpr (mx) {
        st_keep(static_cast<uint8_t *>(scales) + (rb + u) * scols + (cb >> 5), scs[tid], keep);
        if (swz && u < 32) {
            const uint32_t *sc = scs + (side ? TILE : 0);
            st_keep(swz + dw_rule_swizzle_offset(rb, cb >> 5, scols) + 16 * u, make_uint4(sc[u], sc[u + 32], sc[u + 64], sc[u + 96]),
                    keep);
        }
    } else {
        st_keep(static_cast<float *>(scales) + (rb + u) * scols + (cb >> 7), scs[tid], keep);
    }
}

/* A unit's staged scales out (after a consumer barrier that follows the last tile's scale
 * writes): gs holds x's rows of the unit ([gh 128][tblock] words, word j = tile column j) and
 * then x^T's ([gw 128][tblock]); each row leaves as one run of 4 gw (x^T: 4 gh) bytes, one
 * 16- or 8-byte store where the run is whole and aligned. Both recipes have 4 scale bytes per
 * tile and row (MX: 4 codes, fp8_block: one float); outputs 4-byte aligned (the launch's check). */
/* Words of a unit's scale staging per copy (x's rows, then x^T's at this offset): g 128 rows of g
 * words; the launch reserves twice this (none for g = 1). */
__host__ __device__ constexpr uint32_t unit_scale_words(uint32_t g) { return g * g * TILE; }

template <int R>
__device__ __forceinline__ void flush_scales(const Params &p, const uint32_t *gs, const Unit &un, int tid) {
    constexpr uint32_t sb = Traits<R>::kind == K_MX ? 1 : 4; /* bytes per scale */
    const uint32_t g = (uint32_t)p.tblock, nr = p.o.codes ? un.gh * TILE : 0, nt = un.gw * TILE;
    const uint64_t keep = l2_keep_policy();
    for (uint32_t i = (uint32_t)tid; i < nr + nt; i += BK_CONS) {
        const bool side = i >= nr;
        const uint32_t row = side ? i - nr : i, n = side ? un.gh : un.gw;
        const uint32_t *src = gs + (side ? unit_scale_words(g) : 0) + row * g;
        uint8_t *const dst = side ? static_cast<uint8_t *>(p.t.scales) + (un.c0 + row) * p.t.scols * sb + (un.r0 >> 7) * 4
                                  : static_cast<uint8_t *>(p.o.scales) + (un.r0 + row) * p.o.scols * sb + (un.c0 >> 7) * 4;
        if (n == 4 && ((uintptr_t)dst & 15u) == 0) st_keep(dst, *reinterpret_cast<const uint4 *>(src), keep);
        else if (n == 2 && ((uintptr_t)dst & 7u) == 0) st_keep(dst, *reinterpret_cast<const uint2 *>(src), keep);
        else
#pragma unroll 1
            for (uint32_t j = 0; j < n; j++) st_keep(dst + 4 * j, src[j], keep);
    }
}

template <int R, int ST, int MINB = 2, bool CNT = false> /* MINB CTAs per SM: 2, or 3 (72 registers, some spilled) */
__global__ void __launch_bounds__(BK_THREADS, MINB) quant_bulk_kernel(const __grid_constant__ TileMaps m,
                                                                      const uint16_t *__restrict__ x, Params p,
                                                                      int64_t nunits, int stages) {
    constexpr bool staged = ST != ST_REG;
    constexpr uint32_t stage_bytes = (uint32_t)stage_bytes_of(ST);
    extern __shared__ __align__(128) unsigned char smem[];
    /* stages buffers from the first 128-byte boundary (tensor copies need it), then 2 x stages mbarriers */
    unsigned char *const ring = smem + ((128u - (smem_u32(smem) & 127u)) & 127u);
    __shared__ __align__(16) uint32_t part_r[2][2][TILE / 2]; /* [tile parity][warp % 2][row pair] */
    __shared__ __align__(16) uint32_t part_c[2][4][TILE / 2]; /* [tile parity][warp / 2][column pair] */
    __shared__ __align__(16) uint32_t scs[staged ? 2 * TILE : 1]; /* staged scales (bulk_tile) */
    uint64_t *const full = ring_init(ring, stages, stage_bytes), *const empty = full + stages;
    /* after the barriers: the unit's scales, [tblock 128][tblock] words for x then for x^T (tblock > 1),
     * then (ST_TMA_OWN) the staging, from a 128-byte boundary */
    uint32_t *const gs = reinterpret_cast<uint32_t *>(empty + stages);
    unsigned char *const own = reinterpret_cast<unsigned char *>(
        ((uintptr_t)(gs + (p.tblock > 1 ? 2 * unit_scale_words((uint32_t)p.tblock) : 0)) + 127) & ~(uintptr_t)127);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (warp == BK_CONS / 32) { /* producer: the n-th tile goes to buffer n % stages once it is free */
        int s = 0;
        uint32_t ph = 0, n = 0; /* parity of the ring's round, tiles so far */
        for (uint32_t u = blockIdx.x; u < (uint32_t)nunits; u += gridDim.x) {
            const Unit un = unit_of(u, p);
            for (uint32_t ti = 0, tj = 0; tj < un.gw; n++) { /* tile (ti, tj) of the unit, column by column */
                if (n >= (uint32_t)stages) {
                    if (lane == 0) mbar_wait<true>(&empty[s], ph ^ 1u);
                    __syncwarp();
                }
                if (elect_one()) { /* one lane: the tile in one tensor copy, or 128 row copies */
                    mbar_expect_tx(&full[s], BK_TILE);
                    const int64_t r0 = un.r0 + (int64_t)ti * TILE, c0 = un.c0 + (int64_t)tj * TILE;
                    unsigned char *buf = ring + (size_t)s * stage_bytes;
                    if (p.tma_in) {
                        tma_load_2d(buf, &m.x, &full[s], (int)c0, (int)r0);
                    } else {
                        const uint16_t *src = x + r0 * p.cols + c0;
#pragma unroll 4
                        for (int rr = 0; rr < TILE; rr++) bulk_g2s(buf + rr * BK_ROW, src + rr * p.cols, BK_ROW, &full[s]);
                    }
                }
                __syncwarp();
                if (++s == stages) s = 0, ph ^= 1u;
                if (++ti == un.gh) ti = 0, tj++;
            }
        }
        return;
    }
    const int tc = (lane & 7) + 8 * (warp & 1), tr = (lane >> 3) + 4 * (warp >> 1);
    const uint32_t g = (uint32_t)p.tblock;
    dwqc::Acc acc[2] = {};
    int s = 0, sp = 0; /* this tile's buffer, the previous tile's */
    uint32_t ph = 0, n = 0;
    for (uint32_t u = blockIdx.x; u < (uint32_t)nunits; u += gridDim.x) {
        const Unit un = unit_of(u, p);
        for (uint32_t ti = 0, tj = 0; tj < un.gw; n++) { /* tile (ti, tj) of the unit, as the producer's */
            mbar_wait(&full[s], ph);
            unsigned char *buf = ring + (size_t)s * stage_bytes;
            uint4 w[8];
#pragma unroll
            for (int k = 0; k < 8; k++) w[k] = *reinterpret_cast<const uint4 *>(buf + (8 * tr + k) * BK_ROW + 16 * tc);
            if constexpr (ST == ST_REG || ST == ST_TMA_OWN) { /* the buffer is free as soon as the warp has its pieces */
                __syncwarp();
                if (lane == 0) mbar_arrive(&empty[s]);
            } else if constexpr (ST == ST_BULK || ST == ST_TMA) { /* the previous tile's buffer, once its copies read it */
                if (n > 0) {
                    bulk_wait_read();
                    __syncwarp();
                    if (lane == 0) mbar_arrive(&empty[sp]);
                }
            }
            const int64_t r0 = un.r0 + (int64_t)ti * TILE, c0 = un.c0 + (int64_t)tj * TILE;
            ScaleSink sk = {nullptr, nullptr, 1};
            if (g > 1) sk = ScaleSink{gs + ti * TILE * g + tj, gs + unit_scale_words(g) + tj * TILE * g + ti, g};
            else if (staged) sk = ScaleSink{scs, scs + TILE, 1};
            unsigned char *const stg = ST == ST_TMA_OWN ? own : buf;
            bulk_tile<R, ST, CNT>(p, r0, c0, w, lane, warp, part_r[n & 1], part_c[n & 1], stg, sk, acc);
            if constexpr (staged) {
                /* the codes: ST_BULK's copies read them; ST_V16's buffer is next written by the
                 * producer's tensor copy, which must land after them. Only reads follow, so the
                 * fence stays ahead of the flush's global stores (it would wait for them). */
                fence_proxy_async();
                consumers_sync();
                flush_tile<R, ST>(p, m, r0, c0, stg, g > 1 ? nullptr : scs, tid);
                if constexpr (ST == ST_V16) { /* read back: the buffer is free */
                    __syncwarp();
                    if (lane == 0) mbar_arrive(&empty[s]);
                }
            }
            if (++ti == un.gh) ti = 0, tj++;
            if (g > 1 && tj == un.gw) { /* the unit's scales, once every consumer has written its share */
                if constexpr (!staged) consumers_sync();
                flush_scales<R>(p, gs, un, tid);
                /* the next unit's first scale writes must wait for these reads: bulk_tile has a barrier
                 * before them except for MX from registers */
                if constexpr (!staged && Traits<R>::kind == K_MX) consumers_sync();
            }
            sp = s;
            if (++s == stages) s = 0, ph ^= 1u;
        }
    }
    if constexpr (CNT) {
        __shared__ unsigned long long qsh[4 * (BK_CONS / 32)];
        unsigned long long *const pairs[2] = {p.o.cnt, p.t.cnt};
        dwqc::flush<BK_CONS / 32>(acc, pairs, (unsigned long long)(p.rows * p.cols), qsh, warp, lane,
                                  [] { consumers_sync(); });
    }
    if constexpr (ST == ST_BULK || tensor_stores(ST)) bulk_wait_all(); /* the shared source must outlive the copies */
}

/* Row-wise only (cols a multiple of the block): the tensor as a flat run of 8-element chunks,
 * BK_TILE bytes (2048 chunks) per ring stage; chunk g's codes at 8 g, its block's scale at 8 g / B.
 * Consumer thread t takes chunks t + 256 i (i < 8) of each stage: B / 8 neighbouring lanes share
 * a block; each block's rule is computed by one of them and broadcast. */
constexpr int64_t BK_STAGE_CHUNKS = BK_TILE / 16;

template <int R, bool CNT>
__global__ void __launch_bounds__(BK_THREADS, 2) quant_bulk_rows_kernel(const __grid_constant__ TileMaps,
                                                                        const uint16_t *__restrict__ x, Params p,
                                                                        int64_t nchunks, int stages) {
    constexpr int B = Traits<R>::B, L = B / 8; /* lanes per block: 4 (MX) or 16 (fp8_block) */
    constexpr bool mx = Traits<R>::kind == K_MX;
    extern __shared__ __align__(128) unsigned char smem[];
    uint64_t *const full = ring_init(smem, stages), *const empty = full + stages;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int64_t nstages = (nchunks + BK_STAGE_CHUNKS - 1) / BK_STAGE_CHUNKS;
    if (warp == BK_CONS / 32) { /* producer: 4 lanes copy a quarter of the stage each */
        int s = 0;
        uint32_t ph = 0;
        for (int64_t st = blockIdx.x, n = 0; st < nstages; st += gridDim.x, n++) {
            if (n >= stages) {
                if (lane == 0) mbar_wait<true>(&empty[s], ph ^ 1u);
                __syncwarp();
            }
            const int64_t g0 = st * BK_STAGE_CHUNKS, left = nchunks - g0;
            const uint32_t bytes = (uint32_t)(left < BK_STAGE_CHUNKS ? left : BK_STAGE_CHUNKS) * 16u;
            if (lane == 0) mbar_expect_tx(&full[s], bytes);
            __syncwarp();
            const uint32_t q0 = (uint32_t)lane * (BK_TILE / 4);
            if (lane < 4 && q0 < bytes) {
                const uint32_t qb = bytes - q0 < BK_TILE / 4 ? bytes - q0 : BK_TILE / 4;
                bulk_g2s(smem + (size_t)s * BK_TILE + q0, reinterpret_cast<const unsigned char *>(x + g0 * 8) + q0, qb,
                         &full[s]);
            }
            if (++s == stages) s = 0, ph ^= 1u;
        }
        return;
    }
    int s = 0;
    uint32_t ph = 0;
    dwqc::Acc acc[2] = {};
    for (int64_t st = blockIdx.x; st < nstages; st += gridDim.x) {
        mbar_wait(&full[s], ph);
        const int64_t g0 = st * BK_STAGE_CHUNKS;
        const uint4 *buf = reinterpret_cast<const uint4 *>(smem + (size_t)s * BK_TILE);
        uint4 w[8];
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = g0 + i * BK_CONS + tid < nchunks ? buf[i * BK_CONS + tid] : make_uint4(0, 0, 0, 0);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
        if (++s == stages) s = 0, ph ^= 1u;
        /* amax of each chunk, two chunks per word (chunk 2h low, 2h + 1 high), then over the block */
        uint32_t am[4];
        pair_amax(w, am);
#pragma unroll
        for (int o = 1; o < L; o <<= 1)
#pragma unroll
            for (int h = 0; h < 4; h++) am[h] = vmax2(am[h], __shfl_xor_sync(0xFFFFFFFFu, am[h], o));
        /* rules: MX, lane % 4 = q takes chunks 2q, 2q + 1; fp8_block, lane % 16 = i < 8 takes chunk i */
        constexpr int CPL = mx ? 2 : 1;
        const int gl = lane & (L - 1);
        const uint32_t apk = pick4(am, mx ? gl : (gl >> 1) & 3);
        Rule qs[CPL];
        float cs[CPL]; /* CNT: the blocks' scales as stored */
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            const int i = mx ? 2 * gl + c : gl; /* chunk index of this stage's 8 (fp8_block: valid when gl < 8) */
            float s32 = 0.0f;
            uint32_t s8 = 0;
            qs[c] = bulk_rule<R>(amax_f32(apk, mx ? c : gl & 1), p, &s32, &s8);
            cs[c] = CNT ? count_scale<R>(s32, s8) : 0.0f;
            const int64_t g = g0 + i * BK_CONS + tid;
            if ((mx || gl < 8) && g < nchunks) {
                const int64_t si = g * 8 / B;
                if constexpr (mx) {
                    static_cast<uint8_t *>(p.o.scales)[si] = (uint8_t)s8;
                    if (p.o.swz) p.o.swz[dw_rule_swizzle_offset(si / p.o.scols, si % p.o.scols, p.o.scols)] = (uint8_t)s8;
                } else {
                    static_cast<float *>(p.o.scales)[si] = s32;
                }
            }
        }
        uint2 *codes = reinterpret_cast<uint2 *>(p.o.codes) + g0 + tid;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const Rule q = shfl_rule<R>(qs[i % CPL], (lane & ~(L - 1)) | (i / CPL));
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = elem(w[i], j);
            if constexpr (CNT) {
                const float c = __shfl_sync(0xFFFFFFFFu, cs[i % CPL], (lane & ~(L - 1)) | (i / CPL));
                if (g0 + i * BK_CONS + tid < nchunks) {
                    const uint2 e = enc8<R>(q, v);
                    __stcs(codes + i * BK_CONS, e);
                    const uint32_t ew[2] = {e.x, e.y};
                    dwqc::test_n<8>(count_fmt<R>(), false, v, ew, c, 1.0f, acc[0]);
                }
            } else if (g0 + i * BK_CONS + tid < nchunks) {
                __stcs(codes + i * BK_CONS, enc8<R>(q, v));
            }
        }
    }
    if constexpr (CNT) {
        __shared__ unsigned long long qsh[4 * (BK_CONS / 32)];
        unsigned long long *const pairs[2] = {p.o.cnt, nullptr};
        dwqc::flush<BK_CONS / 32>(acc, pairs, (unsigned long long)(p.rows * p.cols), qsh, warp, lane,
                                  [] { consumers_sync(); });
    }
}

/* A ring kernel's launch shape: dynamic shared memory (the ring, its barriers and `extra` bytes:
 * slack for the kernel to align the ring, staging behind the barriers) and the persistent grid,
 * at most ctas_per_sm CTAs per SM (0 = as many as fit) and max_ctas in all, before the cap by the
 * work; grid 0 where no CTA fits (launch_ring refuses it). */
using ring_kernel = void (*)(const TileMaps, const uint16_t *, Params, int64_t, int);
struct RingShape {
    size_t smem;
    int64_t grid;
};
dw_status ring_shape(dw_ctx *ctx, ring_kernel k, std::atomic<uint64_t> (&cache)[16], int stages, size_t stage_bytes,
                     size_t extra, int ctas_per_sm, int max_ctas, RingShape *out) {
    const size_t smem = (size_t)stages * stage_bytes + 2 * (size_t)stages * sizeof(uint64_t) + extra;
    int sms = 0, per_sm = 0;
    DW_TRY(kernel_fit(ctx, (const void *)k, BK_THREADS, smem, cache, &sms, &per_sm));
    if (ctas_per_sm > 0 && ctas_per_sm < per_sm) per_sm = ctas_per_sm;
    int64_t grid = (int64_t)sms * per_sm;
    if (max_ctas > 0 && max_ctas < grid) grid = max_ctas;
    *out = RingShape{smem, grid};
    return DW_OK;
}

/* Ring kernel k over `work` units (tiles, units of tiles or stages; n is the kernel's count
 * argument) in the launch shape sh. */
dw_status launch_ring(dw_ctx *ctx, ring_kernel k, const RingShape &sh, dw_recipe r, const TileMaps &maps,
                      const uint16_t *x, const Params &p, int64_t work, int64_t n, int stages, cudaStream_t st) {
    if (sh.grid < 1)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "quantize %s: %d bulk stages (%zu bytes) do not fit in shared memory",
                            dw_recipe_name(r), stages, sh.smem);
    if (work > 0x7FFFFFFFLL)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "quantize %s: [%lld, %lld] is too large", dw_recipe_name(r),
                            (long long)p.rows, (long long)p.cols);
    const int64_t grid = sh.grid < work ? sh.grid : work;
    k<<<(unsigned)grid, BK_THREADS, sh.smem, st>>>(maps, x, p, n, stages);
    DW_CUDA_CHECK_LAUNCH(ctx, dw_recipe_name(r));
    return DW_OK;
}

/* The producer's one-copy tile loads: x [rows, cols] (BF16) in 128x128 boxes (else it copies
 * row by row). */
bool make_x_map(CUtensorMap *m, const uint16_t *x, int64_t rows, int64_t cols) {
    return dw_make_map_2d(m, x, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, rows, cols, cols, TILE, TILE, CU_TENSOR_MAP_SWIZZLE_NONE);
}

/* ST_TMA's stores: the 8-bit codes of x [rows, cols] and x^T [cols, rows] in 32-row boxes of 128
 * bytes (a warp's share of a staged tile); o's map only where the row-wise copy is written. */
bool make_code_maps(TileMaps *m, const Params &p) {
    if (p.o.codes && !dw_make_map_2d(&m->o, p.o.codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.rows, p.cols, p.o.row_bytes,
                                     128, 32, CU_TENSOR_MAP_SWIZZLE_NONE))
        return false;
    return dw_make_map_2d(&m->t, p.t.codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, p.cols, p.rows, p.t.row_bytes, 128, 32,
                          CU_TENSOR_MAP_SWIZZLE_NONE);
}

/* Whether the staged stores can write p's outputs: 16-byte aligned codes (and swizzled copies),
 * 4-byte aligned scale rows. */
bool staged_ok(const Params &p) {
    const void *ptrs[] = {p.o.codes, p.t.codes, p.o.swz, p.t.swz};
    for (const void *q : ptrs)
        if ((uintptr_t)q % 16 != 0) return false;
    return (uintptr_t)p.o.scales % 4 == 0 && (uintptr_t)p.t.scales % 4 == 0;
}

/* Units of g x g tiles over a grid of tr x tc tiles. */
int64_t tile_units(int64_t tr, int64_t tc, int g) { return ((tr + g - 1) / g) * ((tc + g - 1) / g); }

template <int R> dw_status launch_bulk_r(dw_ctx *ctx, const uint16_t *x, const Params &p_in, bool trans, BulkTune t,
                                         cudaStream_t st, bool *counted) {
    /* [3 CTAs, or counting][store - 1][log2 tblock] */
    static std::atomic<uint64_t> cache_t[3][5][3][16], cache_r[2][16];
    const bool cnt = p_in.o.cnt || p_in.t.cnt;
    TileMaps maps;
    memset(&maps, 0, sizeof maps);
    Params p = p_in;
    p.tma_in = false;
    p.tblock = 1;
    RingShape sh;
    if (trans) {
        p.tma_in = t.load != 1 && make_x_map(&maps.x, x, p.rows, p.cols);
        p.group = t.group ? t.group : BULK_GROUP_DEFAULT;
        const int64_t tr = p.rows / TILE, tc = p.tiles_c;
        int store = t.store ? t.store : BULK_STORE_DEFAULT;
        if (store != ST_REG && !staged_ok(p)) store = ST_REG;
        if (tensor_stores(store) && !make_code_maps(&maps, p)) store = ST_V16; /* no tensor stores: 16-byte stores */
        /* 3 or more CTAs per SM asked for: the kernels built for 3 (72 registers; 2 stages fit) */
        const bool three = t.ctas_per_sm >= 3;
        const int stages = t.stages ? t.stages : bulk_stages_default<R>(store, three);
        static const ring_kernel ks[2][5] = {
            {quant_bulk_kernel<R, ST_REG>, quant_bulk_kernel<R, ST_BULK>, quant_bulk_kernel<R, ST_V16>,
             quant_bulk_kernel<R, ST_TMA>, quant_bulk_kernel<R, ST_TMA_OWN>},
            {quant_bulk_kernel<R, ST_REG, 3>, quant_bulk_kernel<R, ST_BULK, 3>, quant_bulk_kernel<R, ST_V16, 3>,
             quant_bulk_kernel<R, ST_TMA, 3>, quant_bulk_kernel<R, ST_TMA_OWN, 3>}};
        /* counting builds: stores from registers or tensor stores from the kernel's own staging, 2 CTAs per SM */
        static const ring_kernel kc[5] = {quant_bulk_kernel<R, ST_REG, 2, true>, nullptr, nullptr, nullptr,
                                          quant_bulk_kernel<R, ST_TMA_OWN, 2, true>};
        const bool kcnt = cnt && !three && kc[store - 1];
        const ring_kernel k = kcnt ? kc[store - 1] : ks[three][store - 1];
        const int ci = kcnt ? 2 : three;
        *counted = kcnt;
        const size_t stage_bytes = stage_bytes_of(store);
        /* tile blocks: the runs need 4-byte aligned scales; the swizzled copies are written per tile */
        const bool blocks_ok = !p.o.swz && !p.t.swz && (uintptr_t)p.o.scales % 4 == 0 && (uintptr_t)p.t.scales % 4 == 0;
        /* the largest block whose busiest CTA takes the fewest tiles (a block whose staging does not
         * fit takes none; where none fits, launch_ring says so) */
        const int tblock = t.tblock ? t.tblock : bulk_tblock_default(store);
        int64_t best = -1;
        for (int gi = 2; gi >= 0; gi--) {
            const int g = 1 << gi;
            if (tblock ? g != (blocks_ok ? tblock : 1) : g > 1 && !blocks_ok) continue;
            RingShape c;
            DW_TRY(ring_shape(ctx, k, cache_t[ci][store - 1][gi], stages, stage_bytes,
                              128 + (g > 1 ? 2 * sizeof(uint32_t) * unit_scale_words((uint32_t)g) : 0) +
                                  (store == ST_TMA_OWN ? 128 + 2 * (size_t)out_block(ST_TMA_OWN) : 0),
                              t.ctas_per_sm,
                              t.max_ctas, &c));
            const int64_t load = c.grid > 0 ? (tile_units(tr, tc, g) + c.grid - 1) / c.grid * g * g : INT64_MAX;
            if (best < 0 || load < best) best = load, sh = c, p.tblock = g;
        }
        const int64_t units = tile_units(tr, tc, p.tblock);
        return launch_ring(ctx, k, sh, (dw_recipe)R, maps, x, p, units, units, stages, st);
    }
    const int64_t nchunks = p.rows * p.cols / 8;
    const int stages = t.stages ? t.stages : 3;
    const ring_kernel k = cnt ? quant_bulk_rows_kernel<R, true> : quant_bulk_rows_kernel<R, false>;
    *counted = cnt;
    DW_TRY(ring_shape(ctx, k, cache_r[cnt], stages, BK_TILE, 0, t.ctas_per_sm, t.max_ctas, &sh));
    return launch_ring(ctx, k, sh, (dw_recipe)R, maps, x, p, (nchunks + BK_STAGE_CHUNKS - 1) / BK_STAGE_CHUNKS, nchunks,
                       stages, st);
}

} /* namespace */

bool bulk_eligible(dw_recipe r, const Params &p, const void *x, bool trans) {
    const bool recipe = r == DW_RECIPE_MXFP8 || r == DW_RECIPE_MXFP8_E5M2 || r == DW_RECIPE_FP8_BLOCK;
    if (!recipe || (uintptr_t)x % 16 != 0 || (uintptr_t)p.o.codes % 8 != 0) return false;
    if (!trans) return p.cols % (r == DW_RECIPE_FP8_BLOCK ? 128 : 32) == 0;
    return p.rows % TILE == 0 && p.cols % TILE == 0 && p.t.codes && (uintptr_t)p.t.codes % 8 == 0;
}

dw_status launch_bulk(dw_ctx *ctx, dw_recipe r, const uint16_t *x, const Params &p, bool trans, const BulkTune &t,
                      cudaStream_t st, bool *counted) {
    *counted = false;
    if (t.store < 0 || t.store > 5 || t.load < 0 || t.load > 2 || t.group < 0 || t.group > 64 ||
        (t.tblock != 0 && t.tblock != 1 && t.tblock != 2 && t.tblock != 4) || (t.stages != 0 && (t.stages < 2 || t.stages > 6)))
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "quantize %s: bulk store %d, load %d, group %d, tile block %d or stages %d out of range",
                            dw_recipe_name(r), t.store, t.load, t.group, t.tblock, t.stages);
    switch (r) {
    case DW_RECIPE_MXFP8: return launch_bulk_r<DW_RECIPE_MXFP8>(ctx, x, p, trans, t, st, counted);
    case DW_RECIPE_MXFP8_E5M2: return launch_bulk_r<DW_RECIPE_MXFP8_E5M2>(ctx, x, p, trans, t, st, counted);
    case DW_RECIPE_FP8_BLOCK: return launch_bulk_r<DW_RECIPE_FP8_BLOCK>(ctx, x, p, trans, t, st, counted);
    default: return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "quantize %s: no bulk-copy kernel", dw_recipe_name(r));
    }
}

} /* namespace dwq */
