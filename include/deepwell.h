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
 *   - Options structs that may grow begin with `size_t size`: call dw_<x>_opts_init(&o, sizeof o)
 *     (it sets size and every default), then change fields. The library reads only the first
 *     `size` bytes, taking defaults for fields a caller built against an older header lacks.
 *   - Threads: a dw_ctx and everything created from it (graphs, programs, engines) belong to one
 *     thread at a time. Process-wide state, and who may touch it:
 *       the GEMM kernel registry and autotune cache, the log level, the assert handler, the stop
 *         request: written by the setters below (and the benchmarks), not synchronised: set them
 *         before other threads use the library;
 *       the CUDA attention path (DW_ATTN, read once): dw_train with `deterministic` switches it
 *         to the deterministic kernels for the run's duration, so don't train deterministically
 *         while another thread creates CUDA engines; engines keep the path they were created with
 *         inside their recorded steps;
 *       cuDNN (the library handle and its per-shape plans): created lazily behind a mutex, safe
 *         from any thread; a plan is built at engine creation, never inside a step;
 *       the environment (docs/environment.md): read (never written) where an option takes its
 *         default, as in the _opts_init calls; don't change it while another thread does so.
 */
#ifndef DEEPWELL_H
#define DEEPWELL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* DW_API marks the published functions: the shared library exports these and nothing else (the
 * build compiles everything else with hidden visibility; the static library keeps every symbol
 * for the tests). */
#if defined(_WIN32)
#define DW_API __declspec(dllexport)
#elif defined(__GNUC__)
#define DW_API __attribute__((visibility("default")))
#else
#define DW_API
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
DW_API const char *dw_status_name(dw_status s);

typedef enum { DW_LOG_DEBUG = 0, DW_LOG_INFO, DW_LOG_WARN, DW_LOG_ERROR, DW_LOG_OFF } dw_log_level;

/* The process-wide log level. Initialised from the environment variable
 * DW_LOG=debug|info|warn|error|off (default info) on first use. */
DW_API dw_log_level dw_log_get_level(void);
DW_API void dw_log_set_level(dw_log_level level);
/* Parse "debug" / "info" / ... ; returns false for an unknown name. */
DW_API bool dw_log_parse_level(const char *name, dw_log_level *out);

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
DW_API dw_status dw_ctx_create(const dw_ctx_opts *opts, dw_ctx **out);
DW_API void dw_ctx_free(dw_ctx *ctx);
/* The device the context resolved to (never DW_DEVICE_AUTO). */
DW_API dw_device_kind dw_ctx_device(const dw_ctx *ctx);
DW_API int dw_ctx_device_index(const dw_ctx *ctx);

/* The last error's message for this context ("" when none). Valid until the next call on ctx.
 * With ctx == NULL: the thread's last message from a call that had no context. */
DW_API const char *dw_errmsg(const dw_ctx *ctx);

/* Device memory of a CUDA context's GPU: free and total bytes now (DW_ERR_UNSUPPORTED on a CPU
 * context). */
DW_API dw_status dw_ctx_mem_info(dw_ctx *ctx, int64_t *free_bytes, int64_t *total_bytes);

/* True when this build contains CUDA code (compiled with nvcc for sm_90a and sm_100a). */
DW_API bool dw_built_with_cuda(void);
/* "0.1.0 (cuda: sm_90a,sm_100a)" or "0.1.0 (cpu-only build)"; static storage. */
DW_API const char *dw_version_string(void);

DW_API void dw_free_string(char *s);

/* Programmer errors (a violated precondition inside the library: a shape that inference should
 * have refused, an index out of range) call the assert handler with the failed expression, the
 * source file and line, and an optional message (may be NULL); the default prints them to stderr
 * and calls abort(). A replacement may log, longjmp or abort itself; if it returns, abort() is
 * called anyway, since execution cannot continue past a broken invariant. The library never
 * calls exit(). Process-wide; set it before other threads use the library (not synchronised).
 * Returns the previous handler; NULL restores the default. */
typedef void (*dw_assert_handler)(const char *expr, const char *file, int line, const char *msg);
DW_API dw_assert_handler dw_set_assert_handler(dw_assert_handler handler);

/* ======================================================================================
 * Probe: the hardware (measured, loaded from JSON, or a datasheet preset)
 * ====================================================================================== */

typedef struct dw_hw dw_hw;

/* Detects GPUs through the CUDA runtime (and NVLink state through NVML, loaded with dlopen when
 * present). No GPU or no driver is not an error: the result has zero GPUs and
 * dw_hw_notice(hw) says why. */
DW_API dw_status dw_probe(dw_ctx *ctx, dw_hw **out);
/* A datasheet preset ("h100-sxm", "h200", "b200", "b100", "gb200-nvl72") for `nodes` nodes. */
DW_API dw_status dw_hw_preset(dw_ctx *ctx, const char *name, int nodes, dw_hw **out);
/* Loads a hardware JSON file in the schema `deepwell probe --json` writes. */
DW_API dw_status dw_hw_load(dw_ctx *ctx, const char *path, dw_hw **out);
DW_API void dw_hw_free(dw_hw *hw);

/* Number of presets and the i-th preset's name and one-line description (static storage). */
DW_API int dw_hw_preset_count(void);
DW_API const char *dw_hw_preset_name(int i);
DW_API const char *dw_hw_preset_description(int i);

DW_API int dw_hw_gpu_count(const dw_hw *hw);
/* Why there are no GPUs ("no CUDA driver found", ...), or NULL. Valid while hw lives. */
DW_API const char *dw_hw_notice(const dw_hw *hw);
/* The JSON document (`deepwell probe --json` schema), indented when pretty. Caller frees with
 * dw_free_string. */
DW_API dw_status dw_hw_to_json(dw_ctx *ctx, const dw_hw *hw, bool pretty, char **out);

/* Growable result structs: like options, structs the library fills for the caller begin with
 * `size_t size`. Set it to sizeof the struct before the call; the library writes at most that
 * many bytes (and refuses a size of 0 with DW_ERR_INVALID). */

/* The machine as a whole (a result struct: set size first). Unknown counts are negative. */
typedef struct {
    size_t size;
    char source[16];        /* "probe", "preset" or "file" */
    char preset[32];        /* the preset's name; "" otherwise */
    char label[160];        /* e.g. "datasheet figures (dense), not measured: ..."; may be "" */
    int nodes;              /* identical nodes */
    int gpus;               /* GPUs per node (dw_hw_gpu_count) */
    int host_cpus;          /* -1: unknown */
    int64_t host_ram_bytes; /* -1: unknown */
    double nvlink_gbps;     /* per GPU, one direction, GB/s; 0: unknown */
    int nvlink_domain;      /* GPUs reachable over NVLink (8 for HGX, 72 for NVL72); 1 if none */
    double internode_gbps;  /* per GPU, one direction, GB/s; 0: unknown */
    char notice[256];       /* why there are no GPUs; "" otherwise */
} dw_hw_info;
/* DW_ERR_INVALID (message in dw_errmsg(NULL)) for NULL or an unset size. */
DW_API dw_status dw_hw_get_info(const dw_hw *hw, dw_hw_info *out);

/* One GPU of a node (a result struct: set size first). Unknown values are negative (counts) or
 * zero (rates); the peak rates are datasheet figures for presets and derived from SMs x clock x
 * architecture for probed GPUs (not measured). */
typedef struct {
    size_t size;
    int index;                 /* 0-based within the node */
    char name[256];            /* "NVIDIA H200" */
    int cc_major, cc_minor;    /* compute capability */
    int sms;
    uint64_t hbm_bytes;
    int64_t hbm_free_bytes;    /* -1: unknown (presets) */
    int sm_clock_mhz;          /* peak; 0: unknown */
    int mem_clock_mhz;         /* peak; 0: unknown */
    int mem_bus_bits;          /* 0: unknown */
    uint64_t l2_bytes;
    uint64_t smem_optin_bytes; /* opt-in shared memory per block */
    char pci_bus_id[32];       /* "" for presets */
    bool wgmma;                /* sm_90 warpgroup MMA */
    bool fp8;                  /* FP8 E4M3/E5M2 tensor cores (sm_89+) */
    bool tcgen05;              /* sm_100 5th-generation tensor core instructions */
    bool tmem;                 /* sm_100 tensor memory */
    bool mx_block_scaling;     /* hardware MX block-scaled MMA (sm_100+) */
    bool fp4;                  /* FP4 E2M1 tensor cores (sm_100+) */
    int nvlink_links;          /* links NVML reports; -1: NVML unavailable */
    int nvlink_active;         /* of those, active; -1: unknown */
    double peak_bf16_tflops, peak_fp8_tflops, peak_fp4_tflops; /* dense; 0: none or unknown */
    double hbm_gbps;           /* GB/s; 0: unknown */
} dw_gpu_info;
/* GPU i (0 <= i < dw_hw_gpu_count) of each node. DW_ERR_INVALID (message in dw_errmsg(NULL))
 * for NULL, an unset size or i out of range. */
DW_API dw_status dw_hw_get_gpu(const dw_hw *hw, int i, dw_gpu_info *out);

/* How GPU i reaches GPU j (a result struct: set size first), as the CUDA runtime reports it. */
typedef struct {
    size_t size;
    bool access;          /* peer access supported (cudaDevP2PAttrAccessSupported) */
    int perf_rank;        /* cudaDevP2PAttrPerformanceRank: lower is better */
    bool native_atomics;  /* cudaDevP2PAttrNativeAtomicSupported */
} dw_peer_link;
/* For i != j, both in [0, dw_hw_gpu_count); DW_ERR_INVALID (dw_errmsg(NULL)) otherwise. */
DW_API dw_status dw_hw_get_peer(const dw_hw *hw, int i, int j, dw_peer_link *out);

/* Sets the number of identical nodes (1..1000000) of a probed or loaded description
 * (dw_hw_preset takes it as an argument). DW_ERR_INVALID for a value out of range. */
DW_API dw_status dw_hw_set_nodes(dw_ctx *ctx, dw_hw *hw, int nodes);
/* Keeps only the first n GPUs of each node (e.g. plan one GPU of an 8-GPU preset); the NVLink
 * domain of a single node shrinks to n with them. DW_ERR_INVALID when n < 1 or the node has fewer
 * than n GPUs (the message names both counts); DW_ERR_NOMEM. */
DW_API dw_status dw_hw_keep_gpus(dw_ctx *ctx, dw_hw *hw, int n);

/* ======================================================================================
 * Formats and quantisation (see shared/FORMATS.md)          [section: formats]
 * ====================================================================================== */

/* Quantisation recipes (bit-level definitions in shared/FORMATS.md). The values are stable: they
 * are stored in dw_gemm_operand.recipe, dw_plan_job.recipe and dw_plan_layout.recipe. */
typedef enum {
    DW_RECIPE_BF16 = 0,   /* no quantisation (BF16 operands) */
    DW_RECIPE_FP8_TENSOR, /* E4M3, one FP32 scale per tensor */
    DW_RECIPE_FP8_ROW,    /* E4M3, one FP32 scale per row */
    DW_RECIPE_FP8_BLOCK,  /* E4M3, FP32 scale per 1x128 block (activations, gradients) */
    DW_RECIPE_FP8_BLOCK2D,/* E4M3, FP32 scale per 128x128 block (weights) */
    DW_RECIPE_MXFP8,      /* E4M3, UE8M0 scale per 1x32 */
    DW_RECIPE_MXFP8_E5M2, /* E5M2, UE8M0 scale per 1x32 */
    DW_RECIPE_MXFP4,      /* E2M1, UE8M0 scale per 1x32 */
    DW_RECIPE_NVFP4,      /* E2M1, UE4M3 scale per 1x16 + FP32 tensor scale */
    DW_RECIPE_COUNT
} dw_recipe;

/* The recipe's name ("mxfp8"), static storage; "unknown" for a value out of range. */
DW_API const char *dw_recipe_name(dw_recipe r);
/* The recipe called `name`; false (and *out untouched) for NULL or an unknown name. */
DW_API bool dw_recipe_parse(const char *name, dw_recipe *out);
/* True for mxfp8, mxfp8_e5m2 and mxfp4 (UE8M0 scales, the MX rule; see dw_scale_rounding). */
DW_API bool dw_recipe_is_mx(dw_recipe r);
/* Bytes per scale: 4 (FP32: the fp8_* recipes), 1 (UE8M0 / UE4M3), 0 (bf16). r must be a
 * recipe (a value below DW_RECIPE_COUNT; others hit DW_ASSERT). */
DW_API int dw_recipe_scale_bytes(dw_recipe r);

/* How an MX block scale is chosen from the block's amax: rceil (cuBLAS, Transformer Engine:
 * never clips) or floor (the OCP rule: may clip). Ignored by the other recipes. */
typedef enum { DW_SCALE_RCEIL = 0, DW_SCALE_FLOOR } dw_scale_rounding;
/* "rceil" / "floor" (static storage; "unknown" out of range) and back (false for other text). */
DW_API const char *dw_scale_rounding_name(dw_scale_rounding r);
DW_API bool dw_scale_rounding_parse(const char *text, dw_scale_rounding *out);

/* How to quantise (options struct: dw_quantize_opts_init sets size and the defaults). */
typedef struct {
    size_t size;
    int32_t recipe;   /* dw_recipe other than bf16; default DW_RECIPE_COUNT = none: must be set */
    int32_t rounding; /* dw_scale_rounding of the MX recipes; default rceil */
    bool pow2;        /* fp8_* recipes: round every FP32 scale up to a power of two; default false */
} dw_quantize_opts;
DW_API void dw_quantize_opts_init(dw_quantize_opts *o, size_t size);

/* The error of y = dequantise(quantise(x)) against x, as sums that add up over tensors (a
 * result struct: set size first). */
typedef struct {
    size_t size;
    int64_t n;          /* elements */
    double sum_x2;      /* sum x^2 over the finite elements */
    double sum_e2;      /* sum (x - y)^2 over the finite elements */
    double max_abs;     /* max |x - y|; NaN when any x or y is NaN or infinite */
    int64_t saturated;  /* clipped: the largest code, and |x| beyond the rounding boundary above
                           the largest value (464 x scale for E4M3, 61440 for E5M2, 7 for E2M1) */
    int64_t flushed;    /* x != 0 but y == 0 */
    int64_t nonfinite;  /* x or y NaN or infinite */
} dw_quant_stats;

/* Quantises x [rows, cols] (host, row-major FP32) with o on the CPU reference (the codes and
 * scales `deepwell quantize` writes; a last block the shape cuts short is quantised as it is),
 * dequantises it and writes the error into *out (sums from zero). DW_ERR_INVALID for bf16, an
 * unknown recipe or rounding, NULL pointers, rows or cols < 1; DW_ERR_NOMEM. Thread-safe for
 * distinct contexts. */
