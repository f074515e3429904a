/* deepwell.h — the public C API of Deepwell, and the only published one.
 *
 * If it is not in this file it is not a published API: everything under src/ is private.
 * C11, usable from C++ (extern "C"). Includes only <stddef.h>, <stdint.h>, <stdbool.h>.
 *
 * Conventions (hold for every function below):
 *   - Handles are opaque. Every dw_x_create/dw_x_load has a dw_x_free; dw_x_free(NULL) is a no-op.
 *   - Functions that can fail for environmental reasons (I/O, bad input files, out of memory,
 *     the driver) return dw_status; the readable reason is then in dw_errmsg(ctx).
 *   - Out-parameters are always written: NULL (or zero) on error.
 *   - Strings returned as `char *` are owned by the caller (free with dw_free_string);
 *     `const char *` results are owned by the library and stay valid as the comment says.
 *   - Programmer errors (violated preconditions) abort through DW_ASSERT's hook, never exit().
 */
#ifndef DEEPWELL_H
#define DEEPWELL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DW_VERSION_MAJOR 0
#define DW_VERSION_MINOR 1
#define DW_VERSION_PATCH 0

/* ======================================================================================
 * Core: status codes, context, logging
 * ====================================================================================== */

typedef enum {
    DW_OK = 0,
    DW_ERR_INVALID,     /* bad argument or bad user input (flag, config value) */
    DW_ERR_NOMEM,       /* host or device allocation failed */
    DW_ERR_IO,          /* file could not be opened, read, written or renamed */
    DW_ERR_FORMAT,      /* a file's content is malformed (JSON, safetensors, token shard) */
    DW_ERR_UNSUPPORTED, /* valid request this build or device cannot do */
    DW_ERR_CUDA,        /* CUDA runtime / driver / library error */
    DW_ERR_NUMERIC,     /* NaN/Inf or numeric guard tripped */
    DW_STATUS_COUNT
} dw_status;

/* Static name of a status ("DW_ERR_IO"), never NULL. */
const char *dw_status_name(dw_status s);

typedef enum { DW_LOG_DEBUG = 0, DW_LOG_INFO, DW_LOG_WARN, DW_LOG_ERROR, DW_LOG_OFF } dw_log_level;

/* The process-wide log level. Initialised from the environment variable
 * DW_LOG=debug|info|warn|error|off (default info) on first use. */
dw_log_level dw_log_get_level(void);
void dw_log_set_level(dw_log_level level);
/* Parse "debug" / "info" / ... ; returns false for an unknown name. */
bool dw_log_parse_level(const char *name, dw_log_level *out);

/* A context: the chosen device, its streams, lazily created library handles (cuBLASLt, ...),
 * and the last error message. One context per thread of use; not thread-safe. */
typedef struct dw_ctx dw_ctx;

typedef enum {
    DW_DEVICE_CPU = 0, /* CPU reference backend */
    DW_DEVICE_CUDA,    /* one CUDA GPU (device_index) */
    DW_DEVICE_AUTO     /* CUDA device 0 if a usable GPU is present, else CPU */
} dw_device_kind;

typedef struct {
    dw_device_kind device;
    int device_index; /* CUDA ordinal, used when device is CUDA */
} dw_ctx_opts;

/* Creates a context. CUDA state (streams, handles) is created on first use, not here, except that
 * DW_DEVICE_CUDA checks that the device exists. *out is NULL on error; the message is then in
 * dw_errmsg(NULL) (a thread-local fallback). */
dw_status dw_ctx_create(const dw_ctx_opts *opts, dw_ctx **out);
void dw_ctx_free(dw_ctx *ctx);
/* The device the context resolved to (never DW_DEVICE_AUTO). */
dw_device_kind dw_ctx_device(const dw_ctx *ctx);
int dw_ctx_device_index(const dw_ctx *ctx);

/* The last error's message for this context ("" when none). Valid until the next call on ctx.
 * With ctx == NULL: the thread's last message from a call that had no context. */
const char *dw_errmsg(const dw_ctx *ctx);

/* True when this build contains CUDA code (compiled with nvcc for sm_90a and sm_100a). */
bool dw_built_with_cuda(void);
/* "0.1.0 (cuda: sm_90a,sm_100a)" or "0.1.0 (cpu-only build)"; static storage. */
const char *dw_version_string(void);

void dw_free_string(char *s);

/* ======================================================================================
 * Probe: the hardware (measured, loaded from JSON, or a datasheet preset)
 * ====================================================================================== */

typedef struct dw_hw dw_hw;

/* Detects GPUs through the CUDA runtime (and NVLink state through NVML, loaded with dlopen when
 * present). No GPU or no driver is not an error: the result has zero GPUs and
 * dw_hw_notice(hw) says why. */
