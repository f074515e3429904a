/* test_gemm_util.h — shared by the GEMM tests (CPU and GPU): random operands in every recipe
 * (valid codes, no NaN/Inf unless asked), and an independent dense dequantisation that walks the
 * scale blocks (not the per-element indexing the library uses). Header-only, test code. */
#ifndef DW_TEST_GEMM_UTIL_H
#define DW_TEST_GEMM_UTIL_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats/formats.h"
#include "testutil.h"

typedef struct {
    dw_gemm_operand op;  /* host pointers */
    size_t data_bytes, scale_bytes;
    int64_t srows, scols;
} tg_operand;

static inline uint8_t tg_fp8_code(dw_test_rng *r, bool e5m2) {
    for (;;) {
        uint8_t c = (uint8_t)dw_test_next(r);
        if (!e5m2 && (c & 0x7f) == 0x7f) continue;          /* E4M3 NaN */
        if (e5m2 && ((c >> 2) & 31) == 31) continue;         /* E5M2 Inf/NaN */
        if (!e5m2 && ((c >> 3) & 15) >= 12) c &= 0xdf;       /* keep |x| <= 2^5 so sums stay tame */
        if (e5m2 && ((c >> 2) & 31) >= 20) c &= 0xbf;
        return c;
    }
}

/* A random stored matrix [rows, cols] in `recipe`; op(X) = trans ? X^T : X. */
static inline void tg_make(dw_test_rng *r, tg_operand *o, int32_t recipe, int64_t rows, int64_t cols, bool trans) {
    memset(o, 0, sizeof *o);
    o->op.recipe = recipe;
    o->op.trans = trans;
    o->op.rows = rows;
    o->op.cols = cols;
    o->op.tensor_scale = 1.0f;
    o->data_bytes = dw_gemm_operand_data_bytes(&o->op);
    uint8_t *d = malloc(o->data_bytes);
    if (recipe == DW_RECIPE_BF16) {
        uint16_t *h = (uint16_t *)d;
        for (int64_t i = 0; i < rows * cols; i++) h[i] = dw_encode_bf16(dw_test_normal(r));
    } else if (recipe == DW_RECIPE_MXFP4 || recipe == DW_RECIPE_NVFP4) {
        for (size_t i = 0; i < o->data_bytes; i++) d[i] = (uint8_t)dw_test_next(r);
    } else {
        for (size_t i = 0; i < o->data_bytes; i++) d[i] = tg_fp8_code(r, recipe == DW_RECIPE_MXFP8_E5M2);
    }
    o->op.data = d;
    if (recipe != DW_RECIPE_BF16) {
        dw_quant_scale_shape((dw_recipe)recipe, rows, cols, &o->srows, &o->scols);
        int64_t ns = o->srows * o->scols;
        o->scale_bytes = (size_t)ns * (size_t)dw_recipe_scale_bytes((dw_recipe)recipe);
        void *s = malloc(o->scale_bytes);
        for (int64_t i = 0; i < ns; i++) {
            if (dw_recipe_scale_bytes((dw_recipe)recipe) == 4)
                ((float *)s)[i] = ldexpf(dw_test_uniform(r, 1.0f, 2.0f), (int)(dw_test_next(r) % 9) - 4);
            else if (recipe == DW_RECIPE_NVFP4)
                ((uint8_t *)s)[i] = (uint8_t)(0x28 + dw_test_next(r) % 48); /* UE4M3 0.25 .. 16 */
            else
                ((uint8_t *)s)[i] = (uint8_t)(121 + dw_test_next(r) % 13); /* 2^-6 .. 2^6 */
        }
        o->op.scales = s;
        if (recipe == DW_RECIPE_NVFP4) o->op.tensor_scale = dw_test_uniform(r, 0.5f, 2.0f);
    }
}

static inline void tg_free(tg_operand *o) {
    free((void *)o->op.data);
    free((void *)o->op.scales);
    memset(o, 0, sizeof *o);
}

