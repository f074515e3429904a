/* quant_check.cu — the guard's quantisation-error check on the device (quant_check.h). For an
 * operand x [rows, cols] (or x^T) in device memory, in stream order:
 *   1. sampled only: the first element of largest magnitude in the layout's order (NaN skipped),
 *      one 64-bit key per warp by atomicMax; the key comes back and the host places the sample's
 *      block rows around it (quant_stats.h, dw_qstats_sample_place) — the one mid-way sync;
 *   2. the sampled layout rows gathered into sub [m, C] (FP32, the layout's order);
 *   3. sub quantised by dw_quantize_cuda (FP32 input: bit-identical to dw_quantize_cpu, which is
 *      what the reference measures);
 *   4. each scale block's first finite element of largest magnitude (the one the bulk sums
 *      leave out), by the same keys per block;
 *   5. every element dequantised exactly (quant_counts.cuh: element x scale [x s_t]) and its
 *      terms summed per CTA, the CTAs' partials added in CTA order by one thread, 80 bytes back.
 * The terms are io/safetensors_quant.c's dw_stq_stats_add and quant_stats.c's bulk loop; only the
 * order of the double additions differs. Scratch: one stream-ordered allocation per call. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

extern "C" { /* C headers without linkage guards */
#include "core/cuda_check.h"
#include "core/error.h"
#include "precision/quant_stats.h"
}
#include "kernels/cuda/quant_check.h"
#include "precision/quant_counts.cuh"

namespace {

constexpr int THREADS = 256;
constexpr int64_t MAX_CTAS = 512;
constexpr unsigned long long POS = (1ull << 33) - 1; /* a key: |x| bits << 33 | (POS - position) */

__device__ __forceinline__ float load(const void *v, bool bf16, int64_t i) {
    return bf16 ? __uint_as_float((uint32_t)((const uint16_t *)v)[i] << 16) : ((const float *)v)[i];
}

/* The warp's largest key among lanes whose `seg` equals theirs, at the first lane of each run of
 * equal seg (others get 0): keys of lanes with another seg are never merged in. All 32 lanes
 * call it. */
__device__ __forceinline__ unsigned long long seg_max(unsigned long long key, int64_t seg, bool *head) {
    const int lane = (int)(threadIdx.x & 31);
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const unsigned long long k = __shfl_down_sync(0xFFFFFFFFu, key, off);
        const int64_t s = __shfl_down_sync(0xFFFFFFFFu, seg, off);
        if (lane + off < 32 && s == seg && k > key) key = k;
    }
    const int64_t before = __shfl_up_sync(0xFFFFFFFFu, seg, 1);
    *head = lane == 0 || before != seg;
    return key;
}

/* Step 1: key of x's first element of largest magnitude, position in the layout [R, C] (x^T's
 * when trans), NaN skipped (Inf counts): x is [rows, cols]. */
__global__ void __launch_bounds__(THREADS) amax_kernel(const void *__restrict__ x, bool bf16, int64_t rows, int64_t cols,
                                                       bool trans, unsigned long long *key) {
    const int64_t n = rows * cols, stride = (int64_t)gridDim.x * THREADS;
    unsigned long long best = 0;
    for (int64_t k = (int64_t)blockIdx.x * THREADS + threadIdx.x; k < n; k += stride) {
        const uint32_t b = __float_as_uint(load(x, bf16, k)) & 0x7FFFFFFFu;
        if (b > 0x7F800000u) continue;
        const int64_t i = k / cols, j = k % cols, pos = trans ? j * rows + i : k;
        const unsigned long long kk = (unsigned long long)b << 33 | (POS - (unsigned long long)pos);
        if (kk > best) best = kk;
    }
    bool head;
    best = seg_max(best, 0, &head);
    if (head && best) atomicMax(key, best);
}

/* Step 2: sub [m, C] = the layout's rows map[i] (map NULL: rows 0..m-1) of x [rows, cols]. */
__global__ void __launch_bounds__(THREADS) gather_kernel(const void *__restrict__ x, bool bf16, int64_t rows, int64_t cols,
                                                         bool trans, const int64_t *__restrict__ map, int64_t m, int64_t C,
                                                         float *__restrict__ sub) {
    const int64_t n = m * C, stride = (int64_t)gridDim.x * THREADS;
    for (int64_t k = (int64_t)blockIdx.x * THREADS + threadIdx.x; k < n; k += stride) {
        const int64_t i = k / C, b = k % C, a = map ? map[i] : i;
        sub[k] = load(x, bf16, trans ? b * cols + a : a * cols + b);
    }
}

