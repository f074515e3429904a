/* test_head_xent_cuda.c — the fused LM head + cross-entropy (ops.def head_xent) on the GPU: for a
 * tied (gpt2-tiny) and an untied (qwen2-tiny) head at a vocabulary of 5003, in FP32 and BF16, at a
 * random chunk size that does not divide the rows, the fused program's loss and every parameter
 * gradient on the GPU against (a) the unfused program on the GPU and (b) the same fused program
 * on the CPU engine (the exact oracle), over two accumulated micro-batches with ignored targets;
 * three steps in a row (the later ones replayed from a CUDA graph) give the same loss; the fused
 * program's activation pool is smaller. Also the head quantised in fp8_block (--fallback none),
 * fused in chunks of 128 rows (fuse.c). Needs a GPU (label gpu).
 *
 * Tolerances: FP32 programs 1e-4 relative on the loss and 1e-4 of each gradient's largest
 * magnitude (FP32 sums in another order: the chunk's GEMM shapes, the xent row kernel's 16-byte
 * split of rows that start elsewhere); BF16 programs 2e-3 on the loss and 3e-2 of each gradient's
 * largest magnitude (BF16 logits and dlogits rounded from FP32 sums taken in another order: a
 * BF16 ulp, 2^-8, on some elements, carried through the dgrad and wgrad); the quantised head 5e-3
 * and 5e-2 against the unfused head on the GPU (a logit's BF16 ulp can move its dlogit's E4M3 code
 * by one, 1/16 of it), 0.25 against the CPU: every layer runs in fp8_block, and such code moves
 * in every dgrad add up in the first layers (16% of the largest in qwen2-tiny's layer-0 norm
 * weight on an H200; test_engine_cuda.c's fp8 parity allows 0.2 normwise). */
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

/* model at B x T (vocabulary V) compiled for this GPU, fused (chunk rows) or not; its engine on ctx.
 * head_q: the LM head in the precision too (--fallback none). */
static void make(run *r, const char *model, int64_t B, int64_t T, int64_t V, const char *precision, bool head_q,
                 bool fused, int64_t chunk, dw_ctx *ctx) {
    memset(r, 0, sizeof *r);
    dw_capture_opts co;
    dw_capture_opts_init(&co, sizeof co);
    co.batch = B, co.seq = T, co.vocab = V;
    if (dw_capture(g_gpu, model, &co, &r->g) != DW_OK) fail_msg("capture %s: %s", model, dw_errmsg(g_gpu));
    if (precision) assert_int_equal(dw_policy_from_precision(g_gpu, precision, !head_q, &r->pol), DW_OK);
    if (head_q) assert_int_equal(dw_policy_set_fallback(g_gpu, r->pol, "none"), DW_OK);
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

/* head_q: the head quantised in `precision` (a vocabulary of 5120, so its GEMMs run quantised;
 * 320 rows in chunks of 128 or 256, the last of 64). */
static int64_t case_one(const char *model, const char *precision, bool head_q) {
    const int64_t B = 2, T = head_q ? 160 : 64, V = head_q ? 5120 : 5003, N = B * T;
    int64_t chunk = head_q ? dw_test_rnd(17, 250) : dw_test_rnd(17, 60);
    if (N % chunk == 0) chunk++;
    const bool bf16 = precision != NULL;
    const double tl = head_q ? 5e-3 : bf16 ? 2e-3 : 1e-4, tg = head_q ? 5e-2 : bf16 ? 3e-2 : 1e-4;
    const double to = head_q ? 0.25 : tg; /* against the CPU: every layer in fp8_block (below) */
    char label[128];
    snprintf(label, sizeof label, "%s %s%s chunk %lld", model, bf16 ? precision : "fp32", head_q ? " (head too)" : "",
             (long long)chunk);
    run fused, plain, oracle;
    make(&fused, model, B, T, V, precision, head_q, true, chunk, g_gpu);
    make(&plain, model, B, T, V, precision, head_q, false, 0, g_gpu);
    make(&oracle, model, B, T, V, precision, head_q, true, chunk, g_cpu);
    assert_true(fused.c->head_xent >= 0);
    if (head_q) { /* its GEMMs quantised at the chunk's rows */
        const int H = fused.c->head_linear;
        assert_true(fused.c->head_chunk % 128 == 0 && fused.c->head_chunk < N);
        for (int p = 0; p < DW_QPASS_COUNT; p++)
            if (!dw_compile_linear_quantised(fused.c, H, (dw_qpass)p, fused.c->head_chunk, NULL, NULL, 0))
                fail_msg("%s: the head's pass %d runs BF16", label, p);
    }
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
    bad += compare_grads(&fused, &oracle, to, "fused GPU vs fused CPU");
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
        bad += case_one(models[m], NULL, false);
        bad += case_one(models[m], "bf16", false);
        bad += case_one(models[m], "fp8_block", true);
    }
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fused_head_cuda)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
