/* compile.c — dw_compile: schedule, per-node precision and kernel binding, parameter pool layout
 * and the activation arena (lifetimes over the schedule -> dw_memplan_assign). Planning only:
 * nothing here touches a device. The report text is in compile_report.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/compile.h"
#include "core/error.h"
#include "kernels/cuda/ops_cuda.h"

const char *dw_pool_name(dw_pool_id p) {
    static const char *names[DW_POOL_COUNT] = {"weights", "grads", "optimizer", "activations",
                                               "workspace"};
    return p >= 0 && p < DW_POOL_COUNT ? names[p] : "?";
}

static int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

void dw_compiled_free(dw_compiled *c) {
    if (!c) return;
    for (int i = 0; c->bind && i < c->g->n_nodes; i++) free(c->bind[i].note);
    free(c->bind);
    free(c->unsupported);
    free(c->param_tensor);
    free(c->param_off);
    free(c->items);
    free(c->info);
    free(c->val_off);
    free(c->grad_off);
    free(c->grad_alias);
    free(c->aux_off);
    free(c->tmp_off);
    free(c->grad_mode);
    free(c->fused);
    free(c->gelu_producer);
    free(c->gelu_consumer);
    free(c->wq);
    free(c);
}

int64_t dw_compiled_pool_bytes(const dw_compiled *c, int pool) {
    return c && pool >= 0 && pool < DW_POOL_COUNT ? c->pool_bytes[pool] : 0;
}

/* ---- kernel binding ---------------------------------------------------------------------- */
static void bind_other(dw_node_binding *b, dw_op op) {
    b->supported = true;
    b->kernel_why = "the one CUDA kernel of this op (kernels/cuda/ops_*.cu), FP32 compute";
    switch (op) {
    case DW_OP_EMBEDDING: b->kernel = "dw_cuda_embedding_fwd/bwd"; break;
    case DW_OP_POSITION: b->kernel = "dw_cuda_pos_fwd/bwd"; break;
    case DW_OP_ROPE: b->kernel = "dw_cuda_rope_fwd/bwd"; break;
    case DW_OP_LAYERNORM: b->kernel = "dw_cuda_layernorm_fwd/bwd"; break;
    case DW_OP_RMSNORM: b->kernel = "dw_cuda_rmsnorm_fwd/bwd"; break;
    case DW_OP_GELU: b->kernel = "dw_cuda_gelu_fwd/bwd"; break;
    case DW_OP_SILU: b->kernel = "dw_cuda_silu_fwd/bwd"; break;
    case DW_OP_SWIGLU: b->kernel = "dw_cuda_swiglu_fwd/bwd"; break;
    case DW_OP_ADD: b->kernel = "dw_cuda_add_fwd (backward: copy/accumulate)"; break;
    case DW_OP_ATTENTION:
        b->kernel = "dw_cuda_attention_fwd/bwd";
        b->kernel_why = "tiled causal flash-style attention with GQA (ops_attention.cu), FP32 compute";
        break;
    case DW_OP_CROSS_ENTROPY:
        b->kernel = "dw_cuda_cross_entropy (fused)";
        b->kernel_why = "loss and dlogits in one pass per row, in place over the logits; loss "
                        "reduced on the device";
        break;
    default: b->kernel = "?"; b->supported = false; break;
    }
}

/* ---- quantised linear layers ------------------------------------------------------------- */
bool dw_compile_quant_recipe(dw_recipe r) { return r != DW_RECIPE_BF16 && (int)r >= 0 && r < DW_RECIPE_COUNT; }

dw_recipe dw_compile_quant_act_recipe(dw_recipe r) { return r == DW_RECIPE_FP8_BLOCK2D ? DW_RECIPE_FP8_BLOCK : r; }
dw_recipe dw_compile_quant_weight_recipe(dw_recipe r) { return r == DW_RECIPE_FP8_BLOCK ? DW_RECIPE_FP8_BLOCK2D : r; }

void dw_compile_quant_shape(dw_qpass pass, int64_t N, int64_t K, int64_t M, int64_t *m, int64_t *n, int64_t *k) {
    switch (pass) {
    case DW_QPASS_FPROP: *m = N, *n = M, *k = K; break; /* y [N,M] = x [N,K] . W^T */
    case DW_QPASS_DGRAD: *m = N, *n = K, *k = M; break; /* dx [N,K] = dy [N,M] . W */
    default: *m = M, *n = K, *k = N; break;             /* dW [M,K] = dy^T [M,N] . x */
    }
}