struct Geo {             /* sub [m, C] in scale blocks of BR x BC (whole dimensions resolved) */
    int64_t m, C, BR, BC, nbc;
};
__device__ __forceinline__ void block_of(const Geo &g, int64_t k, int64_t *blk, int64_t *local) {
    const int64_t a = k / g.C, b = k % g.C;
    *blk = (a / g.BR) * g.nbc + b / g.BC;
    *local = (a % g.BR) * g.BC + b % g.BC;
}

/* Step 4: per block, the key of its first finite element of largest magnitude (row-major within
 * the block); 0 for a block without a finite element. Lanes step through sub together. */
__global__ void __launch_bounds__(THREADS) block_max_kernel(const float *__restrict__ sub, Geo g,
                                                            unsigned long long *bkey) {
    const int64_t n = g.m * g.C, stride = (int64_t)gridDim.x * THREADS;
    for (int64_t base = (int64_t)blockIdx.x * THREADS; base < n; base += stride) {
        const int64_t k = base + threadIdx.x;
        int64_t blk = -1, local = 0;
        unsigned long long key = 0;
        if (k < n) {
            block_of(g, k, &blk, &local);
            const uint32_t b = __float_as_uint(sub[k]) & 0x7FFFFFFFu;
            if (b < 0x7F800000u) key = (unsigned long long)b << 33 | (POS - (unsigned long long)local);
        }
        bool head;
        key = seg_max(key, blk, &head);
        if (head && blk >= 0 && key) atomicMax(&bkey[blk], key);
    }
}

struct Sums {            /* one CTA's, then the operand's */
    double sum_x2, sum_e2, bulk_x2, bulk_e2, max_abs;
    unsigned long long n, nonfinite, saturated, flushed;
};

struct Codes {           /* what quantising sub wrote, and how to read it */
    const uint8_t *codes;
    const void *scales;
    const float *ts;     /* nvfp4's s_t */
    int64_t row_bytes, scols;
    int br, bc;          /* the recipe's block (0: whole dimension) */
    int bits;
    bool e5m2, fp32_scale, nv;
};

/* Step 5: each element's terms (dw_stq_stats_add, and the bulk loop of quant_stats.c), a CTA's
 * sums to part[blockIdx.x]. Products and sums rounded one at a time (no contraction), as the
 * reference's are. */
