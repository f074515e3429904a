/* recipe.c — CPU reference of the quantisation recipes of shared/FORMATS.md: block geometry,
 * scale shapes, quantise (FP32 or BF16 input) and dequantise. One block at a time, exactly as
 * written in the contract; the oracle for the CUDA kernels. Not the element codecs (elem.c) and
 * not the transposed copy or the swizzled scale layout (layout.c). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/sized.h"
#include "formats/formats.h"
#include "formats/rules.h"

typedef struct {
    const char *name;
    int block_rows, block_cols; /* 0 = whole dimension */
    int elem_bits, scale_bytes;
    dw_elem_format elem;
} recipe_info;

static const recipe_info RECIPES[DW_RECIPE_COUNT] = {
    [DW_RECIPE_BF16] = {"bf16", 0, 0, 16, 0, DW_FMT_BF16},
    [DW_RECIPE_FP8_TENSOR] = {"fp8_tensor", 0, 0, 8, 4, DW_FMT_E4M3},
    [DW_RECIPE_FP8_ROW] = {"fp8_row", 1, 0, 8, 4, DW_FMT_E4M3},
    [DW_RECIPE_FP8_BLOCK] = {"fp8_block", 1, 128, 8, 4, DW_FMT_E4M3},
    [DW_RECIPE_FP8_BLOCK2D] = {"fp8_block2d", 128, 128, 8, 4, DW_FMT_E4M3},
    [DW_RECIPE_MXFP8] = {"mxfp8", 1, 32, 8, 1, DW_FMT_E4M3},
    [DW_RECIPE_MXFP8_E5M2] = {"mxfp8_e5m2", 1, 32, 8, 1, DW_FMT_E5M2},
    [DW_RECIPE_MXFP4] = {"mxfp4", 1, 32, 4, 1, DW_FMT_E2M1},
    [DW_RECIPE_NVFP4] = {"nvfp4", 1, 16, 4, 1, DW_FMT_E2M1},
};

static bool valid_recipe(dw_recipe r) { return (int)r >= 0 && r < DW_RECIPE_COUNT; }

const char *dw_recipe_name(dw_recipe r) { return valid_recipe(r) ? RECIPES[r].name : "unknown"; }

bool dw_recipe_parse(const char *name, dw_recipe *out) {
    for (int i = 0; name && i < DW_RECIPE_COUNT; i++)
        if (!strcmp(name, RECIPES[i].name)) {
            if (out) *out = (dw_recipe)i;
            return true;
        }
    return false;
}

void dw_recipe_block(dw_recipe r, int *block_rows, int *block_cols) {
    DW_ASSERT(valid_recipe(r));
    if (block_rows) *block_rows = RECIPES[r].block_rows;
    if (block_cols) *block_cols = RECIPES[r].block_cols;
}

int dw_recipe_elem_bits(dw_recipe r) {
    DW_ASSERT(valid_recipe(r));
    return RECIPES[r].elem_bits;
}

int dw_recipe_scale_bytes(dw_recipe r) {
    DW_ASSERT(valid_recipe(r));
    return RECIPES[r].scale_bytes;
}

bool dw_recipe_is_mx(dw_recipe r) {
    return r == DW_RECIPE_MXFP8 || r == DW_RECIPE_MXFP8_E5M2 || r == DW_RECIPE_MXFP4;
}

const char *dw_scale_rounding_name(dw_scale_rounding r) {
    return r == DW_SCALE_RCEIL ? "rceil" : r == DW_SCALE_FLOOR ? "floor" : "unknown";
}

bool dw_scale_rounding_parse(const char *text, dw_scale_rounding *out) {
    if (!text) return false;
    if (!strcmp(text, "rceil")) *out = DW_SCALE_RCEIL;
    else if (!strcmp(text, "floor")) *out = DW_SCALE_FLOOR;
    else return false;
    return true;
}

static const dw_quantize_opts QUANTIZE_DEFAULTS = {
    .size = sizeof(dw_quantize_opts), .recipe = DW_RECIPE_COUNT, .rounding = DW_SCALE_RCEIL};