bool dw_compile_quant_gemm_ok(dw_recipe r, dw_qpass pass, int64_t m, int64_t n, int64_t k, const char **why) {
    *why = NULL;
    bool block = r == DW_RECIPE_FP8_BLOCK || r == DW_RECIPE_FP8_BLOCK2D;
    bool fp8 = r == DW_RECIPE_FP8_TENSOR || r == DW_RECIPE_FP8_ROW || block;
    if (!fp8) return true; /* MX / NVFP4 on sm_90: exact BF16 dequantisation, any shape */
    if (k % 16) return *why = "cuBLASLt FP8 needs k % 16 == 0", false;
    if (block && (k % 128 || m % 16))
        return *why = "cuBLASLt block scaling needs k % 128 == 0 and m % 16 == 0", false;
    if ((n * (pass == DW_QPASS_WGRAD ? 4 : 2)) % 16)
        return *why = "cuBLASLt FP8 needs 16-byte output rows", false;
    return true;
}

bool dw_compile_quant_pass_ok(dw_recipe r, dw_qpass pass, int64_t N, int64_t K, int64_t M) {
    int64_t m, n, k;
    const char *why;
    dw_compile_quant_shape(pass, N, K, M, &m, &n, &k);
    return dw_compile_quant_gemm_ok(r, pass, m, n, k, &why);
}

bool dw_compile_dgrad_accumulates(const dw_compiled *c, int i) {
    const dw_ir_node *n = &c->g->nodes[i];
    if (!c->bf16 || n->op != DW_OP_LINEAR || c->grad_mode[i][0] != DW_GRAD_ACCUM) return false;
    return !(c->fused && dw_compile_fused_gelu_bwd(c, i) >= 0);
}

/* Node i's note: per GEMM at the planned shape, quantised or the BF16 fallback and why. */
static dw_status quant_note(dw_ctx *ctx, dw_compiled *c, int i) {
    const dw_graph *g = c->g;
    const dw_ir_node *n = &g->nodes[i];
    const dw_ir_tensor *x = &g->tensors[n->in[0]], *y = &g->tensors[n->out];
    int64_t N = g->batch * g->seq, K = x->shape[x->ndim - 1], M = y->shape[y->ndim - 1];
    static const char *names[DW_QPASS_COUNT] = {"fprop", "dgrad", "wgrad"};
    char buf[512];
    size_t used = 0;
    for (int p = 0; p < DW_QPASS_COUNT; p++) {
        int64_t m, nn, k;
        const char *why = NULL;
        dw_compile_quant_shape((dw_qpass)p, N, K, M, &m, &nn, &k);
        bool ok = dw_compile_quant_gemm_ok(c->bind[i].recipe, (dw_qpass)p, m, nn, k, &why);
        int w = snprintf(buf + used, sizeof buf - used, "%s%s %lldx%lldx%lld %s%s%s", p ? "; " : "", names[p],
                         (long long)m, (long long)nn, (long long)k, ok ? "quantised" : "BF16 FALLBACK (",
                         ok ? "" : why, ok ? "" : ")");
        if (w > 0 && (size_t)w < sizeof buf - used) used += (size_t)w;
    }
    c->bind[i].note = strdup(buf);
    return c->bind[i].note ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
}

