/* test_adamw_fused.c — the BF16 working copies written by AdamW's own pass (the fused cast:
 * kernels/cpu/optim_cpu.c dw_cpu_adamw_cast, the executor's DW_STEP_ADAMW with the CAST_BF16
 * steps after it, runtime/exec.c; DW_FUSED_CAST=0 turns it off):
 *   - the kernel: on fresh random pools and runs (a gap before the first, between runs and after
 *     the last; the decay boundary inside a run), p, m and v are dw_cpu_adamw's bits, the copies in
 *     the runs dw_encode_bf16 of the updated masters, every other copy untouched (a sentinel); with
 *     a non-finite norm p, m and v stay and the copies are still made;
 *   - the engine: BF16 programs (llama-tiny, mixtral-tiny, olmoe-tiny, gpt2-tiny with its fused
 *     head, llama-tiny fp8_block whose weight matrices have no copy: runs with gaps) train 3 steps
 *     with the fusion and without it (DW_FUSED_CAST=0): the same losses, parameters and routing
 *     counters bit for bit; the fused engine's AdamW covered every CAST_BF16 step and the other
 *     ran its casts; the copies equal dw_encode_bf16 of the masters in both, after the steps and
 *     after new weights (a refresh alone, which casts every run: its steps do not follow an AdamW);
 *     under bf16_arena (the copies on gradients AdamW has yet to read) the casts stay apart. */
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
#include "capture/model_config.h"
#include "compile/passes.h"
#include "formats/formats.h"
#include "kernels/cpu/ops_cpu.h"
#include "runtime/engine.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)
#define SENTINEL 0xABCDu

static float *randv(int64_t n, float lo, float hi) {
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = dw_test_uniform(RNG, lo, hi);
    return v;
}

/* One kernel case: norm finite or not. */
static void kernel_case(double norm) {
    const int64_t n = 64 * dw_test_rnd(8, 40) + dw_test_rnd(0, 63); /* a tail past the last 64 */
    int64_t runs[6][2];
    int nr = 0;
    for (int64_t at = 64 * dw_test_rnd(0, 2); nr < 6 && at < n; nr++) { /* 64-aligned starts, as parameters */
        const int64_t end = at + dw_test_rnd(1, 300);
        runs[nr][0] = at, runs[nr][1] = end < n ? end : n;
        at = (runs[nr][1] + 63) / 64 * 64 + 64 * dw_test_rnd(0, 2);
    }
    const int64_t n_decay = dw_test_rnd(runs[0][0], runs[0][1]); /* inside the first run */
    float *p = randv(n, -1, 1), *g = randv(n, -1e-2f, 1e-2f), *m = randv(n, -1e-3f, 1e-3f), *v = randv(n, 0, 1e-5f);
    float *p2 = malloc((size_t)n * 4), *m2 = malloc((size_t)n * 4), *v2 = malloc((size_t)n * 4);
    uint16_t *wb = malloc((size_t)n * 2);
    memcpy(p2, p, (size_t)n * 4), memcpy(m2, m, (size_t)n * 4), memcpy(v2, v, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) wb[i] = SENTINEL;
    const dw_adamw_args a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                             .c1 = 1.0 - pow(0.9, 5.0), .c2 = 1.0 - pow(0.95, 5.0), .max_norm = 0.5};
    dw_cpu_adamw(p, g, m, v, n, n_decay, norm, &a);
    dw_cpu_adamw_cast(p2, g, m2, v2, n, n_decay, norm, &a, wb, (const int64_t(*)[2])runs, nr);
    if (memcmp(p, p2, (size_t)n * 4) || memcmp(m, m2, (size_t)n * 4) || memcmp(v, v2, (size_t)n * 4))
        fail_msg("norm %g: the fused step's p, m or v differ from dw_cpu_adamw's", norm);
    int64_t copies = 0;
    for (int64_t i = 0; i < n; i++) {
        bool in = false;
        for (int r = 0; r < nr; r++) in = in || (i >= runs[r][0] && i < runs[r][1]);
        const uint16_t want = in ? dw_encode_bf16(p[i]) : (uint16_t)SENTINEL;
        if (wb[i] != want)
            fail_msg("norm %g: copy %lld (%s a run) is 0x%04x, expected 0x%04x", norm, (long long)i, in ? "in" : "past",
                     wb[i], want);
        copies += in;
    }
    printf("  n %lld, %d runs (%lld copies), decay below %lld, norm %g: p, m, v as dw_cpu_adamw, copies as the cast\n",
           (long long)n, nr, (long long)copies, (long long)n_decay, norm);
    free(p), free(g), free(m), free(v), free(p2), free(m2), free(v2), free(wb);
}

