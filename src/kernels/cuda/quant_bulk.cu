/* quant_bulk.cu — the transposing quantiser for BF16 input in whole 128x128 tiles (mxfp8,
 * mxfp8_e5m2, fp8_block; rows and cols multiples of 128): a persistent kernel whose producer warp
 * streams tiles into a ring of shared-memory buffers with bulk copies (cp.async.bulk, one 256-byte
 * row each, completing on an mbarrier), while 8 consumer warps each take an 8x8 piece per thread
 * into registers, free the buffer at once, and write row-wise and transposed codes and scales from
 * those registers. The same ring, fed 32 KiB runs of the flat tensor, also quantises row-wise only
 * (quant_bulk_rows_kernel; cols a multiple of the block). Same rules and encoders as quant.cu
 * (quant_common.cuh): bit-identical to the CPU reference. Not the other recipes, FP32 input or
 * ragged tiles: quant.cu runs those. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/quant_common.cuh"

namespace dwq {
namespace {

constexpr int BK_CONS = 256;               /* 8 consumer warps: 16 x 16 pieces of 8 x 8 */
constexpr int BK_THREADS = BK_CONS + 32;   /* + the producer warp */
constexpr int BK_ROW = TILE * 2;           /* bytes of one tile row in shared memory */
constexpr int BK_TILE = TILE * BK_ROW;     /* 32 KiB */

/* ---- mbarrier and bulk copy (PTX, sm_90) ------------------------------------------------ */

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *b, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint64_t *b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(smem_addr(b)), "r"(parity)
                     : "memory");
    } while (!done);
}
/* bytes (multiple of 16) from global src to shared dst (both 16-byte aligned), counted on b */
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *b) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(b))
                 : "memory");
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(BK_CONS) : "memory"); }

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

/* The ring's barriers after `stages` 32 KiB buffers: full[s] (the producer's bytes landed) and
 * empty[s] (each consumer warp is done with buffer s); initialised by thread 0, then a CTA barrier. */
__device__ __forceinline__ uint64_t *ring_init(unsigned char *smem, int stages) {
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + (size_t)stages * BK_TILE);
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&full[stages + s], BK_CONS / 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    return full;
}

/* A block rule moved between lanes: f, r and mode | konst << 8 (MX blocks need no r). */
template <int R> __device__ __forceinline__ Q shfl_q(const Q &q, int src) {
    Q o;
    o.f = __shfl_sync(0xFFFFFFFFu, q.f, src);
    if constexpr (Traits<R>::kind != K_MX) o.r = __shfl_sync(0xFFFFFFFFu, q.r, src);
    else o.r = 0.0f;
    const uint32_t mk = __shfl_sync(0xFFFFFFFFu, (uint32_t)q.mode | q.konst << 8, src);
    o.mode = (int)(mk & 0xFFu);
    o.konst = mk >> 8;
    return o;
}

/* 8 codes of v[0..7] under q, as 2 words. MX rules only multiply (mode 1) or give a constant
 * (mode 0), so their path skips encode_n's division branches; the results are the same. */
