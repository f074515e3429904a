/* decode_cuda.h — private: the device side of cached decoding on a CUDA engine (runtime/kv_cache.c):
 * the K/V cache kept in device memory in the program's activation type, rows appended by
 * stream-ordered device copies, and the new position's attention by the flash-decoding kernel
 * (kernels/cuda/decode_attn.h) on the backend's stream. In a build without CUDA every entry
 * returns DW_ERR_UNSUPPORTED (kv_cache.c never calls them there: only a CUDA engine does). */
#ifndef DW_RUNTIME_CUDA_DECODE_CUDA_H
#define DW_RUNTIME_CUDA_DECODE_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/backend.h"

/* Device workspace bytes of dw_cuda_decode_attention for H heads of head_dim D, a cache of S. */
size_t dw_cuda_decode_work_bytes(int64_t H, int64_t D, int64_t S);

/* Copies rows (rows, width) of src, `stride` elements apart (a packed q|k|v row's k or v part),
 * into cache rows pos .. pos+rows-1 (rows of width elements, contiguous); elements of 2 bytes
 * (bf16) or 4. */
dw_status dw_cuda_decode_keep(dw_backend *be, bool bf16, void *cache, int64_t pos, const void *src, int64_t rows,
                              int64_t stride, int64_t width);

/* out (H,D) = the attention of query q (H,D) at position n-1 over cache rows 0..n-1 of kc, vc
 * (S,Hkv,D): window W, score cap `cap` (dw_cpu_attention_decode's arguments); work of work_bytes. */
dw_status dw_cuda_decode_attention(dw_backend *be, bool bf16, void *out, const void *q, const void *kc,
                                   const void *vc, int64_t n, int64_t S, int64_t H, int64_t Hkv, int64_t D, int64_t W,
                                   double cap, void *work, size_t work_bytes);

#endif /* DW_RUNTIME_CUDA_DECODE_CUDA_H */
