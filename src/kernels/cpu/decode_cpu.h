/* decode_cpu.h — CPU reference kernels for decoding one position at a time with a K/V cache
 * (runtime/kv_cache.c): each computes exactly what the whole-sequence kernel computes for that
 * position's row (same arithmetic, same order), so cached decoding gives the same bits. */
#ifndef DW_KERNELS_CPU_DECODE_CPU_H
#define DW_KERNELS_CPU_DECODE_CPU_H

#include <stdint.h>

#include "kernels/rope_freq.h"

/* rope of one position: x, out (H,D) rotated by the angles of position pos (rope_cpu.c's row t = pos) */
void dw_cpu_rope_fwd_at(float *out, const float *x, int64_t pos, int64_t H, int64_t D, double theta,
                        const dw_rope_scaling *rs);

/* causal GQA attention of the query at position n-1 over the n cached keys: q, out (H,D), kc, vc
 * (n,Hkv,D) in position order; W > 0: only the last W keys (sliding window); cap > 0: scores
 * soft-capped. attention_cpu.c's row (b, n-1, h) of a forward over the n positions. */
void dw_cpu_attention_decode(float *out, const float *q, const float *kc, const float *vc, int64_t n, int64_t H,
                             int64_t Hkv, int64_t D, int64_t W, double cap);

#endif /* DW_KERNELS_CPU_DECODE_CPU_H */
