/* tokenizer_encode.c — dw_hf_tokenizer_encode (deepwell.h): text -> ids as the `tokenizers`
 * package's encode(text, add_special_tokens=False): added tokens matched first (leftmost-longest;
 * unnormalized ones in the raw text, normalized ones in the normalized pieces), the normalizers and
 * pre-tokenizers on the rest (tokenizer_pretok.c), then BPE on each piece: its characters (or their
 * <0xNN> bytes with byte_fallback, else unk_token) merged pair by pair, the lowest merge rank first
 * and the leftmost among equals. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_text.h"

typedef struct {
    int32_t *v;
    int64_t n, cap;
    bool oom;
} ids_buf;

static void ids_add(ids_buf *b, int32_t id) {
    if (b->oom) return;
    if (b->n == b->cap) {
        const int64_t cap = b->cap ? 2 * b->cap : 64;
        int32_t *v = realloc(b->v, (size_t)cap * sizeof *v);
        if (!v) {
            b->oom = true;
            return;
        }
        b->v = v, b->cap = cap;
    }
    b->v[b->n++] = id;
}

/* BPE of one pre-tokenized piece s[0, n) (valid UTF-8), appended to out. */
static void bpe(const dw_hf_tokenizer *t, const char *s, size_t n, ids_buf *out) {
    const int32_t whole = t->ignore_merges ? dw_tok_map_get(&t->vocab, s, n) : -1;
    if (whole >= 0) {
        ids_add(out, whole);
        return;
    }
    int32_t *sym = malloc((n + 1) * sizeof *sym);
    if (!sym) {
        out->oom = true;
        return;
    }
    int64_t k = 0, unk_pending = 0; /* unk_pending: an unk not yet added (fuse_unk grows it) */
    for (size_t i = 0; i < n;) {
        size_t len;
        dw_utf8_at(s + i, &len);
        const int32_t id = dw_tok_map_get(&t->vocab, s + i, len);
        if (id >= 0) {
            if (unk_pending) sym[k++] = t->unk, unk_pending = 0;
            sym[k++] = id;
        } else {
            bool fell_back = false;
            if (t->byte_fallback) { /* every byte as <0xNN>, or none of them */
                int32_t b[4];
                size_t j = 0;
                for (; j < len; j++) {
                    static const char hex[] = "0123456789ABCDEF";
                    const unsigned char c = (unsigned char)s[i + j];
                    const char name[6] = {'<', '0', 'x', hex[c >> 4], hex[c & 15], '>'};
                    if ((b[j] = dw_tok_map_get(&t->vocab, name, 6)) < 0) break;
                }
                if ((fell_back = j == len)) /* the package leaves a pending unk after these */
                    for (j = 0; j < len; j++) sym[k++] = b[j];
            }
            if (!fell_back && t->unk >= 0) {
                if (unk_pending && !t->fuse_unk) sym[k++] = t->unk;
                unk_pending = 1;
            } /* no unk_token: the character is dropped, as the package does */
        }
        i += len;
    }
    if (unk_pending) sym[k++] = t->unk;
    /* merge the lowest-ranked adjacent pair, leftmost first, until none merges */
    while (k > 1) {
        int64_t best = -1;
        int32_t best_rank = INT32_MAX, best_id = -1;
        for (int64_t j = 0; j + 1 < k; j++) {
            int32_t r, id;
            if (dw_tok_pairs_get(&t->merges, sym[j], sym[j + 1], &r, &id) && r < best_rank)
                best = j, best_rank = r, best_id = id;
        }
        if (best < 0) break;
        sym[best] = best_id;
        memmove(sym + best + 1, sym + best + 2, (size_t)(k - best - 2) * sizeof *sym);
        k--;
    }
    for (int64_t j = 0; j < k; j++) ids_add(out, sym[j]);
    free(sym);
}

/* A segment of the input: text still to tokenize (id < 0) or an added token (its id). */
typedef struct {
    char *s;
    size_t n;
    int32_t id;
    bool at0;
} segment;
typedef struct {
    segment *v;
    int64_t n, cap;
    bool oom;
} segments;

static void seg_add(segments *ss, const char *s, size_t n, int32_t id, bool at0) {
    if (ss->oom || (n == 0 && id < 0)) return;
    if (ss->n == ss->cap) {
        const int64_t cap = ss->cap ? 2 * ss->cap : 16;
        segment *v = realloc(ss->v, (size_t)cap * sizeof *v);
        if (!v) {
            ss->oom = true;
            return;
        }
        ss->v = v, ss->cap = cap;
    }
    char *c = id < 0 ? malloc(n + 1) : NULL;
    if (id < 0 && !c) {
        ss->oom = true;
        return;
    }
    if (c) memcpy(c, s, n), c[n] = '\0';
    ss->v[ss->n++] = (segment){c, n, id, at0};
}

static void seg_free(segments *ss) {
    for (int64_t i = 0; i < ss->n; i++) free(ss->v[i].s);
    free(ss->v);
    memset(ss, 0, sizeof *ss);
}