template <int R> __device__ __forceinline__ uint2 enc8(const Q &q, const float v[8]) {
    constexpr int fmt = Traits<R>::fmt;
    uint32_t w[2];
    if constexpr (Traits<R>::kind == K_MX) {
#pragma unroll
        for (int j = 0; j < 2; j++)
            w[j] = enc_x2<fmt>(v[4 * j] * q.f, v[4 * j + 1] * q.f) | enc_x2<fmt>(v[4 * j + 2] * q.f, v[4 * j + 3] * q.f) << 16;
        if (q.mode == 0) w[0] = w[1] = q.konst * 0x01010101u;
    } else {
        encode_n<fmt, 8>(q, v, w);
    }
    return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ void put_scale8(const OutDesc &o, int64_t sr, int64_t sc, uint32_t s8) {
    static_cast<uint8_t *>(o.scales)[sr * o.scols + sc] = (uint8_t)s8;
    if (o.swz) o.swz[dw_rule_swizzle_offset(sr, sc, o.scols)] = (uint8_t)s8;
}

/* One tile [r0 .. r0+128) x [c0 .. c0+128): this thread holds rows 8 tr .. 8 tr + 7, columns
 * 8 tc .. 8 tc + 7 of it in w[row] (8 BF16 each). Lanes: tc = lane % 8 + 8 (warp % 2), tr =
 * lane / 8 + 4 (warp / 2), so a warp covers 32 rows x 64 columns: an MX block of a row is 4
 * neighbouring lanes (xor 1, 2), an MX block of a column the 4 lanes lane % 8 (xor 8, 16).
 * fp8_block's 128-blocks add the partner warps through part_r / part_c (one consumer barrier). */
template <int R>
__device__ __forceinline__ void bulk_tile(const Params &p, int64_t r0, int64_t c0, const uint4 (&w)[8], int lane,
                                          int cw, uint32_t (*part_r)[TILE / 2], uint32_t (*part_c)[TILE / 2]) {
    constexpr int kind = Traits<R>::kind;
    constexpr bool mx = kind == K_MX;
    const int tc = (lane & 7) + 8 * (cw & 1), tr = (lane >> 3) + 4 * (cw >> 1);
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
    }
    /* Block rules, each computed by one lane and broadcast. Rows: G lanes share 8 rows, lane
     * lane % G takes rows RPL (lane % G) .. +RPL-1. Columns: the 4 lanes lane % 8 share 8 columns,
     * lane / 8 takes columns 2 (lane / 8), +1. */
    constexpr int G = mx ? 4 : 8, RPL = 8 / G;
    const int gl = lane & (G - 1), q4 = lane >> 3;
    /* packed amax pairs this lane rules (selects, not run-time indexing: that would go to local memory) */
    const uint32_t rpk = pick4(rm, mx ? gl : gl >> 1), cpk = pick4(cm, q4);
    const uint32_t orb = (uint32_t)p.o.row_bytes, trb = (uint32_t)p.t.row_bytes;
    Q qr[RPL], qc[2];
#pragma unroll
    for (int s = 0; s < RPL; s++) {
        const int k = RPL * gl + s;
        float s32 = 0.0f;
        uint32_t s8 = 0;
        qr[s] = block_q<R>(amax_f32(rpk, mx ? s : gl & 1), 0.0f, p, &s32, &s8);
        const int64_t r = r0 + 8 * tr + k;
        if constexpr (mx) put_scale8(p.o, r, (c0 >> 5) + (tc >> 2), s8);
        else if ((cw & 1) == 0) static_cast<float *>(p.o.scales)[r * p.o.scols + (c0 >> 7)] = s32;
    }
#pragma unroll
    for (int s = 0; s < 2; s++) {
        const int j = 2 * q4 + s;
        float s32 = 0.0f;
        uint32_t s8 = 0;
        qc[s] = block_q<R>(amax_f32(cpk, s), 0.0f, p, &s32, &s8);
        const int64_t cg = c0 + 8 * tc + j;
        if constexpr (mx) put_scale8(p.t, cg, (r0 >> 5) + (tr >> 2), s8);
        else if ((cw >> 1) == 0) static_cast<float *>(p.t.scales)[cg * p.t.scols + (r0 >> 7)] = s32;
    }
    /* row-wise codes: row k, 8 bytes at column c0 + 8 tc */
    uint8_t *const ob = p.o.codes + (r0 + 8 * tr) * p.o.row_bytes + c0 + 8 * tc;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const Q q = shfl_q<R>(qr[k % RPL], (lane & ~(G - 1)) | (k / RPL));
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = elem(w[k], j);
        __stcs(reinterpret_cast<uint2 *>(ob + (uint32_t)k * orb), enc8<R>(q, v));
    }
    /* transposed codes: column j of x = row c0 + 8 tc + j of x^T, 8 bytes at r0 + 8 tr */
    uint8_t *const tb = p.t.codes + (c0 + 8 * tc) * p.t.row_bytes + r0 + 8 * tr;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const Q q = shfl_q<R>(qc[j & 1], (lane & 7) | ((j >> 1) << 3));
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = elem(w[k], j);
        __stcs(reinterpret_cast<uint2 *>(tb + (uint32_t)j * trb), enc8<R>(q, v));
    }
}

