/* test_grouped_select.c — the grouped GEMM kind of the kernel registry (src/gemm/grouped_*.c):
 * every eligibility rule of the built-in kernels in each direction (CPU / CUDA target, FP32 /
 * BF16, sm_75 / sm_80 / sm_90 / sm_100, K or M not a multiple of 8, experts over 1024 and over
 * 65535, misaligned operands, too many rows, a forced backend) on fresh random sizes; the public
 * API on a CPU context (select, explain, the CPU reference's three passes against a naive oracle
 * with skewed routings, bad input); user-registered grouped kernels; and the compiler's binding
 * of each MoE linear layer (CPU and CUDA targets, DW_MOE_GEMM, dw_compiled_explain). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "gemm/grouped.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)
#define PH ((const void *)(uintptr_t)4096) /* an aligned placeholder pointer */

/* A problem with aligned placeholders: random rows, experts in [e_lo, e_hi], K and M multiples of
 * 8 (or odd where asked). */
static dw_grouped_args problem(int pass, int dtype, int64_t e_lo, int64_t e_hi, bool odd_k, bool odd_m) {
    const int64_t k = odd_k ? 2 * dw_test_rnd(0, 200) + 1 : 8 * dw_test_rnd(1, 64);
    const int64_t m = odd_m ? 2 * dw_test_rnd(0, 200) + 1 : 8 * dw_test_rnd(1, 64);
    return (dw_grouped_args){.pass = pass, .dtype = dtype, .recipe = DW_RECIPE_BF16, .rows = dw_test_rnd(0, 100000),
                             .experts = dw_test_rnd(e_lo, e_hi), .k = k, .m = m, .x = PH, .w = PH, .dy = PH,
                             .out = (void *)PH, .offsets = (const int32_t *)PH};
}

/* The pick for a on dev/sm is `want` (NULL: none), and the account holds `line` (may be NULL). */
static void expect(dw_device_kind dev, int sm, const dw_grouped_args *a, const char *want, const char *line) {
    char log[4096] = "";
    const char *got = dw_grouped_registry_pick(dev, sm, a, log, sizeof log);
    if ((want == NULL) != (got == NULL) || (want && strcmp(want, got)) || (line && !strstr(log, line))) {
        fprintf(stderr, "sm_%d pass %d dtype %d E %lld K %lld M %lld rows %lld: got %s, want %s (line '%s'):\n%s", sm,
                (int)a->pass, (int)a->dtype, (long long)a->experts, (long long)a->k, (long long)a->m,
                (long long)a->rows, got ? got : "(none)", want ? want : "(none)", line ? line : "", log);
        fail();
    }
}