static bool word_char(unsigned char c) { return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z'); }

/* The start of the run of white space that ends s[0, n). */
static size_t space_run_before(const char *s, size_t n) {
    size_t i = n;
    while (i > 0) {
        size_t j = i - 1, len;
        while (j > 0 && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        if (!dw_unicode_space(dw_utf8_at(s + j, &len))) break;
        i = j;
    }
    return i;
}

/* The length of the run of white space that starts s[0, n). */
static size_t space_run_after(const char *s, size_t n) {
    size_t i = 0, len;
    while (i < n && dw_unicode_space(dw_utf8_at(s + i, &len))) i += len;
    return i;
}

/* Splits s[0, n) on the added tokens whose is_normalized is `normalized` (matching their
 * normalized text when it is), as the package's AddedVocabulary::find_matches. */
static void split_added(const dw_hf_tokenizer *t, const char *s, size_t n, bool at0, bool normalized, segments *out) {
    size_t from = 0; /* the end of the last split */
    for (size_t pos = 0; pos < n;) {
        int best = -1;
        size_t best_len = 0;
        for (int a = 0; a < t->n_added; a++) {
            if (t->added[a].is_normalized != normalized) continue;
            const char *c = normalized ? t->added[a].normalized : t->added[a].content;
            const size_t len = strlen(c);
            if (len > best_len && len <= n - pos && memcmp(s + pos, c, len) == 0) best = a, best_len = len;
        }
        if (best < 0) {
            pos++;
            continue;
        }
        const dw_tok_added *d = &t->added[best];
        size_t start = pos, stop = pos + best_len;
        pos = stop;
        if (d->single_word && ((start > 0 && word_char((unsigned char)s[start - 1])) ||
                               (stop < n && word_char((unsigned char)s[stop]))))
            continue;
        if (d->lstrip) {
            const size_t ns = space_run_before(s, start);
            start = ns > from ? ns : from;
        }
        if (d->rstrip) stop += space_run_after(s + stop, n - stop);
        seg_add(out, s + from, start - from, -1, at0 && from == 0);
        seg_add(out, NULL, 0, d->id, false);
        from = stop;
        if (pos < stop) pos = stop;
    }
    seg_add(out, s + from, n - from, -1, at0 && from == 0);
}

static dw_status nomem(dw_ctx *ctx) { return dw_set_error(ctx, DW_ERR_NOMEM, "tokenizer: out of memory"); }

/* ids of one text segment: normalized, split on normalized added tokens, pre-tokenized, BPE. */
static dw_status encode_text(dw_ctx *ctx, const dw_hf_tokenizer *t, const segment *g, ids_buf *out) {
    size_t nn = 0;
    bool lead = true;
    char *norm = dw_tok_normalize(t, g->s, g->n, &nn, &lead);
    if (!norm) return nomem(ctx);
    segments ss = {0};
    split_added(t, norm, nn, g->at0 && lead, true, &ss);
    free(norm);
    dw_status st = ss.oom ? nomem(ctx) : DW_OK;
    for (int64_t i = 0; i < ss.n && st == DW_OK; i++) {
        if (ss.v[i].id >= 0) {
            ids_add(out, ss.v[i].id);
            continue;
        }
        dw_tok_pieces ps = {0};
        dw_tok_pieces_push(&ps, ss.v[i].s, ss.v[i].n, ss.v[i].at0);
        st = ps.oom ? nomem(ctx) : dw_tok_pretokenize(ctx, t, &ps);
        for (int64_t k = 0; k < ps.n && st == DW_OK; k++) bpe(t, ps.p[k].s, ps.p[k].n, out);
        dw_tok_pieces_free(&ps);
    }
    seg_free(&ss);
    return st == DW_OK && out->oom ? nomem(ctx) : st;
}

dw_status dw_hf_tokenizer_encode(dw_ctx *ctx, const dw_hf_tokenizer *t, const char *text, int32_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    if (!t || !text) return dw_set_error(ctx, DW_ERR_INVALID, "tokenizer encode: %s is NULL", t ? "the text" : "the tokenizer");
    const size_t len = strlen(text);
    size_t bad;
    if (!dw_utf8_valid(text, len, &bad))
        return dw_set_error(ctx, DW_ERR_INVALID, "tokenizer %s: the text is not UTF-8 (byte %zu, 0x%02x)", t->path, bad,
                            (unsigned char)text[bad]);
    segments ss = {0};
    split_added(t, text, len, true, false, &ss);
    ids_buf out = {0};
    dw_status st = ss.oom ? nomem(ctx) : DW_OK;
    for (int64_t i = 0; i < ss.n && st == DW_OK; i++) {
        if (ss.v[i].id >= 0) ids_add(&out, ss.v[i].id);
        else st = encode_text(ctx, t, &ss.v[i], &out);
    }
    seg_free(&ss);
    if (st == DW_OK && out.oom) st = nomem(ctx);
    if (st != DW_OK) {
        free(out.v);
        return st;
    }
    if (!out.v && !(out.v = malloc(sizeof *out.v))) return nomem(ctx); /* an empty text: a valid empty array */
    *ids = out.v;
    *n = out.n;
    return DW_OK;
}