static dw_status bind_nodes(dw_ctx *ctx, dw_compiled *c, const dw_policy *policy) {
    const dw_graph *g = c->g;
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        dw_node_binding *b = &c->bind[i];
        b->rule = -1;
        b->recipe = DW_RECIPE_BF16;
        b->reason = DW_POLICY_NOT_GEMM;
        if (policy)
            b->recipe = dw_policy_resolve(policy, n->name, dw_op_name(n->op), g->model.n_blocks,
                                          &b->reason, &b->rule);
        if (n->op != DW_OP_LINEAR) {
            b->recipe = DW_RECIPE_BF16;
            b->reason = DW_POLICY_NOT_GEMM;
            bind_other(b, n->op);
            continue;
        }
        if (!policy) {
            b->reason = DW_POLICY_NOT_GEMM;
            b->kernel = "dw_cuda_linear_fwd/bwd";
            b->kernel_why = "FP32 mode (no precision policy): the FP32 reference GEMM, for parity "
                            "with the CPU engine";
            b->supported = true;
        } else if (b->recipe == DW_RECIPE_BF16) {
            b->kernel = "dw_gemm (registry; cublaslt_bf16 on sm_80+)";
            b->kernel_why = "BF16 operands (BF16 working copy of the weight), FP32 accumulation; "
                            "fprop x W^T, dgrad dy W, wgrad dy^T x accumulated into FP32 grads";
            b->supported = true;
        } else if (dw_compile_quant_recipe(b->recipe)) {
            b->kernel = "dw_quantize_cuda + dw_gemm (sm_90: cublaslt_fp8_sm90 for fp8_*, "
                        "deepwell_mx_dequant_bf16 for mx*/nvfp4)";
            b->kernel_why = "x and W quantised along K (fprop), dy along out and W^T (dgrad), dy^T and x^T "
                            "along tokens (wgrad), scales from the current amax, dy in the node's recipe too "
                            "(fp8_block, fp8_block2d: W and W^T in 128x128 blocks, x and dy in 1x128); a GEMM whose shape "
                            "the quantised kernel refuses runs in BF16";
            b->supported = true;
            DW_TRY(quant_note(ctx, c, i));
        } else {
            b->kernel = "none";
            b->kernel_why = "no quantised linear layer for this recipe in the CUDA engine";
            b->supported = false;
            if (!c->unsupported) {
                size_t len = strlen(n->name) + 200;
                c->unsupported = malloc(len);
                if (!c->unsupported) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
                snprintf(c->unsupported, len, "node '%s' resolves to recipe %s, which the CUDA "
                         "engine cannot run for x, W and dy alike; use another recipe for it",
                         n->name, dw_recipe_name(b->recipe));
            }
        }
    }
    return DW_OK;
}

/* ---- parameter pools ------------------------------------------------------------------------ */
static dw_status layout_params(dw_ctx *ctx, dw_compiled *c) {
    const dw_graph *g = c->g;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].kind == DW_TENSOR_PARAM) c->n_params++;
    size_t np = (size_t)(c->n_params ? c->n_params : 1);
    c->param_tensor = malloc(np * sizeof *c->param_tensor);
    c->param_off = malloc(np * sizeof *c->param_off);
    if (!c->param_tensor || !c->param_off) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    int p = 0;
    for (int i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].kind == DW_TENSOR_PARAM) c->param_tensor[p++] = i;
    int64_t off = 0;
    for (int pass = 0; pass < 2; pass++) { /* decay parameters first, then the rest */
        for (p = 0; p < c->n_params; p++) {
            const dw_ir_tensor *t = &g->tensors[c->param_tensor[p]];
            if (t->decay != (pass == 0)) continue;
            c->param_off[p] = off;
            off = align_up(off + dw_ir_numel(t), 64);
        }
        if (pass == 0) c->decay_floats = off;
    }
    c->param_floats = off > 0 ? off : 64;
    return DW_OK;
}

/* ---- activation arena ------------------------------------------------------------------------ */
/* Does node n's backward read the values of its inputs? */
static bool bwd_reads_inputs(dw_op op) {
    return !(op == DW_OP_ADD || op == DW_OP_ROPE || op == DW_OP_POSITION ||
             op == DW_OP_CROSS_ENTROPY); /* cross-entropy is fused into the forward step */
}

