/* tokenizer_nfc.c — Unicode NFC for the tokenizer's NFC normalizer (Qwen2's tokenizer.json):
 * canonical decomposition (tables in tokenizer_nfc_data.h, Hangul by its algorithm), canonical
 * ordering of combining marks, then canonical composition of primary composites (UAX #15). Not
 * NFKC or NFD: no file this reader accepts asks for them. */
#include <stdlib.h>

#include "io/tokenizer_nfc_data.h"
#include "io/tokenizer_text.h"

enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, L_COUNT = 19, V_COUNT = 21,
       T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT };

static int ccc_of(uint32_t cp) {
    size_t lo = 0, hi = sizeof DW_NFC_CCC / sizeof *DW_NFC_CCC;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (DW_NFC_CCC[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < sizeof DW_NFC_CCC / sizeof *DW_NFC_CCC && DW_NFC_CCC[lo].cp == cp ? DW_NFC_CCC[lo].ccc : 0;
}

static const dw_nfc_dec *decomposition(uint32_t cp) {
    size_t lo = 0, hi = sizeof DW_NFC_DEC / sizeof *DW_NFC_DEC;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (DW_NFC_DEC[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < sizeof DW_NFC_DEC / sizeof *DW_NFC_DEC && DW_NFC_DEC[lo].cp == cp ? &DW_NFC_DEC[lo] : NULL;
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b) {
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    size_t lo = 0, hi = sizeof DW_NFC_COMP / sizeof *DW_NFC_COMP;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        const dw_nfc_comp *c = &DW_NFC_COMP[mid];
        if (c->a < a || (c->a == a && c->b < b)) lo = mid + 1;
        else hi = mid;
    }
    const dw_nfc_comp *c = &DW_NFC_COMP[lo < sizeof DW_NFC_COMP / sizeof *DW_NFC_COMP ? lo : 0];
    return lo < sizeof DW_NFC_COMP / sizeof *DW_NFC_COMP && c->a == a && c->b == b ? c->c : 0;
}

char *dw_utf8_nfc(const char *s, size_t n, size_t *out_len) {
    uint32_t *cp = malloc((4 * n + 1) * sizeof *cp); /* a character decomposes into at most 4 */
    if (!cp) return NULL;
    size_t len = 0;
    for (size_t i = 0; i < n;) { /* decompose */
        size_t k;
        const uint32_t c = dw_utf8_at(s + i, &k);
        const dw_nfc_dec *d = decomposition(c);
        if (c >= S_BASE && c < S_BASE + S_COUNT) {
            const uint32_t si = c - S_BASE;
            cp[len++] = L_BASE + si / N_COUNT, cp[len++] = V_BASE + (si % N_COUNT) / T_COUNT;
            if (si % T_COUNT) cp[len++] = T_BASE + si % T_COUNT;
        } else if (d) {
            for (int j = 0; j < d->n; j++) cp[len++] = d->d[j];
        } else {
            cp[len++] = c;
        }
        i += k;
    }
    for (size_t i = 1; i < len; i++) /* canonical order: a stable sort of each run of marks by class */
        for (size_t j = i; j > 0 && ccc_of(cp[j]) != 0 && ccc_of(cp[j - 1]) > ccc_of(cp[j]); j--) {
            const uint32_t t = cp[j];
            cp[j] = cp[j - 1], cp[j - 1] = t;
        }
    size_t out = 0;
    int64_t starter = -1; /* the last starter's index in the output */
    int last = 0;         /* the class of the last character kept after it */
    for (size_t i = 0; i < len; i++) { /* compose */
        const uint32_t c = cp[i];
        const int cc = ccc_of(c);
        const bool adjacent = starter >= 0 && (size_t)starter == out - 1;
        if (starter >= 0 && (adjacent || (last != 0 && last < cc))) {
            const uint32_t p = compose(cp[starter], c);
            if (p) {
                cp[starter] = p;
                continue;
            }
        }
        if (cc == 0) starter = (int64_t)out;
        last = cc;
        cp[out++] = c;
    }
    dw_tok_buf b = {0};
    for (size_t i = 0; i < out; i++) dw_tok_buf_addc(&b, cp[i]);
    dw_tok_buf_add(&b, "", 0);
    free(cp);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    *out_len = b.n;
    return b.s;
}
