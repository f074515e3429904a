/* test_plan_ep_buffers.c — expert parallelism's buffers for the group's rows, one computation
 * (train/ep_buffers.h) for the runtime and the planner, on random tiny Mixtral shapes:
 *   - runtime: on K forked tcp ranks (K = 2 or 4), what dw_ep_create allocates (its log's "MiB of
 *     buffers ...") is dw_ep_buffer_bytes' total over the engine's program; uncapped
 *     (DW_EP_CAPACITY past K) it grows with K as the group's rows do, and the default is that;
 *   - planner: an ep > 1 plan's memory per rank carries that total, computed over the engine's
 *     program for the plan's micro-batch (compiled here as the planner's engine model does), as
 *     ep_buffers, in its total and named in the plan's JSON; every other term is the same plan's
 *     at ep 1 on the engine model (the runtime keeps the whole model on every rank under --ep). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>
#include <math.h>
#include <sys/wait.h>
#include <unistd.h>

#include "capture/capture.h"
#include "comm/comm.h"
#include "compile/program.h"
#include "runtime/engine.h"
#include "test_plan_common.h"
#include "testutil.h"
#include "train/ep.h"
#include "train/ep_buffers.h"

/* A random tiny Mixtral (hidden 128; experts 4 or 8, top-k 1 or 2, expert width 128 or 256). */
static dw_model_config random_moe(dw_ctx *ctx, dw_test_rng *r) {
    dw_model_config c;
    if (dw_model_config_load(ctx, "mixtral-tiny", &c) != DW_OK) {
        fprintf(stderr, "mixtral-tiny: %s\n", dw_errmsg(ctx));
        abort();
    }
    c.d_model = 128, c.head_dim = 32, c.d_ff = 256;
    c.d_ff_expert = 128 << (dw_test_next(r) % 2);
    c.n_experts = 4 << (dw_test_next(r) % 2);
    c.top_k = 1 + (int64_t)(dw_test_next(r) % 2);
    return c;
}

static int64_t function_total(const dw_compiled *p, int k) {
    dw_ep_map m;
    if (dw_ep_map_build(NULL, p, k, &m) != DW_OK) return -1;
    dw_ep_bytes b;
    dw_ep_buffer_bytes(p, &m, &b);
    dw_ep_map_free(&m);
    assert_true(b.total == b.rows + b.index + b.acc + b.stage + b.fp8);
    return b.total;
}

/* ---- the runtime ------------------------------------------------------------------------------ */
typedef struct {
    dw_model_config cfg;
    int64_t B, T;
    int K;
    const char *precision;
} rt_case;

/* One rank: its engine, dw_ep_create over K ranks, the allocated bytes against the function's;
 * 0 or the failing line. */
static int rank_checks(int rank, int port, const rt_case *c) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    if (dw_ctx_create(&co, &ctx) != DW_OK) return 90;
    dw_comm *comm = NULL;
    dw_graph *g = NULL;
    dw_test_model m = {0};
    dw_ep *ep = NULL;
    int rc = 0;
    if (dw_comm_tcp_create(ctx, rank, c->K, rank, "127.0.0.1", port, 20, &comm) != DW_OK ||
        dw_capture_config(ctx, &c->cfg, c->B, c->T, &g) != DW_OK ||
        dw_test_model_build(ctx, g, c->precision, DW_DEVICE_AUTO, &m) != DW_OK ||
        dw_ep_create(m.e, comm, c->K, &ep) != DW_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, dw_errmsg(ctx));
        rc = __LINE__;
    }
    if (!rc) {
        const int64_t got = dw_ep_buffers_allocated(ep), want = function_total(m.e->p, c->K);
        const int64_t half = function_total(m.e->p, c->K / 2);
        setenv("DW_EP_CAPACITY", "1e9", 1); /* every routed row of the group on one rank (capped at K) */
        const int64_t worst = function_total(m.e->p, c->K), worst_half = function_total(m.e->p, c->K / 2);
        unsetenv("DW_EP_CAPACITY");
        if (got != want || got <= 0) {
            fprintf(stderr, "rank %d: dw_ep_create allocated %lld bytes, dw_ep_buffer_bytes says %lld\n", rank,
                    (long long)got, (long long)want);
            rc = __LINE__;
        } else if (!(half > 0 && half < want && worst_half < worst && worst == want)) {
            /* the default: the group's rows (every routed row fits), growing with K */
            fprintf(stderr, "rank %d: groups of %d: %lld bytes, of %d: %lld; uncapped %lld and %lld\n", rank,
                    c->K / 2, (long long)half, c->K, (long long)want, (long long)worst_half, (long long)worst);
            rc = __LINE__;
        }
    }
    dw_ep_free(ep);
    dw_test_model_free(&m); /* frees g */
    dw_comm_free(comm, rc == 0);
    dw_ctx_free(ctx);
    return rc;
}

