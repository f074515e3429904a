/* ops_cuda.h — private: the CUDA kernels for every IR op, forward and backward, callable from C.
 * Each entry validates its arguments (DW_ERR_INVALID with the op named), launches on `stream`
 * (a cudaStream_t passed as void*; NULL = the legacy default stream) and does not synchronise.
 * All pointers are device pointers. Same semantics as the CPU oracle (kernels/cpu/ops_cpu.h):
 * backward entries ACCUMULATE (+=) into parameter gradients and WRITE input gradients.
 * Not here: GEMM/quantisation fast paths (kernels/cuda/gemm*, quant*), the optimizer (train/).
 *
 * Dtypes: `dt` selects the storage of ACTIVATIONS (x, out, dout, dx, q/k/v, logits): FP32 or BF16
 * (compute is FP32 either way). Parameters and their gradients (wte, wpe, w, b, dw, db), saved
 * statistics (mean, rstd, lse) and losses are always FP32. linear is FP32 only (the reference
 * GEMM; fast and low-precision GEMMs live in gemm*).
 * Letters as in ops_cpu.h: B batch, T sequence, C channels, V vocab, H heads, Hkv KV heads,
 * D head_dim, N rows (= B*T), K in-features, M out-features. Indices are 64-bit throughout. */
#ifndef DW_KERNELS_OPS_CUDA_H
#define DW_KERNELS_OPS_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deepwell.h"
#include "kernels/rope_freq.h"
#include "kernels/router_desc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DW_ACT_F32 = 0, DW_ACT_BF16 = 1 } dw_act_dtype;

/* Size in bytes of one activation element. */
int dw_act_size(dw_act_dtype dt);

/* ---- embedding (V,C) and learned positions (maxT,C) --------------------------------------
 * fwd: out (N,C) = wte[tok[n]]. A token outside [0,V) gives a row of NaN (never an OOB read). */
dw_status dw_cuda_embedding_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const int32_t *tok,
                                const float *wte, int64_t N, int64_t C, int64_t V, void *stream);
/* dwte (V,C) += scatter of dout (N,C) by tok; deterministic (each (token, column) summed by one
 * thread in ascending n); tokens outside [0,V) are skipped. */
dw_status dw_cuda_embedding_bwd(dw_ctx *ctx, dw_act_dtype dt, float *dwte, const void *dout,
                                const int32_t *tok, int64_t N, int64_t C, int64_t V, void *stream);
/* the same, tokens equal to pad (0 <= pad < V) adding nothing (nn.Embedding padding_idx); -1: none */
dw_status dw_cuda_embedding_bwd_pad(dw_ctx *ctx, dw_act_dtype dt, float *dwte, const void *dout,
                                    const int32_t *tok, int64_t N, int64_t C, int64_t V, int64_t pad,
                                    void *stream);
/* out (B,T,C) = x + wpe[t]; wpe rows 0..T-1 used. */
dw_status dw_cuda_pos_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, const float *wpe,
                          int64_t B, int64_t T, int64_t C, void *stream);
/* dx = dout (written; dx may be NULL or equal dout), dwpe[t] += sum_b dout[b,t]. */
dw_status dw_cuda_pos_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dwpe, const void *dout,
                          int64_t B, int64_t T, int64_t C, void *stream);

/* ---- rope, HF llama rotate-half, x (B,T,H,D), D even, angles t*inv_freq[i] in double, cos and
 * sin times the attention factor: the rope type rs (kernels/rope_freq.h; NULL: default, angles
 * t*theta^(-2i/D), factor 1) ---- out may equal x (in place). bwd applies the transposed map. */
dw_status dw_cuda_rope_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t B,
                           int64_t T, int64_t H, int64_t D, double theta, const dw_rope_scaling *rs, void *stream);
dw_status dw_cuda_rope_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, int64_t B,
                           int64_t T, int64_t H, int64_t D, double theta, const dw_rope_scaling *rs, void *stream);

/* ---- norms over C: x, out (N,C); w, b (C); mean, rstd (N) saved -----------------------------
 * layernorm: b may be NULL; mean/rstd may be NULL in fwd (inference). bwd: dx written (may be
 * NULL), dw/db accumulated (may be NULL); deterministic (fixed-order column sums). */