dw_status dw_probe(dw_ctx *ctx, dw_hw **out);
/* A datasheet preset ("h100-sxm", "h200", "b200", "b100", "gb200-nvl72") for `nodes` nodes. */
dw_status dw_hw_preset(dw_ctx *ctx, const char *name, int nodes, dw_hw **out);
/* Loads a hardware JSON file in the schema `deepwell probe --json` writes. */
dw_status dw_hw_load(dw_ctx *ctx, const char *path, dw_hw **out);
void dw_hw_free(dw_hw *hw);

/* Number of presets and the i-th preset's name and one-line description (static storage). */
int dw_hw_preset_count(void);
const char *dw_hw_preset_name(int i);
const char *dw_hw_preset_description(int i);

int dw_hw_gpu_count(const dw_hw *hw);
/* Why there are no GPUs ("no CUDA driver found", ...), or NULL. Valid while hw lives. */
const char *dw_hw_notice(const dw_hw *hw);
/* The JSON document (`deepwell probe --json` schema), indented when pretty. Caller frees with
 * dw_free_string. */
dw_status dw_hw_to_json(dw_ctx *ctx, const dw_hw *hw, bool pretty, char **out);

/* ======================================================================================
 * Formats and quantisation (see shared/FORMATS.md)          [section: formats]
 * ====================================================================================== */

/* ======================================================================================
 * safetensors                                                [section: safetensors]
 * ====================================================================================== */

/* ======================================================================================
 * Graph IR and capture                                       [section: ir]
 * ====================================================================================== */

/* A model as a graph of coarse ops (embedding, norms, linear, attention, ...) whose nodes carry
 * the Hugging Face module names ("model.layers.3.mlp.down_proj"). Immutable once built. */
typedef struct dw_graph dw_graph;

/* Captures the training graph (forward + loss; backward is implied by each op) of a model given
 * as a directory holding config.json, a config.json path, or a preset name ("gpt2-tiny",
 * "llama-1b", ...; see `deepwell capture --list-presets`). Shapes are for batch 1 and sequence
 * min(max_position_embeddings, 2048). Planning-only presets (llama-8b, mixtral-8x7b, ...) are
 * refused with DW_ERR_UNSUPPORTED. *out is NULL on error. */
dw_status dw_capture_hf(dw_ctx *ctx, const char *model_dir_or_preset, dw_graph **out);
/* Same, for `batch` sequences of length `seq` (1 <= seq <= max_position_embeddings; 0: the
 * default above). */
dw_status dw_capture_hf_shape(dw_ctx *ctx, const char *model_dir_or_preset, int64_t batch,
                              int64_t seq, dw_graph **out);
void dw_graph_free(dw_graph *g);

/* The graph as JSON (schema in docs/ir.md): top-level "params", "flops_per_token", "config",
 * "tensors", "nodes". Caller frees *out with dw_free_string. */
dw_status dw_graph_to_json(dw_ctx *ctx, const dw_graph *g, bool pretty, char **out);
/* Loads a graph written by dw_graph_to_json and verifies it (shape/dtype inference; errors name
 * the node). `what` names the source in messages (may be NULL). */
dw_status dw_graph_from_json(dw_ctx *ctx, const char *text, size_t len, const char *what,
                             dw_graph **out);
/* A readable listing: one line per node (name, op, inputs, output shape), then totals. Caller
 * frees *out with dw_free_string. */
dw_status dw_graph_print(dw_ctx *ctx, const dw_graph *g, char **out);

/* Trainable parameters, tied embeddings counted once. */
int64_t dw_graph_params(const dw_graph *g);
/* Training FLOPs (forward + backward) per token at the graph's sequence length, causal attention
 * counted as computed (docs/ir.md). */
double dw_graph_flops_per_token(const dw_graph *g);
int dw_graph_node_count(const dw_graph *g);
int64_t dw_graph_seq(const dw_graph *g);

/* ======================================================================================
 * Precision policy                                           [section: precision]
 * ====================================================================================== */

/* A precision policy: default recipe, ordered rules on node names/op types, optional "safe"
 * fallback that keeps embeddings, the LM head, MoE routers and the first and last block in BF16. */
typedef struct dw_policy dw_policy;

/* Loads a policy JSON file: {"default":"fp8_block","fallback":"safe",
 * "rules":[{"match":"*.self_attn.*","op":"linear","recipe":"bf16"}]}. Errors name the file and
 * the field (unknown recipe names list the known ones). */
dw_status dw_policy_load(dw_ctx *ctx, const char *path, dw_policy **out);
/* A policy with only a default recipe ("bf16", "fp8_block", "mxfp8", "nvfp4", ...). */
dw_status dw_policy_from_precision(dw_ctx *ctx, const char *recipe, bool fallback_safe,
                                   dw_policy **out);
