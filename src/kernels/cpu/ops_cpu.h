/* ops_cpu.h — private: the CPU reference kernels, forward and backward, for every IR op.
 * Exact and simple: FP32 storage, double accumulation, no fast-math, never fused. They are the
 * oracle every CUDA kernel is compared with. OpenMP only where it cannot change results
 * (independent rows). Backward functions ACCUMULATE (+=) into parameter gradients and WRITE (=)
 * input gradients unless stated.
 * Letters: B batch, T sequence, C channels (d_model), V vocab, H heads, Hkv KV heads,
 * D head_dim, F ffn width, N rows (= B*T), K/M generic.
 * CONTRACT HEADER: implemented in kernels/cpu/ (one .c file per op family), called by the CPU engine (runtime/). */
#ifndef DW_KERNELS_OPS_CPU_H
#define DW_KERNELS_OPS_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/adamw_args.h"
#include "kernels/rope_freq.h"
#include "kernels/router_desc.h"

/* embedding: out[n,:] = wte[tok[n],:]                     wte (V,C), tok (N), out (N,C) */
void dw_cpu_embedding_fwd(float *out, const int32_t *tok, const float *wte, int64_t N, int64_t C);
void dw_cpu_embedding_bwd(float *dwte, const float *dout, const int32_t *tok, int64_t N, int64_t C);
/* the same, tokens equal to pad (>= 0) adding nothing (nn.Embedding padding_idx); pad -1: none */
void dw_cpu_embedding_bwd_pad(float *dwte, const float *dout, const int32_t *tok, int64_t N, int64_t C,
                              int64_t pad);

/* learned positions: out[b,t,:] = x[b,t,:] + wpe[t,:]      x,out (B,T,C), wpe (maxT,C) */
void dw_cpu_pos_fwd(float *out, const float *x, const float *wpe, int64_t B, int64_t T, int64_t C);
void dw_cpu_pos_bwd(float *dx, float *dwpe, const float *dout, int64_t B, int64_t T, int64_t C);

/* rope (rotate-half convention of HF llama): x (B,T,H,D) in place-free form
 * out = m (x*cos + rotate_half(x)*sin), angles t * inv_freq[i], positions 0..T-1, inv_freq and m
 * of the rope type rs (kernels/rope_freq.h; NULL: default, theta^(-2i/D) and m = 1) */
void dw_cpu_rope_fwd(float *out, const float *x, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                     const dw_rope_scaling *rs);
void dw_cpu_rope_bwd(float *dx, const float *dout, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                     const dw_rope_scaling *rs);

/* layernorm over C: out = (x-mean)*rstd*w + b; saves mean, rstd (N)     w,b (C) */
void dw_cpu_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w,
                          const float *b, int64_t N, int64_t C, double eps);
void dw_cpu_layernorm_bwd(float *dx, float *dw, float *db, const float *dout, const float *x,
                          const float *w, const float *mean, const float *rstd, int64_t N, int64_t C);

/* rmsnorm over C: out = x*rstd*w; saves rstd (N). Per head (head_rmsnorm): N*H rows of D. */
void dw_cpu_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int64_t N,
                        int64_t C, double eps);
void dw_cpu_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x, const float *w,
                        const float *rstd, int64_t N, int64_t C);

/* linear: out (N,M) = x (N,K) @ W^T + b, W (M,K) as torch.nn.Linear; b may be NULL */
void dw_cpu_linear_fwd(float *out, const float *x, const float *w, const float *b, int64_t N,
                       int64_t K, int64_t M);
/* dx = dout @ W (written; dx may be NULL), dW += dout^T @ x, db += sum_n dout (db may be NULL) */
void dw_cpu_linear_bwd(float *dx, float *dw, float *db, const float *dout, const float *x,
                       const float *w, int64_t N, int64_t K, int64_t M);

