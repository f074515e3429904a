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
 *     the same under bf16_arena, where the copies may lie on gradients AdamW has yet to read
 *     (gpt2-tiny's above them, the others' at or below) and AdamW fuses them too;
 *   - the passes (kernels/adamw_passes.h) on random pools and runs, with and without a first cut:
 *     every master updated once, every copy in a run made once (none elsewhere) in the pass of its
 *     update or later, a pass's start 64-aligned, and behind (first > 0) every gradient a copy can
 *     lie on (j <= i / 2 + lag) read by an earlier pass;
 *   - the kernel behind: the copies at byte d of the gradients' own buffer (d <= 0, lag 0, and
 *     d > 0 with lag ceil(d / 4), as dw_exec_cast_plan sets them): p, m, v are
 *     dw_cpu_adamw's bits on the gradients before the step, the copies as the cast, every other
 *     byte of the buffer as it was. */
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
#include "kernels/adamw_passes.h"
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
    dw_cpu_adamw_cast(p2, g, m2, v2, n, n_decay, norm, &a, wb, (const int64_t(*)[2])runs, nr, 0, 0);
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

/* Random runs over a pool of n: 64-aligned starts, gaps before, between and after (*nr of 8). */
static int64_t random_runs(int64_t runs[8][2], int *nr) {
    const int64_t n = 64 * dw_test_rnd(4, 400) + dw_test_rnd(0, 63);
    *nr = 0;
    for (int64_t at = 64 * dw_test_rnd(0, 3); *nr < 8 && at < n; (*nr)++) {
        const int64_t end = at + dw_test_rnd(1, 3000);
        runs[*nr][0] = at, runs[*nr][1] = end < n ? end : n;
        at = (runs[*nr][1] + 63) / 64 * 64 + 64 * dw_test_rnd(0, 3);
    }
    return n;
}

static void test_passes(void **state) {
    (void)state;
    for (int rep = 0; rep < 300; rep++) {
        int64_t runs[8][2];
        int nr;
        const int64_t n = random_runs(runs, &nr);
        const int64_t lag = rep % 2 ? dw_test_rnd(0, n / 2) : 0;
        const int64_t first = rep % 3 == 0 ? 0 : rep % 3 == 1 ? 64 * dw_test_rnd(1, 40) : dw_adamw_passes_first(n, lag);
        int *upd = malloc((size_t)n * sizeof *upd), *cast = malloc((size_t)n * sizeof *cast);
        for (int64_t i = 0; i < n; i++) upd[i] = cast[i] = -1;
        dw_adamw_plan pl;
        dw_adamw_pass ps;
        dw_adamw_plan_init(&pl, n, (const int64_t(*)[2])runs, nr, first, lag);
        int k = 0;
        for (; dw_adamw_pass_next(&pl, &ps); k++) {
            if (ps.lo < 0 || ps.hi > n || ps.lo >= ps.hi || ps.c0 < ps.lo || ps.c1 > ps.hi || ps.c0 > ps.c1)
                fail_msg("pass %d [%lld, %lld) copies [%lld, %lld) out of its bounds", k, (long long)ps.lo,
                         (long long)ps.hi, (long long)ps.c0, (long long)ps.c1);
            if (ps.update && ps.lo % 64) fail_msg("pass %d starts at %lld, not 64-aligned", k, (long long)ps.lo);
            if (!ps.update && (ps.c0 != ps.lo || ps.c1 != ps.hi)) fail_msg("cast-only pass %d is not all copies", k);
            for (int64_t i = ps.lo; i < ps.hi && ps.update; i++) {
                if (upd[i] >= 0) fail_msg("master %lld updated twice", (long long)i);
                upd[i] = k;
            }
            for (int64_t i = ps.c0; i < ps.c1; i++) {
                if (cast[i] >= 0) fail_msg("copy %lld made twice", (long long)i);
                cast[i] = k;
            }
        }
        for (int64_t i = 0, r = 0; i < n; i++) {
            while (r < nr && i >= runs[r][1]) r++;
            const bool in = r < nr && i >= runs[r][0];
            if (upd[i] < 0) fail_msg("n %lld: master %lld never updated", (long long)n, (long long)i);
            if (in != (cast[i] >= 0)) fail_msg("copy %lld: %s a run, made %d", (long long)i, in ? "in" : "past", cast[i]);
            if (in && cast[i] < upd[i]) fail_msg("copy %lld made before its master's update", (long long)i);
            const int64_t j = i / 2 + lag < n ? i / 2 + lag : n - 1; /* the last gradient copy i may lie on */
            if (in && first > 0 && upd[j] >= cast[i])
                fail_msg("first %lld, lag %lld: copy %lld (pass %d) on gradient %lld, read by pass %d", (long long)first,
                         (long long)lag, (long long)i, cast[i], (long long)j, upd[j]);
        }
        if (rep < 4)
            printf("  n %lld, %d runs, first %lld, lag %lld: %d passes\n", (long long)n, nr, (long long)first,
                   (long long)lag, k);
        free(upd), free(cast);
    }
}

/* The kernel behind: the copies at byte d of the gradients' buffer (even; a multiple of 4 below 0,
 * where the gradients start at -d: the arena's bases are 256-aligned). */
