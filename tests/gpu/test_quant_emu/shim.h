/* shim.h — host stand-ins, for the emulator run of quant_bulk.cu (run.sh), of what it uses beyond
 * tests/common/cuda_emu: vector types and intrinsics, launch queries, and the PTX helpers that
 * transform.py swaps in (mbarrier with its phase and byte count, bulk copy as memcpy, a named
 * barrier of the consumer warps, max.u16x2; the FP8 pair conversions are
 * tests/common/cuda_emu/kernels/cuda/fp8_cvt.cuh's).
 * A tensor map is the emulator's own record of x's base and shape (make_x_map's stand-in), its
 * box copy a loop of row copies. A bulk store (shared -> global) is only queued: it reads shared memory when its thread waits
 * for its groups, the latest a GPU may, so that a buffer reused before that wait is caught. */
#pragma once
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <algorithm>
#include <map>
#include <vector>
#define DW_EMU_OWN_DEVICE_QUERIES 1 /* below: a settable SM count, the transposing kernel's static arrays */
#include "cuda_runtime.h"
extern "C" {
#include "formats/formats.h"
}
void dw_emu_yield(void);

#define __align__(n) __attribute__((aligned(n)))
/* uint2, uint4, __float_as_uint, __uint_as_float, __fdiv_rn, __frcp_rn and __syncwarp: the
 * emulator's cuda_runtime.h has them */
struct float4 { float x, y, z, w; };
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
static inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
static inline float __fmul_rn(float a, float b) { volatile float q = a * b; return q; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }
static inline uint32_t max(uint32_t a, uint32_t b) { return a > b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline uint32_t __byte_perm(uint32_t a, uint32_t b, uint32_t s) {
    uint8_t by[8];
    memcpy(by, &a, 4);
    memcpy(by + 4, &b, 4);
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)by[(s >> (4 * i)) & 7] << (8 * i);
    return r;
}
template <typename T> static inline void __stcs(T *p, T v) { *p = v; }
template <typename T> static inline T __ldcs(const T *p) { return *p; }
static inline uint32_t __cvta_generic_to_shared(const void *p) { return (uint32_t)(uintptr_t)p; }

#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif

typedef enum { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 } cudaDeviceAttr;
enum { cudaFuncAttributePreferredSharedMemoryCarveout = 9 };
static inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
extern int g_emu_sms;
static inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int) {
    *v = a == cudaDevAttrMaxSharedMemoryPerBlockOptin ? 227 * 1024 : g_emu_sms; /* H200's opt-in limit */
    return cudaSuccess;
}
static inline cudaError_t cudaFuncSetAttribute(const void *, int, int) { return cudaSuccess; }
struct cudaFuncAttributes { size_t sharedSizeBytes; };
static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, const void *) {
    a->sharedSizeBytes = 5 * 1024; /* about the transposing kernel's static arrays */
    return cudaSuccess;
}
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *, int, size_t smem) {
    *n = smem <= 72 * 1024 ? 3 : smem <= 113 * 1024 ? 2 : smem <= 227 * 1024 ? 1 : 0;
    return cudaSuccess;
}

/* mbarrier emulation */
struct EmuBar { int expected, pending; long tx; unsigned phase; };
extern std::map<const void *, EmuBar> g_bars;
static inline void emu_bar_check(EmuBar &b) {
    if (b.pending == 0 && b.tx == 0) { b.phase++; b.pending = b.expected; }
}
static inline void emu_mbar_init(uint64_t *p, uint32_t count) { g_bars[p] = EmuBar{(int)count, (int)count, 0, 0}; }
/* an arrival lets the others run at once (a waiting producer refills the buffer before the
 * arriving thread goes on: a buffer released too early is caught) */
static inline void emu_mbar_arrive(uint64_t *p) {
    EmuBar &b = g_bars.at(p);
    if (--b.pending < 0) abort();
    emu_bar_check(b);
    dw_emu_yield();
}
static inline void emu_mbar_arrive_tx(uint64_t *p, uint32_t bytes) {
    EmuBar &b = g_bars.at(p); b.tx += bytes; if (--b.pending < 0) abort(); emu_bar_check(b);
}
static inline void emu_mbar_wait(uint64_t *p, uint32_t parity) {
    while ((g_bars.at(p).phase & 1u) == parity) dw_emu_yield();
}
static inline void emu_bulk(void *dst, const void *src, uint32_t bytes, uint64_t *p) {
    if (bytes % 16 || (uintptr_t)dst % 16 || (uintptr_t)src % 16) { fprintf(stderr, "bulk misaligned\n"); abort(); }
    memcpy(dst, src, bytes);
    EmuBar &b = g_bars.at(p); b.tx -= bytes; if (b.tx < 0) { fprintf(stderr, "tx negative\n"); abort(); } emu_bar_check(b);
}
extern int g_emu_bar_count, g_emu_bar_gen;
static inline void emu_named_bar(int n) {
    int gen = g_emu_bar_gen;
    if (++g_emu_bar_count == n) { g_emu_bar_count = 0; g_emu_bar_gen++; return; }
    while (g_emu_bar_gen == gen) dw_emu_yield();
}
static inline uint32_t emu_vmax2(uint32_t a, uint32_t b) {
    uint32_t lo = std::max(a & 0xFFFFu, b & 0xFFFFu), hi = std::max(a >> 16, b >> 16);
    return lo | hi << 16;
}