static void test_rules(void **state) {
    (void)state;
    for (int trial = 0; trial < 20; trial++) {
        const int pass = (int)dw_test_rnd(0, 2);
        dw_grouped_args a = problem(pass, DW_GROUPED_F32, 1, 64, false, false);
        /* CPU: the reference, FP32 only */
        expect(DW_DEVICE_CPU, 0, &a, "grouped_cpu_reference", "grouped_wgmma_sm90           prio  30  rejected: CUDA kernel, CPU target");
        a.dtype = DW_GROUPED_BF16;
        expect(DW_DEVICE_CPU, 0, &a, NULL, "grouped_cpu_reference        prio   0  rejected: operands must be fp32, not bf16");
        /* CUDA FP32: the FMA tiles on any sm; the tensor-core kernels want BF16 */
        a.dtype = DW_GROUPED_F32;
        const int sms[] = {75, 80, 90, 100};
        for (int s = 0; s < 4; s++) /* (below sm_80 the mma.sync kernel's sm range speaks first) */
            expect(DW_DEVICE_CUDA, sms[s], &a, "grouped_cuda_simt", sms[s] < 80 ? "grouped_cuda_simt            prio  10  eligible"
                                                                   : "grouped_mma_sm80             prio  20  rejected: operands must be bf16, not fp32");
        expect(DW_DEVICE_CUDA, 90, &a, "grouped_cuda_simt", "grouped_cpu_reference        prio   0  rejected: CPU kernel, CUDA target");
        /* CUDA BF16: wgmma on sm_90 only, mma.sync from sm_80, FMA tiles below */
        a.dtype = DW_GROUPED_BF16;
        expect(DW_DEVICE_CUDA, 90, &a, "grouped_wgmma_sm90", "grouped_mma_sm80             prio  20  eligible");
        expect(DW_DEVICE_CUDA, 80, &a, "grouped_mma_sm80", "rejected: needs sm_90, device is sm_80");
        expect(DW_DEVICE_CUDA, 100, &a, "grouped_mma_sm80", "rejected: needs sm_90, device is sm_100");
        expect(DW_DEVICE_CUDA, 75, &a, "grouped_cuda_simt", "rejected: needs sm_80 or later, device is sm_75");
        /* K or M not a multiple of 8: not wgmma (TMA rows) */
        dw_grouped_args o = problem(pass, DW_GROUPED_BF16, 1, 64, true, false);
        expect(DW_DEVICE_CUDA, 90, &o, "grouped_mma_sm80", "rejected: K and M must be multiples of 8");
        o = problem(pass, DW_GROUPED_BF16, 1, 64, false, true);
        expect(DW_DEVICE_CUDA, 90, &o, "grouped_mma_sm80", "rejected: K and M must be multiples of 8");
        /* experts: 1024 is wgmma's limit, 65535 the grids' */
        o = problem(pass, DW_GROUPED_BF16, 1024, 1024, false, false);
        expect(DW_DEVICE_CUDA, 90, &o, "grouped_wgmma_sm90", NULL);
        o.experts = dw_test_rnd(1025, 65535);
        expect(DW_DEVICE_CUDA, 90, &o, "grouped_mma_sm80", "rejected: at most 1024 experts");
        o.experts = dw_test_rnd(65536, 100000);
        expect(DW_DEVICE_CUDA, 90, &o, NULL, "grouped_cuda_simt            prio  10  rejected: at most 65535 experts");
        /* alignment and row count: wgmma only */
        o = problem(pass, DW_GROUPED_BF16, 1, 64, false, false);
        const void **which[] = {&o.x, &o.w, &o.dy};
        *which[dw_test_rnd(0, 2)] = (const char *)PH + 2 * dw_test_rnd(1, 7);
        expect(DW_DEVICE_CUDA, 90, &o, "grouped_mma_sm80", "rejected: x, W, dy and out must be 16-byte aligned");
        o = problem(pass, DW_GROUPED_BF16, 1, 64, false, false);
        o.rows = ((int64_t)1 << 30) + dw_test_rnd(0, 1000);
        expect(DW_DEVICE_CUDA, 90, &o, "grouped_mma_sm80", "rejected: rows under 2^30");
        /* a forced backend: that one or none */
        a.backend = "grouped_cuda_simt";
        expect(DW_DEVICE_CUDA, 90, &a, "grouped_cuda_simt", "grouped_wgmma_sm90           prio  30  rejected: not the requested backend");
        a.backend = "grouped_wgmma_sm90";
        expect(DW_DEVICE_CUDA, 80, &a, NULL, NULL);
        a.backend = NULL;
        /* the CUDA entry's automatic choice: the same rules among the built-ins */
        assert_int_equal(dw_grouped_builtin_pick(90, &a), 3);
        assert_int_equal(dw_grouped_builtin_pick(80, &a), 2);
        assert_int_equal(dw_grouped_builtin_pick(0, &a), 1);
    }
}

/* ---- the CPU reference through the public API ------------------------------------------------- */
/* Group sizes of `rows` rows over E experts: 0 random, 1 all to one expert, 2 alternate experts
 * empty, 3 a single row; some rows past the last group (capacity). */