DW_API dw_status dw_quant_error(dw_ctx *ctx, const dw_quantize_opts *o, const float *x, int64_t rows,
                                int64_t cols, dw_quant_stats *out);
/* Adds the sums of s to *into (both set up by the caller: size set). A NaN max_abs stays NaN. */
DW_API void dw_quant_stats_merge(dw_quant_stats *into, const dw_quant_stats *s);
/* SQNR = 10 log10(sum_x2 / sum_e2) dB: +Inf when exact, NaN when x is all zero. */
DW_API double dw_quant_stats_sqnr_db(const dw_quant_stats *s);
/* Relative error ||x - y|| / ||x|| = sqrt(sum_e2 / sum_x2) (0 when exact; +Inf for a zero x
 * with an error). */
DW_API double dw_quant_stats_rel_err(const dw_quant_stats *s);

/* ======================================================================================
 * safetensors                                                [section: safetensors]
 * ====================================================================================== */

/* One tensor of a safetensors file, as a callback sees it (library-owned; valid during the call). */
typedef struct {
    const char *name;      /* "model.layers.0.mlp.down_proj.weight" */
    const char *dtype;     /* the safetensors spelling: "F32", "BF16", "F8_E4M3", "I64", ... */
    int ndim;              /* 0..8 */
    const int64_t *shape;  /* [ndim] */
} dw_st_tensor_info;

/* Called once per tensor of the input, in file order: why == NULL when the tensor was quantised,
 * else why it was copied unchanged ("not floating-point", "columns not a multiple of 32", ...;
 * static text). */
typedef void (*dw_quantize_notify)(void *user, const dw_st_tensor_info *t, const char *why);

/* What dw_quantize_file did (a result struct: set size first). */
typedef struct {
    size_t size;
    int quantized, copied;        /* tensors */
    uint64_t in_bytes, out_bytes; /* tensor data, before and after */
} dw_quantize_summary;

/* Quantises the safetensors checkpoint `in` with o and writes `out` in FORMATS.md's layout:
 * every tensor that qualifies (F32, BF16 or F16; 2-D [R, C] or 1-D [C] seen as [1, C];
 * non-empty; C a multiple of the recipe's block columns, R of 128 for fp8_block2d) becomes NAME
 * (codes), NAME.scale (scales, row-major, unswizzled) and, for nvfp4, NAME.scale_2 (the FP32
 * tensor scale); the others are copied unchanged. __metadata__ keeps the input's entries and
 * records deepwell.recipe, deepwell.scale_rounding and deepwell.pow2. `out` is written
 * atomically (temporary, fsync, rename): on error an existing `out` is untouched.
 * notify (may be NULL) hears about every tensor; summary may be NULL.
 * Errors: DW_ERR_INVALID (options), DW_ERR_IO naming the file, DW_ERR_FORMAT for a malformed
 * input, for one already quantised (deepwell.recipe metadata) and for a NAME.scale or
 * NAME.scale_2 already present next to a qualifying NAME; DW_ERR_NOMEM. */
DW_API dw_status dw_quantize_file(dw_ctx *ctx, const char *in, const char *out, const dw_quantize_opts *o,
                                  dw_quantize_notify notify, void *user, dw_quantize_summary *summary);

/* `deepwell quant-report`: options (dw_quant_report_opts_init sets size and the defaults). */
typedef struct {
    size_t size;
    const int32_t *recipes; /* dw_recipe values to measure, in this order (repeats are dropped);
                               NULL: all eight quantised recipes, fp8_tensor .. nvfp4 (default) */
    int n_recipes;          /* entries of recipes */
    int32_t rounding;       /* dw_scale_rounding for the MX recipes (default rceil) */
    bool pow2;              /* the fp8_* recipes with power-of-two scales (default false) */
    bool json;              /* the JSON document instead of the table (default false) */
} dw_quant_report_opts;
DW_API void dw_quant_report_opts_init(dw_quant_report_opts *o, size_t size);

/* Quantises every tensor of the safetensors file at `path` with each recipe on the CPU reference
 * (the rules of dw_quantize_file), dequantises it, and reports the error against the original
 * (dw_quant_stats: SQNR, max abs and relative error, saturated and flushed percentages) per
 * tensor and recipe, then per recipe, element-weighted over the tensors it applies to; tensors a
 * recipe does not apply to are listed with the reason. *out is the report: the table `deepwell
 * quant-report` prints, or with o->json its JSON document {file, options, recipes, tensors[],
 * summary} (sqnr_db null when exact or all zero); caller frees with dw_free_string. Measures
 * only: writes nothing. Errors as dw_quantize_file's reading; DW_ERR_INVALID for bf16 or an
 * unknown recipe in o->recipes. */
DW_API dw_status dw_quant_report(dw_ctx *ctx, const char *path, const dw_quant_report_opts *o, char **out);

/* `deepwell quant-report RUN`: a training run's quantised layers over time, from the guardrails'
 * files in run_dir (docs/precision.md, "Guardrails"): quant_stats.jsonl (required: DW_ERR_IO when
 * absent), precision_decisions.jsonl, and the latest checkpoint's state.json when there is one
 * (its recipes as "now" and its --ckpt-every as the interval). Per layer: the recipe, the recipe
 * now and each fallback (step, tensor, reason); per measured tensor the number of checks, the
 * first, last and largest bulk error (with the rel error and the step), overflow and underflow
 * summed over the checks; and per checkpoint interval each layer's largest bulk error. *out: that
 * table, or with json the document {run, checkpoint, checks, first_step, last_step, ckpt_every,
 * layers: [{layer, recipe, now, fallbacks: [the decisions' lines], tensors: [{tensor, recipe,
 * checks, first, last, max: {step, bulk_error, rel_error}, overflow, underflow}], intervals:
 * [{from, to, max_bulk_error (null: no check)}]}]}; caller frees with dw_free_string. Reads only;
 * DW_ERR_FORMAT naming the file for a malformed line. */
DW_API dw_status dw_quant_run_report(dw_ctx *ctx, const char *run_dir, bool json, char **out);

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
DW_API dw_status dw_capture_hf(dw_ctx *ctx, const char *model_dir_or_preset, dw_graph **out);
/* Same, for `batch` sequences of length `seq` (1 <= seq <= max_position_embeddings; 0: the
 * default above). */
DW_API dw_status dw_capture_hf_shape(dw_ctx *ctx, const char *model_dir_or_preset, int64_t batch,
                              int64_t seq, dw_graph **out);
/* Which assignments an expert over its capacity (config.json capacity_factor) drops: the config's
 * (moe_token_drop_policy, default position), the last in (token, k) order (position) or the
 * lightest by router weight, equal weights dropping the later (probs: GShard's and Megatron-Core's
 * "drop by probability"). Without a capacity nothing is dropped either way. */
typedef enum { DW_MOE_DROP_CONFIG = 0, DW_MOE_DROP_POSITION, DW_MOE_DROP_PROBS } dw_moe_drop;

/* The same with options (NULL: defaults): the shape, and overrides of the model's config. */
typedef struct {
    size_t size;     /* sizeof(dw_capture_opts), set by dw_capture_opts_init */
    int64_t batch;   /* default 1 */
    int64_t seq;     /* default 0: min(max_position_embeddings, 2048) */
    int64_t vocab;   /* default 0: the config's vocab_size; else this many rows (e.g. GPT-2's
                        50257 padded to 50304), the captured config.json saying so too */
    dw_moe_drop moe_drop; /* default DW_MOE_DROP_CONFIG; else the policy config.json then records */
} dw_capture_opts;
DW_API void dw_capture_opts_init(dw_capture_opts *o, size_t size);
DW_API dw_status dw_capture(dw_ctx *ctx, const char *model_dir_or_preset, const dw_capture_opts *opts, dw_graph **out);
DW_API void dw_graph_free(dw_graph *g);

/* The graph as JSON (schema in docs/ir.md): top-level "params", "flops_per_token", "config",
 * "tensors", "nodes". Caller frees *out with dw_free_string. */
DW_API dw_status dw_graph_to_json(dw_ctx *ctx, const dw_graph *g, bool pretty, char **out);
/* Loads a graph written by dw_graph_to_json and verifies it (shape/dtype inference; errors name
 * the node). `what` names the source in messages (may be NULL). */
DW_API dw_status dw_graph_from_json(dw_ctx *ctx, const char *text, size_t len, const char *what,
                             dw_graph **out);
/* A readable listing: one line per node (name, op, inputs, output shape), then totals. Caller
 * frees *out with dw_free_string. */
DW_API dw_status dw_graph_print(dw_ctx *ctx, const dw_graph *g, char **out);

/* Trainable parameters, tied embeddings counted once. */
DW_API int64_t dw_graph_params(const dw_graph *g);
/* Training FLOPs (forward + backward) per token at the graph's sequence length, causal attention
 * counted as computed (docs/ir.md). */
DW_API double dw_graph_flops_per_token(const dw_graph *g);
/* The same in PaLM's model-FLOPs convention, the one MFU is quoted in (bench/train_anchor.py):
 * 6 per matmul weight element per token (the LM head included; no biases, no elementwise ops)
 * plus 12 x layers x heads x head_dim x T for attention (the full square). */
DW_API double dw_graph_model_flops_per_token(const dw_graph *g);
DW_API int dw_graph_node_count(const dw_graph *g);
DW_API int64_t dw_graph_seq(const dw_graph *g);
/* Sequences the graph's shapes are for, and the vocabulary (token embedding rows). */
DW_API int64_t dw_graph_batch(const dw_graph *g);
DW_API int64_t dw_graph_vocab(const dw_graph *g);
/* The model's Hugging Face model_type ("llama") and its config.json text as captured (NULL when the
 * graph was built without one); valid while g lives. */
DW_API const char *dw_graph_model_type(const dw_graph *g);
DW_API const char *dw_graph_config_json(const dw_graph *g);
/* Feed-forward graphs (what dw.optimize makes of an nn.Sequential of linears, activations and
 * norms): dw_graph_from_json of a document whose "roles" are {"input": NAME, "output": NAME}, an
 * f32 input tensor (B,T,C_in) in place of token ids and an f32 activation (B,T,C_out) in place of
 * logits, with no targets and no loss (docs/ir.md). Such a graph compiles like any other (a policy
 * sets its linears' recipes) and runs forward only, through dw_engine_forward_float. These give
 * C_in and C_out; 0 for a token graph. */
DW_API int64_t dw_graph_input_width(const dw_graph *g);
DW_API int64_t dw_graph_output_width(const dw_graph *g);

/* ======================================================================================
 * Precision policy                                           [section: precision]
 * ====================================================================================== */

/* A precision policy: default recipe, ordered rules on node names/op types, and a fallback for
 * nodes no rule names: "head" (the default) keeps the LM head in BF16, as torchao and torchtitan
 * do; "safe" also embeddings, MoE routers and the first and last block; "none" nothing. */
typedef struct dw_policy dw_policy;

/* Loads a policy JSON file: {"default":"fp8_block","fallback":"safe" (or "head", the default when
 * absent, or "none"),
 * "rules":[{"match":"*.self_attn.*","op":"linear","recipe":"bf16"}]}. Errors name the file and
 * the field (unknown recipe names list the known ones). */
DW_API dw_status dw_policy_load(dw_ctx *ctx, const char *path, dw_policy **out);
/* A policy with only a default recipe ("bf16", "fp8_block", "mxfp8", "nvfp4", ...); fallback
 * "safe" when fallback_safe, else "head". */
DW_API dw_status dw_policy_from_precision(dw_ctx *ctx, const char *recipe, bool fallback_safe,
                                   dw_policy **out);
/* Sets the fallback: "safe", "head" or "none" (the LM head quantised like the rest); anything
 * else is DW_ERR_INVALID. */
DW_API dw_status dw_policy_set_fallback(dw_ctx *ctx, dw_policy *p, const char *fallback);
/* The policy as JSON (the same schema); caller frees with dw_free_string. */
DW_API dw_status dw_policy_to_json(dw_ctx *ctx, const dw_policy *p, char **out);
DW_API void dw_policy_free(dw_policy *p);

/* ======================================================================================
 * GEMM layer and kernel registry                             [section: gemm]
 * ====================================================================================== */

/* One GEMM of a linear layer, D = epilogue(alpha * op(A) * op(B) + beta * C), row-major:
 *   op(A) [m, k], op(B) [k, n], C and D [m, n].
 * The three training GEMMs of y = x W^T (+ b), x [T, in], W [out, in]:
 *   fprop  y  [T, out] = x [T, in]      * W^T      (A = x,   B = W stored [out, in], trans_b)
 *   dgrad  dx [T, in]  = dy [T, out]    * W        (B = W^T's quantised copy [in, out], trans_b)
 *   wgrad  dW [out, in] = dy^T [out, T] * x        (A = dy^T's copy [out, T], B = x^T's copy [in, T])
 * Quantised operands are stored as FORMATS.md writes them: codes row-major [rows, cols], scales
 * along cols (the last dimension). Hopper FP8 (cuBLASLt and Deepwell's MXFP8 kernel) needs both
 * operands K-major: A stored [m, k] (trans = false) and B stored [n, k] (trans = true); the
 * quantiser's transposed copies exist for that. The CPU reference takes any layout. */
typedef enum { DW_GEMM_FPROP = 0, DW_GEMM_DGRAD, DW_GEMM_WGRAD } dw_gemm_pass;
typedef enum { DW_GEMM_OUT_F32 = 0, DW_GEMM_OUT_BF16 } dw_gemm_out_type;

/* Epilogue flags (combine with |). Applied in this order: + bias, save pre-activation, GELU.
 *   BIAS:     D[i, j] += bias[j]; bias [n] in the output type
 *   GELU:     GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
 *   GELU_AUX: with GELU, also write the pre-activation to aux [m, n] (output type)
 *   BGRAD:    bgrad[i] = sum_k op(A)[i, k], length m, output type (the bias gradient of wgrad,
 *             where op(A) = dy^T)
 *   DGELU:    D[i, j] *= GELU'(aux[i, j]) with aux [m, n] (output type) an input: the
 *             pre-activation GELU_AUX saved (the dgrad of the layer after a GELU then yields
 *             the gradient of the GELU's input). Alone: not with BIAS, GELU, GELU_AUX, BGRAD. */
enum { DW_EPI_BIAS = 1, DW_EPI_GELU = 2, DW_EPI_GELU_AUX = 4, DW_EPI_BGRAD = 8, DW_EPI_DGELU = 16 };

/* One operand: a stored matrix [rows, cols] in a recipe (a dw_recipe value: see FORMATS.md;
 * 0 = bf16), used as op(X) = trans ? X^T : X. */
