/* decode_attn.cu — flash-decoding attention for one new query per sequence against the K/V cache
 * (decode_attn.h). Two kernels on one stream:
 *   split:   block (chunk c, KV head kh x head batch hb, sequence b) takes keys [j0 + c CH, ...) of
 *            kh for heads h0 .. h0+ng-1 (ng <= 8): scores into shared memory (each key row read
 *            once, by one warp, for all ng heads), the chunk's max m and sum l of exp(s - m), and
 *            o = sum_j exp(s_j - m) v_j (each value row read once) -> work
 *   combine: block (h, b): M = max_c m_c, out = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) l_c.
 * work: partial outputs (B,H,NC,D) then (m, l) pairs (B,H,NC,2), FP32; NC = chunks of this call. */
#include "kernels/cuda/decode_attn.h"
#include "kernels/cuda/ops_common.cuh"

#define DW_DEC_THREADS 128 /* 4 warps */
#define DW_DEC_HEADS 8     /* query heads of one KV head per block (registers per lane) */
#define DW_DEC_MIN_CHUNK 32
#define DW_DEC_MAX_CHUNK 512
#define DW_DEC_TARGET_BLOCKS 256 /* split until about this many blocks: two waves on 132 SMs */

/* Parts the value pass splits the chunk into: P x D threads busy (P = 1 for D >= the block). */
static __host__ __device__ __forceinline__ int64_t dw_dec_parts(int64_t D) {
    return D < DW_DEC_THREADS ? DW_DEC_THREADS / D : 1;
}

/* Shared floats of a split block: q (8,D), scores (8,CH), value partials (P,8,D), (m, l) (8,2). */
static __host__ __device__ __forceinline__ int64_t dw_dec_smem_floats(int64_t D, int64_t CH) {
    return DW_DEC_HEADS * (D + CH + dw_dec_parts(D) * D + 2);
}

static __device__ __forceinline__ float dw_dec_cap(float z, float cap) { return cap > 0.0f ? cap * tanhf(z / cap) : z; }

