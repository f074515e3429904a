/* kv_cache.h — private: decoding with a K/V cache. A prefill runs the program's forward over the
 * prompt and keeps every attention node's keys and values (after RoPE); each later position runs
 * the forward for one token (b = t = 1) through the executor, except the position-dependent ops —
 * learned positions, RoPE and attention — which read the position and the cache here, on the host.
 * On the CPU engine the logits are bit for bit those of the whole-sequence forward. Programs FP32
 * or BF16 (not quantised: a tensor-scaled GEMM makes a row depend on the others), whose ops are
 * all row-wise apart from those three; MoE layers count as row-wise when they drop no token (no
 * capacity factor below E). CUDA engines too (BF16 within rounding of the recompute: tests/gpu/
 * test_kv_cache_cuda.c, run on an H100 in session 17): the cache stays on the device and attention runs there (flash-decoding,
 * runtime/cuda/decode_cuda.h); positions and RoPE rows go through the backend's download/upload;
 * the GPU's M = 1 GEMMs and decode attention round differently from the whole-sequence kernels, so
 * there the logits agree within BF16 tolerance (tests/gpu/test_kv_cache_cuda.c).
 * dw_kv_cache_supported says, and others keep the full recompute. Cache: per attention node
 * (seq, Hkv, D) keys and values, FP32 on the host (a BF16 program's widened exactly), or on a CUDA
 * engine in the program's activation type in device memory. */
#ifndef DW_RUNTIME_KV_CACHE_H
#define DW_RUNTIME_KV_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/engine.h"

typedef struct dw_kv_cache dw_kv_cache;

/* Whether e's program can decode with a cache (see above). */
bool dw_kv_cache_supported(const dw_engine *e);

dw_status dw_kv_cache_create(dw_engine *e, dw_kv_cache **out);
void dw_kv_cache_free(dw_kv_cache *kv);

/* Forgets the cache and runs tokens (n, 1 <= n <= the program's seq) from position 0; logits (V)
 * gets the last position's. */
dw_status dw_kv_cache_prefill(dw_kv_cache *kv, const int32_t *tokens, int64_t n, float *logits);

/* Appends one token at the next position (the cache holds fewer than seq); logits (V) its logits. */
dw_status dw_kv_cache_step(dw_kv_cache *kv, int32_t token, float *logits);

/* Positions in the cache. */
int64_t dw_kv_cache_len(const dw_kv_cache *kv);

#endif /* DW_RUNTIME_KV_CACHE_H */