typedef struct {
    int32_t recipe;       /* DW_RECIPE_* (bf16, fp8_tensor, fp8_row, fp8_block, fp8_block2d, mxfp8,
                             mxfp8_e5m2, mxfp4, nvfp4) */
    bool trans;           /* op(X) = X^T */
    int64_t rows, cols;   /* the stored matrix */
    const void *data;     /* BF16 values or element codes (FP4: two per byte, even column low) */
    const void *scales;   /* the recipe's scales, row-major and unswizzled (NULL for bf16) */
    float tensor_scale;   /* NVFP4's FP32 s_t; ignored otherwise */
    const float *tensor_scale_ptr; /* NVFP4: s_t read from memory (device pointer on CUDA) when the
                                      GEMM runs instead of tensor_scale, so a quantiser's output
                                      needs no host read-back (CUDA-graph safe); NULL: tensor_scale */
} dw_gemm_operand;

/* All pointers are device pointers on a CUDA context and host pointers on a CPU context. */
typedef struct {
    int32_t pass;         /* dw_gemm_pass: informational (logs, registry predicates) */
    int64_t m, n, k;
    dw_gemm_operand a, b;
    float alpha, beta;    /* beta != 0 needs c */
    const void *c;        /* [m, n] in out_type, or NULL */
    void *d;              /* [m, n] out_type */
    int32_t out_type;     /* dw_gemm_out_type */
    int32_t epilogue;     /* DW_EPI_* flags */
    const void *bias;     /* [n], out_type (DW_EPI_BIAS) */
    void *aux;            /* [m, n], out_type (DW_EPI_GELU_AUX) */
    void *bgrad;          /* [m], out_type (DW_EPI_BGRAD) */
    const char *backend;  /* NULL: the best eligible kernel; else a registered kernel's name */
} dw_gemm_args;

/* Runs the GEMM on the context's device (stream-ordered on CUDA; returns before the GPU is done)
 * with the kernel the registry selects. DW_ERR_UNSUPPORTED names every rejected candidate. */
DW_API dw_status dw_gemm(dw_ctx *ctx, const dw_gemm_args *args);

/* The kernel that dw_gemm would run (static name, valid while registered), or an error. */
DW_API dw_status dw_gemm_select(dw_ctx *ctx, const dw_gemm_args *args, const char **name);
/* A readable account of the selection: every registered kernel, eligible or not and why, and
 * the winner. Caller frees with dw_free_string. */
DW_API dw_status dw_gemm_explain(dw_ctx *ctx, const dw_gemm_args *args, char **out);

/* ---- kernel registry ----------------------------------------------------------------------
 * Entries: op, recipes, device and arch range, a shape/alignment predicate, a priority and the
 * function. Selection keeps the entries whose fields match and whose predicate accepts, then
 * takes the highest priority (ties: the earliest registered). The built-in kernels are registered
 * on first use (src/gemm/builtins.c lists them); users add theirs with dw_kernel_register. */
typedef enum {
    DW_KOP_GEMM = 0,      /* dense GEMMs (dw_gemm): dw_kernel_desc, dw_kernel_register */
    DW_KOP_GROUPED = 1    /* grouped expert GEMMs (dw_grouped_gemm): dw_grouped_kernel_desc,
                             dw_grouped_kernel_register (below) */
} dw_kernel_op;

/* Returns true when the kernel can run args; otherwise false and *why (static text). */
typedef bool (*dw_gemm_eligible_fn)(const dw_gemm_args *args, void *user, const char **why);
typedef dw_status (*dw_gemm_run_fn)(dw_ctx *ctx, const dw_gemm_args *args, void *user);

typedef struct {
    const char *name;     /* unique; copied by the registry */
    int32_t op;           /* dw_kernel_op */
    int32_t recipe_a;     /* DW_RECIPE_* of A, or -1 for any */
    int32_t recipe_b;     /* DW_RECIPE_* of B, or -1 for any */
    int32_t device;       /* DW_DEVICE_CPU or DW_DEVICE_CUDA */
    int32_t sm_min, sm_max; /* CUDA compute capability x10 (90 = sm_90), inclusive; 0,0 = any */
    int32_t priority;     /* higher wins */
    dw_gemm_eligible_fn eligible; /* NULL: always eligible */
    dw_gemm_run_fn run;
    void *user;           /* passed to eligible and run */
} dw_kernel_desc;

/* Adds (or, for an existing name, replaces) a kernel. DW_ERR_INVALID for a missing name or run,
 * DW_ERR_NOMEM when the table is full (256 entries). */
DW_API dw_status dw_kernel_register(const dw_kernel_desc *k);
/* Removes a kernel by name; false when none has that name. */
DW_API bool dw_kernel_unregister(const char *name);

/* Autotune cache (off by default; the environment variable DW_GEMM_AUTOTUNE=1 turns it on too).
 * When on, the first dw_gemm of a problem (device, m, n, k, recipes, layouts, output type,
 * epilogue) on a CUDA context with two or more eligible kernels and no forced backend times each
 * (it runs them on that call's buffers; skipped when beta != 0 and c == d) and remembers the
 * fastest for the process; dw_gemm_select and dw_gemm_explain report the remembered choice.
 * It picks by time only: on sm_90 the FP8-wgmma MXFP8 kernels (~1e-4 relative error) can then
 * replace the exact BF16 route (~1e-6) for small problems. */
DW_API void dw_gemm_set_autotune(bool on);

/* ---- grouped GEMMs: the registry's second kind (DW_KOP_GROUPED) -----------------------------
 * The expert GEMMs of a mixture-of-experts linear layer, one call for E problems over rows sorted
 * by expert; the group offsets live with the data (device memory on CUDA: no host read of the
 * counts, so a recorded step replays whatever the routing). Row-major:
 *   x [rows, k]: expert e's rows are [offsets[e], offsets[e+1]); W [experts, m, k]; y, dy [rows, m]
 *   fprop  y_e  = x_e W_e^T     out = y  [rows, m], rows past offsets[experts] set to 0
 *   dgrad  dx_e = dy_e W_e      out = dx [rows, k], rows past offsets[experts] set to 0
 *   wgrad  dW_e += dy_e^T x_e   out = dW [experts, m, k] FP32, accumulated (overwrite: written,
 *                               an expert without rows getting zeros)
 * The rows of x and dy past offsets[experts] must be finite (a tensor-core wgrad multiplies them
 * by zeros). Selection is as for dense GEMMs: the entries whose fields match and whose predicate
 * accepts, the highest priority winning (ties: the earliest registered); the built-ins (src/gemm/
 * grouped_kernels.c) are the CPU reference, CUDA FP32-FMA tiles, mma.sync (sm_80+) and TMA +
 * wgmma (sm_90). The compiler selects one per pass of every MoE linear layer (`deepwell compile
 * --explain` shows why) and the engine runs that one. */
typedef enum { DW_GROUPED_F32 = 0, DW_GROUPED_BF16 = 1 } dw_grouped_dtype;

/* All pointers are device pointers on a CUDA context and host pointers on a CPU context. */
typedef struct {
    int32_t pass;             /* dw_gemm_pass: DW_GEMM_FPROP, DW_GEMM_DGRAD or DW_GEMM_WGRAD */
    int32_t dtype;            /* dw_grouped_dtype of x, W, dy and y or dx (dW is FP32) */
    int32_t recipe;           /* DW_RECIPE_BF16: the operands are plain dtype values;
                                 DW_RECIPE_FP8_BLOCK, DW_RECIPE_MXFP8: E4M3 codes with the scales below */
    int64_t rows, experts, k, m; /* rows: the capacity of x, y, dy (offsets[experts] <= rows) */
    const void *x, *w, *dy;   /* x: fprop, wgrad; w: fprop, dgrad; dy: dgrad, wgrad (else NULL) */
    void *out;                /* y, dx or dW as the pass says */
    const int32_t *offsets;   /* [experts + 1]: 0, non-decreasing, at most rows */
    const char *backend;      /* NULL: the best eligible kernel; else a registered grouped kernel's name */
    /* recipe fp8_block: x [rows, k] and dy [rows, m] E4M3 with FP32 scales per 1x128 block of a
     * row (x_scales [rows, k/128], dy_scales [rows, m/128]); W E4M3 in 128x128 blocks per expert
     * with FP32 scales — fprop W [experts, m, k], w_scales [experts, m/128, k/128]; dgrad W^T's
     * copy [experts, k, m], w_scales [experts, k/128, m/128] (FORMATS.md's fp8_block and
     * fp8_block2d); out (y or dx) in dtype. wgrad reads dy^T and x^T in 1x128 blocks along each
     * expert's rows: x [k, P], x_scales [k, P/128], dy [m, P], dy_scales [m, P/128], expert e's
     * rows from column 128 * sum over e' < e of ceil(count_e' / 128) on, zero-padded to the next
     * multiple of 128, P = 128 * (rows/128 + experts) (src/gemm/grouped_fp8.h makes them); out dW
     * FP32. k and m multiples of 128. NULL for bf16.
     * recipe mxfp8: the scales are UE8M0 bytes (FORMATS.md's mxfp8), one per 1x32 block along
     * the reduction, passed through these pointers: x_scales [rows, k/32], fprop's w_scales
     * [experts, m, k/32]; dy_scales [rows, m/32], dgrad's W^T copy [experts, k, m] with w_scales
     * [experts, k, m/32]; wgrad as fp8_block's with each expert's rows padded to 32: x [k, P],
     * x_scales [k, P/32], dy [m, P], dy_scales [m, P/32], P = 32 * (rows/32 + experts); k and m
     * multiples of 32 (src/gemm/grouped_mxfp8.h makes them). */
    const float *x_scales, *w_scales, *dy_scales;
    /* wgrad: true writes dW_e = dy_e^T x_e over out (whatever it held, NaN included; zeros for an
     * expert without rows) instead of adding into it; false (a zeroed struct's) adds, as before.
     * A registered wgrad kernel must honour it. Ignored by fprop and dgrad. */
    bool overwrite;
} dw_grouped_args;

/* Runs one pass on the context's device (stream-ordered on CUDA) with the kernel the registry
 * selects. DW_ERR_INVALID for a malformed problem (named), DW_ERR_UNSUPPORTED naming every
 * rejected candidate when none is eligible. */
DW_API dw_status dw_grouped_gemm(dw_ctx *ctx, const dw_grouped_args *args);
/* The kernel dw_grouped_gemm would run (static name, valid while registered), or an error. */
DW_API dw_status dw_grouped_select(dw_ctx *ctx, const dw_grouped_args *args, const char **name);
/* Every registered grouped kernel, eligible or not and why, and the winner, for args on the
 * context's device. Caller frees with dw_free_string. */
DW_API dw_status dw_grouped_explain(dw_ctx *ctx, const dw_grouped_args *args, char **out);

/* Returns true when the kernel can run args; otherwise false and *why (static text). */
typedef bool (*dw_grouped_eligible_fn)(const dw_grouped_args *args, void *user, const char **why);
typedef dw_status (*dw_grouped_run_fn)(dw_ctx *ctx, const dw_grouped_args *args, void *user);
typedef struct {
    const char *name;     /* unique among grouped kernels; copied by the registry */
    int32_t dtype;        /* dw_grouped_dtype it takes, or -1 for any */
    int32_t recipe;       /* DW_RECIPE_* it takes, or -1 for any */
    int32_t device;       /* DW_DEVICE_CPU or DW_DEVICE_CUDA */
    int32_t sm_min, sm_max; /* CUDA compute capability x10, inclusive; sm_max 0: no upper bound */
    int32_t priority;     /* higher wins */
    dw_grouped_eligible_fn eligible; /* NULL: always eligible */
    dw_grouped_run_fn run;
    void *user;           /* passed to eligible and run */
} dw_grouped_kernel_desc;
/* Adds (or, for an existing name, replaces) a grouped kernel. DW_ERR_INVALID for a missing name
 * or run or a bad device, DW_ERR_NOMEM when the table is full (64 entries). Not thread-safe:
 * register before concurrent use. */
DW_API dw_status dw_grouped_kernel_register(const dw_grouped_kernel_desc *k);
/* Removes a grouped kernel by name; false when none has that name. */
DW_API bool dw_grouped_kernel_unregister(const char *name);

/* ======================================================================================
 * Compile: schedule, kernel binding, memory plan             [section: compile]
 * ====================================================================================== */

/* A compiled program: the one thing engines execute. Its steps (every node's forward, then the
 * backward in reverse, then the optimizer), the recipe and kernels of every node, and the static
 * memory plan (pools: weights, grads, optimizer, activations, workspace), for a target backend.
 * Planning only: compiling needs no GPU, and a CPU engine runs a program compiled for CUDA (as
 * its exact oracle: the same steps and recipes, the reference kernels). */
typedef struct dw_compiled dw_compiled;
/* A parallel plan (section [plan]). */
typedef struct dw_plan dw_plan;