/* Bytes of node n's parts (aux, tmp) at capacity. */
static void node_parts(const dw_compiled *c, int ni, int64_t aux[DW_AUX_COUNT],
                       int64_t tmp[DW_TMP_COUNT]) {
    const dw_graph *g = c->g;
    const dw_ir_node *n = &g->nodes[ni];
    const int64_t N = g->batch * g->seq, as = c->act_size;
    memset(aux, 0, sizeof(int64_t) * DW_AUX_COUNT);
    memset(tmp, 0, sizeof(int64_t) * DW_TMP_COUNT);
    for (int s = 0; s < n->n_in; s++)
        if (c->grad_mode[ni][s] == DW_GRAD_ACCUM && !(s == 0 && dw_compile_dgrad_accumulates(c, ni)))
            tmp[DW_TMP_ACC0 + s] = dw_ir_numel(&g->tensors[n->in[s]]) * as;
    const dw_ir_attrs *a = &n->attrs;
    switch (n->op) {
    case DW_OP_LAYERNORM: /* DELTA: the one-pass backward's partial column sums */
        aux[DW_AUX_STAT0] = aux[DW_AUX_STAT1] = N * 4;
        tmp[DW_TMP_DELTA] = (int64_t)dw_cuda_norm_bwd_ws_bytes(N, dw_ir_numel(&g->tensors[n->out]) / N);
        break;
    case DW_OP_RMSNORM:
        aux[DW_AUX_STAT0] = N * 4;
        tmp[DW_TMP_DELTA] = (int64_t)dw_cuda_norm_bwd_ws_bytes(N, dw_ir_numel(&g->tensors[n->out]) / N);
        break;
    case DW_OP_ATTENTION:
        aux[DW_AUX_STAT0] = N * a->heads * 4;
        tmp[DW_TMP_DELTA] = N * a->heads * 4;
        if (n->n_in == 1) {
            aux[DW_AUX_Q] = tmp[DW_TMP_GQ] = N * a->heads * a->head_dim * as;
            aux[DW_AUX_K] = aux[DW_AUX_V] = tmp[DW_TMP_GK] = tmp[DW_TMP_GV] =
                N * a->kv_heads * a->head_dim * as;
        }
        break;
    case DW_OP_CROSS_ENTROPY: tmp[DW_TMP_XENT] = 16 + N * 4; break; /* dw_cuda_cross_entropy_ws_bytes */
    default: break;
    }
}

typedef struct {
    dw_mem_item *items;
    dw_buf_info *info;
    int n, cap;
} item_list;

static int add_item(item_list *l, int64_t size, int first, int last, dw_buf_kind kind, int index) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        dw_mem_item *it = realloc(l->items, (size_t)cap * sizeof *it);
        if (!it) return -1;
        l->items = it;
        dw_buf_info *in = realloc(l->info, (size_t)cap * sizeof *in);
        if (!in) return -1;
        l->info = in;
        l->cap = cap;
    }
    l->items[l->n] = (dw_mem_item){.size = size, .first = first, .last = last, .align = 256};
    l->info[l->n] = (dw_buf_info){kind, index};
    return l->n++;
}

static void place_parts(const int64_t *sizes, int count, int64_t base, int64_t *offs) {
    int64_t o = base;
    for (int k = 0; k < count; k++) {
        offs[k] = sizes[k] ? o : -1;
        o += align_up(sizes[k], 256);
    }
}

static int64_t parts_total(const int64_t *sizes, int count) {
    int64_t t = 0;
    for (int k = 0; k < count; k++) t += align_up(sizes[k], 256);
    return t;
}

/* Gradient delivery: the first backward step to reach a tensor writes it, later ones add. */
static dw_status plan_grad_modes(dw_ctx *ctx, dw_compiled *c) {
    const dw_graph *g = c->g;
    c->grad_mode = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof *c->grad_mode);
    bool *written = calloc((size_t)(g->n_tensors ? g->n_tensors : 1), sizeof *written);
    if (!c->grad_mode || !written) {
        free(written);
        return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    }
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        const dw_ir_node *n = &g->nodes[i];
        for (int s = 0; s < n->n_in; s++) {
            int t = n->in[s];
            if (g->tensors[t].kind != DW_TENSOR_ACT) continue;
            c->grad_mode[i][s] = written[t] ? DW_GRAD_ACCUM : DW_GRAD_WRITE;
            written[t] = true;
        }
    }
    free(written);
    return DW_OK;
}

/* The root of t's alias chain. */
static int grad_root(const dw_compiled *c, int t) {
    while (c->grad_alias[t] != t) t = c->grad_alias[t];
    return t;
}

