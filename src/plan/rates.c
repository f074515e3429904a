/* rates.c — achievable GEMM rates for the planner: datasheet peak x a shape efficiency curve,
 * capped by the HBM roofline, optionally corrected by measured `deepwell bench gemm --json`
 * results. Not a kernel benchmark: it runs nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "plan/plan.h"

/* Large-GEMM efficiency ceilings (fraction of the precision's dense datasheet peak) in sustained
 * training (power-capped clocks, real epilogues): cuBLAS(Lt) BF16 ~0.75 of peak on big GEMMs;
 * block-scaled FP8 pays for scale handling (~0.62 on Hopper's 1x128/128x128 path, ~0.72 native
 * on Blackwell); NVFP4 on Blackwell ~0.65 of the FP4 peak. Assumptions, not measurements:
 * `--gemm-rates` replaces them with a bench file. */
#define EFF_BF16 0.75
#define EFF_FP8_HOPPER 0.62
#define EFF_LOWP_BLACKWELL 0.72
#define EFF_FP4_BLACKWELL 0.65
/* MXFP8 / NVFP4 on Hopper are emulated (FORMATS.md): FP8 tensor cores with the 1x32 / 1x16
 * scales applied in software per K-block. Stated overheads: MXFP8 runs at 0.60x and NVFP4 at
 * 0.50x the block-scaled FP8 rate. */
#define HOPPER_MXFP8_FACTOR 0.60
#define HOPPER_NVFP4_FACTOR 0.50
/* Fraction of HBM bandwidth a memory-bound GEMM or elementwise kernel reaches. */
#define HBM_EFF 0.75
/* A GEMM with a dimension that is not a multiple of 8 has rows off 16-byte alignment (BF16), and
 * cuBLASLt falls back to much slower kernels. Measured on the H200 (docs/planner.md: GPT-2's LM
 * head at vocabulary 50257 vs 50304 in the training step: ~125 vs ~700 TFLOP/s): 5.6x slower.
 * Used when a rates file has no misaligned point (`deepwell bench gemm --shapes vocab` measures
 * them); with one, the measurement decides. */
#define MISALIGNED_SLOWDOWN 5.6

static bool aligned8(double m, double n, double k) {
    return fmod(m, 8.0) == 0 && fmod(n, 8.0) == 0 && fmod(k, 8.0) == 0;
}

static double peak_of(const dw_gpu_info *g, dw_recipe p, double *ceil) {
    bool blackwell = g->cc_major >= 10;
    switch (p) {
    case DW_RECIPE_BF16: *ceil = EFF_BF16; return g->peak_bf16_tflops;
    case DW_RECIPE_FP8_BLOCK:
        *ceil = blackwell ? EFF_LOWP_BLACKWELL : EFF_FP8_HOPPER;
        return g->peak_fp8_tflops;
    case DW_RECIPE_MXFP8:
        if (g->mx_block_scaling) { *ceil = EFF_LOWP_BLACKWELL; return g->peak_fp8_tflops; }
        *ceil = EFF_FP8_HOPPER * HOPPER_MXFP8_FACTOR;
        return g->peak_fp8_tflops;
    case DW_RECIPE_NVFP4:
        if (g->fp4 && g->peak_fp4_tflops > 0) {
            *ceil = EFF_FP4_BLACKWELL;
            return g->peak_fp4_tflops;
        }
        *ceil = EFF_FP8_HOPPER * HOPPER_NVFP4_FACTOR;
        return g->peak_fp8_tflops;
    default: *ceil = 0; return 0;
    }
}

/* Bytes per operand element (codes only; scales are small). */
static double elem_bytes(dw_recipe p) {
    return p == DW_RECIPE_BF16 ? 2.0 : p == DW_RECIPE_NVFP4 ? 0.5 : 1.0;
}

/* Tile-quantisation knee: a dimension x reaches x/(x+x0) of the ceiling. Lower precisions use
 * bigger tiles for the same arithmetic intensity, so their knee is further out. */
static double knee(dw_recipe p) { return p == DW_RECIPE_BF16 ? 64 : p == DW_RECIPE_NVFP4 ? 256 : 128; }

double dw_plan_gemm_eff(const dw_gpu_info *g, dw_recipe prec, double m, double n, double k) {
    double ceil = 0, peak = peak_of(g, prec, &ceil);
    if (peak <= 0 || m <= 0 || n <= 0 || k <= 0) return 0;
    double x0 = knee(prec);
    double eff = ceil * (m / (m + x0)) * (n / (n + x0)) * (k / (k + x0));
    /* roofline: each operand read once, output written once (BF16) */
    if (g->hbm_gbps > 0) {
        double bytes = (m * k + k * n) * elem_bytes(prec) + m * n * 2.0;
        double mem_rate = 2.0 * m * n * k / (bytes / (g->hbm_gbps * 1e9 * HBM_EFF));
        double mem_eff = mem_rate / (peak * 1e12);
        if (mem_eff < eff) eff = mem_eff;
    }
    return eff;
}

