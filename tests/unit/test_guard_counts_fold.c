/* test_guard_counts_fold.c — the guard's counters fold the counts of reused x copies at the read
 * (train/guard_counts.c, precision/quant_counts.h): on the GPU a layer that quantises x's copy k
 * counts it into its own pair and siblings reusing the copy take those counts when the counters
 * are read (dw_qcounts.from), instead of a memset and an add kernel each per step. Here on a CPU
 * engine's counter block (backend memory is host memory): random counts in the layers' slots and
 * own pairs, a random reuse table, two reads: each layer's reported counts (dw_qcounter_step_all,
 * the step's totals, and the quant_stats.jsonl lines dw_qcounter_write reports over both reads)
 * equal its slot plus the own pairs it names, exactly — what each layer added on the device
 * before the fold; the block reads back zero after each read; a layer forgotten (fallen back to
 * BF16) takes no sibling's counts. The fold on a GPU engine: tests/gpu/test_quant_counts_cuda.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "ir/ir.h"
#include "runtime/engine.h"
#include "train/guard.h"
#include "testutil.h"

static dw_ctx *ctx;
static char *dir, *model;

static int setup(void **state) {
    (void)state;
    return dw_test_train_fixture(&ctx, &dir, &model, 2, 32, 64);
}
static int teardown(void **state) {
    (void)state;
    dw_test_train_fixture_close(ctx, dir, model);
    return 0;
}

enum { W = DW_QC_WORDS, K = DW_QC_KINDS };

static void test_fold(void **state) {
    (void)state;
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    dw_model *m = dw_test_open_model(ctx, model, dw_test_next(&rng), NULL, 2, 16);
    assert_non_null(m);
    dw_engine *e = dw_model_engine(m);
    int *nodes = malloc((size_t)e->g->n_nodes * sizeof *nodes), n = 0;
    for (int i = 0; i < e->g->n_nodes; i++)
        if (!strcmp(dw_op_name(e->g->nodes[i].op), "linear")) nodes[n++] = i;
    assert_true(n >= 7); /* q k v o gate up down per block */
    dw_comm *host = NULL;
    assert_int_equal(dw_comm_self_create(ctx, &host), DW_OK);
    dw_qcounter *q = NULL;
    assert_int_equal(dw_qcounter_open(ctx, e, nodes, n, 0, &q), DW_OK);
    dw_qcounts *c = dw_qcounter_counts(q);
    const size_t slots = (size_t)n * K * W, owns = (size_t)n * 2 * W;
    int64_t *want = calloc(slots, sizeof *want), *got = calloc(slots, sizeof *got), *reported = calloc(slots, sizeof *reported);
    const int forgotten = (int)dw_test_rnd(0, n - 1);
    for (int read = 0; read < 2; read++) {
        for (size_t i = 0; i < slots + owns; i++) c->dev[i] = dw_test_next(&rng) >> 40; /* slots, then own pairs */
        for (int i = 0; i < 2 * n; i++) c->from[i] = (int)dw_test_rnd(-1, n - 1);
        if (read == 1) dw_qcounter_forget(q, forgotten);
        assert_true(read == 0 || (c->from[2 * forgotten] == -1 && c->from[2 * forgotten + 1] == -1));
        int64_t tot[W] = {0};
        for (int i = 0; i < n; i++)
            for (int k = 0; k < K; k++)
                for (int w = 0; w < W; w++) {
                    int64_t v = (int64_t)c->dev[((size_t)i * K + k) * W + w];
                    for (int cp = 0; k == DW_QC_X && cp < 2; cp++)
                        if (c->from[2 * i + cp] >= 0) v += (int64_t)c->own[((size_t)c->from[2 * i + cp] * 2 + cp) * W + w];
                    want[((size_t)i * K + k) * W + w] = v;
                    reported[((size_t)i * K + k) * W + w] += v;
                    tot[w] += v;
                }
        int64_t over = -1, under = -1;
        assert_int_equal(dw_qcounter_read(q, host, &over, &under), DW_OK);
        assert_int_equal(dw_qcounter_step_all(q, host, got), DW_OK);
        for (size_t i = 0; i < slots; i++)
            if (got[i] != want[i]) fail_msg("read %d: word %zu of the layers' counts is %lld, want %lld", read, i, (long long)got[i], (long long)want[i]);
        assert_true(over == tot[DW_QC_OVER] && under == tot[DW_QC_UNDER]);
        for (size_t i = 0; i < slots + owns; i++) assert_true(c->dev[i] == 0); /* zeroed for the next step */
    }
    /* what the guard writes to quant_stats.jsonl: the sums over both reads, three lines a layer */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_int_equal(dw_qcounter_write(q, host, f, 2, NULL), DW_OK);
    fclose(f);
    int lines = 0;
    for (char *p = text; p && *p; lines++) {
        long long step, o, u, el, steps;
        char layer[200], kind[8];
        if (sscanf(p, "{\"step\": %lld, \"layer\": \"%199[^\"]\", \"counts\": \"%7[^\"]\", \"overflow\": %lld, \"underflow\": "
                      "%lld, \"elements\": %lld, \"steps\": %lld}",
                   &step, layer, kind, &o, &u, &el, &steps) != 7)
            fail_msg("line %d of the counts: %.120s", lines, p);
        const int i = lines / K, k = lines % K;
        assert_string_equal(layer, e->g->nodes[nodes[i]].name);
        assert_string_equal(kind, k == DW_QC_X ? "x" : k == DW_QC_W ? "w" : "dy");
        const int64_t *r = reported + ((size_t)i * K + k) * W;
        if (o != r[DW_QC_OVER] || u != r[DW_QC_UNDER] || el != r[DW_QC_N] || steps != 2 || step != 2)
            fail_msg("%s %s: reported %lld / %lld / %lld over %lld steps, want %lld / %lld / %lld over 2", layer, kind, o, u, el,
                     steps, (long long)r[DW_QC_OVER], (long long)r[DW_QC_UNDER], (long long)r[DW_QC_N]);
        p = strchr(p, '\n');
        p = p ? p + 1 : NULL;
    }
    assert_int_equal(lines, n * K);
    free(text);
    free(want), free(got), free(reported);
    dw_qcounter_free(q);
    dw_comm_free(host, true);
    free(nodes);
    dw_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fold, setup, teardown),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
