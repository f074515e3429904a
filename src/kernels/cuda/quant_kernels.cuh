/* quant_kernels.cuh — the quantisation kernels of quant.cu's entry point (quant.h) and their
 * launchers, as templates over the input type; built once per type, by quant_in_bf16.cu and
 * quant_in_f32.cu (one translation unit each, so that a build compiles the two in parallel: as one
 * file they took ~6 minutes of one core). Row-wise only, when no block straddles a row: a flat
 * grid-stride kernel over 8-element chunks. Otherwise (transposed copy, fp8_block2d, ragged
 * shapes): 128x128 tiles, streamed by cp.async through a ring of shared-memory buffers on a
 * persistent grid (one tile per CTA from registers when rows are not 16-byte aligned); row-wise
 * codes and the transposed copy both come from the staged tile. Block scales also go to cuBLAS's
 * 128x4 layout on request. Scale rules are formats/rules.h's (the CPU reference's own, plus a
 * division-free MX exponent proven equal); x / s is one FP32 rounding computed through the block's
 * reciprocal (quot_q); elements use the hardware conversions (E4M3/E5M2) or exact comparisons
 * (E2M1). fp8_tensor, fp8_row and nvfp4 run an amax pass first. The kernels built with CNT also
 * count each copy's overflows and underflows from the values and codes in registers
 * (precision/quant_counts.cuh), one atomic per CTA and counter at the end. CUDA C++ only; only
 * quant*.cu include it. */
#ifndef DW_KERNELS_CUDA_QUANT_KERNELS_CUH
#define DW_KERNELS_CUDA_QUANT_KERNELS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

extern "C" { /* core/ headers are C without linkage guards; cuda_runtime.h above is already in */
#include "core/cuda_check.h"
#include "core/error.h"
}
#include "kernels/cuda/quant_common.cuh"
#include "precision/amax_rules.h"
#include "precision/quant_counts.h"

