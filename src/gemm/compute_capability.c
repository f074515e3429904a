/* compute_capability.c — dw_gemm_ctx_sm: the device's compute capability, asked of the CUDA
 * runtime once per device index and cached for the process (0 on the CPU or without CUDA). */
#include "gemm/compute_capability.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

int dw_gemm_ctx_sm(dw_ctx *ctx) {
    if (dw_ctx_device(ctx) != DW_DEVICE_CUDA) return 0;
#if DW_HAVE_CUDA
    static int cached[64];
    int dev = dw_ctx_device_index(ctx);
    if (dev < 0 || dev >= 64) return 0;
    if (!cached[dev]) {
        int major = 0, minor = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        cached[dev] = major * 10 + minor;
    }
    return cached[dev];
#else
    return 0;
#endif
}