/* gelu (tanh approximation, as GPT-2): elementwise over n elements */
void dw_cpu_gelu_fwd(float *out, const float *x, int64_t n);
void dw_cpu_gelu_bwd(float *dx, const float *dout, const float *x, int64_t n);
/* gelu_erf (exact, torch's nn.GELU() default): x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) */
void dw_cpu_gelu_erf_fwd(float *out, const float *x, int64_t n);
void dw_cpu_gelu_erf_bwd(float *dx, const float *dout, const float *x, int64_t n);
/* relu: max(x, 0); dx = dout where x > 0, else 0 */
void dw_cpu_relu_fwd(float *out, const float *x, int64_t n);
void dw_cpu_relu_bwd(float *dx, const float *dout, const float *x, int64_t n);
/* silu: x*sigmoid(x) */
void dw_cpu_silu_fwd(float *out, const float *x, int64_t n);
void dw_cpu_silu_bwd(float *dx, const float *dout, const float *x, int64_t n);
/* swiglu: out = silu(gate) * up     gate, up, out (n) */
void dw_cpu_swiglu_fwd(float *out, const float *gate, const float *up, int64_t n);
void dw_cpu_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate,
                       const float *up, int64_t n);
/* geglu: out = gelu_tanh(gate) * up     gate, up, out (n) (Gemma); the backward writes both */
void dw_cpu_geglu_fwd(float *out, const float *gate, const float *up, int64_t n);
void dw_cpu_geglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, int64_t n);
/* softcap (softcap_cpu.c): out = s x, or c tanh(s x / c) when c > 0; dx written */
void dw_cpu_softcap_fwd(float *out, const float *x, int64_t n, double s, double c);
void dw_cpu_softcap_bwd(float *dx, const float *dout, const float *x, int64_t n, double s, double c);
/* sigmoid gate: out[n,:] = sigmoid(g[n]) * x[n,:]     x, out (N,C), g (N) */
void dw_cpu_sigmoid_gate_fwd(float *out, const float *x, const float *g, int64_t N, int64_t C);
/* dx (N,C) = sigmoid(g) * dout, dg (N) = sigmoid'(g) * (dout[n,:] . x[n,:]) (both written; either
 * may be NULL) */
void dw_cpu_sigmoid_gate_bwd(float *dx, float *dg, const float *dout, const float *x, const float *g, int64_t N,
                             int64_t C);
/* add: out = a + b; backward is identity to both (callers copy/accumulate) */
void dw_cpu_add_fwd(float *out, const float *a, const float *b, int64_t n);

/* causal attention with GQA: q (B,T,H,D), k,v (B,T,Hkv,D), out (B,T,H,D); scale 1/sqrt(D).
 * Saves lse (B,H,T) = log-sum-exp of the scaled scores per query row, for backward. */
void dw_cpu_attention_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                          int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D);
/* dq written; dk, dv written (summed over the query heads sharing a KV head). */
void dw_cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                          const float *k, const float *v, const float *out, const float *lse,
                          int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D);
/* The same with a sliding window of W keys: query t sees keys max(0, t-W+1)..t (W 0: all up to t). */
void dw_cpu_attention_window_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                                 int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t W);
void dw_cpu_attention_window_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                 const float *k, const float *v, const float *out, const float *lse,
                                 int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t W);
/* The same with the scaled scores soft-capped to cap tanh(s / cap) before the softmax (Gemma 2's
 * attn_logit_softcapping; cap 0: none); lse is of the capped scores. */
void dw_cpu_attention_softcap_fwd(float *out, float *lse, const float *q, const float *k, const float *v,
                                  int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t W, double cap);
void dw_cpu_attention_softcap_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                  const float *k, const float *v, const float *out, const float *lse,
                                  int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t W, double cap);

/* cross-entropy over V with mean reduction over the N rows whose target >= 0 (target < 0 is
 * ignored, as torch's ignore_index). Returns the mean loss; saves nothing (recomputes). */
double dw_cpu_cross_entropy_fwd(const float *logits, const int32_t *targets, int64_t N, int64_t V);
/* dlogits = (softmax - onehot) / n_valid, scaled by dloss */
void dw_cpu_cross_entropy_bwd(float *dlogits, const float *logits, const int32_t *targets,
                              int64_t N, int64_t V, double dloss);
/* Their pieces (xent_cpu.c): log(sum_v exp(x_v)) of one row in double; the rows with target >= 0. */
double dw_row_lse(const float *x, int64_t V);
int64_t dw_count_valid(const int32_t *targets, int64_t N, int64_t V);
/* The fused LM head's cross-entropy (head_xent_cpu.c), rows of one chunk at a time, the same
 * arithmetic as the two above: *loss_sum += each row's loss in row order; when g is not NULL,
 * g (rows,V) = (softmax - onehot) * scale (0 on ignored rows), g may be logits (in place). */
void dw_cpu_head_xent_rows(float *g, double *loss_sum, const float *logits, const int32_t *targets, int64_t rows,
                           int64_t V, double scale);
