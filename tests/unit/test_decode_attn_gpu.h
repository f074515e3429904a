/* test_decode_attn_gpu.h — the CUDA decode attention (kernels/cuda/decode_attn.h) against the CPU
 * reference of the same step (dw_cpu_attention_decode), for test_decode_attn.c under the host
 * emulator and tests/gpu/test_kv_cache_cuda.c on a GPU: fresh random q, keys and values (BF16 ones
 * rounded first, so both sides read the same values), NaN-poisoned output, guard bands around every
 * buffer, and a cache of S positions of which only n are valid (the rest NaN: a read past n shows).
 * Normwise ||gpu - cpu||_2 / ||cpu||_2 <= 1e-5 (FP32) or 2e-2 (BF16: one rounding of the output),
 * and no NaN. Needs gpucheck.h's CUDA runtime. */
#ifndef DW_TEST_DECODE_ATTN_GPU_H
#define DW_TEST_DECODE_ATTN_GPU_H

#include <math.h>
#include <stdio.h>

#include "gpucheck.h"
#include "kernels/cpu/decode_cpu.h"
#include "kernels/cuda/decode_attn.h"

/* One case: B sequences, cache of S positions, n valid; returns the failures (0: passed). */
static int64_t dw_dec_check(dw_test_rng *r, dw_act_dtype dt, int64_t B, int64_t S, int64_t n, int64_t H,
                            int64_t Hkv, int64_t D, int64_t W, double cap, float qk) {
    char name[200];
    snprintf(name, sizeof name, "decode_attn[%s B=%lld S=%lld n=%lld H=%lld Hkv=%lld D=%lld W=%lld cap=%g qk=%g]",
             dw_gc_dtname(dt), (long long)B, (long long)S, (long long)n, (long long)H, (long long)Hkv, (long long)D,
             (long long)W, cap, (double)qk);
    const int64_t nq = B * H * D, nkv = B * S * Hkv * D;
    dw_gt *q = dw_gt_new("q", nq, dt), *k = dw_gt_new("kcache", nkv, dt), *v = dw_gt_new("vcache", nkv, dt);
    dw_oc_fill(r, q->host, nq, -qk, qk);
    dw_oc_fill(r, k->host, nkv, -qk, qk);
    dw_oc_fill(r, v->host, nkv, -1, 1);
    for (int64_t b = 0; b < B; b++) /* positions n.. of the cache: never read */
        for (int64_t i = n * Hkv * D; i < S * Hkv * D; i++) k->host[b * S * Hkv * D + i] = v->host[b * S * Hkv * D + i] = NAN;
    dw_gt_upload(q), dw_gt_upload(k), dw_gt_upload(v);
    const size_t wb = dw_cuda_decode_attn_work_bytes(B, H, D, S);
    dw_gt *work = dw_gt_out("work", (int64_t)(wb / sizeof(float)), DW_ACT_F32), *out = dw_gt_out("out", nq, dt);
    int64_t bad = 0;
    DW_GC_OK(bad, name, dw_cuda_decode_attn(NULL, dt, out->dev, q->dev, k->dev, v->dev, B, S, n, H, Hkv, D, W, cap,
                                            work->dev, wb, dw_gc_stream));
    DW_GC_SYNC();
    float *want = dw_oc_alloc(nq), *got = dw_oc_alloc(nq);
    for (int64_t b = 0; b < B; b++)
        dw_cpu_attention_decode(want + b * H * D, q->host + b * H * D, k->host + b * S * Hkv * D,
                                v->host + b * S * Hkv * D, n, H, Hkv, D, W, cap);
    dw_gt_download(out, got);
    double d2 = 0, r2 = 0;
    int64_t nan = 0;
    for (int64_t i = 0; i < nq; i++) {
        if (!isfinite(got[i])) nan++;
        d2 += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        r2 += (double)want[i] * want[i];
    }
    const double err = sqrt(d2) / (r2 > 0 ? sqrt(r2) : 1.0), tol = dt == DW_ACT_BF16 ? 2e-2 : 1e-5;
    if (nan || !(err <= tol)) {
        fprintf(stderr, "MISMATCH %s: normwise error %.3g (tolerance %g), %lld non-finite of %lld\n", name, err, tol,
                (long long)nan, (long long)nq);
        bad++;
    }
    if (!dw_gc_guards_ok(name)) bad++;
    free(want), free(got);
    dw_gc_free_all();
    return bad;
}

/* `cases` random shapes: T (= n) up to tmax, heads and KV heads (GQA groups of 1 to 12, past the
 * kernel's 8 heads a block), D of 64, 128 or odd, windows shorter and longer than n, caps; every
 * other case BF16. Returns the failures. */
static int64_t dw_dec_check_random(dw_test_rng *r, int cases, int64_t tmax) {
    static const int64_t Ds[] = {64, 128, 1, 7, 33, 65, 96, 255};
    int64_t bad = 0;
    for (int i = 0; i < cases; i++) {
        const uint64_t rnd = dw_test_next(r);
        const int64_t Hkv = 1 + (int64_t)(rnd % 3), group = 1 + (int64_t)((rnd >> 8) % 12), D = Ds[(rnd >> 16) % 8];
        const int64_t n = 1 + (int64_t)(dw_test_next(r) % (uint64_t)tmax), S = n + (int64_t)((rnd >> 24) % 40);
        const int64_t B = 1 + (int64_t)((rnd >> 32) % 2);
        const int64_t W = (rnd >> 36) % 3 == 0 ? 1 + (int64_t)((rnd >> 40) % (uint64_t)(n + 8)) : 0;
        const double cap = (rnd >> 50) % 3 == 0 ? 5.0 + (double)((rnd >> 52) % 50) : 0.0;
        const float qk = (rnd >> 58) % 2 ? 1.5f : 5.0f; /* soft or peaked scores */
        bad += dw_dec_check(r, i % 2 ? DW_ACT_BF16 : DW_ACT_F32, B, S, n, Hkv * group, Hkv, D, W, cap, qk);
    }
    return bad;
}

#endif /* DW_TEST_DECODE_ATTN_GPU_H */
