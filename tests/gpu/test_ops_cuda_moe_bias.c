/* test_ops_cuda_moe_bias.c — the CUDA MoE router with a selection bias (kernels/cuda/ops_moe.cu,
 * dw_cuda_moe_router_fwd_biased) against the CPU reference (dw_cpu_moe_router_fwd_biased): fresh
 * random logits and biases, softmax and sigmoid, renormalised or not, FP32 and BF16 storage, one
 * and two lane passes over the experts, outputs poisoned, guard bands. The GPU keys are FP32 and the
 * CPU's doubles, so a row whose top K + 1 keys come within 1e-4 of each other is drawn again (an
 * exact tie, the same logit and bias on two experts, is kept: both sides give it to the lower
 * expert); then the experts must be equal and the weights the unbiased scores (elementwise
 * tolerance). The device switch: bias given but off, or no switch, chooses by the logits, as the
 * unbiased router. Needs a GPU (ctest label "gpu"); also runs on tests/common/cuda_emu. */
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
#include "kernels/cpu/ops_cpu.h"
#include "opcheck.h"
#include "testutil.h"

static dw_test_rng g_rng;

static int setup(void **state) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0xB1A5ull);
    return dw_gc_init(state);
}

static const dw_act_dtype DTS[] = {DW_ACT_F32, DW_ACT_BF16};

/* The keys of row z in double as the CPU reference forms them (score + bias). */
static void keys(const float *z, const float *b, int64_t E, int score, double *k) {
    double m = z[0], s = 0.0;
    for (int64_t e = 1; e < E; e++) m = fmax(m, (double)z[e]);
    for (int64_t e = 0; e < E; e++) s += exp((double)z[e] - m);
    for (int64_t e = 0; e < E; e++)
        k[e] = (score ? 1.0 / (1.0 + exp(-(double)z[e])) : exp((double)z[e] - m) / s) + (double)b[e];
}

/* Whether row z's top K + 1 keys are 1e-4 apart, pairs with the same logit and bias excepted. */
static bool separated(const float *z, const float *b, int64_t E, int64_t K, int score) {
    double k[512];
    keys(z, b, E, score, k);
    int64_t top[513];
    int64_t n = 0;
    for (int64_t e = 0; e < E; e++) { /* insertion into the K + 1 largest */
        int64_t j = n < K + 1 ? n++ : K + 1;
        if (j == K + 1 && k[e] <= k[top[K]]) continue;
        if (j == K + 1) j = K;
        while (j > 0 && k[top[j - 1]] < k[e]) top[j] = top[j - 1], j--;
        top[j] = e;
    }
    for (int64_t i = 0; i + 1 < n; i++)
        for (int64_t j = i + 1; j < n; j++)
            if (fabs(k[top[i]] - k[top[j]]) < 1e-4 && !(z[top[i]] == z[top[j]] && b[top[i]] == b[top[j]])) return false;
    return true;
}

static int64_t run_biased(dw_act_dtype dt, int64_t N, int64_t E, int64_t K, int score, int renorm, int on) {
    char name[128];
    snprintf(name, sizeof name, "moe_router biased[%s %s%s N=%lld E=%lld K=%lld on=%d]", dw_gc_dtname(dt),
             score ? "sigmoid" : "softmax", renorm ? " renorm" : "", (long long)N, (long long)E, (long long)K, on);
    int64_t bad = 0;
    float *bias = dw_oc_alloc(E);
    for (int64_t e = 0; e < E; e++) bias[e] = dw_test_uniform(&g_rng, -0.6f, 0.6f);
    if (E > 2) bias[E - 1] = bias[0]; /* with the logits below: an exact tie */
    dw_gt *z = dw_gt_new("logits", N * E, dt);
    for (int64_t n = 0; n < N; n++) {
        float *zr = z->host + n * E;
        int tries = 0;
        do { /* BF16-representable logits, so that both sides key the same values */
            for (int64_t e = 0; e < E; e++) {
                const float v = dw_test_uniform(&g_rng, -4.0f, 4.0f);
                zr[e] = dt == DW_ACT_BF16 ? dw_gc_bf2f(dw_gc_f2bf(v)) : v;
            }
            if (E > 2 && n % 2) zr[E - 1] = zr[0];
        } while (on && !separated(zr, bias, E, K, score) && ++tries < 1000);
        if (tries >= 1000) fail_msg("%s: no separated row in 1000 draws", name);
    }
    dw_gt_upload(z);
    dw_gt *gb = dw_gt_from("bias", bias, E, DW_ACT_F32);
    const int32_t flag = on;
    dw_gt *gon = dw_gt_ints("switch", &flag, 1);
    dw_gt *w = dw_gt_out("weights", N * K, dt), *ix = dw_gt_out("experts", N * K, DW_ACT_F32);
    float *ww = dw_oc_alloc(N * K);
    int32_t *widx = malloc((size_t)(N * K) * 4), *gidx = malloc((size_t)(N * K) * 4);
    dw_cpu_moe_router_fwd_biased(ww, widx, z->host, on ? bias : NULL, N, E, K, score, renorm);
    DW_GC_OK(bad, name, dw_cuda_moe_router_fwd_biased(NULL, dt, w->dev, (int32_t *)ix->dev, z->dev, gb->dev,
                                                      (const int32_t *)gon->dev, N, E, K, score, renorm, dw_gc_stream));
    DW_GC_SYNC();
    DW_GC_CUDA(cudaMemcpy(gidx, ix->dev, (size_t)(N * K) * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < N * K; i++)
        if (gidx[i] != widx[i]) {
            bad++;
            printf("MISMATCH %s experts[%lld]: gpu %d cpu %d\n", name, (long long)i, gidx[i], widx[i]);
            break;
        }
    DW_GC_CMP(bad, name, w, ww, dw_gc_pick(dt, 1e-6, 1e-5));
    if (!on) { /* no switch at all: the unbiased router's choice */
        dw_gt *ix2 = dw_gt_out("experts (no switch)", N * K, DW_ACT_F32);
        DW_GC_OK(bad, name, dw_cuda_moe_router_fwd_biased(NULL, dt, w->dev, (int32_t *)ix2->dev, z->dev, gb->dev, NULL,
                                                          N, E, K, score, renorm, dw_gc_stream));
        DW_GC_SYNC();
        DW_GC_CUDA(cudaMemcpy(gidx, ix2->dev, (size_t)(N * K) * 4, cudaMemcpyDeviceToHost));
        if (memcmp(gidx, widx, (size_t)(N * K) * 4)) bad++, printf("MISMATCH %s: without a switch\n", name);
    }
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(bias), free(ww), free(widx), free(gidx);
    return bad;
}

static void test_router_biased(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int d = 0; d < 2; d++)
        for (int score = 0; score < 2; score++)
            for (int renorm = 0; renorm < 2; renorm++)
                for (int on = 0; on < 2; on++) {
                    bad += run_biased(DTS[d], 1 + (int64_t)(dw_test_next(&g_rng) % 200), 8, 2, score, renorm, on);
                    bad += run_biased(DTS[d], 37, 64, 8, score, renorm, on); /* two lane passes */
                    bad += run_biased(DTS[d], 5, 3, 3, score, renorm, on);   /* every expert */
                    bad += run_biased(DTS[d], 3, 97, 9, score, renorm, on);  /* odd E */
                }
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_router_biased)};
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