static double model_rate(const dw_gpu_info *g, dw_recipe prec, double m, double n, double k) {
    double ceil = 0, peak = peak_of(g, prec, &ceil);
    return peak * 1e12 * dw_plan_gemm_eff(g, prec, m, n, k);
}

double dw_plan_peak_flops(const dw_gpu_info *g, dw_recipe prec) {
    double ceil = 0;
    return peak_of(g, prec, &ceil) * 1e12;
}

double dw_plan_gemm_rate(const dw_plan_in *in, dw_recipe prec, double m, double n, double k) {
    const dw_gpu_info *g = &in->hw->gpus[0];
    double r = model_rate(g, prec, m, n, k);
    const bool al = aligned8(m, n, k);
    const dw_gemm_table *t = in->gemm;
    /* Measured correction: inverse-square-distance weighting, in log2(m,n,k) space, of the ratio
     * measured / modelled at each measured point of this precision and of the same 8-alignment
     * class (a misaligned GEMM is corrected only by misaligned measurements). An exact hit
     * returns the measurement; far from every point the correction tends to the points' mean
     * ratio; no point of the class: the model (divided by the slowdown when misaligned). */
    double wsum = 0, rsum = 0;
    for (int i = 0; t && r > 0 && i < t->n; i++) {
        const dw_gemm_point *p = &t->pts[i];
        if (p->recipe != prec || aligned8((double)p->m, (double)p->n, (double)p->k) != al) continue;
        double dm = log2(m / (double)p->m), dn = log2(n / (double)p->n), dk = log2(k / (double)p->k);
        double d2 = dm * dm + dn * dn + dk * dk;
        double mr = model_rate(g, prec, (double)p->m, (double)p->n, (double)p->k);
        if (mr <= 0) continue;
        double ratio = p->tflops * 1e12 / mr;
        if (d2 < 1e-12) return p->tflops * 1e12;
        rsum += ratio / d2;
        wsum += 1.0 / d2;
    }
    if (wsum > 0) return r * (rsum / wsum);
    return al ? r : r / MISALIGNED_SLOWDOWN;
}

void dw_gemm_table_free(dw_gemm_table *t) {
    if (!t) return;
    free(t->pts);
    t->pts = NULL;
    t->n = 0;
}

dw_status dw_gemm_table_load(dw_ctx *ctx, const char *path, dw_gemm_table *out) {
    memset(out, 0, sizeof *out);
    json_t *root = NULL;
    DW_TRY(dw_json_load_file(ctx, path, &root));
    const json_t *arr = json_is_array(root) ? root : json_object_get(root, "results");
    if (!json_is_array(arr)) {
        json_decref(root);
        return dw_set_error(ctx, DW_ERR_FORMAT,
                            "%s: expected an array of {m,n,k,recipe,tflops} or an object with "
                            "a \"results\" array", path);
    }
    size_t n = json_array_size(arr);
    out->pts = calloc(n ? n : 1, sizeof *out->pts);
    if (!out->pts) {
        json_decref(root);
        return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    dw_status s = DW_OK;
    for (size_t i = 0; i < n && s == DW_OK; i++) {
        const json_t *e = json_array_get(arr, i);
        char what[64];
        snprintf(what, sizeof what, "%s: results[%zu]", path, i);
        long long m = 0, nn = 0, k = 0;
        double tf = 0;
        const char *rec = NULL;
        dw_gemm_point *p = &out->pts[out->n];
        if (!json_is_object(e)) {
            s = dw_set_error(ctx, DW_ERR_FORMAT, "%s: expected an object", what);
            break;
        }
        if ((s = dw_json_get_int(ctx, e, "m", what, &m)) || (s = dw_json_get_int(ctx, e, "n", what, &nn)) ||
            (s = dw_json_get_int(ctx, e, "k", what, &k)) ||
            (s = dw_json_get_num(ctx, e, "tflops", what, &tf)) ||
            (s = dw_json_get_str(ctx, e, "recipe", what, &rec)))
            break;
        if (m < 1 || nn < 1 || k < 1 || !(tf > 0) || !isfinite(tf)) {
            s = dw_set_error(ctx, DW_ERR_FORMAT, "%s: m, n, k and tflops must be positive", what);
            break;
        }
        if (!dw_recipe_parse(rec, &p->recipe) || !dw_plan_supports_recipe(p->recipe))
            continue; /* recipes the planner does not model */
        p->m = m;
        p->n = nn;
        p->k = k;
        p->tflops = tf;
        out->n++;
    }
    json_decref(root);
    if (s != DW_OK) dw_gemm_table_free(out);
    return s;
}
