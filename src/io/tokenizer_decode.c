/* tokenizer_decode.c — dw_hf_tokenizer_decode (deepwell.h): ids -> text as the `tokenizers`
 * package's decode(ids, skip_special_tokens): each id's token (added tokens first; special ones
 * left out when asked), then the decoders in order, each a list of strings -> list of strings
 * (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace), then joined. Without a decoder the
 * tokens are joined with spaces. Ids outside the vocabulary decode as U+FFFD. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_text.h"

typedef struct {
    char **s;
    size_t *n;
    int64_t count;
} toks;

static void toks_free(toks *t) {
    for (int64_t i = 0; i < t->count; i++) free(t->s[i]);
    free(t->s);
    free(t->n);
    memset(t, 0, sizeof *t);
}

static bool toks_init(toks *t, int64_t cap) {
    t->s = calloc((size_t)(cap ? cap : 1), sizeof *t->s);
    t->n = calloc((size_t)(cap ? cap : 1), sizeof *t->n);
    t->count = 0;
    return t->s && t->n;
}

/* Takes b's string as the next token (false when b ran out of memory). */
static bool toks_take(toks *t, dw_tok_buf *b) {
    if (b->oom) return free(b->s), false;
    if (!b->s) dw_tok_buf_add(b, "", 0);
    if (b->oom) return false;
    t->s[t->count] = b->s, t->n[t->count++] = b->n;
    memset(b, 0, sizeof *b);
    return true;
}

/* ByteLevel: every token's characters back to bytes (a token with a character outside the map
 * keeps its UTF-8), all of them as one string, invalid UTF-8 replaced. */
static bool dec_bytelevel(const toks *in, toks *out) {
    dw_tok_buf raw = {0}, b = {0};
    for (int64_t i = 0; i < in->count; i++) {
        const size_t start = raw.n;
        bool all = true;
        for (size_t k = 0; k < in->n[i] && all;) {
            size_t len;
            const int byte = dw_bytelevel_byte(dw_utf8_at(in->s[i] + k, &len));
            if (byte < 0) all = false;
            else dw_tok_buf_add(&raw, &(char){(char)byte}, 1);
            k += len;
        }
        if (!all) {
            raw.n = start;
            dw_tok_buf_add(&raw, in->s[i], in->n[i]);
        }
    }
    dw_utf8_lossy(&b, raw.s ? raw.s : "", raw.n);
    const bool ok = !raw.oom;
    free(raw.s);
    return ok && toks_take(out, &b);
}

static bool is_byte_token(const char *s, size_t n, unsigned char *v) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return false;
    unsigned x = 0;
    for (int i = 3; i < 5; i++) {
        const char c = s[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return false;
        x = x * 16 + (unsigned)d;
    }
    *v = (unsigned char)x;
    return true;
}

/* ByteFallback: runs of <0xNN> tokens become their UTF-8 text, or one U+FFFD per byte when invalid. */
static bool flush_bytes(toks *out, dw_tok_buf *bytes) {
    size_t bad;
    bool ok = true;
    if (!bytes->n) return !bytes->oom;
    if (dw_utf8_valid(bytes->s, bytes->n, &bad)) {
        dw_tok_buf b = {0};
        dw_tok_buf_add(&b, bytes->s, bytes->n);
        ok = toks_take(out, &b);
    } else {
        for (size_t i = 0; i < bytes->n && ok; i++) {
            dw_tok_buf b = {0};
            dw_tok_buf_addc(&b, 0xFFFD);
            ok = toks_take(out, &b);
        }
    }
    bytes->n = 0;
    return ok && !bytes->oom;
}

static bool dec_bytefallback(const toks *in, toks *out) {
    dw_tok_buf bytes = {0};
    bool ok = true;
    for (int64_t i = 0; i < in->count && ok; i++) {
        unsigned char v;
        if (is_byte_token(in->s[i], in->n[i], &v)) {
            dw_tok_buf_add(&bytes, &v, 1);
            continue;
        }
        ok = flush_bytes(out, &bytes);
        dw_tok_buf b = {0};
        dw_tok_buf_add(&b, in->s[i], in->n[i]);
        ok = ok && toks_take(out, &b);
    }
    ok = ok && flush_bytes(out, &bytes);
    free(bytes.s);
    return ok;
}

