/* grouped_gpu.h — helpers of the grouped expert GEMM's GPU tests (test_grouped_fp8.c,
 * test_grouped_mxfp8.c): the CPU and GPU contexts as a cmocka group fixture and the skewed
 * routings (host <-> device copies: tests/common/gpu_upload.h). Static functions and globals:
 * include once per test program (after cmocka.h). */
#ifndef DW_TEST_GROUPED_GPU_H
#define DW_TEST_GROUPED_GPU_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "deepwell.h"
#include "gemm/compute_capability.h"
#include "gpu_upload.h"
#include "testutil.h"

static dw_ctx *g_cpu, *g_gpu;
static int g_sm; /* the GPU's compute capability x10 */

static int setup(void **state) {
    (void)state;
    if (dw_test_cpu_gpu_setup(&g_cpu, &g_gpu)) return -1;
    dw_test_rng_init(&dw_test_group_rng, dw_test_seed());
    g_sm = dw_gemm_ctx_sm(g_gpu);
    return 0;
}
static int teardown(void **state) {
    (void)state;
    dw_test_cpu_gpu_teardown(g_cpu, g_gpu);
    return 0;
}

/* Groups: 0 random odd sizes, 1 all to one expert, 2 odd experts empty, 3 a single row. */
static void route(int kind, int64_t E, int64_t R, int32_t *off) {
    const int64_t used = kind == 3 ? 1 : R - dw_test_rnd(0, R / 4), one = dw_test_rnd(0, E - 1);
    int64_t left = used;
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        int64_t n = kind == 1 || kind == 3 ? (e == one ? left : 0) : kind == 2 && e % 2 ? 0 : dw_test_rnd(0, left) | 1;
        if (n > left) n = left;
        if (e == E - 1 && !(kind == 1 || kind == 3) && !(kind == 2 && e % 2)) n = left;
        left -= n;
        off[e + 1] = (int32_t)(off[e] + n);
    }
}

#endif /* DW_TEST_GROUPED_GPU_H */
