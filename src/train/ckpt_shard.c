/* ckpt_shard.c — which rank's shard holds which elements of a tensor, the check that pieces
 * tile a tensor, the copies that read any range back, and the shard files' names (ckpt_shard.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/ckpt_shard.h"

int dw_ckpt_pieces_of(int64_t off, int64_t numel, int n, const int *rank, const int64_t *lo, const int64_t *hi,
                      dw_ckpt_piece *out) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        const int64_t a = lo[i] > off ? lo[i] : off, b = hi[i] < off + numel ? hi[i] : off + numel;
        if (a >= b) continue;
        int nth = 0;
        for (int j = 0; j < k; j++) nth += out[j].rank == rank[i];
        out[k++] = (dw_ckpt_piece){.rank = rank[i], .begin = a - off, .end = b - off, .nth = nth};
    }
    return k;
}

int dw_ckpt_pieces(int64_t off, int64_t numel, int world, const int64_t *lo, const int64_t *hi, dw_ckpt_piece *out) {
    int n = 0;
    for (int r = 0; r < world; r++) {
        const int64_t a = lo[r] > off ? lo[r] : off, b = hi[r] < off + numel ? hi[r] : off + numel;
        if (a < b) out[n++] = (dw_ckpt_piece){.rank = r, .begin = a - off, .end = b - off};
    }
    return n;
}

char *dw_ckpt_piece_name(const char *moment, const dw_ckpt_piece *p) {
    const size_t n = strlen(moment) + 24;
    char *s = malloc(n);
    if (!s) return NULL;
    if (p->nth == 0) snprintf(s, n, "%s", moment);
    else snprintf(s, n, "%s@%lld", moment, (long long)p->begin);
    return s;
}

static int by_begin(const void *x, const void *y) {
    const dw_ckpt_piece *a = x, *b = y;
    return (a->begin > b->begin) - (a->begin < b->begin);
}

bool dw_ckpt_pieces_check(const dw_ckpt_piece *p, int n, int64_t numel, char *why, size_t cap) {
    for (int i = 0; i < n; i++) {
        if (p[i].begin < 0 || p[i].end > numel) {
            snprintf(why, cap, "a piece [%lld, %lld) lies outside the %lld elements", (long long)p[i].begin,
                     (long long)p[i].end, (long long)numel);
            return false;
        }
        if (p[i].begin >= p[i].end) {
            snprintf(why, cap, "a piece [%lld, %lld) is empty or reversed", (long long)p[i].begin, (long long)p[i].end);
            return false;
        }
    }
    dw_ckpt_piece *s = malloc((size_t)(n ? n : 1) * sizeof *s);
    if (!s) {
        snprintf(why, cap, "out of memory");
        return false;
    }
    memcpy(s, p, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, by_begin);
    int64_t at = 0; /* elements [0, at) are covered once */
    bool ok = true;
    for (int i = 0; ok && i < n; i++) {
        if (s[i].begin > at) snprintf(why, cap, "elements [%lld, %lld) are in no piece", (long long)at, (long long)s[i].begin), ok = false;
        else if (s[i].begin < at)
            snprintf(why, cap, "elements [%lld, %lld) are in two pieces", (long long)s[i].begin,
                     (long long)(s[i].end < at ? s[i].end : at)), ok = false;
        else at = s[i].end;
    }
    if (ok && at != numel) snprintf(why, cap, "elements [%lld, %lld) are in no piece", (long long)at, (long long)numel), ok = false;
    free(s);
    return ok;
}

int dw_ckpt_copies(const dw_ckpt_piece *p, int n, int64_t a, int64_t b, dw_ckpt_copy *out) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        const int64_t x = p[i].begin > a ? p[i].begin : a, y = p[i].end < b ? p[i].end : b;
        if (x < y) out[k++] = (dw_ckpt_copy){.piece = i, .src = x - p[i].begin, .dst = x - a, .count = y - x};
    }
    for (int i = 1; i < k; i++) /* insertion sort by dst: k is at most the pieces of one tensor */
        for (int j = i; j > 0 && out[j].dst < out[j - 1].dst; j--) {
            dw_ckpt_copy t = out[j];
            out[j] = out[j - 1], out[j - 1] = t;
        }
    return k;
}

void dw_ckpt_shard_name(int rank, int world, char *buf, size_t cap) {
    snprintf(buf, cap, "optimizer-%05d-of-%05d.safetensors", rank, world);
}

bool dw_ckpt_shard_parse(const char *name, int *rank, int *world) {
    int r = -1, w = -1, len = 0;
    if (sscanf(name, "optimizer-%5d-of-%5d.safetensors%n", &r, &w, &len) != 2 || len != (int)strlen(name)) return false;
    char again[64];
    dw_ckpt_shard_name(r, w, again, sizeof again);
    if (strcmp(again, name) || w < 1 || r < 0 || r >= w) return false; /* the one spelling, in range */
    *rank = r, *world = w;
    return true;
}
