/* test_head_xent.c — the fused LM head + cross-entropy (ops.def head_xent, compile/fuse.c,
 * dw_compile_opts.fused_head) on the CPU engine: for tied (gpt2, llama) and untied (qwen2) heads in
 * FP32, BF16 and fp8_block, a program with the head fused at a random chunk size (a non-divisor of
 * the rows, one row, every row, more than the rows) gives the unfused program's loss and every
 * parameter gradient bit for bit — over two accumulated micro-batches with ignored targets — and
 * the same losses and parameters after AdamW steps, with recompute too; its arena is smaller and
 * its logits have no buffer; an evaluation forward gives the same loss, reading its logits is
 * refused by name, and a negative chunk is refused. A quantised head (--fallback none: fp8_block,
 * mxfp8) fuses in chunks of 128 rows with the same bit-for-bit results but its wgrad's sums;
 * fp8_row's and fp8_tensor's stay apart. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/program.h"
#include "ir/ir.h"
#include "runtime/engine.h"
#include "testutil.h"

#define CTX dw_test_ctx

/* A preset captured at B x T compiled with the head fused (chunk rows) or not, on a CPU engine;
 * quantised recipes keep the LM head (and the other fragile layers) in BF16 (--fallback safe) unless
 * all_quantised (--fallback none: the head quantised too). */
static void build_policy(const char *preset, int64_t B, int64_t T, const char *precision, bool all_quantised,
                         bool fused, int64_t chunk, int recompute, dw_test_model *m) {
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, preset, &mc), DW_OK);
    memset(m, 0, sizeof *m);
    assert_int_equal(dw_capture_config(CTX, &mc, B, T, &m->g), DW_OK);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.fused_head = fused, o.head_chunk = chunk, o.recompute = recompute;
    if (precision) assert_int_equal(dw_policy_from_precision(CTX, precision, !all_quantised, &m->pol), DW_OK);
    if (precision && all_quantised) assert_int_equal(dw_policy_set_fallback(CTX, m->pol, "none"), DW_OK);
    assert_int_equal(dw_compile(CTX, m->g, NULL, m->pol, &o, &m->c), DW_OK);
    assert_int_equal(dw_engine_create(CTX, m->c, NULL, &m->e), DW_OK);
}

static void build(const char *preset, int64_t B, int64_t T, const char *precision, bool fused, int64_t chunk,
                  int recompute, dw_test_model *m) {
    build_policy(preset, B, T, precision, false, fused, chunk, recompute, m);
}

/* No two items live at one time share bytes. */
static void assert_plan_disjoint(const dw_compiled *c) {
    int i, j, t;
    if (dw_test_plan_overlap(c, &i, &j, &t)) fail_msg("items %d and %d share bytes while both live at time %d", i, j, t);
}

/* Every parameter of a and b, values (what 0) or gradients (1), bit for bit; parameter `near`
 * (-1: none) within 1e-5 of its largest magnitude instead. */
static void same_params_but(dw_test_model *a, dw_test_model *b, int what, int near, const char *label) {
    for (int i = 0; i < a->c->n_params; i++) {
        const int64_t n = dw_test_param_numel(a->e, i);
        float *pa = malloc((size_t)n * sizeof *pa), *pb = malloc((size_t)n * sizeof *pb);
        assert_true(pa && pb);
        assert_int_equal(what ? dw_engine_grad_read(a->e, i, pa) : dw_engine_param_read(a->e, i, pa), DW_OK);
        assert_int_equal(what ? dw_engine_grad_read(b->e, i, pb) : dw_engine_param_read(b->e, i, pb), DW_OK);
        double big = 0;
        for (int64_t k = 0; i == near && k < n; k++) big = fmax(big, fabs(pa[k]));
        for (int64_t k = 0; k < n; k++)
            if (i == near ? !(fabs((double)pa[k] - pb[k]) <= 1e-5 * big) : memcmp(&pa[k], &pb[k], sizeof *pa) != 0)
                fail_msg("%s: %s %s[%lld] unfused %.9g, fused %.9g", label, what ? "gradient" : "value",
                         dw_engine_param_name(a->e, i), (long long)k, pa[k], pb[k]);
        free(pa), free(pb);
    }
}
static void same_params(dw_test_model *a, dw_test_model *b, int what, const char *label) {
    same_params_but(a, b, what, -1, label);
}