/* po (B,H,NC,D), pml (B,H,NC,2); q (B,H,D); kc, vc (B,S,Hkv,D). Keys j0 .. n-1 of the cache. */
template <typename T>
static __global__ void __launch_bounds__(DW_DEC_THREADS)
dw_dec_split_kernel(float *po, float *pml, const T *q, const T *kc, const T *vc, int64_t S, int64_t n, int64_t j0,
                    int64_t CH, int64_t NC, int64_t H, int64_t Hkv, int64_t D, float scale, float cap) {
    extern __shared__ float dw_dec_sm[];
    const int64_t group = H / Hkv, hbatches = (group + DW_DEC_HEADS - 1) / DW_DEC_HEADS;
    const int64_t c = blockIdx.x, kh = blockIdx.y / hbatches, hb = blockIdx.y % hbatches, b = blockIdx.z;
    const int64_t h0 = kh * group + hb * DW_DEC_HEADS;
    const int ng = (int)(group - hb * DW_DEC_HEADS < DW_DEC_HEADS ? group - hb * DW_DEC_HEADS : DW_DEC_HEADS);
    const int64_t js = j0 + c * CH, len = (n - js < CH ? n - js : CH), P = dw_dec_parts(D);
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = DW_DEC_THREADS / 32;
    float *qs = dw_dec_sm;                   /* (8, D) */
    float *ss = qs + DW_DEC_HEADS * D;       /* (8, CH) scores, then exp(s - m) */
    float *os = ss + DW_DEC_HEADS * CH;      /* (P, 8, D) */
    float *ml = os + P * DW_DEC_HEADS * D;   /* (8, 2) */
    for (int64_t i = tid; i < ng * D; i += DW_DEC_THREADS) qs[i] = dw_ld(q, (b * H + h0) * D + i);
    __syncthreads();
    /* scores: warp w takes keys w, w + 4, ...; lanes split the key's D channels */
    for (int64_t jl = w; jl < len; jl += nw) {
        const T *kr = kc + ((b * S + js + jl) * Hkv + kh) * D;
        float acc[DW_DEC_HEADS];
#pragma unroll
        for (int g = 0; g < DW_DEC_HEADS; g++) acc[g] = 0.0f;
        for (int64_t d = lane; d < D; d += 32) {
            const float kd = dw_ld(kr, d);
#pragma unroll
            for (int g = 0; g < DW_DEC_HEADS; g++)
                if (g < ng) acc[g] = fmaf(qs[g * D + d], kd, acc[g]);
        }
#pragma unroll
        for (int g = 0; g < DW_DEC_HEADS; g++) {
            if (g >= ng) break;
            const float dot = dw_warp_sum(acc[g]);
            if (lane == 0) ss[g * CH + jl] = dw_dec_cap(dot * scale, cap);
        }
    }
    __syncthreads();
    /* the chunk's max and sum per head: warp w takes heads w, w + 4 */
    for (int g = w; g < ng; g += nw) {
        float m = -INFINITY;
        for (int64_t jl = lane; jl < len; jl += 32) m = fmaxf(m, ss[g * CH + jl]);
        m = dw_warp_max(m);
        float l = 0.0f;
        for (int64_t jl = lane; jl < len; jl += 32) {
            const float p = expf(ss[g * CH + jl] - m);
            ss[g * CH + jl] = p;
            l += p;
        }
        l = dw_warp_sum(l);
        if (lane == 0) ml[2 * g] = m, ml[2 * g + 1] = l;
    }
    __syncthreads();
    /* weighted values: thread (part, d) sums keys part, part + P, ... of channel d for every head */
    for (int64_t e = tid; e < P * D; e += DW_DEC_THREADS) {
        const int64_t part = e / D, d = e % D;
        float o[DW_DEC_HEADS];
#pragma unroll
        for (int g = 0; g < DW_DEC_HEADS; g++) o[g] = 0.0f;
        for (int64_t jl = part; jl < len; jl += P) {
            const float vd = dw_ld(vc, ((b * S + js + jl) * Hkv + kh) * D + d);
#pragma unroll
            for (int g = 0; g < DW_DEC_HEADS; g++)
                if (g < ng) o[g] = fmaf(ss[g * CH + jl], vd, o[g]);
        }
#pragma unroll
        for (int g = 0; g < DW_DEC_HEADS; g++)
            if (g < ng) os[(part * DW_DEC_HEADS + g) * D + d] = o[g];
    }
    __syncthreads();
    for (int64_t e = tid; e < ng * D; e += DW_DEC_THREADS) {
        const int64_t g = e / D, d = e % D;
        float o = 0.0f;
        for (int64_t part = 0; part < P; part++) o += os[(part * DW_DEC_HEADS + g) * D + d];
        po[((b * H + h0 + g) * NC + c) * D + d] = o;
    }
    if (tid < 2 * ng) pml[((b * H + h0 + tid / 2) * NC + c) * 2 + tid % 2] = ml[tid];
}

/* out (B,H,D) from the NC chunks' partials of each (b, h). */
template <typename T>
static __global__ void __launch_bounds__(DW_DEC_THREADS)
dw_dec_combine_kernel(T *out, const float *po, const float *pml, int64_t NC, int64_t H, int64_t D) {
    const int64_t h = blockIdx.x, b = blockIdx.y, r = b * H + h;
    const float *ml = pml + r * NC * 2;
    float M = -INFINITY;
    for (int64_t c = 0; c < NC; c++) M = fmaxf(M, ml[2 * c]);
    float L = 0.0f;
    for (int64_t c = 0; c < NC; c++) L += expf(ml[2 * c] - M) * ml[2 * c + 1];
    for (int64_t d = threadIdx.x; d < D; d += DW_DEC_THREADS) {
        float o = 0.0f;
        for (int64_t c = 0; c < NC; c++) o = fmaf(expf(ml[2 * c] - M), po[(r * NC + c) * D + d], o);
        dw_st(out, r * D + d, o / L);
    }
}

/* Keys per chunk for a call: split until about DW_DEC_TARGET_BLOCKS blocks, whole warps of keys. */
static int64_t dw_dec_chunk(int64_t keys, int64_t blocks_per_chunk) {
    int64_t ch = (keys * blocks_per_chunk + DW_DEC_TARGET_BLOCKS - 1) / DW_DEC_TARGET_BLOCKS;
    ch = (ch + 31) / 32 * 32;
    return ch < DW_DEC_MIN_CHUNK ? DW_DEC_MIN_CHUNK : ch > DW_DEC_MAX_CHUNK ? DW_DEC_MAX_CHUNK : ch;
}