void dw_quantize_opts_init(dw_quantize_opts *o, size_t size) {
    if (o) dw_sized_init(o, size, &QUANTIZE_DEFAULTS, sizeof QUANTIZE_DEFAULTS);
}

dw_status dw_quant_opts_from_public(dw_ctx *ctx, const dw_quantize_opts *pub, dw_quant_opts *out) {
    dw_quantize_opts o = QUANTIZE_DEFAULTS;
    if (!pub) return dw_set_error(ctx, DW_ERR_INVALID, "quantize: NULL options");
    if (!dw_sized_read(&o, sizeof o, pub))
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize: options size is 0 (call dw_quantize_opts_init)");
    if (o.recipe == DW_RECIPE_COUNT)
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize: no recipe chosen (options field 'recipe')");
    if (!valid_recipe((dw_recipe)o.recipe) || o.recipe == DW_RECIPE_BF16)
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize: recipe %d is not a quantised recipe (fp8_tensor, "
                            "fp8_row, fp8_block, fp8_block2d, mxfp8, mxfp8_e5m2, mxfp4, nvfp4)", (int)o.recipe);
    if (o.rounding != DW_SCALE_RCEIL && o.rounding != DW_SCALE_FLOOR)
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize: scale rounding %d is not rceil (0) or floor (1)",
                            (int)o.rounding);
    *out = (dw_quant_opts){.recipe = (dw_recipe)o.recipe, .rounding = (dw_scale_rounding)o.rounding, .pow2 = o.pow2};
    return DW_OK;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void dw_quant_scale_shape(dw_recipe r, int64_t rows, int64_t cols, int64_t *srows, int64_t *scols) {
    DW_ASSERT(valid_recipe(r));
    const recipe_info *ri = &RECIPES[r];
    int64_t sr, sc;
    if (r == DW_RECIPE_BF16) sr = sc = 0;
    else {
        sr = ri->block_rows ? ceil_div(rows, ri->block_rows) : 1;
        sc = ri->block_cols ? ceil_div(cols, ri->block_cols) : 1;
    }
    if (srows) *srows = sr;
    if (scols) *scols = sc;
}

int64_t dw_quant_row_bytes(dw_recipe r, int64_t cols) {
    DW_ASSERT(valid_recipe(r));
    return RECIPES[r].elem_bits == 4 ? ceil_div(cols, 2) : cols * (RECIPES[r].elem_bits / 8);
}

size_t dw_quant_codes_bytes(dw_recipe r, int64_t rows, int64_t cols) {
    DW_ASSERT(valid_recipe(r));
    return (size_t)(rows * dw_quant_row_bytes(r, cols));
}

size_t dw_quant_scales_bytes(dw_recipe r, int64_t rows, int64_t cols) {
    int64_t sr, sc;
    dw_quant_scale_shape(r, rows, cols, &sr, &sc);
    return (size_t)(sr * sc * RECIPES[r].scale_bytes);
}

/* ---- quantisation ------------------------------------------------------------------------- */

typedef struct { /* one block: rows [r0, r1) x cols [c0, c1) of x [rows, cols] */
    int64_t r0, r1, c0, c1;
} block_rect;

static uint32_t block_amax_bits(const float *x, int64_t cols, block_rect b) {
    uint32_t m = 0;
    for (int64_t r = b.r0; r < b.r1; r++)
        for (int64_t c = b.c0; c < b.c1; c++) {
            uint32_t a = dw_rule_f2u(x[r * cols + c]) & 0x7FFFFFFFu;
            if (a > m) m = a;
        }
    return m;
}

static void put_code(dw_qtensor *q, int64_t r, int64_t c, unsigned code) {
    if (dw_recipe_elem_bits(q->recipe) == 4) {
        uint8_t *p = &q->codes[r * dw_quant_row_bytes(q->recipe, q->cols) + c / 2];
        *p = (uint8_t)((c & 1) ? ((*p & 0x0Fu) | (code << 4)) : ((*p & 0xF0u) | (code & 0xFu)));
    } else {
        q->codes[r * q->cols + c] = (uint8_t)code;
    }
}

