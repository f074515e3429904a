/* test_ops_cuda_moe_group.c — the CUDA MoE router's DeepSeek-V3 variants (kernels/cuda/ops_moe.cu,
 * dw_cuda_moe_router_fwd_desc / _bwd_desc) against the CPU reference (kernels/cpu/router_cpu.c):
 * group-limited selection (n_group groups, topk_group kept, groups of one to many experts, up to 64
 * groups: two lanes' worth), the routed scaling factor, softmax and sigmoid, renormalised or not,
 * with the selection bias on and off, FP32 and BF16 storage; outputs poisoned, guard bands. The
 * GPU's group keys (and biased keys) are FP32 sums and the CPU's doubles, so a row whose last kept
 * group and the next, or (biased) whose K-th and next expert keys, come within 1e-4 is drawn again; then the experts must be equal, the weights
 * and dlogits within the elementwise tolerances. Needs a GPU (ctest label "gpu"); also runs on
 * tests/common/cuda_emu. */
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
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x6A0Bull);
    return dw_gc_init(state);
}

static const dw_act_dtype DTS[] = {DW_ACT_F32, DW_ACT_BF16};

/* Sorts items[0..n) by key descending (insertion sort). */
static void sort_desc(int64_t *items, int64_t n, const double *key) {
    for (int64_t i = 1; i < n; i++) {
        const int64_t v = items[i];
        int64_t j = i;
        while (j > 0 && key[items[j - 1]] < key[v]) items[j] = items[j - 1], j--;
        items[j] = v;
    }
}

/* Whether row z's choice cannot depend on FP32 against double: the last kept group's key and the
 * next group's at least 1e-4 apart, and with a bias (without, both choose by the stored logits)
 * the K + 1 largest keys score + bias within the kept groups too. */
static bool separated(const float *z, const float *b, int64_t E, int64_t K, const dw_router_desc *d) {
    double k[512], g[64], m = z[0], s = 0.0;
    for (int64_t e = 1; e < E; e++) m = fmax(m, (double)z[e]);
    for (int64_t e = 0; e < E; e++) s += exp((double)z[e] - m);
    for (int64_t e = 0; e < E; e++)
        k[e] = (d->score ? 1.0 / (1.0 + exp(-(double)z[e])) : exp((double)z[e] - m) / s) + (b ? (double)b[e] : 0.0);
    const int64_t G = d->n_group, S = E / G, kept = d->topk_group;
    int64_t order[64], cand[512], nc = 0;
    for (int64_t x = 0; x < G; x++) {
        double t1 = -INFINITY, t2 = -INFINITY;
        for (int64_t e = x * S; e < (x + 1) * S; e++) {
            if (k[e] > t1) t2 = t1, t1 = k[e];
            else if (k[e] > t2) t2 = k[e];
        }
        g[x] = S == 1 ? t1 : t1 + t2;
        order[x] = x;
    }
    sort_desc(order, G, g);
    if (kept < G && fabs(g[order[kept - 1]] - g[order[kept]]) < 1e-4) return false;
    if (!b) return true;
    for (int64_t i = 0; i < kept; i++)
        for (int64_t e = order[i] * S; e < (order[i] + 1) * S; e++) cand[nc++] = e;
    sort_desc(cand, nc, k);
    for (int64_t i = 0; i < K && i + 1 < nc; i++)
        if (fabs(k[cand[i]] - k[cand[i + 1]]) < 1e-4) return false;
    return true;
}