namespace {

using namespace dwq;

/* ---- loads: 8 consecutive elements of a row, kept raw in registers ---------------------- */

template <typename TIn> struct Raw;
template <> struct Raw<uint16_t> { uint4 w; };   /* 8 BF16 codes */
template <> struct Raw<float> { float4 a, b; };  /* 8 floats */

__device__ __forceinline__ void load_raw(const uint16_t *__restrict__ x, const Params &p, int64_t r, int64_t c,
                                         Raw<uint16_t> &out) {
    if (r < p.rows && p.vec_in && c + 8 <= p.cols) {
        out.w = __ldcs(reinterpret_cast<const uint4 *>(x + r * p.cols + c));
    } else {
        uint32_t h[8];
#pragma unroll
        for (int i = 0; i < 8; i++) h[i] = (r < p.rows && c + i < p.cols) ? x[r * p.cols + c + i] : 0u;
        out.w = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
    }
}
__device__ __forceinline__ void load_raw(const float *__restrict__ x, const Params &p, int64_t r, int64_t c,
                                         Raw<float> &out) {
    if (r < p.rows && p.vec_in && c + 8 <= p.cols) {
        const float4 *q = reinterpret_cast<const float4 *>(x + r * p.cols + c);
        out.a = __ldcs(q);
        out.b = __ldcs(q + 1);
    } else {
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = (r < p.rows && c + i < p.cols) ? x[r * p.cols + c + i] : 0.0f;
        out.a = make_float4(v[0], v[1], v[2], v[3]);
        out.b = make_float4(v[4], v[5], v[6], v[7]);
    }
}
__device__ __forceinline__ void to_f32(const Raw<uint16_t> &r, float v[8]) {
    const uint32_t w[4] = {r.w.x, r.w.y, r.w.z, r.w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
}
__device__ __forceinline__ void to_f32(const Raw<float> &r, float v[8]) {
    v[0] = r.a.x, v[1] = r.a.y, v[2] = r.a.z, v[3] = r.a.w, v[4] = r.b.x, v[5] = r.b.y, v[6] = r.b.z, v[7] = r.b.w;
}

/* The tile in shared memory for the transposed pass, row-major without padding: the row pass
 * stores 16-byte pieces; the transposed pass reads one 4-byte (BF16) or 8-byte (FP32) column
 * pair per lane, consecutive lanes on consecutive pairs of the same row: no bank conflicts. */
template <typename TIn> struct Smem;
template <> struct Smem<uint16_t> {
    static constexpr size_t bytes = (size_t)TILE * TILE * 2;
    __device__ static void put(void *s, int r, int chunk, const Raw<uint16_t> &v) {
        reinterpret_cast<uint4 *>(s)[r * (TILE / 8) + chunk] = v.w;
    }
    __device__ static void get(const void *s, int r, int chunk, Raw<uint16_t> &v) {
        v.w = reinterpret_cast<const uint4 *>(s)[r * (TILE / 8) + chunk];
    }
    __device__ static void pair(const void *s, int r, int pair, float *c0, float *c1) {
        uint32_t w = reinterpret_cast<const uint32_t *>(s)[r * (TILE / 2) + pair];
        *c0 = __uint_as_float(w << 16), *c1 = __uint_as_float(w & 0xFFFF0000u);
    }
    __device__ static float elem(const void *s, int r, int col) {
        return __uint_as_float((uint32_t)reinterpret_cast<const uint16_t *>(s)[r * TILE + col] << 16);
    }
};
template <> struct Smem<float> {
    static constexpr size_t bytes = (size_t)TILE * TILE * 4;
    __device__ static void put(void *s, int r, int chunk, const Raw<float> &v) {
        float4 *d = reinterpret_cast<float4 *>(s) + r * (TILE / 4) + 2 * chunk;
        d[0] = v.a, d[1] = v.b;
    }
    __device__ static void get(const void *s, int r, int chunk, Raw<float> &v) {
        const float4 *d = reinterpret_cast<const float4 *>(s) + r * (TILE / 4) + 2 * chunk;
        v.a = d[0], v.b = d[1];
    }
    __device__ static void pair(const void *s, int r, int pair, float *c0, float *c1) {
        float2 f = reinterpret_cast<const float2 *>(s)[r * (TILE / 2) + pair];
        *c0 = f.x, *c1 = f.y;
    }
    __device__ static float elem(const void *s, int r, int col) { return reinterpret_cast<const float *>(s)[r * TILE + col]; }
};

/* ---- the quantisation kernel ------------------------------------------------------------ */

/* Row-wise codes of x[r, c .. c+7] (8 elements, one block rule q), also left in w8; false (nothing
 * encoded) outside x. */
template <int FMT> __device__ __forceinline__ bool store_row8(const OutDesc &o, const Params &p, int64_t r,
                                                               int64_t c, const float v[8], const Q &q, uint32_t w8[2]) {
    if (r >= p.rows || c >= p.cols) return false;
    encode8<FMT>(q, v, w8);
    if constexpr (FMT == F_E2M1) {
        const uint32_t w = w8[0];
        uint8_t *dst = o.codes + r * o.row_bytes + c / 2;
        if (p.vec_out && c + 8 <= p.cols) {
            *reinterpret_cast<uint32_t *>(dst) = w;
        } else {
            for (int i = 0; i < 4 && c + 2 * i < p.cols; i++)
                dst[i] = (uint8_t)((w >> (8 * i)) & (c + 2 * i + 1 < p.cols ? 0xFFu : 0x0Fu));
        }
    } else {
        const uint32_t w0 = w8[0], w1 = w8[1];
        uint8_t *dst = o.codes + r * o.row_bytes + c;
        if (p.vec_out && c + 8 <= p.cols) {
            *reinterpret_cast<uint2 *>(dst) = make_uint2(w0, w1);
        } else {
            for (int i = 0; i < 8 && c + i < p.cols; i++)
                dst[i] = (uint8_t)((i < 4 ? w0 : w1) >> (8 * (i & 3)));
        }
    }
    return true;
}

/* 32 transposed 8-bit codes (one column of x, rows 0-31 of v) under rules q0 (rows 0-15) and q1. */
template <int FMT> __device__ __forceinline__ void col_codes32(const float v[32], const Q &q0, const Q &q1,
                                                                uint32_t w[8]) {
    encode_n<FMT, 16>(q0, v, w);
    encode_n<FMT, 16>(q1, v + 16, w + 4);
}

/* The same codes (any format) stored straight to global memory: x^T's row cg, columns rb .. rb+31;
 * also left in w (E2M1: rows 16-31 from w[2]); false (nothing encoded) outside x. */
template <int FMT> __device__ __forceinline__ bool store_col32(const OutDesc &t, const Params &p, int64_t cg,
                                                                int64_t rb, const float v[32], const Q &q0,
                                                                const Q &q1, uint32_t w[8]) {
    if (cg >= p.cols || rb >= p.rows) return false;
    if constexpr (FMT == F_E2M1) {
        encode_n<FMT, 16>(q0, v, w);
        encode_n<FMT, 16>(q1, v + 16, w + 2);
        uint8_t *dst = t.codes + cg * t.row_bytes + rb / 2;
        if (p.vec_out_t && rb + 32 <= p.rows) {
            *reinterpret_cast<uint4 *>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
            for (int i = 0; i < 16 && rb + 2 * i < p.rows; i++)
                dst[i] = (uint8_t)((w[i / 4] >> (8 * (i & 3))) & (rb + 2 * i + 1 < p.rows ? 0xFFu : 0x0Fu));
        }
    } else {
        col_codes32<FMT>(v, q0, q1, w);
        uint8_t *dst = t.codes + cg * t.row_bytes + rb;
        if (p.vec_out_t && rb + 32 <= p.rows) {
            reinterpret_cast<uint4 *>(dst)[0] = make_uint4(w[0], w[1], w[2], w[3]);
            reinterpret_cast<uint4 *>(dst)[1] = make_uint4(w[4], w[5], w[6], w[7]);
        } else {
            for (int i = 0; i < 32 && rb + i < p.rows; i++) dst[i] = (uint8_t)(w[i / 4] >> (8 * (i & 3)));
        }
    }
    return true;
}

__device__ __forceinline__ void put_scale(const OutDesc &o, bool f32, int64_t sr, int64_t sc, float s32,
                                          uint32_t s8) {
    if (f32) {
        static_cast<float *>(o.scales)[sr * o.scols + sc] = s32;
    } else {
        static_cast<uint8_t *>(o.scales)[sr * o.scols + sc] = (uint8_t)s8;
        if (o.swz) o.swz[dw_rule_swizzle_offset(sr, sc, o.scols)] = (uint8_t)s8;
    }
}

/* One tile (each thread: rows r0 + 16 * pass + tid / 16, columns c0 + 8 * (tid % 16) .. +7),
 * already loaded into raw[PASSES], or (STAGED) already in smem, row-major, raw unused. CNT: the
 * overflows and underflows of the row-wise and transposed codes added to acc[0], acc[1]. */
template <typename TIn, int R, bool TRANS, bool STAGED, bool CNT = false>
__device__ __forceinline__ void quant_tile(const Params &p, int64_t tile, const Raw<TIn> *raw,
                                           unsigned char *smem, uint32_t *red, uint32_t (*part)[TILE],
                                           dwqc::Acc (&acc)[2]) {
    constexpr int kind = Traits<R>::kind, B = Traits<R>::B, fmt = Traits<R>::fmt;
    constexpr dwqc::Fmt cf = count_fmt<R>();
    constexpr bool f32s = kind == K_TENSOR || kind == K_ROW || kind == K_BLOCK || kind == K_BLOCK2D;
    const int tid = threadIdx.x, lane16 = tid & 15;
    const int64_t r0 = tile / p.tiles_c * TILE, c0 = tile % p.tiles_c * TILE;
    const int64_t c = c0 + lane16 * 8;
    /* this thread's 8 elements of pass ps: from registers, or read from the staged tile when needed */
    auto raw_at = [&](int ps) {
        if constexpr (STAGED) {
            Raw<TIn> v;
            Smem<TIn>::get(smem, ps * ROWS_PER_PASS + (tid >> 4), lane16, v);
            return v;
        } else {
            return raw[ps];
        }
    };

    if constexpr (TRANS && !STAGED) {
#pragma unroll
        for (int ps = 0; ps < PASSES; ps++) Smem<TIn>::put(smem, ps * ROWS_PER_PASS + (tid >> 4), lane16, raw[ps]);
    }

    /* fp8_block2d: one amax for the whole tile */
    Q q2d = {};
    float s2d = 0.0f;
    if constexpr (kind == K_BLOCK2D) {
        uint32_t m = 0;
#pragma unroll
        for (int ps = 0; ps < PASSES; ps++) {
            float v[8];
            to_f32(raw_at(ps), v);
#pragma unroll
            for (int i = 0; i < 8; i++) m = max(m, abs_bits(v[i]));
        }
        m = group_max<32>(m);
        if ((tid & 31) == 0) red[tid >> 5] = m;
        __syncthreads();
        m = red[0];
#pragma unroll
        for (int w = 1; w < THREADS / 32; w++) m = max(m, red[w]);
        uint32_t dummy;
        q2d = block_q<R>(m, 0.0f, p, &s2d, &dummy);
        if (tid == 0) {
            put_scale(p.o, true, r0 / TILE, c0 / TILE, s2d, 0);
            if constexpr (TRANS) put_scale(p.t, true, c0 / TILE, r0 / TILE, s2d, 0);
        }
    }
    float ext = 0.0f;
    if constexpr (kind == K_TENSOR) ext = static_cast<const float *>(p.o.scales)[0];
    if constexpr (kind == K_NV) ext = p.o.tscale[0];

    /* row-wise */
#pragma unroll
    for (int ps = 0; ps < PASSES; ps++) {
        const int64_t r = r0 + ps * ROWS_PER_PASS + (tid >> 4);
        float v[8];
        to_f32(raw_at(ps), v);
        Q q;
        float cs = s2d; /* the block's scale, for counting */
        if constexpr (kind == K_BLOCK2D) {
            q = q2d;
        } else {
            uint32_t m = 0;
            if constexpr (B > 0) m = chunk_amax<B>(v);
            float e = ext;
            if constexpr (kind == K_ROW) e = r < p.rows ? static_cast<const float *>(p.o.scales)[r] : 1.0f;
            float s32 = 0.0f;
            uint32_t s8 = 0;
            q = block_q<R>(m, e, p, &s32, &s8);
            if constexpr (B > 0)
                if (lane16 % (B / 8) == 0 && r < p.rows && c < p.cols) put_scale(p.o, f32s, r, c / B, s32, s8);
            cs = count_scale<R>(s32, s8);
        }
        uint32_t w8[2];
        if (store_row8<fmt>(p.o, p, r, c, v, q, w8) && CNT) dwqc::test_n<8>(cf, kind == K_NV, v, w8, cs, ext, acc[0]);
    }

    if constexpr (TRANS) {
        if constexpr (!STAGED) __syncthreads();
        const int pp = tid & 63, qq = tid >> 6; /* column pair, 32-row quarter */
        const int64_t rb = r0 + 32 * qq;
        uint32_t am[2][2] = {{0, 0}, {0, 0}}; /* [column][16-row half]; the values are read again below */
#pragma unroll
        for (int i = 0; i < 32; i++) {
            float a0, a1;
            Smem<TIn>::pair(smem, 32 * qq + i, pp, &a0, &a1);
            am[0][i / 16] = max(am[0][i / 16], abs_bits(a0));
            am[1][i / 16] = max(am[1][i / 16], abs_bits(a1));
        }
        if constexpr (B == 128) {
#pragma unroll
            for (int k = 0; k < 2; k++) part[qq][2 * pp + k] = max(am[k][0], am[k][1]);
            __syncthreads();
        }
        const float ext_t = kind == K_TENSOR ? static_cast<const float *>(p.t.scales)[0] : ext;
        /* 8-bit codes of whole tiles go through shared memory (the staged tile's own buffer, read
         * by now) and leave as full 128-byte rows of x^T; others are stored from registers */
        const bool via_smem = STAGED && fmt != F_E2M1 && p.t_smem && p.vec_out_t && r0 + TILE <= p.rows &&
                              c0 + TILE <= p.cols;
        uint32_t wk[2][8];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int64_t cg = c0 + 2 * pp + k; /* a column of x = a row of x^T */
            Q q0, q1;
            float s32 = 0.0f, cs0 = s2d, cs1 = s2d; /* cs: the two blocks' scales, for counting */
            uint32_t s8 = 0;
            if constexpr (kind == K_BLOCK2D) {
                q0 = q1 = q2d;
            } else if constexpr (B == 0) {
                float e = ext_t;
                if constexpr (kind == K_ROW) e = cg < p.cols ? static_cast<const float *>(p.t.scales)[cg] : 1.0f;
                q0 = q1 = block_q<R>(0, e, p, &s32, &s8);
            } else if constexpr (B == 128) {
                uint32_t m = max(max(part[0][2 * pp + k], part[1][2 * pp + k]), max(part[2][2 * pp + k], part[3][2 * pp + k]));
                q0 = q1 = block_q<R>(m, ext_t, p, &s32, &s8);
                if (qq == 0 && cg < p.cols) put_scale(p.t, f32s, cg, r0 / B, s32, s8);
            } else if constexpr (B == 32) {
                q0 = q1 = block_q<R>(max(am[k][0], am[k][1]), ext_t, p, &s32, &s8);
                if (cg < p.cols && rb < p.rows) put_scale(p.t, f32s, cg, rb / 32, s32, s8);
            } else { /* B == 16 */
                q0 = block_q<R>(am[k][0], ext_t, p, &s32, &s8);
                if (cg < p.cols && rb < p.rows) put_scale(p.t, f32s, cg, rb / 16, s32, s8);
                cs0 = count_scale<R>(s32, s8);
                q1 = block_q<R>(am[k][1], ext_t, p, &s32, &s8);
                if (cg < p.cols && rb + 16 < p.rows) put_scale(p.t, f32s, cg, rb / 16 + 1, s32, s8);
            }
            if constexpr (kind != K_BLOCK2D && B != 16) cs0 = cs1 = count_scale<R>(s32, s8);
            if constexpr (B == 16) cs1 = count_scale<R>(s32, s8);
            float col[32];
#pragma unroll
            for (int i = 0; i < 32; i++) col[i] = Smem<TIn>::elem(smem, 32 * qq + i, 2 * pp + k);
            uint32_t wc[8];
            bool coded;
            if (via_smem) col_codes32<fmt>(col, q0, q1, wk[k]), coded = true;
            else coded = store_col32<fmt>(p.t, p, cg, rb, col, q0, q1, wc);
            if (CNT && coded) {
                const uint32_t *w = via_smem ? wk[k] : wc;
                dwqc::test_n<16>(cf, kind == K_NV, col, w, cs0, ext_t, acc[1]);
                dwqc::test_n<16>(cf, kind == K_NV, col + 16, w + (fmt == F_E2M1 ? 2 : 4), cs1, ext_t, acc[1]);
            }
        }
        if constexpr (STAGED && fmt != F_E2M1) {
            if (via_smem) { /* tile-uniform; x^T tile [128 cols of x][128 bytes], 16-byte pieces XOR-swizzled */
                __syncthreads();
#pragma unroll
                for (int k = 0; k < 2; k++) {
                    const int cl = 2 * pp + k, sw = (cl >> 1) & 7;
                    uint4 *row = reinterpret_cast<uint4 *>(smem + cl * TILE);
                    row[(2 * qq) ^ sw] = make_uint4(wk[k][0], wk[k][1], wk[k][2], wk[k][3]);
                    row[(2 * qq + 1) ^ sw] = make_uint4(wk[k][4], wk[k][5], wk[k][6], wk[k][7]);
                }
                __syncthreads();
#pragma unroll
                for (int i = 0; i < TILE * TILE / 16 / THREADS; i++) {
                    const int idx = i * THREADS + tid, cl = idx >> 3, ch = idx & 7;
                    const uint4 v = reinterpret_cast<const uint4 *>(smem + cl * TILE)[ch ^ ((cl >> 1) & 7)];
                    *reinterpret_cast<uint4 *>(p.t.codes + (c0 + cl) * p.t.row_bytes + r0 + 16 * ch) = v;
                }
            }
        }
    }
}

/* One CTA per 128x128 tile: used for the transposed copy, fp8_block2d and ragged shapes. */
template <typename TIn, int R, bool TRANS>
__global__ void __launch_bounds__(THREADS, sizeof(TIn) == 2 ? 3 : 2) quant_tile_kernel(const TIn *__restrict__ x, Params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ uint32_t red[THREADS / 32];
    __shared__ uint32_t part[4][TILE]; /* fp8_block, transposed: amax of each 32-row quarter of each column */
    const int tid = threadIdx.x;
    const int64_t tile = blockIdx.x;
    const int64_t r0 = tile / p.tiles_c * TILE, c = tile % p.tiles_c * TILE + (tid & 15) * 8;
    Raw<TIn> raw[PASSES];
#pragma unroll
    for (int ps = 0; ps < PASSES; ps++) load_raw(x, p, r0 + ps * ROWS_PER_PASS + (tid >> 4), c, raw[ps]);
    dwqc::Acc acc[2] = {};
    quant_tile<TIn, R, TRANS, false>(p, tile, raw, smem, red, part, acc);
}

/* The same tiles on a persistent grid with the input staged through a ring of `stages` tile
 * buffers in shared memory by cp.async (16-byte pieces, zero-filled outside the tensor), so that
 * the next tiles stream in while this one is quantised; needs 16-byte aligned rows (p.vec_in). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool ok) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait(int pending) { /* the newest `pending` groups may still run */
    if (pending >= 2) asm volatile("cp.async.wait_group 2;\n" ::: "memory");
    else if (pending == 1) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    else asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

template <typename TIn> __device__ __forceinline__ void stage_tile(const TIn *__restrict__ x, const Params &p,
                                                                   int64_t tile, unsigned char *buf) {
    constexpr int per_row = TILE * (int)sizeof(TIn) / 16, elems = 16 / (int)sizeof(TIn); /* 16-byte pieces */
    const int64_t r0 = tile / p.tiles_c * TILE, c0 = tile % p.tiles_c * TILE;
#pragma unroll
    for (int k = 0; k < TILE * per_row / THREADS; k++) {
        const int piece = k * THREADS + threadIdx.x, rr = piece / per_row, cc = piece % per_row * elems;
        const bool ok = r0 + rr < p.rows && c0 + cc < p.cols;
        cp_async16(buf + (size_t)piece * 16, ok ? x + (r0 + rr) * p.cols + c0 + cc : x, ok);
    }
}

template <typename TIn, int R, bool TRANS, bool CNT>
__global__ void __launch_bounds__(THREADS, sizeof(TIn) == 2 ? 3 : 1) quant_tile_pipe_kernel(const TIn *__restrict__ x, Params p,
                                                                     int64_t ntiles, int stages) {
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ uint32_t red[THREADS / 32];
    __shared__ uint32_t part[4][TILE];
    int64_t next = blockIdx.x;
    for (int s = 0; s < stages - 1; s++, next += gridDim.x) {
        if (next < ntiles) stage_tile(x, p, next, smem + (size_t)s * Smem<TIn>::bytes);
        cp_async_commit();
    }
    int cur = 0;
    dwqc::Acc acc[2] = {};
    for (int64_t tile = blockIdx.x; tile < ntiles; tile += gridDim.x, next += gridDim.x) {
        cp_async_wait(stages - 2); /* this thread's pieces of `tile` have landed */
        __syncthreads();           /* everyone's have, and the buffer refilled below is free */
        const int fill = (cur + stages - 1) % stages;
        if (next < ntiles) stage_tile(x, p, next, smem + (size_t)fill * Smem<TIn>::bytes);
        cp_async_commit();
        quant_tile<TIn, R, TRANS, true, CNT>(p, tile, nullptr, smem + (size_t)cur * Smem<TIn>::bytes, red, part, acc);
        cur = cur + 1 == stages ? 0 : cur + 1;
    }
    cp_async_wait(0);
    if constexpr (CNT) {
        __shared__ unsigned long long qsh[4 * (THREADS / 32)];
        unsigned long long *const pairs[2] = {p.o.cnt, p.t.cnt};
        dwqc::flush<THREADS / 32>(acc, pairs, (unsigned long long)(p.rows * p.cols), qsh, threadIdx.x >> 5,
                                  threadIdx.x & 31, [] { __syncthreads(); });
    }
}

/* Row-wise only, when blocks never straddle rows (cols % block == 0) and rows are 16-byte aligned:
 * the tensor is a flat run of 8-element chunks; chunk g's codes sit at g * 8 (g * 4 for FP4) and
 * its block's scale at g * 8 / B. Grid-stride loop, UNROLL independent chunks per thread. */
constexpr int UNROLL = 4;

__device__ __forceinline__ void load_chunk(const uint16_t *__restrict__ x, int64_t g, bool ok, Raw<uint16_t> &r) {
    r.w = ok ? __ldcs(reinterpret_cast<const uint4 *>(x) + g) : make_uint4(0, 0, 0, 0);
}
__device__ __forceinline__ void load_chunk(const float *__restrict__ x, int64_t g, bool ok, Raw<float> &r) {
    const float4 *q = reinterpret_cast<const float4 *>(x) + 2 * g;
    r.a = ok ? __ldcs(q) : make_float4(0, 0, 0, 0);
    r.b = ok ? __ldcs(q + 1) : make_float4(0, 0, 0, 0);
}

template <typename TIn, int R, bool CNT>
__global__ void __launch_bounds__(THREADS) quant_rows_kernel(const TIn *__restrict__ x, Params p, int64_t nchunks) {
    constexpr int kind = Traits<R>::kind, B = Traits<R>::B, fmt = Traits<R>::fmt;
    dwqc::Acc acc[2] = {};
    constexpr bool f32s = kind == K_TENSOR || kind == K_ROW || kind == K_BLOCK;
    const int tid = threadIdx.x;
    float ext = 0.0f;
    if constexpr (kind == K_TENSOR) ext = static_cast<const float *>(p.o.scales)[0];
    if constexpr (kind == K_NV) ext = p.o.tscale[0];
    const int64_t step = (int64_t)gridDim.x * THREADS * UNROLL;
    for (int64_t base = (int64_t)blockIdx.x * THREADS * UNROLL; base < nchunks; base += step) {
        Raw<TIn> raw[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t g = base + u * THREADS + tid;
            load_chunk(x, g, g < nchunks, raw[u]);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int64_t g = base + u * THREADS + tid;
            const bool ok = g < nchunks;
            float v[8];
            to_f32(raw[u], v);
            uint32_t m = 0;
            if constexpr (B > 0) m = chunk_amax<B>(v);
            float e = ext;
            if constexpr (kind == K_ROW) e = ok ? static_cast<const float *>(p.o.scales)[g * 8 / p.cols] : 1.0f;
            float s32 = 0.0f;
            uint32_t s8 = 0;
            Q q = block_q<R>(m, e, p, &s32, &s8);
            if (!ok) continue;
            if constexpr (B > 0) {
                if (tid % (B / 8) == 0) {
                    const int64_t si = g * 8 / B;
                    if (f32s) {
                        static_cast<float *>(p.o.scales)[si] = s32;
                    } else {
                        static_cast<uint8_t *>(p.o.scales)[si] = (uint8_t)s8;
                        if (p.o.swz) p.o.swz[dw_rule_swizzle_offset(si / p.o.scols, si % p.o.scols, p.o.scols)] = (uint8_t)s8;
                    }
                }
            }
            uint32_t w[2];
            encode8<fmt>(q, v, w);
            if constexpr (fmt == F_E2M1) reinterpret_cast<uint32_t *>(p.o.codes)[g] = w[0];
            else reinterpret_cast<uint2 *>(p.o.codes)[g] = make_uint2(w[0], w[1]);
            if constexpr (CNT) dwqc::test_n<8>(count_fmt<R>(), kind == K_NV, v, w, count_scale<R>(s32, s8), ext, acc[0]);
        }
    }
    if constexpr (CNT) {
        __shared__ unsigned long long qsh[4 * (THREADS / 32)];
        unsigned long long *const pairs[2] = {p.o.cnt, nullptr};
        dwqc::flush<THREADS / 32>(acc, pairs, (unsigned long long)(p.rows * p.cols), qsh, tid >> 5, tid & 31,
                                  [] { __syncthreads(); });
    }
}

/* ---- amax pass (fp8_tensor, fp8_row, nvfp4) and scale finalisation ------------------------ */

template <typename TIn, bool ROWS, bool COLS>
__global__ void __launch_bounds__(THREADS) amax_kernel(const TIn *__restrict__ x, Params p, uint32_t *g_amax,
                                                      uint32_t *row_amax, uint32_t *col_amax) {
    __shared__ uint32_t scol[TILE];
    __shared__ uint32_t red[THREADS / 32];
    const int tid = threadIdx.x, lane16 = tid & 15;
    const int64_t tile = blockIdx.x;
    const int64_t r0 = tile / p.tiles_c * TILE, c0 = tile % p.tiles_c * TILE;
    const int64_t c = c0 + lane16 * 8;
    if (COLS && tid < TILE) scol[tid] = 0;
    uint32_t all = 0, cm[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll 2
    for (int ps = 0; ps < PASSES; ps++) {
        const int64_t r = r0 + ps * ROWS_PER_PASS + (tid >> 4);
        Raw<TIn> raw;
        load_raw(x, p, r, c, raw);
        float v[8];
        to_f32(raw, v);
        uint32_t m = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t a = abs_bits(v[i]);
            m = max(m, a);
            cm[i] = max(cm[i], a);
        }
        all = max(all, m);
        if (ROWS) {
            m = group_max<16>(m);
            if (lane16 == 0 && r < p.rows) atomicMax(&row_amax[r], m);
        }
    }
    __syncthreads();
    if (COLS)
#pragma unroll
        for (int i = 0; i < 8; i++) atomicMax(&scol[lane16 * 8 + i], cm[i]);
    all = group_max<32>(all);
    if ((tid & 31) == 0) red[tid >> 5] = all;
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < THREADS / 32; w++) all = max(all, red[w]);
        atomicMax(g_amax, all);
    }
    if (COLS && tid < TILE && c0 + tid < p.cols) atomicMax(&col_amax[c0 + tid], scol[tid]);
}