static unsigned get_code(const dw_qtensor *q, int64_t r, int64_t c) {
    if (dw_recipe_elem_bits(q->recipe) == 4) {
        uint8_t b = q->codes[r * dw_quant_row_bytes(q->recipe, q->cols) + c / 2];
        return (c & 1) ? (b >> 4) : (b & 0xFu);
    }
    return q->codes[r * q->cols + c];
}

/* MX element format parameters: max normal and emax. */
static void mx_params(dw_recipe r, float *maxnorm, int *emax) {
    if (r == DW_RECIPE_MXFP8) *maxnorm = 448.0f, *emax = 8;
    else if (r == DW_RECIPE_MXFP8_E5M2) *maxnorm = 57344.0f, *emax = 15;
    else *maxnorm = 6.0f, *emax = 2;
}

static unsigned encode_elem(dw_recipe r, float v) {
    switch (r) {
    case DW_RECIPE_MXFP8_E5M2: return dw_encode_e5m2(v, true);
    case DW_RECIPE_MXFP4:
    case DW_RECIPE_NVFP4: return dw_encode_e2m1(v);
    default: return dw_encode_e4m3(v);
    }
}

/* Quantises one block with the recipe's rule; writes its codes and scale cell (sr, sc). */
static void quantize_block(const dw_quant_opts *o, const float *x, dw_qtensor *q, block_rect b,
                           int64_t sidx) {
    dw_recipe r = o->recipe;
    uint32_t amax = block_amax_bits(x, q->cols, b);
    if (r == DW_RECIPE_NVFP4) {
        float st = q->tensor_scale;
        uint8_t bc = dw_encode_ue4m3(dw_rule_u2f(amax) / (6.0f * st));
        if (dw_rule_nonfinite(dw_rule_f2u(st) & 0x7FFFFFFFu)) bc = 0x7F;
        ((uint8_t *)q->scales)[sidx] = bc;
        float d = dw_decode_ue4m3(bc) * st;
        for (int64_t i = b.r0; i < b.r1; i++)
            for (int64_t j = b.c0; j < b.c1; j++)
                put_code(q, i, j, d == 0.0f ? 0u : encode_elem(r, x[i * q->cols + j] / d));
        return;
    }
    if (dw_recipe_is_mx(r)) {
        float maxnorm;
        int emax;
        mx_params(r, &maxnorm, &emax);
        uint8_t sc = dw_rule_mx_scale_code(amax, maxnorm, emax, o->rounding == DW_SCALE_FLOOR);
        ((uint8_t *)q->scales)[sidx] = sc;
        unsigned nan_code = (r == DW_RECIPE_MXFP4) ? 0u : 0x7Fu;
        float inv = sc == 0xFF ? 0.0f : dw_rule_mx_inv_scale(sc);
        for (int64_t i = b.r0; i < b.r1; i++)
            for (int64_t j = b.c0; j < b.c1; j++) {
                unsigned code = sc == 0xFF ? nan_code
                                : amax == 0 ? 0u
                                            : encode_elem(r, x[i * q->cols + j] * inv);
                put_code(q, i, j, code);
            }
        return;
    }
    /* FP8 recipes with FP32 scales */
    float s = dw_rule_fp8_scale(amax, o->pow2);
    ((float *)q->scales)[sidx] = s;
    bool bad = dw_rule_nonfinite(amax);
    for (int64_t i = b.r0; i < b.r1; i++)
        for (int64_t j = b.c0; j < b.c1; j++)
            put_code(q, i, j, bad ? 0x7Fu : dw_encode_e4m3(x[i * q->cols + j] / s));
}

static dw_status check_args(dw_ctx *ctx, const dw_quant_opts *o, const void *x, int64_t rows,
                            int64_t cols, const dw_qtensor *q) {
    if (!o || !valid_recipe(o->recipe))
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize: unknown recipe");
    if (rows <= 0 || cols <= 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize %s: bad shape [%lld, %lld]",
                            dw_recipe_name(o->recipe), (long long)rows, (long long)cols);
    if (!x || !q || !q->codes || (o->recipe != DW_RECIPE_BF16 && !q->scales))
        return dw_set_error(ctx, DW_ERR_INVALID, "quantize %s: NULL buffer",
                            dw_recipe_name(o->recipe));
    return DW_OK;
}

