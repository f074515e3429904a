/* testutil.h — helpers shared by the tests: fresh random seeds, temporary directories,
 * reading expected data paths, a hand-built model pipeline (graph -> program -> engine) and a host
 * mirror of the engine's optimizer. Every test draws new random inputs per run and prints the
 * seed so a failure can be replayed with DW_TEST_SEED=<seed>. */
#ifndef DW_TESTUTIL_H
#define DW_TESTUTIL_H

#include <stdint.h>
#include <stddef.h>

#include "deepwell.h"

/* The run's seed: DW_TEST_SEED if set, else from the clock and pid; printed once. */
uint64_t dw_test_seed(void);
/* splitmix64 / xoshiro-style generator for tests. */
typedef struct { uint64_t s; } dw_test_rng;
void dw_test_rng_init(dw_test_rng *r, uint64_t seed);
uint64_t dw_test_next(dw_test_rng *r);
float dw_test_uniform(dw_test_rng *r, float lo, float hi);
float dw_test_normal(dw_test_rng *r);

/* Creates a fresh temporary directory (removed by dw_test_rmtree); returns a static path copy
 * the caller frees. */
char *dw_test_tmpdir(void);
void dw_test_rmtree(const char *path);
/* path join into a malloc'd string */
char *dw_test_path(const char *dir, const char *name);
/* Writes bytes to a file (non-atomically; for fixtures). Returns 0 on success. */
int dw_test_write(const char *path, const void *data, size_t n);
/* DIR/model holding config.json with the given text: its path (free()), or NULL on failure. */
char *dw_test_model_dir(const char *dir, const char *config_json);
/* The fixture of the training tests: a context *ctx, a fresh temporary directory *dir and
 * in it *model, a tiny byte-level Llama directory (vocab 256, 2 heads, 1 KV head, 32 positions) of
 * `layers` blocks, width `hidden`, MLP width `ff`, on the CPU (DW_TEST_DEVICE=cuda: on the GPU, for
 * the tests gpu-verify.sh runs on both engines). 0 on success. dw_test_train_fixture_close frees
 * the three (any may be NULL). */
int dw_test_train_fixture(dw_ctx **ctx, char **dir, char **model, int layers, int hidden, int ff);
void dw_test_train_fixture_close(dw_ctx *ctx, char *dir, char *model);

/* A dw_model of `model` (a directory or preset) with random weights from `seed`, batch x seq, under
 * policy pol (NULL: the default); NULL with the message printed on failure. */
dw_model *dw_test_open_model(dw_ctx *ctx, const char *model, uint64_t seed, const dw_policy *pol, int64_t batch,
                             int64_t seq);
/* The index of e's parameter `name`, or -1. */
int dw_test_param_index(dw_engine *e, const char *name);
/* The recipe e's program binds node `name` to now (bf16 after a guard's fallback), or
 * DW_RECIPE_COUNT when there is no such node. */
dw_recipe dw_test_node_recipe(dw_engine *e, const char *name);

/* The lines of a JSON-lines file as a Jansson array (a json_t *, json_decref it), or NULL with
 * the reason printed. */
void *dw_test_json_lines(const char *path);
/* The quantisers' counters of a run (train/guard_counts.c) against its checks (guard_quant.c), in
 * a run with a check every step and no fallback: at `step` (>= 2: step 1's counts also hold the
 * weights' first quantisation) each layer's counted w and dy (overflow, underflow, elements) equal the
 * check's reference measurements of w + w^T (the weights the update quantised) and dy + dy^T (the
 * step's backward), and metrics.jsonl's totals the layers' x + w + dy. 0 with the layers compared
 * in *layers and their w underflows in *w_under, or -1 with the mismatch printed. */
int dw_test_quant_counts_check(const char *run_dir, int64_t step, int *layers, long long *w_under);

/* A cmocka group fixture shared by the tests that need a CPU context and a seeded generator:
 * cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown). */
struct dw_ctx;
extern struct dw_ctx *dw_test_ctx;
extern dw_test_rng dw_test_group_rng;
int dw_test_group_setup(void **state);
int dw_test_group_teardown(void **state);
/* The GPU tests' fixture: a CPU and a CUDA context (0), or -1 with the reason on stderr. */
int dw_test_cpu_gpu_setup(struct dw_ctx **cpu, struct dw_ctx **gpu);
void dw_test_cpu_gpu_teardown(struct dw_ctx *cpu, struct dw_ctx *gpu);
/* Uniform integer in [lo, hi] from dw_test_group_rng. */
int64_t dw_test_rnd(int64_t lo, int64_t hi);
/* How many of the n elements of `size` bytes differ between a and b, bit for bit. */
int64_t dw_test_differing(const void *a, const void *b, int64_t n, int64_t size);
/* A TCP port on 127.0.0.1 free a moment ago (for tcp ranks forked by a test), or -1. */
int dw_test_free_port(void);
/* Under mpirun -np world: the job's MPI communicator (dw_comm_world's, kept until
 * dw_dist_shutdown) and rank 0's seed broadcast into *seed; NULL with the reason on stderr, naming
 * `test`, otherwise. */
