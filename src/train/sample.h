/* sample.h — private: what the public generation (dw_engine_generate: a K/V cache where the
 * engine has one, runtime/kv_cache.h; else each new token runs the forward pass over the last T
 * tokens) and tokenizers (dw_tokenize, dw_detokenize by name: "bytes", one token per byte, vocab
 * 256; "ids", space-separated token ids; any other name is a tokenizer.json, io/tokenizer.h) share. */
#ifndef DW_TRAIN_SAMPLE_H
#define DW_TRAIN_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"
#include "train/rng.h"

typedef struct {
    double temperature; /* 0: greedy (argmax) */
    int top_k;          /* 0: the whole vocabulary */
} dw_sample_opts;

/* Picks a token from logits (V) with temperature and top-k; work (V) is scratch. */
int32_t dw_sample_logits(const float *logits, int64_t V, const dw_sample_opts *o, dw_rng *rng,
                         double *work);

/* Tokenizers. bytes: each byte of text is a token; decoding writes bytes (ids > 255 as "<id>").
 * ids: space-separated decimal token ids both ways. */
typedef enum { DW_TOK_BYTES = 0, DW_TOK_IDS } dw_tokenizer;
const char *dw_tokenizer_name(dw_tokenizer t); /* "bytes", "ids" */
bool dw_tokenizer_parse(const char *name, dw_tokenizer *out);

#endif /* DW_TRAIN_SAMPLE_H */
