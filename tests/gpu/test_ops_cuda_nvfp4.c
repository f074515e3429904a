/* test_ops_cuda_nvfp4.c — the NVFP4 training recipe's CUDA quantiser (kernels/cuda/ops_nvfp4.cu)
 * against the CPU reference (kernels/cpu/nvfp4_train_cpu.c), byte for byte: codes, UE4M3 scales
 * and the tensor scale, for FP32 and BF16 inputs, row-wise and transposed views, each recipe
 * piece alone and together (random Hadamard transform, 16x16 weight blocks, stochastic rounding
 * with seed/stream and a step given or taken from the tensor scale's bits), ragged shapes (rows and columns not multiples of 16, odd widths),
 * non-finite inputs, outputs poisoned before the call and guard bands around every buffer, and
 * the rht + block2d refusal. Needs a GPU (ctest label "gpu"); the host emulator
 * (tests/common/cuda_emu/run.sh) runs it too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucheck.h"
#include "kernels/cpu/nvfp4_train_cpu.h"
#include "kernels/cuda/nvfp4_cuda.h"
#include "opcheck.h"
#include "testutil.h"

static dw_test_rng g_rng;

static int setup(void **state) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x4F4Eull);
    return dw_gc_init(state);
}

/* A guarded device byte buffer of n bytes, poisoned with 0xEE. */
static dw_gt *bytes_out(const char *name, size_t n) {
    dw_gt *t = dw_gt_new(name, (int64_t)((n + 3) / 4), DW_ACT_F32);
    DW_GC_CUDA(cudaMemset(t->dev, 0xEE, n));
    DW_GC_CUDA(cudaDeviceSynchronize());
    return t;
}

static int64_t compare_bytes(const char *name, const char *what, const dw_gt *t, const void *want, size_t n) {
    unsigned char *got = malloc(n ? n : 1);
    DW_GC_CUDA(cudaMemcpy(got, t->dev, n, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != ((const unsigned char *)want)[i]) {
            if (bad < 4) fprintf(stderr, "%s: %s byte %zu: GPU %02x, CPU %02x\n", name, what, i, got[i], ((const unsigned char *)want)[i]);
            bad++;
        }
    free(got);
    return bad;
}

static int64_t run_case(dw_act_dtype dt, const dw_nvfp4_qopts *o, int64_t rows, int64_t cols, bool specials) {
    char name[160];
    snprintf(name, sizeof name, "nvfp4[%s %lldx%lld%s%s%s%s%s]", dw_gc_dtname(dt), (long long)rows, (long long)cols,
             o->trans ? " trans" : "", o->rht ? " rht" : "", o->block2d ? " 2d" : "", o->sr ? " sr" : "",
             specials ? " specials" : "");
    const int64_t n = rows * cols, R = o->trans ? cols : rows, C = o->trans ? rows : cols;
    dw_gt *x = dw_gt_new("x", n, dt);
    for (int64_t i = 0; i < n; i++)
        x->host[i] = dw_test_normal(&g_rng) * ldexpf(1.0f, (int)(dw_test_next(&g_rng) % 12) - 6);
    if (specials) x->host[dw_test_rnd(0, n - 1)] = (dw_test_next(&g_rng) & 1) ? NAN : -INFINITY;
    dw_gt_upload(x); /* host now holds exactly what the device holds */
    const size_t cb = dw_quant_codes_bytes(DW_RECIPE_NVFP4, R, C), sb = dw_quant_scales_bytes(DW_RECIPE_NVFP4, R, C);
    dw_gt *codes = bytes_out("codes", cb), *scales = bytes_out("scales", sb), *ts = bytes_out("tensor_scale", 4);
    dw_gt *ws = bytes_out("workspace", DW_NVFP4_CUDA_WORKSPACE_BYTES);
    dw_qtensor q = {.codes = malloc(cb), .scales = malloc(sb)};
    assert_int_equal(dw_nvfp4_quantize_cpu(NULL, o, x->host, rows, cols, &q), DW_OK);
    const dw_quant_dev_out out = {.codes = codes->dev, .scales = scales->dev, .tensor_scale = ts->dev};
    int64_t bad = 0;
    DW_GC_OK(bad, name, dw_nvfp4_quantize_cuda(NULL, o, dt == DW_ACT_BF16 ? DW_QUANT_IN_BF16 : DW_QUANT_IN_F32, x->dev,
                                               rows, cols, &out, ws->dev, dw_gc_stream));
    DW_GC_SYNC();
    bad += compare_bytes(name, "codes", codes, q.codes, cb);
    bad += compare_bytes(name, "scales", scales, q.scales, sb);
    bad += compare_bytes(name, "tensor scale", ts, &q.tensor_scale, 4);
    if (!dw_gc_guards_ok(name)) bad++;
    free(q.codes), free(q.scales);
    dw_gc_free_all();
    return bad;
}

static void test_nvfp4_recipe_matches_cpu(void **state) {
    (void)state;
    int64_t bad = 0;
    const dw_act_dtype dts[] = {DW_ACT_F32, DW_ACT_BF16};
    for (int trial = 0; trial < 6; trial++)
        for (int d = 0; d < 2; d++)
            for (int piece = 0; piece < 5; piece++)
                for (int t = 0; t < 2; t++) {
                    /* 0 plain, 1 rht, 2 sr, 3 rht + sr (the wgrad's dy^T), 4 16x16 blocks (weights) */
                    const dw_nvfp4_qopts o = {.trans = t, .rht = piece == 1 || piece == 3, .sr = piece == 2 || piece == 3,
                                              .block2d = piece == 4, .seed = dw_test_next(&g_rng),
                                              .stream = (uint32_t)dw_test_next(&g_rng),
                                              .step = (uint32_t)dw_test_next(&g_rng),
                                              .step_from_scale = trial % 2 == 1};
                    const int64_t rows = trial < 2 ? 16 * dw_test_rnd(1, 5) : dw_test_rnd(1, 80);
                    const int64_t cols = trial < 2 ? 16 * dw_test_rnd(1, 5) : dw_test_rnd(1, 80);
                    bad += run_case(dts[d], &o, rows, cols, trial == 5);
                }
    const dw_nvfp4_qopts both = {.rht = true, .block2d = true};
    float dummy[4]; /* refused before any launch: the pointers are never read */
    const dw_quant_dev_out fake = {.codes = (uint8_t *)dummy, .scales = dummy, .tensor_scale = dummy};
    assert_int_equal(dw_nvfp4_quantize_cuda(NULL, &both, DW_QUANT_IN_F32, dummy, 16, 16, &fake, dummy, NULL),
                     DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(NULL), "block2d"));
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nvfp4_recipe_matches_cpu)};
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
