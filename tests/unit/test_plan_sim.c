/* test_plan_sim.c — the pipeline event simulation: closed forms for uniform stages (1F1B bubble
 * (p-1)/(m+p-1), interleaved (p-1)/v), in-flight counts against the schedule's closed form, and
 * an independent replay of every simulated op (dependencies, no overlap on a rank). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>

#include "plan/plan.h"
#include "testutil.h"

static double *fill(int n, double v) {
    double *a = malloc(sizeof *a * (size_t)n);
    for (int i = 0; i < n; i++) a[i] = v;
    return a;
}

static void test_1f1b_closed_form(void **state) {
    (void)state;
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    for (int it = 0; it < 300; it++) {
        int p = 1 + (int)(dw_test_next(&rng) % 16), m = 1 + (int)(dw_test_next(&rng) % 64);
        double f = dw_test_uniform(&rng, 0.1f, 2.0f), b = dw_test_uniform(&rng, 0.1f, 4.0f);
        double *fw = fill(p, f), *bw = fill(p, b);
        dw_sim_in in = {.p = p, .v = 1, .m = m, .fwd = fw, .bwd = bw, .p2p = 0};
        dw_sim_out o;
        assert_int_equal(dw_pipe_simulate(NULL, &in, false, &o), DW_OK);
        /* makespan (m + p - 1)(f + b); every rank busy m(f + b); bubble (p-1)/(m+p-1) */
        double want = (m + p - 1) * (f + b);
        if (fabs(o.makespan - want) > 1e-9 * want)
            fail_msg("p %d m %d f %g b %g: makespan %.12g, closed form %.12g", p, m, f, b, o.makespan, want);
        for (int s = 0; s < p; s++) {
            assert_true(fabs(o.busy[s] - m * (f + b)) < 1e-9 * want);
            assert_int_equal(o.max_inflight[s], dw_pipe_inflight(p, 1, m, s));
            assert_int_equal(o.max_inflight[s], m < p - s ? m : p - s);
        }
        double bubble = 1 - o.busy[0] / o.makespan;
        assert_true(fabs(bubble - (double)(p - 1) / (m + p - 1)) < 1e-9);
        dw_sim_out_free(&o);
        free(fw), free(bw);
    }
}

static void test_interleaved_closed_form(void **state) {
    (void)state;
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x1234);
    for (int it = 0; it < 200; it++) {
        int p = 2 + (int)(dw_test_next(&rng) % 8), v = 2 + (int)(dw_test_next(&rng) % 4);
        int m = p * (1 + (int)(dw_test_next(&rng) % 6));
        double f = dw_test_uniform(&rng, 0.1f, 2.0f), b = 2 * f; /* backward = 2 x forward */
        double *fw = fill(p * v, f / v), *bw = fill(p * v, b / v);
        dw_sim_in in = {.p = p, .v = v, .m = m, .fwd = fw, .bwd = bw, .p2p = 0};
        dw_sim_out o;
        assert_int_equal(dw_pipe_simulate(NULL, &in, false, &o), DW_OK);
        /* Megatron-LM interleaved 1F1B: bubble time (p-1)(f+b)/v on top of m(f+b) */
        double want = m * (f + b) + (p - 1) * (f + b) / v;
        if (fabs(o.makespan - want) > 1e-9 * want)
            fail_msg("p %d v %d m %d: makespan %.12g, closed form %.12g", p, v, m, o.makespan, want);
        for (int s = 0; s < p; s++) assert_int_equal(o.max_inflight[s], dw_pipe_inflight(p, v, m, s));
        /* and it beats plain 1F1B on the same work */
        double *f1 = fill(p, f), *b1 = fill(p, b);
        dw_sim_in in1 = {.p = p, .v = 1, .m = m, .fwd = f1, .bwd = b1, .p2p = 0};
        dw_sim_out o1;
        assert_int_equal(dw_pipe_simulate(NULL, &in1, false, &o1), DW_OK);
        assert_true(o.makespan < o1.makespan);
        dw_sim_out_free(&o), dw_sim_out_free(&o1);
        free(fw), free(bw), free(f1), free(b1);
    }
}

/* Independent replay: every op starts after its input arrived and after the previous op of its
 * rank ended; every (micro-batch, virtual stage) runs F and B exactly once. */