static void test_runtime_allocates_the_function(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed() ^ 0xeb1);
    static const char *const precisions[] = {"bf16", "fp8_block"};
    for (int round = 0; round < 3; round++) {
        rt_case c = {.cfg = random_moe(ctx, &r), .B = 1 + (int64_t)(dw_test_next(&r) % 3),
                     .T = 8 << (dw_test_next(&r) % 2), .K = 2 << (dw_test_next(&r) % 2),
                     .precision = precisions[dw_test_next(&r) % 2]};
        print_message("round %d: experts %lld top-%lld expert width %lld, B %lld T %lld, --ep %d, %s\n", round,
                      (long long)c.cfg.n_experts, (long long)c.cfg.top_k, (long long)c.cfg.d_ff_expert,
                      (long long)c.B, (long long)c.T, c.K, c.precision);
        const int port = dw_test_free_port();
        assert_true(port > 0);
        fflush(stdout), fflush(stderr);
        pid_t kid[4] = {0};
        for (int k = 1; k < c.K; k++) {
            kid[k] = fork();
            assert_true(kid[k] >= 0);
            if (kid[k] == 0) _exit(rank_checks(k, port, &c));
        }
        const int rc = rank_checks(0, port, &c);
        for (int k = 1; k < c.K; k++) {
            int status = 0;
            assert_int_equal(waitpid(kid[k], &status, 0), kid[k]);
            assert_true(WIFEXITED(status));
            assert_int_equal(WEXITSTATUS(status), 0);
        }
        assert_int_equal(rc, 0);
    }
    dw_ctx_free(ctx);
}

/* ---- the planner ------------------------------------------------------------------------------ */
/* The function over the engine's program for the plan, compiled as the planner's engine model
 * compiles it (plan/engine.c compile_job: CUDA sm_90, the fused head, the plan's recompute and the
 * training arenas of its accumulation and ZeRO stage). */
static int64_t planned_program_total(dw_ctx *ctx, const dw_plan_in *in, const dw_par *p) {
    dw_graph *g = NULL;
    dw_policy *pol = NULL;
    dw_compiled *c = NULL;
    assert_int_equal(dw_capture_config(ctx, in->cfg, p->micro_batch, in->job.seq, &g), DW_OK);
    assert_int_equal(dw_plan_recipe_policy(ctx, in->job.recipe, &pol), DW_OK);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.device = DW_DEVICE_CUDA, o.sm = 90, o.recompute = (int)p->recompute, o.fused_head = true;
    if (!dw_compile_opts_train_arenas(&o, p->grad_accum, p->zero)) o.grad_arena = false;
    assert_int_equal(dw_compile(ctx, g, NULL, pol, &o, &c), DW_OK);
    const int64_t total = function_total(c, p->ep);
    dw_compiled_free(c), dw_policy_free(pol), dw_graph_free(g);
    return total;
}

