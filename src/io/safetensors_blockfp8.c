/* safetensors_blockfp8.c — Hugging Face fine-grained FP8 weights (transformers' finegrained_fp8,
 * DeepSeek-V3's checkpoints, Deepwell's own `export --format hf-fp8`): E4M3 codes NAME [..., R, C]
 * next to NAME_scale_inv [..., ceil(R/128), ceil(C/128)] (F32, BF16 or F16), read back as FP32
 * values: code x scale_inv of its 128 x 128 block. Other block sizes are refused by shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "formats/formats.h"
#include "io/safetensors.h"

enum { BLOCK = 128 };

char *dw_st_scale_inv_name(const char *name) {
    size_t n = strlen(name) + sizeof "_scale_inv";
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s_scale_inv", name);
    return s;
}

dw_status dw_st_check_block_fp8(dw_ctx *ctx, const dw_st_file *f, const dw_st_tensor *codes, const dw_st_file *sf,
                                const dw_st_tensor *scale) {
    if (codes->dtype != DW_DT_F8_E4M3)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (block-scaled FP8 weights are F8_E4M3)",
                            dw_st_path(f), codes->name, dw_dtype_name(codes->dtype));
    if (!scale)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: FP8 tensor '%s' has no '%s_scale_inv' next to it (its block scales)",
                            dw_st_path(f), codes->name, codes->name);
    if (scale->dtype != DW_DT_F32 && scale->dtype != DW_DT_BF16 && scale->dtype != DW_DT_F16)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' has dtype %s (F32, BF16 or F16 scales expected)",
                            dw_st_path(sf), scale->name, dw_dtype_name(scale->dtype));
    bool ok = codes->ndim >= 2 && scale->ndim == codes->ndim;
    for (int d = 0; ok && d < codes->ndim; d++) {
        const int64_t want = d < codes->ndim - 2 ? codes->shape[d] : (codes->shape[d] + BLOCK - 1) / BLOCK;
        ok = scale->shape[d] == want;
    }
    if (!ok)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s' (%d dimensions) does not hold one scale per 128 x 128 "
                            "block of '%s' (%d dimensions, last two %lld x %lld): other block sizes are not read",
                            dw_st_path(sf), scale->name, scale->ndim, codes->name, codes->ndim,
                            (long long)(codes->ndim >= 2 ? codes->shape[codes->ndim - 2] : 0),
                            (long long)(codes->ndim >= 1 ? codes->shape[codes->ndim - 1] : 0));
    return DW_OK;
}

dw_status dw_st_read_block_fp8(dw_ctx *ctx, const dw_st_file *f, const dw_st_tensor *codes, const dw_st_file *sf,
                               const dw_st_tensor *scale, float *out) {
    DW_TRY(dw_st_check_block_fp8(ctx, f, codes, sf, scale));
    const int64_t R = codes->shape[codes->ndim - 2], C = codes->shape[codes->ndim - 1];
    const int64_t lead = dw_st_numel(codes) / (R * C > 0 ? R * C : 1);
    const int64_t SR = (R + BLOCK - 1) / BLOCK, SC = (C + BLOCK - 1) / BLOCK;
    float *s = malloc((size_t)(dw_st_numel(scale) > 0 ? dw_st_numel(scale) : 1) * sizeof *s);
    if (!s) return dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory for '%s'", dw_st_path(sf), scale->name);
    dw_status st = dw_st_read_f32(ctx, sf, scale, s);
    const unsigned char *p = codes->data;
    for (int64_t l = 0; st == DW_OK && l < lead; l++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) {
                const int64_t i = (l * R + r) * C + c;
                out[i] = dw_decode_e4m3(p[i]) * s[(l * SR + r / BLOCK) * SC + c / BLOCK];
            }
    free(s);
    return st;
}
