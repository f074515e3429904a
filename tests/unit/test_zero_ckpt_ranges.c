/* test_zero_ckpt_ranges.c — checkpoint moments held in several ranges a rank
 * (train/ckpt_shard_io.h, the _ranges calls; issue 28: a rank that keeps its slice of its own
 * experts' moments besides its part of the dense ones holds ranges apart). On a random model
 * trained two steps, a random world of 2 to 4 ranks and a random cut of the flat pools into ranges
 * of random ranks (some ranks with none, one rank holding two pieces of the largest parameter),
 * every rank's shard and the index are written from the whole engine. Loaded back, a whole engine
 * gets every moment and an engine made for ZeRO-1 on a random rank of 4 its own range, bit for bit
 * (resharding). The index names a rank's later piece of a tensor ("tensor": NAME@BEGIN); an index
 * naming it otherwise is refused naming the field. */
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
#include "train/ckpt_shard.h"
#include "train/ckpt_shard_io.h"

#define CTX dw_test_ctx

static int by_value(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Both moments (F floats each) of engine e from floats [lo, hi) into m, v at their pool offsets. */
static void read_moments(dw_engine *e, float *m, float *v) {
    const int64_t n = e->x->opt_hi - e->x->opt_lo;
    assert_int_equal(e->be->i->download(e->be, m + e->x->opt_lo, e->x->m, (size_t)n * sizeof *m), DW_OK);
    assert_int_equal(e->be->i->download(e->be, v + e->x->opt_lo, e->x->v, (size_t)n * sizeof *v), DW_OK);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

static void spill(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

static void test_ranges_round_trip(void **state) {
    (void)state;
    dw_test_rng *rng = &dw_test_group_rng;
    const int64_t B = 1, T = 8;
    dw_graph *g = dw_test_small_graph(CTX, "gpt2-tiny", B, T, rng);
    assert_non_null(g);
    dw_test_model whole;
    assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &whole), DW_OK);
    const dw_compiled *p = whole.c;
    const int64_t F = p->param_floats;
    double first, last; /* random weights trained two steps: moments of every parameter */
    assert_int_equal(dw_test_model_train_random(&whole, B, T, 2, 1e-2, rng, &first, &last), DW_OK);
    float *m = malloc((size_t)F * sizeof *m), *v = malloc((size_t)F * sizeof *v);
    float *gm = malloc((size_t)F * sizeof *gm), *gv = malloc((size_t)F * sizeof *gv);
    assert_true(m && v && gm && gv);
    read_moments(whole.e, m, v);

    /* the cut: random points, two more inside the largest parameter, ranks random but that one's
     * three pieces a, b, a */
    const int world = 2 + (int)(dw_test_next(rng) % 3), n_cuts = world + (int)(dw_test_next(rng) % (2 * world));
    int big = 0;
    for (int k = 1; k < p->n_params; k++)
        if (dw_ir_numel(&g->tensors[p->param_tensor[k]]) > dw_ir_numel(&g->tensors[p->param_tensor[big]])) big = k;
    const int64_t boff = p->param_off[big], bn = dw_ir_numel(&g->tensors[p->param_tensor[big]]);
    assert_true(bn >= 3);
    int64_t *cut = malloc((size_t)(n_cuts + 4) * sizeof *cut);
    assert_non_null(cut);
    int nc = 0;
    cut[nc++] = boff + bn / 3, cut[nc++] = boff + 2 * bn / 3;
    for (int i = 0; i < n_cuts; i++) cut[nc++] = 1 + (int64_t)(dw_test_next(rng) % (uint64_t)(F - 1));
    qsort(cut, (size_t)nc, sizeof *cut, by_value);
    int64_t *ranges = malloc((size_t)(2 * (nc + 1)) * sizeof *ranges);
    int *rank = malloc((size_t)(nc + 1) * sizeof *rank);
    assert_true(ranges && rank);
    int n = 0;
    int64_t at = 0;
    for (int i = 0; i <= nc; i++) {
        const int64_t end = i < nc ? cut[i] : F;
        if (end <= at) continue; /* a repeated point */
        ranges[2 * n] = at, ranges[2 * n + 1] = end;
        rank[n++] = (int)(dw_test_next(rng) % (uint64_t)world);
        at = end;
    }
    for (int i = 0; i < n; i++) { /* the largest parameter's middle third to rank 1, its neighbours to 0 */
        if (ranges[2 * i + 1] == boff + bn / 3) rank[i] = 0;
        if (ranges[2 * i] == boff + bn / 3) rank[i] = 1;
        if (ranges[2 * i] == boff + 2 * bn / 3) rank[i] = 0;
    }

    char *dir = dw_test_tmpdir(), *ipath = dw_test_path(dir, DW_CKPT_INDEX);
    int64_t *mine = malloc((size_t)(2 * n) * sizeof *mine);
    assert_non_null(mine);
    for (int r = 0; r < world; r++) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (rank[i] == r) mine[2 * k] = ranges[2 * i], mine[2 * k + 1] = ranges[2 * i + 1], k++;
        if (dw_ckpt_shard_write_ranges(whole.e, dir, r, world, k, mine) != DW_OK)
            fail_msg("rank %d's shard: %s", r, dw_errmsg(CTX));
    }
    assert_int_equal(dw_ckpt_index_write_ranges(whole.e, dir, world, 0, n, rank, ranges), DW_OK);
    char *index = slurp(ipath);
    assert_non_null(strstr(index, ".exp_avg@")); /* rank 0's second piece of the largest parameter */

    /* a whole engine gets every moment */
    dw_engine *e = NULL;
    assert_int_equal(dw_engine_create(CTX, p, NULL, &e), DW_OK);
    if (dw_ckpt_shards_load(e, dir) != DW_OK) fail_msg("load: %s", dw_errmsg(CTX));
    read_moments(e, gm, gv);
    assert_memory_equal(gm, m, (size_t)F * sizeof *m);
    assert_memory_equal(gv, v, (size_t)F * sizeof *v);
    dw_engine_free(e);

    /* an engine made for ZeRO-1 on a rank of 4 gets its range */
    const int r4 = (int)(dw_test_next(rng) % 4);
    char rs[8];
    snprintf(rs, sizeof rs, "%d", r4);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    setenv("WORLD_SIZE", "4", 1), setenv("RANK", rs, 1), setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29513", 1);
    dw_engine_opts eo;
    dw_engine_opts_init(&eo, sizeof eo);
    eo.zero = 1;
    assert_int_equal(dw_engine_create(CTX, p, &eo, &e), DW_OK);
    unsetenv("WORLD_SIZE"), unsetenv("RANK"), unsetenv("MASTER_ADDR"), unsetenv("MASTER_PORT");
    int64_t lo, hi;
    dw_shard_range(F, 4, r4, &lo, &hi);
    assert_int_equal(e->x->opt_lo, lo), assert_int_equal(e->x->opt_hi, hi);
    if (dw_ckpt_shards_load(e, dir) != DW_OK) fail_msg("ZeRO-1 load: %s", dw_errmsg(CTX));
    read_moments(e, gm, gv);
    assert_memory_equal(gm + lo, m + lo, (size_t)(hi - lo) * sizeof *m);
    assert_memory_equal(gv + lo, v + lo, (size_t)(hi - lo) * sizeof *v);
    dw_engine_free(e);

    /* an index naming a later piece otherwise: refused, naming the field */
    *strstr(index, ".exp_avg@") = '#';
    spill(ipath, index);
    assert_int_equal(dw_engine_create(CTX, p, NULL, &e), DW_OK);
    assert_int_equal(dw_ckpt_shards_load(e, dir), DW_ERR_FORMAT);
    if (!strstr(dw_errmsg(CTX), "'tensor' must name the piece as stored")) fail_msg("%s", dw_errmsg(CTX));
    dw_engine_free(e);

    dw_test_rmtree(dir);
    free(dir), free(ipath), free(index), free(mine), free(cut), free(ranges), free(rank);
    free(m), free(v), free(gm), free(gv);
    dw_test_model_free(&whole);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranges_round_trip),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
