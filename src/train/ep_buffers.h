/* ep_buffers.h — private: expert parallelism's MoE layers and the buffers for a group's rows, found
 * and sized from the compiled program alone, so the runtime (train/ep.c) allocates and the planner
 * (plan/memory.c) counts the same bytes. A rank's expert rows are sized for f x its own share,
 * the rows of ceil(f x B) sequences, f x B x T x top-k (f: dw_ep_capacity_factor, by default and
 * at most the group's G, where every routed row of the group lands on one rank), and the expert ops run on
 * that many rows (dw_ep_group_batch); a step whose routing sends a rank more is refused by name
 * (ep.c).
 * The expert rows' gradients live only inside their layer's backward: one pool, sized for the
 * largest layer, serves every layer.
 * Not here: allocation, the exchanges (ep.c), the index bookkeeping (ep_plan.h). */
#ifndef DW_TRAIN_EP_BUFFERS_H
#define DW_TRAIN_EP_BUFFERS_H

#include <stdbool.h>
#include <stdint.h>

#include "compile/program.h"

enum { DW_EP_ROLE_NONE = 0, DW_EP_ROLE_DISPATCH, DW_EP_ROLE_EXPERT, DW_EP_ROLE_COMBINE };

typedef struct {
    int dispatch, combine; /* nodes */
    int rows, offsets, y;  /* tensors: dispatch's rows and offsets, the combine's expert rows */
} dw_ep_layer_at;

/* The MoE layers of a program under --ep G, and the group's rows of each expert-op tensor. */
typedef struct {
    int group;               /* G */
    int64_t experts;         /* E, the same in every layer */
    int n_layers;
    dw_ep_layer_at *layer;   /* (n_layers) */
    signed char *role;       /* (nodes) DW_EP_ROLE_* */
    int *layer_of;           /* (nodes) its layer, -1 */
    int64_t *cap;            /* (tensors) rows of t's group buffers (dw_ep_group_batch(B)'s); 0: not ep's */
    double capacity;         /* f */
    int64_t *grad_at;        /* (tensors) byte offset of t's gradient rows in the shared pool; -1: none */
    int64_t grad_pool;       /* bytes of that pool: the largest layer's gradient rows */
} dw_ep_map;

/* f: DW_EP_CAPACITY (a positive number; above g is taken as g), by default the group size g: every
 * routed row fits, whatever the routing (a fresh moe-e64 with --ep 4 on 4 H100s routed 2.0006 x a
 * rank's share to one rank at step 3, and 3.0002 x at step 8; session 21). A smaller f saves
 * memory and may stop a skewed step. */
double dw_ep_capacity_factor(int g);
/* The batch whose rows a rank's expert buffers hold at micro-batch b: ceil(f x b), at most G x b;
 * the expert ops run on its rows (the received ones first, the rest zero). */
int64_t dw_ep_group_batch(const dw_ep_map *m, int64_t b);

/* Bytes of the buffers ep.c allocates for a map, by kind; total is their sum (the log's "MiB of
 * buffers for the group's rows"). */
typedef struct {
    int64_t rows;  /* each expert-op tensor's rows (cap x width) and the shared pool of their gradients */
    int64_t index; /* each layer's expert-order offsets (E+1) and perm, back (cap) as int32 */
    int64_t acc;   /* an ACC temporary of the widest expert-op tensor */
    int64_t stage; /* rows in source order: the widest exchanged (a layer's rows or y) */
    int64_t fp8;   /* fp8_block experts' operand slots for the group's rows (runtime/moe_fp8.h) */
    int64_t total;
} dw_ep_bytes;

/* The map of program p for groups of g ranks (g >= 2): the layers and, from each dispatch, the ops
 * reading its rows (transitively) up to the combine. DW_ERR_UNSUPPORTED naming --ep g for what the
 * runtime cannot run (layers of unequal experts, an expert op with per-rank workspaces, a layer
 * without expert ops); DW_ERR_INVALID without a MoE layer or when E % g. Free with dw_ep_map_free. */
dw_status dw_ep_map_build(dw_ctx *ctx, const dw_compiled *p, int g, dw_ep_map *out);
void dw_ep_map_free(dw_ep_map *m);

/* One buffer of tensor t's group rows (its values, or its gradient's share of the pool), the ACC temporary, the staging
 * rows, a layer's offsets and its perm (= back) in bytes: what ep.c allocates each of. */
int64_t dw_ep_tensor_bytes(const dw_compiled *p, const dw_ep_map *m, int t);
int64_t dw_ep_acc_bytes(const dw_compiled *p, const dw_ep_map *m);
int64_t dw_ep_stage_bytes(const dw_compiled *p, const dw_ep_map *m);
int64_t dw_ep_offsets_bytes(const dw_ep_map *m);
int64_t dw_ep_perm_bytes(const dw_ep_map *m, int layer);
/* Whether tensor t's gradient has a group buffer too. */
bool dw_ep_tensor_has_grad(const dw_compiled *p, const dw_ep_map *m, int t);

/* Grows fp8's slots (runtime/moe_fp8.h) to hold each fp8_block expert op's operands for its rows. */
struct dw_moe_fp8_ep;
void dw_ep_fp8_fit(const dw_compiled *p, const dw_ep_map *m, struct dw_moe_fp8_ep *fp8);

/* Every buffer of the map, by kind (fp8: the slots dw_moe_fp8_ep_fit sizes for it). */
void dw_ep_buffer_bytes(const dw_compiled *p, const dw_ep_map *m, dw_ep_bytes *out);

#endif /* DW_TRAIN_EP_BUFFERS_H */