/* Dense op(X) [R, C] in double: decode every code, then multiply block by block. */
static inline double *tg_dense(const tg_operand *o) {
    int64_t rows = o->op.rows, cols = o->op.cols;
    double *x = malloc((size_t)(rows * cols) * sizeof *x);
    const uint8_t *d = o->op.data;
    int32_t rc = o->op.recipe;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double v;
            if (rc == DW_RECIPE_BF16) v = dw_decode_bf16(((const uint16_t *)d)[r * cols + c]);
            else if (rc == DW_RECIPE_MXFP4 || rc == DW_RECIPE_NVFP4)
                v = dw_decode_e2m1((uint8_t)((d[r * ((cols + 1) / 2) + c / 2] >> (4 * (c & 1))) & 15));
            else if (rc == DW_RECIPE_MXFP8_E5M2) v = dw_decode_e5m2(d[r * cols + c]);
            else v = dw_decode_e4m3(d[r * cols + c]);
            x[r * cols + c] = v;
        }
    if (rc != DW_RECIPE_BF16) {
        int br, bc;
        dw_recipe_block((dw_recipe)rc, &br, &bc);
        if (br == 0) br = (int)rows;
        if (bc == 0) bc = (int)cols;
        for (int64_t sr = 0; sr < o->srows; sr++)
            for (int64_t sc = 0; sc < o->scols; sc++) {
                double s;
                int64_t si = sr * o->scols + sc;
                if (dw_recipe_scale_bytes((dw_recipe)rc) == 4) s = ((const float *)o->op.scales)[si];
                else if (rc == DW_RECIPE_NVFP4)
                    s = dw_decode_ue4m3(((const uint8_t *)o->op.scales)[si]) * (double)o->op.tensor_scale;
                else s = dw_decode_ue8m0(((const uint8_t *)o->op.scales)[si]);
                for (int64_t r = sr * br; r < (sr + 1) * br && r < rows; r++)
                    for (int64_t c = sc * bc; c < (sc + 1) * bc && c < cols; c++) x[r * cols + c] *= s;
            }
    }
    if (o->op.trans) { /* return op(X) = X^T */
        double *t = malloc((size_t)(rows * cols) * sizeof *t);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) t[c * rows + r] = x[r * cols + c];
        free(x);
        x = t;
    }
    return x;
}

static inline double tg_gelu(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
/* GELU' by a central difference of tg_gelu (independent of the library's closed form; error ~1e-10) */
static inline double tg_gelu_grad(double x) { return (tg_gelu(x + 1e-5) - tg_gelu(x - 1e-5)) / 2e-5; }

/* Independent expected result (pre-rounding, double) of args with host operands o_a, o_b;
 * fills exp_d [m, n], exp_aux [m, n] (may be NULL), exp_bgrad [m] (may be NULL). c/bias given in
 * double; aux_in [m, n]: DGELU's pre-activation input, in double. */
static inline void tg_expect(const dw_gemm_args *a, const tg_operand *oa, const tg_operand *ob, const double *c,
                             const double *bias, const double *aux_in, double *exp_d, double *exp_aux,
                             double *exp_bgrad) {
    double *A = tg_dense(oa), *B = tg_dense(ob); /* [m, k], [k, n] */
    for (int64_t i = 0; i < a->m; i++) {
        for (int64_t j = 0; j < a->n; j++) {
            double s = 0;
            for (int64_t p = 0; p < a->k; p++) s += A[i * a->k + p] * B[p * a->n + j];
            double v = (double)a->alpha * s;
            if (a->beta != 0.0f) v += (double)a->beta * c[i * a->n + j];
            if (a->epilogue & DW_EPI_BIAS) v += bias[j];
            if (exp_aux) exp_aux[i * a->n + j] = v;
            if (a->epilogue & DW_EPI_GELU) v = tg_gelu(v);
            if (a->epilogue & DW_EPI_DGELU) v *= tg_gelu_grad(aux_in[i * a->n + j]);
            exp_d[i * a->n + j] = v;
        }
        if (exp_bgrad) {
            double s = 0;
            for (int64_t p = 0; p < a->k; p++) s += A[i * a->k + p];
            exp_bgrad[i] = s;
        }
    }
    free(A);
    free(B);
}

/* ||got - exp|| / ||exp|| over n values; NaN anywhere (got or exp) returns +Inf. */
static inline double tg_rel_err(const double *got, const double *exp, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(exp[i])) return INFINITY;
        num += (got[i] - exp[i]) * (got[i] - exp[i]);
        den += exp[i] * exp[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Output buffer of out_type [n] to double. */
static inline void tg_to_double(const void *p, int32_t type, int64_t n, double *out) {
    for (int64_t i = 0; i < n; i++)
        out[i] = type == DW_GEMM_OUT_BF16 ? dw_decode_bf16(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void tg_fill_out(dw_test_rng *r, void *p, int32_t type, int64_t n, double *as_double) {
    for (int64_t i = 0; i < n; i++) {
        float v = dw_test_normal(r);
        if (type == DW_GEMM_OUT_BF16) {
            ((uint16_t *)p)[i] = dw_encode_bf16(v);
            as_double[i] = dw_decode_bf16(((uint16_t *)p)[i]);
        } else {
            ((float *)p)[i] = v;
            as_double[i] = v;
        }
    }
}

static inline size_t tg_out_size(int32_t type) { return type == DW_GEMM_OUT_BF16 ? 2 : 4; }

#endif /* DW_TEST_GEMM_UTIL_H */
