/* print.c — the graph as a readable listing: one line per node (index, name, op, output shape,
 * inputs), then parameter and FLOP totals. Not a serialisation (see graph_json.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/strbuf.h"
#include "ir/ir.h"

static void shape(dw_strbuf *b, const dw_ir_tensor *t) {
    char s[96];
    size_t len = (size_t)snprintf(s, sizeof s, "(");
    for (int i = 0; i < t->ndim; i++)
        len += (size_t)snprintf(s + len, sizeof s - len, "%s%lld", i ? "," : "", (long long)t->shape[i]);
    snprintf(s + len, sizeof s - len, ")");
    dw_strbuf_printf(b, "%-18s ", s);
}

dw_status dw_graph_print(dw_ctx *ctx, const dw_graph *g, char **out) {
    dw_strbuf b = {0};
    dw_strbuf_printf(&b, "model: %s, %s\n", g->model.model_type, g->model.summary);
    dw_strbuf_printf(&b, "shapes for batch %lld x seq %lld\n\n", (long long)g->batch, (long long)g->seq);
    dw_strbuf_printf(&b, "%-5s %-42s %-14s %-18s %s\n", "#", "node", "op", "output", "inputs");
    double fwd = 0, bwd = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const dw_ir_node *n = &g->nodes[i];
        dw_strbuf_printf(&b, "%-5d %-42s %-14s ", i, n->name, dw_op_name(n->op));
        shape(&b, &g->tensors[n->out[0]]);
        for (int k = 1; k < n->n_out; k++) dw_strbuf_printf(&b, "+ %s ", g->tensors[n->out[k]].name);
        for (int k = 0; k < n->n_in; k++) dw_strbuf_printf(&b, "%s%s", k ? ", " : "", g->tensors[n->in[k]].name);
        dw_strbuf_printf(&b, "\n");
        double f, bb;
        dw_ir_flops(g, n, &f, &bb);
        fwd += f;
        bwd += bb;
    }
    double tok = (double)(g->batch * g->seq);
    dw_strbuf_printf(&b, "\nparams: %lld (%.2f M; tied embeddings counted once)\n", (long long)dw_graph_params(g),
        (double)dw_graph_params(g) / 1e6);
    dw_strbuf_printf(&b, "training FLOPs per token: %.4g (forward %.4g + backward %.4g) at seq %lld\n",
        (fwd + bwd) / tok, fwd / tok, bwd / tok, (long long)g->seq);
    if (b.oom || !b.s) {
        free(b.s);
        *out = NULL;
        return dw_set_error(ctx, DW_ERR_NOMEM, "graph: out of memory printing");
    }
    *out = b.s;
    return DW_OK;
}
