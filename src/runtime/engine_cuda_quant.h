/* engine_cuda_quant.h — private to runtime/: the CUDA engine's quantised linear layers. Operands
 * are quantised on the device (dw_quantize_cuda) into the workspace pool's slots (compile.h:
 * dw_work_layout's q_*, and the per-node weight cache wq) and multiplied by dw_gemm in the node's
 * recipe. Each GEMM whose shape the quantised kernel refuses reports "not done" and the caller
 * runs it in BF16.
 * Not the BF16/FP32 linear layers (engine_cuda.c). CUDA builds only. */
#ifndef DW_RUNTIME_ENGINE_CUDA_QUANT_H
#define DW_RUNTIME_ENGINE_CUDA_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "compile/compile.h"
#include "deepwell.h"

typedef struct {
    dw_ctx *ctx;
    void *stream;             /* cudaStream_t */
    char *work;               /* the workspace pool (device) */
    const dw_compiled *cp;    /* slots (cp->work) and each node's cached W, W^T (cp->wq) */
    /* what the activation slots hold while the schedule is launched: the graph tensor whose x
     * codes are in q_rows / whose x^T codes are in q_xt (-1: none or a gradient), and in which
     * recipe. Linear nodes reading the same x (llama's q/k/v, gate/up) quantise it once. */
    int rows_tensor, xt_tensor;
    dw_recipe rows_recipe, xt_recipe;
    bool reuse;               /* false (DW_QUANT_REUSE=0 at engine creation): quantise every use */
} dw_qlin;

/* Forgets what the slots hold; the engine calls it at the start of every forward and backward
 * sweep (so a slot is reused only within one sweep, where the tensor cannot change). */
void dw_qlin_reset(dw_qlin *q);

/* Quantises linear node `node`'s FP32 master weight w [M,K] into its cache (cp->wq[node]): W
 * along K and W^T along M in one pass. The engine calls it after every weight update; a node
 * without a cache is skipped. */
dw_status dw_qlin_quantize_weight(const dw_qlin *q, int node, const float *w, int64_t K, int64_t M);
/* y [N,M] (BF16) = quant(x [N,K], BF16) . W_cached^T (+ bias [M], BF16), in node's recipe (x is
 * node's input tensor: its codes are reused when q_rows still holds them). gelu_out (NULL: none):
 * also GELU(y) there, in the GEMM's epilogue (GELU_AUX: y still written) when the kernel the
 * registry picks for the plain GEMM offers it, else by a GELU pass after the GEMM.
 * *done false (nothing launched): the shape is not eligible; run it in BF16. */
dw_status dw_qlin_fprop(dw_qlin *q, int node, void *y, void *gelu_out, const void *x, const void *bias, int64_t N,
                        int64_t K, int64_t M, bool *done);
/* Backward of the same layer: dx [N,K] (BF16, when dx is not NULL) = quant(dy) . W^T_cached^T,
 * dW [M,K] (FP32) += quant(dy^T) . quant(x^T)^T. dy [N,M] and x are BF16. *dgrad_done /
 * *wgrad_done false: that GEMM was not run (ineligible shape); the caller runs it in BF16. */
dw_status dw_qlin_bwd(dw_qlin *q, int node, void *dx, float *dw, const void *dy, const void *x, int64_t N,
                      int64_t K, int64_t M, bool *dgrad_done, bool *wgrad_done);

#endif /* DW_RUNTIME_ENGINE_CUDA_QUANT_H */
