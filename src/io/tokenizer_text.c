/* tokenizer_text.c — UTF-8, White_Space and GPT-2's byte map for the tokenizer (tokenizer_text.h). */
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_text.h"

void dw_tok_buf_add(dw_tok_buf *b, const void *p, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = true;
            return;
        }
        b->s = s, b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = '\0';
}

void dw_tok_buf_addc(dw_tok_buf *b, uint32_t cp) {
    unsigned char u[4];
    size_t n;
    if (cp < 0x80) u[0] = (unsigned char)cp, n = 1;
    else if (cp < 0x800) u[0] = (unsigned char)(0xC0 | cp >> 6), u[1] = (unsigned char)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        u[0] = (unsigned char)(0xE0 | cp >> 12), u[1] = (unsigned char)(0x80 | (cp >> 6 & 63)),
        u[2] = (unsigned char)(0x80 | (cp & 63)), n = 3;
    else
        u[0] = (unsigned char)(0xF0 | cp >> 18), u[1] = (unsigned char)(0x80 | (cp >> 12 & 63)),
        u[2] = (unsigned char)(0x80 | (cp >> 6 & 63)), u[3] = (unsigned char)(0x80 | (cp & 63)), n = 4;
    dw_tok_buf_add(b, u, n);
}

void dw_tok_replace_all(dw_tok_buf *out, const char *s, size_t n, const char *a, const char *b) {
    const size_t na = strlen(a), nb = strlen(b);
    for (size_t i = 0; i < n;) {
        if (na && i + na <= n && memcmp(s + i, a, na) == 0) dw_tok_buf_add(out, b, nb), i += na;
        else dw_tok_buf_add(out, s + i, 1), i++;
    }
}

/* The length of the valid prefix of the sequence at s[0, n) (Unicode table 3-7): 0 for an invalid
 * lead byte; *full says whether the whole character was valid. */
static size_t valid_prefix(const unsigned char *s, size_t n, bool *full) {
    const unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    *full = false;
    if (c < 0x80) return *full = true, 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) need = 2;
    else if (c == 0xED) need = 2, hi = 0x9F;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) need = 3, hi = 0x8F;
    else return 0;
    size_t i = 1;
    for (; i <= need && i < n; i++) {
        const unsigned char lo_i = i == 1 ? lo : 0x80, hi_i = i == 1 ? hi : 0xBF;
        if (s[i] < lo_i || s[i] > hi_i) return i;
    }
    *full = i == need + 1;
    return i;
}

bool dw_utf8_valid(const char *s, size_t n, size_t *bad) {
    for (size_t i = 0; i < n;) {
        bool full;
        const size_t k = valid_prefix((const unsigned char *)s + i, n - i, &full);
        if (!full) return *bad = i, false;
        i += k;
    }
    return true;
}

uint32_t dw_utf8_at(const char *s, size_t *len) {
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) return *len = 1, u[0];
    if (u[0] < 0xE0) return *len = 2, (uint32_t)(u[0] & 31) << 6 | (u[1] & 63);
    if (u[0] < 0xF0) return *len = 3, (uint32_t)(u[0] & 15) << 12 | (uint32_t)(u[1] & 63) << 6 | (u[2] & 63);
    return *len = 4, (uint32_t)(u[0] & 7) << 18 | (uint32_t)(u[1] & 63) << 12 | (uint32_t)(u[2] & 63) << 6 | (u[3] & 63);
}

void dw_utf8_lossy(dw_tok_buf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        bool full;
        size_t k = valid_prefix((const unsigned char *)s + i, n - i, &full);
        if (full) dw_tok_buf_add(b, s + i, k);
        else dw_tok_buf_addc(b, 0xFFFD);
        i += k ? k : 1;
    }
}

bool dw_unicode_space(uint32_t cp) {
    return (cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* bytes_to_unicode: printable bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF stand for themselves; the
 * other 68 take 256, 257, ... in byte order. */
static bool printable(unsigned b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

uint32_t dw_bytelevel_char(uint8_t b) {
    if (printable(b)) return b;
    uint32_t k = 0;
    for (unsigned i = 0; i < b; i++) k += !printable(i);
    return 256 + k;
}

int dw_bytelevel_byte(uint32_t cp) {
    if (cp < 256) return printable(cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t k = 0;
    for (unsigned i = 0; i < 256; i++)
        if (!printable(i) && k++ == cp - 256) return (int)i;
    return -1;
}
