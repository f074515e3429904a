/* fp8_cvt.cuh — private: the PTX conversions of two FP32 values to a pair of FP8 codes (E4M3,
 * E5M2; round to nearest even, saturating to the largest finite code, NaN to 0x7F), lo in the low
 * byte. quant_common.cuh's element encoders use them. Kept apart so that the CUDA emulator
 * (tests/common/cuda_emu) can put host stand-ins in their place. */
#ifndef DW_KERNELS_CUDA_FP8_CVT_CUH
#define DW_KERNELS_CUDA_FP8_CVT_CUH

#include <stdint.h>

__device__ __forceinline__ uint32_t dw_cvt_e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ uint32_t dw_cvt_e5m2x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

#endif /* DW_KERNELS_CUDA_FP8_CVT_CUH */
