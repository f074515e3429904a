/* router_desc.h — private: how an MoE router chooses and weights its experts, as the CPU
 * reference (cpu/router_cpu.c), the CUDA kernel (cuda/ops_moe.cu) and the backends' entries (from
 * the router node's attributes) all read it: the scores, group-limited selection (DeepSeek-V3),
 * renormalisation and the routed scaling factor. Not the selection bias (runtime/engine_moe_bias.h). */
#ifndef DW_KERNELS_ROUTER_DESC_H
#define DW_KERNELS_ROUTER_DESC_H

#include <stdint.h>

#ifdef __CUDACC__
#define DW_ROUTER_FN static inline __host__ __device__
#else
#define DW_ROUTER_FN static inline
#endif

/* Per row of E logits z: scores p = softmax(z) (score 0) or sigmoid(z) (score 1); keys k = p + b
 * with a selection bias b, else p (ranked by z itself, which orders p the same way). Grouped
 * (dw_router_grouped: topk_group < n_group): the E experts form n_group equal groups of
 * consecutive experts, a group's key is the sum of its two largest keys (its one key for
 * groups of one; a NaN key counts as -inf), the topk_group best groups are kept (ties: the lower
 * group) and the K experts are the largest keys among theirs (ties: the lower expert, NaN never).
 * Weights: the chosen p, divided by their sum when renorm, times scale. */
typedef struct {
    int32_t score;      /* dw_router_score: 0 softmax, 1 sigmoid */
    int32_t renorm;     /* the K weights renormalised to sum 1 before the scale */
    int64_t n_group;    /* <= 1: one group (plain top-k) */
    int64_t topk_group; /* groups kept per token; <= 0 or >= n_group: all */
    double scale;       /* routed_scaling_factor (0: 1) */
} dw_router_desc;

/* Whether d restricts the choice to some groups. */
DW_ROUTER_FN int dw_router_grouped(const dw_router_desc *d) {
    return d->n_group > 1 && d->topk_group > 0 && d->topk_group < d->n_group;
}
DW_ROUTER_FN double dw_router_scale(const dw_router_desc *d) { return d->scale > 0 ? d->scale : 1.0; }

/* Largest n_group the kernels take (the CUDA kernel keeps the kept groups as one 64-bit mask). */
#define DW_ROUTER_MAX_GROUPS 64

#endif /* DW_KERNELS_ROUTER_DESC_H */
