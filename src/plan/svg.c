/* svg.c — an SVG timeline of one simulated pipeline step: one row per pipeline rank, forward
 * (light) and backward (dark) blocks coloured by micro-batch, idle time (bubbles) left as the
 * grey row background. Written atomically. Pictures only; numbers come from the simulation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/strbuf.h"
#include "plan/plan.h"

dw_status dw_pipe_write_svg(dw_ctx *ctx, const dw_plan_in *in, const dw_par *par, const char *path) {
    int P = par->pp * par->vpp;
    int64_t ops = 2 * par->grad_accum * P;
    if (ops > 40000)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                            "%s: the step has %lld forward/backward blocks, too many to draw (limit 40000)",
                            path, (long long)ops);
    double *fw = calloc((size_t)P, sizeof *fw), *bw = calloc((size_t)P, sizeof *bw);
    double *fc = calloc((size_t)P, sizeof *fc), *bc = calloc((size_t)P, sizeof *bc);
    if (!fw || !bw || !fc || !bc) {
        free(fw), free(bw), free(fc), free(bc);
        return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    dw_sim_in si;
    dw_plan_sim_input(in, par, fw, bw, fc, bc, &si);
    dw_sim_out so;
    dw_status s = dw_pipe_simulate(ctx, &si, true, &so);
    free(fw), free(bw), free(fc), free(bc);
    if (s != DW_OK) return s;
    const double W = 1400, left = 70, row = 26, top = 50;
    double H = top + row * par->pp + 40, scale = (W - left - 20) / (so.makespan > 0 ? so.makespan : 1);
    dw_strbuf b = {0};
    char title[200];
    dw_par_format(par, title, sizeof title);
    double busy = 0, ep_exposed = 0, ep_hidden = 0;
    for (int i = 0; i < par->pp; i++) busy += so.busy[i], ep_exposed += so.comm_exposed[i], ep_hidden += so.comm_hidden[i];
    double bubble = so.makespan > 0 ? 1 - busy / (so.makespan * par->pp) : 0;
    dw_strbuf_printf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                  "font-family=\"sans-serif\" font-size=\"11\">\n", W, H);
    dw_strbuf_printf(&b, "<text x=\"10\" y=\"20\" font-size=\"14\">%s</text>\n", title);
    dw_strbuf_printf(&b, "<text x=\"10\" y=\"38\">one step: %.4g s of pipeline, idle (bubble) %.1f%% of rank time; "
                  "EP all-to-all per rank %.4g s exposed, %.4g s hidden; "
                  "light = forward, dark = backward, colour = micro-batch</text>\n",
              so.makespan, 100 * bubble, ep_exposed / par->pp, ep_hidden / par->pp);
    for (int i = 0; i < par->pp; i++) {
        double y = top + row * i;
        dw_strbuf_printf(&b, "<text x=\"8\" y=\"%.1f\">stage %d</text>\n", y + row * 0.65, i);
        dw_strbuf_printf(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#e6e6e6\"/>\n", left,
                  y + 2, so.makespan * scale, row - 4);
    }
    for (int64_t k = 0; k < so.n_ops; k++) {
        const dw_sim_op *op = &so.ops[k];
        double x = left + op->start * scale, w = (op->end - op->start) * scale, y = top + row * op->stage;
        int hue = (int)((op->mb * 137.508) + 0.5) % 360;
        int light = op->kind == DW_OP_F ? 70 : 42;
        dw_strbuf_printf(&b, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"hsl(%d,65%%,%d%%)\" "
                      "stroke=\"#fff\" stroke-width=\"0.5\"><title>%c mb %d chunk %d: %.4g-%.4g s</title></rect>\n",
                  x, y + 2, w > 0.3 ? w : 0.3, row - 4, hue, light, op->kind == DW_OP_F ? 'F' : 'B', op->mb,
                  op->chunk, op->start, op->end);
        if (w > 18)
            dw_strbuf_printf(&b, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">%c%d</text>\n", x + 2, y + row * 0.65,
                      op->kind == DW_OP_F ? "#000" : "#fff", op->kind == DW_OP_F ? 'F' : 'B', op->mb);
    }
    dw_strbuf_printf(&b, "<text x=\"%.0f\" y=\"%.0f\">0 s</text><text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.4g s</text>\n",
              left, H - 12, W - 20, H - 12, so.makespan);
    dw_strbuf_printf(&b, "</svg>\n");
    dw_sim_out_free(&so);
    if (b.oom) {
        free(b.s);
        return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory writing %s", path);
    }
    s = dw_write_file_atomic(ctx, path, b.s, b.len);
    free(b.s);
    return s;
}
