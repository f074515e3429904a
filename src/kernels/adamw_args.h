/* adamw_args.h — private: the arguments of one AdamW step, shared by the CPU reference
 * (kernels/cpu/ops_cpu.h) and the CUDA kernels (kernels/cuda/adamw_cuda.h), which implement one
 * contract (decoupled weight decay as torch.optim.AdamW, bias correction, global-norm clipping):
 *   scale = max_norm / (norm + 1e-6) when max_norm > 0 and norm > max_norm, else 1;
 *   g' = g * scale;  p -= lr * wd * p (decay elements only);
 *   m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2;  p -= lr * (m / c1) / (sqrt(v / c2) + eps)
 * in double, stored as FP32; a non-finite norm leaves p, m and v unchanged. The executor keeps
 * one copy in the workspace (8 doubles), so a recorded optimizer step replays with new values. */
#ifndef DW_KERNELS_ADAMW_ARGS_H
#define DW_KERNELS_ADAMW_ARGS_H

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    double c1, c2;   /* bias corrections 1 - beta1^t, 1 - beta2^t (computed by the caller) */
    double max_norm; /* clipping; 0: none */
} dw_adamw_args;

#endif /* DW_KERNELS_ADAMW_ARGS_H */