template <int R>
__global__ void __launch_bounds__(BK_THREADS, 2) quant_bulk_kernel(const uint16_t *__restrict__ x, Params p,
                                                                   int64_t ntiles, int stages) {
    extern __shared__ __align__(128) unsigned char smem[]; /* stages tiles, then 2 x stages mbarriers */
    __shared__ __align__(16) uint32_t part_r[2][2][TILE / 2]; /* [tile parity][warp % 2][row pair] */
    __shared__ __align__(16) uint32_t part_c[2][4][TILE / 2]; /* [tile parity][warp / 2][column pair] */
    uint64_t *const full = ring_init(smem, stages), *const empty = full + stages;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const uint32_t tiles_c = (uint32_t)p.tiles_c; /* tile t is row block t / tiles_c, column block t % tiles_c */
    if (warp == BK_CONS / 32) { /* producer: the n-th tile goes to buffer n % stages once it is free */
        int s = 0;
        uint32_t ph = 0; /* parity of the ring's round */
        for (uint32_t tile = blockIdx.x, n = 0; tile < (uint32_t)ntiles; tile += gridDim.x, n++) {
            if (n >= (uint32_t)stages) {
                if (lane == 0) mbar_wait(&empty[s], ph ^ 1u);
                __syncwarp();
            }
            if (lane == 0) mbar_arrive_tx(&full[s], BK_TILE);
            __syncwarp();
            const int64_t r0 = (int64_t)(tile / tiles_c) * TILE, c0 = (int64_t)(tile % tiles_c) * TILE;
            unsigned char *buf = smem + (size_t)s * BK_TILE;
#pragma unroll
            for (int k = 0; k < TILE / 32; k++) {
                const int rr = 32 * k + lane;
                bulk_g2s(buf + rr * BK_ROW, x + (r0 + rr) * p.cols + c0, BK_ROW, &full[s]);
            }
            if (++s == stages) s = 0, ph ^= 1u;
        }
        return;
    }
    const int tc = (lane & 7) + 8 * (warp & 1), tr = (lane >> 3) + 4 * (warp >> 1);
    int s = 0;
    uint32_t ph = 0;
    for (uint32_t tile = blockIdx.x, n = 0; tile < (uint32_t)ntiles; tile += gridDim.x, n++) {
        mbar_wait(&full[s], ph);
        const unsigned char *buf = smem + (size_t)s * BK_TILE;
        uint4 w[8];
#pragma unroll
        for (int k = 0; k < 8; k++) w[k] = *reinterpret_cast<const uint4 *>(buf + (8 * tr + k) * BK_ROW + 16 * tc);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
        if (++s == stages) s = 0, ph ^= 1u;
        const int64_t r0 = (int64_t)(tile / tiles_c) * TILE, c0 = (int64_t)(tile % tiles_c) * TILE;
        bulk_tile<R>(p, r0, c0, w, lane, warp, part_r[n & 1], part_c[n & 1]);
    }
}

/* Row-wise only (cols a multiple of the block): the tensor as a flat run of 8-element chunks,
 * BK_TILE bytes (2048 chunks) per ring stage; chunk g's codes at 8 g, its block's scale at 8 g / B.
 * Consumer thread t takes chunks t + 256 i (i < 8) of each stage: B / 8 neighbouring lanes share
 * a block; each block's rule is computed by one of them and broadcast. */
constexpr int64_t BK_STAGE_CHUNKS = BK_TILE / 16;

template <int R>
__global__ void __launch_bounds__(BK_THREADS, 2) quant_bulk_rows_kernel(const uint16_t *__restrict__ x, Params p,
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
                if (lane == 0) mbar_wait(&empty[s], ph ^ 1u);
                __syncwarp();
            }
            const int64_t g0 = st * BK_STAGE_CHUNKS, left = nchunks - g0;
            const uint32_t bytes = (uint32_t)(left < BK_STAGE_CHUNKS ? left : BK_STAGE_CHUNKS) * 16u;
            if (lane == 0) mbar_arrive_tx(&full[s], bytes);
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
        Q qs[CPL];
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            const int i = mx ? 2 * gl + c : gl; /* chunk index of this stage's 8 (fp8_block: valid when gl < 8) */
            float s32 = 0.0f;
            uint32_t s8 = 0;
            qs[c] = block_q<R>(amax_f32(apk, mx ? c : gl & 1), 0.0f, p, &s32, &s8);
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
            const Q q = shfl_q<R>(qs[i % CPL], (lane & ~(L - 1)) | (i / CPL));
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; j++) v[j] = elem(w[i], j);
            if (g0 + i * BK_CONS + tid < nchunks) __stcs(codes + i * BK_CONS, enc8<R>(q, v));
        }
    }
}