static void kernel_behind_case(int64_t d) {
    int64_t runs[8][2];
    int nr;
    const int64_t n = random_runs(runs, &nr), n_decay = dw_test_rnd(0, n);
    const int64_t gbase = d < 0 ? -d : 0, cbase = gbase + d; /* the buffer from the lower of the two */
    const int64_t bytes = gbase + 4 * n > cbase + 2 * n ? gbase + 4 * n : cbase + 2 * n;
    uint8_t *buf = malloc((size_t)bytes), *want = malloc((size_t)bytes);
    for (int64_t b = 0; b < bytes; b++) buf[b] = (uint8_t)dw_test_rnd(0, 255);
    float *g = (float *)(buf + gbase), *gref = randv(n, -1e-2f, 1e-2f);
    memcpy(g, gref, (size_t)n * 4);
    memcpy(want, buf, (size_t)bytes);
    float *p = randv(n, -1, 1), *m = randv(n, -1e-3f, 1e-3f), *v = randv(n, 0, 1e-5f);
    float *p2 = malloc((size_t)n * 4), *m2 = malloc((size_t)n * 4), *v2 = malloc((size_t)n * 4);
    memcpy(p2, p, (size_t)n * 4), memcpy(m2, m, (size_t)n * 4), memcpy(v2, v, (size_t)n * 4);
    const dw_adamw_args a = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                             .c1 = 1.0 - pow(0.9, 2.0), .c2 = 1.0 - pow(0.95, 2.0), .max_norm = 0.5};
    const double norm = dw_test_uniform(RNG, 0.1f, 2.0f);
    dw_cpu_adamw(p, gref, m, v, n, n_decay, norm, &a);
    for (int r = 0; r < nr; r++)
        for (int64_t i = runs[r][0]; i < runs[r][1]; i++) {
            const uint16_t c = dw_encode_bf16(p[i]);
            memcpy(want + cbase + 2 * i, &c, 2);
        }
    const int64_t lag = d > 0 ? (d + 3) / 4 : 0, first = dw_test_rnd(0, 1) ? 64 : dw_adamw_passes_first(n, lag);
    dw_cpu_adamw_cast(p2, g, m2, v2, n, n_decay, norm, &a, (uint16_t *)(buf + cbase), (const int64_t(*)[2])runs, nr,
                      first, lag);
    if (memcmp(p, p2, (size_t)n * 4) || memcmp(m, m2, (size_t)n * 4) || memcmp(v, v2, (size_t)n * 4))
        fail_msg("behind, d %lld: p, m or v differ from dw_cpu_adamw on the gradients before the step", (long long)d);
    for (int64_t b = 0; b < bytes; b++)
        if (buf[b] != want[b]) fail_msg("behind, d %lld: byte %lld of the buffer is %u, want %u", (long long)d,
                                        (long long)b, buf[b], want[b]);
    printf("  behind, d %lld, n %lld, %d runs, first %lld, lag %lld: p, m, v as dw_cpu_adamw, the buffer as "
           "expected\n", (long long)d, (long long)n, nr, (long long)first, (long long)lag);
    free(buf), free(want), free(gref), free(p), free(m), free(v), free(p2), free(m2), free(v2);
}

static void test_kernel_behind(void **state) {
    (void)state;
    kernel_behind_case(0);
    for (int rep = 0; rep < 3; rep++) kernel_behind_case(-4 * dw_test_rnd(1, 2500)); /* the gradients 4-byte aligned */
    for (int rep = 0; rep < 3; rep++) kernel_behind_case(2 * dw_test_rnd(1, 20000));
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
 * gradients AdamW has yet to read, at or below them: fused too, in the passes of adamw_passes.h. */
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
    if (f.e->x->cast_fused_through != last_cast || u.e->x->cast_fused_through != -1)
        fail_msg("%s: AdamW covered the casts through step %d fused, %d unfused (casts: steps %d..%d)", what,
                 f.e->x->cast_fused_through, u.e->x->cast_fused_through, adamw + 1, last_cast);
    assert_int_equal(copies_current(f.e, what) + copies_current(u.e, what), 0);
    const uint64_t seed = dw_test_next(RNG); /* new masters: the refresh alone casts */
    assert_int_equal(dw_engine_init_weights(f.e, seed), DW_OK);
    assert_int_equal(dw_engine_init_weights(u.e, seed), DW_OK);
    assert_int_equal(copies_current(f.e, what) + copies_current(u.e, what), 0);
    int64_t cut, lag;
    dw_exec_cast_plan(f.e->x, &cut, &lag);
    printf("  %-13s %-10s%s%s losses %.6f -> %.6f the same bits; %d runs made by AdamW's pass%s", preset, precision,
           fused_head ? " fused" : "      ", arena ? " arena" : "      ", first, last, f.c->n_bf16_runs,
           arena ? "es (bf16_arena" : "\n");
    if (arena) printf(", copies %+lld bytes from the gradients: first cut %lld, lag %lld)\n",
                      (long long)(f.c->bf16_base - f.c->grad_base), (long long)cut, (long long)lag);
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
    same_training("llama-tiny", "bf16", false, true);
    same_training("olmoe-tiny", "bf16", false, true);
    same_training("gpt2-tiny", "bf16", true, true);
    same_training("llama-tiny", "fp8_block", false, true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernel),
        cmocka_unit_test(test_passes),
        cmocka_unit_test(test_kernel_behind),
        cmocka_unit_test(test_engine),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
