/* cuda_check.h — private: DW_CUDA_CHECK for files that call the CUDA runtime (C or CUDA C++).
 * Records the failing statement, function, file and line on ctx and returns DW_ERR_CUDA. */
#ifndef DW_CORE_CUDA_CHECK_H
#define DW_CORE_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "core/error.h"

#define DW_CUDA_CHECK(ctx, stmt)                                                            \
    do {                                                                                    \
        cudaError_t dw_cuda_err_ = (stmt);                                                  \
        if (dw_cuda_err_ != cudaSuccess)                                                    \
            return dw_set_error((ctx), DW_ERR_CUDA, "%s failed in %s (%s:%d): %s", #stmt,   \
                                __func__, __FILE__, __LINE__,                               \
                                cudaGetErrorString(dw_cuda_err_));                          \
    } while (0)

/* After a kernel launch: checks the launch itself and names the op. */
#define DW_CUDA_CHECK_LAUNCH(ctx, opname)                                                   \
    do {                                                                                    \
        cudaError_t dw_cuda_err_ = cudaGetLastError();                                      \
        if (dw_cuda_err_ != cudaSuccess)                                                    \
            return dw_set_error((ctx), DW_ERR_CUDA, "launch of %s failed (%s:%d): %s",      \
                                (opname), __FILE__, __LINE__,                               \
                                cudaGetErrorString(dw_cuda_err_));                          \
    } while (0)

#endif /* DW_CORE_CUDA_CHECK_H */