static void test_kernel(void **state) {
    (void)state;
    for (int rep = 0; rep < 4; rep++) kernel_case(dw_test_uniform(RNG, 0.1f, 2.0f));
    kernel_case(NAN);
}

/* The copies of e's BF16 program: dw_encode_bf16 of the masters over every run (0), or 1. */
static int copies_current(const dw_engine *e, const char *what) {
    const dw_compiled *p = e->p;
    const dw_exec *x = e->x;
    for (int r = 0; r < p->n_bf16_runs; r++)
        for (int64_t i = p->bf16_runs[r][0]; i < p->bf16_runs[r][1]; i++)
            if (x->wb[i] != dw_encode_bf16(x->w[i])) {
                fprintf(stderr, "%s: copy %lld is 0x%04x, the master's cast 0x%04x\n", what, (long long)i, x->wb[i],
                        dw_encode_bf16(x->w[i]));
                return 1;
            }
    return 0;
}

/* The program's AdamW step and the last CAST_BF16 step (-1: none). */
static void optimizer_steps(const dw_compiled *c, int *adamw, int *last_cast) {
    *adamw = *last_cast = -1;
    for (int s = 0; s < c->n_steps; s++) {
        if (c->steps[s].kind == DW_STEP_ADAMW) *adamw = s;
        if (c->steps[s].kind == DW_STEP_CAST_BF16) *last_cast = s;
    }
}

static void build(const char *preset, const char *precision, bool fused_head, bool arena, bool fuse, dw_test_model *m) {
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, preset, &mc), DW_OK);
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(CTX, &mc, 2, 16, &g), DW_OK);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.fused_head = fused_head, o.grad_arena = o.bf16_arena = arena;
    if (!fuse) setenv("DW_FUSED_CAST", "0", 1); /* read when the engine's executor is made */
    const dw_status st = dw_test_model_build_opts(CTX, g, precision, &o, m);
    unsetenv("DW_FUSED_CAST");
    assert_int_equal(st, DW_OK);
}

/* arena: gradients and BF16 copies in the activation arena (bf16_arena), where the copies lie on
 * gradients AdamW has yet to read: no fusion, the casts run after it. */
static void same_training(const char *preset, const char *precision, bool fused_head, bool arena) {
    dw_test_model f, u;
    build(preset, precision, fused_head, arena, true, &f);
    build(preset, precision, fused_head, arena, false, &u);
    char what[96];
    snprintf(what, sizeof what, "%s %s%s%s, AdamW with and without the copies", preset, precision,
             fused_head ? " fused head" : "", arena ? " bf16_arena" : "");
    double first, last;
    const int rc = dw_test_same_training(&f, &u, 2, 16, 3, 1e-3, dw_test_next(RNG), what, &first, &last);
    if (rc) fail_msg("%s: %s", what, rc < 0 ? dw_errmsg(CTX) : "not the same bits");
    int adamw, last_cast;
    optimizer_steps(f.c, &adamw, &last_cast);
    assert_true(adamw >= 0 && last_cast == adamw + f.c->n_bf16_runs && f.c->n_bf16_runs > 0);
    if (f.e->x->cast_fused_through != (arena ? -1 : last_cast) || u.e->x->cast_fused_through != -1)
        fail_msg("%s: AdamW covered the casts through step %d fused, %d unfused (casts: steps %d..%d)", what,
                 f.e->x->cast_fused_through, u.e->x->cast_fused_through, adamw + 1, last_cast);
    assert_int_equal(copies_current(f.e, what) + copies_current(u.e, what), 0);
    const uint64_t seed = dw_test_next(RNG); /* new masters: the refresh alone casts */
    assert_int_equal(dw_engine_init_weights(f.e, seed), DW_OK);
    assert_int_equal(dw_engine_init_weights(u.e, seed), DW_OK);
    assert_int_equal(copies_current(f.e, what) + copies_current(u.e, what), 0);
    printf("  %-13s %-10s%s losses %.6f -> %.6f the same bits; %d runs made by %s\n", preset, precision,
           fused_head ? " fused" : arena ? " arena" : "      ", first, last, f.c->n_bf16_runs,
           arena ? "the casts (bf16_arena)" : "AdamW's pass");
    dw_test_model_free(&f);
    dw_test_model_free(&u);
}

static void test_engine(void **state) {
    (void)state;
    same_training("llama-tiny", "bf16", false, false);
    same_training("mixtral-tiny", "bf16", false, false);
    same_training("olmoe-tiny", "bf16", false, false);
    same_training("gpt2-tiny", "bf16", true, false);
    same_training("llama-tiny", "fp8_block", false, false); /* the weight matrices have no copy: runs with gaps */
    same_training("mixtral-tiny", "bf16", false, true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel),
        cmocka_unit_test(test_engine),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