typedef struct {
    size_t size;          /* sizeof(dw_compile_opts), set by dw_compile_opts_init */
    dw_device_kind device; /* the target: DW_DEVICE_AUTO (default) = the context's device */
    int sm;               /* CUDA target: compute capability x10 the kernels are chosen for; 0
                             (default) = the context's GPU, or 90 on a CPU context */
    bool fuse;            /* GELU into the neighbouring GEMMs' epilogues in BF16 programs (default
                             true; the environment variable DW_FUSE=0 makes the default false) */
    int recompute;        /* dw_recompute (section [plan]): DW_RECOMPUTE_NONE (default: the plan's,
                             when one is given); DW_RECOMPUTE_FULL — every transformer block keeps
                             only its input and runs its forward again just before its backward, so
                             the blocks' inner activations share the memory of one block, for about
                             a third more compute; DW_RECOMPUTE_SELECTIVE — every norm that feeds a
                             linear layer and every MLP activation runs again just before the
                             first backward reading its output instead of being kept: no GEMM or
                             attention runs twice. The same values bit for bit */
    int recompute_blocks; /* with FULL only (else DW_ERR_INVALID): only the first N blocks recompute
                             (0, default: all), for memory between the two at less extra compute */
    bool fused_head;      /* the LM head and the cross-entropy as one op that holds a chunk of rows'
                             logits at a time (never all B x T x V) and does their backward in the
                             training forward, when the head is a BF16 (or FP32-program) linear
                             without bias read by the loss alone. The program then has no logits
                             to read back: dw_engine_forward with logits is refused, so compile
                             without it to evaluate or sample with logits (default false; the
                             environment variable DW_FUSED_HEAD=1 makes it true; `deepwell train`
                             and `bench step` turn it on: --no-fused-head) */
    int64_t head_chunk;   /* fused_head: rows of logits per chunk (0, default: the compiler's, about
                             B T C / V rounded up to 256; DW_HEAD_CHUNK sets the default) */
    bool moe_remat;       /* a MoE layer's input norm, dispatch and expert SwiGLU run again in the
                             backward, just before their outputs' first reader, instead of keeping
                             those outputs from the forward: the same bits, no GEMM twice, less
                             activation memory (default true; the environment variable
                             DW_MOE_REMAT=0 makes the default false) */
    bool grad_arena;      /* the FP32 parameter gradients in the activation pool instead of a
                             standing gradient pool: each parameter's gradient is zeroed just
                             before its first backward writer and lives to the optimizer step, in
                             memory the forward's activations used, so the peak falls. For one
                             micro-batch per step and ZeRO 0/1: an engine refuses a second backward
                             (accumulation), or a forward, before dw_engine_step or
                             dw_engine_zero_grad, and ZeRO-2/3; the gradients read back right after
                             the backward or the step, until the next forward. The same losses and
                             weights bit for bit (default false; the environment variable
                             DW_GRAD_ARENA=1 makes the default true) */
    bool bf16_arena;      /* with grad_arena, in a BF16 program: the BF16 working copies of the
                             weights in the activation pool too, each live from the refresh after
                             the optimizer to its last reader in the backward, so that the
                             gradients born later reuse its memory. The engine converts them again
                             from the FP32 masters before a forward that follows a backward without
                             a step; the gradients are readable after the backward, not after the
                             step (its refresh writes copies over some). The same bits (default
                             false; the environment variable DW_BF16_ARENA=1 makes it true) */
    bool wcache_arena;    /* with bf16_arena: a MoE layer whose experts run fprop and dgrad in
                             fp8_block or mxfp8 keeps its cached FP8 weights (W and W^T codes, one
                             byte an element each) in the room of the BF16 copy those experts do not have,
                             instead of the workspace: the same span (refresh to the layer's
                             backward), the same bits, the cache's memory saved (moe-e64: 4.5 GiB).
                             A backward without a step makes them again before the next forward,
                             as the copies (default true; the environment variable
                             DW_WCACHE_ARENA=0 makes the default false) */
} dw_compile_opts;
DW_API void dw_compile_opts_init(dw_compile_opts *o, size_t size);
/* The arenas a training run gets by default: where it runs one micro-batch per optimizer step on
 * each rank (grad_accum 1) under ZeRO stage 0 or 1 — what an engine of a grad_arena program allows
 * — sets o->grad_arena and o->bf16_arena true, each unless its environment variable is 0
 * (DW_GRAD_ARENA=0, DW_BF16_ARENA=0), and returns true; otherwise leaves o as it is and returns
 * false. The caller then reads no gradient after the step. `deepwell train`, `bench step`,
 * `dryrun --run` and the planner's memory (dw_plan_get_engine_memory) follow it. */
DW_API bool dw_compile_opts_train_arenas(dw_compile_opts *o, int64_t grad_accum, int zero);

/* Compiles g (which must outlive the result) for batches up to g's batch x seq. plan: NULL (one
 * device) or a plan (dw_autoplan, dw_plan_single, dw_plan_load) of world size 1 without
 * recompute, ZeRO or offload whose micro-batch x seq fits g's batch x seq (DW_ERR_INVALID
 * otherwise); a multi-rank plan is refused with DW_ERR_UNSUPPORTED until the multi-GPU runtime
 * exists. policy: NULL = FP32 mode (FP32 activations, each backend's
 * FP32 reference linear: parity with PyTorch in FP32); else BF16 activations and each linear
 * node's recipe from the policy. opts may be NULL (defaults). An op the target backend lacks is
 * refused with DW_ERR_UNSUPPORTED naming the op, the node and the backend. *out is NULL on error. */
DW_API dw_status dw_compile(dw_ctx *ctx, const dw_graph *g, const dw_plan *plan, const dw_policy *policy,
                            const dw_compile_opts *opts, dw_compiled **out);
DW_API void dw_compiled_free(dw_compiled *c);
/* Planned bytes of pool 0 weights, 1 grads, 2 optimizer, 3 activations, 4 workspace (0 for
 * other values). */
DW_API int64_t dw_compiled_pool_bytes(const dw_compiled *c, int pool);
/* Rows of logits the fused LM head holds at a time (dw_compile_opts.fused_head); 0 when the
 * program keeps the head and the loss apart (not asked, or the head is quantised, biased, or read
 * by more than the loss). */
DW_API int64_t dw_compiled_head_chunk(const dw_compiled *c);
/* The readable report: per node the recipe and why, the kernel and why; per pool the planned
 * bytes; the activation arena's peak. Caller frees with dw_free_string. */
DW_API dw_status dw_compiled_report(dw_ctx *ctx, const dw_compiled *c, char **out);
/* Why each MoE linear layer runs the grouped kernels it does: per layer and pass (fprop, dgrad,
 * wgrad) the problem on the target, every registered grouped kernel, eligible or rejected and why,
 * and the one selected (`deepwell compile --explain`). A program without MoE layers says so.
 * Caller frees with dw_free_string. */
DW_API dw_status dw_compiled_explain(dw_ctx *ctx, const dw_compiled *c, char **out);

/* ======================================================================================
 * Engine: a compiled program on a device                     [section: engine]
 * ====================================================================================== */

/* An engine executes a dw_compiled on its context's device: the CPU (the exact reference backend,
 * which runs any program, including one compiled for CUDA, with the same steps and recipes) or
 * one CUDA GPU. It owns the program's pools (weights, gradients, optimizer state, activations,
 * workspace), allocated once at creation; no step allocates. Belongs to its context's thread. */
typedef struct dw_engine dw_engine;

typedef struct {
    size_t size;       /* sizeof(dw_engine_opts), set by dw_engine_opts_init */
    bool record;       /* replay recorded steps (CUDA graphs) from a shape's second call (default
                          true; the environment variable DW_CUDA_GRAPH=0 makes the default false) */
    bool quant_reuse;  /* quantised layers reading the same x (q/k/v, gate/up) quantise it once
                          per sweep (default true; DW_QUANT_REUSE=0 makes the default false) */
    int zero;          /* the ZeRO stage dw_train will run this engine under (dw_train_opts.zero;
                          default 0). In a job of several ranks (dw_dist_env_get) the engine then
                          allocates only this rank's shard of the AdamW moments (1 and up), of the
                          FP32 gradients (2 and 3, staged through buckets by dw_train) and of the
                          FP32 masters (3, with no BF16 copies: dw_train gathers each parameter
                          around its use), never the whole pools, so a model that fits only sharded
                          can start; dw_engine_init_weights and dw_engine_load_weights then fill the
                          shard alone (every rank must use the same seed or file); its own
                          dw_engine_step, backward, parameter access and whole-optimizer save are
                          refused, dw_train with a lower stage too. One rank: ignored */
} dw_engine_opts;
DW_API void dw_engine_opts_init(dw_engine_opts *o, size_t size);

/* Creates an engine for c on ctx's device; c (and its graph) must outlive it. Parameters start
 * at zero: call dw_engine_init_weights or dw_engine_load_weights. Refuses (DW_ERR_UNSUPPORTED) a
 * program that needs an op the backend lacks, naming the op (a CUDA program on a CPU engine, whose
 * ops the CPU may lack), and a CUDA engine for a program compiled for another target. opts may be
 * NULL. *out is NULL on error. */
DW_API dw_status dw_engine_create(dw_ctx *ctx, const dw_compiled *c, const dw_engine_opts *opts, dw_engine **out);
DW_API void dw_engine_free(dw_engine *e);
/* The program and graph it runs (valid while it lives). */
DW_API const dw_compiled *dw_engine_program(const dw_engine *e);
DW_API const dw_graph *dw_engine_graph(const dw_engine *e);
/* "cpu" or "cuda". */
DW_API const char *dw_engine_backend(const dw_engine *e);

/* Initialises the parameters as the architecture's reference implementation does (normal(0,
 * std) matrices, GPT-2's scaled residual projections, ones/zeros for norms and biases),
 * deterministically from seed (the same values on every backend). */
DW_API dw_status dw_engine_init_weights(dw_engine *e, uint64_t seed);
/* Hugging Face safetensors with the model's tensor names and layouts: path is a .safetensors
 * file, or a directory with model.safetensors or a sharded model.safetensors.index.json. Loading
 * checks every tensor (present, shape, floating dtype, nothing unexpected) before changing any;
 * errors name the file and tensor. Mixture-of-experts weights load from either layout below (one
 * per file; both mixed are refused). Saving writes FP32 atomically (path: a file, or a directory
 * that gets model.safetensors), in the layout the weights were loaded in (fused when none). */
typedef enum {
    DW_WEIGHTS_LAYOUT_AS_LOADED = 0,
    DW_WEIGHTS_LAYOUT_FUSED,       /* transformers 5: mlp.experts.gate_up_proj [E,2F,C], down_proj [E,C,F] */
    DW_WEIGHTS_LAYOUT_PER_EXPERT,  /* block_sparse_moe.experts.{e}.w1/w3 [F,C], w2 [C,F], router .gate */
} dw_weights_layout;
DW_API dw_status dw_engine_load_weights(dw_engine *e, const char *path);
DW_API dw_status dw_engine_save_weights(dw_engine *e, const char *path);
/* The same in a chosen layout (dense models: the same file either way). */
DW_API dw_status dw_engine_save_weights_layout(dw_engine *e, const char *path, dw_weights_layout layout);
/* The AdamW moments as NAME.exp_avg and NAME.exp_avg_sq (FP32, Deepwell's layout) in one
 * safetensors file; loading checks every tensor before changing any. */
DW_API dw_status dw_engine_save_optimizer(dw_engine *e, const char *path);
DW_API dw_status dw_engine_load_optimizer(dw_engine *e, const char *path);

/* Forward on B x T tokens (int32, row-major; B and T at most the program's). targets (may be
 * NULL) below 0 are ignored; *loss (may be NULL) gets the mean cross-entropy; logits (may be
 * NULL) gets (B,T,V) FP32. Tokens and targets outside the vocabulary are refused. A mixture of
 * experts trained with transformers' load-balancing loss (config output_router_logits) adds it:
 * the loss is cross-entropy + router_aux_loss_coef x that loss (+ router_z_loss_coef x the router
 * z-loss when configured; dw_engine_moe_stats tells both). */
DW_API dw_status dw_engine_forward(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                                   float *logits, double *loss);
/* Forward and backward: gradients of loss * grad_scale are ADDED to the parameters' gradients
 * (grad_scale = 1 / accumulation steps). *loss (may be NULL: then nothing waits for the device)
 * gets the mean cross-entropy (+ the load-balancing loss, as dw_engine_forward). */
DW_API dw_status dw_engine_forward_backward(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B,
                                            int64_t T, double grad_scale, double *loss);
/* Forward of a feed-forward graph's engine on float activations: x (B,T,C_in) FP32 row-major, B
 * and T at most the graph's batch and seq, C_in = dw_graph_input_width -> y (B,T,C_out) FP32, C_out
 * = dw_graph_output_width. A BF16 program (compiled with a policy) rounds x to BF16 on the way in,
 * as it keeps every activation, and widens y from BF16. DW_ERR_INVALID for NULL x or y or B, T out
 * of range; DW_ERR_UNSUPPORTED for an engine of a token graph (that takes dw_engine_forward, as a
 * feed-forward engine refuses dw_engine_forward and dw_engine_forward_backward). Waits for the
 * device. Allocates a host buffer of B x T x C_in BF16 codes per call in BF16 programs. */
DW_API dw_status dw_engine_forward_float(dw_engine *e, const float *x, int64_t B, int64_t T, float *y);
DW_API dw_status dw_engine_zero_grad(dw_engine *e);
/* Experts the router losses of this engine's model count (0: the model has no router loss). */
DW_API int64_t dw_engine_moe_experts(const dw_engine *e);
/* The last forward's router losses, each already part of the loss: *aux_loss router_aux_loss_coef x
 * transformers' load_balancing_loss_func (NaN without output_router_logits), *z_loss
 * router_z_loss_coef x the router z-loss (NaN without it); counts (dw_engine_moe_experts entries) the
 * (token, k) assignments each expert received, summed over the MoE layers. Any pointer may be
 * NULL. Waits for the device. DW_ERR_UNSUPPORTED when the model has no router loss. */
DW_API dw_status dw_engine_moe_stats(dw_engine *e, double *aux_loss, double *z_loss, int64_t *counts);
/* The MoE layers' routing counters: running totals over the training forwards (those of
 * dw_engine_forward_backward; not dw_engine_forward's) since the engine was made. Per MoE layer
 * (its dispatch, in graph order): the (token, k) assignments, those dropped past an expert's
 * capacity, then the router's choices per expert (before dropping). *layers and *experts (either
 * may be NULL) say how many; counts, when not NULL, gets layers x (2 + experts) values. A model
 * without MoE layers has 0 layers. Waits for the device. */
DW_API dw_status dw_engine_moe_counts(dw_engine *e, int64_t *layers, int64_t *experts, int64_t *counts);

typedef struct {
    size_t size;            /* sizeof(dw_adamw_opts), set by dw_adamw_opts_init */
    double lr;              /* default 1e-3 */
    double beta1, beta2;    /* 0.9, 0.95 */
    double eps;             /* 1e-8 */
    double weight_decay;    /* 0.1, on matrices only (the graph's decay flag) */
    double clip;            /* global gradient-norm clipping, 1.0; 0 disables */
} dw_adamw_opts;
DW_API void dw_adamw_opts_init(dw_adamw_opts *o, size_t size);
/* One AdamW step number `step` (1-based: bias correction 1 - beta^step) over every parameter:
 * norm = global L2 norm of the gradients (*grad_norm, before clipping); gradients scaled by
 * clip / (norm + 1e-6) when clip > 0 and norm > clip; p -= lr * wd * p for decay parameters;
 * m, v updated; p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps). A non-finite norm
 * leaves every parameter and moment unchanged and returns DW_ERR_NUMERIC. */
DW_API dw_status dw_engine_step(dw_engine *e, const dw_adamw_opts *o, int64_t step, double *grad_norm);

/* Parameters, in the graph's order (tied embeddings once): name (static while e lives), shape
 * (returns ndim, shape in Deepwell's layout: linear weights out x in), and their FP32 values and
 * gradients copied out (numel floats) or in (writing refreshes the BF16 and quantised copies). */