/* Strip: up to `start` leading and `stop` trailing copies of the character a, from every token. */
static void strip(const dw_tok_dec *d, const char *s, size_t n, dw_tok_buf *b) {
    const size_t na = strlen(d->a);
    size_t lo = 0, hi = n;
    for (int64_t i = 0; i < d->start && lo + na <= hi && memcmp(s + lo, d->a, na) == 0; i++) lo += na;
    for (int64_t i = 0; i < d->stop && hi >= lo + na && memcmp(s + hi - na, d->a, na) == 0; i++) hi -= na;
    dw_tok_buf_add(b, s + lo, hi - lo);
}

/* Per-token decoders: Replace, Strip, Metaspace (the replacement -> space; the first token's
 * replacements dropped unless the scheme is never). */
static void per_token(const dw_tok_dec *d, int64_t i, const char *s, size_t n, dw_tok_buf *b) {
    if (d->kind == DW_TOKD_STRIP) {
        strip(d, s, n, b);
        return;
    }
    const char *a = d->a;
    const size_t na = strlen(a);
    const bool drop = d->kind == DW_TOKD_METASPACE && i == 0 && d->scheme != DW_PREPEND_NEVER;
    for (size_t k = 0; k < n;) {
        if (na && k + na <= n && memcmp(s + k, a, na) == 0) {
            if (d->kind == DW_TOKD_REPLACE) dw_tok_buf_add(b, d->b, strlen(d->b));
            else if (!drop) dw_tok_buf_add(b, " ", 1);
            k += na;
        } else {
            dw_tok_buf_add(b, s + k, 1), k++;
        }
    }
    dw_tok_buf_add(b, "", 0);
}

static bool decode_step(const dw_tok_dec *d, const toks *in, toks *out) {
    if (d->kind == DW_TOKD_BYTELEVEL) return dec_bytelevel(in, out);
    if (d->kind == DW_TOKD_BYTEFALLBACK) return dec_bytefallback(in, out);
    if (d->kind == DW_TOKD_FUSE) {
        dw_tok_buf b = {0};
        for (int64_t i = 0; i < in->count; i++) dw_tok_buf_add(&b, in->s[i], in->n[i]);
        return toks_take(out, &b);
    }
    for (int64_t i = 0; i < in->count; i++) {
        dw_tok_buf b = {0};
        per_token(d, i, in->s[i], in->n[i], &b);
        if (!toks_take(out, &b)) return false;
    }
    return true;
}

dw_status dw_hf_tokenizer_decode(dw_ctx *ctx, const dw_hf_tokenizer *t, const int32_t *ids, int64_t n,
                                 bool skip_special, char **text, size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    if (!t || (n > 0 && !ids) || n < 0)
        return dw_set_error(ctx, DW_ERR_INVALID, "tokenizer decode: %s", !t ? "the tokenizer is NULL" : "bad ids");
    toks cur;
    bool ok = toks_init(&cur, n);
    for (int64_t i = 0; ok && i < n; i++) {
        const int32_t id = ids[i];
        const char *s = id >= 0 && id < t->n_ids ? t->id_token[id] : NULL;
        bool special = false;
        for (int a = 0; s && skip_special && a < t->n_added; a++) special |= t->added[a].id == id && t->added[a].special;
        if (special) continue;
        dw_tok_buf b = {0};
        if (s) dw_tok_buf_add(&b, s, strlen(s));
        else dw_tok_buf_addc(&b, 0xFFFD);
        ok = toks_take(&cur, &b);
    }
    for (int k = 0; ok && k < t->n_dec; k++) {
        toks next;
        /* ByteFallback may turn one token into one U+FFFD per byte: at most 6 per token */
        ok = toks_init(&next, cur.count * 6 + 1) && decode_step(&t->dec[k], &cur, &next);
        toks_free(&cur);
        cur = next;
    }
    dw_tok_buf out = {0};
    for (int64_t i = 0; ok && i < cur.count; i++) {
        if (!t->has_decoder && i) dw_tok_buf_add(&out, " ", 1);
        dw_tok_buf_add(&out, cur.s[i], cur.n[i]);
    }
    dw_tok_buf_add(&out, "", 0);
    toks_free(&cur);
    if (!ok || out.oom) {
        free(out.s);
        return dw_set_error(ctx, DW_ERR_NOMEM, "tokenizer: out of memory");
    }
    *text = out.s;
    if (len) *len = out.n;
    return DW_OK;
}