/* Either ring kernel k over `work` units (tiles or stages; n is the kernel's count argument):
 * a persistent grid of at most ctas_per_sm CTAs per SM (0 = as many as fit) and max_ctas in all. */
using ring_kernel = void (*)(const uint16_t *, Params, int64_t, int);
dw_status launch_ring(dw_ctx *ctx, ring_kernel k, std::atomic<uint64_t> (&cache)[16], dw_recipe r, const uint16_t *x,
                      const Params &p, int64_t work, int64_t n, int stages, int ctas_per_sm, int max_ctas,
                      cudaStream_t st) {
    if (work > 0x7FFFFFFFLL)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "quantize %s: [%lld, %lld] is too large", dw_recipe_name(r),
                            (long long)p.rows, (long long)p.cols);
    const size_t smem = (size_t)stages * BK_TILE + 2 * (size_t)stages * sizeof(uint64_t);
    int sms = 0, per_sm = 0;
    DW_TRY(kernel_fit(ctx, (const void *)k, BK_THREADS, smem, cache, &sms, &per_sm));
    if (per_sm < 1)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "quantize %s: %d bulk stages (%zu bytes) do not fit in shared memory",
                            dw_recipe_name(r), stages, smem);
    if (ctas_per_sm > 0 && ctas_per_sm < per_sm) per_sm = ctas_per_sm;
    int64_t grid = (int64_t)sms * per_sm;
    if (max_ctas > 0 && max_ctas < grid) grid = max_ctas;
    if (grid > work) grid = work;
    k<<<(unsigned)grid, BK_THREADS, smem, st>>>(x, p, n, stages);
    DW_CUDA_CHECK_LAUNCH(ctx, dw_recipe_name(r));
    return DW_OK;
}

template <int R> dw_status launch_bulk_r(dw_ctx *ctx, const uint16_t *x, const Params &p, bool trans, int stages,
                                         int ctas_per_sm, int max_ctas, cudaStream_t st) {
    static std::atomic<uint64_t> cache_t[16], cache_r[16];
    if (trans) {
        const int64_t tiles = p.rows / TILE * p.tiles_c;
        return launch_ring(ctx, quant_bulk_kernel<R>, cache_t, (dw_recipe)R, x, p, tiles, tiles, stages, ctas_per_sm,
                           max_ctas, st);
    }
    const int64_t nchunks = p.rows * p.cols / 8;
    return launch_ring(ctx, quant_bulk_rows_kernel<R>, cache_r, (dw_recipe)R, x, p,
                       (nchunks + BK_STAGE_CHUNKS - 1) / BK_STAGE_CHUNKS, nchunks, stages, ctas_per_sm, max_ctas, st);
}

} /* namespace */

bool bulk_eligible(dw_recipe r, const Params &p, const void *x, bool trans) {
    const bool recipe = r == DW_RECIPE_MXFP8 || r == DW_RECIPE_MXFP8_E5M2 || r == DW_RECIPE_FP8_BLOCK;
    if (!recipe || (uintptr_t)x % 16 != 0 || (uintptr_t)p.o.codes % 8 != 0) return false;
    if (!trans) return p.cols % (r == DW_RECIPE_FP8_BLOCK ? 128 : 32) == 0;
    return p.rows % TILE == 0 && p.cols % TILE == 0 && p.t.codes && (uintptr_t)p.t.codes % 8 == 0;
}

dw_status launch_bulk(dw_ctx *ctx, dw_recipe r, const uint16_t *x, const Params &p, bool trans, int stages,
                      int ctas_per_sm, int max_ctas, cudaStream_t st) {
    switch (r) {
    case DW_RECIPE_MXFP8: return launch_bulk_r<DW_RECIPE_MXFP8>(ctx, x, p, trans, stages, ctas_per_sm, max_ctas, st);
    case DW_RECIPE_MXFP8_E5M2:
        return launch_bulk_r<DW_RECIPE_MXFP8_E5M2>(ctx, x, p, trans, stages, ctas_per_sm, max_ctas, st);
    case DW_RECIPE_FP8_BLOCK: return launch_bulk_r<DW_RECIPE_FP8_BLOCK>(ctx, x, p, trans, stages, ctas_per_sm, max_ctas, st);
    default: return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "quantize %s: no bulk-copy kernel", dw_recipe_name(r));
    }
}

} /* namespace dwq */
