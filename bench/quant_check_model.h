/* quant_check_model.h — what bench/quant_check_time.c (the CPU) and bench/quant_check_time_cuda.c
 * (the GPU) time one quantisation-guard check of: the accuracy bench's model (bench/accuracy.sh,
 * bench/accuracy_setup.py: width 512, SwiGLU 1536, 4 K/V heads of 64, batch 16 x seq 256 = 4096
 * tokens), its 7 linears a layer (q k v o gate up down: K inputs -> M outputs), random normal
 * values, the caps to time, and a wall clock. Header-only: both are built by hand, not by CMake. */
#ifndef DW_BENCH_QUANT_CHECK_MODEL_H
#define DW_BENCH_QUANT_CHECK_MODEL_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

enum { QCM_N = 16 * 256, QCM_D = 512, QCM_F = 3 * QCM_D, QCM_KV = QCM_D / 2, QCM_LINEARS = 7 };
static const int64_t qcm_k[QCM_LINEARS] = {QCM_D, QCM_D, QCM_D, QCM_D, QCM_D, QCM_D, QCM_F};
static const int64_t qcm_m[QCM_LINEARS] = {QCM_D, QCM_KV, QCM_KV, QCM_D, QCM_F, QCM_F, QCM_D};

static inline double qcm_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A normal-shaped value of standard deviation sd (sum of 4 uniforms: shape enough for a timing). */
static inline float qcm_normal(float sd) {
    static uint64_t state = 0x9e3779b97f4a7c15ull;
    double s = 0;
    for (int i = 0; i < 4; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        s += (double)(state >> 11) / 9007199254740992.0 - 0.5;
    }
    return (float)(s * 1.7320508 * sd);
}

/* The caps (quant_check_elements) to time: argv[first..] when given (at most 16), else 0 (whole
 * tensors), 1M and 64K. Returns how many. */
static inline int qcm_caps(int argc, char **argv, int first, int64_t caps[16]) {
    int nc = 0;
    for (int i = first; i < argc && nc < 16; i++) caps[nc++] = atoll(argv[i]);
    if (nc) return nc;
    caps[0] = 0, caps[1] = 1 << 20, caps[2] = 1 << 16;
    return 3;
}

#endif /* DW_BENCH_QUANT_CHECK_MODEL_H */