dw_status dw_cuda_layernorm_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, float *mean, float *rstd,
                                const void *x, const float *w, const float *b, int64_t N,
                                int64_t C, double eps, void *stream);
dw_status dw_cuda_layernorm_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw, float *db,
                                const void *dout, const void *x, const float *w, const float *mean,
                                const float *rstd, int64_t N, int64_t C, void *stream);
dw_status dw_cuda_rmsnorm_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, float *rstd, const void *x,
                              const float *w, int64_t N, int64_t C, double eps, void *stream);
dw_status dw_cuda_rmsnorm_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw, const void *dout,
                              const void *x, const float *w, const float *rstd, int64_t N,
                              int64_t C, void *stream);
/* The same backward in one pass over dout and x (BF16 rows, C % 8 == 0, C <= 4096; other cases
 * fall back to the two-pass form above): dx and per-block partial column sums of dw, db in ws,
 * then fixed-order sums of those (deterministic). ws: device scratch of
 * dw_cuda_norm_bwd_ws_bytes(N, C) bytes, 4-byte aligned (NULL: the two-pass form).
 * accumulate: dx += the input gradient instead of dx = (dx must not be dout then). */
dw_status dw_cuda_layernorm_bwd_ws(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw, float *db,
                                   const void *dout, const void *x, const float *w,
                                   const float *mean, const float *rstd, int64_t N, int64_t C,
                                   bool accumulate, void *ws, size_t ws_bytes, void *stream);
dw_status dw_cuda_rmsnorm_bwd_ws(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw,
                                 const void *dout, const void *x, const float *w,
                                 const float *rstd, int64_t N, int64_t C, bool accumulate,
                                 void *ws, size_t ws_bytes, void *stream);
/* rmsnorm applying its weight as woff + w[c] (rounded to FP32; Gemma's 1 + w): the forward and the
 * one-pass backward above (dw accumulates the gradient of w, which is that of woff + w). */
dw_status dw_cuda_rmsnorm_fwd_offset(dw_ctx *ctx, dw_act_dtype dt, void *out, float *rstd, const void *x,
                                     const float *w, double woff, int64_t N, int64_t C, double eps, void *stream);
dw_status dw_cuda_rmsnorm_bwd_offset(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw, const void *dout,
                                     const void *x, const float *w, double woff, const float *rstd, int64_t N,
                                     int64_t C, bool accumulate, void *ws, size_t ws_bytes, void *stream);
/* The BF16 forward of rmsnorm (rms; weight woff + w) or layernorm (mean, bias b) that also writes
 * its output's fp8_block rows, codes [N, C] E4M3 and scales [N, C/128] FP32 (ops_norm.cu): bit for
 * bit the output of the forwards above and what quantising it along its rows gives. counts (NULL:
 * not counted): a device counter (overflow, underflow, elements; precision/quant_counts.h) the
 * rows' counts are added to, as the rows quantiser's. C a multiple of 128, at most 8192; out, x,
 * w (and b) 16-byte aligned, codes 8-byte. */
dw_status dw_cuda_norm_fwd_fp8(dw_ctx *ctx, bool rms, void *out, float *mean, float *rstd, const void *x,
                               const float *w, const float *b, double woff, int64_t N, int64_t C, double eps,
                               uint8_t *codes, float *scales, uint64_t *counts, void *stream);
/* Bytes of that workspace: FP32 partial sums of dw and db, (C) each per block, for
 * min(ceil(N / rows per block), 512) blocks; rows per block = 256 / threads per row, threads per
 * row the fewest of 32..256 holding C in 16 elements each. Host code, no CUDA needed (the
 * planner sizes the engine's scratch with it). */
static inline size_t dw_cuda_norm_bwd_ws_bytes(int64_t N, int64_t C) {
    int64_t tpr = 32;
    while (tpr * 16 < C && tpr < 256) tpr *= 2;
    const int64_t rpb = 256 / tpr, g = (N + rpb - 1) / rpb;
    return (size_t)(2 * (g < 512 ? g : 512) * (C > 0 ? C : 0)) * sizeof(float);
}