static void replay(const dw_sim_in *in, const dw_sim_out *o) {
    int P = in->p * in->v;
    int64_t n = (int64_t)in->m * P;
    double *fe = calloc((size_t)n, sizeof *fe), *be = calloc((size_t)n, sizeof *be);
    int *seen = calloc((size_t)n * 2, sizeof *seen);
    double *last = calloc((size_t)in->p, sizeof *last);
    assert_int_equal(o->n_ops, 2 * n);
    for (int64_t i = 0; i < o->n_ops; i++) {
        const dw_sim_op *op = &o->ops[i];
        int vs = op->chunk * in->p + op->stage;
        seen[((int64_t)op->mb * P + vs) * 2 + op->kind]++;
        (op->kind == DW_OP_F ? fe : be)[(int64_t)op->mb * P + vs] = op->end;
        double dur = op->kind == DW_OP_F ? in->fwd[vs] : in->bwd[vs];
        assert_true(fabs(op->end - op->start - dur) < 1e-12);
    }
    for (int64_t i = 0; i < 2 * n; i++) assert_int_equal(seen[i], 1);
    for (int64_t i = 0; i < o->n_ops; i++) {
        const dw_sim_op *op = &o->ops[i];
        int vs = op->chunk * in->p + op->stage;
        double hop = in->p > 1 ? in->p2p : 0;
        if (op->kind == DW_OP_F && vs > 0) assert_true(op->start >= fe[(int64_t)op->mb * P + vs - 1] + hop - 1e-12);
        if (op->kind == DW_OP_B && vs < P - 1)
            assert_true(op->start >= be[(int64_t)op->mb * P + vs + 1] + hop - 1e-12);
        if (op->kind == DW_OP_B && vs == P - 1) assert_true(op->start >= fe[(int64_t)op->mb * P + vs] - 1e-12);
        assert_true(op->start >= last[op->stage] - 1e-12); /* ops of a rank are listed in order */
        last[op->stage] = op->end;
    }
    free(fe), free(be), free(seen), free(last);
}

static void test_random_stages_replay(void **state) {
    (void)state;
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed() ^ 0x5678);
    for (int it = 0; it < 200; it++) {
        int p = 1 + (int)(dw_test_next(&rng) % 8), v = p > 1 ? 1 + (int)(dw_test_next(&rng) % 3) : 1;
        int m = v > 1 ? p * (1 + (int)(dw_test_next(&rng) % 4)) : 1 + (int)(dw_test_next(&rng) % 20);
        int P = p * v;
        double *fw = malloc(sizeof *fw * (size_t)P), *bw = malloc(sizeof *bw * (size_t)P);
        double crit = 0;
        for (int i = 0; i < P; i++) {
            fw[i] = dw_test_uniform(&rng, 0.05f, 1.0f);
            bw[i] = dw_test_uniform(&rng, 0.05f, 2.0f);
            crit += fw[i] + bw[i];
        }
        double p2p = dw_test_uniform(&rng, 0.0f, 0.2f);
        dw_sim_in in = {.p = p, .v = v, .m = m, .fwd = fw, .bwd = bw, .p2p = p2p};
        dw_sim_out o;
        assert_int_equal(dw_pipe_simulate(NULL, &in, true, &o), DW_OK);
        replay(&in, &o);
        /* bounds: one micro-batch's critical path; the busiest rank's work */
        assert_true(o.makespan >= crit + (P - 1) * 2 * (p > 1 ? p2p : 0) - 1e-9);
        for (int s = 0; s < p; s++) {
            assert_true(o.makespan >= o.busy[s] - 1e-9);
            assert_int_equal(o.max_inflight[s], dw_pipe_inflight(p, v, m, s));
        }
        /* latency never helps */
        dw_sim_in in0 = in;
        in0.p2p = 0;
        dw_sim_out o0;
        assert_int_equal(dw_pipe_simulate(NULL, &in0, false, &o0), DW_OK);
        assert_true(o0.makespan <= o.makespan + 1e-12);
        dw_sim_out_free(&o), dw_sim_out_free(&o0);
        free(fw), free(bw);
    }
}

static void test_bad_shapes(void **state) {
    (void)state;
    double f[4] = {1, 1, 1, 1};
    dw_sim_in in = {.p = 2, .v = 2, .m = 3, .fwd = f, .bwd = f};
    dw_sim_out o;
    assert_int_equal(dw_pipe_simulate(NULL, &in, false, &o), DW_ERR_INVALID); /* 3 % 2 */
    in.m = 0;
    assert_int_equal(dw_pipe_simulate(NULL, &in, false, &o), DW_ERR_INVALID);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_1f1b_closed_form),
        cmocka_unit_test(test_interleaved_closed_form),
        cmocka_unit_test(test_random_stages_replay),
        cmocka_unit_test(test_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
