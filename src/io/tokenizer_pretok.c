/* tokenizer_pretok.c — the tokenizer's pre-tokenizers (io/tokenizer.h), as the `tokenizers` package
 * applies them (its normalizers: tokenizer_norm.c): ByteLevel (GPT-2's split, then every byte as its
 * printable character), Split (PCRE2 regexes in UTF + UCP mode for
 * the package's Oniguruma ones, and its five ways of keeping matches), Metaspace and Digits. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_text.h"

void *dw_tok_regex_compile(const char *pattern, bool literal, char *err, size_t errcap) {
    int code;
    PCRE2_SIZE off;
    const uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &code, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[200];
        pcre2_get_error_message(code, msg, sizeof msg);
        snprintf(err, errcap, "at offset %zu: %s", (size_t)off, (const char *)msg);
    }
    return re;
}

void dw_tok_regex_free(void *re) { pcre2_code_free((pcre2_code *)re); }

void dw_tok_pieces_push(dw_tok_pieces *ps, const char *s, size_t n, bool at0) {
    if (ps->oom || n == 0) return; /* the package drops empty pieces */
    char *c = malloc(n + 1);
    if (ps->n == ps->cap) {
        const int64_t cap = ps->cap ? 2 * ps->cap : 16;
        dw_tok_piece *p = realloc(ps->p, (size_t)cap * sizeof *p);
        if (p) ps->p = p, ps->cap = cap;
    }
    if (!c || ps->n == ps->cap) {
        free(c);
        ps->oom = true;
        return;
    }
    memcpy(c, s, n);
    c[n] = '\0';
    ps->p[ps->n++] = (dw_tok_piece){c, n, at0};
}

void dw_tok_pieces_free(dw_tok_pieces *ps) {
    for (int64_t i = 0; i < ps->n; i++) free(ps->p[i].s);
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}

/* A split of a piece: [start, end) and whether it is a match of the pattern. */
typedef struct {
    size_t start, end;
    bool match;
} span;

/* find_matches: the matches of re in s[0, n) and the gaps between them, in order (an empty text is
 * one gap). *spans: malloc'd. */