template <int R>
__global__ void finalize_kernel(Params p, bool trans, const uint32_t *g_amax, const uint32_t *row_amax,
                                const uint32_t *col_amax) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    constexpr int kind = Traits<R>::kind;
    if constexpr (kind == K_TENSOR) {
        if (i == 0) {
            uint32_t a = *g_amax;
            if (p.amax_h) { /* delayed scaling (--fp8-amax-history): the history's amax, this one noted */
                const uint32_t cur = a;
                a = dw_amax_pick(p.amax_h, cur);
                if (p.amax_record) dw_amax_note(p.amax_h, cur);
            }
            float s = dw_rule_fp8_scale(a, p.pow2);
            static_cast<float *>(p.o.scales)[0] = s;
            if (trans) static_cast<float *>(p.t.scales)[0] = s;
        }
    } else if constexpr (kind == K_ROW) {
        if (i < p.rows) static_cast<float *>(p.o.scales)[i] = dw_rule_fp8_scale(row_amax[i], p.pow2);
        if (trans && i < p.cols) static_cast<float *>(p.t.scales)[i] = dw_rule_fp8_scale(col_amax[i], p.pow2);
    } else if constexpr (kind == K_NV) {
        if (i == 0) {
            float st = dw_rule_nvfp4_tensor_scale(*g_amax);
            p.o.tscale[0] = st;
            if (trans) p.t.tscale[0] = st;
        }
    }
}