/* ---- linear (FP32 reference GEMM), torch layout: x (N,K), W (M,K), b (M), out (N,M) ---------
 * fwd: out = x W^T + b (b may be NULL). bwd: dx = dout W (written, or added with dx_acc; dx may
 * be NULL), dW += dout^T x (may be NULL), db += sum_n dout (may be NULL). */
dw_status dw_cuda_linear_fwd(dw_ctx *ctx, float *out, const float *x, const float *w,
                             const float *b, int64_t N, int64_t K, int64_t M, void *stream);
dw_status dw_cuda_linear_bwd(dw_ctx *ctx, float *dx, bool dx_acc, float *dw, float *db, const float *dout,
                             const float *x, const float *w, int64_t N, int64_t K, int64_t M,
                             void *stream);

/* ---- elementwise over n elements (out may equal an input) ------------------------------------ */
dw_status dw_cuda_gelu_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t n,
                           void *stream); /* tanh approximation (GPT-2 / HF gelu_new) */
dw_status dw_cuda_gelu_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, const void *x,
                           int64_t n, void *stream);
dw_status dw_cuda_gelu_erf_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t n,
                               void *stream); /* exact: 0.5 x (1 + erf(x / sqrt 2)) */
dw_status dw_cuda_gelu_erf_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, const void *x,
                               int64_t n, void *stream);
dw_status dw_cuda_relu_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t n, void *stream);
dw_status dw_cuda_relu_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, const void *x, int64_t n,
                           void *stream);
dw_status dw_cuda_silu_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t n,
                           void *stream);
dw_status dw_cuda_silu_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, const void *x,
                           int64_t n, void *stream);
/* out = silu(gate) * up; bwd writes dgate and dup */
dw_status dw_cuda_swiglu_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *gate,
                             const void *up, int64_t n, void *stream);
dw_status dw_cuda_swiglu_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dgate, void *dup,
                             const void *dout, const void *gate, const void *up, int64_t n,
                             void *stream);
/* BF16 SwiGLU forward of [rows, cols] (cols % 128 == 0) that also writes its output's fp8_block
 * rows (formats.h: codes [rows, cols] E4M3, scales [rows, cols/128] FP32), bit for bit what
 * quantising the BF16 output gives (swiglu_fp8.cu); out NULL: the BF16 output not stored. counts
 * (NULL: not counted): a device counter (overflow, underflow, elements; precision/quant_counts.h)
 * the rows' counts are added to, atomically, as the rows quantiser's. gate, up and out 16-byte
 * aligned, codes 8-byte. */
dw_status dw_cuda_swiglu_fwd_fp8(dw_ctx *ctx, void *out, const void *gate, const void *up, int64_t rows,
                                 int64_t cols, uint8_t *codes, float *scales, uint64_t *counts, void *stream);
/* The same for the tanh GELU of x [rows, cols] (dw_cuda_gelu_fwd's values, swiglu_fp8.cu). */
dw_status dw_cuda_gelu_fwd_fp8(dw_ctx *ctx, void *out, const void *x, int64_t rows, int64_t cols, uint8_t *codes,
                               float *scales, uint64_t *counts, void *stream);
/* One gradient [N, F] as the fp8_block operands of a linear layer's backward (formats.h): codes
 * [N, F] E4M3 and scales [N, F/128] FP32, 1x128 along the features (dgrad's dy); codes_t [F, N]
 * and scales_t [F, N/128], 1x128 along the tokens (wgrad's dy^T); counts (NULL: not counted): a
 * device counter (overflow, underflow, elements; precision/quant_counts.h) both copies' counts
 * are added to. codes 8-byte aligned, codes_t 16-byte, scales 4-byte. */
typedef struct {
    uint8_t *codes, *codes_t;
    float *scales, *scales_t;
    uint64_t *counts;
} dw_cuda_fp8_grad;
/* BF16 SwiGLU backward of [rows, cols] (both multiples of 128) whose gradients are written only as
 * fp8_block operands (swiglu_bwd_fp8.cu): bit for bit what quantising dw_cuda_swiglu_bwd's BF16
 * dgate and dup gives, rows and transposed. Both gradients counted, or neither. dout, gate, up
 * 16-byte aligned. */
