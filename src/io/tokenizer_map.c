/* tokenizer_map.c — the tokenizer's hash tables (tokenizer_map.h): FNV-1a over token bytes, a
 * 64-bit mix over id pairs, linear probing in power-of-two tables kept at most half full. */
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer_map.h"

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static size_t map_slot(const dw_tok_map *m, const char *key, size_t len) {
    size_t i = (size_t)hash_bytes(key, len) & (m->cap - 1);
    while (m->key[i] && !(m->klen[i] == len && memcmp(m->key[i], key, len) == 0)) i = (i + 1) & (m->cap - 1);
    return i;
}

static bool map_grow(dw_tok_map *m) {
    dw_tok_map g = {.cap = m->cap ? m->cap * 2 : 1024};
    g.key = calloc(g.cap, sizeof *g.key), g.klen = malloc(g.cap * sizeof *g.klen), g.val = malloc(g.cap * sizeof *g.val);
    if (!g.key || !g.klen || !g.val) {
        dw_tok_map_free(&g);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->key[i]) {
            const size_t j = map_slot(&g, m->key[i], m->klen[i]);
            g.key[j] = m->key[i], g.klen[j] = m->klen[i], g.val[j] = m->val[i];
        }
    g.n = m->n;
    dw_tok_map_free(m);
    *m = g;
    return true;
}

bool dw_tok_map_put(dw_tok_map *m, const char *key, size_t len, int32_t val) {
    if ((m->n + 1) * 2 > m->cap && !map_grow(m)) return false;
    const size_t i = map_slot(m, key, len);
    if (!m->key[i]) m->key[i] = key, m->klen[i] = len, m->n++;
    m->val[i] = val;
    return true;
}

int32_t dw_tok_map_get(const dw_tok_map *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    const size_t i = map_slot(m, key, len);
    return m->key[i] ? m->val[i] : -1;
}

void dw_tok_map_free(dw_tok_map *m) {
    free(m->key);
    free(m->klen);
    free(m->val);
    memset(m, 0, sizeof *m);
}

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static size_t pair_slot(const dw_tok_pairs *m, uint64_t k) {
    size_t i = (size_t)mix64(k) & (m->cap - 1);
    while (m->key[i] != UINT64_MAX && m->key[i] != k) i = (i + 1) & (m->cap - 1);
    return i;
}

static bool pairs_grow(dw_tok_pairs *m) {
    dw_tok_pairs g = {.cap = m->cap ? m->cap * 2 : 1024};
    g.key = malloc(g.cap * sizeof *g.key), g.rank = malloc(g.cap * sizeof *g.rank), g.id = malloc(g.cap * sizeof *g.id);
    if (!g.key || !g.rank || !g.id) {
        dw_tok_pairs_free(&g);
        return false;
    }
    memset(g.key, 0xff, g.cap * sizeof *g.key);
    for (size_t i = 0; i < m->cap; i++)
        if (m->key[i] != UINT64_MAX) {
            const size_t j = pair_slot(&g, m->key[i]);
            g.key[j] = m->key[i], g.rank[j] = m->rank[i], g.id[j] = m->id[i];
        }
    g.n = m->n;
    dw_tok_pairs_free(m);
    *m = g;
    return true;
}

bool dw_tok_pairs_put(dw_tok_pairs *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    if ((m->n + 1) * 2 > m->cap && !pairs_grow(m)) return false;
    const uint64_t k = pair_key(a, b);
    const size_t i = pair_slot(m, k);
    if (m->key[i] == UINT64_MAX) m->key[i] = k, m->n++;
    m->rank[i] = rank, m->id[i] = id;
    return true;
}

bool dw_tok_pairs_get(const dw_tok_pairs *m, int32_t a, int32_t b, int32_t *rank, int32_t *id) {
    if (!m->cap) return false;
    const size_t i = pair_slot(m, pair_key(a, b));
    if (m->key[i] == UINT64_MAX) return false;
    *rank = m->rank[i], *id = m->id[i];
    return true;
}

void dw_tok_pairs_free(dw_tok_pairs *m) {
    free(m->key);
    free(m->rank);
    free(m->id);
    memset(m, 0, sizeof *m);
}
