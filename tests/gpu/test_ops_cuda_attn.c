/* test_ops_cuda_attn.c — CUDA attention (causal, GQA, flash-style; sliding windows and soft-capped
 * scores (Gemma 2) on the tensor-core kernels for BF16 D 64/128, else the reference kernels) and
 * fused cross-entropy against the CPU reference: fresh random inputs, odd shapes (T not a multiple
 * of the 8-row/32-key or 64-row tiles,
 * D from 6 to 256), NaN-poisoned outputs, guard bands, FP32 and BF16, determinism (two runs bit-
 * equal), in-place cross-entropy gradient, ignore_index. Needs a GPU (ctest label "gpu").
 *
 * Tolerances (|gpu - cpu| <= atol * max|cpu| + rtol * |cpu|): the GPU computes in FP32 with
 * expf/logf and FMA dot products over D and T (<= 300 terms here), the CPU in double; FP32
 * rounding then gives ~1e-6 relative, so FP32 uses rtol 1e-4 and atol 1e-5 of the max (a wrong
 * mask, scale or head mapping is off by O(1)). lse: rtol 1e-5. BF16 activations: the same BF16
 * inputs on both sides and one BF16 rounding of the output: rtol 8e-3 (2 BF16 ulps), atol 1e-4.
 * Cross-entropy: the loss is a double mean of FP32 row losses, rtol 1e-5.
 * DW_ATTN_TILES=2,2,2 runs the same cases on attn_mma.cu's 128-row / 32-query-chunk variants.
 * Runs with DW_ATTN=mma unless the environment sets DW_ATTN (cuDNN: test_attn_cudnn.c). */
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
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0xF1A5Bull);
    return dw_gc_init(state);
}