static double others(const dw_mem *m) {
    return m->weights + m->grads + m->optimizer + m->activations + m->workspace + m->scales;
}

static void test_planner_counts_the_function(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed() ^ 0xeb2);
    for (int round = 0; round < 6; round++) {
        dw_model_config cfg = random_moe(ctx, &r);
        const int dp = 2 << (dw_test_next(&r) % 2), ep = dp == 2 || dw_test_next(&r) % 2 ? 2 : 4;
        dw_hw *hw = plan_preset(ctx, "h200", 1);
        hw->n_gpus = dp, hw->nvlink_domain = dp;
        dw_par p = {.dp = dp, .tp = 1, .pp = 1, .cp = 1, .ep = ep, .vpp = 1,
                    .micro_batch = 1 + (int64_t)(dw_test_next(&r) % 3), .grad_accum = 1 + (int64_t)(dw_test_next(&r) % 2),
                    .zero = (int)(dw_test_next(&r) % 2),
                    .recompute = dw_test_next(&r) % 2 ? DW_RECOMPUTE_FULL : DW_RECOMPUTE_NONE};
        dw_job job = {.seq = 64 << (dw_test_next(&r) % 2), .global_batch = dp * p.micro_batch * p.grad_accum};
        dw_plan_in in;
        assert_int_equal(dw_plan_in_init(ctx, &cfg, hw, &job, NULL, &in), DW_OK);
        assert_true(in.engine_model);
        const int64_t want = planned_program_total(ctx, &in, &p);
        print_message("round %d: experts %lld top-%lld, dp %d ep %d mb %lld ga %lld zero %d %s, seq %lld: %lld bytes\n",
                      round, (long long)cfg.n_experts, (long long)cfg.top_k, dp, ep, (long long)p.micro_batch,
                      (long long)p.grad_accum, p.zero, dw_recompute_name(p.recompute), (long long)job.seq,
                      (long long)want);
        assert_true(want > 0);
        dw_mem m, bare, one;
        dw_plan_memory(&in, &p, &m);
        assert_true(m.ep_buffers == (double)want);
        assert_true(fabs(m.total - (others(&m) + m.ep_buffers)) <= 1e-9 * m.total);
        /* the same plan without the engine model (no program to size the buffers over): no term */
        dw_plan_in no_engine = in;
        no_engine.engine_model = false;
        dw_plan_memory(&no_engine, &p, &bare);
        assert_true(bare.ep_buffers == 0);
        /* against ep 1 on the engine model: the runtime keeps the whole model on every rank under
         * --ep as data parallelism does (ZeRO-1 by cells shards the moments alike), so every other
         * term is the same and the total larger by exactly the buffers */
        dw_par p1 = p;
        p1.ep = 1;
        dw_plan_memory(&in, &p1, &one);
        assert_true(one.ep_buffers == 0);
        assert_true(m.weights == one.weights && m.grads == one.grads && m.optimizer == one.optimizer);
        assert_true(one.activations == m.activations && one.workspace == m.workspace && one.scales == m.scales);
        assert_true(fabs(m.total - (one.total + (double)want)) <= 1e-9 * m.total);
        /* named in the plan's JSON, in its memory and in its total */
        dw_plan_entry e;
        dw_reject why;
        char det[300];
        assert_true(dw_plan_evaluate(&in, &p, true, &e, &why, det, sizeof det));
        json_t *o = dw_plan_entry_json(&in, &e);
        const json_t *mem = json_object_get(o, "memory");
        assert_non_null(mem);
        assert_true(json_integer_value(json_object_get(mem, "ep_buffers_bytes")) == want);
        assert_true(json_integer_value(json_object_get(mem, "total_bytes")) == (json_int_t)e.mem.total);
        assert_true(e.mem.ep_buffers == (double)want);
        json_decref(o);
        dw_hw_free(hw);
    }
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_runtime_allocates_the_function),
                                       cmocka_unit_test(test_planner_counts_the_function)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
