/* test_core_gpu.c — the core on a real GPU: CUDA contexts, the lazily created stream and library
 * handles, device arenas (alignment, limits, every byte writable), and the probe's GPU fields. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "core/ctx.h"
#include "deepwell.h"
#include "probe/hw.h"
#include "testutil.h"

static dw_ctx *cuda_ctx(void) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts o = {.device = DW_DEVICE_CUDA, .device_index = 0};
    if (dw_ctx_create(&o, &ctx) != DW_OK) fail_msg("no CUDA context: %s", dw_errmsg(NULL));
    return ctx;
}

static int handles_created;
static dw_status fake_create(dw_ctx *ctx, void **out) {
    (void)ctx;
    handles_created++;
    *out = malloc(16);
    return DW_OK;
}

static void test_stream_and_handles(void **state) {
    (void)state;
    dw_ctx *ctx = cuda_ctx();
    assert_int_equal(dw_ctx_device(ctx), DW_DEVICE_CUDA);
    void *s1 = NULL, *s2 = NULL;
    assert_int_equal(dw_ctx_stream(ctx, &s1), DW_OK);
    assert_non_null(s1);
    assert_int_equal(dw_ctx_stream(ctx, &s2), DW_OK);
    assert_ptr_equal(s1, s2); /* created once */
    assert_int_equal(cudaStreamQuery((cudaStream_t)s1), cudaSuccess);
    handles_created = 0;
    void *h1 = NULL, *h2 = NULL;
    assert_int_equal(dw_ctx_handle(ctx, DW_HANDLE_USER0, fake_create, free, &h1), DW_OK);
    assert_int_equal(dw_ctx_handle(ctx, DW_HANDLE_USER0, fake_create, free, &h2), DW_OK);
    assert_ptr_equal(h1, h2);
    assert_int_equal(handles_created, 1); /* lazily, once; freed with the context */
    dw_ctx_free(ctx);
    /* an out-of-range device is refused with a message */
    dw_ctx *bad = (dw_ctx *)1;
    dw_ctx_opts o = {.device = DW_DEVICE_CUDA, .device_index = 999};
    assert_int_equal(dw_ctx_create(&o, &bad), DW_ERR_INVALID);
    assert_null(bad);
    assert_non_null(strstr(dw_errmsg(NULL), "999"));
}

static void test_device_arena(void **state) {
    (void)state;
    dw_ctx *ctx = cuda_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    size_t cap = (size_t)64 << 20;
    dw_arena a;
    assert_int_equal(dw_arena_init(ctx, &a, DW_ARENA_DEVICE, cap, "gpu-test"), DW_OK);
    unsigned char *host = malloc(cap);
    for (int i = 0; i < 100; i++) {
        size_t align = (size_t)256 << (dw_test_next(&rng) % 4);
        size_t bytes = 1 + dw_test_next(&rng) % (1 << 20);
        void *p = NULL;
        dw_status s = dw_arena_alloc(ctx, &a, bytes, align, &p);
        if (s != DW_OK) {
            assert_int_equal(s, DW_ERR_NOMEM);
            break;
        }
        assert_int_equal((uintptr_t)p % align, 0);
        unsigned char v = (unsigned char)(dw_test_next(&rng) & 0xFF);
        assert_int_equal(cudaMemset(p, v, bytes), cudaSuccess);
        assert_int_equal(cudaMemcpy(host, p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        for (size_t k = 0; k < bytes; k++)
            if (host[k] != v) fail_msg("byte %zu of allocation %d: %u != %u", k, i, host[k], v);
    }
    size_t before = 0, total = 0;
    assert_int_equal(cudaMemGetInfo(&before, &total), cudaSuccess);
    dw_arena_release(&a);
    size_t after = 0;
    assert_int_equal(cudaMemGetInfo(&after, &total), cudaSuccess);
    assert_true(after >= before + cap - ((size_t)2 << 20)); /* the backing store went back */
    /* an impossible arena fails with a message naming it, not a crash */
    dw_arena huge;
    assert_int_equal(dw_arena_init(ctx, &huge, DW_ARENA_DEVICE, (size_t)1 << 50, "huge"), DW_ERR_NOMEM);
    assert_non_null(strstr(dw_errmsg(ctx), "huge"));
    free(host);
    dw_ctx_free(ctx);
}

static void test_probe_gpu_fields(void **state) {
    (void)state;
    dw_ctx *ctx = cuda_ctx();
    dw_hw *hw = NULL;
    assert_int_equal(dw_probe(ctx, &hw), DW_OK);
    int n = 0;
    assert_int_equal(cudaGetDeviceCount(&n), cudaSuccess);
    assert_int_equal(dw_hw_gpu_count(hw), n);
    assert_null(dw_hw_notice(hw));
    for (int i = 0; i < n; i++) {
        const dw_gpu_info *g = &hw->gpus[i];
        struct cudaDeviceProp p;
        assert_int_equal(cudaGetDeviceProperties(&p, i), cudaSuccess);
        assert_string_equal(g->name, p.name);
        assert_int_equal(g->sms, p.multiProcessorCount);
        assert_int_equal(g->cc_major, p.major);
        assert_true(g->hbm_bytes == p.totalGlobalMem);
        assert_true(g->hbm_free_bytes > 0 && (uint64_t)g->hbm_free_bytes <= g->hbm_bytes);
        assert_true(g->sm_clock_mhz > 500 && g->mem_clock_mhz > 500);
        assert_true(g->l2_bytes > 0 && g->smem_optin_bytes >= 48 * 1024);
        assert_int_equal(g->wgmma, p.major == 9);
        assert_int_equal(g->tcgen05, p.major == 10);
    }
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_and_handles),
        cmocka_unit_test(test_device_arena),
        cmocka_unit_test(test_probe_gpu_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