/* ---- launchers -------------------------------------------------------------------------- */


template <typename TIn, int R>
dw_status launch_pipe(dw_ctx *ctx, const TIn *x, const Params &p, bool trans, bool cnt, int64_t tiles, cudaStream_t st) {
    /* BF16: 2 x 32 KB per CTA, 3 CTAs per SM (80 registers); FP32: 3 x 64 KB, 1 CTA per SM */
    const int stages = g_tuning.stages ? g_tuning.stages : sizeof(TIn) == 2 ? 2 : 3;
    const size_t smem = (size_t)stages * Smem<TIn>::bytes;
    auto k = cnt ? (trans ? quant_tile_pipe_kernel<TIn, R, true, true> : quant_tile_pipe_kernel<TIn, R, false, true>)
                 : (trans ? quant_tile_pipe_kernel<TIn, R, true, false> : quant_tile_pipe_kernel<TIn, R, false, false>);
    static std::atomic<uint64_t> cache[2][2][16]; /* [counting][transposed] */
    int sms = 0, per_sm = 0;
    DW_TRY(kernel_fit(ctx, (const void *)k, THREADS, smem, cache[cnt][trans], &sms, &per_sm));
    if (per_sm < 1)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "quantize %s: %d tile stages (%zu bytes) do not fit in shared memory",
                            dw_recipe_name((dw_recipe)R), stages, smem);
    if (g_tuning.ctas_per_sm > 0 && g_tuning.ctas_per_sm < per_sm) per_sm = g_tuning.ctas_per_sm;
    int64_t grid = (int64_t)sms * per_sm;
    if (g_tuning.max_ctas > 0 && g_tuning.max_ctas < grid) grid = g_tuning.max_ctas;
    if (grid > tiles) grid = tiles;
    k<<<(unsigned)grid, THREADS, smem, st>>>(x, p, tiles, stages);
    return DW_OK;
}

