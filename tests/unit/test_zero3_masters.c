/* test_zero3_masters.c — an engine made for ZeRO-3 (dw_engine_opts.zero = 3) on a random rank of
 * 4 (the launcher's environment) holds only its shard of the FP32 masters from creation
 * (runtime/engine.c, exec.c): the weights pool is the shard's floats 256-aligned, with no BF16
 * copies in a BF16 program, beside the shards of the gradients and moments. Initialising it from a
 * random seed gives exactly floats [lo, hi) of a whole engine initialised from that seed, and
 * loading a weights file written by a whole engine with random weights gives exactly that file's
 * floats [lo, hi) (runtime/weights.c fills the shard alone), bit for bit, FP32 and BF16. What reads
 * the whole masters is refused by name (parameter access, saving, a forward or backward without
 * ZeRO-3's gathers); refreshing the derived copies does nothing (each is made on its gather). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/program.h"
#include "compile/shard.h"
#include "runtime/engine.h"
#include "testutil.h"

#define CTX dw_test_ctx

/* The whole engine's masters (F floats) to host. */
static void read_masters(dw_engine *e, float *out, int64_t n) {
    assert_int_equal(e->be->i->download(e->be, out, e->x->w, (size_t)n * sizeof *out), DW_OK);
}

static void refused(dw_status st, const char *what) {
    assert_int_equal(st, DW_ERR_UNSUPPORTED);
    if (!strstr(dw_errmsg(CTX), "ZeRO-3 shard of the weights")) fail_msg("%s: %s", what, dw_errmsg(CTX));
}

static void check_precision(const char *precision) {
    dw_test_rng *rng = &dw_test_group_rng;
    const int64_t B = 1, T = 8;
    dw_graph *g = dw_test_small_graph(CTX, "gpt2-tiny", B, T, rng);
    assert_non_null(g);
    dw_test_model whole;
    assert_int_equal(dw_test_model_build(CTX, g, precision, DW_DEVICE_AUTO, &whole), DW_OK);
    const dw_compiled *p = whole.c;
    const int64_t F = p->param_floats, V = g->model.vocab;
    const uint64_t seed = dw_test_next(rng);
    float *want = malloc((size_t)F * sizeof *want), *got = malloc((size_t)F * sizeof *got);
    assert_non_null(want), assert_non_null(got);
    char *dir = dw_test_tmpdir(), *wpath = dw_test_path(dir, "model.safetensors");

    const int world = 4, rank = (int)(dw_test_next(rng) % 4);
    char rs[8];
    snprintf(rs, sizeof rs, "%d", rank);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    setenv("WORLD_SIZE", "4", 1), setenv("RANK", rs, 1), setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29512", 1);
    int64_t lo, hi;
    dw_shard_range(F, world, rank, &lo, &hi);
    assert_true(hi > lo && hi - lo < F);
    dw_engine_opts eo;
    dw_engine_opts_init(&eo, sizeof eo);
    eo.zero = 3;
    dw_engine *e = NULL;
    if (dw_engine_create(CTX, p, &eo, &e) != DW_OK) fail_msg("ZeRO-3 engine: %s", dw_errmsg(CTX));
    /* the pools: the masters' shard alone (no BF16 copies), the gradients' and moments' shards */
    assert_int_equal(e->x->pool_bytes[DW_POOL_WEIGHTS], (4 * (hi - lo) + 255) / 256 * 256);
    assert_true(e->x->pool_bytes[DW_POOL_WEIGHTS] < p->pool_bytes[DW_POOL_WEIGHTS] / 2);
    assert_int_equal(e->x->w_lo, lo), assert_int_equal(e->x->w_hi, hi);
    assert_null(e->x->wb);
    assert_int_equal(e->x->pool_bytes[DW_POOL_GRADS], 4 * (hi - lo));
    assert_int_equal(e->x->pool_bytes[DW_POOL_OPTIM], 8 * (hi - lo));

    /* from a seed: the whole engine's floats [lo, hi) */
    assert_int_equal(dw_engine_init_weights(whole.e, seed), DW_OK);
    read_masters(whole.e, want, F);
    assert_int_equal(dw_engine_init_weights(e, seed), DW_OK);
    assert_int_equal(e->be->i->download(e->be, got, e->x->w, (size_t)(hi - lo) * sizeof *got), DW_OK);
    assert_memory_equal(got, want + lo, (size_t)(hi - lo) * sizeof *got);

    /* from a file of random weights: its floats [lo, hi) */
    dw_test_random_params(whole.e, rng, 0.3f, NULL, 0);
    read_masters(whole.e, want, F);
    assert_int_equal(dw_engine_save_weights(whole.e, wpath), DW_OK);
    assert_int_equal(dw_engine_load_weights(e, wpath), DW_OK);
    assert_int_equal(e->be->i->download(e->be, got, e->x->w, (size_t)(hi - lo) * sizeof *got), DW_OK);
    assert_memory_equal(got, want + lo, (size_t)(hi - lo) * sizeof *got);

    /* what reads the whole masters, refused by name; the refresh has nothing to derive */
    int32_t x[8], y[8];
    dw_test_random_tokens(x, B * T, V, rng);
    dw_test_random_tokens(y, B * T, V, rng);
    double loss = 0;
    refused(dw_engine_param_read(e, 0, got), "parameter read");
    refused(dw_engine_param_write(e, 0, got), "parameter write");
    refused(dw_engine_save_weights(e, wpath), "save");
    refused(dw_engine_forward(e, x, y, B, T, NULL, &loss), "forward");
    refused(dw_engine_forward_backward(e, x, y, B, T, 1.0, &loss), "backward");
    assert_int_equal(dw_engine_refresh(e), DW_OK);
    dw_engine_free(e);
    unsetenv("WORLD_SIZE"), unsetenv("RANK"), unsetenv("MASTER_ADDR"), unsetenv("MASTER_PORT");
    dw_test_rmtree(dir);
    free(dir), free(wpath), free(want), free(got);
    dw_test_model_free(&whole);
}

static void test_fp32(void **state) {
    (void)state;
    check_precision(NULL);
}

static void test_bf16(void **state) {
    (void)state;
    check_precision("bf16");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp32),
        cmocka_unit_test(test_bf16),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
