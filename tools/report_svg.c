/* report_svg.c — inline-SVG line plots for `deepwell report` (report_svg.h): a frame, round-number
 * ticks with grid lines on linear axes, one polyline per series and a legend. Pure text output;
 * labels are fixed ASCII from the caller, so nothing here needs escaping. */
#include <math.h>

#include "report_svg.h"

enum { MARGIN_L = 72, MARGIN_R = 16, MARGIN_T = 34, MARGIN_B = 36 };

size_t svg_series_points(const svg_series *s) {
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++) k += isfinite(s->x[i]) && isfinite(s->y[i]);
    return k;
}

/* A round step (1, 2 or 5 times a power of ten) giving about five ticks over [lo, hi]. */
static double nice_step(double lo, double hi) {
    double raw = (hi - lo) / 4, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

typedef struct {
    double lo, hi, step; /* the axis runs over [lo, hi], both multiples of step */
} axis;

static axis make_axis(double lo, double hi) {
    if (!(hi > lo)) { /* one value: a small range around it */
        double d = lo != 0 ? fabs(lo) * 0.05 : 1;
        lo -= d, hi += d;
    }
    axis a = {.step = nice_step(lo, hi)};
    a.lo = floor(lo / a.step) * a.step;
    a.hi = ceil(hi / a.step) * a.step;
    return a;
}

/* Tick i's value, snapped to zero when rounding left a residue far below the step. */
static double tick(const axis *a, long i) {
    double v = a->lo + (double)i * a->step;
    return fabs(v) < a->step * 1e-9 ? 0 : v;
}

int svg_plot(FILE *out, const char *id, const char *title, const svg_series *s, int ns, int width, int height) {
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    int drawn = 0;
    for (int k = 0; k < ns; k++) {
        if (svg_series_points(&s[k]) == 0) continue;
        drawn++;
        for (size_t i = 0; i < s[k].n; i++) {
            if (!isfinite(s[k].x[i]) || !isfinite(s[k].y[i])) continue;
            xmin = fmin(xmin, s[k].x[i]), xmax = fmax(xmax, s[k].x[i]);
            ymin = fmin(ymin, s[k].y[i]), ymax = fmax(ymax, s[k].y[i]);
        }
    }
    if (drawn == 0) return 0;
    axis ax = make_axis(xmin, xmax), ay = make_axis(ymin, ymax);
    double pw = width - MARGIN_L - MARGIN_R, ph = height - MARGIN_T - MARGIN_B;
#define PX(v) (MARGIN_L + ((v) - ax.lo) / (ax.hi - ax.lo) * pw)
#define PY(v) (MARGIN_T + ph - ((v) - ay.lo) / (ay.hi - ay.lo) * ph)
    fprintf(out,
            "<svg data-plot=\"%s\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"%s\">\n"
            "<text class=\"title\" x=\"%d\" y=\"20\">%s</text>\n"
            "<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%g\" height=\"%g\"/>\n",
            id, width, height, width, height, title, MARGIN_L, title, MARGIN_L, MARGIN_T, pw, ph);
    long nx = lround((ax.hi - ax.lo) / ax.step), ny = lround((ay.hi - ay.lo) / ay.step);
    for (long i = 0; i <= nx; i++) {
        double v = tick(&ax, i), x = PX(v);
        fprintf(out,
                "<line class=\"grid\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%.1f\"/>"
                "<text class=\"tx\" x=\"%.1f\" y=\"%.1f\">%g</text>\n",
                x, MARGIN_T, x, MARGIN_T + ph, x, MARGIN_T + ph + 16, v);
    }
    for (long i = 0; i <= ny; i++) {
        double v = tick(&ay, i), y = PY(v);
        fprintf(out,
                "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                "<text class=\"ty\" x=\"%d\" y=\"%.1f\">%.6g</text>\n",
                MARGIN_L, y, MARGIN_L + pw, y, MARGIN_L - 6, y + 4, v);
    }
    fprintf(out, "<text class=\"tx\" x=\"%.1f\" y=\"%d\">step</text>\n", MARGIN_L + pw / 2, height - 4);
    int legend_x = width / 2; /* entries side by side on the title's line */
    for (int k = 0; k < ns; k++) {
        size_t np = svg_series_points(&s[k]);
        if (np == 0) continue;
        fprintf(out, "<polyline data-series=\"%s\" data-points=\"%zu\" fill=\"none\" stroke=\"%s\" points=\"",
                s[k].key, np, s[k].color);
        const char *sep = "";
        for (size_t i = 0; i < s[k].n; i++)
            if (isfinite(s[k].x[i]) && isfinite(s[k].y[i])) {
                fprintf(out, "%s%.1f,%.1f", sep, PX(s[k].x[i]), PY(s[k].y[i]));
                sep = " ";
            }
        fprintf(out, "\"/>\n");
        if (np == 1) /* a lone point draws no line: mark it */
            for (size_t i = 0; i < s[k].n; i++)
                if (isfinite(s[k].x[i]) && isfinite(s[k].y[i]))
                    fprintf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", PX(s[k].x[i]),
                            PY(s[k].y[i]), s[k].color);
        fprintf(out,
                "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/>"
                "<text class=\"legend\" x=\"%d\" y=\"%d\">%s</text>\n",
                legend_x, 16, legend_x + 20, 16, s[k].color, legend_x + 26, 20, s[k].label);
        legend_x += 150;
    }
#undef PX
#undef PY
    fprintf(out, "</svg>\n");
    return drawn;
}
