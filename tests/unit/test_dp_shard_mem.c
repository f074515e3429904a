/* test_dp_shard_mem.c — ZeRO-1/2's memory (compile/shard.h, runtime/exec.c
 * dw_exec_shard_optimizer): on random small models (FP32 and BF16 programs), for 2, 4 and a
 * random 3..7 ranks, the ranks' ranges tile the pool in 64-float-aligned blocks; each rank's
 * engine, its optimizer pool replaced by its shard's, allocates 8 bytes a float of its range, at
 * most what the planner reports per rank (the largest shard), and that report is the whole pool
 * over the ranks (up to the alignment: whole <= ranks x planned < whole + 512 x ranks^2 bytes).
 * The sharded engine holds exactly its range of the moments a whole checkpoint loads; AdamW over its
 * range with the global norm (train/dp_range.c) gives the whole engine's step bit for bit, weights
 * and moments; the engine's own step and the whole-optimizer save are refused on it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "compile/shard.h"
#include "runtime/engine.h"
#include "testutil.h"
#include "train/dp.h"

#define CTX dw_test_ctx

/* The ranges of `world` ranks tile [0, floats), 64-aligned, rank order; the planned per-rank
 * optimizer bytes are the largest range's and about the whole over world. */
static void check_tiling(const dw_compiled *p, int world) {
    int64_t next = 0, largest = 0;
    for (int r = 0; r < world; r++) {
        int64_t lo, hi;
        dw_shard_range(p->param_floats, world, r, &lo, &hi);
        assert_int_equal(lo, next);
        assert_int_equal(lo % 64, 0);
        assert_true(hi >= lo);
        if (hi - lo > largest) largest = hi - lo;
        next = hi;
    }
    assert_int_equal(next, p->param_floats);
    assert_int_equal(dw_shard_max_floats(p->param_floats, world), largest);
    int64_t pools[DW_POOL_COUNT];
    dw_shard_pool_bytes(p->pool_bytes, p->param_floats, world, 1, pools);
    assert_int_equal(pools[DW_POOL_OPTIM], 8 * largest);
    const int64_t whole = p->pool_bytes[DW_POOL_OPTIM];
    assert_true(world * pools[DW_POOL_OPTIM] >= whole && world * pools[DW_POOL_OPTIM] < whole + 512 * world * world);
    for (int k = 0; k < DW_POOL_COUNT; k++) /* nothing else changes; ZeRO-0 nothing at all */
        if (k != DW_POOL_OPTIM) assert_int_equal(pools[k], p->pool_bytes[k]);
    dw_shard_pool_bytes(p->pool_bytes, p->param_floats, world, 0, pools);
    assert_int_equal(pools[DW_POOL_OPTIM], whole);
}

static void read_pool(dw_engine *e, float *dst, const float *src, int64_t n) {
    assert_int_equal(e->be->i->download(e->be, dst, src, (size_t)n * sizeof *dst), DW_OK);
}