/* The head's weight gradient over chunks, as dw_cpu_linear_bwd sums it: acc (M,K) += dy^T x over
 * the chunk's rows (dy (rows,M), x (rows,K)) in double; then dw (M,K) = dw + acc, one rounding. */
void dw_cpu_head_xent_wgrad(double *acc, const float *dy, const float *x, int64_t rows, int64_t K, int64_t M);
void dw_cpu_head_xent_wgrad_end(float *dw, const double *acc, int64_t n);

/* MoE router over E experts per row: scores p = softmax(z) (score 0) or sigmoid(z) (score 1);
 * the K largest scores, largest first (by the logits: ties, the lower expert; a NaN logit is never
 * chosen, and a row with fewer than K others gets expert -1 and weight NaN), their experts in idx
 * (N,K) and their weights in w (N,K): p itself, or p / (sum of the K) when renorm. */
void dw_cpu_moe_router_fwd(float *w, int32_t *idx, const float *z, int64_t N, int64_t E, int64_t K, int score,
                           int renorm);
/* The same with a per-expert selection bias (E; NULL: none): the K largest p + bias (in double;
 * ties: the lower expert), the weights from p alone. */
void dw_cpu_moe_router_fwd_biased(float *w, int32_t *idx, const float *z, const float *bias, int64_t N, int64_t E,
                                  int64_t K, int score, int renorm);
/* dz (N,E) written from dw (N,K; NULL: zeros) through the experts idx the forward chose. */
void dw_cpu_moe_router_bwd(float *dz, const float *dw, const float *z, const int32_t *idx, int64_t N, int64_t E,
                           int64_t K, int score, int renorm);
/* Either, as router d describes it (kernels/router_desc.h: group-limited selection, the routed
 * scaling factor), with the selection bias (E; NULL: none). The backward's dw is the scaled
 * weights' gradient. */
void dw_cpu_moe_router_fwd_desc(float *w, int32_t *idx, const float *z, const float *bias, int64_t N, int64_t E,
                                int64_t K, const dw_router_desc *d);
void dw_cpu_moe_router_bwd_desc(float *dz, const float *dw, const float *z, const int32_t *idx, int64_t N, int64_t E,
                                int64_t K, const dw_router_desc *d);

/* MoE dispatch: the N*K (token, k) assignments grouped by expert (a counting sort: groups in
 * expert order, each in (token, k) order). xs (N*K, C) gets x's row n for each assignment of n,
 * offsets (E+1) the group starts (offsets[E] = the assignments kept), pos (N,K) each assignment's
 * row (-1: no row, for an expert outside [0, E) or an assignment dropped). cap: the most rows an
 * expert keeps (dw_moe_capacity; 0: all) — prio NULL: its first cap assignments in (token, k) order
 * (drop by position); prio (N,K), the router's weights: its cap heaviest (equal weights: the
 * earlier (token, k)), kept rows still in (token, k) order (drop by weight). The rest dropped.
 * xs holds min(N K, E cap) rows (dw_moe_routed_rows); those past offsets[E] are 0. */
void dw_cpu_moe_dispatch_fwd(float *xs, int32_t *offsets, int32_t *pos, const float *x, const int32_t *idx,
                             const float *prio, int64_t N, int64_t C, int64_t K, int64_t E, int64_t cap);
/* A dispatch's routing added to a layer's running counters cnt (2+E) int64: the A assignments,
 * those dropped (A - offsets[E]), the router's choices idx (A) per expert. */
void dw_cpu_moe_count(int64_t *cnt, const int32_t *idx, const int32_t *offsets, int64_t A, int64_t E);
/* dx (N,C) written: each token's sum of its K rows' gradients */
void dw_cpu_moe_dispatch_bwd(float *dx, const float *dxs, const int32_t *pos, int64_t N, int64_t C, int64_t K);
/* Grouped linear: rows [offsets[e], offsets[e+1]) of x (R,K) times w[e]^T (w (E,M,K)) into y
 * (R,M); rows past offsets[E] are 0. */
void dw_cpu_moe_linear_fwd(float *y, const float *x, const float *w, const int32_t *offsets, int64_t R, int64_t E,
                           int64_t K, int64_t M);
/* dx (R,K) written (NULL: not needed; rows past offsets[E] are 0); dw[e] += dy_e^T x_e (dw NULL:
 * not needed). w is read only for dx, x only for dw. */
