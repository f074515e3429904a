/* emu.cpp — the CUDA emulator's scheduler and runtime (see cuda_runtime.h). One block at a time;
 * its threads are ucontext coroutines run round-robin until each finishes or waits at a barrier.
 * A block barrier opens when every live thread waits at it; a warp exchange opens when all 32
 * lanes of the warp wait at it. Anything else (some threads at a barrier while others finished or
 * wait elsewhere) is a divergent barrier: reported, then abort(). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <vector>

#include "cuda_runtime.h"

dw_emu_thread_idx dw_emu_tid;
dim3 dw_emu_bid, dw_emu_bdim, dw_emu_gdim;
void *dw_emu_dyn_smem;

namespace {
enum State { RUN, AT_BLOCK, AT_WARP, DONE };
struct Thread {
    ucontext_t ctx;
    dw_emu_thread_idx tid;
    State state;
    char *stack;
};
const size_t kStack = 256 * 1024;
std::vector<Thread> g_threads;
struct StackFree { /* destroyed before g_threads: frees the coroutine stacks at exit */
    ~StackFree() {
        for (Thread &t : g_threads) free(t.stack);
    }
} g_stack_free;
ucontext_t g_sched;
Thread *g_cur;
int g_cur_index;
std::function<void()> *g_body;
uint64_t g_xchg[32][32]; /* [warp][lane] */
int g_launches;

void set_current(int i) {
    g_cur_index = i;
    g_cur = &g_threads[(size_t)i];
    dw_emu_tid = g_cur->tid;
}

void trampoline() {
    (*g_body)();
    g_cur->state = DONE;
    swapcontext(&g_cur->ctx, &g_sched);
}

void wait_here(State s) {
    Thread *me = g_cur;
    me->state = s;
    swapcontext(&me->ctx, &g_sched);
    /* resumed by the scheduler, which set the current thread back to us */
}

[[noreturn]] void divergence(const char *what) {
    fprintf(stderr, "CUDA-EMU: %s in launch #%d, block (%u,%u,%u)\n", what, g_launches, dw_emu_bid.x,
            dw_emu_bid.y, dw_emu_bid.z);
    abort();
}

void run_block(int n) {
    for (int i = 0; i < n; i++) {
        Thread &t = g_threads[(size_t)i];
        t.state = RUN;
        getcontext(&t.ctx);
        t.ctx.uc_stack.ss_sp = t.stack;
        t.ctx.uc_stack.ss_size = kStack;
        t.ctx.uc_link = NULL;
        makecontext(&t.ctx, trampoline, 0);
    }
    const int nwarps = (n + 31) / 32;
    for (;;) {
        for (int i = 0; i < n; i++)
            if (g_threads[(size_t)i].state == RUN) {
                set_current(i);
                swapcontext(&g_sched, &g_threads[(size_t)i].ctx);
            }
        int done = 0, at_block = 0, released = 0;
        for (int w = 0; w < nwarps; w++) {
            int at_warp = 0, lanes = 0;
            for (int i = w * 32; i < n && i < w * 32 + 32; i++, lanes++)
                at_warp += g_threads[(size_t)i].state == AT_WARP;
            if (at_warp == 0) continue;
            if (at_warp != 32 || lanes != 32) divergence("warp shuffle without all 32 lanes");
            for (int i = w * 32; i < w * 32 + 32; i++) g_threads[(size_t)i].state = RUN;
            released = 1;
        }
        if (released) continue;
        for (int i = 0; i < n; i++) {
            done += g_threads[(size_t)i].state == DONE;
            at_block += g_threads[(size_t)i].state == AT_BLOCK;
        }
        if (done == n) return;
        if (at_block + done != n) divergence("scheduler stuck");
        if (done > 0) divergence("__syncthreads not reached by threads that exited");
        for (int i = 0; i < n; i++) g_threads[(size_t)i].state = RUN;
    }
}
} // namespace

void __syncthreads(void) { wait_here(AT_BLOCK); }

int dw_emu_lane(void) { return g_cur_index & 31; }

uint64_t dw_emu_exchange(uint64_t v, int src_lane) {
    const int w = g_cur_index >> 5, lane = g_cur_index & 31;
    g_xchg[w][lane] = v;
    wait_here(AT_WARP);
    const uint64_t r = g_xchg[w][src_lane];
    wait_here(AT_WARP); /* nobody overwrites the buffer before every lane has read it */
    return r;
}

void dw_emu_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> body) {
    const unsigned n = block.x * block.y * block.z;
    g_launches++;
    if (n == 0 || n > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 ||
        grid.z > 65535 || smem > 227 * 1024) {
        fprintf(stderr, "CUDA-EMU: invalid launch #%d grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n",
                g_launches, grid.x, grid.y, grid.z, block.x, block.y, block.z, smem);
        abort();
    }
    if (g_threads.size() < n) {
        size_t old = g_threads.size();
        g_threads.resize(n);
        for (size_t i = old; i < n; i++) g_threads[i].stack = (char *)malloc(kStack);
    }
    for (unsigned i = 0; i < n; i++)
        g_threads[i].tid = {i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
    g_body = &body;
    dw_emu_gdim = grid;
    dw_emu_bdim = block;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                dw_emu_bid = dim3(x, y, z);
                dw_emu_dyn_smem = smem ? malloc(smem) : NULL; /* exact size: ASan sees overruns */
                if (smem) memset(dw_emu_dyn_smem, 0xFF, smem); /* garbage, as on a GPU */
                run_block((int)n);
                free(dw_emu_dyn_smem);
                dw_emu_dyn_smem = NULL;
            }
}

extern "C" {
cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
#ifndef DW_EMU_OWN_DEVICE_QUERIES /* (cuda_runtime_api.h) */
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int d) {
    if (d != 0) return cudaErrorInvalidValue;
    if (a == cudaDevAttrMultiProcessorCount) *v = 132;
    else if (a == cudaDevAttrMaxSharedMemoryPerBlockOptin) *v = 227 * 1024;
    else return cudaErrorInvalidValue;
    return cudaSuccess;
}
#endif
cudaError_t cudaMalloc(void **p, size_t n) {
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p) {
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k) {
    (void)k;
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s) {
    (void)s;
    return cudaMemcpy(dst, src, n, k);
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    memset(p, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    (void)s;
    return cudaMemset(p, v, n);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    *s = (cudaStream_t)malloc(1);
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    free(s);
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated error"; }
}
