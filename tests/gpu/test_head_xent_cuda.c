/* test_head_xent_cuda.c — the fused LM head + cross-entropy (ops.def head_xent) on the GPU: for a
 * tied (gpt2-tiny) and an untied (qwen2-tiny) head at a vocabulary of 5003, in FP32 and BF16, at a
 * random chunk size that does not divide the rows, the fused program's loss and every parameter
 * gradient on the GPU against (a) the unfused program on the GPU and (b) the same fused program
 * on the CPU engine (the exact oracle), over two accumulated micro-batches with ignored targets;
 * three steps in a row (the later ones replayed from a CUDA graph) give the same loss; the fused
 * program's activation pool is smaller. Needs a GPU (label gpu).
 *
 * Tolerances: FP32 programs 1e-4 relative on the loss and 1e-4 of each gradient's largest
 * magnitude (FP32 sums in another order: the chunk's GEMM shapes, the xent row kernel's 16-byte
 * split of rows that start elsewhere); BF16 programs 2e-3 on the loss and 3e-2 of each gradient's
 * largest magnitude (BF16 logits and dlogits rounded from FP32 sums taken in another order: a
 * BF16 ulp, 2^-8, on some elements, carried through the dgrad and wgrad). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "kernels/cuda/attn_packed.h"
#include "runtime/engine.h"
#include "testutil.h"

static dw_ctx *g_cpu, *g_gpu;

static int setup(void **state) {
    (void)state;
    dw_cuda_attention_use("mma");
    if (dw_test_group_setup(state)) return -1; /* the seeded group rng (DW_TEST_SEED) */
    return dw_test_cpu_gpu_setup(&g_cpu, &g_gpu);
}
static int teardown(void **state) {
    dw_test_cpu_gpu_teardown(g_cpu, g_gpu);
    return dw_test_group_teardown(state);
}

typedef struct {
    dw_graph *g;
    dw_policy *pol;
    dw_compiled *c;
    dw_engine *e;
} run;

/* model at B x T (vocabulary V) compiled for this GPU, fused (chunk rows) or not; its engine on ctx. */
static void make(run *r, const char *model, int64_t B, int64_t T, int64_t V, const char *precision, bool fused,
                 int64_t chunk, dw_ctx *ctx) {
    memset(r, 0, sizeof *r);
    dw_capture_opts co;
    dw_capture_opts_init(&co, sizeof co);
    co.batch = B, co.seq = T, co.vocab = V;
    if (dw_capture(g_gpu, model, &co, &r->g) != DW_OK) fail_msg("capture %s: %s", model, dw_errmsg(g_gpu));
    if (precision) assert_int_equal(dw_policy_from_precision(g_gpu, precision, true, &r->pol), DW_OK);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.fused_head = fused, o.head_chunk = chunk;
    if (dw_compile(g_gpu, r->g, NULL, r->pol, &o, &r->c) != DW_OK) fail_msg("compile: %s", dw_errmsg(g_gpu));
    if (dw_engine_create(ctx, r->c, NULL, &r->e) != DW_OK) fail_msg("engine: %s", dw_errmsg(ctx));
}

static void drop(run *r) {
    dw_engine_free(r->e);
    dw_compiled_free(r->c);
    dw_policy_free(r->pol);
    dw_graph_free(r->g);
}

/* The same random weights, zeroed gradients, two micro-batches at 1/2 each: the losses. */
static void train2(run *r, uint64_t seed, const int32_t *x, const int32_t *y, int64_t B, int64_t T, double loss[2]) {
    dw_test_rng rng;
    dw_test_rng_init(&rng, seed);
    dw_test_random_params(r->e, &rng, 0.3f, NULL, 0.3f);
    assert_int_equal(dw_engine_refresh(r->e), DW_OK);
    assert_int_equal(dw_engine_zero_grad(r->e), DW_OK);
    for (int k = 0; k < 2; k++)
        if (dw_engine_forward_backward(r->e, x + k * B * T, y + k * B * T, B, T, 0.5, &loss[k]) != DW_OK)
            fail_msg("forward_backward: %s", dw_errmsg(g_gpu));
}