__global__ void __launch_bounds__(THREADS) stats_kernel(const float *__restrict__ sub, Geo g, Codes q,
                                                        const unsigned long long *__restrict__ bkey, Sums *part) {
    __shared__ Sums sh[THREADS / 32];
    const int64_t n = g.m * g.C, stride = (int64_t)gridDim.x * THREADS;
    const float st = q.nv ? *q.ts : 1.0f;
    const dwqc::Fmt f = {q.bits, q.e5m2};
    unsigned mask, top;
    double ratio;
    dw_qc_top(q.bits, q.e5m2, &mask, &top, &ratio);
    Sums s = {};
    for (int64_t k = (int64_t)blockIdx.x * THREADS + threadIdx.x; k < n; k += stride) {
        const int64_t i = k / g.C, j = k % g.C;
        const unsigned code = q.bits == 4 ? (q.codes[i * q.row_bytes + j / 2] >> (4 * (j & 1))) & 0xFu : q.codes[i * g.C + j];
        const int64_t si = (q.br ? i / q.br : 0) * q.scols + (q.bc ? j / q.bc : 0);
        const float sc = q.fp32_scale ? ((const float *)q.scales)[si] : dwqc::scale8(q.nv, ((const uint8_t *)q.scales)[si]);
        float y = dwqc::elem(f, code) * sc;
        if (q.nv) y = y * st;
        const float x = sub[k];
        s.n++;
        if (!isfinite(x) || !isfinite(y)) {
            s.nonfinite++;
            continue;
        }
        const double xv = x, yv = y, e = __dsub_rn(xv, yv), e2 = __dmul_rn(e, e), x2 = __dmul_rn(xv, xv);
        s.sum_x2 = __dadd_rn(s.sum_x2, x2);
        s.sum_e2 = __dadd_rn(s.sum_e2, e2);
        s.max_abs = fmax(s.max_abs, fabs(e));
        s.flushed += dw_qc_underflow(x, y);
        s.saturated += dw_qc_overflow(code, mask, top, ratio, x, y);
        int64_t blk, local;
        block_of(g, k, &blk, &local);
        const unsigned long long bk = bkey[blk];
        if (bk && POS - (bk & POS) == (unsigned long long)local) continue; /* the block's largest: not bulk */
        s.bulk_x2 = __dadd_rn(s.bulk_x2, x2);
        s.bulk_e2 = __dadd_rn(s.bulk_e2, e2);
    }
    for (int o = 16; o > 0; o >>= 1) {
        s.sum_x2 = __dadd_rn(s.sum_x2, __shfl_xor_sync(0xFFFFFFFFu, s.sum_x2, o));
        s.sum_e2 = __dadd_rn(s.sum_e2, __shfl_xor_sync(0xFFFFFFFFu, s.sum_e2, o));
        s.bulk_x2 = __dadd_rn(s.bulk_x2, __shfl_xor_sync(0xFFFFFFFFu, s.bulk_x2, o));
        s.bulk_e2 = __dadd_rn(s.bulk_e2, __shfl_xor_sync(0xFFFFFFFFu, s.bulk_e2, o));
        s.max_abs = fmax(s.max_abs, __shfl_xor_sync(0xFFFFFFFFu, s.max_abs, o));
        s.n += __shfl_xor_sync(0xFFFFFFFFu, s.n, o);
        s.nonfinite += __shfl_xor_sync(0xFFFFFFFFu, s.nonfinite, o);
        s.saturated += __shfl_xor_sync(0xFFFFFFFFu, s.saturated, o);
        s.flushed += __shfl_xor_sync(0xFFFFFFFFu, s.flushed, o);
    }
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x) return;
    Sums t = sh[0];
    for (int w = 1; w < THREADS / 32; w++) {
        t.sum_x2 = __dadd_rn(t.sum_x2, sh[w].sum_x2), t.sum_e2 = __dadd_rn(t.sum_e2, sh[w].sum_e2);
        t.bulk_x2 = __dadd_rn(t.bulk_x2, sh[w].bulk_x2), t.bulk_e2 = __dadd_rn(t.bulk_e2, sh[w].bulk_e2);
        t.max_abs = fmax(t.max_abs, sh[w].max_abs);
        t.n += sh[w].n, t.nonfinite += sh[w].nonfinite, t.saturated += sh[w].saturated, t.flushed += sh[w].flushed;
    }
    part[blockIdx.x] = t;
}

/* The CTAs' partials added in CTA order (deterministic), into part[0]. */
__global__ void fold_kernel(Sums *part, int ctas) {
    Sums t = part[0];
    for (int c = 1; c < ctas; c++) {
        t.sum_x2 = __dadd_rn(t.sum_x2, part[c].sum_x2), t.sum_e2 = __dadd_rn(t.sum_e2, part[c].sum_e2);
        t.bulk_x2 = __dadd_rn(t.bulk_x2, part[c].bulk_x2), t.bulk_e2 = __dadd_rn(t.bulk_e2, part[c].bulk_e2);
        t.max_abs = fmax(t.max_abs, part[c].max_abs);
        t.n += part[c].n, t.nonfinite += part[c].nonfinite, t.saturated += part[c].saturated, t.flushed += part[c].flushed;
    }
    part[0] = t;
}

unsigned grid(int64_t n) {
    const int64_t need = (n + THREADS - 1) / THREADS;
    return (unsigned)(need < 1 ? 1 : need < MAX_CTAS ? need : MAX_CTAS);
}
size_t up(size_t b) { return (b + 255) & ~(size_t)255; }

/* The scratch of one call, carved from one allocation. */
struct Scratch {
    unsigned long long *key, *bkey;
    int64_t *map;
    float *sub, *ts;
    uint8_t *codes;
    void *scales, *ws;
    Sums *part;
};

