/* test_ops_cuda_rope.c — the CUDA rope kernels (kernels/cuda/ops_rope.cu) against the CPU reference
 * (kernels/cpu/rope_cpu.c): every rope type of kernels/rope_freq.h (default, linear, llama3, yarn;
 * longrope with its short or long list by the run's length T against original_max_position_embeddings,
 * cos and sin times the attention factor), over the whole head and over a partial rotary width R < D
 * (partial_rotary_factor: the first R dims of each head rotate, the rest are copied bit for bit);
 * forward out of place and in place, backward. Fresh random inputs and widths; shapes reaching each
 * path: the 16-byte table kernel (R/2 and D multiples of the vector), its element-wise form (R/2 or D
 * not), the per-pair kernel (R/2 > 1024); the dispatcher's refusals. FP32 and BF16, outputs poisoned
 * with NaN, guard bands. Needs a GPU (ctest label "gpu"); the host emulator
 * (tests/common/cuda_emu/run.sh) runs it too. Tolerances as test_ops_cuda.c states: 1e-6 (the GPU
 * computes rope in double too); BF16 2 BF16 ulps and 1e-4 of the max. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
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
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0x80BEull);
    return dw_gc_init(state);
}

static const dw_act_dtype DTS[] = {DW_ACT_F32, DW_ACT_BF16};

/* A random rope type with parameters around real configs' (Llama 3.x llama3, Qwen/DeepSeek yarn,
 * Phi-3 longrope), original positions small enough that every type's bands fall inside R (longrope:
 * around T, so that either list is taken), over a width R of D. */
static dw_rope_scaling rand_rope(int32_t type, int64_t R, int64_t D, int64_t T) {
    dw_rope_scaling r = {.type = type, .rotary_dim = R == D ? 0 : (int32_t)R};
    if (type == DW_ROPE_LONGROPE) {
        r.n_factors = (int32_t)(R / 2);
        for (int32_t i = 0; i < r.n_factors; i++)
            r.short_factor[i] = dw_test_uniform(&g_rng, 0.8f, 2), r.long_factor[i] = dw_test_uniform(&g_rng, 1, 60);
        r.original_max = fmax(1, floor(dw_test_uniform(&g_rng, 0.5f, 1.5f) * (float)T));
        r.attention_factor = dw_test_uniform(&g_rng, 0.9f, 1.3f);
        return r;
    }
    r.factor = r.type == DW_ROPE_DEFAULT ? 0 : dw_test_uniform(&g_rng, 1.5, 40);
    if (r.type == DW_ROPE_LLAMA3 || r.type == DW_ROPE_YARN) r.original_max = dw_test_uniform(&g_rng, 16, 8192);
    if (r.type == DW_ROPE_LLAMA3) r.low_freq_factor = 1, r.high_freq_factor = dw_test_uniform(&g_rng, 2, 8);
    if (r.type == DW_ROPE_YARN) {
        r.beta_fast = 32, r.beta_slow = 1, r.truncate = dw_test_uniform(&g_rng, 0, 1) < 0.5;
        r.attention_factor = 0.1 * log(r.factor) + 1.0;
    }
    return r;
}