dw_status dw_cuda_swiglu_bwd_fp8(dw_ctx *ctx, const void *dout, const void *gate, const void *up, int64_t rows,
                                 int64_t cols, const dw_cuda_fp8_grad *dgate, const dw_cuda_fp8_grad *dup,
                                 void *stream);
/* BF16 SwiGLU backward of [rows, cols] (any rows; cols % 128 == 0) that writes dgate and dup in
 * BF16 and also each one's fp8_block rows, codes[0|1] [rows, cols] E4M3 and scales[0|1] [rows,
 * cols/128] FP32 (swiglu_bwd_rows_fp8.cu): bit for bit dw_cuda_swiglu_bwd's gradients and what
 * quantising them along their rows gives. BF16 buffers 16-byte aligned, codes 8-byte. */
dw_status dw_cuda_swiglu_bwd_rows_fp8(dw_ctx *ctx, void *dgate, void *dup, const void *dout, const void *gate,
                                      const void *up, int64_t rows, int64_t cols, uint8_t *const codes[2],
                                      float *const scales[2], void *stream);
/* out = gelu_tanh(gate) * up (Gemma's GeGLU); bwd writes dgate and dup */
dw_status dw_cuda_geglu_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *gate, const void *up, int64_t n,
                            void *stream);
dw_status dw_cuda_geglu_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dgate, void *dup, const void *dout, const void *gate,
                            const void *up, int64_t n, void *stream);
dw_status dw_cuda_add_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *a, const void *b,
                          int64_t n, void *stream);
/* softcap (ops_softcap.cu; oracle: dw_cpu_softcap_*): out = s x, or c tanh(s x / c) when c > 0
 * (s finite, non-zero; c >= 0); bwd writes dx = dout d out / dx (dx may be dout). */
dw_status dw_cuda_softcap_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *x, int64_t n, double s, double c,
                              void *stream);
dw_status dw_cuda_softcap_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, const void *dout, const void *x, int64_t n,
                              double s, double c, void *stream);

/* ---- causal attention with GQA (flash-attention style: tiled, online softmax) ---------------
 * q, out (B,T,H,D); k, v (B,T,Hkv,D); lse (B,H,T) saved (natural log of the sum of exp of the
 * scaled scores); scale 1/sqrt(D); query head h reads KV head h / (H/Hkv). D <= 256.
 * bwd recomputes the probabilities from lse; dq, dk, dv written (dk, dv summed over the query
 * heads of a group; the mma and reference kernels without atomics: deterministic; BF16 through
 * cuDNN, DW_ATTN=cudnn: docs/kernels.md). delta (B,H,T) is FP32 scratch. */
#define DW_CUDA_ATTN_MAX_D 256
dw_status dw_cuda_attention_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, float *lse,
                                const void *q, const void *k, const void *v, int64_t B, int64_t T,
                                int64_t H, int64_t Hkv, int64_t D, void *stream);
dw_status dw_cuda_attention_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dq, void *dk, void *dv,
                                const void *dout, const void *q, const void *k, const void *v,
                                const void *out, const float *lse, float *delta, int64_t B,
                                int64_t T, int64_t H, int64_t Hkv, int64_t D, void *stream);
/* The same under a sliding window of W keys (query t sees keys max(0, t-W+1)..t; W 0: causal) and
 * with the scores soft-capped to cap tanh(s / cap) before the softmax (cap > 0, Gemma 2; 0: none):
 * BF16 through cuDNN when DW_ATTN picks it and the loaded version fuses the mask (kernels/cuda/
 * attn_cudnn.c), else with D 64 or 128 on the tensor-core kernels (key tiles outside the window
 * skipped) unless DW_ATTN=ref, else the reference kernels.
 * lse holds the log-sum-exp of the capped scores. Oracle: dw_cpu_attention_softcap_fwd/bwd. */
dw_status dw_cuda_attention_window_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, float *lse, const void *q,
                                       const void *k, const void *v, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                       int64_t D, int64_t W, double cap, void *stream);