/* Bit-equality of two device tensors of the same size (determinism). */
static int64_t same_bits(const char *name, const dw_gt *a, const dw_gt *b) {
    unsigned char *ha = malloc(a->bytes ? a->bytes : 1), *hb = malloc(b->bytes ? b->bytes : 1);
    DW_GC_CUDA(cudaMemcpy(ha, a->dev, a->bytes, cudaMemcpyDeviceToHost));
    DW_GC_CUDA(cudaMemcpy(hb, b->dev, b->bytes, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (size_t i = 0; i < a->bytes; i++)
        if (ha[i] != hb[i]) {
            fprintf(stderr, "NOT DETERMINISTIC %s: %s and %s differ first at byte %zu\n", name,
                    a->name, b->name, i);
            bad = 1;
            break;
        }
    free(ha), free(hb);
    return bad;
}

/* ---- attention ------------------------------------------------------------------------------ */
/* qk: range of q and k; 1.5 gives soft attention, 5 gives scores of tens (peaked softmax, many
 * rescales of the running max and underflowing exponentials) */
/* W > 0: a sliding window of W keys, cap > 0: scores soft-capped to cap tanh(s / cap)
 * (dw_cuda_attention_window_*, oracle dw_cpu_attention_softcap_*) */
static int64_t run_attention_w(dw_act_dtype dt, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                               int64_t D, float qk, int64_t W, double cap) {
    char name[160];
    snprintf(name, sizeof name, "attention[%s B=%lld T=%lld H=%lld Hkv=%lld D=%lld qk=%g W=%lld cap=%g]",
             dw_gc_dtname(dt), (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D,
             (double)qk, (long long)W, cap);
    const bool masked = W > 0 || cap > 0;
    int64_t bad = 0;
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
    const dw_gc_tol tl = dt == DW_ACT_BF16 ? DW_GC_TOL_BF16 : (dw_gc_tol){1e-5, 1e-4, 0}, tlse = {1e-6, 1e-5, 0};
    dw_gt *q = dw_gt_rand(&g_rng, "q", nq, dt, -qk, qk), *k = dw_gt_rand(&g_rng, "k", nk, dt, -qk, qk);
    dw_gt *v = dw_gt_rand(&g_rng, "v", nk, dt, -1, 1), *g = dw_gt_rand(&g_rng, "dout", nq, dt, -1, 1);
    dw_gt *out = dw_gt_out("out", nq, dt), *lse = dw_gt_out("lse", nl, DW_ACT_F32);
    float *wout = dw_oc_alloc(nq), *wlse = dw_oc_alloc(nl);
    dw_cpu_attention_softcap_fwd(wout, wlse, q->host, k->host, v->host, B, T, H, Hkv, D, W, cap);
    if (masked)
        DW_GC_OK(bad, name, dw_cuda_attention_window_fwd(NULL, dt, out->dev, lse->dev, q->dev, k->dev, v->dev, B, T, H,
                                                         Hkv, D, W, cap, dw_gc_stream));
    else
        DW_GC_OK(bad, name, dw_cuda_attention_fwd(NULL, dt, out->dev, lse->dev, q->dev, k->dev, v->dev, B,
                                                T, H, Hkv, D, dw_gc_stream));
    /* backward reads the CPU forward's out (in the activation dtype) and lse */
    dw_gt *out_in = dw_gt_from("out_in", wout, nq, dt), *lse_in = dw_gt_from("lse_in", wlse, nl, DW_ACT_F32);
    dw_gt *dq = dw_gt_out("dq", nq, dt), *dk = dw_gt_out("dk", nk, dt), *dv = dw_gt_out("dv", nk, dt);
    dw_gt *dq2 = dw_gt_out("dq(run 2)", nq, dt), *dk2 = dw_gt_out("dk(run 2)", nk, dt);
    dw_gt *dv2 = dw_gt_out("dv(run 2)", nk, dt), *delta = dw_gt_out("delta", nl, DW_ACT_F32);
    float *wdq = dw_oc_alloc(nq), *wdk = dw_oc_alloc(nk), *wdv = dw_oc_alloc(nk);
    dw_cpu_attention_softcap_bwd(wdq, wdk, wdv, g->host, q->host, k->host, v->host, out_in->host,
                                 lse_in->host, B, T, H, Hkv, D, W, cap);
    for (int run = 0; run < 2; run++) {
        void *pq = run ? dq2->dev : dq->dev, *pk = run ? dk2->dev : dk->dev, *pv = run ? dv2->dev : dv->dev;
        if (masked)
            DW_GC_OK(bad, name, dw_cuda_attention_window_bwd(NULL, dt, pq, pk, pv, g->dev, q->dev, k->dev, v->dev,
                                                             out_in->dev, lse_in->dev, delta->dev, B, T, H, Hkv, D, W,
                                                             cap, dw_gc_stream));
        else
            DW_GC_OK(bad, name, dw_cuda_attention_bwd(NULL, dt, pq, pk, pv, g->dev, q->dev, k->dev, v->dev,
                                                    out_in->dev, lse_in->dev, delta->dev, B, T, H, Hkv, D,
                                                    dw_gc_stream));
    }
    DW_GC_SYNC();
    DW_GC_CMP(bad, name, out, wout, tl);
    DW_GC_CMP(bad, name, lse, wlse, tlse);
    /* a window of one key: dq and dk vanish (p = 1, ds = dO.(v - out) = 0), so the kernels' FP32
     * rounding (~1e-7) meets a zero oracle; an absolute floor far below a wrong mask's O(0.1) */
    const dw_gc_tol tg = W == 1 ? (dw_gc_tol){tl.atol, tl.rtol, 1e-5} : tl;
    DW_GC_CMP(bad, name, dq, wdq, tg);
    DW_GC_CMP(bad, name, dk, wdk, tg);
    DW_GC_CMP(bad, name, dv, wdv, tl);
    bad += same_bits(name, dq, dq2) + same_bits(name, dk, dk2) + same_bits(name, dv, dv2);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(wout), free(wlse), free(wdq), free(wdk), free(wdv);
    return bad;
}

static int64_t run_attention(dw_act_dtype dt, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, float qk) {
    return run_attention_w(dt, B, T, H, Hkv, D, qk, 0, 0.0);
}

/* Sliding windows (mistral, qwen2, Gemma 2) and soft-capped scores (Gemma 2). BF16 with D 64 or
 * 128 runs the tensor-core kernels (64-row tiles: key tiles below every row's window skipped in the
 * forward and dQ, query tiles past every key's window in dK/dV), the rest the reference kernels.
 * Windows: one key, shorter than a 32-key tile, across tiles, not a multiple of either tile, as
 * long as T and longer (the causal mask), random; caps: none, Gemma 2's 50 with peaked scores
 * (qk 5: scores of tens, partly capped), and a small one that saturates most scores. */
static int64_t run_masked_cases(void) {
    int64_t bad = 0;
    const int64_t wins[] = {1, 5, 32, 33, 70, 130, 1 + (int64_t)(dw_test_next(&g_rng) % 129)};
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof wins / sizeof wins[0]; i++)
            bad += run_attention_w(d ? DW_ACT_BF16 : DW_ACT_F32, 2, 130, 4, 2, i % 2 ? 24 : 64, i == 3 ? 5.0f : 1.5f,
                                   wins[i], 0.0);
    /* the tensor-core kernels across many tiles: T 300 (a partial last tile), windows inside one
     * tile, across two, longer than T; D 128; a cap alone, a cap and a window */
    const int64_t wmma[] = {7, 64, 65, 100 + (int64_t)(dw_test_next(&g_rng) % 100), 400};
    for (size_t i = 0; i < sizeof wmma / sizeof wmma[0]; i++)
        bad += run_attention_w(DW_ACT_BF16, 1, 300, 4, 2, i == 2 ? 128 : 64, 1.5f, wmma[i], 0.0);
    for (int d = 0; d < 2; d++) {
        const dw_act_dtype dt = d ? DW_ACT_BF16 : DW_ACT_F32;
        bad += run_attention_w(dt, 2, 150, 4, 2, 64, 5.0f, 0, 50.0);
        bad += run_attention_w(dt, 1, 200, 2, 1, 128, 5.0f, 0, 2.0);
        bad += run_attention_w(dt, 2, 97, 4, 4, 64, 5.0f, 1 + (int64_t)(dw_test_next(&g_rng) % 96), 50.0);
        bad += run_attention_w(dt, 1, 77, 6, 2, 40, 5.0f, 20, 3.0);
    }
    return bad;
}

static void test_attention(void **state) {
    (void)state;
    static const int64_t shapes[][5] = {
        /* B, T, H, Hkv, D */
        {2, 5, 4, 2, 6},    {1, 1, 1, 1, 1},     {2, 77, 6, 2, 40},  {1, 33, 4, 4, 64},
        {1, 130, 2, 1, 128}, {1, 41, 2, 1, 256}, {3, 9, 8, 2, 33},   {1, 300, 1, 1, 17},
    };
    int64_t bad = 0;
    for (int d = 0; d < 2; d++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            bad += run_attention(d ? DW_ACT_BF16 : DW_ACT_F32, shapes[i][0], shapes[i][1],
                                 shapes[i][2], shapes[i][3], shapes[i][4], 1.5f);
    bad += run_attention(DW_ACT_F32, 2, 70, 4, 2, 24, 5.0f);
    bad += run_attention(DW_ACT_BF16, 1, 45, 2, 1, 64, 5.0f);
    /* tensor-core tiles (attn_mma.cu, D = 64: 128-row forward / dQ blocks, dK/dV in 32-query
     * chunks): several key tiles, a partial last 128-row block (T = 200: rows 128..199 of 256),
     * T a multiple of 128, GQA groups of 4 and 1, peaked scores */
    bad += run_attention(DW_ACT_BF16, 2, 200, 8, 2, 64, 1.5f);
    bad += run_attention(DW_ACT_BF16, 1, 256, 2, 2, 64, 1.5f);
    bad += run_attention(DW_ACT_BF16, 1, 161, 4, 1, 64, 5.0f);
    bad += run_attention(DW_ACT_BF16, 1, 150, 2, 1, 128, 1.5f);
    bad += run_masked_cases();
    assert_int_equal(bad, 0);
}

/* ---- cross-entropy -------------------------------------------------------------------------- */
static int64_t run_xent(dw_act_dtype dt, int64_t N, int64_t V, int ignore_every) {
    char name[160];
    snprintf(name, sizeof name, "cross_entropy[%s N=%lld V=%lld]", dw_gc_dtname(dt), (long long)N,
             (long long)V);
    int64_t bad = 0;
    dw_gc_tol tg = dt == DW_ACT_BF16 ? DW_GC_TOL_BF16 : (dw_gc_tol){1e-5, 1e-4, 0};
    const dw_gc_tol tloss = {0, 1e-5, 0};
    const float dloss = dw_test_uniform(&g_rng, 0.5f, 2.0f);
    int32_t *tgt = malloc((size_t)N * sizeof *tgt);
    int64_t valid = 0;
    for (int64_t n = 0; n < N; n++) {
        tgt[n] = ignore_every && n % ignore_every == 1 ? -100 : (int32_t)(dw_test_next(&g_rng) % (uint64_t)V);
        valid += tgt[n] >= 0;
    }
    /* dlogits = dloss (p - onehot) / valid cancels at the target when p -> 1 (V = 1: exactly 0):
     * its error scales with the terms, a few FP32 ulps of 1 (the kernel's exponent is ex2.approx
     * of an FFMA, whose rounding residual is not 0 even at the row's max) */
    tg.abs = 8.0 * FLT_EPSILON * dloss / (double)(valid ? valid : 1);
    dw_gt *tg_ = dw_gt_ints("targets", tgt, N);
    dw_gt *x = dw_gt_rand(&g_rng, "logits", N * V, dt, -4, 4);
    dw_gt *inplace = dw_gt_from("logits_inplace", x->host, N * V, dt);
    dw_gt *loss = dw_gt_out("loss", 1, DW_ACT_F32), *loss2 = dw_gt_out("loss(inplace)", 1, DW_ACT_F32);
    dw_gt *loss3 = dw_gt_out("loss(no grad)", 1, DW_ACT_F32), *rl = dw_gt_out("row_loss", N, DW_ACT_F32);
    dw_gt *dx = dw_gt_out("dlogits", N * V, dt);
    const int64_t wsn = (int64_t)(dw_cuda_cross_entropy_ws_bytes(N) + 3) / 4;
    dw_gt *ws = dw_gt_out("ws", wsn, DW_ACT_F32);
    float wloss, *wrl = dw_oc_alloc(N), *wdx = dw_oc_alloc(N * V);
    wloss = (float)dw_cpu_cross_entropy_fwd(x->host, tgt, N, V);
    for (int64_t n = 0; n < N; n++)
        wrl[n] = tgt[n] < 0 ? 0.0f : (float)dw_cpu_cross_entropy_fwd(x->host + n * V, tgt + n, 1, V);
    dw_cpu_cross_entropy_bwd(wdx, x->host, tgt, N, V, dloss);
    DW_GC_OK(bad, name, dw_cuda_cross_entropy(NULL, dt, loss->dev, rl->dev, dx->dev, x->dev, tg_->dev,
                                            N, V, dloss, ws->dev, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_cross_entropy(NULL, dt, loss2->dev, NULL, inplace->dev, inplace->dev,
                                            tg_->dev, N, V, dloss, ws->dev, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_cross_entropy(NULL, dt, loss3->dev, NULL, NULL, x->dev, tg_->dev, N, V,
                                            dloss, ws->dev, dw_gc_stream));
    DW_GC_SYNC();
    DW_GC_CMP(bad, name, loss, &wloss, tloss);
    DW_GC_CMP(bad, name, loss2, &wloss, tloss);
    DW_GC_CMP(bad, name, loss3, &wloss, tloss);
    DW_GC_CMP(bad, name, rl, wrl, tloss);
    DW_GC_CMP(bad, name, dx, wdx, tg);
    DW_GC_CMP(bad, name, inplace, wdx, tg);
    bad += same_bits(name, loss, loss3); /* the gradient pass does not change the loss */
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(tgt), free(wrl), free(wdx);
    return bad;
}

/* All rows ignored: loss 0, gradient 0. A target >= V: NaN loss (not an out-of-bounds read). */
static int64_t run_xent_edges(dw_act_dtype dt) {
    const char *name = dt == DW_ACT_BF16 ? "cross_entropy edges[bf16]" : "cross_entropy edges[f32]";
    const int64_t N = 3, V = 11;
    int64_t bad = 0;
    int32_t none[3] = {-100, -1, -100}, over[3] = {2, (int32_t)V, 4};
    dw_gt *t0 = dw_gt_ints("targets(all ignored)", none, N), *t1 = dw_gt_ints("targets(>=V)", over, N);
    dw_gt *x = dw_gt_rand(&g_rng, "logits", N * V, dt, -4, 4);
    dw_gt *loss = dw_gt_out("loss", 1, DW_ACT_F32), *dx = dw_gt_out("dlogits", N * V, dt);
    dw_gt *loss1 = dw_gt_out("loss(>=V)", 1, DW_ACT_F32);
    dw_gt *ws = dw_gt_out("ws", (int64_t)(dw_cuda_cross_entropy_ws_bytes(N) + 3) / 4, DW_ACT_F32);
    float zero = 0.0f, nan = NAN, *zeros = dw_oc_alloc(N * V);
    for (int64_t i = 0; i < N * V; i++) zeros[i] = 0.0f;
    DW_GC_OK(bad, name, dw_cuda_cross_entropy(NULL, dt, loss->dev, NULL, dx->dev, x->dev, t0->dev, N,
                                            V, 1.0f, ws->dev, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_cross_entropy(NULL, dt, loss1->dev, NULL, NULL, x->dev, t1->dev, N, V,
                                            1.0f, ws->dev, dw_gc_stream));
    DW_GC_SYNC();
    const dw_gc_tol exact = {0, 0, 0};
    DW_GC_CMP(bad, name, loss, &zero, exact);
    DW_GC_CMP(bad, name, dx, zeros, exact);
    DW_GC_CMP(bad, name, loss1, &nan, exact);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(zeros);
    return bad;
}

static void test_cross_entropy(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int d = 0; d < 2; d++) {
        const dw_act_dtype dt = d ? DW_ACT_BF16 : DW_ACT_F32;
        bad += run_xent(dt, 29, 97, 4);
        bad += run_xent(dt, 7, 1031, 3);
        bad += run_xent(dt, 13, 8209, 5);
        bad += run_xent(dt, 3, 50257, 0);
        bad += run_xent(dt, 1, 1, 0);
        bad += run_xent_edges(dt);
    }
    assert_int_equal(bad, 0);
}

int main(void) {
    /* These tolerances and the determinism check are the mma / reference kernels'; cuDNN (the BF16
     * default where it runs) has its own test, test_attn_cudnn.c. An outer DW_ATTN still wins. */
    setenv("DW_ATTN", "mma", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_cross_entropy),
    };
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
