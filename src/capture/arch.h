/* arch.h — private: the Hugging Face architecture table (archs.def) as data: one dw_hf_arch per
 * model_type (its checkpoint prefix and per-expert names, which runtime/weights.c and
 * weights_layout.c read), and which stored tensors are not parameters. Not the config parser (model_config.c) nor
 * the graph builder (capture.c). */
#ifndef DW_CAPTURE_ARCH_H
#define DW_CAPTURE_ARCH_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
#define DW_ARCH(ID, type, hf_class, family, reads_config, trains, prefix, ignorable, experts, fused) DW_ARCH_##ID,
#include "capture/archs.def"
#undef DW_ARCH
    DW_ARCH_COUNT
} dw_arch;

typedef struct {
    dw_arch id;
    const char *model_type;   /* "gpt2" */
    const char *hf_class;     /* "GPT2LMHeadModel" (config.json "architectures") */
    const char *family;       /* "gpt2" | "llama" */
    bool reads_config, trains;
    const char *ckpt_prefix;  /* "" or "transformer." */
    const char *ignorable;    /* "|"-separated suffixes */
    const char *experts;      /* per-expert checkpoint names "module|gate|up|down" ("": none) */
    bool fused;               /* q/k/v stored as self_attn.qkv_proj, gate/up as mlp.gate_up_proj (Phi-3) */
} dw_hf_arch;

const dw_hf_arch *dw_hf_arch_get(dw_arch a);
/* The row of a model_type, or NULL. */
const dw_hf_arch *dw_hf_arch_find(const char *model_type);
/* "gpt2, llama, mistral, qwen2, mixtral, olmoe, ...": the types whose config.json is read, into buf. */
void dw_hf_arch_list(char *buf, size_t n);

/* Whether checkpoint tensor `stored` is one the architecture keeps that is no parameter (an
 * ignorable suffix, or "lm_head.weight" of a model with tied embeddings). */
bool dw_hf_ignorable(const dw_hf_arch *a, const char *stored, bool tied_embeddings);

#endif /* DW_CAPTURE_ARCH_H */