template <typename T>
static cudaError_t dw_dec_launch(void *out, const void *q, const void *kc, const void *vc, int64_t B, int64_t S,
                                 int64_t n, int64_t H, int64_t Hkv, int64_t D, int64_t W, float cap, float *work,
                                 cudaStream_t s) {
    const int64_t j0 = W > 0 && n - W > 0 ? n - W : 0, group = H / Hkv;
    const int64_t hbatches = (group + DW_DEC_HEADS - 1) / DW_DEC_HEADS;
    const int64_t CH = dw_dec_chunk(n - j0, B * Hkv * hbatches), NC = (n - j0 + CH - 1) / CH;
    float *po = work, *pml = work + B * H * NC * D;
    const size_t smem = (size_t)dw_dec_smem_floats(D, CH) * sizeof(float);
    dw_dec_split_kernel<T><<<dim3((unsigned)NC, (unsigned)(Hkv * hbatches), (unsigned)B), DW_DEC_THREADS, smem, s>>>(
        po, pml, (const T *)q, (const T *)kc, (const T *)vc, S, n, j0, CH, NC, H, Hkv, D,
        (float)(1.0 / sqrt((double)D)), cap);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    dw_dec_combine_kernel<T><<<dim3((unsigned)H, (unsigned)B), DW_DEC_THREADS, 0, s>>>((T *)out, po, pml, NC, H, D);
    return cudaGetLastError();
}

extern "C" {

size_t dw_cuda_decode_attn_work_bytes(int64_t B, int64_t H, int64_t D, int64_t S) {
    const int64_t chunks = (S + DW_DEC_MIN_CHUNK - 1) / DW_DEC_MIN_CHUNK;
    return (size_t)(B * H * chunks * (D + 2)) * sizeof(float);
}

dw_status dw_cuda_decode_attn(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *q, const void *kc,
                              const void *vc, int64_t B, int64_t S, int64_t n, int64_t H, int64_t Hkv, int64_t D,
                              int64_t W, double cap, void *work, size_t work_bytes, void *stream) {
    const char *op = "decode_attn";
    DW_OPS_REQUIRE_DT(ctx, op, dt);
    DW_OPS_REQUIRE(ctx, op, B > 0 && B <= 65535 && S > 0 && n >= 1 && n <= S);
    DW_OPS_REQUIRE(ctx, op, H > 0 && Hkv > 0 && H % Hkv == 0 && H <= 65535 && D > 0 && D <= DW_CUDA_ATTN_MAX_D);
    DW_OPS_REQUIRE(ctx, op, W >= 0 && cap >= 0.0 && isfinite(cap));
    DW_OPS_REQUIRE(ctx, op, out && q && kc && vc && work);
    if (work_bytes < dw_cuda_decode_attn_work_bytes(B, H, D, S))
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: a workspace of %zu bytes, %zu needed (B=%lld H=%lld D=%lld S=%lld)",
                            op, work_bytes, dw_cuda_decode_attn_work_bytes(B, H, D, S), (long long)B, (long long)H,
                            (long long)D, (long long)S);
    cudaStream_t s = (cudaStream_t)stream;
    const cudaError_t e =
        dt == DW_ACT_F32 ? dw_dec_launch<float>(out, q, kc, vc, B, S, n, H, Hkv, D, W, (float)cap, (float *)work, s)
                         : dw_dec_launch<dw_bf16>(out, q, kc, vc, B, S, n, H, Hkv, D, W, (float)cap, (float *)work, s);
    if (e != cudaSuccess)
        return dw_set_error(ctx, DW_ERR_CUDA, "%s (B=%lld S=%lld n=%lld H=%lld Hkv=%lld D=%lld window %lld cap %g): %s",
                            op, (long long)B, (long long)S, (long long)n, (long long)H, (long long)Hkv, (long long)D,
                            (long long)W, cap, cudaGetErrorString(e));
    return DW_OK;
}

} /* extern "C" */