/* Random tokens and targets (B*T), a quarter of the targets ignored (-1). */
static void draw_batch(dw_test_rng *r, int64_t n, int64_t V, int32_t *x, int32_t *y) {
    for (int64_t i = 0; i < n; i++) {
        x[i] = (int32_t)(dw_test_next(r) % (uint64_t)V);
        y[i] = dw_test_next(r) % 4 == 0 ? -1 : (int32_t)(dw_test_next(r) % (uint64_t)V);
    }
}

/* One preset, precision and chunk at B 2 x T: the fused program against the unfused one; with
 * all_quantised the LM head in the precision too (--fallback none: its chunks rounded up to 128 rows). */
static void same_bits_at(const char *preset, const char *precision, bool all_quantised, int64_t T, int64_t chunk,
                         int recompute, int *tied) {
    const int64_t B = 2, N = B * T;
    char label[128];
    snprintf(label, sizeof label, "%s %s%s chunk %lld%s", preset, precision ? precision : "fp32",
             all_quantised ? " (head too)" : "", (long long)chunk, recompute ? " recompute" : "");
    dw_test_model a, f;
    build_policy(preset, B, T, precision, all_quantised, false, 0, recompute, &a);
    build_policy(preset, B, T, precision, all_quantised, true, chunk, recompute, &f);
    const dw_graph *g = f.g;
    assert_int_equal(a.c->head_xent, -1);
    if (f.c->head_xent < 0) fail_msg("%s: the head was not fused", label);
    const int64_t want = all_quantised ? (chunk + 127) / 128 * 128 : chunk;
    if (chunk > 0) assert_int_equal(f.c->head_chunk, want < N ? want : N);
    assert_int_equal(f.c->tensor[g->logits].val_off, -1);
    assert_int_equal(f.c->tensor[g->logits].grad_off, -1);
    for (int s = 0; s < f.c->n_steps; s++) /* the head linear has no step of its own */
        assert_true(f.c->steps[s].node != f.c->head_linear || f.c->steps[s].kind > 1);
    assert_plan_disjoint(f.c);
    const int64_t arena_a = dw_compiled_pool_bytes(a.c, 3), arena_f = dw_compiled_pool_bytes(f.c, 3);
    /* never larger; smaller where the logits were the peak (gpt2-tiny: vocabulary 256, width 128, FP32) */
    const bool peak = !recompute && !strcmp(preset, "gpt2-tiny");
    if (peak ? arena_f >= arena_a : arena_f > arena_a) fail_msg("%s: fused arena %lld bytes, not below %lld", label, (long long)arena_f, (long long)arena_a);
    *tied += g->model.tied_embeddings;

    const uint64_t seed = dw_test_next(&dw_test_group_rng);
    dw_test_rng r;
    dw_test_rng_init(&r, seed);
    const int64_t V = g->model.vocab;
    dw_test_random_params(a.e, &r, 0.5f, NULL, 0.5f); /* wide logits: the softmax is not uniform */
    dw_test_rng_init(&r, seed);
    dw_test_random_params(f.e, &r, 0.5f, NULL, 0.5f);
    int32_t *x[2], *y[2];
    for (int k = 0; k < 2; k++) {
        x[k] = malloc((size_t)N * sizeof *x[k]), y[k] = malloc((size_t)N * sizeof *y[k]);
        assert_true(x[k] && y[k]);
    }
    draw_batch(&r, N, V, x[0], y[0]);
    draw_batch(&r, N, V, x[1], y[1]);
    /* two accumulated micro-batches at 1/2 each, the second on fewer rows than the capacity */
    double la[2], lf[2];
    for (int k = 0; k < 2; k++) {
        const int64_t b = k ? 1 : B;
        if (!k) assert_int_equal(dw_engine_zero_grad(a.e), DW_OK), assert_int_equal(dw_engine_zero_grad(f.e), DW_OK);
        assert_int_equal(dw_engine_forward_backward(a.e, x[k], y[k], b, T, 0.5, &la[k]), DW_OK);
        assert_int_equal(dw_engine_forward_backward(f.e, x[k], y[k], b, T, 0.5, &lf[k]), DW_OK);
        if (memcmp(&la[k], &lf[k], sizeof la[k]))
            fail_msg("%s: micro-batch %d loss unfused %.9g, fused %.9g", label, k, la[k], lf[k]);
    }
    /* a quantised head over several chunks: its wgrad's FP32 sums added chunk by chunk, the rest
     * the same bits */
    const bool exact = !all_quantised || f.c->head_chunk >= N;
    const int head_w = f.c->tensor[g->nodes[f.c->head_linear].in[1]].param;
    same_params_but(&a, &f, 1, exact ? -1 : head_w, label);
    /* an evaluation forward: the same loss; no logits to read from the fused program */
    double ea = 0, ef = 0;
    float *logits = malloc((size_t)(N * V) * sizeof *logits);
    assert_non_null(logits);
    assert_int_equal(dw_engine_forward(a.e, x[0], y[0], B, T, logits, &ea), DW_OK);
    assert_int_equal(dw_engine_forward(f.e, x[0], y[0], B, T, NULL, &ef), DW_OK);
    if (memcmp(&ea, &ef, sizeof ea)) fail_msg("%s: evaluation loss unfused %.9g, fused %.9g", label, ea, ef);
    assert_int_equal(dw_engine_forward(f.e, x[0], y[0], B, T, logits, &ef), DW_ERR_UNSUPPORTED);
    assert_non_null(strstr(dw_errmsg(CTX), "fused_head"));
    assert_int_equal(dw_engine_forward(f.e, x[0], NULL, B, T, NULL, NULL), DW_OK); /* no targets: no loss */
    free(logits);
    /* AdamW steps, then training on: the same losses and parameters */
    double a0, a1, f0, f1;
    dw_test_rng ra, rf;
    dw_test_rng_init(&ra, seed + 1);
    dw_test_rng_init(&rf, seed + 1);
    assert_int_equal(dw_test_model_train_random(&a, B, T, 3, 1e-2, &ra, &a0, &a1), DW_OK);
    assert_int_equal(dw_test_model_train_random(&f, B, T, 3, 1e-2, &rf, &f0, &f1), DW_OK);
    if (exact ? a0 != f0 || a1 != f1 : !(fabs(a0 - f0) <= 1e-4 * fabs(a0) && fabs(a1 - f1) <= 1e-4 * fabs(a1)))
        fail_msg("%s: losses %.9g %.9g unfused, %.9g %.9g fused", label, a0, a1, f0, f1);
    if (exact) same_params(&a, &f, 0, label);
    printf("  %-12s %-9s chunk %2lld%s: arena %8lld -> %8lld bytes, loss %.6f\n", preset,
           precision ? precision : "fp32", (long long)f.c->head_chunk, recompute ? " recompute" : "",
           (long long)arena_a, (long long)arena_f, la[0]);
    for (int k = 0; k < 2; k++) free(x[k]), free(y[k]);
    dw_test_model_free(&a);
    dw_test_model_free(&f);
}

