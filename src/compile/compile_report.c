/* compile_report.c — the text of `deepwell compile --report`: the target and steps; per node the
 * recipe and why (the policy's reason) and what runs it (the backend's op entry; for linear
 * layers the registry's kernel per GEMM, quantised or the BF16 fallback and why; for MoE linear
 * layers the grouped kernel per pass); per pool the planned bytes; the activation arena's size
 * against the live-buffer lower bound. */
#include <stdio.h>
#include <stdlib.h>

#include "compile/passes.h"
#include "core/error.h"

static const char *kname(const char *k) { return k ? k : "(none)"; }

static void mib(FILE *f, int64_t bytes) {
    fprintf(f, "%14lld B  %10.3f MiB", (long long)bytes, (double)bytes / 1048576.0);
}

dw_status dw_compiled_report(dw_ctx *ctx, const dw_compiled *c, char **out) {
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return dw_set_error(ctx, DW_ERR_NOMEM, "compile report: out of memory");
    const dw_graph *g = c->g;
    fprintf(f, "model %s, batch %lld x seq %lld, precision %s (%s activations)\n",
            g->model.model_type, (long long)g->batch, (long long)g->seq, c->precision,
            c->bf16 ? "BF16" : "FP32");
    const char *dev = c->target.device == DW_DEVICE_CUDA ? "cuda" : "cpu";
    if (c->target.device == DW_DEVICE_CUDA) fprintf(f, "target: cuda, kernels chosen for sm_%d\n", c->target.sm);
    else fprintf(f, "target: cpu (the reference kernels)\n");
    fprintf(f, "program: %d steps (%d forward, %d backward, %d optimizer and weight refresh); one device\n",
            c->n_steps, c->phase[DW_PHASE_FORWARD][1] - c->phase[DW_PHASE_FORWARD][0],
            c->phase[DW_PHASE_BACKWARD][1] - c->phase[DW_PHASE_BACKWARD][0],
            c->phase[DW_PHASE_OPTIMIZER][1] - c->phase[DW_PHASE_OPTIMIZER][0]);
    fprintf(f, "\nnodes (recipe: why | kernel)\n");
    static const char *const pass_names[DW_QPASS_COUNT] = {"fprop", "dgrad", "wgrad"};
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        const dw_prog_node *pn = &c->node[i];
        const dw_node_binding *b = &pn->bind;
        const bool gemm = DW_OP_IS(n, DW_OPF_GEMM), moe = n->op == DW_OP_MOE_LINEAR; /* moe: the policy's too */
        const char *recipe = !gemm && !moe ? (c->bf16 ? "bf16" : "fp32")
                             : c->bf16             ? dw_recipe_name(b->recipe)
                                                   : "fp32";
        fprintf(f, "%4d %-44s %-13s recipe %-10s ", i, n->name, dw_op_name(n->op), recipe);
        if (!c->bf16 && (gemm || moe))
            fprintf(f, "(no policy: FP32 mode)");
        else if (b->reason == DW_POLICY_BY_RULE)
            fprintf(f, "(rule %d)", b->rule);
        else
            fprintf(f, "(%s)", dw_policy_reason_text(b->reason));
        if (pn->fused == (DW_FUSED_FWD | DW_FUSED_BWD))
            fprintf(f, "\n     kernel none of its own: forward and backward run in GEMM epilogues\n");
        else if (n->op == DW_OP_MOE_LINEAR) /* the grouped kernel per pass (bind_grouped.c) */
            fprintf(f, "\n     kernel grouped fprop %s, dgrad %s, wgrad %s\n", kname(b->kernel[0]), kname(b->kernel[1]),
                    kname(b->kernel[2]));
        else if (!gemm || !c->bf16)
            fprintf(f, "\n     kernel dw_%s_op_%s_fwd/bwd%s\n", dev, dw_op_name(n->op),
                    gemm ? " (the FP32 reference GEMM)" : "");
        else {
            fprintf(f, "\n     kernel");
            for (int p = 0; p < DW_QPASS_COUNT; p++)
                fprintf(f, "%s %s %s%s", p ? "," : "", pass_names[p], b->kernel[p] ? b->kernel[p] : "(none)",
                        dw_compile_quant_recipe(b->recipe) && !b->quantised[p] ? " (BF16 fallback)" : "");
            fprintf(f, "\n");
        }
        if (gemm && c->bf16 && dw_compile_quant_recipe(b->recipe)) {
            const dw_recipe ra = dw_compile_quant_act_recipe(b->recipe), rw = dw_compile_quant_weight_recipe(b->recipe);
            int br, bc;
            dw_recipe_block(rw, &br, &bc);
            fprintf(f, "     operands: x, dy, dy^T, x^T %s; W and W^T %s", dw_recipe_name(ra), dw_recipe_name(rw));
            if (br > 1 && bc > 1) fprintf(f, " (W and W^T in %dx%d blocks)", br, bc);
            fprintf(f, "; quantised on the device, scales from the current amax\n");
        }
        if (b->note) fprintf(f, "     at this shape: %s\n", b->note);
        if ((pn->fused & DW_FUSED_FWD) && dw_compile_gelu_epilogue(c, pn->partner_fwd, g->batch * g->seq))
            fprintf(f, "     fused: forward in %s's GEMM epilogue (GELU_AUX)\n", g->nodes[pn->partner_fwd].name);
        else if (pn->fused & DW_FUSED_FWD)
            fprintf(f, "     fused: forward run by %s, a pass right after its GEMM (its quantised kernel has no GELU "
                    "epilogue)\n", g->nodes[pn->partner_fwd].name);
        if (pn->fused & DW_FUSED_BWD)
            fprintf(f, "     fused: backward in %s's dgrad epilogue (DGELU)\n", g->nodes[pn->partner_bwd].name);
        const int nq = dw_compile_norm_quant_reader(c, i, g->batch * g->seq);
        if (nq >= 0)
            fprintf(f, "     fused: writes the fp8_block rows of its output for %s and the layers beside it as it "
                    "computes them (CUDA, quant_reuse; DW_NORM_QUANT=0: not)\n", g->nodes[nq].name);
        const int gq = dw_compile_gelu_quant_reader(c, i, g->batch * g->seq);
        if (gq >= 0)
            fprintf(f, "     fused: writes %s's fp8_block rows as it computes them (CUDA, quant_reuse; DW_GELU_QUANT=0: "
                    "not)\n", g->nodes[gq].name);
        const int q = dw_compile_swiglu_quant_reader(c, i, g->batch * g->seq);
        if (q >= 0)
            fprintf(f, "     fused: writes %s's fp8_block rows as it computes them (CUDA, quant_reuse; "
                    "DW_SWIGLU_QUANT=0: not)\n", g->nodes[q].name);
        int gu[2];
        if (dw_compile_swiglu_bwd_quant(c, i, g->batch * g->seq, gu))
            fprintf(f, "     fused: backward writes %s's and %s's fp8_block dy and dy^T, not BF16 gradients (CUDA, "
                    "quant_reuse; DW_SWIGLU_QUANT_BWD=0: not)\n", g->nodes[gu[0]].name, g->nodes[gu[1]].name);
        else if (dw_compile_swiglu_bwd_moe_rows(c, i, gu))
            fprintf(f, "     fused: backward writes %s's and %s's fp8_block dy rows beside the BF16 gradients (CUDA, "
                    "quant_reuse; DW_SWIGLU_QUANT_BWD=0: not)\n", g->nodes[gu[0]].name, g->nodes[gu[1]].name);
        const int cd = dw_compile_combine_bwd_moe_rows(c, i);
        if (cd >= 0)
            fprintf(f, "     fused: backward writes %s's fp8_block dy rows beside the BF16 gradient (CUDA, quant_reuse, "
                    "dropless; DW_SWIGLU_QUANT_BWD=0: not)\n", g->nodes[cd].name);
        if (i == c->head_linear)
            fprintf(f, "     fused: with %s into head_xent, %lld rows of logits at a time (no logits buffer; its "
                    "backward in the training forward)\n", g->nodes[c->head_xent].name, (long long)c->head_chunk);
    }

    int64_t sizes = 0;
    for (int i = 0; i < c->n_items; i++) sizes += c->items[i].size;
    fprintf(f, "\nmemory plan (one allocation per pool)\n");
    int64_t total = 0;
    for (int p = 0; p < DW_POOL_COUNT; p++) {
        fprintf(f, "  %-12s", dw_pool_name((dw_pool_id)p));
        mib(f, c->pool_bytes[p]);
        switch (p) {
        case DW_POOL_WEIGHTS:
            fprintf(f, "  FP32 master (%d tensors, %lld floats padded)%s\n", c->n_params,
                    (long long)c->param_floats,
                    !c->bf16           ? ""
                    : c->bf16_arena ? "; the BF16 working copies in the activation arena (bf16_arena)"
                                    : " + BF16 working copy");
            break;
        case DW_POOL_GRADS:
            fprintf(f, c->grad_arena ? "  FP32 gradients: none, in the activation arena from each one's first writer "
                                       "(grad_arena, DW_GRAD_ARENA=1)\n"
                                     : "  FP32 gradients\n");
            break;
        case DW_POOL_OPTIM: fprintf(f, "  AdamW m and v, FP32\n"); break;
        case DW_POOL_ACT:
            fprintf(f, "  arena of %d buffers (sum %lld B; live peak %lld B = lower bound)\n",
                    c->n_items, (long long)sizes, (long long)c->live_peak);
            int again = 0, remat = 0, moe = 0;
            for (int i = 0; i < c->g->n_nodes; i++) {
                const bool r = dw_compile_remat(c, i);
                again += dw_compile_recomputed(c, i), remat += r;
                moe += r && c->g->nodes[i].op == DW_OP_MOE_DISPATCH;
            }
            if (c->recompute == DW_RECOMPUTE_FULL)
                fprintf(f, "%14s recompute: %d forwards of blocks 0-%d run again before their block's backward; "
                        "only those blocks' inputs are kept\n", "", again, c->recompute_blocks - 1);
            if (remat && c->recompute == DW_RECOMPUTE_SELECTIVE)
                fprintf(f, "%14s recompute selective: %d forwards (norms feeding linear layers, MLP activations%s) run "
                        "again before their outputs' backward instead of keeping them\n", "", remat,
                        moe ? "; MoE dispatches and expert SwiGLUs" : "");
            else if (remat)
                fprintf(f, "%14s MoE: %d forwards (input norms, dispatches, expert SwiGLUs) run again before their "
                        "outputs' backward instead of keeping them (DW_MOE_REMAT=0 keeps them)\n", "", remat);
            break;
        default: {
            fprintf(f, "  tokens, targets, loss, gradient-norm partials, AdamW arguments");
            int64_t wq = 0, nq = 0;
            const int na = dw_compile_wcache_layers(c);
            for (int i = 0; i < c->g->n_nodes; i++)
                if (c->node[i].wq[0].off >= 0) wq += c->node[i].wq[0].bytes + c->node[i].wq[1].bytes, nq++;
            if (nq) {
                int64_t act = c->work.q_rows.bytes + c->work.q_dyt.bytes + c->work.q_xt.bytes;
                fprintf(f, ";\n%*squantised x, dy, dy^T, x^T slots %.3f MiB; W and W^T of %lld quantised nodes %.3f MiB",
                        44, "", (double)act / 1048576.0, (long long)nq, (double)wq / 1048576.0);
                if (na)
                    fprintf(f, ";\n%*sthe codes of %lld MoE layers' W and W^T in their experts' BF16 rooms in the "
                            "activation arena (wcache_arena)", 44, "", (long long)na);
            }
            fprintf(f, "\n");
            break;
        }
        }
        total += c->pool_bytes[p];
    }
    fprintf(f, "  %-12s", "total");
    mib(f, total);
    fprintf(f, "\n");
    if (c->bf16 && c->target.device == DW_DEVICE_CUDA)
        fprintf(f, "  plus %lld MiB cuBLASLt workspace owned by the GEMM layer (once per context, "
                "allocated when the first engine is created)\n", (long long)(DW_COMPILE_LT_WORKSPACE >> 20));
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return dw_set_error(ctx, DW_ERR_NOMEM, "compile report: out of memory");
    }
    *out = buf;
    return DW_OK;
}
