/* cuda_runtime.h (CUDA emulator) — runs CUDA C++ kernels on the host: every block in turn, its
 * threads as coroutines (emu.cpp) that switch at __syncthreads and at warp shuffles. Checks what
 * hardware would not report: a barrier not reached by all threads (divergence), a shuffle with
 * lanes missing, dynamic shared memory overruns (exact-size heap buffer, visible to ASan).
 * Kernel launches `k<<<g, b, smem, s>>>(args)` are rewritten by preprocess.py into
 * dw_emu_launch(g, b, smem, lambda). Semantics of FP32 math are IEEE on both; expf/tanhf etc.
 * come from the host libm (ulp-level differences from the GPU's). */
#ifndef DW_CUDA_EMU_RUNTIME_H
#define DW_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct dw_emu_thread_idx {
    unsigned x, y, z;
};

/* the running thread (set by the scheduler before every switch) */
extern dw_emu_thread_idx dw_emu_tid;
extern dim3 dw_emu_bid, dw_emu_bdim, dw_emu_gdim;
extern void *dw_emu_dyn_smem;
#define threadIdx dw_emu_tid
#define blockIdx dw_emu_bid
#define blockDim dw_emu_bdim
#define gridDim dw_emu_gdim

void __syncthreads(void);
/* lane exchange: every lane of the warp stores 8 bytes, waits for all 32, reads lane src */
uint64_t dw_emu_exchange(uint64_t v, int src_lane);
int dw_emu_lane(void);

template <typename T>
static inline T dw_emu_shfl(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    b = dw_emu_exchange(b, src & 31);
    T r;
    memcpy(&r, &b, sizeof(T));
    return r;
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src) {
    (void)mask;
    return dw_emu_shfl(v, src);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int o) {
    (void)mask;
    return dw_emu_shfl(v, dw_emu_lane() ^ o);
}
/* the lanes whose v equals this lane's: 32 exchanges, every lane taking part in each */
static inline unsigned __match_any_sync(unsigned mask, int v) {
    (void)mask;
    unsigned same = 0;
    for (int j = 0; j < 32; j++)
        if (dw_emu_shfl(v, j) == v) same |= 1u << j;
    return same;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
#define __restrict__ __restrict
/* a warp barrier: every lane exchanges, so none runs ahead (orders shared-memory accesses) */
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)mask;
    (void)dw_emu_exchange(0, dw_emu_lane());
}
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
/* the IEEE round-to-nearest operations the quantisers use (quant_common.cuh): the host's */
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* CUDA's overloaded min and max of two values of one type */
template <typename T> static inline T max(T a, T b) { return a < b ? b : a; }
template <typename T> static inline T min(T a, T b) { return b < a ? b : a; }
/* threads switch only at barriers and shuffles, so a plain read-modify-write is atomic here */
static inline int atomicAdd(int *p, int v) {
    const int old = *p;
    *p = old + v;
    return old;
}
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    const unsigned long long old = *p;
    *p = old + v;
    return old;
}

/* Runs the kernel body for every block of grid and every thread of block. */
void dw_emu_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> body);

template <typename F> static inline cudaError_t cudaFuncSetAttribute(F *, int a, int value) {
    return a != cudaFuncAttributeMaxDynamicSharedMemorySize || value <= 227 * 1024 ? cudaSuccess
                                                                                     : cudaErrorInvalidValue;
}
#ifndef DW_EMU_OWN_DEVICE_QUERIES
/* the kernels' shared arrays are function-static here: none the runtime would count */
template <typename F> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *fa, F *) {
    fa->sharedSizeBytes = 0;
    return cudaSuccess;
}
/* as many blocks a multiprocessor as 2048 threads and 227 KiB allow, at least one */
template <typename F>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F *, int threads, size_t smem) {
    const int by_threads = threads > 0 ? 2048 / threads : 1, by_smem = smem ? (int)(227 * 1024 / smem) : 32;
    *n = by_threads < by_smem ? by_threads : by_smem;
    if (*n < 1) *n = 1;
    return cudaSuccess;
}
#endif
#endif /* __cplusplus */

#endif
