/* test_ops_cuda_xent_chunks.c — the cross-entropy in pieces (dw_cuda_cross_entropy_begin/rows/end,
 * ops_xent.cu), as the fused LM head (ops.def head_xent) runs it over chunks of rows: the valid
 * rows of the whole batch counted once, the row kernel per chunk, the mean at the end. Against the
 * one-shot dw_cuda_cross_entropy on the same buffers: loss and dlogits bit for bit (the same
 * kernels on the same rows at the same addresses); against the CPU (head_xent_cpu.c's rows, summed
 * over the chunks) within test_ops_cuda_attn.c's cross-entropy tolerances. Random chunk sizes that
 * do not divide N, ignored rows, FP32 and BF16, guard bands and NaN-poisoned outputs. Needs a GPU
 * (label gpu); the host emulator runs it too (tests/common/cuda_emu/run.sh). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucheck.h"
#include "kernels/cpu/ops_cpu.h"
#include "opcheck.h"
#include "testutil.h"

static dw_test_rng g_rng;

static int setup(void **state) {
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x4EADull);
    return dw_gc_init(state);
}

/* Bytes of a and b equal (device tensors of one size). */
static int64_t same_bytes(const char *name, const dw_gt *a, const dw_gt *b) {
    unsigned char *ha = malloc(a->bytes ? a->bytes : 1), *hb = malloc(b->bytes ? b->bytes : 1);
    DW_GC_CUDA(cudaMemcpy(ha, a->dev, a->bytes, cudaMemcpyDeviceToHost));
    DW_GC_CUDA(cudaMemcpy(hb, b->dev, b->bytes, cudaMemcpyDeviceToHost));
    const int64_t bad = a->bytes != b->bytes || memcmp(ha, hb, a->bytes) != 0;
    if (bad) fprintf(stderr, "%s: %s and %s differ\n", name, a->name, b->name);
    free(ha), free(hb);
    return bad;
}