dw_status dw_cuda_attention_window_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dq, void *dk, void *dv, const void *dout,
                                       const void *q, const void *k, const void *v, const void *out, const float *lse,
                                       float *delta, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                       int64_t W, double cap, void *stream);

/* ---- cross-entropy, fused softmax + loss + gradient per row, chunked over V ------------------
 * logits (N,V), targets (N) int32 (< 0: ignored). Writes *loss (one FP32 on the device) = mean
 * over valid rows of lse(row) - row[target] (0 when no row is valid); row_loss (N) may be NULL.
 * When dlogits is non-NULL also writes dlogits = dloss * (softmax - onehot) / n_valid (0 on
 * ignored rows); dlogits may equal logits (in place). A target >= V gives a NaN loss for its row
 * (and so a NaN mean). ws: device scratch of dw_cuda_cross_entropy_ws_bytes(N) bytes. */
size_t dw_cuda_cross_entropy_ws_bytes(int64_t N);
dw_status dw_cuda_cross_entropy(dw_ctx *ctx, dw_act_dtype dt, float *loss, float *row_loss,
                                void *dlogits, const void *logits, const int32_t *targets,
                                int64_t N, int64_t V, float dloss, void *ws, void *stream);
/* The same in pieces, for logits that exist a chunk of rows at a time (the fused LM head, ops.def
 * head_xent), with the same results: begin counts the valid rows of all N targets into ws;
 * rows runs the row kernel on rows [row0, row0 + rows) — logits, dlogits and targets point at the
 * chunk's first row — scaled by that count; end writes *loss, the mean over all N (same ws). */
dw_status dw_cuda_cross_entropy_begin(dw_ctx *ctx, void *ws, const int32_t *targets, int64_t N, void *stream);
dw_status dw_cuda_cross_entropy_rows(dw_ctx *ctx, dw_act_dtype dt, void *ws, int64_t row0, void *dlogits,
                                     const void *logits, const int32_t *targets, int64_t rows, int64_t V, float dloss,
                                     void *stream);
dw_status dw_cuda_cross_entropy_end(dw_ctx *ctx, float *loss, void *ws, int64_t N, void *stream);

/* ---- MoE router (oracle: kernels/cpu/router_cpu.c), one warp per row ---------------------------
 * logits z (N,E) -> weights w (N,K) (act dtype) and experts idx (N,K) int32: scores softmax
 * (score 0) or sigmoid (1), the K largest by the logits (ties: the lower expert; NaN never: a row
 * short of candidates gets -1 and NaN), weights the scores or renormalised to sum 1. Backward:
 * dz (N,E) written from dw (N,K; NULL: zeros) and the chosen experts. E <= 4096. */
dw_status dw_cuda_moe_router_fwd(dw_ctx *ctx, dw_act_dtype dt, void *w, int32_t *idx, const void *z, int64_t N,
                                 int64_t E, int64_t K, int score, int renorm, void *stream);
/* The same with a per-expert selection bias (E FP32, device; NULL: none) used while the device
 * int32 *bias_on is non-zero: the K largest score + bias (FP32; ties: the lower expert), the
 * weights from the scores alone. The flag lives on the device so that a recorded step replays. */
dw_status dw_cuda_moe_router_fwd_biased(dw_ctx *ctx, dw_act_dtype dt, void *w, int32_t *idx, const void *z,
                                        const float *bias, const int32_t *bias_on, int64_t N, int64_t E, int64_t K,
                                        int score, int renorm, void *stream);
dw_status dw_cuda_moe_router_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dz, const void *dw, const void *z,
                                 const int32_t *idx, int64_t N, int64_t E, int64_t K, int score, int renorm,
                                 void *stream);
/* Either, as router d describes it (kernels/router_desc.h: group-limited selection among at most
 * DW_ROUTER_MAX_GROUPS groups, the routed scaling factor); the backward's dw is the scaled
 * weights' gradient. */
dw_status dw_cuda_moe_router_fwd_desc(dw_ctx *ctx, dw_act_dtype dt, void *w, int32_t *idx, const void *z,
                                      const float *bias, const int32_t *bias_on, int64_t N, int64_t E, int64_t K,
                                      const dw_router_desc *d, void *stream);