dw_status dw_quantize_cpu(dw_ctx *ctx, const dw_quant_opts *o, const float *x, int64_t rows,
                          int64_t cols, dw_qtensor *q) {
    DW_TRY(check_args(ctx, o, x, rows, cols, q));
    dw_recipe r = o->recipe;
    q->recipe = r;
    q->rows = rows;
    q->cols = cols;
    q->tensor_scale = 1.0f;
    if (r == DW_RECIPE_BF16) {
        uint16_t *out = (uint16_t *)(void *)q->codes;
        for (int64_t i = 0; i < rows * cols; i++) out[i] = dw_encode_bf16(x[i]);
        return DW_OK;
    }
    memset(q->codes, 0, dw_quant_codes_bytes(r, rows, cols));
    if (r == DW_RECIPE_NVFP4)
        q->tensor_scale = dw_rule_nvfp4_tensor_scale(block_amax_bits(x, cols, (block_rect){0, rows, 0, cols}));
    int br = RECIPES[r].block_rows, bcl = RECIPES[r].block_cols;
    int64_t srows, scols;
    dw_quant_scale_shape(r, rows, cols, &srows, &scols);
    for (int64_t si = 0; si < srows; si++)
        for (int64_t sj = 0; sj < scols; sj++) {
            block_rect b = {br ? si * br : 0, br ? si * br + br : rows, bcl ? sj * bcl : 0,
                            bcl ? sj * bcl + bcl : cols};
            if (b.r1 > rows) b.r1 = rows;
            if (b.c1 > cols) b.c1 = cols;
            quantize_block(o, x, q, b, si * scols + sj);
        }
    return DW_OK;
}

dw_status dw_quantize_bf16_cpu(dw_ctx *ctx, const dw_quant_opts *o, const uint16_t *x, int64_t rows,
                               int64_t cols, dw_qtensor *q) {
    DW_TRY(check_args(ctx, o, x, rows, cols, q));
    float *xf = malloc((size_t)(rows * cols) * sizeof *xf);
    if (!xf) return dw_set_error(ctx, DW_ERR_NOMEM, "quantize: out of memory for [%lld, %lld]",
                                 (long long)rows, (long long)cols);
    for (int64_t i = 0; i < rows * cols; i++) xf[i] = dw_decode_bf16(x[i]);
    dw_status s = dw_quantize_cpu(ctx, o, xf, rows, cols, q);
    free(xf);
    return s;
}

/* ---- dequantisation ----------------------------------------------------------------------- */

static float decode_elem(dw_recipe r, unsigned c) {
    switch (r) {
    case DW_RECIPE_MXFP8_E5M2: return dw_decode_e5m2((uint8_t)c);
    case DW_RECIPE_MXFP4:
    case DW_RECIPE_NVFP4: return dw_decode_e2m1((uint8_t)c);
    default: return dw_decode_e4m3((uint8_t)c);
    }
}

void dw_dequantize_cpu(const dw_qtensor *q, float *y) {
    dw_recipe r = q->recipe;
    DW_ASSERT(valid_recipe(r));
    if (r == DW_RECIPE_BF16) {
        const uint16_t *in = (const uint16_t *)(const void *)q->codes;
        for (int64_t i = 0; i < q->rows * q->cols; i++) y[i] = dw_decode_bf16(in[i]);
        return;
    }
    int br = RECIPES[r].block_rows, bcl = RECIPES[r].block_cols;
    int64_t srows, scols;
    dw_quant_scale_shape(r, q->rows, q->cols, &srows, &scols);
    for (int64_t i = 0; i < q->rows; i++)
        for (int64_t j = 0; j < q->cols; j++) {
            int64_t sidx = (br ? i / br : 0) * scols + (bcl ? j / bcl : 0);
            float e = decode_elem(r, get_code(q, i, j)), v;
            if (RECIPES[r].scale_bytes == 4) v = e * ((const float *)q->scales)[sidx];
            else if (r == DW_RECIPE_NVFP4)
                v = e * dw_decode_ue4m3(((const uint8_t *)q->scales)[sidx]) * q->tensor_scale;
            else v = e * dw_decode_ue8m0(((const uint8_t *)q->scales)[sidx]);
            y[i * q->cols + j] = v;
        }
}