static void route(int kind, int64_t E, int64_t rows, int32_t *off) {
    const int64_t used = kind == 3 ? 1 : rows - dw_test_rnd(0, rows / 4);
    const int64_t one = dw_test_rnd(0, E - 1);
    int64_t left = used;
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t n = kind == 1 || kind == 3 ? (e == one ? left : 0) : kind == 2 && e % 2 ? 0 : dw_test_rnd(0, left);
        if (e == E - 1 && kind != 1 && kind != 3) n = kind == 2 && e % 2 ? 0 : left;
        left -= n;
        off[e + 1] = (int32_t)(off[e] + n);
    }
}

static float *randv(int64_t n) {
    float *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = dw_test_uniform(RNG, -1, 1);
    return v;
}

static void test_cpu_reference(void **state) {
    (void)state;
    for (int trial = 0; trial < 12; trial++) {
        const int kind = trial % 4;
        const int64_t E = dw_test_rnd(1, 7), K = dw_test_rnd(1, 13), M = dw_test_rnd(1, 11), R = dw_test_rnd(1, 40);
        int32_t *off = malloc((size_t)(E + 1) * sizeof *off);
        route(kind, E, R, off);
        float *x = randv(R * K), *w = randv(E * M * K), *dy = randv(R * M), *dw = randv(E * M * K);
        float *y = randv(R * M), *dx = randv(R * K), *dw0 = malloc((size_t)(E * M * K) * sizeof *dw0);
        memcpy(dw0, dw, (size_t)(E * M * K) * sizeof *dw);
        dw_grouped_args a = {.pass = DW_GEMM_FPROP, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_BF16, .rows = R,
                             .experts = E, .k = K, .m = M, .x = x, .w = w, .dy = dy, .offsets = off, .out = y};
        const char *name = NULL;
        assert_int_equal(dw_grouped_select(CTX, &a, &name), DW_OK);
        assert_string_equal(name, "grouped_cpu_reference");
        assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
        a.pass = DW_GEMM_DGRAD, a.out = dx;
        assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
        a.pass = DW_GEMM_WGRAD, a.out = dw;
        assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
        int64_t bad = 0;
        for (int64_t e = 0; e < E; e++) /* the oracle: each expert's rows, double sums in index order */
            for (int64_t r = off[e]; r < off[e + 1]; r++) {
                for (int64_t m = 0; m < M; m++) {
                    double s = 0;
                    for (int64_t k = 0; k < K; k++) s += (double)x[r * K + k] * w[(e * M + m) * K + k];
                    bad += y[r * M + m] != (float)s;
                }
                for (int64_t k = 0; k < K; k++) {
                    double s = 0;
                    for (int64_t m = 0; m < M; m++) s += (double)dy[r * M + m] * w[(e * M + m) * K + k];
                    bad += dx[r * K + k] != (float)s;
                }
            }
        for (int64_t i = (int64_t)off[E] * M; i < R * M; i++) bad += y[i] != 0.0f; /* rows past the groups */
        for (int64_t i = (int64_t)off[E] * K; i < R * K; i++) bad += dx[i] != 0.0f;
        for (int64_t e = 0; e < E; e++)
            for (int64_t m = 0; m < M; m++)
                for (int64_t k = 0; k < K; k++) {
                    double s = 0;
                    for (int64_t r = off[e]; r < off[e + 1]; r++) s += (double)dy[r * M + m] * x[r * K + k];
                    const int64_t i = (e * M + m) * K + k;
                    bad += dw[i] != (float)((double)dw0[i] + s);
                }
        if (bad) fprintf(stderr, "routing %d E %lld K %lld M %lld R %lld: %lld wrong\n", kind, (long long)E,
                         (long long)K, (long long)M, (long long)R, (long long)bad);
        assert_int_equal(bad, 0);
        free(off), free(x), free(w), free(dy), free(dw), free(y), free(dx), free(dw0);
    }
}

