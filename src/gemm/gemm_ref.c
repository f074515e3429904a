/* gemm_ref.c — the CPU reference GEMM (the oracle): every operand dequantised exactly with the
 * formats decode functions into double, products accumulated in double, the epilogue in double,
 * one rounding at the end. Slow and simple on purpose; no fast-math, no fusion tricks. */
#include <math.h>
#include <stdlib.h>

#include "core/error.h"
#include "formats/formats.h"
#include "gemm/gemm_args.h"
#include "gemm/kernels.h"

/* GELU, tanh approximation, in double. */
static double gelu_tanh(double x) {
    const double k = 0.7978845608028654; /* sqrt(2/pi) */
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

/* d/dx of gelu_tanh. */
static double gelu_tanh_grad(double x) {
    const double k = 0.7978845608028654; /* sqrt(2/pi) */
    const double u = k * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

static double load_out(const void *p, int32_t type, int64_t i) {
    if (type == DW_GEMM_OUT_BF16) return dw_decode_bf16(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static void store_out(void *p, int32_t type, int64_t i, double v) {
    if (type == DW_GEMM_OUT_BF16) ((uint16_t *)p)[i] = dw_encode_bf16((float)v);
    else ((float *)p)[i] = (float)v;
}

dw_status dw_gemm_ref_run(dw_ctx *ctx, const dw_gemm_args *a, void *user) {
    (void)user;
    int64_t m = a->m, n = a->n, k = a->k;
    double *A = malloc((size_t)(m * k) * sizeof *A); /* op(A) [m, k] */
    double *B = malloc((size_t)(n * k) * sizeof *B); /* op(B)^T [n, k] */
    if (!A || !B) {
        free(A);
        free(B);
        return dw_set_error(ctx, DW_ERR_NOMEM, "gemm reference: out of host memory (%lldx%lldx%lld)",
                            (long long)m, (long long)n, (long long)k);
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; i++)
        for (int64_t p = 0; p < k; p++) A[i * k + p] = dw_gemm_operand_at(&a->a, i, p);
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++)
        for (int64_t p = 0; p < k; p++) B[j * k + p] = dw_gemm_operand_at(&a->b, p, j);

    int epi = a->epilogue;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double acc = 0;
            const double *x = A + i * k, *y = B + j * k;
            for (int64_t p = 0; p < k; p++) acc += x[p] * y[p];
            double v = (double)a->alpha * acc;
            if (a->beta != 0.0f) v += (double)a->beta * load_out(a->c, a->out_type, i * n + j);
            if (epi & DW_EPI_BIAS) v += load_out(a->bias, a->out_type, j);
            if (epi & DW_EPI_GELU_AUX) store_out(a->aux, a->out_type, i * n + j, v);
            if (epi & DW_EPI_GELU) v = gelu_tanh(v);
            if (epi & DW_EPI_DGELU) v *= gelu_tanh_grad(load_out(a->aux, a->out_type, i * n + j));
            store_out(a->d, a->out_type, i * n + j, v);
        }
        if (epi & DW_EPI_BGRAD) {
            double s = 0;
            for (int64_t p = 0; p < k; p++) s += A[i * k + p];
            store_out(a->bgrad, a->out_type, i, s);
        }
    }
    free(A);
    free(B);
    return DW_OK;
}

static const dw_kernel_desc ref_kernels[] = {
    {.name = "cpu_reference", .op = DW_KOP_GEMM, .recipe_a = -1, .recipe_b = -1, .device = DW_DEVICE_CPU,
     .priority = 0, .run = dw_gemm_ref_run},
};

dw_kernel_table dw_gemm_ref_kernels(void) {
    return (dw_kernel_table){ref_kernels, (int)(sizeof ref_kernels / sizeof ref_kernels[0])};
}