/* Steps 1-5 for the layout [R, C] of x, k sampled groups of BR rows (0: whole); *out the sums. */
dw_status run(dw_ctx *ctx, dw_recipe r, dw_quant_in in, const void *x, int64_t rows, int64_t cols, bool trans,
              int64_t k, int64_t BR, const Scratch &sc, int64_t *host_map, Sums *out, cudaStream_t st) {
    const bool bf16 = in == DW_QUANT_IN_BF16;
    const int64_t R = trans ? cols : rows, C = trans ? rows : cols;
    int64_t m = R;
    if (k) {
        unsigned long long key = 0;
        DW_CUDA_CHECK(ctx, cudaMemsetAsync(sc.key, 0, sizeof key, st));
        amax_kernel<<<grid(rows * cols), THREADS, 0, st>>>(x, bf16, rows, cols, trans, sc.key);
        DW_CUDA_CHECK_LAUNCH(ctx, "quant check (amax)");
        DW_CUDA_CHECK(ctx, cudaMemcpyAsync(&key, sc.key, sizeof key, cudaMemcpyDeviceToHost, st));
        DW_CUDA_CHECK(ctx, cudaStreamSynchronize(st));
        const int64_t pos = key ? (int64_t)(POS - (key & POS)) : 0, G = (R + BR - 1) / BR;
        int64_t *group = host_map + k * BR; /* room after the map */
        dw_qstats_sample_place(k, G, pos / C / BR, group);
        m = 0;
        for (int64_t i = 0; i < k; i++)
            for (int64_t a = group[i] * BR; a < (group[i] + 1) * BR && a < R; a++) host_map[m++] = a;
        DW_CUDA_CHECK(ctx, cudaMemcpyAsync(sc.map, host_map, (size_t)m * sizeof *host_map, cudaMemcpyHostToDevice, st));
    }
    gather_kernel<<<grid(m * C), THREADS, 0, st>>>(x, bf16, rows, cols, trans, k ? sc.map : nullptr, m, C, sc.sub);
    DW_CUDA_CHECK_LAUNCH(ctx, "quant check (gather)");
    dw_quant_opts o;
    o.recipe = r, o.rounding = DW_SCALE_RCEIL, o.pow2 = false;
    const dw_quant_dev_out qo = {sc.codes, sc.scales, nullptr, sc.ts, nullptr};
    DW_TRY(dw_quantize_cuda(ctx, &o, DW_QUANT_IN_F32, sc.sub, m, C, &qo, nullptr, sc.ws, st));
    int br, bc;
    dw_recipe_block(r, &br, &bc);
    Geo g = {m, C, br ? br : m, bc ? bc : C, 0};
    g.nbc = (C + g.BC - 1) / g.BC;
    const int64_t nb = ((m + g.BR - 1) / g.BR) * g.nbc;
    DW_CUDA_CHECK(ctx, cudaMemsetAsync(sc.bkey, 0, (size_t)nb * sizeof *sc.bkey, st));
    block_max_kernel<<<grid(m * C), THREADS, 0, st>>>(sc.sub, g, sc.bkey);
    DW_CUDA_CHECK_LAUNCH(ctx, "quant check (block maxima)");
    Codes q = {sc.codes, sc.scales, sc.ts, dw_quant_row_bytes(r, C), 0, br, bc, dw_recipe_elem_bits(r),
               r == DW_RECIPE_MXFP8_E5M2, dw_recipe_scale_bytes(r) == 4, r == DW_RECIPE_NVFP4};
    int64_t srows;
    dw_quant_scale_shape(r, m, C, &srows, &q.scols);
    const unsigned ctas = grid(m * C);
    stats_kernel<<<ctas, THREADS, 0, st>>>(sc.sub, g, q, sc.bkey, sc.part);
    DW_CUDA_CHECK_LAUNCH(ctx, "quant check (sums)");
    fold_kernel<<<1, 1, 0, st>>>(sc.part, (int)ctas);
    DW_CUDA_CHECK_LAUNCH(ctx, "quant check (fold)");
    DW_CUDA_CHECK(ctx, cudaMemcpyAsync(out, sc.part, sizeof *out, cudaMemcpyDeviceToHost, st));
    DW_CUDA_CHECK(ctx, cudaStreamSynchronize(st));
    return DW_OK;
}

} /* namespace */

