/* weights_layout.h — private to runtime/: where each parameter lives in a Hugging Face checkpoint,
 * as pieces (a block of a stored tensor <-> a block of the parameter). Most parameters are one
 * piece under their own name (GPT-2's Conv1D weights stored transposed). Mixture-of-experts
 * weights have two layouts: transformers 5's, fused (mlp.experts.gate_up_proj [E,2F,C], gate rows
 * first; mlp.experts.down_proj [E,C,F]; router mlp.gate.weight), and the per-expert one of earlier
 * checkpoints, named by the architecture (capture/archs.def's experts column: Mixtral's
 * block_sparse_moe.experts.{e}.w1 / w3 [F,C], w2 [C,F] with the router block_sparse_moe.gate.weight;
 * OLMoE's mlp.experts.{e}.gate_proj / up_proj / down_proj). Deepwell keeps gate and up as separate
 * (E,F,C) parameters. Architectures with archs.def's fused column (Phi-3) store q, k, v as the rows
 * of self_attn.qkv_proj.weight [q+2kv, C] and gate, up as those of mlp.gate_up_proj.weight [2F, C];
 * each Deepwell parameter is its block of rows. */
#ifndef DW_RUNTIME_WEIGHTS_LAYOUT_H
#define DW_RUNTIME_WEIGHTS_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "capture/arch.h"
#include "deepwell.h"
#include "ir/ir.h"

typedef struct {
    char *stored;                     /* the tensor's name in the file (owned) */
    int ndim;
    int64_t shape[DW_IR_MAX_DIMS];    /* the stored tensor's shape */
    int64_t stored_off, param_off;    /* first element of the block in each */
    int64_t count;                    /* elements of the block */
    bool transposed;                  /* the stored tensor is the whole parameter transposed */
} dw_hf_piece;

/* The pieces of parameter p of graph g, architecture a (may be NULL: no per-expert names) in the
 * layout (DW_WEIGHTS_LAYOUT_FUSED or _PER_EXPERT), *n of them; NULL when out of memory. Free with
 * dw_hf_pieces_free. */
dw_hf_piece *dw_hf_pieces(const dw_graph *g, const dw_ir_tensor *p, dw_weights_layout layout, const dw_hf_arch *a,
                          int *n);
void dw_hf_pieces_free(dw_hf_piece *pc, int n);
/* Whether a stored name belongs to the per-expert layout (".experts.<number>."), or to the fused
 * one (".experts.gate_up_proj", ".experts.down_proj"). */
bool dw_hf_per_expert_name(const char *stored);
bool dw_hf_fused_expert_name(const char *stored);

#endif /* DW_RUNTIME_WEIGHTS_LAYOUT_H */