dw_status dw_cuda_moe_router_bwd_desc(dw_ctx *ctx, dw_act_dtype dt, void *dz, const void *dw, const void *z,
                                      const int32_t *idx, int64_t N, int64_t E, int64_t K, const dw_router_desc *d,
                                      void *stream);

/* ---- MoE dispatch and combine (ops_moe_dispatch.cu; oracle: kernels/cpu/moe_cpu.c) ------------
 * dispatch: x (N,C), experts idx (N,K) int32 -> xs (min(N*K, E*cap),C) x's rows grouped by expert,
 * each group in (token, k) order, rows past the assigned ones zero; offsets (E+1) int32 group starts; pos (N,K)
 * int32 each assignment's row (-1: an expert outside [0,E), or dropped: past the first cap of its
 * expert in (token, k) order, or with prio (N,K) the router's weights in dt, past its cap heaviest,
 * equal weights keeping the earlier (token, k); cap <= 0: none dropped). All on the device. E <= 4096.
 * combine: out (N,C) = sum_k wt[n,k] ys[pos[n,k]] (wt NULL: weights 1, dispatch's backward; ys
 * NULL: zeros). combine backward: dys (R,C) (rows no assignment names: zero) and dwt (N,K), either
 * NULL; dout NULL: zeros; covered: every row of dys is one assignment's (a dropless dispatch, R =
 * N K: pos a permutation), so none is zeroed first. zero_tail: rows [offsets[E], R) of y (R,C) set
 * to zero. */
dw_status dw_cuda_moe_dispatch_fwd(dw_ctx *ctx, dw_act_dtype dt, void *xs, int32_t *offsets, int32_t *pos,
                                   const void *x, const int32_t *idx, const void *prio, int64_t N, int64_t C,
                                   int64_t K, int64_t E, int64_t cap, void *stream);
/* count: a dispatch's routing added to a layer's running counters cnt (2+E) int64 on the device (as
 * kernels/cpu/moe_cpu.c dw_cpu_moe_count): the A assignments, those dropped, the choices per expert. */
dw_status dw_cuda_moe_count(dw_ctx *ctx, int64_t *cnt, const int32_t *idx, const int32_t *offsets, int64_t A,
                            int64_t E, void *stream);
dw_status dw_cuda_moe_combine_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, const void *ys, const void *wt,
                                  const int32_t *pos, int64_t N, int64_t C, int64_t K, void *stream);
dw_status dw_cuda_moe_combine_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dys, void *dwt, const void *dout,
                                  const void *ys, const void *wt, const int32_t *pos, int64_t N, int64_t C, int64_t K,
                                  int64_t R, bool covered, void *stream);
/* The combine's backward above where every row of dys is one assignment's (a dropless dispatch of
 * N K rows), BF16, that also writes dys's fp8_block rows, codes [N K, C] E4M3 and scales [N K,
 * C/128] FP32 (the down layer's dgrad dy; ops_moe_dispatch.cu): bit for bit dys and what
 * quantising it along its rows gives. C a multiple of 128, K at most 16; dys, dout, ys 16-byte
 * aligned, codes 8-byte; dwt may be NULL. */
dw_status dw_cuda_moe_combine_bwd_rows_fp8(dw_ctx *ctx, void *dys, void *dwt, const void *dout, const void *ys,
                                           const void *wt, const int32_t *pos, int64_t N, int64_t C, int64_t K,
                                           uint8_t *codes, float *scales, void *stream);
dw_status dw_cuda_moe_zero_tail(dw_ctx *ctx, dw_act_dtype dt, void *y, const int32_t *offsets, int64_t E, int64_t R,
                                int64_t C, void *stream);

