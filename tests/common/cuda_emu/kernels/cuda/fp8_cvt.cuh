/* fp8_cvt.cuh (CUDA emulator) — host stand-ins for src/kernels/cuda/fp8_cvt.cuh's PTX conversions
 * (this file is found first on the emulator's include path): FORMATS.md's encoders from the library
 * (formats/formats.h), whose E4M3 and saturating E5M2 round to nearest even, clamp to the largest
 * finite code and encode NaN as 0x7F, as cvt.rn.satfinite does. lo in the low byte. */
#ifndef DW_KERNELS_CUDA_FP8_CVT_CUH
#define DW_KERNELS_CUDA_FP8_CVT_CUH

#include <stdint.h>

#include "formats/formats.h"

static inline uint32_t dw_cvt_e4m3x2(float lo, float hi) {
    return (uint32_t)dw_encode_e4m3(lo) | (uint32_t)dw_encode_e4m3(hi) << 8;
}
static inline uint32_t dw_cvt_e5m2x2(float lo, float hi) {
    return (uint32_t)dw_encode_e5m2(lo, true) | (uint32_t)dw_encode_e5m2(hi, true) << 8;
}

#endif /* DW_KERNELS_CUDA_FP8_CVT_CUH */