static void test_bad_input(void **state) {
    (void)state;
    float v[64] = {0};
    int32_t off[3] = {0, 2, 4};
    dw_grouped_args a = {.pass = DW_GEMM_FPROP, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_BF16, .rows = 4,
                         .experts = 2, .k = 2, .m = 2, .x = v, .w = v, .offsets = off, .out = v};
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
    a.experts = 0;
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "experts"));
    a.experts = 2, a.x = NULL;
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "needs out, offsets, x, w"));
    a.x = v, a.pass = 7;
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "pass 7"));
    a.pass = DW_GEMM_FPROP, off[1] = 5; /* past rows */
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "offsets[1] = 5"));
    off[1] = 3, off[2] = 1; /* decreasing */
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "offsets[2] = 1"));
    off[1] = 2, off[2] = 4, a.dtype = DW_GROUPED_BF16; /* the CPU has no BF16 grouped kernel: every reason */
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_ERR_UNSUPPORTED);
    assert_non_null(strstr(dw_errmsg(CTX), "grouped_cpu_reference        prio   0  rejected: operands must be fp32"));
    a.dtype = DW_GROUPED_F32, a.backend = "no_such_kernel";
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_ERR_UNSUPPORTED);
    assert_non_null(strstr(dw_errmsg(CTX), "not the requested backend"));
}

/* ---- user kernels ----------------------------------------------------------------------------- */
static int calls;
static bool even_k(const dw_grouped_args *a, void *user, const char **why) {
    (void)user;
    return a->k % 2 == 0 || (*why = "test: K must be even", false);
}
static dw_status count_run(dw_ctx *ctx, const dw_grouped_args *a, void *user) {
    (void)ctx, (void)a;
    calls += *(const int *)user;
    return DW_OK;
}

static void test_user_kernel(void **state) {
    (void)state;
    static int step = 1;
    dw_grouped_kernel_desc d = {.name = "test_grouped_user", .dtype = DW_GROUPED_F32, .recipe = -1,
                                .device = DW_DEVICE_CPU, .priority = 5, .eligible = even_k, .run = count_run,
                                .user = &step};
    assert_int_equal(dw_grouped_kernel_register(&d), DW_OK);
    float v[64] = {0};
    int32_t off[2] = {0, 3};
    dw_grouped_args a = {.pass = DW_GEMM_WGRAD, .dtype = DW_GROUPED_F32, .recipe = DW_RECIPE_BF16, .rows = 3,
                         .experts = 1, .k = 2 * dw_test_rnd(1, 3), .m = 2, .x = v, .dy = v, .offsets = off, .out = v};
    const char *name = NULL;
    assert_int_equal(dw_grouped_select(CTX, &a, &name), DW_OK);
    assert_string_equal(name, "test_grouped_user");
    calls = 0;
    assert_int_equal(dw_grouped_gemm(CTX, &a), DW_OK);
    assert_int_equal(calls, 1);
    a.k = 2 * dw_test_rnd(0, 3) + 1; /* its predicate refuses: the reference runs, the account says why */
    assert_int_equal(dw_grouped_select(CTX, &a, &name), DW_OK);
    assert_string_equal(name, "grouped_cpu_reference");
    char *text = NULL;
    assert_int_equal(dw_grouped_explain(CTX, &a, &text), DW_OK);
    assert_non_null(strstr(text, "test_grouped_user            prio   5  rejected: test: K must be even"));
    assert_non_null(strstr(text, "selected: grouped_cpu_reference"));
    dw_free_string(text);
    assert_true(dw_grouped_kernel_unregister("test_grouped_user"));
    assert_false(dw_grouped_kernel_unregister("test_grouped_user"));
    a.k = 2;
    assert_int_equal(dw_grouped_select(CTX, &a, &name), DW_OK);
    assert_string_equal(name, "grouped_cpu_reference");
    d.run = NULL;
    assert_int_equal(dw_grouped_kernel_register(&d), DW_ERR_INVALID);
    d.run = count_run, d.device = 7;
    assert_int_equal(dw_grouped_kernel_register(&d), DW_ERR_INVALID);
}

/* ---- the compiler's binding ------------------------------------------------------------------- */
static dw_compiled *compile_for(dw_graph *g, const dw_policy *p, dw_device_kind dev, int sm) {
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.device = dev, o.sm = sm;
    dw_compiled *c = NULL;
    const dw_status s = dw_compile(CTX, g, NULL, p, &o, &c);
    if (s != DW_OK) fprintf(stderr, "compile: %s\n", dw_errmsg(CTX));
    return c;
}

