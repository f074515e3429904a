/* safetensors_convert.c — a file's floating-point tensor as FP32, alignment-safe (memcpy per
 * element: the data may sit at any offset of the mapping): F32, F64, F16 and BF16; any other
 * dtype is refused naming the file and the tensor. */
#include <math.h>
#include <string.h>

#include "core/error.h"
#include "io/safetensors.h"

/* IEEE binary16 → binary32, exact (every half is a float). */
static float half_to_float(uint16_t h) {
    int e = (h >> 10) & 0x1F;
    int m = h & 0x3FF;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 0x400), e - 25);
    return (h & 0x8000) ? -v : v;
}

dw_status dw_st_read_f32(dw_ctx *ctx, const dw_st_file *f, const dw_st_tensor *t, float *out) {
    const unsigned char *p = t->data;
    int64_t n = dw_st_numel(t);
    switch (t->dtype) {
    case DW_DT_F32: memcpy(out, p, (size_t)n * 4); break;
    case DW_DT_F64:
        for (int64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            out[i] = (float)d;
        }
        break;
    case DW_DT_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = half_to_float(h);
        }
        break;
    case DW_DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&out[i], &bits, 4);
        }
        break;
    default:
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                            "%s: tensor '%s': dtype %s cannot be read as F32 (F32, F16, BF16, F64 can)",
                            dw_st_path(f), t->name, dw_dtype_name(t->dtype));
    }
    return DW_OK;
}
