/* attn_mma_ptx.cuh — private to attn_mma.cu: the inline-PTX primitives its kernels are built from
 * (mma.sync m16n8k16 BF16 -> FP32, ldmatrix, cp.async, ex2.approx), each behind a small function so
 * that the host CUDA emulator can stand in its own versions (tests/common/cuda_emu/kernels/cuda/
 * attn_mma_ptx.cuh, found first on its include path). Needs am_bf16 (= __nv_bfloat16) declared. */
#ifndef DW_KERNELS_ATTN_MMA_PTX_CUH
#define DW_KERNELS_ATTN_MMA_PTX_CUH

#include <cuda_bf16.h>
#include <stdint.h>

/* c (16x8 FP32) += a (16x16 BF16, row) . b (16x8 BF16, col): one warp-wide m16n8k16 MMA. */
static __device__ __forceinline__ void am_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* Four 8x8 b16 matrices, transposed: B fragments (k = stored row, n = stored column). */
static __device__ __forceinline__ void am_ldsm_t(uint32_t r[4], const am_bf16 *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
/* Four 8x8 b16 matrices as stored: A fragments, or B fragments with n = stored row. */
static __device__ __forceinline__ void am_ldsm(uint32_t r[4], const am_bf16 *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
/* cp.async: 16 bytes global -> shared (zero-filled when !valid; src is then not read). */
static __device__ __forceinline__ void am_cp16(am_bf16 *dst, const am_bf16 *src, bool valid) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void am_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void am_wait(void) { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* 2^x on the special-function unit, subnormal results flushed to 0 (probabilities < 2^-126). */
static __device__ __forceinline__ float am_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
#endif /* DW_KERNELS_ATTN_MMA_PTX_CUH */