void dw_cpu_moe_linear_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                           const int32_t *offsets, int64_t R, int64_t E, int64_t K, int64_t M);
/* The wgrad alone: dw (E,M,K) [e] += dy_e^T x_e, dy (R,M), x (R,K); overwrite: dw[e] = dy_e^T x_e
 * whatever dw held (zeros for an expert without rows), the bits a zeroed dw would get. */
void dw_cpu_moe_linear_wgrad(float *dw, const float *dy, const float *x, const int32_t *offsets, int64_t R, int64_t E,
                             int64_t K, int64_t M, bool overwrite);
/* MoE combine: out[n] = sum_k wt[n,k] * ys[pos[n,k]] (pos -1: nothing; wt NULL: weights 1)
 * ys (R,C), wt, pos (N,K) */
void dw_cpu_moe_combine_fwd(float *out, const float *ys, const float *wt, const int32_t *pos, int64_t N, int64_t C,
                            int64_t K);
/* dys (R,C) written: wt[n,k] * dout[n] at row pos[n,k], 0 in rows no assignment names; dwt (N,K)
 * written: dout[n] . ys[pos[n,k]] (0 for pos -1). Either may be NULL. */
void dw_cpu_moe_combine_bwd(float *dys, float *dwt, const float *dout, const float *ys, const float *wt,
                            const int32_t *pos, int64_t N, int64_t C, int64_t K, int64_t R);

/* Softmax of one row z (E) into p (max-subtracted, in double; router_cpu.c); returns the row's
 * log-sum-exp. */
double dw_cpu_softmax_row(double *p, const float *z, int64_t E);
/* MoE load-balancing statistics (moe_aux_cpu.c): sums (E + 1) = prev_sums + each row's softmax
 * of z (N,E) summed, then its squared log-sum-exp summed; counts (E) = prev_counts + the
 * assignments idx (N,K) per expert (prev NULL: 0). Backward: dz (N,E) written from the sums'
 * gradient g (E + 1). The losses: returns coef E sum_e counts_e sums_e / (L N)^2 with L N = sum
 * counts / K, *z_loss = zcoef sums_E / N (N tokens); the gradient dsums of their sum times dloss. */
void dw_cpu_moe_aux_stats_fwd(float *sums, int32_t *counts, const float *z, const int32_t *idx, const float *prev_sums,
                              const int32_t *prev_counts, int64_t N, int64_t E, int64_t K);
void dw_cpu_moe_aux_stats_bwd(float *dz, const float *g, const float *z, int64_t N, int64_t E);
double dw_cpu_moe_aux_loss(const float *sums, const int32_t *counts, int64_t E, int64_t K, int64_t N, double coef,
                           double zcoef, double *z_loss);
void dw_cpu_moe_aux_loss_bwd(float *dsums, const int32_t *counts, int64_t E, int64_t K, int64_t N, double coef,
                             double zcoef, double dloss);

/* ---- optimizer over flat FP32 pools (the contract of kernels/adamw_args.h) ------------------- */
/* sum of g[i]^2 (n) in double, in ascending order */
double dw_cpu_sumsq(const float *g, int64_t n);
/* One AdamW step over n elements (weight decay for i < n_decay) with the gradient norm `norm`
 * (clipping) and the arguments a; a non-finite norm changes nothing. */
void dw_cpu_adamw(float *p, const float *g, float *m, float *v, int64_t n, int64_t n_decay, double norm,
                  const dw_adamw_args *a);
/* The same step writing, in the same pass, the BF16 copy wb[i] = bf16(p[i]) (round to nearest
 * even: dw_encode_bf16) of each updated master in runs (n_runs) [begin, end), ascending and
 * disjoint within [0, n); wb elsewhere untouched. A non-finite norm leaves p, m, v and still
 * writes the copies. first > 0: wb lies on g, copy i on g[j] for j <= i / 2 + lag at most, and
 * the passes of kernels/adamw_passes.h from that first cut read each gradient before its bytes
 * take a copy (0: wb and g apart). */
void dw_cpu_adamw_cast(float *p, const float *g, float *m, float *v, int64_t n, int64_t n_decay, double norm,
                       const dw_adamw_args *a, uint16_t *wb, const int64_t (*runs)[2], int n_runs, int64_t first,
                       int64_t lag);

#endif /* DW_KERNELS_OPS_CPU_H */
