/* attn_packed.h — causal GQA attention reading q, k, v in place from a packed qkv activation
 * (B,T,(H + 2 Hkv) D), rows [q heads | k heads | v heads] (GPT-2's c_attn output), and writing
 * dq, dk, dv into the packed gradient: no split / merge copies. BF16 tensor-core path only
 * (kernels/cuda/attn_mma.cu); callers check dw_cuda_attention_packed_ok first and otherwise split
 * and use dw_cuda_attention_{fwd,bwd} (ops_cuda.h). Same numerics and saved lse as those. */
#ifndef DW_KERNELS_ATTN_PACKED_H
#define DW_KERNELS_ATTN_PACKED_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/ops_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* true when the packed path runs for these pointers (BF16, D 64 or 128, 16-byte aligned, not
 * DW_ATTN=ref). The same answer for a node's forward and backward when given all four pointers. */
bool dw_cuda_attention_packed_ok(dw_act_dtype dt, int64_t D, const void *const *ptrs, int n);
/* out (B,T,H,D), lse (B,H,T) FP32 from qkv (B,T,(H+2Hkv)D). */
dw_status dw_cuda_attention_fwd_packed(dw_ctx *ctx, void *out, float *lse, const void *qkv, int64_t B,
                                       int64_t T, int64_t H, int64_t Hkv, int64_t D, void *stream);
/* dqkv (B,T,(H+2Hkv)D) written (every element); delta (B,H,T) FP32 scratch. */
dw_status dw_cuda_attention_bwd_packed(dw_ctx *ctx, void *dqkv, const void *dout, const void *qkv,
                                       const void *out, const float *lse, float *delta, int64_t B,
                                       int64_t T, int64_t H, int64_t Hkv, int64_t D, void *stream);

/* Chooses the attention path for the process from now on, with DW_ATTN's values ("auto",
 * "cudnn", "mma", "ref", "nosplit"; NULL: DW_ATTN again): for tests and benchmarks that compare
 * paths or need the deterministic kernels. Engines created before keep the path their captured
 * step graphs recorded. */
void dw_cuda_attention_use(const char *path);

/* Builds, outside any step, what BF16 attention of this shape will need (cuDNN's plans and their
 * workspaces, kernels/cuda/attn_cudnn.c), so that steps allocate nothing: engines call it at
 * creation for each attention node. packed: q, k, v are views into a packed qkv row (the packed
 * entries above), else separate tensors. W, cap: the node's sliding window and score cap (0: none),
 * as dw_cuda_attention_window_*. DW_OK also when cuDNN is not selected or cannot run this shape
 * (the step then takes another path, or reports why under DW_ATTN=cudnn). */
dw_status dw_cuda_attention_prepare(dw_ctx *ctx, dw_act_dtype dt, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                    int64_t D, bool packed, int64_t W, double cap);

#ifdef __cplusplus
}
#endif

#endif /* DW_KERNELS_ATTN_PACKED_H */