/* Gradient buffers shared through residual adds (BF16 and FP32 modes alike). For y = a + b, an
 * input whose gradient the add writes first (DW_GRAD_WRITE) can take y's gradient buffer: y's
 * gradient is read by the add's backward alone, so it is dead afterwards and the input's gradient
 * starts as the same values. Input a (slot 0) always may. Input b (slot 1) may too when the add is
 * b's only reader (nothing else ever writes b's gradient) and, if a shares the buffer as well,
 * every other reader of a comes before b's producer in the graph: their backward steps, which
 * accumulate into a's gradient, run after b's producer has read b's gradient. Adds are visited
 * from the last, so a residual stream's gradient is one buffer from the loss to the embedding. */
static dw_status plan_grad_alias(dw_ctx *ctx, dw_compiled *c) {
    const dw_graph *g = c->g;
    c->grad_alias = malloc((size_t)(g->n_tensors ? g->n_tensors : 1) * sizeof *c->grad_alias);
    if (!c->grad_alias) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    for (int t = 0; t < g->n_tensors; t++) c->grad_alias[t] = t;
    for (int p = g->n_nodes - 1; p >= 0; p--) {
        const dw_ir_node *n = &g->nodes[p];
        if (n->op != DW_OP_ADD || n->out == g->logits) continue;
        const int a = n->in[0], b = n->in[1];
        if (a == b || g->tensors[a].kind != DW_TENSOR_ACT || g->tensors[b].kind != DW_TENSOR_ACT) continue;
        const bool wa = c->grad_mode[p][0] == DW_GRAD_WRITE, wb = c->grad_mode[p][1] == DW_GRAD_WRITE;
        bool share_b = wb;
        for (int i = 0; share_b && i < g->n_nodes; i++) { /* b read by this add alone */
            const dw_ir_node *m = &g->nodes[i];
            for (int s = 0; s < m->n_in; s++)
                if (m->in[s] == b && i != p) share_b = false;
        }
        const int pb = g->tensors[b].producer;
        for (int i = 0; share_b && wa && i < g->n_nodes; i++) { /* a's other readers before b's producer */
            const dw_ir_node *m = &g->nodes[i];
            for (int s = 0; s < m->n_in; s++)
                if (m->in[s] == a && i != p && i >= pb) share_b = false;
        }
        const int root = grad_root(c, n->out);
        if (wa) c->grad_alias[a] = root;
        if (share_b) c->grad_alias[b] = root;
    }
    return DW_OK;
}

