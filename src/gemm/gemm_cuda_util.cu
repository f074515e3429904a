// gemm_cuda_util.cu — scale re-layout kernels for the cuBLASLt backend: FP32 block scales
// transposed into cuBLASLt's outer-dimension-fastest layout (sm_90 VEC128 / BLK128x128), and
// UE8M0 / UE4M3 scales tiled 128x4 for Blackwell (sm_100 VEC32 / VEC16). Not a GEMM.
#include <cuda_runtime.h>

#include "gemm/gemm_cuda.h"

// dst [cols][ld] <- src [rows, cols]; padding rows (rows..ld) get 0.
static __global__ void transpose_scales_kernel(const float *src, int64_t rows, int64_t cols, int64_t ld,
                                               float *dst) {
    int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= cols * ld) return;
    int64_t c = idx / ld, r = idx % ld;
    dst[idx] = r < rows ? src[r * cols + c] : 0.0f;
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

extern "C" int dw_gemm_cuda_transpose_scales(const float *src, int64_t rows, int64_t cols, int64_t ld,
                                             float *dst, void *stream) {
    int64_t total = cols * ld;
    if (total == 0) return 0;
    transpose_scales_kernel<<<(unsigned)((total + 255) / 256), 256, 0, (cudaStream_t)stream>>>(src, rows, cols,
                                                                                                 ld, dst);
    return (int)cudaGetLastError();
}

extern "C" int dw_gemm_cuda_tile_scales(const uint8_t *src, int64_t rows, int64_t scols, uint8_t *dst,
                                        void *stream) {
    int64_t total = ((rows + 127) / 128) * ((scols + 3) / 4) * 512;
    tile_scales_kernel<<<(unsigned)((total + 255) / 256), 256, 0, (cudaStream_t)stream>>>(src, rows, scols, dst,
                                                                                            total);
    return (int)cudaGetLastError();
}