DW_API int dw_engine_param_count(const dw_engine *e);
DW_API const char *dw_engine_param_name(const dw_engine *e, int i);
DW_API int dw_engine_param_shape(const dw_engine *e, int i, int64_t shape[4]);
DW_API dw_status dw_engine_param_read(dw_engine *e, int i, float *values);
DW_API dw_status dw_engine_param_write(dw_engine *e, int i, const float *values);
DW_API dw_status dw_engine_grad_read(dw_engine *e, int i, float *grads);

/* ======================================================================================
 * Autoplan and dryrun                                        [section: plan]
 * ====================================================================================== */

/* ---- models the planner (and capture) read: presets and Hugging Face config.json ----------
 * Declared here for the CLI; they describe capture's model configs (see [section: ir]). */

/* Number of model presets and the i-th preset's name (static storage; NULL out of range). */
DW_API int dw_model_preset_count(void);
DW_API const char *dw_model_preset_name(int i);

/* A model's architecture as the planner and capture see it (a result struct: set size first). */
typedef struct {
    size_t size;
    char model_type[32];   /* as in config.json: "gpt2", "llama", "mixtral", ... */
    int64_t vocab_size, d_model, n_layers, n_heads, n_kv_heads, head_dim, d_ff, max_seq;
    int64_t n_experts, top_k; /* 0 experts: dense */
    int64_t params;        /* trainable parameters, tied embeddings counted once (closed form) */
    bool planning_only;    /* a shape for the planner; capture and training refuse it */
} dw_model_info;
/* The architecture of `model`: a preset name, a directory holding config.json, or a path to a
 * config.json. Errors name the file and field; DW_ERR_INVALID for an unknown preset (the message
 * lists the presets) or NULL arguments. */
DW_API dw_status dw_model_info_load(dw_ctx *ctx, const char *model, dw_model_info *out);

/* Whether the planner models `recipe` (a dw_recipe): bf16, fp8_block, mxfp8 and nvfp4 (its GEMM
 * rates, memory, and the CUDA engine's policy); the others are refused by dw_autoplan. */
DW_API bool dw_plan_supports_recipe(int32_t recipe);

/* A training job for the planner (options struct: dw_plan_job_init sets size and defaults). */
typedef struct {
    size_t size;
    int64_t seq;            /* tokens per sequence (required: >= 1) */
    int64_t global_batch;   /* sequences per optimizer step (required: >= 1) */
    int32_t recipe;         /* dw_recipe of the GEMMs (dw_plan_supports_recipe); default bf16 */
    int64_t moe_experts, moe_top_k; /* 0: the model config's (default) */
    double moe_capacity;    /* in (0, 64]: below 1 each expert keeps that share of its assignments,
                               at 1 and above it computes its padded capacity; 0: the config's
                               capacity_factor, else 1.0 (default) */
    double mem_headroom;    /* fraction of HBM kept free, below 0.9; 0: 0.10 (default) */
    const char *gemm_rates; /* measured GEMM rates, a `deepwell bench gemm --json` file
                               ({"results":[{m,n,k,recipe,tflops}]}), replacing the analytical
                               curve where it has points; NULL: none (default) */
    int top_k;              /* candidates dw_autoplan_search keeps, 1..100000; default 5 */
} dw_plan_job;
DW_API void dw_plan_job_init(dw_plan_job *job, size_t size);

/* Activation recompute of a plan. */
typedef enum { DW_RECOMPUTE_NONE = 0, DW_RECOMPUTE_SELECTIVE, DW_RECOMPUTE_FULL, DW_RECOMPUTE_COUNT } dw_recompute;
/* "none", "selective", "full" (static storage; "?" out of range). */
DW_API const char *dw_recompute_name(dw_recompute r);

/* One parallel plan: a layout (the degrees, micro-batch, recompute, ZeRO, offload) for a model,
 * a machine and a job, with the planner's predictions (memory per GPU, step time) and its checks.
 * Immutable once made: reading it from several threads is safe; the calls that take a ctx use
 * that ctx's thread. Free with dw_plan_free. */
typedef struct dw_plan dw_plan;
/* The record of a search: its candidates, best first, and why the other configurations were
 * rejected. Immutable; free with dw_plan_set_free. */
typedef struct dw_plan_set dw_plan_set;

/* Searches parallel plans (DP/TP/PP/CP/EP degrees, micro-batch, pipeline schedule, recompute,
 * ZeRO stage, offload) for training `model` (a preset name or a directory with config.json; see
 * dw_model_info_load) on `hw` (copied: it may be freed after the call) and keeps job->top_k
 * candidates. Analytical: runs no kernel and needs no GPU. Nothing fitting is not an error here:
 * the set then has no candidate and its rejections say why. Errors: DW_ERR_INVALID for a bad job
 * (the message names the field), an unknown model, a machine without GPUs or without the rates
 * planning needs; DW_ERR_UNSUPPORTED for a recipe the GPUs lack; DW_ERR_IO / DW_ERR_FORMAT for
 * the gemm_rates file. *out is NULL on error. */
DW_API dw_status dw_autoplan_search(dw_ctx *ctx, const char *model, const dw_hw *hw, const dw_plan_job *job,
                                    dw_plan_set **out);
/* The best plan of dw_autoplan_search; DW_ERR_UNSUPPORTED ("no configuration fits", with the
 * number searched) when nothing fits. */
DW_API dw_status dw_autoplan(dw_ctx *ctx, const char *model, const dw_hw *hw, const dw_plan_job *job,
                             dw_plan **out);
/* dw_autoplan_search's set as the `deepwell plan --json` document (schema: docs/planner.md),
 * compact, keeping `top_k` candidates (overrides job->top_k); "best" is null when nothing fits.
 * *json_out is caller-owned (dw_free_string); NULL on error. */
DW_API dw_status dw_autoplan_json(dw_ctx *ctx, const char *model, const dw_hw *hw, const dw_plan_job *job,
                                  int top_k, char **json_out);

DW_API void dw_plan_set_free(dw_plan_set *s);
/* Candidates kept, best (fastest predicted step) first; 0 when nothing fits. */
DW_API int dw_plan_set_count(const dw_plan_set *s);
/* Candidate i (0 = best) as a plan of its own (caller dw_plan_free). DW_ERR_INVALID for i out
 * of range. */
DW_API dw_status dw_plan_set_get(dw_ctx *ctx, const dw_plan_set *s, int i, dw_plan **out);
/* Configurations the search considered, and of those the ones that passed every constraint
 * (either pointer may be NULL). */
DW_API void dw_plan_set_stats(const dw_plan_set *s, int64_t *evaluated, int64_t *feasible);
/* The `deepwell plan --json` document of the set (indented when pretty); dw_free_string. */
DW_API dw_status dw_plan_set_to_json(dw_ctx *ctx, const dw_plan_set *s, bool pretty, char **out);

/* Rejection reasons, 0 <= reason < dw_plan_reject_reasons(): their names
 * ("heads_not_divisible_by_tp", "memory_exceeds_hbm_minus_headroom", ...; static storage, NULL
 * out of range), how many configurations each rejected in a search, and up to three examples
 * ("dp8 tp16 ...: tp 16 > NVLink domain 8"; valid while s lives; NULL out of range). */
DW_API int dw_plan_reject_reasons(void);
DW_API const char *dw_plan_reject_name(int reason);
DW_API int64_t dw_plan_set_rejected(const dw_plan_set *s, int reason, int *examples);
DW_API const char *dw_plan_set_reject_example(const dw_plan_set *s, int reason, int i);
/* Families of configurations (`deepwell plan --explain`): "no pipeline (pp 1)", "pipeline,
 * DualPipe", "expert parallel (ep > 1)", "ZeRO-3 (FSDP)", ...; a configuration belongs to every
 * family whose feature it has. 0 <= family < dw_plan_families(). */
DW_API int dw_plan_families(void);
/* A family's account in a search (a result struct: set size first). */
typedef struct {
    size_t size;
    const char *name;           /* static storage */
    int64_t feasible;           /* members that passed every constraint and fit in memory */
    int64_t rejected;           /* members a constraint ruled out (memory included) */
    int main_reason;            /* the reason that ruled out most of them (-1: none) */
    int64_t main_reason_count;
    int kept;                   /* the set's index of its fastest kept plan (0: the best), -1 none */
    bool simulated;             /* a member was simulated: best_step is exact */
    double best_step;           /* its fastest simulated member's step, seconds (0: none) */
    const char *best_summary;   /* that member ("" for none; valid while the set lives) */
    double lower_bound;         /* the smallest lower bound (busiest stage, no bubble) of members
                                   pruned without simulation, seconds (0: none) */
    int largest_term;           /* of the fastest member's step split (dw_plan_time_split order:
                                   0 compute .. 7 optimizer), the term most above the best plan's
                                   (-1: no member simulated or no best plan) */
    double largest_excess;      /* that term's excess, seconds */
} dw_plan_family_info;
/* DW_ERR_INVALID for a family out of range or a NULL argument. */
DW_API dw_status dw_plan_set_get_family(const dw_plan_set *s, int family, dw_plan_family_info *out);

/* A one-GPU plan without the planner: dp = tp = pp = cp = ep = vpp = 1, no recompute, ZeRO or
 * offload, global batch = micro_batch (one micro-batch per step), bf16. It carries no model or
 * machine, so it has a layout but no predictions or checks (those getters refuse it).
 * DW_ERR_INVALID for micro_batch or seq < 1. */
DW_API dw_status dw_plan_single(dw_ctx *ctx, int64_t micro_batch, int64_t seq, dw_plan **out);
/* A plan read from JSON: a `deepwell plan --json` document (its "best") or one plan object
 * ({"parallel":{dp,tp,pp,ep,cp}, "micro_batch", "grad_accum", "virtual_stages", "recompute",
 * "zero", "offload"}; only "parallel" is required; a missing grad_accum is global_batch /
 * (dp x micro_batch) when that divides), checked and predicted for model, hw and job as
 * dw_autoplan_search would. `what` names the text in messages (may be NULL). A plan that breaks
 * constraints is still made (dw_plan_get_checks says which); DW_ERR_FORMAT for malformed JSON or
 * fields (the message names the field), and dw_autoplan_search's errors. */
DW_API dw_status dw_plan_from_json(dw_ctx *ctx, const char *text, size_t len, const char *what, const char *model,
                                   const dw_hw *hw, const dw_plan_job *job, dw_plan **out);
/* Same from a file (DW_ERR_IO naming it when unreadable). */
DW_API dw_status dw_plan_load(dw_ctx *ctx, const char *path, const char *model, const dw_hw *hw,
                              const dw_plan_job *job, dw_plan **out);
/* The plan as one JSON object: "summary", the layout fields dw_plan_from_json reads, the
 * predictions when it has them ("step_time_s", "tokens_per_s", "mfu", "hfu",
 * "peak_memory_bytes", "memory", "time") and "job" {seq, global_batch, precision}. */
DW_API dw_status dw_plan_to_json(dw_ctx *ctx, const dw_plan *p, bool pretty, char **out);
DW_API void dw_plan_free(dw_plan *p);

/* The layout the compiler reads (a result struct: set size first). */
typedef struct {
    size_t size;
    int dp, tp, pp, cp, ep;   /* data, tensor, pipeline, context, expert parallel degrees; EP
                                 splits the DP ranks' experts (ep divides dp) */
    int vpp;                  /* virtual stages per pipeline rank (1: plain 1F1B, else interleaved) */
    int zero;                 /* ZeRO stage 0..3 (3 = FSDP) */
    int recompute;            /* dw_recompute: 0 none */
    bool offload;             /* optimizer state and step on the host */
    int64_t micro_batch;      /* sequences per micro-batch per DP rank; micro-batches per step per
                                 DP rank = global_batch / (dp x micro_batch) */
    int64_t seq, global_batch;
    int32_t recipe;           /* dw_recipe of the GEMMs */
    int etp;                  /* expert tensor parallel: ranks splitting each expert, tp or 1
                                 (MoE parallel folding: the EP group then spans the TP ranks) */
    bool a2a_overlap;         /* EP all-to-all of one micro-batch hidden under another's compute */
    int64_t grad_accum;       /* micro-batches per step per DP rank */
} dw_plan_layout;
DW_API dw_status dw_plan_get_layout(const dw_plan *p, dw_plan_layout *out);
/* GPUs the plan runs on: dp x tp x pp x cp (0 for NULL). */
DW_API int dw_plan_world_size(const dw_plan *p);
/* "dp8 tp8 pp16 v1 cp1 ep1 mb1 ga16 1f1b rc=none zero1" (valid while p lives; "" for NULL). */
DW_API const char *dw_plan_summary(const dw_plan *p);
/* The pipeline schedule: "1f1b", "interleaved_1f1b" or "dualpipe" (static storage). */
DW_API const char *dw_plan_schedule(const dw_plan *p);
/* The plan's layer layout: pp x vpp model stages, stage i in the order of the layer stack (0
 * holds the embedding). Uneven layouts show here: the first and last stage may hold fewer
 * blocks, and dense blocks keep their place in the stack (DeepSeek-V3's first 3). Rank r holds
 * stages r, r + pp, ... (its chunks); under DualPipe rank r holds stage r and, as its chunk 1, a
 * copy of stage pp-1-r. 0 for NULL or a plan without a model (dw_plan_single). */
DW_API int dw_plan_stage_count(const dw_plan *p);
/* One model stage of the layout (a result struct: set size first). */
typedef struct {
    size_t size;
    int rank, chunk;            /* the pipeline rank holding it, and which of its chunks (DualPipe:
                                   the chunk-0 holder; rank pp-1-rank holds the copy) */
    int64_t first_layer;        /* its first block's index in the model's stack */
    int64_t layers;             /* transformer blocks, of which: */
    int64_t dense_layers, moe_layers;
    int64_t mtp;                /* multi-token-prediction modules (the last stage) */
    bool embedding, lm_head;    /* the embedding (first stage), final norm + LM head (last) */
} dw_plan_stage;
/* DW_ERR_INVALID for i out of [0, dw_plan_stage_count) or a plan without a model. */
DW_API dw_status dw_plan_get_stage(const dw_plan *p, int i, dw_plan_stage *out);

/* What a plan was made for (a result struct: set size first). Strings are valid while p lives
 * (NULL for a plan from dw_plan_single, whose numbers beyond the job are 0). */