/* Every moe_linear node of c has `want` for each pass; returns how many nodes. */
static int check_bound(const dw_compiled *c, const char *want) {
    int n = 0;
    for (int i = 0; i < c->g->n_nodes; i++) {
        if (c->g->nodes[i].op != DW_OP_MOE_LINEAR) continue;
        for (int p = 0; p < DW_QPASS_COUNT; p++) {
            if (!c->node[i].bind.kernel[p] || strcmp(c->node[i].bind.kernel[p], want))
                fprintf(stderr, "%s pass %d: %s, want %s\n", c->g->nodes[i].name, p,
                        c->node[i].bind.kernel[p] ? c->node[i].bind.kernel[p] : "(none)", want);
            assert_non_null(c->node[i].bind.kernel[p]);
            assert_string_equal(c->node[i].bind.kernel[p], want);
        }
        n++;
    }
    return n;
}

static void test_compile_binding(void **state) {
    (void)state;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_hf_shape(CTX, "mixtral-tiny", dw_test_rnd(1, 2), 8 * dw_test_rnd(1, 4), &g), DW_OK);
    dw_policy *bf16 = NULL;
    assert_int_equal(dw_policy_from_precision(CTX, "bf16", false, &bf16), DW_OK);
    struct {
        const dw_policy *p;
        dw_device_kind dev;
        int sm;
        const char *want;
    } cases[] = {{bf16, DW_DEVICE_CUDA, 90, "grouped_wgmma_sm90"}, {bf16, DW_DEVICE_CUDA, 80, "grouped_mma_sm80"},
                 {bf16, DW_DEVICE_CUDA, 100, "grouped_mma_sm80"},  {NULL, DW_DEVICE_CUDA, 90, "grouped_cuda_simt"},
                 {bf16, DW_DEVICE_CPU, 0, "grouped_cpu_reference"}, {NULL, DW_DEVICE_CPU, 0, "grouped_cpu_reference"}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dw_compiled *c = compile_for(g, cases[k].p, cases[k].dev, cases[k].sm);
        assert_non_null(c);
        assert_true(check_bound(c, cases[k].want) >= 3); /* gate, up, down per MoE block */
        char *text = NULL;
        assert_int_equal(dw_compiled_explain(CTX, c, &text), DW_OK);
        char sel[96];
        snprintf(sel, sizeof sel, "selected: %s", cases[k].want);
        assert_non_null(strstr(text, "model.layers.0.mlp.experts.down"));
        assert_non_null(strstr(text, sel));
        assert_non_null(strstr(text, "grouped_cpu_reference"));
        dw_free_string(text);
        dw_compiled_free(c);
    }
    /* DW_MOE_GEMM asks for one kernel on a CUDA target; unknown values are refused */
    setenv("DW_MOE_GEMM", "simt", 1);
    dw_compiled *c = compile_for(g, bf16, DW_DEVICE_CUDA, 90);
    assert_non_null(c);
    check_bound(c, "grouped_cuda_simt");
    dw_compiled_free(c);
    setenv("DW_MOE_GEMM", "wgmma", 1);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.device = DW_DEVICE_CUDA, o.sm = 80;
    c = NULL;
    assert_int_equal(dw_compile(CTX, g, NULL, bf16, &o, &c), DW_ERR_UNSUPPORTED);
    assert_non_null(strstr(dw_errmsg(CTX), "needs sm_90, device is sm_80"));
    setenv("DW_MOE_GEMM", "fast", 1);
    assert_int_equal(dw_compile(CTX, g, NULL, bf16, &o, &c), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "DW_MOE_GEMM must be auto, wgmma, mma or simt, not 'fast'"));
    unsetenv("DW_MOE_GEMM");
    dw_policy_free(bf16);
    dw_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rules),       cmocka_unit_test(test_cpu_reference),   cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_user_kernel), cmocka_unit_test(test_compile_binding),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