extern "C" dw_status dw_qcheck_cuda(dw_ctx *ctx, dw_recipe r, dw_quant_in in, const void *x, int64_t rows, int64_t cols,
                                    bool trans, dw_qstats *s, void *stream) {
    if (r == DW_RECIPE_BF16 || (int)r < 0 || r >= DW_RECIPE_COUNT)
        return dw_set_error(ctx, DW_ERR_INVALID, "quant check (cuda): recipe %d has no quantised form", (int)r);
    if (!x || rows < 0 || cols < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "quant check (cuda): bad operand [%lld, %lld]", (long long)rows,
                            (long long)cols);
    if (rows * cols <= 0) return DW_OK;
    if (rows > (int64_t)POS / cols)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "quant check (cuda): [%lld, %lld] has 2^33 elements or more",
                            (long long)rows, (long long)cols);
    const int64_t R = trans ? cols : rows, C = trans ? rows : cols;
    int64_t BR = 1;
    const int64_t k = dw_qstats_sample_size(r, R, C, s->cap, &BR), mmax = k ? (k * BR < R ? k * BR : R) : R;
    int br, bc;
    dw_recipe_block(r, &br, &bc);
    const int64_t nb = ((mmax + (br ? br : mmax) - 1) / (br ? br : mmax)) * ((C + (bc ? bc : C) - 1) / (bc ? bc : C));
    const size_t sizes[8] = {up(8), up((size_t)nb * 8), up(k ? (size_t)mmax * 8 : 0), up((size_t)(mmax * C) * 4), up(4),
                             up(dw_quant_codes_bytes(r, mmax, C)), up(dw_quant_scales_bytes(r, mmax, C)),
                             up(dw_quantize_cuda_workspace_bytes(r, mmax, C))};
    size_t total = up((size_t)grid(mmax * C) * sizeof(Sums));
    for (int i = 0; i < 8; i++) total += sizes[i];
    int64_t *host_map = k ? (int64_t *)malloc((size_t)(k * BR + k) * sizeof *host_map) : nullptr; /* map, groups */
    if (k && !host_map) return dw_set_error(ctx, DW_ERR_NOMEM, "quant check (cuda): out of memory");
    cudaStream_t st = (cudaStream_t)stream;
    char *mem = nullptr;
    cudaError_t err = cudaMallocAsync((void **)&mem, total, st);
    if (err != cudaSuccess) {
        free(host_map);
        return dw_set_error(ctx, DW_ERR_CUDA, "quant check (cuda): %zu bytes of scratch: %s", total, cudaGetErrorString(err));
    }
    Scratch sc;
    char *p = mem;
    sc.key = (unsigned long long *)p, p += sizes[0];
    sc.bkey = (unsigned long long *)p, p += sizes[1];
    sc.map = (int64_t *)p, p += sizes[2];
    sc.sub = (float *)p, p += sizes[3];
    sc.ts = (float *)p, p += sizes[4];
    sc.codes = (uint8_t *)p, p += sizes[5];
    sc.scales = p, p += sizes[6];
    sc.ws = sizes[7] ? p : nullptr, p += sizes[7];
    sc.part = (Sums *)p;
    Sums t = {};
    dw_status rc = run(ctx, r, in, x, rows, cols, trans, k, BR, sc, host_map, &t, st);
    err = cudaFreeAsync(mem, st);
    if (err == cudaSuccess) err = cudaStreamSynchronize(st);
    free(host_map);
    if (rc != DW_OK) return rc;
    if (err != cudaSuccess) return dw_set_error(ctx, DW_ERR_CUDA, "quant check (cuda): %s", cudaGetErrorString(err));
    s->elements += rows * cols;
    s->q.n += (int64_t)t.n;
    s->q.sum_x2 += t.sum_x2;
    s->q.sum_e2 += t.sum_e2;
    s->q.saturated += (int64_t)t.saturated;
    s->q.flushed += (int64_t)t.flushed;
    s->q.nonfinite += (int64_t)t.nonfinite;
    if (t.nonfinite) s->q.max_abs = NAN;
    else if (t.max_abs > s->q.max_abs) s->q.max_abs = t.max_abs; /* stays NaN once NaN */
    s->bulk_e2 += t.bulk_e2;
    s->bulk_x2 += t.bulk_x2;
    return DW_OK;
}