static dw_status plan_arena(dw_ctx *ctx, dw_compiled *c) {
    const dw_graph *g = c->g;
    const int nn = g->n_nodes, nt = g->n_tensors;
    c->val_off = malloc((size_t)nt * sizeof *c->val_off);
    c->grad_off = malloc((size_t)nt * sizeof *c->grad_off);
    c->aux_off = malloc((size_t)nn * sizeof *c->aux_off);
    c->tmp_off = malloc((size_t)nn * sizeof *c->tmp_off);
    int *vitem = malloc((size_t)nt * sizeof *vitem), *gitem = malloc((size_t)nt * sizeof *gitem);
    int *aitem = malloc((size_t)nn * sizeof *aitem), *titem = malloc((size_t)nn * sizeof *titem);
    int *fitem = malloc((size_t)nn * sizeof *fitem);
    int *gf = malloc((size_t)nt * sizeof *gf), *gl = malloc((size_t)nt * sizeof *gl);
    int64_t *gb = calloc((size_t)(nt ? nt : 1), sizeof *gb); /* gradient lifetimes and bytes */
    item_list l = {0};
    dw_status st = DW_OK;
    if (!c->val_off || !c->grad_off || !c->aux_off || !c->tmp_off || !vitem || !gitem || !aitem || !titem ||
        !fitem || !gf || !gl || !gb) {
        st = dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
        goto done;
    }
    const int logits = g->logits, last_step = c->n_steps - 1;
    for (int t = 0; t < nt; t++) gf[t] = last_step + 1, gl[t] = -1;
    for (int t = 0; t < nt; t++) {
        c->val_off[t] = c->grad_off[t] = -1;
        vitem[t] = gitem[t] = -1;
        const dw_ir_tensor *ten = &g->tensors[t];
        if (ten->kind != DW_TENSOR_ACT || t == g->loss) continue; /* the loss lives in workspace */
        int p = ten->producer;
        int vfirst = dw_compile_fwd_step(c, p), vlast = vfirst, gfirst = last_step + 1;
        /* fusion: a GELU computed by its linear's epilogue is written at that linear's step; the
         * gradient of a GELU's input written by the next linear's dgrad (DGELU) at its step, and
         * the GELU output's gradient then never exists */
        const bool gelu = g->nodes[p].op == DW_OP_GELU;
        if (gelu && (c->fused[p] & DW_FUSED_FWD)) vfirst = dw_compile_fwd_step(c, g->tensors[g->nodes[p].in[0]].producer);
        bool no_grad = gelu && (c->fused[p] & DW_FUSED_BWD);
        if (g->nodes[p].op == DW_OP_ATTENTION) vlast = dw_compile_bwd_step(c, p); /* reads out */
        for (int i = p + 1; i < nn; i++) {
            const dw_ir_node *n = &g->nodes[i];
            for (int s = 0; s < n->n_in; s++) {
                if (n->in[s] != t) continue;
                int f = dw_compile_fwd_step(c, i), b = dw_compile_bwd_step(c, i);
                if (f > vlast) vlast = f;
                if (bwd_reads_inputs(n->op) && b > vlast) vlast = b;
                if (b < gfirst) gfirst = b;
                if (n->op == DW_OP_GELU && (c->fused[i] & DW_FUSED_BWD)) { /* written by the dgrad of */
                    int f2 = dw_compile_bwd_step(c, c->gelu_consumer[i]); /* the linear after the GELU */
                    if (f2 < gfirst) gfirst = f2;
                }
            }
        }
        if (t == logits) vlast = dw_compile_bwd_step(c, p); /* dlogits in place, read by lm_head bwd */
        int64_t bytes = dw_ir_numel(ten) * c->act_size;
        vitem[t] = add_item(&l, bytes, vfirst, vlast, DW_BUF_VALUE, t);
        if (vitem[t] < 0) goto nomem;
        if (t != logits && gfirst <= last_step && !no_grad) { /* lifetime; the item once per alias root */
            const int r = grad_root(c, t), glast = dw_compile_bwd_step(c, p);
            if (gfirst < gf[r]) gf[r] = gfirst;
            if (glast > gl[r]) gl[r] = glast;
            if (bytes > gb[r]) gb[r] = bytes;
            if (bytes > gb[t]) gb[t] = bytes; /* t has a gradient */
        }
    }
    for (int t = nt - 1; t >= 0; t--) { /* one item per alias root, over its members' joint lifetime */
        if (gb[t] <= 0 || grad_root(c, t) != t) continue;
        gitem[t] = add_item(&l, gb[t], gf[t], gl[t], DW_BUF_GRAD, t);
        if (gitem[t] < 0) goto nomem;
    }
    for (int t = 0; t < nt; t++)
        if (gb[t] > 0 && gitem[t] < 0) gitem[t] = gitem[grad_root(c, t)];
    for (int i = 0; i < nn; i++) {
        int64_t aux[DW_AUX_COUNT], tmp[DW_TMP_COUNT];
        node_parts(c, i, aux, tmp);
        int64_t a = parts_total(aux, DW_AUX_COUNT), ft = tmp[DW_TMP_XENT];
        int64_t bt = parts_total(tmp, DW_TMP_COUNT) - align_up(ft, 256);
        aitem[i] = titem[i] = fitem[i] = -1;
        if (a && (aitem[i] = add_item(&l, a, dw_compile_fwd_step(c, i), dw_compile_bwd_step(c, i),
                                      DW_BUF_AUX, i)) < 0)
            goto nomem;
        if (ft && (fitem[i] = add_item(&l, ft, dw_compile_fwd_step(c, i), dw_compile_fwd_step(c, i),
                                       DW_BUF_FTMP, i)) < 0)
            goto nomem;
        if (bt && (titem[i] = add_item(&l, bt, dw_compile_bwd_step(c, i), dw_compile_bwd_step(c, i),
                                       DW_BUF_BTMP, i)) < 0)
            goto nomem;
    }
    st = dw_memplan_assign(ctx, l.items, l.n, &c->arena_bytes);
    if (st != DW_OK) goto done;
    c->live_peak = dw_memplan_live_peak(l.items, l.n);
    for (int t = 0; t < nt; t++) {
        if (vitem[t] >= 0) c->val_off[t] = l.items[vitem[t]].offset;
        if (gitem[t] >= 0) c->grad_off[t] = l.items[gitem[t]].offset;
    }
    if (logits >= 0) c->grad_off[logits] = c->val_off[logits];
    for (int i = 0; i < nn; i++) {
        int64_t aux[DW_AUX_COUNT], tmp[DW_TMP_COUNT];
        node_parts(c, i, aux, tmp);
        place_parts(aux, DW_AUX_COUNT, aitem[i] >= 0 ? l.items[aitem[i]].offset : 0, c->aux_off[i]);
        int64_t xent = tmp[DW_TMP_XENT];
        tmp[DW_TMP_XENT] = 0;
        place_parts(tmp, DW_TMP_COUNT, titem[i] >= 0 ? l.items[titem[i]].offset : 0, c->tmp_off[i]);
        c->tmp_off[i][DW_TMP_XENT] = fitem[i] >= 0 && xent ? l.items[fitem[i]].offset : -1;
    }
    c->items = l.items;
    c->info = l.info;
    c->n_items = l.n;
    l.items = NULL;
    l.info = NULL;
    goto done;
nomem:
    st = dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
done:
    free(l.items);
    free(l.info);
    free(vitem);
    free(gitem);
    free(aitem);
    free(titem);
    free(fitem);
    free(gf);
    free(gl);
    free(gb);
    return st;
}