struct dw_comm;
struct dw_comm *dw_test_mpi_world(struct dw_ctx *ctx, int world, const char *test, uint64_t *seed);


/* A graph of the preset's family ("gpt2-tiny", "llama-tiny", "qwen2-tiny") with random small
 * dimensions drawn from r (1-2 blocks, vocabulary 20-60, width 6-24, 1-4 heads, 32 positions,
 * tied embeddings or not) for batch x seq; NULL with the message printed on failure. */
dw_graph *dw_test_small_graph(dw_ctx *ctx, const char *preset, int64_t batch, int64_t seq, dw_test_rng *r);

/* A hand-built graph in which one activation x = embedding(tokens) is read by four input slots of
 * ops without and with ACC_IN flags, so that its gradient is written by the linear (the first
 * backward to reach it) and added in through ACC temporaries by the others:
 *   x = emb(tokens, wte); h = gelu(x); sw = swiglu(x, x); y = linear(x, w1);
 *   s = (h + sw) + y; logits = linear(rmsnorm(s, g), head); loss = cross_entropy(logits, targets)
 * with random small widths from r, for batch x seq. *node_gelu / *node_swiglu (may be NULL) get
 * the two nodes' indices. NULL with the message printed on failure. */
dw_graph *dw_test_shared_graph(dw_ctx *ctx, int64_t batch, int64_t seq, dw_test_rng *r, int *node_gelu,
                               int *node_swiglu);

/* A hand-built graph around a two-output node, the MoE router (E experts, top K):
 *   x = emb(tokens, wte); z = linear(x, gate); (w, experts) = moe_router(z);
 *   s = x + linear(w, up); logits = linear(s, head); loss = cross_entropy(logits, targets)
 * with random small sizes from r (C even, E 3..9, K 1..E; with gemm_sizes, sizes cuBLASLt's BF16
 * GEMMs take: C, V multiples of 8, E 16 or 24, K 8), score 0 softmax / 1 sigmoid, renorm as given,
 * for batch x seq; the experts (int32) have no reader. *node_router (may be NULL) gets the
 * router's node index. NULL with the message printed on failure. */
dw_graph *dw_test_router_graph(dw_ctx *ctx, int64_t batch, int64_t seq, dw_test_rng *r, int score, bool renorm,
                               bool gemm_sizes, int *node_router);

/* A hand-built mixture-of-experts feed-forward around the MoE ops (E experts, top K, SwiGLU of
 * width F, dropless):
 *   x = emb(tokens, wte); (w, experts) = moe_router(linear(x, gate)) (softmax, renormalised);
 *   (xs, offsets, rows) = moe_dispatch(x, experts); a = swiglu(moe_linear(xs, w1), moe_linear(xs, w3));
 *   s = x + moe_combine(moe_linear(a, w2), w, rows); logits = linear(s, head); loss
 * with random small sizes from r (C 4..12, F 2..9, E 2..6, K 1..E, V 10..30), for batch x seq.
 * NULL with the message printed on failure. */
dw_graph *dw_test_moe_graph(dw_ctx *ctx, int64_t batch, int64_t seq, dw_test_rng *r);

/* Elements of engine parameter i. */
int64_t dw_test_param_numel(dw_engine *e, int i);
/* Every parameter of e drawn normal(0, sd) from r, the one named `wide` (may be NULL) with sd_wide. */
void dw_test_random_params(dw_engine *e, dw_test_rng *r, float sd, const char *wide, float sd_wide);
/* Parameter `name` of e read back into a new array (free it); its index into *index (may be
 * NULL). NULL when e has no such parameter. */
float *dw_test_param_read(dw_engine *e, const char *name, int *index);
/* Activation tensor t's gradient (n values) read from a CPU engine's arena as FP32 (a BF16
 * program's widened), into a new array (free it); aborts when t has no gradient. */
float *dw_test_act_grad_read(const dw_engine *e, int t, int64_t n);
/* Central differences, step h, of e's loss on (x, y) for every element of parameter `name`,
 * against the gradient e holds (run forward_backward first). An element whose +-h forwards change
 * int32 tensor `watch` (-1: none; a router's experts) sits at a kink and is not compared. Fills
 * *gmax (max |gradient|) and *compared; returns the elements off by more than atol + rel * gmax
 * (the first printed to stderr), or -1 when an engine call fails (message on its context). */
int64_t dw_test_fd_param(dw_engine *e, const char *name, const int32_t *x, const int32_t *y, int64_t B, int64_t T,
                         int watch, float h, double atol, double rel, double *gmax, int64_t *compared);