typedef struct {
    size_t size;
    const char *model;          /* as given */
    const char *model_type;     /* "llama", ... */
    double params;              /* trainable parameters, tied embeddings once */
    double model_flops_per_token; /* 6 x active matmul params + attention (the MFU numerator) */
    int64_t experts, top_k;     /* effective MoE (0 experts: dense) */
    double moe_capacity;
    const char *gpu;            /* GPU 0's name */
    const char *hw_source;      /* "probe", "preset" or "file" */
    int nodes, gpus_per_node, nvlink_domain;
    int64_t gpus;               /* nodes x GPUs per node */
    int64_t seq, global_batch;
    int32_t recipe;             /* dw_recipe */
    double mem_headroom;        /* the fraction of HBM kept free */
    double peak_flops;          /* dense datasheet FLOP/s per GPU of the recipe's GEMMs: the MFU basis */
    bool engine;                /* one GPU and a model Deepwell's CUDA engine builds: planned for
                                   the engine (its compiled memory, its kernel rates) */
} dw_plan_info;
DW_API dw_status dw_plan_get_info(const dw_plan *p, dw_plan_info *out);
/* The same for the set's model, machine and job (a set that kept no plan has one too). */
DW_API dw_status dw_plan_set_get_info(const dw_plan_set *s, dw_plan_info *out);

/* Predicted memory per GPU on the plan's worst pipeline stage, in bytes (a result struct). */
typedef struct {
    size_t size;
    double weights, grads, optimizer, activations, workspace, scales;
    double total;               /* the sum of the above and ep_buffers */
    double hbm, limit;          /* HBM per GPU, and (1 - headroom) x HBM */
    int worst_stage;            /* the pipeline stage of the peak */
    double inflight;            /* micro-batches whose activations that stage holds at the peak */
    double ep_buffers;          /* expert parallelism (ep > 1): the runtime's buffers for the group's
                                   rows, sized for every routed row of the group on one rank; 0 else */
} dw_plan_mem;
/* Predicted time of one optimizer step, in seconds (a result struct). Communication figures are
 * the parts the schedule cannot hide, on the slowest stage. */
typedef struct {
    size_t size;
    double step;                /* predicted seconds per optimizer step */
    double pipeline;            /* simulated pipeline makespan (compute, TP/CP/EP, p2p, bubbles) */
    double compute;             /* busy time of the slowest stage (no bubbles) */
    double bubble_frac;         /* idle fraction of that stage inside `pipeline` */
    double tp_comm, cp_comm, ep_comm, pp_comm;
    double dp_comm, dp_exposed; /* DP/ZeRO traffic time, and the part not hidden by backward */
    double optimizer;           /* the optimizer step (GPU, or host when offloaded) */
    double tokens_per_s, mfu, hfu; /* against dw_plan_info.peak_flops */
    double model_flops;         /* per step, whole machine (the MFU numerator, PaLM convention) */
} dw_plan_cost;
/* DW_ERR_INVALID (message in dw_errmsg(NULL)) for a plan without predictions: one from
 * dw_plan_single, or one whose constraints fail (see dw_plan_get_checks). */
DW_API dw_status dw_plan_get_memory(const dw_plan *p, dw_plan_mem *out);
DW_API dw_status dw_plan_get_cost(const dw_plan *p, dw_plan_cost *out);
/* The same memory for pipeline rank `rank` (0 <= rank < pp; worst_stage holds rank). */
DW_API dw_status dw_plan_get_rank_memory(const dw_plan *p, int rank, dw_plan_mem *out);
/* The predicted step split into terms that add up to dw_plan_cost.step, on the slowest pipeline
 * rank (a result struct; `deepwell plan --explain`). */
typedef struct {
    size_t size;
    double compute;             /* busy time less the communication and recomputation in it */
    double tp_exposed, cp_exposed, ep_exposed; /* communication the schedule does not hide */
    double recompute;           /* recomputation in the backward */
    double bubble;              /* pipeline idle time and p2p waits (makespan - busy) */
    double dp_exposed;          /* DP/ZeRO traffic not hidden by the backward */
    double optimizer;           /* the optimizer step */
    double ep_hidden;           /* all-to-all hidden under other compute (not part of the step) */
} dw_plan_time_split;
DW_API dw_status dw_plan_get_time_split(const dw_plan *p, dw_plan_time_split *out);

/* `deepwell dryrun`'s checks of a plan, re-derived independently of the search (a result
 * struct). The memory, overlap and bubble checks are made only for a well-formed plan. */
typedef struct {
    size_t size;
    int violations;             /* structural constraints broken (divisibility, NVLink domain,
                                   schedule, ZeRO, engine limits); memory not counted */
    const char *why;            /* one line per violation ("tp: tp 16 exceeds the NVLink domain
                                   8\n"); "" when none; valid while the plan lives */
    bool constraints_ok;        /* violations == 0: well-formed */
    bool memory_ok;             /* peak memory per GPU within HBM minus the headroom */
    double overlap;             /* non-overlapped communication / step time */
    bool overlap_ok;            /* overlap <= 0.5 */
    bool bubble_ok;             /* pipeline idle fraction <= 0.5 */
} dw_plan_checks;
/* DW_ERR_INVALID (dw_errmsg(NULL)) for a plan from dw_plan_single. */
DW_API dw_status dw_plan_get_checks(const dw_plan *p, dw_plan_checks *out);

/* Whether Deepwell's CUDA engine runs the plan as it is: one GPU (every degree 1), no
 * recompute, ZeRO or offload, and a model the engine builds (dense gpt2/llama/mistral/qwen2).
 * Otherwise false with the first reason in *why (valid while p lives; why may be NULL). */
DW_API bool dw_plan_runs_on_engine(const dw_plan *p, const char **why);
/* The precision policy the engine runs the plan's recipe with: bf16, or a quantised recipe with
 * the safe fallback (embedding, LM head, first and last block in BF16), as the cost model
 * assumes. Caller dw_policy_free. */
DW_API dw_status dw_plan_engine_policy(dw_ctx *ctx, const dw_plan *p, dw_policy **out);
/* The engine's device memory for the plan's micro-batch on one GPU, in bytes (a result struct):
 * the five pools of its compiled memory plan, the GEMM layer's cuBLASLt workspace, cuDNN
 * attention's buffers and a CUDA-context allowance. Captures and compiles; needs no GPU. */
typedef struct {
    size_t size;
    int64_t pool[5];            /* weights, grads, optimizer, activations, workspace */
    int64_t cublaslt;           /* the GEMM layer's workspace */
    int64_t attention;          /* cuDNN attention's buffers for the model's attention shape */
    int64_t context;            /* CUDA context and kernel images (an allowance) */
    int64_t total;              /* all of the above */
} dw_plan_engine_mem;
/* The engine's time, in seconds (a result struct): each linear node's three GEMMs at their
 * shapes and recipes, quantisation, attention at the engine kernel's rate, other kernels by
 * the bytes they move, launch overheads and AdamW (docs/planner.md, "Deepwell's engine"); the
 * launches as the runtime issues them for the plan: replayed in a CUDA graph on one GPU, eager
 * on several (their collectives run between the steps). */
typedef struct {
    size_t size;
    double fwd, bwd;            /* per micro-batch */
    double gemm, attn, mem;     /* of fwd + bwd: GEMMs, attention, memory-bound kernels */
    double overhead;            /* of fwd + bwd: launches and per-micro-batch costs */
    double launches;            /* kernel launches per micro-batch */
    double optimizer;           /* AdamW, once per step */
    double flops;               /* executed per micro-batch */
} dw_plan_engine_cost;
/* DW_ERR_UNSUPPORTED (the reason of dw_plan_runs_on_engine) for a plan the engine does not run. */
DW_API dw_status dw_plan_get_engine_memory(dw_ctx *ctx, const dw_plan *p, dw_plan_engine_mem *out);
DW_API dw_status dw_plan_get_engine_cost(dw_ctx *ctx, const dw_plan *p, dw_plan_engine_cost *out);

/* Writes an SVG timeline of one simulated step of the plan's pipeline (one row per pipeline
 * rank, forward and backward blocks by micro-batch, bubbles left grey), atomically.
 * DW_ERR_UNSUPPORTED for steps too large to draw (over 40000 blocks); DW_ERR_IO. */
DW_API dw_status dw_plan_write_svg(dw_ctx *ctx, const dw_plan *p, const char *path);

/* ======================================================================================
 * Benchmarks (GPU micro-benchmarks behind `deepwell bench`)  [section: bench]
 * ====================================================================================== */

/* Timing: CUDA events around batches of back-to-back calls on one stream, after warm-up; the
 * median batch. Each benchmark measures an anchor in the same run (a device-to-device copy, the
 * registry's own choice) so results compare across machines and clocks. The benchmarks set
 * process-wide state while they run (the quantiser's tuning, the GEMM autotuner's cache): call
 * them with no other thread using the library. */

/* `deepwell bench quant` (options struct: dw_bench_quant_opts_init sets size and defaults). */
typedef struct {
    size_t size;
    int64_t rows, cols;  /* the BF16 input [rows, cols]; default 8192 x 8192; at most 4e9 elements */
    int iters;           /* timed batches per variant (default 50) */
    int batch;           /* calls per timed batch (default 10; 1 times each call alone, launch included) */
    /* Tuning of the quantisation kernels, 0 = the built-in choice (the meaning of each value:
     * `deepwell bench quant --help`): kernel 1 = the older cp.async kernels, 2 = the bulk-copy
     * kernels (the default); stages 2..6; ctas_per_sm 1..64; t_store 1..5; load 1..2; group
     * 1..64; tile_block 1, 2 or 4. Applied for the call only. */
    int kernel, stages, ctas_per_sm, t_store, load, group, tile_block;
} dw_bench_quant_opts;
DW_API void dw_bench_quant_opts_init(dw_bench_quant_opts *o, size_t size);

/* One measurement (library-owned, valid during the callback). */
typedef struct {
    const char *device;   /* the GPU's name */
    int32_t recipe;       /* dw_recipe quantised to; -1 for the anchor, a device-to-device copy of
                             the input */
    bool transposed;      /* the transposed (column-wise) copy written in the same pass */
    double ms;            /* per call */
    double bytes;         /* read + written: input, codes, scales (the copy: input twice) */
    double gbps;          /* bytes / time, GB/s */
    double ratio_to_copy; /* gbps / the anchor's (1 for the anchor) */
} dw_bench_quant_row;
typedef void (*dw_bench_quant_fn)(const dw_bench_quant_row *r, void *user);

/* Quantises a random BF16 [rows, cols] tensor on the context's GPU (the legacy default stream)
 * to mxfp8 and fp8_block, each without and with the transposed copy, after timing the anchor:
 * fn hears the anchor first, then the four variants. Correctness is tests/gpu's, not this.
 * Errors: DW_ERR_UNSUPPORTED in a build without CUDA or on a CPU context (the message says which);
 * DW_ERR_INVALID for bad options or tuning; DW_ERR_NOMEM; DW_ERR_CUDA. */
DW_API dw_status dw_bench_quant(dw_ctx *ctx, const dw_bench_quant_opts *o, dw_bench_quant_fn fn, void *user);

/* `deepwell bench gemm`: the shapes and recipes it knows, by index (static storage; NULL past
 * the end). Shapes: square (8192^3), gpt2 (m = 16384, n, k in {768, 2304, 3072}), llama
 * (16384x14336x4096, 16384x4096x14336), vocab (GPT-2's LM head GEMMs at vocabulary 50257: rows off
 * 16-byte alignment). Recipes: bf16, fp8_tensor, fp8_block (1x128 A, 128x128 B: the engine's
 * fp8_block2d weights), fp8_block_1x128 (1x128 both), mxfp8. */
DW_API const char *dw_bench_gemm_shape_name(int i);
DW_API const char *dw_bench_gemm_recipe_name(int i);

/* Options (dw_bench_gemm_opts_init sets size and defaults). */
typedef struct {
    size_t size;
    const char *shapes;   /* comma list of shape names; NULL: all (default) */
    const char *recipes;  /* comma list of recipe names; NULL: all (default) */
    int iters;            /* calls per timed batch (default 20) */
    const char *backend;  /* force this registered kernel (cases it cannot run are skipped); NULL */
    bool explain;         /* give each case dw_gemm_explain's account of the selection */
} dw_bench_gemm_opts;
DW_API void dw_bench_gemm_opts_init(dw_bench_gemm_opts *o, size_t size);

/* One case, D = A B^T with A [m, k], B [n, k], BF16 output (library-owned, valid during the
 * callback). */
typedef struct {
    int64_t m, n, k;
    const char *recipe;   /* a dw_bench_gemm_recipe_name */
    const char *explain;  /* with opts.explain: the selection's account; else NULL */
    const char *skipped;  /* why the case was not timed (no kernel can run it); else NULL */
    bool timed;           /* backend, ms and tflops are set */
    const char *backend;  /* the kernel that ran (the autotuned winner when autotuning is on) */
    double ms;            /* per call: the median of 5 batches of iters calls, after 3 warm-up calls */
    double tflops;        /* 2 m n k / time */
} dw_bench_gemm_case;
typedef void (*dw_bench_gemm_fn)(const dw_bench_gemm_case *c, void *user);

/* Times dw_gemm on the context's device for every chosen shape and recipe with the kernel the
 * registry selects, on random valid codes and scales rotated among up to 4 copies in device
 * memory; fn hears each case as it is done. On a CPU context only opts.explain is possible (no
 * timing: cases come with their explanation only); without it DW_ERR_UNSUPPORTED. Errors:
 * DW_ERR_INVALID for an unknown name in a list (named) or iters < 1; DW_ERR_NOMEM; DW_ERR_CUDA. */
DW_API dw_status dw_bench_gemm(dw_ctx *ctx, const dw_bench_gemm_opts *o, dw_bench_gemm_fn fn, void *user);

/* `deepwell bench grouped`: the grouped expert GEMMs of the MoE linear layer (moe_linear) — fprop
 * y_e = x_e W_e^T, dgrad dx_e = dy_e W_e, wgrad dW_e += dy_e^T x_e over E experts' row groups.
 * Shapes by index (static storage; NULL past the end), rows x K -> M over E experts: e8 (16384 x
 * 4096 -> 14336, E 8), e64 (32768 x 2048 -> 1408, E 64), moe-e8 and moe-e8-down (the preset's
 * expert GEMMs at B 8, T 2048, top-2: 32768 x 2048 -> 5632 and 5632 -> 2048), moe-e64 and
 * moe-e64-down (B 4, T 2048, top-8: 65536 x 2048 -> 1024 and 1024 -> 2048); "custom" takes the
 * options' rows, experts, k, m. Routings: balanced (equal groups) and zipf (expert e's share
 * proportional to 1/(e+1)^s). */
DW_API const char *dw_bench_grouped_shape_name(int i);
DW_API const char *dw_bench_grouped_routing_name(int i);
/* The rows of each of `experts` groups for a routing (0 balanced, 1 zipf with exponent s): they add
 * up to rows; balanced differ by at most one; zipf's never grow with e except expert 0 taking the
 * rounding remainder. counts has `experts` entries. */
DW_API void dw_bench_grouped_counts(int64_t rows, int64_t experts, int routing, double s, int64_t *counts);

