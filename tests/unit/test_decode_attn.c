/* test_decode_attn.c — attention for cached decoding. On the CPU (every build, CI): the decode
 * reference dw_cpu_attention_decode gives bit for bit row n-1 of the whole-sequence forward
 * (dw_cpu_attention_softcap_fwd) for random shapes, GQA, sliding windows and soft-capped scores,
 * with every cached key and value after position n-1 NaN (never read). Under the host CUDA
 * emulator (tests/common/cuda_emu/run.sh BUILD with DW_EMU_TESTS=../unit/test_decode_attn) also
 * the CUDA flash-decoding kernel against that reference (test_decode_attn_gpu.h); on a GPU the
 * same cases run in tests/gpu/test_kv_cache_cuda.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/decode_cpu.h"
#include "kernels/cpu/ops_cpu.h"
#include "opcheck.h"
#include "testutil.h"

#if DW_CUDA_EMU
#include "test_decode_attn_gpu.h"
#endif

static dw_test_rng rng;

/* The forward over n positions (B = 1) and the decode of position n-1 from a cache of S > n. */
static void check_reference(int64_t n, int64_t S, int64_t H, int64_t Hkv, int64_t D, int64_t W, double cap) {
    const int64_t nq = n * H * D, nk = n * Hkv * D;
    float *q = dw_oc_alloc(nq), *k = dw_oc_alloc(nk), *v = dw_oc_alloc(nk), *out = dw_oc_alloc(nq);
    float *lse = dw_oc_alloc(n * H), *kc = dw_oc_alloc(S * Hkv * D), *vc = dw_oc_alloc(S * Hkv * D);
    float *got = dw_oc_alloc(H * D);
    dw_oc_fill(&rng, q, nq, -3, 3);
    dw_oc_fill(&rng, k, nk, -3, 3);
    dw_oc_fill(&rng, v, nk, -1, 1);
    dw_cpu_attention_softcap_fwd(out, lse, q, k, v, 1, n, H, Hkv, D, W, cap);
    for (int64_t i = 0; i < S * Hkv * D; i++) kc[i] = i < nk ? k[i] : NAN, vc[i] = i < nk ? v[i] : NAN;
    dw_cpu_attention_decode(got, q + (n - 1) * H * D, kc, vc, n, H, Hkv, D, W, cap);
    if (memcmp(got, out + (n - 1) * H * D, (size_t)(H * D) * sizeof *got) != 0)
        fail_msg("decode reference n=%lld H=%lld Hkv=%lld D=%lld W=%lld cap=%g: differs from the forward's last row",
                 (long long)n, (long long)H, (long long)Hkv, (long long)D, (long long)W, cap);
    free(q), free(k), free(v), free(out), free(lse), free(kc), free(vc), free(got);
}

static void test_reference_is_forward_row(void **state) {
    (void)state;
    for (int i = 0; i < 24; i++) {
        const int64_t Hkv = dw_test_rnd(1, 3), H = Hkv * dw_test_rnd(1, 4), D = dw_test_rnd(1, 40);
        const int64_t n = dw_test_rnd(1, 160), W = dw_test_rnd(0, 2) ? 0 : dw_test_rnd(1, n + 4);
        const double cap = dw_test_rnd(0, 2) ? 0.0 : (double)dw_test_rnd(3, 50);
        check_reference(n, n + dw_test_rnd(1, 9), H, Hkv, D, W, cap);
    }
}

#if DW_CUDA_EMU
/* The kernel against the reference: edge shapes first (one key, one key in the window, a window
 * of exactly n, the largest head_dim, a single chunk's boundary), then random ones to T 3000. */
static void test_kernel(void **state) {
    (void)state;
    int64_t bad = 0;
    bad += dw_dec_check(&rng, DW_ACT_F32, 1, 1, 1, 4, 2, 64, 0, 0.0, 1.5f);
    bad += dw_dec_check(&rng, DW_ACT_BF16, 1, 50, 50, 8, 8, 128, 1, 0.0, 1.5f);
    bad += dw_dec_check(&rng, DW_ACT_F32, 2, 70, 64, 6, 2, 33, 64, 30.0, 5.0f);
    bad += dw_dec_check(&rng, DW_ACT_BF16, 1, 40, 33, 16, 1, 256, 0, 50.0, 5.0f);
    bad += dw_dec_check(&rng, DW_ACT_F32, 1, 4096, 4096, 32, 8, 128, 0, 0.0, 1.5f);
    bad += dw_dec_check(&rng, DW_ACT_BF16, 1, 3000, 2999, 8, 4, 64, 1024, 0.0, 5.0f);
    bad += dw_dec_check_random(&rng, 24, 3000);
    assert_int_equal(bad, 0);
}

static int gpu_setup(void **state) {
    dw_test_rng_init(&rng, dw_test_seed() ^ 0xDEC0DEull);
    return dw_gc_init(state);
}
#endif

static int setup(void **state) {
    dw_test_rng_init(&rng, dw_test_seed() ^ 0xDEC0DEull);
    return dw_test_group_setup(state);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_reference_is_forward_row)};
    int rc = cmocka_run_group_tests(tests, setup, dw_test_group_teardown);
#if DW_CUDA_EMU
    const struct CMUnitTest gpu[] = {cmocka_unit_test(test_kernel)};
    rc |= cmocka_run_group_tests(gpu, gpu_setup, dw_gc_fini);
#endif
    return rc;
}