/* n tokens uniform in [0, V) from r. */
void dw_test_random_tokens(int32_t *t, int64_t n, int64_t V, dw_test_rng *r);
/* steps AdamW steps (lr, the other options default) on one fixed batch; the first and last loss.
 * The first failing call's status (message on the engine's context); a non-finite loss or norm
 * is DW_ERR_NUMERIC. */
dw_status dw_test_train_fixed(dw_engine *e, const int32_t *x, const int32_t *y, int64_t B, int64_t T, int steps,
                              double lr, double *first, double *last);

/* A second graph of g's configuration (captured again from its config.json) at batch x seq (0:
 * g's). NULL with the message printed on failure. */
dw_graph *dw_test_same_graph(dw_ctx *ctx, const dw_graph *g, int64_t batch, int64_t seq);

/* A policy from spec: a recipe name (dw_policy_from_precision) or a policy's JSON text (starting
 * with '{', loaded as a policy file); fallback "safe" if fallback_safe, else the spec's ("head" for
 * a recipe name). DW_OK, or the loader's status (message on ctx) with *out NULL. */
dw_status dw_test_policy(dw_ctx *ctx, const char *spec, bool fallback_safe, dw_policy **out);
/* fp8_block with the MoE experts' wgrad quantised too (the rule's "bf16_passes": [] turns off the
 * default that keeps it BF16: docs/precision.md), for the tests of the grouped fp8_block wgrad. */
#define DW_TEST_FP8_WGRAD \
    "{\"default\": \"fp8_block\", \"rules\": [{\"op\": \"moe_linear\", \"recipe\": \"fp8_block\", \"bf16_passes\": []}]}"

/* A model built by hand: a graph (owned from the call on, freed with the model even on error),
 * its program and an engine on ctx's device. precision: NULL = the FP32 program (no policy), else
 * dw_test_policy(precision, no safe fallback): a recipe name or a policy's JSON text. target: DW_DEVICE_AUTO (the context's
 * device) or DW_DEVICE_CUDA (a program compiled for sm_90). Parameters start at zero. Returns the
 * first failing call's status with its message printed to stderr; m is then all NULL. */
typedef struct {
    dw_graph *g;
    dw_policy *pol;
    dw_compiled *c;
    dw_engine *e;
} dw_test_model;
dw_status dw_test_model_build(dw_ctx *ctx, dw_graph *g, const char *precision, dw_device_kind target, dw_test_model *m);
/* The same with the caller's compile options (target, recompute, ...) instead of target alone. */
dw_status dw_test_model_build_opts(dw_ctx *ctx, dw_graph *g, const char *precision, const dw_compile_opts *o,
                                   dw_test_model *m);
void dw_test_model_free(dw_test_model *m);
/* m's engine from weights drawn from r, then dw_test_train_fixed on one batch of B x T tokens
 * drawn from r (B*T <= 4096): the first and last loss. */
dw_status dw_test_model_train_random(dw_test_model *m, int64_t B, int64_t T, int steps, double lr, dw_test_rng *r,
                                     double *first, double *last);

/* a and b (two programs of one model, e.g. with and without a memory-saving pass) trained as
 * dw_test_model_train_random from generators seeded with seed: 0 when their first and last losses,
 * every parameter after the last step and the MoE routing counters (if any, not all zero) are the
 * same bits, 1 when one differs (named on stderr after `what`), -1 when a call fails. a's losses
 * into *first, *last. */
int dw_test_same_training(dw_test_model *a, dw_test_model *b, int64_t B, int64_t T, int steps, double lr,
                          uint64_t seed, const char *what, double *first, double *last);

/* A host mirror of an engine's AdamW for checking dw_engine_step bit for bit: a copy of every
 * parameter (read back at creation) and its moments (zero at creation: create it before the
 * engine's first step). dw_test_optref_step applies what dw_engine_step(e, o, step) must do, with
 * the engine's gradients read back: the global norm over the gradient pool in the program's order
 * (dw_cpu_sumsq), then dw_cpu_adamw per parameter (decay per the graph's flag). Returns the norm. */
typedef struct dw_test_optref dw_test_optref;
dw_test_optref *dw_test_optref_create(dw_engine *e);
double dw_test_optref_step(dw_test_optref *r, dw_engine *e, const dw_adamw_opts *o, int64_t step);
/* Parameter i's mirrored values (what 0), m (1) or v (2): numel floats. */
const float *dw_test_optref_get(const dw_test_optref *r, int i, int what);
void dw_test_optref_free(dw_test_optref *r);

/* Whether two buffers of c's activation arena share bytes while both are live; the first such pair
 * into *a, *b and the time into *t. */
struct dw_compiled;
bool dw_test_plan_overlap(const struct dw_compiled *c, int *a, int *b, int *t);

#endif