/* Sizes of a quantised slot: the largest codes and scales of the operands it holds. */
typedef struct {
    int64_t codes, scales;
} qsize;

static void qsize_fit(qsize *s, dw_recipe r, int64_t R, int64_t C) {
    int64_t cb = R * dw_quant_row_bytes(r, C), sb = (int64_t)dw_quant_scales_bytes(r, R, C);
    if (cb > s->codes) s->codes = cb;
    if (sb > s->scales) s->scales = sb;
}

/* Places a slot of size s at *o (codes, scales, then the NVFP4 tensor scale); off -1 when empty. */
static dw_qslot_layout qslot_place(qsize s, int64_t *o) {
    dw_qslot_layout l = {.off = -1, .scales = 0, .tscale = 0, .bytes = 0};
    if (s.codes == 0) return l;
    l.off = *o;
    l.scales = align_up(s.codes, 256);
    l.tscale = l.scales + align_up(s.scales, 256);
    l.bytes = l.tscale + 256;
    *o += l.bytes;
    return l;
}

static bool quantised_linear(const dw_compiled *c, int i) {
    return c->g->nodes[i].op == DW_OP_LINEAR && c->bf16 && dw_compile_quant_recipe(c->bind[i].recipe);
}

/* The per-step operand slots (x, dy; dy^T; x^T), the quantiser's scratch, and each quantised
 * node's cached W and W^T. */