static void one_model(const char *preset, const char *precision) {
    dw_test_rng *rng = &dw_test_group_rng;
    const int64_t B = 2, T = 8;
    dw_graph *g = dw_test_small_graph(CTX, preset, B, T, rng);
    assert_non_null(g);
    dw_graph *g2 = dw_test_same_graph(CTX, g, 0, 0);
    assert_non_null(g2);
    dw_test_model whole, part;
    assert_int_equal(dw_test_model_build(CTX, g, precision, DW_DEVICE_AUTO, &whole), DW_OK);
    assert_int_equal(dw_test_model_build(CTX, g2, precision, DW_DEVICE_AUTO, &part), DW_OK);
    const dw_compiled *p = whole.c;
    const int64_t F = p->param_floats, V = g->model.vocab;
    int32_t *x = malloc((size_t)(B * T) * sizeof *x), *y = malloc((size_t)(B * T) * sizeof *y);
    float *w = malloc((size_t)F * sizeof *w), *m = malloc((size_t)F * sizeof *m), *v = malloc((size_t)F * sizeof *v);
    float *got = malloc((size_t)F * sizeof *got);
    assert_non_null(x), assert_non_null(y), assert_non_null(w), assert_non_null(m), assert_non_null(v);
    assert_non_null(got);
    dw_test_random_tokens(x, B * T, V, rng);
    dw_test_random_tokens(y, B * T, V, rng);
    /* two steps give the whole engine weights and moments of its own; they go to a checkpoint file */
    dw_test_random_params(whole.e, rng, 0.3f, NULL, 0);
    double first, last;
    assert_int_equal(dw_test_train_fixed(whole.e, x, y, B, T, 2, 1e-2, &first, &last), DW_OK);
    char *dir = dw_test_tmpdir(), *wpath = dw_test_path(dir, "model.safetensors"),
         *opath = dw_test_path(dir, "optimizer.safetensors");
    assert_int_equal(dw_engine_save_weights(whole.e, wpath), DW_OK);
    assert_int_equal(dw_engine_save_optimizer(whole.e, opath), DW_OK);
    /* the oracle: the whole engine's third step */
    assert_int_equal(dw_engine_zero_grad(whole.e), DW_OK);
    assert_int_equal(dw_engine_forward_backward(whole.e, x, y, B, T, 1.0, NULL), DW_OK);
    dw_adamw_opts ao;
    dw_adamw_opts_init(&ao, sizeof ao);
    ao.lr = 1e-2, ao.clip = 0.05; /* small: the clipping by the global norm takes part */
    double norm = 0;
    assert_int_equal(dw_engine_step(whole.e, &ao, 3, &norm), DW_OK);
    read_pool(whole.e, w, whole.e->x->w, F);
    read_pool(whole.e, m, whole.e->x->m, F);
    read_pool(whole.e, v, whole.e->x->v, F);

    const int worlds[3] = {2, 4, 3 + (int)(dw_test_next(rng) % 5)};
    for (int wi = 0; wi < 3; wi++) {
        const int world = worlds[wi];
        check_tiling(p, world);
        int64_t planned[DW_POOL_COUNT];
        dw_shard_pool_bytes(p->pool_bytes, F, world, 1 + wi % 2, planned);
        for (int r = 0; r < world; r++) {
            int64_t lo, hi;
            dw_shard_range(F, world, r, &lo, &hi);
            if (hi == lo) continue; /* a model smaller than world x 64 floats: the last rank holds it all */
            assert_int_equal(dw_exec_shard_optimizer(part.e->x, lo, hi), DW_OK);
            assert_int_equal(part.e->x->pool_bytes[DW_POOL_OPTIM], 8 * (hi - lo));
            assert_true(part.e->x->pool_bytes[DW_POOL_OPTIM] <= planned[DW_POOL_OPTIM]);
            for (int k = 0; k < DW_POOL_COUNT; k++)
                if (k != DW_POOL_OPTIM) assert_int_equal(part.e->x->pool_bytes[k], p->pool_bytes[k]);
            /* the checkpoint into the shard: its range of the moments, nothing outside */
            assert_int_equal(dw_engine_load_weights(part.e, wpath), DW_OK);
            assert_int_equal(dw_engine_load_optimizer(part.e, opath), DW_OK);
            /* the whole engine's third step on the shard's range, with the global norm */
            assert_int_equal(dw_engine_zero_grad(part.e), DW_OK);
            assert_int_equal(dw_engine_forward_backward(part.e, x, y, B, T, 1.0, NULL), DW_OK);
            dw_dp d;
            memset(&d, 0, sizeof d);
            d.ctx = CTX, d.eng = part.e;
            double sumsq = 0;
            assert_int_equal(dw_dp_range_sumsq(&d, 0, F, &sumsq), DW_OK);
            assert_true(sqrt(sumsq) == norm);
            dw_adamw_args a;
            assert_int_equal(dw_engine_adamw_args(part.e, &ao, 3, &a), DW_OK);
            assert_int_equal(dw_dp_range_adamw(&d, &a, sqrt(sumsq), lo, hi), DW_OK);
            read_pool(part.e, got, part.e->x->w + lo, hi - lo);
            assert_memory_equal(got, w + lo, (size_t)(hi - lo) * sizeof *got);
            read_pool(part.e, got, part.e->x->m, hi - lo);
            assert_memory_equal(got, m + lo, (size_t)(hi - lo) * sizeof *got);
            read_pool(part.e, got, part.e->x->v, hi - lo);
            assert_memory_equal(got, v + lo, (size_t)(hi - lo) * sizeof *got);
            /* what needs the whole state is refused, naming the shard */
            double n2 = 0;
            assert_int_equal(dw_engine_step(part.e, &ao, 4, &n2), DW_ERR_UNSUPPORTED);
            assert_non_null(strstr(dw_errmsg(CTX), "ZeRO shard"));
            assert_int_equal(dw_engine_save_optimizer(part.e, opath), DW_ERR_UNSUPPORTED);
            assert_non_null(strstr(dw_errmsg(CTX), "ZeRO shard"));
        }
    }
    dw_test_rmtree(dir);
    free(dir), free(wpath), free(opath);
    free(x), free(y), free(w), free(m), free(v), free(got);
    dw_test_model_free(&whole);
    dw_test_model_free(&part);
}

static void test_fp32_gpt2(void **state) {
    (void)state;
    one_model("gpt2-tiny", NULL);
}

static void test_bf16_llama(void **state) {
    (void)state;
    one_model("llama-tiny", "bf16");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32_gpt2),
        cmocka_unit_test(test_bf16_llama),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