/* Options (dw_bench_grouped_opts_init sets size and defaults). */
typedef struct {
    size_t size;
    const char *shapes;   /* comma list of shape names or "custom"; NULL: every named shape (GPU only) */
    const char *routings; /* comma list: balanced, zipf; NULL: both */
    const char *passes;   /* comma list: fprop, dgrad, wgrad; NULL: all three */
    int iters;            /* calls per timed batch (default 10) */
    double zipf_s;        /* the Zipf exponent (default 1.0; (0, 8]) */
    uint64_t seed;        /* the random inputs (default 0) */
    int64_t rows, experts, k, m; /* the custom shape */
    bool explain;         /* give each case dw_grouped_explain's account of the selection */
    const char *recipes;  /* comma list: bf16, fp8_block; NULL: bf16. fp8_block runs the registry's
                             fp8_block kernel on E4M3 codes (k and m multiples of 128): W quantised
                             once, the pass's activation operands inside every timed call */
} dw_bench_grouped_opts;
DW_API void dw_bench_grouped_opts_init(dw_bench_grouped_opts *o, size_t size);

/* One case (library-owned, valid during the callback). */
typedef struct {
    size_t size;
    const char *shape, *routing, *pass;
    int64_t rows, experts, k, m;
    int64_t max_rows;     /* the largest group */
    const char *dtype;    /* "bf16" on a GPU (the kernel the registry picks), "fp32" on the CPU reference */
    const char *skipped;  /* why the case was not timed; else NULL */
    bool timed;
    double ms;            /* per call: the median of 5 batches of iters calls, after 2 warm-up calls */
    double tflops;        /* 2 rows K M / time */
    const char *explain;  /* with opts.explain: every grouped kernel, eligible or why not, and the
                             one that ran; else NULL */
    const char *recipe;   /* "bf16" (plain dtype values) or "fp8_block" */
    double quant_ms;      /* fp8_block: the activation operands' quantisation alone, per call (ms
                             includes it); 0 for bf16 */
} dw_bench_grouped_case;
typedef void (*dw_bench_grouped_fn)(const dw_bench_grouped_case *c, void *user);

/* Times the grouped GEMMs (dw_grouped_gemm, the registry's kernel) on the context's device for
 * every chosen shape, routing, recipe and pass, on random inputs; fn hears each case as it is
 * done (skipped, with the registry's reason, where no kernel can run it: e.g. fp8_block on sm_90
 * with DW_MOE_FP8=0, which withdraws its kernel). The CPU times its FP32 references and
 * needs named shapes. Errors: DW_ERR_INVALID for an
 * unknown name in a list (named), iters < 1, a bad custom shape or Zipf exponent; DW_ERR_NOMEM;
 * DW_ERR_CUDA. */
DW_API dw_status dw_bench_grouped(dw_ctx *ctx, const dw_bench_grouped_opts *o, dw_bench_grouped_fn fn, void *user);

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
    /* a mixture of experts with router losses (else NaN), from the step's last micro-batch: the
     * load-balancing loss and the z-loss (parts of `loss`; NaN when not configured) and the most
     * loaded expert's assignments over the mean */
    double moe_aux_loss, moe_z_loss, expert_load;
    /* a mixture of experts (else NaN): the (token, k) assignments dropped past an expert's capacity
     * over the step's micro-batches and ranks, and their share of all assignments */
    double moe_dropped, moe_dropped_frac;
    /* guardrails (docs/precision.md, "Guardrails"): NULL, or why this step changed nothing —
     * "nonfinite loss" or "nonfinite grad" (weights and optimizer state untouched; the step still
     * counts, its batch is consumed and the schedule moves on) */
    const char *skipped;
    /* NULL, or the layers switched to BF16 after this step's quantisation check, with the tensor,
     * its bulk quantisation error and the threshold ("layer w 0.86 > 0.25, ...") */
    const char *precision_change;
    /* several ranks (else ranks 0 and both NULL): for each rank r < ranks, the seconds this step's
     * gradient collectives ran (comm_s[r]) and the wall seconds rank r waited for them after
     * backward (exposed_comm_s[r]: what overlapping them with backward did not hide) */
    int ranks;
    const double *comm_s, *exposed_comm_s;
    /* a mixture of experts with the selection bias on (dw_train_opts.moe_bias_update; else NaN): the
     * largest |b| over the routers and experts after this step's update */
    double moe_bias_max;
    /* quantised layers (else -1 both): the elements this step's quantisers saturated (overflow) and
     * flushed to zero (underflow), over every quantised GEMM operand (x, W, dy), layer and rank
     * (docs/precision.md, "Guardrails") */
    int64_t quant_overflow, quant_underflow;
} dw_train_progress;

typedef struct {
    size_t size;            /* sizeof(dw_train_opts), set by dw_train_opts_init */
    const char *data;       /* glob of llm.c token shards (*.bin) or of text files, or "builtin" */
    const char *val;        /* validation data (same forms), or NULL; "builtin" data has its own
                               validation stream (the same facts, other orders), used when NULL */
    const char *out_dir;    /* run directory: metrics.jsonl, ckpt-<step>/, latest (created) */
    const char *resume;     /* checkpoint or run directory to continue from, or NULL: its weights,
                               optimizer state, step, data position and RNG replace the engine's */
    int64_t steps;          /* total optimizer steps (a resumed run continues up to it) */
    int64_t batch;          /* micro-batch B (sequences per forward/backward), at most the program's */
    int64_t seq;            /* sequence length T, at most the program's */
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
    uint64_t seed;          /* shuffling and sampling (weights are the engine's already) */
    bool deterministic;     /* CUDA: bit-reproducible steps — attention through Deepwell's
                               tensor-core kernels instead of cuDNN, whose backward accumulates
                               dQ with atomics (for the whole process while dw_train runs; the
                               CPU backend always is) */
    bool profile;           /* after the last step, time 3 eager steps of the last micro-batch
                               step by step and write out_dir/profile.json (dw_profile_save) */
    void (*progress)(const dw_train_progress *p, void *user); /* may be NULL */
    void *progress_user;
    double ckpt_minutes;    /* also checkpoint once this many minutes of wall time have passed
                               since the last checkpoint (or the start), so that a crash loses at
                               most about that much work; fractions allowed; 0: by steps only */
    int zero;               /* several ranks (dw_dist_env_get): the ZeRO stage, 0 (gradients
                               all-reduced), 1 (optimizer state sharded) or 2 (gradients sharded
                               too: with an engine made for it, dw_engine_opts.zero, the backward
                               writes through bucket-sized staging, each bucket reduced into the
                               shard as backward finishes it) or 3 (FSDP: parameters sharded,
                               gathered before use; not quantised programs, not --ep). An engine
                               made for a higher stage is refused. Default 0 */
    /* guardrails (docs/precision.md, "Guardrails") */
    int64_t max_skips;      /* a step whose loss or gradient norm is not finite is skipped (nothing
                               changes); this many in a row stop the run with DW_ERR_NUMERIC after a
                               checkpoint of the last good state. Default 10; 0: stop at the first */
    int64_t quant_check_every; /* every K steps, the relative quantisation error, overflow and
                               underflow of each quantised GEMM input into out_dir/quant_stats.jsonl
                               (one extra forward of the step's last micro-batch). Default 100; 0: off */
    int64_t quant_fallback_after; /* a layer over its threshold (policy "max_rel_error", else per
                               format) in this many checks in a row runs in BF16 for the rest of the
                               run; out_dir/precision_decisions.jsonl records it and a resumed run
                               keeps it. Default 3; 0: statistics only */
    int ep;                 /* several ranks: expert parallelism over groups of ep consecutive
                               ranks, each running E/ep of every MoE layer's experts (tokens sent
                               to their experts' ranks and back by all-to-all; docs/multi-gpu.md);
                               ep divides the ranks and E. Default 1: off */
    /* The caller's data instead of `data` (then NULL) and `val`: dw_train calls next_batch for
     * each micro-batch to fill tokens and targets (b, t) = (batch, seq) of int32 ids, index being
     * the micro-batches this process took before it (counted across a resume: the checkpoint's
     * data position, which is this count); val_batch (may be NULL: no validation) for each
     * micro-batch of a validation, index 0, 1, ... from its start. Each returns 0 when it filled
     * them, 1 when it has no more (val_batch only: the validation ends with the micro-batches it
     * got; none is an error), anything else to stop training: dw_train then returns DW_ERR_IO
     * without finishing the step (the newest checkpoint stays the last complete one). Every id is
     * checked below the model's vocabulary (DW_ERR_INVALID naming the micro-batch and position).
     * Checkpoints record the data as "(next_batch)" and a resume continues the index; what the
     * callbacks return from there is the caller's. Several ranks: each calls its own for its part.
     * Called on the thread that called dw_train; batch_user is passed to both. */
    int (*next_batch)(void *user, int64_t index, int32_t *tokens, int32_t *targets, int64_t b, int64_t t);
    int (*val_batch)(void *user, int64_t index, int32_t *tokens, int32_t *targets, int64_t b, int64_t t);
    void *batch_user;
    /* loss-spike rollback (docs/precision.md, "Loss spikes"): once the window of the last
     * spike_window applied steps' losses is full, a step whose loss is more than spike_zscore
     * standard deviations above the window's mean restores the newest checkpoint this run wrote
     * (weights, moments, step, data position, RNG, the guardrails' state) and its batch is skipped
     * when the data reaches it again; logged on stderr and as a "rollback" line in metrics.jsonl.
     * After max_rollbacks rollbacks the next spike stops the run with DW_ERR_NUMERIC. */
    double spike_zscore;    /* Z > 0; 0 (default): off */
    int64_t spike_window;   /* W >= 2 (default 50) */
    int64_t max_rollbacks;  /* default 3; 0: stop at the first spike */
    /* delayed scaling of the fp8_tensor recipe (docs/precision.md, "Delayed scaling"): each
     * quantised operand (x, dy, W of every fp8_tensor linear layer) is scaled from the largest of
     * its last N steps' amaxes instead of its own; its state is saved in checkpoints. 0 (default):
     * just-in-time scales. The block recipes always scale from the block itself */
    int64_t fp8_amax_history;
    bool no_overlap;        /* several ranks: reduce the gradients after backward instead of each
                               bucket as soon as backward has finished it (the same collectives
                               in the same order, so the same results; for comparison). Default
                               false: overlapped (docs/multi-gpu.md) */
    double moe_bias_update; /* mixture of experts: auxiliary-loss-free load balancing (DeepSeek-V3) —
                               γ > 0 turns on a per-expert selection bias b: each router chooses
                               its top k by score + b (the weights stay the unbiased scores) and
                               after every optimizer step b_e += γ·sign(mean load − load_e) over the
                               global batch; checkpoints keep b (state.json "moe_bias"). 0 (default):
                               the resumed run's γ, else the model config's (moe_bias_update_speed, or
                               0.001 under topk_method "noaux_tc"), else off. In [0, 1] */
    /* the quantisers' counters as a fallback rule (docs/precision.md, "Guardrails"): a quantised
     * linear layer whose overflow (saturated) or underflow (flushed to zero) fraction of one
     * operand kind — x, w or dy: the step's counts over the elements its quantisers read, summed
     * over the ranks — is over quant_overflow_max / quant_underflow_max in quant_counts_after
     * consecutive steps runs in BF16 for the rest of the run, recorded as quant_fallback_after's
     * fallbacks are (precision_decisions.jsonl, the progress line, metrics.jsonl, the checkpoint;
     * a resumed run keeps it, its runs of steps start again). Fractions; a negative maximum turns
     * its rule off. Defaults: overflow 0.001 (0.1%), underflow -1 (off), 3 steps; 0 steps: off */
    double quant_overflow_max;
    double quant_underflow_max;
    int64_t quant_counts_after;
    /* the quantisation error checks (quant_check_every) measure each tensor of more than this many
     * elements on a deterministic sample of whole quantisation blocks (block rows spread evenly
     * over it, the same every check, always with the block row holding its amax; docs/precision.md,
     * "Guardrails"). Default 1 << 16; 0: every tensor whole */
    int64_t quant_check_elements;
} dw_train_opts;

/* Fills defaults: steps 100, batch 8, seq 64, global_batch 8, lr 1e-3, min_lr 1e-4, warmup 10,
 * cosine, weight_decay 0.1, clip 1.0, betas 0.9/0.95, eps 1e-8, eval every 50 (8 batches),
 * sample every 0 (64 tokens at temperature 0.8), checkpoint every 30 minutes and at the end,
 * keep 3, seed 1337, max_skips 10, quant_check_every 100, quant_fallback_after 3, quant_overflow_max
 * 0.001, quant_underflow_max -1 (off), quant_counts_after 3, quant_check_elements 1 << 16.
 * data and out_dir must still be set. */
DW_API void dw_train_opts_init(dw_train_opts *opts, size_t size);

/* Trains the engine's model: per optimizer step global_batch/batch micro-batches of forward and
 * backward, gradient clipping, the scheduled learning rate, AdamW (dw_engine_step); validation,
 * samples and checkpoints (config.json: the graph's captured config; model.safetensors;
 * optimizer.safetensors, or with several ranks one optimizer-<r>-of-<N>.safetensors per rank and
 * optimizer.safetensors.index.json; state.json with the step, data position, RNG, schedule and the program's
 * precision). Writes out_dir/metrics.jsonl (one JSON object per step). Returns DW_OK when all
 * steps ran or after a stop request (then a checkpoint of the last finished step exists). */
DW_API dw_status dw_train(dw_engine *e, const dw_train_opts *opts);

/* Asks a running dw_train to stop after the current step (it writes a checkpoint first).
 * Async-signal-safe: meant to be called from a SIGINT handler. */
DW_API void dw_train_request_stop(void);
/* Whether a stop was requested (and not yet cleared by the start of the next dw_train). */
DW_API bool dw_train_stop_requested(void);

/* Several processes (docs/multi-gpu.md). A process started by mpirun, torchrun, Slurm's srun or
 * `deepwell launch` is one rank of a job: dw_train then trains data-parallel with the others
 * (batch is per rank, global_batch across all ranks; rank 0 alone calls progress and writes
 * metrics and checkpoints; the losses reported are the global means). Read from the launcher's
 * variables, no communication; a world of one when none is set. DW_ERR_INVALID naming a
 * malformed variable (message in dw_errmsg(NULL); *out is then one rank). When the world has
 * several ranks, every later log line carries "rank R/N". */