/* ---- Grouped expert GEMMs (ops_moe_gemm.cu, moe_gemm_tc.cu, moe_gemm_sm90.cu; oracle:
 * kernels/cpu/moe_cpu.c) ----
 * x (R,K) rows grouped by expert (offsets (E+1) on the device), W (E,M,K), y and dy (R,M):
 *   fprop  out = y (R,M):  y_e = x_e W_e^T, rows past offsets[E] zero
 *   dgrad  out = dx (R,K): dx_e = dy_e W_e, rows past offsets[E] zero
 *   wgrad  out = dW (E,M,K) FP32: dW_e += dy_e^T x_e
 * x, W, dy in the activation dtype (a BF16 program passes its BF16 weight copy). kernel: AUTO runs
 * BF16 on sm_90 through TMA + wgmma (moe_gemm_sm90.cu) where K and M are multiples of 8, else on
 * mma.sync (moe_gemm_tc.cu); FP32 on FMA tiles. SIMT, MMA and WGMMA ask for one (WGMMA where it
 * cannot run: DW_ERR_UNSUPPORTED). The rows of x and dy past offsets[E] (up to R) must be finite:
 * the wgmma wgrad multiplies the last K tile's lines past an expert's rows by zeroed lines of the
 * other operand, and 0 x NaN is NaN (the dispatch zeroes them; see tests/gpu/test_ops_cuda_moe.c). */
typedef enum { DW_MOE_FPROP = 0, DW_MOE_DGRAD = 1, DW_MOE_WGRAD = 2 } dw_moe_pass;
typedef enum { DW_MOE_KERNEL_AUTO = 0, DW_MOE_KERNEL_SIMT, DW_MOE_KERNEL_MMA, DW_MOE_KERNEL_WGMMA } dw_moe_kernel;
typedef struct {
    dw_moe_pass pass;
    const void *x, *w, *dy;
    void *out;
    const int32_t *offsets;
    int64_t R, E, K, M;
    dw_moe_kernel kernel;
    bool overwrite; /* wgrad: dW_e = dy_e^T x_e (experts without rows: zeros) instead of += */
    double *sumsq;  /* wgrad with overwrite, or NULL: also the sum of squares of each 64 x 128 block of
                       the dW written, compile/wgrad_sumsq.h's layout (the sm_90 kernel's TMA epilogue
                       from its registers; the others by dw_cuda_moe_block_sumsq after) */
} dw_moe_gemm_args;
dw_status dw_cuda_moe_gemm(dw_ctx *ctx, dw_act_dtype dt, const dw_moe_gemm_args *a, void *stream);
/* The sums of squares' blocks: DW_MOE_SUMSQ_BM rows by DW_MOE_SUMSQ_BN columns of dW, block (e, mb,
 * kb) at (e * dw_moe_sumsq_mb(M) + mb) * dw_moe_sumsq_kb(K) + kb; dw_moe_sumsq_parts of them. */
#define DW_MOE_SUMSQ_BM 64
#define DW_MOE_SUMSQ_BN 128
static inline int64_t dw_moe_sumsq_mb(int64_t M) { return (M + DW_MOE_SUMSQ_BM - 1) / DW_MOE_SUMSQ_BM; }
static inline int64_t dw_moe_sumsq_kb(int64_t K) { return (K + DW_MOE_SUMSQ_BN - 1) / DW_MOE_SUMSQ_BN; }
static inline int64_t dw_moe_sumsq_parts(int64_t E, int64_t M, int64_t K) {
    return E * dw_moe_sumsq_mb(M) * dw_moe_sumsq_kb(K);
}
/* sumsq[(e * ceil(M/64) + i/64) * ceil(K/128) + j/128] = sum of dw[e, i, j]^2 over each 64 x 128
 * block of dw (E, M, K) FP32, in double (each thread's elements in order, then a fixed tree). */
dw_status dw_cuda_moe_block_sumsq(dw_ctx *ctx, const float *dw, int64_t E, int64_t M, int64_t K, double *sumsq,
                                  void *stream);

/* ---- per-head RMSNorm (ops_norm.cu; oracle: dw_cpu_rmsnorm_* over N*H rows of D) ---------------
 * x, out (N,H*D); one weight w (D) for every head; rstd (N*H) saved. The rmsnorm entries over N*H
 * rows of D: bwd writes dx (or adds with accumulate; dx may be NULL), accumulates dw (D) summed over
 * every row and head; ws as dw_cuda_rmsnorm_bwd_ws with dw_cuda_norm_bwd_ws_bytes(N*H, D) (NULL:
 * the two-pass form). Deterministic. */