static dw_status find_matches(dw_ctx *ctx, pcre2_code *re, const char *s, size_t n, span **spans, int64_t *count) {
    int64_t cap = 16, k = 0;
    span *sp = malloc((size_t)cap * sizeof *sp);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    dw_status st = sp && md ? DW_OK : dw_set_error(ctx, DW_ERR_NOMEM, "tokenizer: out of memory");
    size_t prev = 0, at = 0;
    while (st == DW_OK && at <= n) {
        const int rc = pcre2_match(re, (PCRE2_SPTR)s, n, at, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[200];
            pcre2_get_error_message(rc, msg, sizeof msg);
            st = dw_set_error(ctx, DW_ERR_INVALID, "tokenizer: regex match failed: %s", (const char *)msg);
            break;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        const size_t a = ov[0], b = ov[1];
        if (k + 2 > cap) {
            span *p = realloc(sp, (size_t)(cap *= 2) * sizeof *p);
            if (!p) {
                st = dw_set_error(ctx, DW_ERR_NOMEM, "tokenizer: out of memory");
                break;
            }
            sp = p;
        }
        if (a == b) { /* an empty match splits nothing: step over one character */
            size_t len = 1;
            if (a < n) dw_utf8_at(s + a, &len);
            at = a + len;
            continue;
        }
        if (prev != a) sp[k++] = (span){prev, a, false};
        sp[k++] = (span){a, b, true};
        prev = at = b;
    }
    if (st == DW_OK && (prev != n || n == 0)) {
        if (k + 1 > cap) {
            span *p = realloc(sp, (size_t)(cap + 1) * sizeof *p);
            if (p) sp = p, cap++;
            else st = dw_set_error(ctx, DW_ERR_NOMEM, "tokenizer: out of memory");
        }
        if (st == DW_OK) sp[k++] = (span){prev, n, false};
    }
    pcre2_match_data_free(md);
    if (st != DW_OK) free(sp), sp = NULL, k = 0;
    *spans = sp;
    *count = k;
    return st;
}

/* Splits piece p by re as SplitDelimiterBehavior b says, appending the parts to out. */
static dw_status split_piece(dw_ctx *ctx, pcre2_code *re, dw_split_behavior b, bool invert, const dw_tok_piece *p,
                             dw_tok_pieces *out) {
    span *sp;
    int64_t n;
    DW_TRY(find_matches(ctx, re, p->s, p->n, &sp, &n));
    for (int64_t i = 0; i < n; i++) sp[i].match ^= invert;
    /* merge as the package does; `keep` spans are emitted, removed ones are not */
    int64_t m = 0;
    bool prev = false;
    if (b == DW_SPLIT_MERGED_NEXT) { /* folds from the right */
        for (int64_t i = n - 1; i >= 0; i--) {
            const bool is = sp[i].match;
            if (is && !prev && m > 0) sp[n - m].start = sp[i].start;
            else sp[n - 1 - m] = (span){sp[i].start, sp[i].end, false}, m++;
            prev = is;
        }
        memmove(sp, sp + n - m, (size_t)m * sizeof *sp);
    } else {
        for (int64_t i = 0; i < n; i++) {
            const bool is = sp[i].match;
            const bool merge = (b == DW_SPLIT_CONTIGUOUS && is == prev) || (b == DW_SPLIT_MERGED_PREV && is && !prev);
            if (merge && m > 0) sp[m - 1].end = sp[i].end;
            else sp[m++] = (span){sp[i].start, sp[i].end, b == DW_SPLIT_REMOVED && is};
            prev = is;
        }
    }
    for (int64_t i = 0; i < m; i++)
        if (!sp[i].match) dw_tok_pieces_push(out, p->s + sp[i].start, sp[i].end - sp[i].start, p->at0 && sp[i].start == 0);
    free(sp);
    return out->oom ? dw_set_error(ctx, DW_ERR_NOMEM, "tokenizer: out of memory") : DW_OK;
}

/* ByteLevel's prefix space and its byte -> printable character map, in place on every piece. */
static dw_status bytelevel_map(dw_ctx *ctx, dw_tok_pieces *ps) {
    for (int64_t i = 0; i < ps->n; i++) {
        dw_tok_buf b = {0};
        for (size_t k = 0; k < ps->p[i].n; k++) dw_tok_buf_addc(&b, dw_bytelevel_char((uint8_t)ps->p[i].s[k]));
        if (b.oom) {
            free(b.s);
            return dw_set_error(ctx, DW_ERR_NOMEM, "tokenizer: out of memory");
        }
        free(ps->p[i].s);
        ps->p[i].s = b.s, ps->p[i].n = b.n;
    }
    return DW_OK;
}

/* The text of a piece before the pre-tokenizer d splits it (prefix spaces, Metaspace's replacement). */
static char *prepare(const dw_tok_pre *d, const dw_tok_piece *p, size_t *len) {
    dw_tok_buf b = {0};
    if (d->kind == DW_TOKP_BYTELEVEL) {
        if (d->add_prefix_space && p->s[0] != ' ') dw_tok_buf_add(&b, " ", 1);
        dw_tok_buf_add(&b, p->s, p->n);
    } else if (d->kind == DW_TOKP_METASPACE) {
        dw_tok_buf body = {0};
        dw_tok_replace_all(&body, p->s, p->n, " ", d->replacement);
        const size_t nr = strlen(d->replacement);
        const bool starts = body.n >= nr && memcmp(body.s, d->replacement, nr) == 0;
        if (!starts && (d->scheme == DW_PREPEND_ALWAYS || (d->scheme == DW_PREPEND_FIRST && p->at0)))
            dw_tok_buf_add(&b, d->replacement, nr);
        dw_tok_buf_add(&b, body.s, body.n);
        b.oom |= body.oom;
        free(body.s);
    } else {
        dw_tok_buf_add(&b, p->s, p->n);
    }
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    *len = b.n;
    return b.s;
}

dw_status dw_tok_pretokenize(dw_ctx *ctx, const dw_hf_tokenizer *t, dw_tok_pieces *ps) {
    for (int k = 0; k < t->n_pre; k++) {
        const dw_tok_pre *d = &t->pre[k];
        dw_tok_pieces out = {0};
        dw_status st = DW_OK;
        for (int64_t i = 0; i < ps->n && st == DW_OK; i++) {
            size_t n = 0;
            char *s = prepare(d, &ps->p[i], &n);
            if (!s) {
                st = dw_set_error(ctx, DW_ERR_NOMEM, "tokenizer: out of memory");
                break;
            }
            const dw_tok_piece q = {s, n, ps->p[i].at0};
            if (d->re && n) {
                const dw_split_behavior b = d->kind == DW_TOKP_SPLIT     ? d->behavior
                                            : d->kind == DW_TOKP_METASPACE ? DW_SPLIT_MERGED_NEXT
                                                                         : DW_SPLIT_ISOLATED;
                st = split_piece(ctx, (pcre2_code *)d->re, b, d->invert, &q, &out);
            } else {
                dw_tok_pieces_push(&out, s, n, q.at0);
                if (out.oom) st = dw_set_error(ctx, DW_ERR_NOMEM, "tokenizer: out of memory");
            }
            free(s);
        }
        if (st == DW_OK && d->kind == DW_TOKP_BYTELEVEL) st = bytelevel_map(ctx, &out);
        dw_tok_pieces_free(ps);
        *ps = out;
        if (st != DW_OK) return st;
    }
    return DW_OK;
}