typedef struct {
    int rank, world_size;              /* this process among the job's */
    int local_rank, local_world_size;  /* among this node's: the GPU a CUDA rank should use */
    const char *launcher;              /* "none", "mpirun", "torchrun", "srun" (static) */
} dw_dist_env;
DW_API dw_status dw_dist_env_get(dw_dist_env *out);
/* Ends this process's part in the job, once, before it exits (harmless when it had none):
 * ok: every rank is finishing (a barrier, then MPI_Finalize / closing the connections); !ok:
 * this rank failed, and leaves without waiting, so that the launcher stops the others (mpirun)
 * or they see the connection close (tcp). Not thread-safe. */
DW_API void dw_dist_shutdown(bool ok);

/* Token data read exactly as dw_train reads dw_train_opts.data, for other readers (`deepwell
 * eval`): a file or glob(3) pattern of llm.c token shards (names ending in .bin: magic, version
 * and size checked), of other files read as bytes (vocab 256), or "builtin"; every token checked
 * below vocab; a FIFO or other non-regular file refused. Windows of seq + 1 tokens in file order
 * (window w of a file starts at its token w x seq). Errors name the file and byte offset. */
typedef struct dw_data dw_data;
DW_API dw_status dw_data_open_pattern(dw_ctx *ctx, const char *pattern, int64_t seq, int64_t vocab,
                                      dw_data **out);
/* Windows in all files (B up to this many are read before the data repeats). */
DW_API int64_t dw_data_windows(const dw_data *d);
/* The next B windows: tokens and targets (B, seq), targets the tokens shifted by one. */
DW_API void dw_data_next(dw_data *d, int64_t B, int32_t *tokens, int32_t *targets);
DW_API void dw_data_free(dw_data *d); /* NULL is harmless */

/* ======================================================================================
 * Opening a model end to end                                 [section: model]
 * ====================================================================================== */

/* The pipeline in one call, for tools and quick starts: capture -> compile -> engine -> weights.
 * A dw_model owns its graph, program and engine. */
typedef struct dw_model dw_model;

typedef enum {
    DW_WEIGHTS_AUTO = 0, /* a checkpoint's or model directory's weights when it has them, else random */
    DW_WEIGHTS_RANDOM,   /* the architecture's initialisation from seed */
    DW_WEIGHTS_FILE,     /* the weights of `what` (an error when it has none) */
    DW_WEIGHTS_NONE      /* parameters left at zero: the caller loads them (dw_train's resume) */
} dw_weights_from;

typedef struct {
    size_t size;               /* sizeof(dw_model_opts), set by dw_model_opts_init */
    int64_t batch;             /* capacity B (default 1) */
    int64_t seq;               /* capacity T (default 0: the model's positions, at most 1024) */
    const dw_policy *policy;   /* borrowed; NULL: FP32 on a CPU context, BF16 on CUDA */
    dw_weights_from weights;   /* default DW_WEIGHTS_AUTO */
    uint64_t seed;             /* random initialisation (default 1337) */
    const char *weights_from;  /* NULL: `what`'s own weights as `weights` says; else (with AUTO or
                                  FILE) the weights of this source instead: a checkpoint or run
                                  directory (validated; its newest checkpoint), a directory with
                                  model.safetensors or model.safetensors.index.json, or a
                                  .safetensors file. Every tensor must match the graph (errors name
                                  the tensor and both shapes) */
    dw_moe_drop moe_drop;      /* default DW_MOE_DROP_CONFIG: the model's (dw_capture_opts) */
    int recompute;             /* dw_recompute for the program (dw_compile_opts.recompute; default
                                  DW_RECOMPUTE_NONE) */
    int recompute_blocks;      /* dw_compile_opts.recompute_blocks (0: every block) */
    bool fused_head;           /* dw_compile_opts.fused_head (default false): a model opened to
                                  train; one whose logits are read (eval, sample) leaves it off */
    int zero;                  /* dw_engine_opts.zero for its engine (default 0): a model opened to
                                  train with that ZeRO stage allocates only its rank's shards */
    bool grad_arena;           /* a model opened to train one micro-batch per optimizer step (no
                                  gradient accumulation), whose gradients nothing reads after the
                                  step: dw_compile_opts.grad_arena and bf16_arena as
                                  dw_compile_opts_train_arenas(o, 1, zero) sets them (default false:
                                  as dw_compile_opts_init leaves them) */
} dw_model_opts;
DW_API void dw_model_opts_init(dw_model_opts *o, size_t size);

/* `what`: a checkpoint or run directory (validated first; its config.json and weights), a
 * directory with config.json (and model.safetensors or a sharded index), a config.json path, or
 * a preset name. The graph is captured for batch x seq and compiled for ctx's device. *out is
 * NULL on error. */
DW_API dw_status dw_model_open(dw_ctx *ctx, const char *what, const dw_model_opts *opts, dw_model **out);
DW_API void dw_model_free(dw_model *m);
DW_API dw_engine *dw_model_engine(const dw_model *m);
DW_API const dw_graph *dw_model_graph(const dw_model *m);
/* Whether the weights came from a file (false: initialised from seed). */
DW_API bool dw_model_trained(const dw_model *m);
/* The checkpoint directory, model directory or file the weights were loaded from; NULL when they
 * were initialised from seed or left at zero. Owned by m. */
DW_API const char *dw_model_weights_source(const dw_model *m);
/* The tokenizer its text goes through: the path of the tokenizer.json of a Hugging Face model
 * directory or of a checkpoint that has one (dw_run_set_tokenizer); else "bytes" (byte-level,
 * vocabulary 256) or "ids" (text is space-separated token ids), a checkpoint saying which its data
 * used. Owned by m. */
DW_API const char *dw_model_tokenizer(const dw_model *m);

/* Records the tokenizer a training run's text goes through: `tokenizer` (a tokenizer.json, or a
 * directory holding one) is copied to run_dir/tokenizer.json (run_dir and its parents created;
 * written atomically), and every checkpoint dw_train writes into run_dir then carries a copy,
 * listed in state.json with its size and CRC-32 like its other files — so that the checkpoint,
 * even moved elsewhere alone, decodes with it (dw_model_tokenizer; `deepwell sample RUN`), and a
 * changed or missing copy is refused when the checkpoint is opened. Call it before dw_train (rank
 * 0 of several). A run keeps one tokenizer: the same bytes again are a no-op, a run_dir holding a
 * different tokenizer.json is refused (DW_ERR_INVALID naming both). The file is copied as it is:
 * whether the library can read it is dw_hf_tokenizer_open's question. DW_ERR_IO naming the file. */
DW_API dw_status dw_run_set_tokenizer(dw_ctx *ctx, const char *run_dir, const char *tokenizer);

/* Text <-> tokens with a tokenizer named as above: "bytes", "ids", or a tokenizer.json (or a
 * directory holding one; read at each call: keep a dw_hf_tokenizer for more than one). dw_tokenize:
 * *ids (free()) and *n; ids outside [0, vocab) are refused naming the word or token. dw_detokenize:
 * a malloc'd NUL-terminated string (bytes: ids above 255 as "<id>"; ids: space-separated;
 * tokenizer.json: as dw_hf_tokenizer_decode keeping special tokens), NULL when out of memory or the
 * file cannot be read (the reason in dw_errmsg(NULL)). */
DW_API dw_status dw_tokenize(dw_ctx *ctx, const char *tokenizer, const char *text, int64_t vocab, int32_t **ids,
                             int64_t *n);
DW_API char *dw_detokenize(const char *tokenizer, const int32_t *ids, int64_t n);

/* A Hugging Face tokenizer.json with a BPE model, read once (docs/tokenizer.md lists what is
 * supported: the byte-level GPT-2 / Llama 3 / Qwen2 and the SentencePiece-style Llama 2 / Mistral
 * files; other model, normalizer, pre-tokenizer and decoder types are refused by name). path: the
 * file or a directory holding tokenizer.json. Immutable once open: one may serve several threads.
 * dw_hf_tokenizer_free(NULL) is harmless; *out is NULL on error. */
typedef struct dw_hf_tokenizer dw_hf_tokenizer;
DW_API dw_status dw_hf_tokenizer_open(dw_ctx *ctx, const char *path, dw_hf_tokenizer **out);
DW_API void dw_hf_tokenizer_free(dw_hf_tokenizer *t);
/* Ids are below this: 1 + the largest id of the vocabulary and the added tokens. */
DW_API int64_t dw_hf_tokenizer_vocab(const dw_hf_tokenizer *t);
/* The tokenizer.json it read. Owned by t. */
DW_API const char *dw_hf_tokenizer_path(const dw_hf_tokenizer *t);
/* UTF-8 text -> *ids (free(); a valid pointer even for no ids) and *n, as the `tokenizers`
 * package's encode(text, add_special_tokens=False): no BOS/EOS is added, added tokens in the text
 * are matched. Text that is not UTF-8 is refused naming the byte. */
DW_API dw_status dw_hf_tokenizer_encode(dw_ctx *ctx, const dw_hf_tokenizer *t, const char *text, int32_t **ids,
                                        int64_t *n);
/* ids -> *text (free(); UTF-8, NUL-terminated) and *len (may be NULL) its bytes, which a token of
 * byte 0 makes differ from strlen; as the package's decode(ids, skip_special_tokens): special added
 * tokens left out when skip_special; an id outside [0, dw_hf_tokenizer_vocab) decodes as U+FFFD
 * (a model's padded rows). */
DW_API dw_status dw_hf_tokenizer_decode(dw_ctx *ctx, const dw_hf_tokenizer *t, const int32_t *ids, int64_t n,
                                        bool skip_special, char **text, size_t *len);

/* Appends n tokens to tokens[0..np) (np >= 1; room for np + n) from the engine's model, each
 * from the last min(length, the program's T) tokens, with temperature (0: greedy) and top-k (0:
 * the whole vocabulary), drawing from *rng_state (advanced; any value seeds a stream). */
DW_API dw_status dw_engine_generate(dw_engine *e, int32_t *tokens, int64_t np, int64_t n, double temperature,
                                    int top_k, uint64_t *rng_state);

/* What one generation took (a result struct: set size first), in wall-clock seconds: the prefill
 * (the prompt's forward, up to the first new token) and the decode (each later token), and
 * whether a K/V cache served the decode (false: a full recompute per token). */
typedef struct {
    size_t size;
    double prefill_s, decode_s;
    int64_t prefill_tokens; /* the prompt's tokens */
    int64_t decode_tokens;  /* the tokens after the first: n - 1 (0 when n <= 1) */
    bool cached;
} dw_generate_stats;

/* dw_engine_generate, filling *stats (may be NULL; size 0 refused) with its timings, also on
 * failure (what had run). */
DW_API dw_status dw_engine_generate_timed(dw_engine *e, int32_t *tokens, int64_t np, int64_t n, double temperature,
                                          int top_k, uint64_t *rng_state, dw_generate_stats *stats);

/* ======================================================================================
 * Export to Hugging Face                                     [section: export]
 * ====================================================================================== */

/* What dw_export_hf writes (docs/export.md). */
typedef enum {
    DW_EXPORT_HF = 0,  /* every tensor in dtype */
    DW_EXPORT_HF_FP8,  /* linear projection weights as E4M3 with 128x128 block scales
                          (NAME.weight + NAME.weight_scale_inv, transformers' and vLLM's fine-grained
                          FP8); embeddings, norms, routers and the LM head in dtype */
} dw_export_format;

typedef enum { DW_EXPORT_BF16 = 0, DW_EXPORT_F32 } dw_export_dtype;

typedef struct {
    size_t size;                /* sizeof(dw_export_opts), set by dw_export_opts_init */
    dw_export_format format;    /* default DW_EXPORT_HF */
    dw_export_dtype dtype;      /* default DW_EXPORT_BF16 */
    dw_weights_layout layout;   /* mixture-of-experts weights; default DW_WEIGHTS_LAYOUT_AS_LOADED:
                                   a model directory's own layout, else that of hf_dir's weights,
                                   else per-expert (what transformers 4 and 5 both load) */
    int64_t max_shard_bytes;    /* tensor bytes per file before sharding (default 5e9, transformers'
                                   "5GB"); more gives model-0000k-of-0000n.safetensors + an index */
    const char *hf_dir;         /* borrowed, may be NULL: the Hugging Face model directory the
                                   weights started from (default: src when src is one). Its
                                   config.json keys Deepwell does not model are kept, its
                                   generation_config.json and tokenizer files copied */
} dw_export_opts;
DW_API void dw_export_opts_init(dw_export_opts *o, size_t size);

/* Writes the weights of src (a run directory: its newest checkpoint; a checkpoint; or a model
 * directory with weights) as a Hugging Face model directory out_dir: config.json, the weights
 * under the family's names and layouts (tied embeddings once), and what opts->hf_dir has. Every
 * file goes into a temporary directory beside out_dir, renamed to out_dir at the end: on any
 * error nothing is left. out_dir must not exist or be an empty directory. Errors name the path
 * and what is wrong. Not thread-safe on one ctx. */
DW_API dw_status dw_export_hf(dw_ctx *ctx, const char *src, const char *out_dir, const dw_export_opts *opts);

/* ======================================================================================
 * Profiles                                                    [section: profile]
 * ====================================================================================== */

/* Where a training step's time goes: eager steps timed step by step (CUDA events on a GPU, the
 * host clock on the CPU), summed per op kind and direction and per node role ("h.#.attn.c_proj
 * fwd"), largest first; and the optimizer step's parts. */
typedef struct dw_profile dw_profile;
/* Times 1 + steps eager training steps of (tokens, targets) [B, T] (the first untimed) and, with
 * optimizer, 3 eager optimizer steps; the weights, moments and gradients change as in real steps. */
DW_API dw_status dw_engine_profile(dw_engine *e, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T,
                                   int steps, bool optimizer, dw_profile **out);
DW_API void dw_profile_free(dw_profile *p);
/* The tables as aligned text (at most top rows each; 0: all), or as JSON fields ("profile_eager_ms",
 * "per_op", "per_role"[, "optimizer"]) for a larger object; caller frees with dw_free_string. */
DW_API char *dw_profile_text(const dw_profile *p, int top);
DW_API char *dw_profile_json_fields(const dw_profile *p);
/* One eager step's milliseconds (the sum of the per-op table). */
DW_API double dw_profile_step_ms(const dw_profile *p);
/* profile.json: written atomically; read back with errors naming the file and field. */
DW_API dw_status dw_profile_save(dw_ctx *ctx, const dw_profile *p, const char *path);
DW_API dw_status dw_profile_load(dw_ctx *ctx, const char *path, dw_profile **out);

/* Debugging and parity: the logits (B,T,V) of the last forward given here, the loss and every
 * parameter's gradient under its Hugging Face name and layout, in one safetensors file. */
DW_API dw_status dw_engine_dump(dw_engine *e, const char *path, const float *logits, int64_t B, int64_t T, double loss);


#ifdef __cplusplus
}
#endif

#endif /* DEEPWELL_H */