/* Every parameter gradient of a against b: max |a - b| <= tol * max |b| per tensor. */
static int64_t compare_grads(run *a, run *b, double tol, const char *label) {
    int64_t bad = 0;
    for (int i = 0; i < a->c->n_params; i++) {
        const int64_t n = dw_test_param_numel(a->e, i);
        float *ga = malloc((size_t)n * sizeof *ga), *gb = malloc((size_t)n * sizeof *gb);
        assert_true(ga && gb);
        assert_int_equal(dw_engine_grad_read(a->e, i, ga), DW_OK);
        assert_int_equal(dw_engine_grad_read(b->e, i, gb), DW_OK);
        double mx = 0, diff = 0;
        for (int64_t k = 0; k < n; k++) {
            mx = fmax(mx, fabs((double)gb[k]));
            const double d = fabs((double)ga[k] - (double)gb[k]);
            diff = isnan(d) ? INFINITY : fmax(diff, d);
        }
        if (!(diff <= tol * mx) || mx == 0) {
            printf("  %s: %s max diff %.3g of max %.3g\n", label, dw_engine_param_name(a->e, i), diff, mx);
            bad++;
        }
        free(ga), free(gb);
    }
    return bad;
}

static int64_t case_one(const char *model, const char *precision) {
    const int64_t B = 2, T = 64, V = 5003, N = B * T;
    int64_t chunk = dw_test_rnd(17, 60);
    if (N % chunk == 0) chunk++;
    const bool bf16 = precision != NULL;
    const double tl = bf16 ? 2e-3 : 1e-4, tg = bf16 ? 3e-2 : 1e-4;
    char label[128];
    snprintf(label, sizeof label, "%s %s chunk %lld", model, bf16 ? precision : "fp32", (long long)chunk);
    run fused, plain, oracle;
    make(&fused, model, B, T, V, precision, true, chunk, g_gpu);
    make(&plain, model, B, T, V, precision, false, 0, g_gpu);
    make(&oracle, model, B, T, V, precision, true, chunk, g_cpu);
    assert_true(fused.c->head_xent >= 0);
    const int64_t act_f = dw_compiled_pool_bytes(fused.c, 3), act_p = dw_compiled_pool_bytes(plain.c, 3);
    int64_t bad = act_f < act_p ? 0 : 1;
    int32_t *x = malloc(sizeof(int32_t) * 2 * N), *y = malloc(sizeof(int32_t) * 2 * N);
    assert_true(x && y);
    for (int64_t i = 0; i < 2 * N; i++) {
        x[i] = (int32_t)dw_test_rnd(0, V - 1);
        y[i] = i % 7 == 3 ? -100 : (int32_t)dw_test_rnd(0, V - 1);
    }
    const uint64_t seed = (uint64_t)dw_test_rnd(1, 1 << 30);
    double lf[2], lp[2], lo[2];
    train2(&fused, seed, x, y, B, T, lf);
    train2(&plain, seed, x, y, B, T, lp);
    train2(&oracle, seed, x, y, B, T, lo);
    for (int k = 0; k < 2; k++) {
        const bool ok = fabs(lf[k] - lp[k]) <= tl * fabs(lp[k]) && fabs(lf[k] - lo[k]) <= tl * fabs(lo[k]);
        printf("  %s: micro-batch %d loss fused %.7f, unfused %.7f, CPU %.7f%s\n", label, k, lf[k], lp[k], lo[k],
               ok ? "" : "  MISMATCH");
        bad += !ok;
    }
    bad += compare_grads(&fused, &plain, tg, "fused vs unfused (GPU)");
    bad += compare_grads(&fused, &oracle, tg, "fused GPU vs fused CPU");
    double l3[3]; /* the same step three times: the second records, the third replays */
    for (int k = 0; k < 3; k++) assert_int_equal(dw_engine_forward_backward(fused.e, x, y, B, T, 1.0, &l3[k]), DW_OK);
    if (l3[0] != l3[1] || l3[1] != l3[2]) {
        printf("  %s: repeated steps' losses %.9g %.9g %.9g\n", label, l3[0], l3[1], l3[2]);
        bad++;
    }
    printf("  %s: activation pool %lld -> %lld bytes; %s\n", label, (long long)act_p, (long long)act_f,
           bad ? "FAILED" : "ok");
    free(x), free(y);
    drop(&fused), drop(&plain), drop(&oracle);
    return bad;
}

static void test_fused_head_cuda(void **state) {
    (void)state;
    int64_t bad = 0;
    static const char *const models[] = {"gpt2-tiny", "qwen2-tiny"};
    for (int m = 0; m < 2; m++) {
        bad += case_one(models[m], NULL);
        bad += case_one(models[m], "bf16");
    }
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fused_head_cuda)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