static int64_t run_group(dw_act_dtype dt, int64_t N, int64_t E, int64_t K, const dw_router_desc *d, int biased) {
    char name[160];
    snprintf(name, sizeof name, "moe_router grouped[%s %s%s%s N=%lld E=%lld K=%lld groups %lld keep %lld scale %g]",
             dw_gc_dtname(dt), d->score ? "sigmoid" : "softmax", d->renorm ? " renorm" : "", biased ? " biased" : "",
             (long long)N, (long long)E, (long long)K, (long long)d->n_group, (long long)d->topk_group, d->scale);
    int64_t bad = 0;
    float *bias = dw_oc_alloc(E);
    for (int64_t e = 0; e < E; e++) bias[e] = dw_test_uniform(&g_rng, -0.3f, 0.3f);
    dw_gt *z = dw_gt_new("logits", N * E, dt);
    for (int64_t n = 0; n < N; n++) {
        float *zr = z->host + n * E;
        int tries = 0;
        do { /* BF16-representable logits, so that both sides key the same values */
            for (int64_t e = 0; e < E; e++) {
                const float v = dw_test_uniform(&g_rng, -4.0f, 4.0f);
                zr[e] = dt == DW_ACT_BF16 ? dw_gc_bf2f(dw_gc_f2bf(v)) : v;
            }
        } while (!separated(zr, biased ? bias : NULL, E, K, d) && ++tries < 1000);
        if (tries >= 1000) fail_msg("%s: no separated row in 1000 draws", name);
    }
    dw_gt_upload(z);
    dw_gt *gb = dw_gt_from("bias", bias, E, DW_ACT_F32);
    const int32_t flag = biased;
    dw_gt *gon = dw_gt_ints("switch", &flag, 1);
    dw_gt *g = dw_gt_rand(&g_rng, "dweights", N * K, dt, -1, 1);
    dw_gt *w = dw_gt_out("weights", N * K, dt), *ix = dw_gt_out("experts", N * K, DW_ACT_F32);
    dw_gt *dz = dw_gt_out("dlogits", N * E, dt);
    float *ww = dw_oc_alloc(N * K), *wdz = dw_oc_alloc(N * E);
    int32_t *widx = malloc((size_t)(N * K) * 4), *gidx = malloc((size_t)(N * K) * 4);
    dw_cpu_moe_router_fwd_desc(ww, widx, z->host, biased ? bias : NULL, N, E, K, d);
    dw_cpu_moe_router_bwd_desc(wdz, g->host, z->host, widx, N, E, K, d);
    DW_GC_OK(bad, name, dw_cuda_moe_router_fwd_desc(NULL, dt, w->dev, (int32_t *)ix->dev, z->dev, gb->dev,
                                                    (const int32_t *)gon->dev, N, E, K, d, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_moe_router_bwd_desc(NULL, dt, dz->dev, g->dev, z->dev, (const int32_t *)ix->dev, N, E, K,
                                                    d, dw_gc_stream));
    DW_GC_SYNC();
    DW_GC_CUDA(cudaMemcpy(gidx, ix->dev, (size_t)(N * K) * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < N * K; i++)
        if (gidx[i] != widx[i]) {
            bad++;
            printf("MISMATCH %s experts[%lld]: gpu %d cpu %d\n", name, (long long)i, gidx[i], widx[i]);
            break;
        }
    DW_GC_CMP(bad, name, w, ww, dw_gc_pick(dt, 1e-6, 1e-5));
    dw_gc_tol tz = dw_gc_pick(dt, 1e-5, 1e-4);
    tz.abs = 4e-7 * (d->scale > 1 ? d->scale : 1);
    DW_GC_CMP(bad, name, dz, wdz, tz);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(bias), free(ww), free(wdz), free(widx), free(gidx);
    return bad;
}

static void test_router_grouped(void **state) {
    (void)state;
    /* E, n_group, topk_group, K: DeepSeek-V3's shape scaled down; groups of one; 64 groups (two
     * lanes each); a single group kept; every group kept */
    static const int64_t shapes[][4] = {{32, 8, 4, 8}, {16, 16, 3, 2}, {128, 64, 5, 4}, {24, 4, 1, 6},
                                        {12, 3, 3, 5}, {60, 6, 2, 20}};
    int64_t bad = 0;
    for (int dti = 0; dti < 2; dti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int score = 0; score < 2; score++)
                for (int renorm = 0; renorm < 2; renorm++) {
                    const dw_router_desc d = {.score = score, .renorm = renorm, .n_group = shapes[s][1],
                                              .topk_group = shapes[s][2],
                                              .scale = renorm ? 2.5 : dw_test_uniform(&g_rng, 0.5f, 3.0f)};
                    const int64_t N = 1 + (int64_t)(dw_test_next(&g_rng) % 40);
                    bad += run_group(DTS[dti], N, shapes[s][0], shapes[s][3], &d, (int)(s + score) % 2);
                }
    assert_int_equal(bad, 0);
}

/* Refusals: n_group not dividing E, more than 64 groups, K beyond the kept groups' experts. */
static void test_router_grouped_refused(void **state) {
    (void)state;
    const dw_router_desc bad_div = {.n_group = 5, .topk_group = 2}, many = {.n_group = 128, .topk_group = 2};
    const dw_router_desc reach = {.n_group = 4, .topk_group = 1};
    dw_gt *z = dw_gt_new("logits", 256, DW_ACT_F32), *w = dw_gt_out("w", 16, DW_ACT_F32);
    dw_gt *ix = dw_gt_out("experts", 16, DW_ACT_F32);
    assert_int_equal(dw_cuda_moe_router_fwd_desc(NULL, DW_ACT_F32, w->dev, (int32_t *)ix->dev, z->dev, NULL, NULL, 1, 16,
                                                 2, &bad_div, dw_gc_stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_moe_router_fwd_desc(NULL, DW_ACT_F32, w->dev, (int32_t *)ix->dev, z->dev, NULL, NULL, 1, 256,
                                                 2, &many, dw_gc_stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_moe_router_fwd_desc(NULL, DW_ACT_F32, w->dev, (int32_t *)ix->dev, z->dev, NULL, NULL, 1, 16,
                                                 5, &reach, dw_gc_stream), DW_ERR_INVALID);
    dw_gc_free_all();
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_router_grouped),
                                       cmocka_unit_test(test_router_grouped_refused)};
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
