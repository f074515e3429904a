/* attn_cudnn.h — private to kernels/cuda/: causal GQA attention (BF16, D <= 128, D % 8 == 0),
 * optionally under a sliding window and with soft-capped scores (Gemma 2), through cuDNN's fused
 * flash-attention graphs, libcudnn loaded at run time (dlopen). Called by ops_attention.cu before the
 * tensor-core kernels; no validation of shapes beyond what cuDNN needs. Same layouts and lse
 * (natural-log logsumexp of the scaled, capped scores) as ops_cuda.h's entries. */
#ifndef DW_KERNELS_ATTN_CUDNN_H
#define DW_KERNELS_ATTN_CUDNN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deepwell.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Shape and token strides: rq between tokens of q (and dq), rk of k, v (and dk, dv); H*D and
 * Hkv*D for separate tensors, (H + 2 Hkv)*D for views into a packed qkv row. out, dout (B,T,H,D)
 * and lse, delta (B,H,T) always have their own layouts. The mask: W > 0 a sliding window of W keys
 * (query t sees keys max(0, t-W+1)..t; W 0 or W >= T: causal only, the same plan); cap > 0 the
 * scaled scores become cap tanh(s / cap) before the mask and softmax (0: none). Both are part of
 * the plan's key; fields left out of an initializer are 0: plain causal attention. */
typedef struct {
    int64_t B, T, H, Hkv, D, rq, rk;
    int64_t W;
    float cap;
} dw_attn_cudnn_shape;

/* Forward: out, lse from q, k, v. *ran = false (and DW_OK) when cuDNN cannot take this call:
 * library missing, shape or alignment it does not support, a window or cap the loaded version
 * cannot fuse (window: cuDNN >= 9.2; cap: >= 9.4, runtime-compiled engines), its plan failed to
 * build, or the plan is not built yet and the stream is capturing (plans are never built during
 * capture).
 * The caller then uses another path; dw_attn_cudnn_why() says why. Errors only when an execute
 * that was attempted fails. */
dw_status dw_attn_cudnn_fwd(dw_ctx *ctx, bool *ran, void *out, float *lse, const void *q, const void *k,
                            const void *v, const dw_attn_cudnn_shape *sh, void *stream);
/* Backward: dq, dk, dv (every element written) from dout, q, k, v, out, lse; delta (B,H,T) FP32
 * scratch receives rowsum(dout * out). *ran as for the forward. */
dw_status dw_attn_cudnn_bwd(dw_ctx *ctx, bool *ran, void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const void *out, const float *lse, float *delta,
                            const dw_attn_cudnn_shape *sh, void *stream);
/* Builds (or finds) the forward and backward plans for a shape outside any capture; true when
 * both exist. For callers that capture the first attention call of a shape. */
bool dw_attn_cudnn_prepare(const dw_attn_cudnn_shape *sh);
/* The reason of the last refusal ("cuDNN not built in", "libcudnn.so.9: not found", cuDNN's
 * error text of a failed plan), never NULL. */
const char *dw_attn_cudnn_why(void);
/* cudnnGetVersion() of the loaded library (e.g. 91900), 0 when none is loaded. */
int64_t dw_attn_cudnn_version(void);
/* How many forward (bwd false) or backward executes cuDNN has run in this process, masked ones
 * (window or cap) counted alone when `masked`: tests and benchmarks check that the path they
 * time or compare was taken. */
int64_t dw_attn_cudnn_calls(bool bwd, bool masked);
/* Device bytes the cached plans hold (cuDNN workspaces plus the FP32 dQ accumulators) — for the
 * planner's memory prediction; *n_plans their count. */
size_t dw_attn_cudnn_device_bytes(int *n_plans);

#ifdef __cplusplus
}
#endif

#endif /* DW_KERNELS_ATTN_CUDNN_H */