static int64_t run_rope(dw_act_dtype dt, int32_t type, int64_t B, int64_t T, int64_t H, int64_t D, int64_t R) {
    const dw_rope_scaling rs = rand_rope(type, R, D, T);
    char name[200];
    snprintf(name, sizeof name, "rope[%s B=%lld T=%lld H=%lld D=%lld R=%lld %s%s]", dw_gc_dtname(dt), (long long)B,
             (long long)T, (long long)H, (long long)D, (long long)R, dw_rope_type_name(rs.type),
             dw_rope_long(&rs, T) ? " long" : "");
    int64_t bad = 0;
    const int64_t n = B * T * H * D;
    const double theta = dw_test_uniform(&g_rng, 0, 1) < 0.5f ? 10000.0 : 500000.0;
    const dw_gc_tol tl = dw_gc_pick(dt, 1e-6, 1e-6);
    dw_gt *x = dw_gt_rand(&g_rng, "x", n, dt, -2, 2), *g = dw_gt_rand(&g_rng, "dout", n, dt, -1, 1);
    dw_gt *out = dw_gt_out("out", n, dt), *dx = dw_gt_out("dx", n, dt);
    dw_gt *inplace = dw_gt_from("x_inplace", x->host, n, dt);
    float *wout = dw_oc_alloc(n), *wdx = dw_oc_alloc(n);
    dw_cpu_rope_fwd(wout, x->host, B, T, H, D, theta, &rs);
    dw_cpu_rope_bwd(wdx, g->host, B, T, H, D, theta, &rs);
    int64_t passed = 0; /* the reference copies dims R.. of each head: so must the kernels (compared below) */
    for (int64_t row = 0; row < B * T * H; row++)
        for (int64_t k = row * D + R; k < (row + 1) * D; k++) passed += wout[k] != x->host[k] || wdx[k] != g->host[k];
    if (passed) {
        fprintf(stderr, "%s: the CPU reference changed %lld passed-through values\n", name, (long long)passed);
        bad++;
    }
    DW_GC_OK(bad, name, dw_cuda_rope_fwd(NULL, dt, out->dev, x->dev, B, T, H, D, theta, &rs, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_rope_bwd(NULL, dt, dx->dev, g->dev, B, T, H, D, theta, &rs, dw_gc_stream));
    DW_GC_OK(bad, name, dw_cuda_rope_fwd(NULL, dt, inplace->dev, inplace->dev, B, T, H, D, theta, &rs, dw_gc_stream));
    DW_GC_SYNC();
    DW_GC_CMP(bad, name, out, wout, tl);
    DW_GC_CMP(bad, name, dx, wdx, tl);
    DW_GC_CMP(bad, name, inplace, wout, tl);
    if (!dw_gc_guards_ok(name)) bad++;
    dw_gc_free_all();
    free(wout), free(wdx);
    return bad;
}

/* Every type over the whole head. */
static void test_types(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int d = 0; d < 2; d++)
        for (int32_t ty = 0; ty < DW_ROPE_TYPE_COUNT; ty++) {
            bad += run_rope(DTS[d], ty, 2, 5, 4, 6, 6);
            bad += run_rope(DTS[d], ty, 2, 37, 3, 10, 10);
            bad += run_rope(DTS[d], ty, 1, 301, 2, 128, 128);
            bad += run_rope(DTS[d], ty, 3, 97, 8, 64, 64);  /* 32 positions per block, the last block short */
            bad += run_rope(DTS[d], ty, 2, 50, 32, 64, 64); /* the Llama q shape: 8 positions per block */
            bad += run_rope(DTS[d], ty, 2, 3, 5, 12, 12);   /* D/2 = 6: BF16 element-wise, FP32 not 4-wide */
            if (ty != DW_ROPE_LONGROPE) /* its lists end at 128 pairs */
                bad += run_rope(DTS[d], ty, 1, 7, 2, 4100, 4100); /* D/2 > 1024: one thread per pair */
        }
    assert_int_equal(bad, 0);
}

/* An even width of 2 .. D - 2 */
static int64_t rand_width(int64_t D) { return 2 * (int64_t)dw_test_uniform(&g_rng, 1, (float)(D / 2)); }

