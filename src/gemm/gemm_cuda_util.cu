// gemm_cuda_util.cu — scale re-layout kernels for the cuBLASLt backend: FP32 block scales
// transposed into cuBLASLt's outer-dimension-fastest layout (sm_90 VEC128 / BLK128x128), and
// UE8M0 / UE4M3 scales tiled 128x4 for Blackwell (sm_100 VEC32 / VEC16), and exact BF16
// dequantisation of MX / NVFP4 operands for the Hopper route. Not a GEMM.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gemm/gemm_cuda.h"

// dst [cols][ld] <- src [rows >> shift, cols], row r of dst's column reading source row r >> shift
// (shift 7 expands one scale per 128 rows to every row); padding rows (rows..ld) get 0. 32x32
// tiles through shared memory: both the reads (along cols) and the writes (along ld) coalesce.
static __global__ void transpose_scales_kernel(const float *src, int64_t rows, int shift, int64_t cols, int64_t ld,
                                               float *dst) {
    __shared__ float t[32][33];
    const int64_t r0 = (int64_t)blockIdx.x * 32, c0 = (int64_t)blockIdx.y * 32;
    const int tx = threadIdx.x, ty = threadIdx.y; // 32 x 8 threads
    for (int i = ty; i < 32; i += 8) { // t[row][col]
        const int64_t r = r0 + i, c = c0 + tx;
        t[i][tx] = r < rows && c < cols ? src[(r >> shift) * cols + c] : 0.0f;
    }
    __syncthreads();
    for (int i = ty; i < 32; i += 8) {
        const int64_t c = c0 + i, r = r0 + tx;
        if (c < cols && r < ld) dst[c * ld + r] = t[tx][i];
    }
}

// dst [rows][ld] <- src [rows, cols]; padding columns (cols..ld) get 0.
static __global__ void pad_scales_kernel(const float *src, int64_t rows, int64_t cols, int64_t ld, float *dst) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * ld) return;
    int64_t r = idx / ld, c = idx % ld;
    dst[idx] = c < cols ? src[r * cols + c] : 0.0f;
}

// One thread per destination byte of the tiled layout.
static __global__ void tile_scales_kernel(const uint8_t *src, int64_t rows, int64_t scols, uint8_t *dst,
                                          int64_t total) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    int64_t ctiles = (scols + 3) / 4;
    int64_t tile = idx / 512, within = idx % 512;
    int64_t rt = tile / ctiles, ct = tile % ctiles;
    int64_t r = rt * 128 + (within / 16) + ((within / 4) % 4) * 32;
    int64_t c = ct * 4 + within % 4;
    dst[idx] = (r < rows && c < scols) ? src[r * scols + c] : 0;
}

extern "C" int dw_gemm_cuda_transpose_scales_rows(const float *src, int64_t rows, int shift, int64_t cols, int64_t ld,
                                                  float *dst, void *stream) {
    if (cols == 0 || ld == 0) return 0;
    const dim3 grid((unsigned)((ld + 31) / 32), (unsigned)((cols + 31) / 32)), block(32, 8);
    transpose_scales_kernel<<<grid, block, 0, (cudaStream_t)stream>>>(src, rows, shift, cols, ld, dst);
    return (int)cudaGetLastError();
}

extern "C" int dw_gemm_cuda_transpose_scales(const float *src, int64_t rows, int64_t cols, int64_t ld,
                                             float *dst, void *stream) {
    return dw_gemm_cuda_transpose_scales_rows(src, rows, 0, cols, ld, dst, stream);
}

extern "C" int dw_gemm_cuda_pad_scales(const float *src, int64_t rows, int64_t cols, int64_t ld, float *dst,
                                       void *stream) {
    int64_t total = rows * ld;
    if (total == 0) return 0;
    pad_scales_kernel<<<(unsigned)((total + 255) / 256), 256, 0, (cudaStream_t)stream>>>(src, rows, cols, ld, dst);
    return (int)cudaGetLastError();
}

extern "C" int dw_gemm_cuda_tile_scales(const uint8_t *src, int64_t rows, int64_t scols, uint8_t *dst,
                                        void *stream) {
    int64_t total = ((rows + 127) / 128) * ((scols + 3) / 4) * 512;
    tile_scales_kernel<<<(unsigned)((total + 255) / 256), 256, 0, (cudaStream_t)stream>>>(src, rows, scols, dst,
                                                                                            total);
    return (int)cudaGetLastError();
}

// ---- alpha with NVFP4 tensor scales read on the device (same product order as the host path)
static __global__ void alpha_beta_kernel(float alpha, float beta, const float *pa, float va, const float *pb,
                                         float vb, float *out) {
    out[0] = alpha * (pa ? *pa : va) * (pb ? *pb : vb);
    out[1] = beta;
}

extern "C" int dw_gemm_cuda_alpha_beta(float alpha, float beta, const float *pa, float va, const float *pb, float vb,
                                       float *out, void *stream) {
    alpha_beta_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(alpha, beta, pa, va, pb, vb, out);
    return (int)cudaGetLastError();
}