static void same_bits(const char *preset, const char *precision, int64_t chunk, int recompute, int *tied) {
    same_bits_at(preset, precision, false, 12, chunk, recompute, tied);
}

static void test_fused_same_bits(void **state) {
    (void)state;
    static const char *const presets[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny"};
    static const char *const precisions[] = {NULL, "bf16", "fp8_block"};
    int tied = 0, runs = 0;
    /* fp8_block (its head stays BF16: the fallback "head") on one preset a run: its CPU quantisers
     * take half the test's time, three times over under ASan */
    const size_t fp8_on = (size_t)(dw_test_next(&dw_test_group_rng) % 3);
    for (size_t p = 0; p < sizeof presets / sizeof *presets; p++)
        for (size_t q = 0; q < sizeof precisions / sizeof *precisions; q++) {
            if (q == 2 && p != fp8_on) continue;
            runs++;
            const int64_t chunk = 2 + (int64_t)(dw_test_next(&dw_test_group_rng) % 9); /* 2..10 of 24 rows */
            same_bits(presets[p], precisions[q], chunk == 8 || chunk == 6 || chunk == 4 ? chunk + 1 : chunk,
                      0, &tied);
        }
    assert_true(tied > 0 && tied < runs); /* tied and untied heads both ran */
    same_bits("llama-tiny", "bf16", 1, 0, &tied);  /* a row at a time */
    same_bits("gpt2-tiny", NULL, 24, 0, &tied);    /* one chunk */
    same_bits("qwen2-tiny", "bf16", 100, 0, &tied); /* more than the rows */
}

static void test_fused_recompute(void **state) {
    (void)state;
    int tied = 0;
    same_bits("llama-tiny", "bf16", 7, DW_RECOMPUTE_FULL, &tied);
    same_bits("gpt2-tiny", NULL, 5, DW_RECOMPUTE_FULL, &tied);
}

/* A quantised head (--fallback none) fused: 200 rows in chunks of 128 (the last of 72), 140 in
 * chunks of 128 (the last of 12), 24 in one chunk, and 140 under full recompute. The quantisers'
 * blocks fall within the chunks, so the loss and every gradient but the head weight's are the
 * unfused program's bit for bit; the head weight's wgrad sums differ in order only (1e-5 of its
 * largest), and the losses after AdamW steps by 1e-4. fp8_block on the tied and the untied head,
 * mxfp8 on one. */
static void test_quantised_head(void **state) {
    (void)state;
    int tied = 0;
    same_bits_at("llama-tiny", "fp8_block", true, 100, 1 + (int64_t)(dw_test_next(&dw_test_group_rng) % 128), 0,
                 &tied);
    same_bits_at("gpt2-tiny", "fp8_block", true, 70, 1 + (int64_t)(dw_test_next(&dw_test_group_rng) % 128), 0,
                 &tied);
    same_bits_at("qwen2-tiny", "mxfp8", true, 12, 0, 0, &tied); /* fewer rows than a block: one chunk */
    same_bits_at("llama-tiny", "fp8_block", true, 70, 128, DW_RECOMPUTE_FULL, &tied); /* forwards run again */
    assert_true(tied >= 1 && tied < 4); /* tied and untied heads */
}

/* Off by default; the compiler's chunk; a head in a recipe whose scales span a chunk's rows
 * (fp8_row's dy^T, fp8_tensor) stays apart; a negative chunk refused. */
static void test_options(void **state) {
    (void)state;
    static const char *const apart[] = {"fp8_row", "fp8_tensor"};
    for (int k = 0; k < 2; k++) {
        dw_test_model q;
        build_policy("llama-tiny", 2, 16, apart[k], true, true, 0, 0, &q);
        if (q.c->head_xent != -1) fail_msg("%s: the head was fused", apart[k]);
        assert_true(q.c->tensor[q.g->logits].val_off >= 0);
        dw_test_model_free(&q);
    }
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    assert_false(o.fused_head);
    assert_int_equal(o.head_chunk, 0);
    dw_test_model m;
    build("llama-tiny", 2, 16, "bf16", true, 0, 0, &m);
    assert_true(m.c->head_xent >= 0 && m.c->head_chunk == 32); /* min(N, 256-multiple of N C / V) */
    dw_compiled *c = NULL;
    o.fused_head = true, o.head_chunk = -3;
    assert_int_equal(dw_compile(CTX, m.g, NULL, m.pol, &o, &c), DW_ERR_INVALID);
    assert_null(c);
    assert_non_null(strstr(dw_errmsg(CTX), "head_chunk -3"));
    dw_test_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_same_bits),
        cmocka_unit_test(test_fused_recompute),
        cmocka_unit_test(test_quantised_head),
        cmocka_unit_test(test_options),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