/* The policy as JSON (the same schema); caller frees with dw_free_string. */
dw_status dw_policy_to_json(dw_ctx *ctx, const dw_policy *p, char **out);
void dw_policy_free(dw_policy *p);

/* ======================================================================================
 * GEMM layer and kernel registry                             [section: gemm]
 * ====================================================================================== */

/* ======================================================================================
 * Autoplan and dryrun                                        [section: plan]
 * ====================================================================================== */

/* ======================================================================================
 * Training                                                   [section: train]
 * ====================================================================================== */

/* Learning-rate schedules: linear warmup, then one of these down to min_lr at the last step. */
typedef enum { DW_LR_COSINE = 0, DW_LR_LINEAR, DW_LR_CONSTANT } dw_lr_schedule;

/* What the trainer reports after each optimizer step (through dw_train_opts.progress). */
typedef struct {
    int64_t step;          /* optimizer steps done, 1..total */
    int64_t total;         /* --steps */
    double loss;           /* mean training loss over the step's global batch */
    double val_loss;       /* NaN unless validation ran after this step */
    double lr, grad_norm;  /* grad_norm: before clipping */
    double tokens_per_s;   /* this step */
    double elapsed_s;      /* since this process started training */
    double eta_s;          /* estimated time to the last step */
    const char *sample;    /* NULL, or generated text (valid during the callback) */
    const char *checkpoint; /* NULL, or the directory of a checkpoint written after this step */
} dw_train_progress;

typedef struct {
    const char *model;      /* preset name or Hugging Face model directory (config.json); with
                               `resume` the checkpoint's config.json is used instead */
    const char *data;       /* glob of llm.c token shards (*.bin) or of text files, or "builtin" */
    const char *val;        /* validation data (same forms), or NULL; "builtin" data has its own
                               validation stream (the same facts, other orders), used when NULL */
    const char *out_dir;    /* run directory: metrics.jsonl, ckpt-<step>/, latest (created) */
    const char *resume;     /* checkpoint or run directory to continue from, or NULL */
    int64_t steps;          /* total optimizer steps (a resumed run continues up to it) */
    int64_t batch;          /* micro-batch B (sequences per forward/backward) */
    int64_t seq;            /* sequence length T */
    int64_t global_batch;   /* sequences per optimizer step; a multiple of batch */
    double lr, min_lr;
    int64_t warmup;
    dw_lr_schedule schedule;
    double weight_decay;    /* on matrices only */
    double clip;            /* global gradient-norm clipping; 0 disables */
    double beta1, beta2, eps;
    int64_t eval_every;     /* validation loss every K steps (and at the end); 0: never */
    int64_t eval_batches;   /* micro-batches per validation */
    int64_t sample_every;   /* a sample every K steps (and at the end); 0: never */
    int64_t sample_tokens;  /* tokens per sample */
    double sample_temperature;
    const char *sample_prompt; /* text (byte-level data) or space-separated ids; NULL: the first
                                  min(16, seq/4) tokens of the step's first sequence */
    int64_t ckpt_every;     /* checkpoint every K steps; one is always written at the end */
    int keep;               /* checkpoints kept (newest); 0: all */
    uint64_t seed;          /* weights, shuffling and sampling */
    void (*progress)(const dw_train_progress *p, void *user); /* may be NULL */
    void *progress_user;
} dw_train_opts;

/* Fills defaults: steps 100, batch 8, seq 64, global_batch 8, lr 1e-3, min_lr 1e-4, warmup 10,
 * cosine, weight_decay 0.1, clip 1.0, betas 0.9/0.95, eps 1e-8, eval every 50 (8 batches),
 * sample every 0 (64 tokens at temperature 0.8), checkpoint at the end only, keep 3, seed 1337.
 * model, data, out_dir must still be set. */
void dw_train_opts_default(dw_train_opts *opts);

/* Trains on the context's device (CPU reference engine; CUDA: DW_ERR_UNSUPPORTED for now).
 * Writes out_dir/metrics.jsonl (one JSON object per step) and checkpoints. Returns DW_OK when
 * all steps ran or after a stop request (then a checkpoint of the last finished step exists). */
dw_status dw_train(dw_ctx *ctx, const dw_train_opts *opts);

/* Asks a running dw_train to stop after the current step (it writes a checkpoint first).
 * Async-signal-safe: meant to be called from a SIGINT handler. */
void dw_train_request_stop(void);
/* Whether a stop was requested (and not yet cleared by the start of the next dw_train). */
bool dw_train_stop_requested(void);


#ifdef __cplusplus
}
#endif

#endif /* DEEPWELL_H */