/* *counted: whether the kernel taken added the copies' counts (p.o.cnt, p.t.cnt): all but the
 * one-tile-per-CTA kernel (rows not 16-byte aligned), which has no counting build. */
template <typename TIn, int R>
dw_status launch_recipe(dw_ctx *ctx, const TIn *x, const Params &p, bool trans, uint32_t *ws,
                        cudaStream_t st, bool *counted) {
    constexpr int kind = Traits<R>::kind;
    const bool cnt = p.o.cnt || p.t.cnt;
    *counted = cnt && p.vec_in;
    const int64_t tiles = (p.rows + TILE - 1) / TILE * p.tiles_c;
    if (tiles > 0x7FFFFFFFLL)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "quantize %s: [%lld, %lld] has too many tiles",
                            dw_recipe_name((dw_recipe)R), (long long)p.rows, (long long)p.cols);
    if constexpr (kind == K_TENSOR || kind == K_ROW || kind == K_NV) {
        constexpr bool rows = kind == K_ROW;
        uint32_t *g = ws, *ra = ws + 1, *ca = ws + 1 + p.rows;
        DW_CUDA_CHECK(ctx, cudaMemsetAsync(ws, 0, dw_quantize_cuda_workspace_bytes((dw_recipe)R, p.rows, p.cols), st));
        if (rows && trans)
            amax_kernel<TIn, true, true><<<(unsigned)tiles, THREADS, 0, st>>>(x, p, g, ra, ca);
        else if (rows)
            amax_kernel<TIn, true, false><<<(unsigned)tiles, THREADS, 0, st>>>(x, p, g, ra, ca);
        else
            amax_kernel<TIn, false, false><<<(unsigned)tiles, THREADS, 0, st>>>(x, p, g, ra, ca);
        DW_CUDA_CHECK_LAUNCH(ctx, "quant amax");
        int64_t n = p.rows > p.cols ? p.rows : p.cols;
        finalize_kernel<R><<<(unsigned)((n + 255) / 256), 256, 0, st>>>(p, trans, g, ra, ca);
        DW_CUDA_CHECK_LAUNCH(ctx, "quant scales");
    }
    constexpr int B = Traits<R>::B;
    if (!trans && kind != K_BLOCK2D && p.vec_in && p.vec_out && p.cols % (B > 8 ? B : 8) == 0) {
        auto k = cnt ? quant_rows_kernel<TIn, R, true> : quant_rows_kernel<TIn, R, false>;
        const int64_t nchunks = p.rows * p.cols / 8;
        static std::atomic<uint64_t> cache[2][16];
        int sms = 0, per_sm = 0;
        DW_TRY(kernel_fit(ctx, (const void *)k, THREADS, 0, cache[cnt], &sms, &per_sm));
        int64_t grid = (int64_t)sms * (per_sm > 0 ? per_sm : 1), need = (nchunks + THREADS * UNROLL - 1) / (THREADS * UNROLL);
        k<<<(unsigned)(grid < need ? grid : need), THREADS, 0, st>>>(x, p, nchunks);
    } else if (p.vec_in) {
        DW_TRY((launch_pipe<TIn, R>(ctx, x, p, trans, cnt, tiles, st)));
    } else if (trans) {
        auto k = quant_tile_kernel<TIn, R, true>;
        DW_CUDA_CHECK(ctx, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Smem<TIn>::bytes));
        k<<<(unsigned)tiles, THREADS, Smem<TIn>::bytes, st>>>(x, p);
    } else {
        quant_tile_kernel<TIn, R, false><<<(unsigned)tiles, THREADS, 0, st>>>(x, p);
    }
    DW_CUDA_CHECK_LAUNCH(ctx, dw_recipe_name((dw_recipe)R));
    return DW_OK;
}