/* Partial rotary widths, the default type and longrope (the two Phi-3 carries), a random type too. */
static void test_partial(void **state) {
    (void)state;
    int64_t bad = 0;
    for (int d = 0; d < 2; d++)
        for (int lr = 0; lr < 2; lr++) {
            const int32_t ty = lr ? DW_ROPE_LONGROPE : DW_ROPE_DEFAULT;
            bad += run_rope(DTS[d], ty, 2, 37, 3, 96, 64);  /* 16-byte paths */
            bad += run_rope(DTS[d], ty, 2, 50, 8, 128, 96); /* Phi-4-mini's widths: R/2 48, D 128 */
            bad += run_rope(DTS[d], ty, 3, 29, 4, 64, 16);  /* 2 groups rotated, 6 passed */
            bad += run_rope(DTS[d], ty, 2, 11, 5, 24, 12);  /* R/2 = 6: element-wise */
            bad += run_rope(DTS[d], ty, 1, 9, 3, 20, 16);   /* R/2 = 8 but D = 20 not 8-wide */
            bad += run_rope(DTS[d], ty, 2, 17, 2, 10, 2);   /* one pair */
            for (int k = 0; k < 3; k++) { /* random widths */
                const int64_t D = 2 * (int64_t)dw_test_uniform(&g_rng, 2, 70);
                bad += run_rope(DTS[d], ty, 1 + k % 2, (int64_t)dw_test_uniform(&g_rng, 1, 70), 1 + k, D,
                                rand_width(D));
            }
        }
    for (int32_t ty = 0; ty < DW_ROPE_LONGROPE; ty++) bad += run_rope(DW_ACT_BF16, ty, 2, 33, 3, 64, 48);
    bad += run_rope(DW_ACT_F32, DW_ROPE_YARN, 1, 5, 2, 4400, 4100); /* R/2 > 1024: one thread per pair slot */
    bad += run_rope(DW_ACT_BF16, DW_ROPE_DEFAULT, 1, 3, 1, 4104, 2050);
    assert_int_equal(bad, 0);
}

/* What the dispatcher refuses: an odd head, a type without its parameters, an odd or too wide R,
 * longrope lists not of R/2 positive entries. */
static void test_validation(void **state) {
    (void)state;
    float *p = NULL;
    DW_GC_CUDA(cudaMalloc((void **)&p, 4096));
    assert_int_equal(dw_cuda_rope_fwd(NULL, DW_ACT_F32, p, p, 1, 2, 1, 5, 1e4, NULL, dw_gc_stream), DW_ERR_INVALID);
    const dw_rope_scaling no_factor = {.type = DW_ROPE_LINEAR}; /* factor 0 */
    assert_int_equal(dw_cuda_rope_fwd(NULL, DW_ACT_F32, p, p, 1, 2, 1, 4, 1e4, &no_factor, dw_gc_stream), DW_ERR_INVALID);
    const int32_t widths[] = {3, 10, -2};
    for (int k = 0; k < 3; k++) {
        const dw_rope_scaling w = {.rotary_dim = widths[k]};
        assert_int_equal(dw_cuda_rope_fwd(NULL, DW_ACT_F32, p, p, 1, 2, 1, 8, 1e4, &w, dw_gc_stream), DW_ERR_INVALID);
    }
    dw_rope_scaling lr = rand_rope(DW_ROPE_LONGROPE, 6, 8, 4);
    assert_int_equal(dw_cuda_rope_fwd(NULL, DW_ACT_F32, p, p, 1, 2, 1, 8, 1e4, &lr, dw_gc_stream), DW_OK);
    lr.rotary_dim = 0; /* 4 pairs, 3 entries */
    assert_int_equal(dw_cuda_rope_bwd(NULL, DW_ACT_F32, p, p, 1, 2, 1, 8, 1e4, &lr, dw_gc_stream), DW_ERR_INVALID);
    lr.rotary_dim = 6, lr.long_factor[1] = 0;
    assert_int_equal(dw_cuda_rope_fwd(NULL, DW_ACT_F32, p, p, 1, 2, 1, 8, 1e4, &lr, dw_gc_stream), DW_ERR_INVALID);
    DW_GC_SYNC();
    cudaFree(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_partial),
        cmocka_unit_test(test_validation),
    };
    return cmocka_run_group_tests(tests, setup, dw_gc_fini);
}
