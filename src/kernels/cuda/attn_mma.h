/* attn_mma.h — private to kernels/cuda/: tensor-core (mma.sync m16n8k16 BF16) causal attention
 * for BF16 activations with D in {64, 128}, optionally under a sliding window of W keys and with
 * soft-capped scores, called by ops_attention.cu's entries when eligible.
 * Same layouts and contract as dw_cuda_attention_{fwd,bwd} (ops_cuda.h); no validation here. */
#ifndef DW_KERNELS_ATTN_MMA_H
#define DW_KERNELS_ATTN_MMA_H

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

/* The attention path DW_ATTN asks for (read once; the only reader of DW_ATTN): unset or "auto"
 * the default choice (ops_attention.cu), "cudnn" cuDNN's fused graphs (an error where they cannot
 * run), "mma" these tensor-core kernels (never cuDNN), "nosplit" these with P and dS in one BF16
 * term (an experiment), "ref" the reference kernels. Unknown values mean auto. */
enum { DW_ATTN_AUTO = 0, DW_ATTN_NOSPLIT = 1, DW_ATTN_REF = 2, DW_ATTN_MMA = 3, DW_ATTN_CUDNN = 4 };
int dw_attn_mode(void);
/* A DW_ATTN value as above; and an override of DW_ATTN for the process from now on (-1: read
 * DW_ATTN again), behind attn_packed.h's dw_cuda_attention_use. */
int dw_attn_mode_parse(const char *v);
void dw_attn_mode_set(int mode);
/* true when the tensor-core path can run: D 64 or 128, every pointer 16-byte aligned, and the
 * environment does not ask for the reference kernels (DW_ATTN=ref). */
bool dw_attn_mma_eligible(int64_t D, const void *const *ptrs, int n);
/* rq: elements between consecutive tokens of q (and dq), rk: of k, v (and dk, dv): H*D and
 * Hkv*D for separate tensors, (H + 2 Hkv)*D for views into a packed qkv row. out, dout, lse and
 * delta always have their own (B,T,H,D) / (B,H,T) layouts. W: query t sees keys t-W+1..t (0: all
 * up to t); cap > 0: scores soft-capped to cap tanh(s / cap) (0: none). */
cudaError_t dw_attn_mma_fwd(void *out, float *lse, const void *q, const void *k, const void *v,
                            int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t rq,
                            int64_t rk, int64_t W, float cap, cudaStream_t s);
/* Writes delta (B,H,T) = rowsum(dout * out) (FP32 scratch, read back by the dK/dV kernel), then
 * dq, dk, dv. out has the (B,T,H,D) layout of dout. */
cudaError_t dw_attn_mma_bwd(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                            const void *v, const void *out, const float *lse, float *delta, int64_t B, int64_t T,
                            int64_t H, int64_t Hkv, int64_t D, int64_t rq, int64_t rk, int64_t W, float cap,
                            cudaStream_t s);

#endif /* DW_KERNELS_ATTN_MMA_H */
