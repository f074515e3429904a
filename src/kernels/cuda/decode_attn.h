/* decode_attn.h — private: CUDA attention for cached decoding (runtime/kv_cache.c): one new query
 * per sequence against the K/V cache, split over the cached positions (flash-decoding: each block
 * a chunk of keys for up to 8 query heads of one KV head, then a reduction of the chunks' partial
 * outputs by their maxima and sums). Not the whole-sequence attention (ops_cuda.h). Oracle: the
 * CPU's dw_cpu_attention_decode (kernels/cpu/decode_cpu.h), the same query row of the forward. */
#ifndef DW_KERNELS_CUDA_DECODE_ATTN_H
#define DW_KERNELS_CUDA_DECODE_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/ops_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of device workspace dw_cuda_decode_attn needs for B sequences of H heads, head_dim D, a
 * cache of S positions (any n <= S). */
size_t dw_cuda_decode_attn_work_bytes(int64_t B, int64_t H, int64_t D, int64_t S);

/* out (B,H,D) = softmax_j(cap(q.k_j / sqrt(D))) v_j of each sequence's query q (B,H,D) at
 * position n-1 over its cached keys and values kc, vc (B,S,Hkv,D), positions 0..n-1 in order
 * (1 <= n <= S, the same n for every sequence); W > 0: only the last W keys (sliding window); cap
 * > 0: scores soft-capped to cap tanh(s / cap) (Gemma 2; its query_pre_attn_scalar is a scale of q
 * in the graph). GQA: head h reads KV head h / (H / Hkv); a block's up to 8 heads of one KV head
 * read each key and value once. Activations FP32 or BF16 (dt), computed in FP32. work: device
 * memory of work_bytes >= dw_cuda_decode_attn_work_bytes(B, H, D, S). Launches on stream, does
 * not synchronise; deterministic (no atomics; the split depends on the shapes only). */
dw_status dw_cuda_decode_attn(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *q, const void *kc,
                              const void *vc, int64_t B, int64_t S, int64_t n, int64_t H, int64_t Hkv, int64_t D,
                              int64_t W, double cap, void *work, size_t work_bytes, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DW_KERNELS_CUDA_DECODE_ATTN_H */