static dw_status layout_quant(dw_ctx *ctx, dw_compiled *c, int64_t *o) {
    const dw_graph *g = c->g;
    const int64_t N = g->batch * g->seq;
    dw_work_layout *w = &c->work;
    qsize rows = {0, 0}, dyt = {0, 0}, xt = {0, 0};
    int64_t ws = 0;
    c->wq = malloc((size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof *c->wq);
    if (!c->wq) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    for (int i = 0; i < g->n_nodes; i++) {
        c->wq[i][0].off = c->wq[i][1].off = -1;
        if (!quantised_linear(c, i)) continue;
        const dw_ir_node *n = &g->nodes[i];
        const dw_ir_tensor *x = &g->tensors[n->in[0]], *y = &g->tensors[n->out];
        int64_t K = x->shape[x->ndim - 1], M = y->shape[y->ndim - 1];
        const dw_recipe r = c->bind[i].recipe;
        const dw_recipe rw = dw_compile_quant_weight_recipe(r), ra = dw_compile_quant_act_recipe(r); /* W's; x's, dy's */
        qsize_fit(&rows, ra, N, K);
        qsize_fit(&rows, ra, N, M);
        qsize_fit(&dyt, ra, M, N);
        qsize_fit(&xt, ra, K, N);
        qsize wsz = {0, 0}, wtsz = {0, 0};
        qsize_fit(&wsz, rw, M, K);
        qsize_fit(&wtsz, rw, K, M);
        c->wq[i][0] = qslot_place(wsz, o);
        c->wq[i][1] = qslot_place(wtsz, o);
        const int64_t dims[6][2] = {{N, K}, {K, N}, {M, K}, {K, M}, {N, M}, {M, N}};
        for (int d = 0; d < 6; d++) { /* quant.cu's amax scratch: at most fp8_row's (1 + R + C) words */
            int64_t b = (1 + dims[d][0] + dims[d][1]) * 4;
            if (b > ws) ws = b;
        }
    }
    w->q_rows = qslot_place(rows, o);
    w->q_dyt = qslot_place(dyt, o);
    w->q_xt = qslot_place(xt, o);
    w->quant_ws = ws ? *o : -1, w->quant_ws_bytes = align_up(ws, 256), *o += w->quant_ws_bytes;
    return DW_OK;
}

static dw_status layout_work(dw_ctx *ctx, dw_compiled *c) {
    const int64_t N = c->g->batch * c->g->seq;
    dw_work_layout *w = &c->work;
    int64_t o = 0;
    w->tokens = o, o = align_up(o + N * 4, 256);
    w->targets = o, o = align_up(o + N * 4, 256);
    w->loss = o, o = align_up(o + 4, 256);
    w->norm = o, o = align_up(o + 8, 256);
    w->partials = o, o = align_up(o + DW_COMPILE_NORM_BLOCKS * 8, 256);
    w->adamw_args = o, o = align_up(o + DW_COMPILE_ADAMW_ARGS_BYTES, 256);
    int64_t widest = 0; /* biased linear layers' output width */
    for (int i = 0; c->bf16 && i < c->g->n_nodes; i++) {
        const dw_ir_node *n = &c->g->nodes[i];
        const dw_ir_tensor *y = &c->g->tensors[n->out];
        if (n->op == DW_OP_LINEAR && n->n_in == 3 && y->shape[y->ndim - 1] > widest) widest = y->shape[y->ndim - 1];
    }
    w->bgrad = widest ? o : -1, o = align_up(o + widest * 4, 256);
    DW_TRY(layout_quant(ctx, c, &o));
    w->bytes = o;
    return DW_OK;
}

dw_status dw_compile(dw_ctx *ctx, const dw_graph *g, const char *plan, const dw_policy *policy,
                     dw_compiled **out) {
    *out = NULL;
    if (!g) return dw_set_error(ctx, DW_ERR_INVALID, "compile: no graph");
    if (plan)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "compile: parallel plan '%s': the engine runs "
                            "on one GPU only for now (pass no plan)", plan);
    if (g->logits < 0 || g->loss < 0 || g->tokens < 0 || g->targets < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "compile: the graph has no tokens/targets/logits/loss roles");
    dw_compiled *c = calloc(1, sizeof *c);
    if (!c) return dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    c->g = g;
    c->bf16 = policy != NULL;
    c->act_size = c->bf16 ? 2 : 4;
    snprintf(c->precision, sizeof c->precision, "%s",
             policy ? dw_recipe_name(policy->default_recipe) : "fp32");
    c->n_steps = 2 * g->n_nodes;
    c->bind = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof *c->bind);
    dw_status st = c->bind ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "compile: out of memory");
    if (st == DW_OK) st = bind_nodes(ctx, c, policy);
    if (st == DW_OK) st = layout_params(ctx, c);
    if (st == DW_OK) st = plan_grad_modes(ctx, c);
    if (st == DW_OK) st = dw_compile_fuse(ctx, c);
    if (st == DW_OK) st = plan_grad_alias(ctx, c);
    if (st == DW_OK) st = plan_arena(ctx, c);
    if (st == DW_OK) st = layout_work(ctx, c);
    if (st != DW_OK) {
        dw_compiled_free(c);
        return st;
    }
    c->pool_bytes[DW_POOL_WEIGHTS] = c->param_floats * (4 + (c->bf16 ? 2 : 0));
    c->pool_bytes[DW_POOL_GRADS] = c->param_floats * 4;
    c->pool_bytes[DW_POOL_OPTIM] = c->param_floats * 8;
    c->pool_bytes[DW_POOL_ACT] = c->arena_bytes > 0 ? c->arena_bytes : 256;
    c->pool_bytes[DW_POOL_WORK] = c->work.bytes;
    *out = c;
    return DW_OK;
}
