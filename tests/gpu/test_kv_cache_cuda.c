/* test_kv_cache_cuda.c — cached decoding on a CUDA engine (runtime/kv_cache.c, on by default;
 * the cache on the device, attention by kernels/cuda/decode_attn.cu): first that
 * kernel against the CPU reference (tests/unit/test_decode_attn_gpu.h: random shapes to T 4096,
 * GQA, windows, caps, D 64/128/odd, FP32 1e-5 and BF16 2e-2 normwise); then for random-weight BF16
 * models of each family (gpt2, llama, qwen2, mixtral, qwen3-moe tiny presets, and directories of
 * Gemma 2 (windows, caps, query_pre_attn_scalar), Mistral (window) and Phi-3 (packed q|k|v,
 * partial rotary, longrope switching tables mid-decoding): tests/unit/test_kv_cache_dirs.h) at a
 * random sequence length, a prefill and every later step, fed random
 * tokens, give logits within BF16 tolerance of a whole-sequence forward over the same tokens
 * (normwise ||cached - full||_2 / ||full||_2 <= 2e-2, the op-by-op BF16 tolerance of
 * test_engine_cuda.c: the GPU's attention and M = 1 GEMMs round differently from the M = T ones),
 * and the greedy token equals the forward's argmax wherever the forward's top two logits are
 * further apart than that tolerance. Needs a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../unit/test_decode_attn_gpu.h"
#include "../unit/test_kv_cache_dirs.h"
#include "runtime/kv_cache.h"
#include "testutil.h"

static dw_ctx *cpu, *gpu;
static dw_test_rng rng;

static int64_t rnd(int64_t lo, int64_t hi) { return lo + (int64_t)(dw_test_next(&rng) % (uint64_t)(hi - lo + 1)); }

static int64_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void check_family(const char *what) {
    const int64_t T = rnd(8, 24), np = rnd(1, T - 1);
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.seq = T, mo.seed = dw_test_next(&rng);
    dw_model *m = NULL;
    if (dw_model_open(gpu, what, &mo, &m) != DW_OK) fail_msg("%s: %s", what, dw_errmsg(gpu));
    dw_engine *e = dw_model_engine(m);
    const int64_t V = dw_graph_vocab(dw_model_graph(m));
    if (!dw_kv_cache_supported(e)) fail_msg("%s: the CUDA engine does not take the cache", what);
    int32_t *tok = malloc((size_t)T * sizeof *tok);
    float *full = malloc((size_t)(T * V) * sizeof *full), *got = malloc((size_t)V * sizeof *got);
    assert_true(tok && full && got);
    for (int64_t i = 0; i < T; i++) tok[i] = (int32_t)rnd(0, V - 1);
    dw_kv_cache *kv = NULL;
    assert_int_equal(dw_kv_cache_create(e, &kv), DW_OK);
    for (int64_t len = np; len <= T; len++) {
        if (len == np) assert_int_equal(dw_kv_cache_prefill(kv, tok, np, got), DW_OK);
        else assert_int_equal(dw_kv_cache_step(kv, tok[len - 1], got), DW_OK);
        assert_int_equal(dw_engine_forward(e, tok, NULL, 1, len, full, NULL), DW_OK);
        const float *ref = full + (len - 1) * V;
        double d2 = 0, r2 = 0, mx = 0;
        for (int64_t i = 0; i < V; i++) {
            d2 += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
            r2 += (double)ref[i] * ref[i];
            if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
        }
        const double err = sqrt(d2) / (sqrt(r2) > 0 ? sqrt(r2) : 1);
        if (!(err <= 2e-2)) fail_msg("%s: position %lld: normwise error %.3g", what, (long long)(len - 1), err);
        const int64_t a = argmax(got, V), b = argmax(ref, V);
        if (a != b && ref[b] - ref[a] > 2e-2 * mx)
            fail_msg("%s: position %lld: greedy token %lld, the forward's %lld by a margin of %.3g", what,
                     (long long)(len - 1), (long long)a, (long long)b, ref[b] - ref[a]);
    }
    dw_kv_cache_free(kv);
    free(tok), free(full), free(got);
    dw_model_free(m);
}

static void test_families(void **state) {
    (void)state;
    static const char *const fam[] = {"gpt2-tiny", "llama-tiny", "qwen2-tiny", "mixtral-tiny", "qwen3-moe-tiny"};
    for (size_t f = 0; f < sizeof fam / sizeof *fam; f++) check_family(fam[f]);
}

/* The families with their own attention, as directories (tests/unit/test_kv_cache_dirs.h). */
static void test_family_dirs(void **state) {
    (void)state;
    dw_kv_for_each_dir(check_family);
}

/* The decode attention kernel against the CPU reference of the same step. */
static void test_decode_kernel(void **state) {
    int64_t bad = 0;
    assert_int_equal(dw_gc_init(state), 0);
    bad += dw_dec_check(&rng, DW_ACT_F32, 1, 4096, 4096, 32, 8, 128, 0, 0.0, 1.5f);
    bad += dw_dec_check(&rng, DW_ACT_BF16, 1, 4096, 4000, 32, 8, 128, 0, 0.0, 5.0f);
    bad += dw_dec_check(&rng, DW_ACT_BF16, 2, 3000, 2999, 16, 4, 256, 1024, 50.0, 5.0f);
    bad += dw_dec_check_random(&rng, 60, 4096);
    dw_gc_fini(state);
    assert_int_equal(bad, 0);
}

/* A CUDA engine takes the cache by default (DW_KV_CACHE unset or 1); the sampler's DW_KV_CACHE=0
 * turns it off (train/sample.c), not this predicate. */
static void test_default_on(void **state) {
    (void)state;
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.seq = 8;
    dw_model *m = NULL;
    assert_int_equal(dw_model_open(gpu, "llama-tiny", &mo, &m), DW_OK);
    unsetenv("DW_KV_CACHE");
    assert_true(dw_kv_cache_supported(dw_model_engine(m)));
    setenv("DW_KV_CACHE", "1", 1);
    assert_true(dw_kv_cache_supported(dw_model_engine(m)));
    dw_model_free(m);
}

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&rng, dw_test_seed());
    setenv("DW_KV_CACHE", "1", 1);
    return dw_test_cpu_gpu_setup(&cpu, &gpu);
}

static int teardown(void **state) {
    (void)state;
    dw_test_cpu_gpu_teardown(cpu, gpu);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_decode_kernel), cmocka_unit_test(test_families),
                                       cmocka_unit_test(test_family_dirs), cmocka_unit_test(test_default_on)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
