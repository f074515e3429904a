/* report_svg.h — a tiny inline-SVG line-plot writer for `deepwell report` (cmd_report.c): linear
 * axes with about five round-number ticks, one polyline per series, a legend. Not a charting
 * library: no log scales, no text layout beyond fixed positions. */
#ifndef DW_TOOLS_REPORT_SVG_H
#define DW_TOOLS_REPORT_SVG_H

#include <stddef.h>
#include <stdio.h>

typedef struct {
    const char *key;   /* the metrics.jsonl key, written as the polyline's data-series */
    const char *label; /* legend text (plain ASCII, no markup) */
    const char *color; /* CSS colour */
    const double *x, *y; /* (n,) each; a point whose x or y is not finite is skipped */
    size_t n;
} svg_series;

/* The number of points of s that svg_plot draws (both coordinates finite). */
size_t svg_series_points(const svg_series *s);

/* Writes one <svg data-plot="id"> of width x height pixels titled `title`, with the series that
 * have at least one point (their polylines carry data-series="key" and data-points="count").
 * Returns the number of series drawn; writes nothing and returns 0 when none has a point. */
int svg_plot(FILE *out, const char *id, const char *title, const svg_series *s, int ns, int width, int height);

#endif /* DW_TOOLS_REPORT_SVG_H */
