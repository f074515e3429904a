/* compile_explain.c — dw_compiled_explain (`deepwell compile --explain`, `dryrun --explain`): the
 * grouped GEMM selection of every MoE linear layer, per pass, with every candidate kernel and why
 * it was or was not eligible (bind_grouped.c tells each). */
#include <stdio.h>
#include <stdlib.h>

#include "compile/bind_grouped.h"
#include "core/error.h"

dw_status dw_compiled_explain(dw_ctx *ctx, const dw_compiled *c, char **out) {
    *out = NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return dw_set_error(ctx, DW_ERR_NOMEM, "compile explain: out of memory");
    const bool cuda = c->target.device == DW_DEVICE_CUDA;
    fprintf(f, "grouped GEMM selections (target %s", cuda ? "cuda" : "cpu");
    if (cuda) fprintf(f, " sm_%d", c->target.sm);
    fprintf(f, "): every registered grouped kernel per MoE linear pass, eligible or why not\n");
    int layers = 0;
    for (int i = 0; i < c->g->n_nodes; i++) {
        if (c->g->nodes[i].op != DW_OP_MOE_LINEAR) continue;
        fprintf(f, "%4d %s\n", i, c->g->nodes[i].name);
        dw_compile_explain_grouped(c, i, f);
        layers++;
    }
    if (!layers) fprintf(f, "  (no MoE linear layers in this program)\n");
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return dw_set_error(ctx, DW_ERR_NOMEM, "compile explain: out of memory");
    }
    *out = buf;
    return DW_OK;
}
