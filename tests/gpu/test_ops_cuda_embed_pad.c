/* test_ops_cuda_embed_pad.c — the CUDA embedding backward with a padding row (nn.Embedding
 * padding_idx, issue 26) against the CPU reference dw_cpu_embedding_bwd_pad: tokens equal to pad add
 * nothing, so row pad keeps exactly what the table's gradient held (a tied head's part, or zero)
 * and every other row is the scatter as without a pad. Fresh random tokens, about one in four a
 * pad, FP32 and BF16 dout, odd sizes and more buckets than rows, guard bands. Needs a GPU (ctest
 * label "gpu"); the host emulator (tests/common/cuda_emu/run.sh) runs it too.
 * Tolerance as test_ops_cuda.c's embedding (the sums are FP32 there, double here): 1e-5 relative,
 * 1e-6 of the max; the pad row exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucheck.h"
#include "kernels/cpu/ops_cpu.h"
#include "opcheck.h"
#include "testutil.h"

static dw_test_rng g_rng;

static int setup(void **state) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0xFAD0ull);
    return dw_gc_init(state);
}

/* dwte (V,C) starts random (tied) or zero (untied); dout (N,C) in dt; tok (N). Returns mismatches. */
static int64_t run_pad(dw_act_dtype dt, int64_t V, int64_t N, int64_t C, bool tied) {
    char name[128];
    const int64_t pad = (int64_t)(dw_test_next(&g_rng) % (uint64_t)V);
    snprintf(name, sizeof name, "embedding_bwd_pad[%s V=%lld N=%lld C=%lld pad=%lld %s]", dw_gc_dtname(dt),
             (long long)V, (long long)N, (long long)C, (long long)pad, tied ? "tied" : "untied");
    int64_t bad = 0;
    int32_t *tok = malloc((size_t)N * sizeof *tok);
    for (int64_t n = 0; n < N; n++)
        tok[n] = (int32_t)(dw_test_next(&g_rng) % 4 == 0 ? pad : (int64_t)(dw_test_next(&g_rng) % (uint64_t)V));
    tok[N / 2] = (int32_t)pad;
    dw_gt *tk = dw_gt_ints("tok", tok, N);
    dw_gt *g = dw_gt_rand(&g_rng, "dout", N * C, dt, -1, 1);
    float *wd = dw_oc_alloc(V * C), *start = dw_oc_alloc(V * C), *got = dw_oc_alloc(V * C);
    if (tied) dw_oc_fill(&g_rng, wd, V * C, -1, 1);
    else memset(wd, 0, (size_t)(V * C) * sizeof *wd);
    memcpy(start, wd, (size_t)(V * C) * sizeof *wd);
    dw_gt *dwte = dw_gt_from("dwte", wd, V * C, DW_ACT_F32);
    dw_cpu_embedding_bwd_pad(wd, g->host, tok, N, C, pad); /* g->host: dout as the GPU reads it */
    DW_GC_OK(bad, name, dw_cuda_embedding_bwd_pad(NULL, dt, dwte->dev, g->dev, tk->dev, N, C, V, pad, dw_gc_stream));
    DW_GC_SYNC();
    const dw_gc_tol tparam = {1e-6, 1e-5, 0};
    DW_GC_CMP(bad, name, dwte, wd, tparam);
    dw_gt_download(dwte, got);
    if (memcmp(got + pad * C, start + pad * C, (size_t)C * sizeof *got)) {
        fprintf(stderr, "%s: the padding row changed\n", name);
        bad++;
    }
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(tok), free(wd), free(start), free(got);
    return bad;
}

static void test_embedding_bwd_pad(void **state) {
    (void)state;
    const int64_t shapes[][3] = {{1, 7, 5}, {13, 37, 9}, {300, 513, 33}, {2000, 700, 1030}};
    const dw_act_dtype dts[] = {DW_ACT_F32, DW_ACT_BF16};
    int64_t bad = 0;
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int tied = 0; tied < 2; tied++) bad += run_pad(dts[d], shapes[i][0], shapes[i][1], shapes[i][2], tied);
    assert_int_equal(bad, 0);
}

/* A pad outside [-1, V) is refused by the entry, not run. */
static void test_pad_refused(void **state) {
    (void)state;
    const int64_t bad_pads[] = {10, -2}; /* V = 10 */
    for (int i = 0; i < 2; i++)
        assert_int_not_equal(dw_cuda_embedding_bwd_pad(NULL, DW_ACT_F32, NULL, NULL, NULL, 0, 4, 10, bad_pads[i],
                                                       dw_gc_stream), DW_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_bwd_pad),
        cmocka_unit_test(test_pad_refused),
    };
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
