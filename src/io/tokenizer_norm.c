/* tokenizer_norm.c — the tokenizer's normalizers (io/tokenizer.h) as the `tokenizers` package
 * applies them, the Unicode data from utf8proc (libutf8proc-dev): NFC, NFD, NFKC and NFKD
 * (utf8proc_map), Lowercase (each character's own lowercase mapping, as Rust's char::to_lowercase:
 * utf8proc's simple mapping plus U+0130 -> "i" U+0307, the one unconditional mapping of more than
 * one character; no context, so no final sigma), StripAccents (drops every character of
 * General_Category Mark: Mn, Mc, Me), Prepend and Replace. Not the pre-tokenizers (tokenizer_pretok.c). */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "io/tokenizer.h"
#include "io/tokenizer_text.h"

/* s[0, n) (valid UTF-8) in one of the four Unicode normalization forms, appended to out. */
static void unicode_form(dw_tok_buf *out, const char *s, size_t n, dw_tok_norm_kind form) {
    utf8proc_option_t o = UTF8PROC_STABLE;
    if (form == DW_TOKN_NFC || form == DW_TOKN_NFKC) o |= UTF8PROC_COMPOSE;
    else o |= UTF8PROC_DECOMPOSE;
    if (form == DW_TOKN_NFKC || form == DW_TOKN_NFKD) o |= UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    const utf8proc_ssize_t len = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, o);
    if (len < 0) out->oom = true; /* valid input: only UTF8PROC_ERROR_NOMEM remains */
    else dw_tok_buf_add(out, dst, (size_t)len);
    free(dst);
}

/* Lowercase or StripAccents, character by character; *lead false when the first character went. */
static void per_char(dw_tok_buf *out, const char *s, size_t n, dw_tok_norm_kind kind, bool *lead) {
    for (size_t i = 0; i < n;) {
        size_t k;
        const uint32_t c = dw_utf8_at(s + i, &k);
        if (kind == DW_TOKN_STRIP_ACCENTS) {
            const utf8proc_category_t g = utf8proc_category((utf8proc_int32_t)c);
            if (g != UTF8PROC_CATEGORY_MN && g != UTF8PROC_CATEGORY_MC && g != UTF8PROC_CATEGORY_ME)
                dw_tok_buf_addc(out, c);
            else if (i == 0)
                *lead = false;
        } else if (c == 0x130) { /* LATIN CAPITAL LETTER I WITH DOT ABOVE */
            dw_tok_buf_addc(out, 'i');
            dw_tok_buf_addc(out, 0x307);
        } else {
            dw_tok_buf_addc(out, (uint32_t)utf8proc_tolower((utf8proc_int32_t)c));
        }
        i += k;
    }
}

/* One normalizer over s[0, n), appended to out; *lead false when the text's first character was
 * removed (StripAccents, Replace by ""). */
static void apply(dw_tok_buf *out, const dw_tok_norm *d, const char *s, size_t n, bool *lead) {
    switch (d->kind) {
    case DW_TOKN_NFC: case DW_TOKN_NFD: case DW_TOKN_NFKC: case DW_TOKN_NFKD:
        unicode_form(out, s, n, d->kind);
        break;
    case DW_TOKN_LOWERCASE: case DW_TOKN_STRIP_ACCENTS:
        per_char(out, s, n, d->kind, lead);
        break;
    case DW_TOKN_PREPEND: /* only a non-empty text */
        if (n) dw_tok_buf_add(out, d->a, strlen(d->a));
        dw_tok_buf_add(out, s, n);
        break;
    case DW_TOKN_REPLACE:
        if (!d->b[0] && d->a[0] && n >= strlen(d->a) && !memcmp(s, d->a, strlen(d->a))) *lead = false;
        dw_tok_replace_all(out, s, n, d->a, d->b);
        break;
    }
    dw_tok_buf_add(out, "", 0); /* NUL-terminated, even when empty */
}

char *dw_tok_normalize_one(const dw_tok_norm *d, const char *s, size_t n, size_t *out_len) {
    dw_tok_buf b = {0};
    bool lead = true;
    apply(&b, d, s, n, &lead);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    *out_len = b.n;
    return b.s;
}

char *dw_tok_normalize(const dw_hf_tokenizer *t, const char *s, size_t n, size_t *out_len, bool *lead) {
    bool kept = true;
    dw_tok_buf cur = {0};
    dw_tok_buf_add(&cur, s, n); /* allocated (NUL-terminated) even when n is 0 */
    for (int k = 0; k < t->n_norm && !cur.oom; k++) {
        dw_tok_buf next = {0};
        apply(&next, &t->norm[k], cur.s, cur.n, &kept);
        free(cur.s);
        cur = next;
    }
    if (cur.oom) {
        free(cur.s);
        return NULL;
    }
    *out_len = cur.n;
    if (lead) *lead = kept;
    return cur.s;
}