template <typename TIn>
dw_status launch(dw_ctx *ctx, dw_recipe r, const TIn *x, const Params &p, bool trans, uint32_t *ws,
                 cudaStream_t st, bool *c) {
    switch (r) {
    case DW_RECIPE_FP8_TENSOR: return launch_recipe<TIn, DW_RECIPE_FP8_TENSOR>(ctx, x, p, trans, ws, st, c);
    case DW_RECIPE_FP8_ROW: return launch_recipe<TIn, DW_RECIPE_FP8_ROW>(ctx, x, p, trans, ws, st, c);
    case DW_RECIPE_FP8_BLOCK: return launch_recipe<TIn, DW_RECIPE_FP8_BLOCK>(ctx, x, p, trans, ws, st, c);
    case DW_RECIPE_FP8_BLOCK2D: return launch_recipe<TIn, DW_RECIPE_FP8_BLOCK2D>(ctx, x, p, trans, ws, st, c);
    case DW_RECIPE_MXFP8: return launch_recipe<TIn, DW_RECIPE_MXFP8>(ctx, x, p, trans, ws, st, c);
    case DW_RECIPE_MXFP8_E5M2: return launch_recipe<TIn, DW_RECIPE_MXFP8_E5M2>(ctx, x, p, trans, ws, st, c);
    case DW_RECIPE_MXFP4: return launch_recipe<TIn, DW_RECIPE_MXFP4>(ctx, x, p, trans, ws, st, c);
    case DW_RECIPE_NVFP4: return launch_recipe<TIn, DW_RECIPE_NVFP4>(ctx, x, p, trans, ws, st, c);
    default: return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "quantize: recipe %s has no CUDA kernel", dw_recipe_name(r));
    }
}

} /* namespace */

#endif /* DW_KERNELS_CUDA_QUANT_KERNELS_CUH */