dw_status dw_cuda_head_rmsnorm_fwd(dw_ctx *ctx, dw_act_dtype dt, void *out, float *rstd, const void *x,
                                   const float *w, int64_t N, int64_t H, int64_t D, double eps, void *stream);
dw_status dw_cuda_head_rmsnorm_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, float *dw, const void *dout,
                                   const void *x, const float *w, const float *rstd, int64_t N, int64_t H,
                                   int64_t D, bool accumulate, void *ws, size_t ws_bytes, void *stream);

/* ---- sigmoid gate (ops_gate.cu; oracle: dw_cpu_sigmoid_gate_*) -----------------------------------
 * x, y (N,C), gate logits g (N), all in the activation dtype: y = sigmoid(g[n]) * x[n,:] (y may
 * equal x). bwd: dx (N,C) = sigmoid(g) * dout, written or added (accumulate; dx then neither dout
 * nor x), dg (N) = sigmoid'(g) * (dout[n,:] . x[n,:]) written; either may be NULL. dx may equal dout
 * or x when written. Deterministic (fixed-order sums, no atomics). */
dw_status dw_cuda_sigmoid_gate_fwd(dw_ctx *ctx, dw_act_dtype dt, void *y, const void *x, const void *g, int64_t N,
                                   int64_t C, void *stream);
dw_status dw_cuda_sigmoid_gate_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dx, void *dg, const void *dout, const void *x,
                                   const void *g, int64_t N, int64_t C, bool accumulate, void *stream);

/* ---- MoE router losses (ops_moe_aux.cu; oracle: kernels/cpu/moe_aux_cpu.c) ---------------------
 * stats: sums (E+1) = prev_sums + each row's softmax of z (N,E) summed, then the rows' squared
 * log-sum-exp summed; counts (E) int32 = prev_counts + the assignments idx (N,K) per expert (prev
 * both NULL: 0); N K < 2^24. Backward: dz (N,E) from the sums' gradient g (E+1; NULL: zeros).
 * loss (dsums NULL): aux = coef E sum_e counts_e sums_e / (L N)^2 with L N = sum counts / K, z =
 * zcoef sums_E / N (N tokens); out (scalar) = aux + z, also added into *loss (FP32); kept[0] = aux,
 * kept[1] = z (NaN where the coefficient is 0), kept[2..] the counts (int32); with dsums: the
 * gradient dsums = dloss d(aux + z)/dsums only. part: the statistics' scratch,
 * DW_MOE_AUX_PART_BYTES(E) bytes of device memory (4-byte aligned), with which every row's softmax
 * is computed once over DW_MOE_AUX_PARTS blocks (E <= DW_MOE_AUX_PART_EXPERTS; NULL or more
 * experts: a block per expert, each computing every row's softmax denominator again). */
#define DW_MOE_AUX_PARTS 128
#define DW_MOE_AUX_PART_EXPERTS 256
#define DW_MOE_AUX_PART_BYTES(E) ((int64_t)DW_MOE_AUX_PARTS * (2 * (int64_t)(E) + 1) * 4)
dw_status dw_cuda_moe_aux_stats_fwd(dw_ctx *ctx, dw_act_dtype dt, void *sums, int32_t *counts, const void *z,
                                    const int32_t *idx, const void *prev_sums, const int32_t *prev_counts, int64_t N,
                                    int64_t E, int64_t K, void *part, void *stream);
dw_status dw_cuda_moe_aux_stats_bwd(dw_ctx *ctx, dw_act_dtype dt, void *dz, const void *g, const void *z, int64_t N,
                                    int64_t E, void *stream);
dw_status dw_cuda_moe_aux_loss(dw_ctx *ctx, dw_act_dtype dt, void *out, float *loss, float *kept, void *dsums,
                               const void *sums, const int32_t *counts, int64_t E, int64_t K, int64_t N, double coef,
                               double zcoef, double dloss, void *stream);

#ifdef __cplusplus
}
#endif

#endif /* DW_KERNELS_OPS_CUDA_H */
