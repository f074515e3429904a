/* async_copy.cuh — the sm_90 asynchronous-copy primitives (PTX) shared by Deepwell's own GEMM
 * kernels (gemm/sm90_common.cuh) and the bulk quantiser (kernels/cuda/quant_bulk.cu): mbarriers,
 * tensor-map and plain bulk copies between global and shared memory, their bulk groups, the proxy
 * fence, elect.sync. Tensor maps come from core/tensor_map.cuh. CUDA C++, private; the quantiser's
 * host emulator (tests/gpu/test_quant_emu) replaces these bodies with its stand-ins. */
#ifndef DW_CORE_ASYNC_COPY_CUH
#define DW_CORE_ASYNC_COPY_CUH

#include <cuda_runtime.h>
#include <cudaTypedefs.h> /* CUtensorMap */
#include <stdint.h>

namespace {

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* ---- mbarriers (CTA scope) ---- */
__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
/* after a thread's mbar_inits, before other threads or the async proxy use the barriers */
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
/* one arrival that also expects `bytes` of copies to complete on bar */
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
/* Waits for the phase of parity `parity` to complete. IDLE, for a thread with nothing else to do
 * (a producer waiting for a free buffer beside busy consumer warps): each try may suspend the
 * thread until the phase completes (up to the hint, 1 ms) instead of returning at once to be
 * polled again, which would take issue slots from the warps beside it. */
template <bool IDLE = false> __device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    if constexpr (IDLE)
        asm volatile("{\n .reg .pred P1;\n WAIT_%=:\n"
                     " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1, %2;\n"
                     " @P1 bra DONE_%=;\n bra WAIT_%=;\n DONE_%=:\n}" ::"r"(smem_u32(bar)),
                     "r"(parity), "r"(1000000u)
                     : "memory");
    else
        asm volatile("{\n .reg .pred P1;\n WAIT_%=:\n"
                     " mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
                     " @P1 bra DONE_%=;\n bra WAIT_%=;\n DONE_%=:\n}" ::"r"(smem_u32(bar)),
                     "r"(parity)
                     : "memory");
}

/* 4 bytes global -> shared by the LSU's asynchronous copy (cp.async, L1-cached: neighbouring
 * words of a line are read by the copies after it), not waited for here; and the arrival, on bar,
 * of this thread's copies issued so far once they have landed (.noinc: the barrier's count includes
 * it). A consumer that sees the phase complete reads what they wrote. */
__device__ __forceinline__ void cp_async_4(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_arrive(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}

/* ---- global -> shared, completing on an mbarrier ---- */
/* map's box at coordinates (c0 innermost, c1) into shared dst (128-byte aligned, the box dense) */
__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
            smem_u32(dst)),
        "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
        : "memory");
}
/* bytes (a multiple of 16) from global src to shared dst, both 16-byte aligned */
__device__ __forceinline__ void bulk_g2s(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

/* ---- shared -> global, in this thread's current bulk group ---- */
/* shared src (128-byte aligned, the box dense) to map's box at coordinates (c0 innermost, c1) */
__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, int c0, int c1, const void *src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];" ::"l"(map), "r"(c0),
                 "r"(c1), "r"(smem_u32(src))
                 : "memory");
}
/* bytes (a multiple of 16) from shared src to global dst, both 16-byte aligned */
__device__ __forceinline__ void bulk_s2g(void *dst, const void *src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_u32(src)),
                 "r"(bytes)
                 : "memory");
}
/* closes the group; wait_read: this thread's groups have read their shared sources (they may be
 * written again); wait_all: and written global memory */
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
/* this thread's shared-memory writes, ordered before its later async-proxy copies */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* true in one lane of the (converged) warp; the compiler then keeps warp-uniform copy operands in
 * uniform registers instead of looping over the lanes that issue copies */
__device__ __forceinline__ bool elect_one() {
    uint32_t pred = 0;
    asm volatile("{\n .reg .pred p;\n elect.sync _|p, 0xffffffff;\n selp.u32 %0, 1, 0, p;\n}" : "=r"(pred));
    return pred != 0;
}

} /* namespace */

#endif /* DW_CORE_ASYNC_COPY_CUH */
