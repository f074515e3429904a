/* tokenizer_map.h — private: the two hash tables a BPE tokenizer looks up (io/tokenizer.h): token
 * text -> id (keys borrowed, not copied: they must outlive the table) and an id pair -> merge
 * (rank, merged id). Open addressing, linear probing, grown at half full; no deletion. */
#ifndef DW_IO_TOKENIZER_MAP_H
#define DW_IO_TOKENIZER_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char **key; /* (cap) borrowed UTF-8, NULL: empty slot */
    size_t *klen;     /* (cap) */
    int32_t *val;     /* (cap) */
    size_t cap, n;
} dw_tok_map;

/* Sets key[0, len) -> val (replacing an earlier value). false when out of memory. */
bool dw_tok_map_put(dw_tok_map *m, const char *key, size_t len, int32_t val);
/* The value of key[0, len), or -1. */
int32_t dw_tok_map_get(const dw_tok_map *m, const char *key, size_t len);
void dw_tok_map_free(dw_tok_map *m);

typedef struct {
    uint64_t *key;  /* (cap) left << 32 | right, UINT64_MAX: empty */
    int32_t *rank, *id;
    size_t cap, n;
} dw_tok_pairs;

/* Sets (a, b) -> (rank, id), replacing an earlier merge of the pair (the package keeps the last). */
bool dw_tok_pairs_put(dw_tok_pairs *m, int32_t a, int32_t b, int32_t rank, int32_t id);
/* The merge of (a, b): true and *rank, *id; false when the pair does not merge. */
bool dw_tok_pairs_get(const dw_tok_pairs *m, int32_t a, int32_t b, int32_t *rank, int32_t *id);
void dw_tok_pairs_free(dw_tok_pairs *m);

#endif /* DW_IO_TOKENIZER_MAP_H */
