/* tensor_map.cuh — the 2-D TMA tensor maps that Deepwell's sm_90 kernels load and store through
 * (the own GEMMs in gemm/, the transposing quantiser in kernels/cuda/): host code, CUDA C++. The
 * driver's encoder is looked up once through the runtime (no libcuda link). */
#ifndef DW_CORE_TENSOR_MAP_CUH
#define DW_CORE_TENSOR_MAP_CUH

#include <cuda_runtime.h>
#include <cudaTypedefs.h> /* CUtensorMap and the encoder's type */
#include <stdint.h>

#include <atomic>

/* The driver's cuTensorMapEncodeTiled, or NULL where the driver offers none. */
inline PFN_cuTensorMapEncodeTiled_v12000 dw_tensor_map_encoder(void) {
    static std::atomic<PFN_cuTensorMapEncodeTiled_v12000> enc{nullptr};
    PFN_cuTensorMapEncodeTiled_v12000 fn = enc.load(std::memory_order_relaxed);
    if (!fn) {
        void *q = nullptr;
        cudaDriverEntryPointQueryResult res;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &q, 12000, cudaEnableDefault, &res) !=
                cudaSuccess ||
            res != cudaDriverEntryPointSuccess || !q)
            return nullptr;
        fn = (PFN_cuTensorMapEncodeTiled_v12000)q;
        enc.store(fn, std::memory_order_relaxed);
    }
    return fn;
}

/* A tensor map over row-major [rows, cols] elements of `esize` bytes, row stride `ld` elements,
 * in box_r x box_c boxes with swizzle sw. False where the driver offers no encoder or refuses the
 * map (address or stride not 16-byte aligned, a box too large, ...). */
inline bool dw_make_map_2d(CUtensorMap *m, const void *base, CUtensorMapDataType t, int esize, int64_t rows,
                           int64_t cols, int64_t ld, uint32_t box_c, uint32_t box_r, CUtensorMapSwizzle sw) {
    const PFN_cuTensorMapEncodeTiled_v12000 fn = dw_tensor_map_encoder();
    if (!fn) return false;
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)(ld * esize)};
    const cuuint32_t box[2] = {box_c, box_r}, es[2] = {1, 1};
    return fn(m, t, 2, const_cast<void *>(base), dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

#endif /* DW_CORE_TENSOR_MAP_CUH */
