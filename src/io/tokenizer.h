/* tokenizer.h — private: Hugging Face tokenizer.json (BPE models) in C, behind deepwell.h's
 * dw_hf_tokenizer_open/encode/decode. Loading (tokenizer_load.c) turns the file's model, added tokens,
 * normalizer, pre-tokenizer and decoder into the tables below; encoding (tokenizer_encode.c,
 * tokenizer_pretok.c) and decoding (tokenizer_decode.c) follow the `tokenizers` package's
 * algorithms for the parts HF models use; anything else is refused by name when the file is read.
 * Not a trainer, not the post-processor (no BOS/EOS is added: `encode(s, add_special_tokens=False)`). */
#ifndef DW_IO_TOKENIZER_H
#define DW_IO_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deepwell.h"
#include "io/tokenizer_map.h"

typedef struct {
    char *content;     /* UTF-8 */
    char *normalized;  /* content through the normalizer (normalized tokens only), else NULL */
    int32_t id;
    bool special, lstrip, rstrip, single_word, is_normalized;
} dw_tok_added;

/* normalizers: Prepend(a), Replace(a -> b) (String patterns), the four Unicode normalization forms,
 * Lowercase, StripAccents (tokenizer_norm.c) */
typedef enum { DW_TOKN_PREPEND, DW_TOKN_REPLACE, DW_TOKN_NFC, DW_TOKN_NFD, DW_TOKN_NFKC, DW_TOKN_NFKD,
               DW_TOKN_LOWERCASE, DW_TOKN_STRIP_ACCENTS } dw_tok_norm_kind;
typedef struct {
    dw_tok_norm_kind kind;
    char *a, *b;
} dw_tok_norm;

/* how Split keeps the matches (the package's SplitDelimiterBehavior) */
typedef enum { DW_SPLIT_REMOVED, DW_SPLIT_ISOLATED, DW_SPLIT_MERGED_PREV, DW_SPLIT_MERGED_NEXT, DW_SPLIT_CONTIGUOUS } dw_split_behavior;

/* pre-tokenizers: ByteLevel (optionally splitting with the GPT-2 regex), Split (regex or string),
 * Metaspace, Digits */
typedef enum { DW_TOKP_BYTELEVEL, DW_TOKP_SPLIT, DW_TOKP_METASPACE, DW_TOKP_DIGITS } dw_tok_pre_kind;
typedef enum { DW_PREPEND_ALWAYS, DW_PREPEND_FIRST, DW_PREPEND_NEVER } dw_prepend_scheme;
typedef struct {
    dw_tok_pre_kind kind;
    bool add_prefix_space, use_regex;  /* ByteLevel */
    void *re;                          /* Split (a String pattern compiled as a literal) and ByteLevel: pcre2_code_8 */
    dw_split_behavior behavior;        /* Split */
    bool invert;                       /* Split */
    char *replacement;                 /* Metaspace: one character, UTF-8 */
    dw_prepend_scheme scheme;          /* Metaspace */
    bool split;                        /* Metaspace */
    bool individual_digits;            /* Digits */
} dw_tok_pre;

/* decoders: ByteLevel, Replace(a -> b), ByteFallback, Fuse, Strip(a, start, stop), Metaspace(a, scheme) */
typedef enum { DW_TOKD_BYTELEVEL, DW_TOKD_REPLACE, DW_TOKD_BYTEFALLBACK, DW_TOKD_FUSE, DW_TOKD_STRIP,
               DW_TOKD_METASPACE } dw_tok_dec_kind;
typedef struct {
    dw_tok_dec_kind kind;
    char *a, *b;
    int64_t start, stop;
    dw_prepend_scheme scheme;
} dw_tok_dec;

struct dw_hf_tokenizer {
    char *path;           /* the tokenizer.json read */
    int64_t n_vocab;      /* the model's ids are below it */
    char **vocab_token;   /* (n_vocab) the model's token of each id, NULL where none */
    int64_t n_ids;        /* all ids are below it: 1 + the largest of the vocabulary's and added tokens' */
    const char **id_token; /* (n_ids) the token of each id (added tokens win; borrowed), NULL where none */
    dw_tok_map vocab;     /* the model's vocabulary: token -> id (keys borrowed from vocab_token) */
    dw_tok_pairs merges;  /* (left id, right id) -> (rank, merged id) */
    int32_t unk;          /* the model's unk_token id, or -1 */
    bool byte_fallback, ignore_merges, fuse_unk;
    dw_tok_added *added;
    int n_added;
    dw_tok_norm *norm;
    int n_norm;
    dw_tok_pre *pre;
    int n_pre;
    dw_tok_dec *dec;
    int n_dec;
    bool has_decoder;     /* false: tokens are joined with spaces, as the package does */
};

/* The token of id ("" when none), for messages. */
const char *dw_hf_tokenizer_token(const dw_hf_tokenizer *t, int64_t id);

/* Applies the normalizers to s[0, n) (valid UTF-8): a malloc'd NUL-terminated string and its
 * length; NULL when out of memory. *lead (may be NULL): whether the result still begins where s
 * began — false when a normalizer removed the first character (StripAccents of a leading mark),
 * which the package's Metaspace prepend_scheme "first" reads as not at offset 0 of the input.
 * dw_tok_normalize_one: one normalizer alone. */
char *dw_tok_normalize(const dw_hf_tokenizer *t, const char *s, size_t n, size_t *out_len, bool *lead);
char *dw_tok_normalize_one(const dw_tok_norm *d, const char *s, size_t n, size_t *out_len);

/* Pieces a pre-tokenizer works on: UTF-8 text, and whether it starts at offset 0 of the input. */
typedef struct {
    char *s;
    size_t n;
    bool at0;
} dw_tok_piece;
typedef struct {
    dw_tok_piece *p;
    int64_t n, cap;
    bool oom;
} dw_tok_pieces;
void dw_tok_pieces_push(dw_tok_pieces *ps, const char *s, size_t n, bool at0);
void dw_tok_pieces_free(dw_tok_pieces *ps);

/* Runs the pre-tokenizers in order over *ps (replaced). DW_ERR_NOMEM or a regex failure. */
dw_status dw_tok_pretokenize(dw_ctx *ctx, const dw_hf_tokenizer *t, dw_tok_pieces *ps);

/* Compiles a pattern (a regex, or with literal a plain string) for Split; NULL with a message in
 * err (errcap bytes) on failure. dw_tok_regex_free(NULL) is harmless. */
void *dw_tok_regex_compile(const char *pattern, bool literal, char *err, size_t errcap);
void dw_tok_regex_free(void *re);

#endif /* DW_IO_TOKENIZER_H */
