/* cuda_runtime_api.h (CUDA emulator) — the few CUDA runtime calls Deepwell's op kernels and GPU
 * tests use, implemented on the host (emu.cpp): "device" memory is host memory, streams are
 * synchronous. Only for running kernels on a machine without a GPU (tests/common/cuda_emu/run.sh);
 * never part of the library build. C and C++. */
#ifndef DW_CUDA_EMU_RUNTIME_API_H
#define DW_CUDA_EMU_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNotSupported = 801,
    cudaErrorLaunchFailure = 719
} cudaError_t;
typedef enum {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;
typedef enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;
/* The device and function queries of quant_common.cuh's kernel_fit. DW_EMU_OWN_DEVICE_QUERIES: the
 * includer brings its own (tests/gpu/test_quant_emu/shim.h: a settable SM count). */
#ifndef DW_EMU_OWN_DEVICE_QUERIES
enum { cudaFuncAttributePreferredSharedMemoryCarveout = 9 };
typedef enum {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
} cudaDeviceAttr;
typedef struct {
    size_t sharedSizeBytes;
} cudaFuncAttributes;
#endif
typedef struct dw_emu_stream *cudaStream_t;
#define cudaStreamNonBlocking 0x01

cudaError_t cudaGetDeviceCount(int *n);
#ifndef DW_EMU_OWN_DEVICE_QUERIES
cudaError_t cudaGetDevice(int *d);
/* an H100-like device: 132 SMs, 227 KiB of shared memory a block */
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d);
#endif
cudaError_t cudaSetDevice(int d);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);

#ifdef __cplusplus
}
#endif

#endif
