/* test_comm_nccl.c — the NCCL communicator (src/comm/comm_nccl.c) as one rank on one GPU: libnccl
 * loaded, the id passed over the host (self) communicator, and every collective run by NCCL on its
 * own stream, ordered with the context's stream by events: values written on the context's stream
 * just before a collective are what it reduces, and a copy issued just after it reads its result
 * (no synchronisation in between). With one rank each collective is the identity (an average over
 * one rank too), so the expected values are exact. Needs a GPU and libnccl.so.2 (skipped, saying
 * so, without the library). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/ctx.h"
#include "deepwell.h"
#include "testutil.h"

enum { N = 1 << 20 };

static void test_nccl_one_rank(void **state) {
    (void)state;
    dw_ctx *ctx = NULL;
    dw_ctx_opts o = {.device = DW_DEVICE_CUDA, .device_index = 0};
    if (dw_ctx_create(&o, &ctx) != DW_OK) fail_msg("no CUDA context: %s", dw_errmsg(NULL));
    dw_comm *host = NULL, *c = NULL;
    assert_int_equal(dw_comm_self_create(ctx, &host), DW_OK);
    dw_status st = dw_comm_nccl_create(ctx, host, &c);
    if (st == DW_ERR_UNSUPPORTED) {
        fprintf(stderr, "skipped: %s\n", dw_errmsg(ctx));
        dw_comm_free(host, true);
        dw_ctx_free(ctx);
        skip();
    }
    assert_int_equal(st, DW_OK);
    assert_true(c->i->device_memory && c->world == 1 && c->host == host);
    void *sp = NULL;
    assert_int_equal(dw_ctx_stream(ctx, &sp), DW_OK);
    cudaStream_t s = (cudaStream_t)sp;

    float *h = malloc(N * sizeof *h), *back = malloc(N * sizeof *back), *d = NULL;
    assert_int_equal(cudaMalloc((void **)&d, N * sizeof *d), cudaSuccess);
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed());
    for (int op = 0; op < 5; op++) {
        for (int64_t i = 0; i < N; i++) h[i] = dw_test_uniform(&r, -3, 3);
        /* the context's stream writes, the collective reads: ordered by the ready event */
        assert_int_equal(cudaMemsetAsync(d, 0xff, N * sizeof *d, s), cudaSuccess); /* NaN first */
        assert_int_equal(cudaMemcpyAsync(d, h, N * sizeof *d, cudaMemcpyHostToDevice, s), cudaSuccess);
        switch (op) {
        case 0: st = dw_comm_all_reduce(ctx, c, d, N, DW_COMM_F32, DW_COMM_SUM); break;
        case 1: st = dw_comm_all_reduce(ctx, c, d, N, DW_COMM_F32, DW_COMM_AVG); break;
        case 2: st = dw_comm_reduce_scatter(ctx, c, d, N, DW_COMM_F32, DW_COMM_AVG); break;
        case 3: st = dw_comm_all_gather(ctx, c, d, N, DW_COMM_F32); break;
        default: st = dw_comm_broadcast(ctx, c, d, N, DW_COMM_F32, 0); break;
        }
        assert_int_equal(st, DW_OK);
        /* the collective writes, the context's stream reads: ordered by the done event */
        assert_int_equal(cudaMemcpyAsync(back, d, N * sizeof *d, cudaMemcpyDeviceToHost, s), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        assert_memory_equal(back, h, N * sizeof *h);
    }
    /* all-to-all to itself: the counts' elements move from send to recv */
    int64_t *dsend = NULL, *drecv = NULL, hs[100], hr[100], cnt = 100;
    for (int i = 0; i < 100; i++) hs[i] = (int64_t)dw_test_next(&r);
    assert_int_equal(cudaMalloc((void **)&dsend, sizeof hs), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&drecv, sizeof hr), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(dsend, hs, sizeof hs, cudaMemcpyHostToDevice, s), cudaSuccess);
    assert_int_equal(dw_comm_all_to_all(ctx, c, dsend, &cnt, drecv, &cnt, DW_COMM_I64), DW_OK);
    assert_int_equal(cudaMemcpyAsync(hr, drecv, sizeof hr, cudaMemcpyDeviceToHost, s), cudaSuccess);
    assert_int_equal(dw_comm_barrier(ctx, c), DW_OK); /* synchronises the context's stream */
    assert_memory_equal(hr, hs, sizeof hs);
    cudaFree(dsend);
    cudaFree(drecv);
    cudaFree(d);
    free(h);
    free(back);
    dw_comm_free(c, true); /* and host */
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nccl_one_rank)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