// ---- MX / NVFP4 operands dequantised exactly into BF16 (the Hopper route for block-scaled
// recipes through BF16 tensor cores): every E4M3/E5M2/E2M1 code times its UE8M0/UE4M3 scale has
// at most 6 significant bits and an 8-bit exponent, so it is a BF16 value (NVFP4's FP32 tensor
// scale is left to alpha). Codes: 0 E4M3, 1 E5M2, 2 E2M1 (packed, even column low); scale
// kinds: 0 UE8M0 per 32, 1 UE4M3 per 16.
static __device__ float dec_elem(int kind, uint32_t c) {
    if (kind == 0) {
        uint32_t e = (c >> 3) & 15, m = c & 7;
        float v = (e == 15 && m == 7) ? __int_as_float(0x7fc00000)
                                      : (e ? ldexpf((float)(8 + m), (int)e - 10) : ldexpf((float)m, -9));
        return (c & 0x80) ? -v : v;
    }
    if (kind == 1) {
        uint32_t e = (c >> 2) & 31, m = c & 3;
        float v = e == 31 ? (m ? __int_as_float(0x7fc00000) : __int_as_float(0x7f800000))
                          : (e ? ldexpf((float)(4 + m), (int)e - 17) : ldexpf((float)m, -16));
        return (c & 0x80) ? -v : v;
    }
    const float t[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    float v = t[c & 7];
    return (c & 8) ? -v : v;
}

static __device__ float dec_scale(int kind, uint32_t c) {
    if (kind == 0) return c == 255 ? __int_as_float(0x7fc00000) : ldexpf(1.0f, (int)c - 127);
    return dec_elem(0, c & 0x7f);
}

// One thread per 8 consecutive elements of a row (cols % 8 == 0 on the fast path: one scale
// covers them, codes read as one 8- or 4-byte word, one 16-byte store); else one per element.
static __global__ void dequant_bf16_kernel(int ekind, int skind, const uint8_t *codes, const uint8_t *scales,
                                           int64_t rows, int64_t cols, int64_t row_bytes, int64_t scols,
                                           __nv_bfloat16 *out) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int blk = skind == 0 ? 32 : 16;
    if (cols % 8 == 0) {
        int64_t groups = cols / 8;
        if (idx >= rows * groups) return;
        int64_t r = idx / groups, c0 = (idx % groups) * 8;
        float s = dec_scale(skind, scales[r * scols + c0 / blk]);
        uint64_t w = ekind == 2 ? (uint64_t)*(const uint32_t *)(codes + r * row_bytes + c0 / 2)
                                : *(const uint64_t *)(codes + r * row_bytes + c0);
        __align__(16) __nv_bfloat16 v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t code = ekind == 2 ? (uint32_t)(w >> (4 * i)) & 15 : (uint32_t)(w >> (8 * i)) & 255;
            v[i] = __float2bfloat16_rn(dec_elem(ekind, code) * s);
        }
        *(uint4 *)(out + r * cols + c0) = *(const uint4 *)v;
        return;
    }
    if (idx >= rows * cols) return;
    int64_t r = idx / cols, c = idx % cols;
    uint32_t code = ekind == 2 ? (codes[r * row_bytes + c / 2] >> (4 * (c & 1))) & 15 : codes[r * row_bytes + c];
    out[idx] = __float2bfloat16_rn(dec_elem(ekind, code) * dec_scale(skind, scales[r * scols + c / blk]));
}

// Fast path (cols % 16 == 0): one thread per 16 consecutive elements (one scale, one 16- or
// 8-byte code load, two 16-byte stores), codes decoded through a 256-entry table in shared memory.
static __global__ void dequant16_bf16_kernel(int ekind, int skind, const uint8_t *codes, const uint8_t *scales,
                                             int64_t rows, int64_t cols, int64_t row_bytes, int64_t scols,
                                             __nv_bfloat16 *out) {
    __shared__ float lut[256];
    lut[threadIdx.x] = dec_elem(ekind, threadIdx.x & (ekind == 2 ? 15u : 255u)); // blockDim.x == 256
    __syncthreads();
    int64_t groups = cols / 16, idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * groups) return;
    int64_t r = idx / groups, c0 = (idx - r * groups) * 16;
    float s = dec_scale(skind, scales[r * scols + c0 / (skind == 0 ? 32 : 16)]);
    uint32_t w[4];
    if (ekind == 2) {
        uint2 v = *(const uint2 *)(codes + r * row_bytes + c0 / 2);
        w[0] = v.x, w[1] = v.y;
    } else {
        uint4 v = *(const uint4 *)(codes + r * row_bytes + c0);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    }
    __align__(16) __nv_bfloat162 o[8];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint32_t c0i, c1i;
        if (ekind == 2) {
            c0i = (w[i / 4] >> (8 * (i % 4))) & 15;
            c1i = (w[i / 4] >> (8 * (i % 4) + 4)) & 15;
        } else {
            c0i = (w[i / 2] >> (16 * (i % 2))) & 255;
            c1i = (w[i / 2] >> (16 * (i % 2) + 8)) & 255;
        }
        o[i] = __floats2bfloat162_rn(lut[c0i] * s, lut[c1i] * s);
    }
    uint4 *dst = (uint4 *)(out + r * cols + c0);
    dst[0] = *(const uint4 *)&o[0];
    dst[1] = *(const uint4 *)&o[4];
}

extern "C" int dw_gemm_cuda_dequant_bf16(int ekind, int skind, const uint8_t *codes, const uint8_t *scales,
                                         int64_t rows, int64_t cols, int64_t row_bytes, int64_t scols,
                                         uint16_t *out, void *stream) {
    if (cols % 16 == 0 && (ekind == 2 ? row_bytes % 8 : row_bytes % 16) == 0 && (uintptr_t)codes % 16 == 0) {
        int64_t n16 = rows * (cols / 16);
        dequant16_bf16_kernel<<<(unsigned)((n16 + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
            ekind, skind, codes, scales, rows, cols, row_bytes, scols, (__nv_bfloat16 *)out);
        return (int)cudaGetLastError();
    }
    int64_t total = cols % 8 == 0 ? rows * (cols / 8) : rows * cols;
    dequant_bf16_kernel<<<(unsigned)((total + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
        ekind, skind, codes, scales, rows, cols, row_bytes, scols, (__nv_bfloat16 *)out);
    return (int)cudaGetLastError();
}