/* bulk stores pending per thread of the running block (blocks run one after another) */
struct EmuPending { void *dst; const void *src; uint32_t bytes; };
extern std::map<unsigned, std::vector<EmuPending>> g_pending;
static inline void emu_bulk_s2g(void *dst, const void *src, uint32_t bytes) {
    if (bytes % 16 || (uintptr_t)dst % 16 || (uintptr_t)src % 16) { fprintf(stderr, "bulk store misaligned\n"); abort(); }
    g_pending[threadIdx.x].push_back(EmuPending{dst, src, bytes});
}
static inline void emu_bulk_wait(void) {
    for (int i = 0; i < 8 && !g_pending[threadIdx.x].empty(); i++) dw_emu_yield(); /* a slow copy engine */
    std::vector<EmuPending> &q = g_pending[threadIdx.x];
    for (const EmuPending &e : q) memcpy(e.dst, e.src, e.bytes);
    q.clear();
}
static inline size_t emu_bulk_pending(void) {
    size_t n = 0;
    for (auto &kv : g_pending) n += kv.second.size();
    return n;
}

/* 2-D tensor maps: [rows, cols] elements of 1 or 2 bytes, row stride in bytes, box_r x box_c boxes,
 * no swizzle: the box lies in shared memory as dense rows */
#define __grid_constant__
enum CUtensorMapDataType { CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0, CU_TENSOR_MAP_DATA_TYPE_UINT16 = 1 };
enum CUtensorMapSwizzle { CU_TENSOR_MAP_SWIZZLE_NONE = 0 };
struct alignas(64) CUtensorMap { unsigned char *base; int64_t rows, cols, stride; int esize, box_r, box_c; char pad[84]; };
static inline bool emu_make_map_2d(CUtensorMap *m, CUtensorMapDataType type, const void *base, int64_t rows, int64_t cols,
                                   int64_t stride, uint32_t box_r, uint32_t box_c) {
    if ((uintptr_t)base % 16 || stride % 16) return false;
    m->base = (unsigned char *)base, m->rows = rows, m->cols = cols, m->stride = stride;
    m->esize = type == CU_TENSOR_MAP_DATA_TYPE_UINT16 ? 2 : 1, m->box_r = (int)box_r, m->box_c = (int)box_c;
    return true;
}
static inline void emu_box_check(const CUtensorMap *m, const void *s, int c0, int r0) {
    if ((uintptr_t)s % 128 || c0 + m->box_c > m->cols || r0 + m->box_r > m->rows || c0 < 0 || r0 < 0) {
        fprintf(stderr, "tensor copy out of bounds or misaligned\n");
        abort();
    }
}
static inline void emu_tma_load_2d(void *dst, const CUtensorMap *m, int c0, int r0, uint64_t *p) {
    emu_box_check(m, dst, c0, r0);
    const int rb = m->box_c * m->esize;
    for (int r = 0; r < m->box_r; r++) memcpy((char *)dst + rb * r, m->base + (int64_t)(r0 + r) * m->stride + (int64_t)c0 * m->esize, rb);
    EmuBar &b = g_bars.at(p); b.tx -= m->box_r * rb; if (b.tx < 0) { fprintf(stderr, "tx negative\n"); abort(); } emu_bar_check(b);
}
/* a tensor store: pending, like a bulk store, until this thread's wait (then it reads shared memory) */
static inline void emu_tma_store_2d(const CUtensorMap *m, int c0, int r0, const void *src) {
    emu_box_check(m, src, c0, r0);
    const int rb = m->box_c * m->esize;
    for (int r = 0; r < m->box_r; r++)
        g_pending[threadIdx.x].push_back(
            EmuPending{m->base + (int64_t)(r0 + r) * m->stride + (int64_t)c0 * m->esize, (const char *)src + rb * r, (uint32_t)rb});
}