static int64_t run_chunks(dw_act_dtype dt, int64_t N, int64_t V, int64_t chunk) {
    char name[160];
    snprintf(name, sizeof name, "cross_entropy chunks[%s N=%lld V=%lld chunk=%lld]", dw_gc_dtname(dt), (long long)N,
             (long long)V, (long long)chunk);
    int64_t bad = 0, valid = 0;
    const float dloss = dw_test_uniform(&g_rng, 0.5f, 2.0f);
    int32_t *tgt = malloc((size_t)N * sizeof *tgt);
    for (int64_t n = 0; n < N; n++) {
        tgt[n] = dw_test_next(&g_rng) % 5 == 1 ? -100 : (int32_t)(dw_test_next(&g_rng) % (uint64_t)V);
        valid += tgt[n] >= 0;
    }
    dw_gc_tol tg = dt == DW_ACT_BF16 ? DW_GC_TOL_BF16 : (dw_gc_tol){1e-5, 1e-4, 0};
    tg.abs = 8.0 * FLT_EPSILON * dloss / (double)(valid ? valid : 1);
    const dw_gc_tol tloss = {0, 1e-5, 0};
    dw_gt *tg_ = dw_gt_ints("targets", tgt, N);
    dw_gt *x = dw_gt_rand(&g_rng, "logits", N * V, dt, -4, 4);
    dw_gt *pieces = dw_gt_from("logits(pieces, in place)", x->host, N * V, dt);
    dw_gt *whole = dw_gt_from("logits(one call, in place)", x->host, N * V, dt);
    dw_gt *loss_p = dw_gt_out("loss(pieces)", 1, DW_ACT_F32), *loss_w = dw_gt_out("loss(one call)", 1, DW_ACT_F32);
    dw_gt *loss_e = dw_gt_out("loss(pieces, no gradient)", 1, DW_ACT_F32);
    const int64_t wsn = (int64_t)(dw_cuda_cross_entropy_ws_bytes(N) + 3) / 4;
    dw_gt *ws = dw_gt_out("ws", wsn, DW_ACT_F32), *ws2 = dw_gt_out("ws2", wsn, DW_ACT_F32);
    const size_t es = dt == DW_ACT_BF16 ? 2 : 4;
    void *s = dw_gc_stream;
    /* pieces, in place over the logits; and an evaluation pass (no gradient) over the original */
    DW_GC_OK(bad, name, dw_cuda_cross_entropy_begin(NULL, ws->dev, tg_->dev, N, s));
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
        const int64_t nc = N - r0 < chunk ? N - r0 : chunk;
        char *c = (char *)pieces->dev + (size_t)(r0 * V) * es;
        DW_GC_OK(bad, name, dw_cuda_cross_entropy_rows(NULL, dt, ws->dev, r0, c, c, (const int32_t *)tg_->dev + r0, nc,
                                                       V, dloss, s));
    }
    DW_GC_OK(bad, name, dw_cuda_cross_entropy_end(NULL, loss_p->dev, ws->dev, N, s));
    DW_GC_OK(bad, name, dw_cuda_cross_entropy_begin(NULL, ws2->dev, tg_->dev, N, s));
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
        const int64_t nc = N - r0 < chunk ? N - r0 : chunk;
        DW_GC_OK(bad, name, dw_cuda_cross_entropy_rows(NULL, dt, ws2->dev, r0, NULL,
                                                       (const char *)x->dev + (size_t)(r0 * V) * es,
                                                       (const int32_t *)tg_->dev + r0, nc, V, dloss, s));
    }
    DW_GC_OK(bad, name, dw_cuda_cross_entropy_end(NULL, loss_e->dev, ws2->dev, N, s));
    DW_GC_OK(bad, name, dw_cuda_cross_entropy(NULL, dt, loss_w->dev, NULL, whole->dev, whole->dev, tg_->dev, N, V,
                                            dloss, ws2->dev, s));
    DW_GC_SYNC();
    bad += same_bytes(name, loss_p, loss_w);
    bad += same_bytes(name, loss_e, loss_w);
    bad += same_bytes(name, pieces, whole);
    /* the CPU: the same rows chunk by chunk (head_xent_cpu.c) */
    float *want = dw_oc_alloc(N * V);
    memcpy(want, x->host, (size_t)(N * V) * sizeof(float));
    double sum = 0;
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
        const int64_t nc = N - r0 < chunk ? N - r0 : chunk;
        dw_cpu_head_xent_rows(want + r0 * V, &sum, want + r0 * V, tgt + r0, nc, V, valid ? dloss / (double)valid : 0);
    }
    const float wloss = valid ? (float)(sum / (double)valid) : 0.0f;
    DW_GC_CMP(bad, name, loss_p, &wloss, tloss);
    DW_GC_CMP(bad, name, pieces, want, tg);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(tgt), free(want);
    return bad;
}

static void test_chunks(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int d = 0; d < 2; d++) {
        const dw_act_dtype dt = d ? DW_ACT_BF16 : DW_ACT_F32;
        bad += run_chunks(dt, 29, 97, 1 + (int64_t)(dw_test_next(&g_rng) % 9));
        bad += run_chunks(dt, 37, 1031, 5 + (int64_t)(dw_test_next(&g_rng) % 11));
        bad += run_chunks(dt, 9, 8209, 4);
        bad += run_chunks(dt, 6, 6, 6); /* one chunk */
    }
    assert_int_equal(bad, 0);
}

/* Bad arguments are refused by name before anything is launched. */
static void test_refused(void **state) {
    (void)state;
    float *p = (float *)(uintptr_t)256;
    assert_int_equal(dw_cuda_cross_entropy_begin(NULL, NULL, (int32_t *)p, 4, NULL), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_cross_entropy_rows(NULL, DW_ACT_F32, p, -1, NULL, p, (int32_t *)p, 2, 3, 1.0f, NULL),
                     DW_ERR_INVALID);
    assert_int_equal(dw_cuda_cross_entropy_end(NULL, p, p, 0, NULL), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(NULL), "cross_entropy"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunks),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
