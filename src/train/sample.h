/* sample.h — private: text generation with an engine (no KV cache: each new token runs the
 * forward pass over the last T tokens; fine for the CPU reference and short samples), and the
 * byte-level tokenizer (one token per byte, vocab 256) or plain token ids. */
#ifndef DW_TRAIN_SAMPLE_H
#define DW_TRAIN_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"
#include "runtime/engine.h"
#include "train/rng.h"

typedef struct {
    double temperature; /* 0: greedy (argmax) */
    int top_k;          /* 0: the whole vocabulary */
} dw_sample_opts;

/* Appends n tokens to tokens[0..np) (np >= 1; room for np + n), using at most T tokens of context
 * (the engine must have been created with T >= that and B >= 1). */
dw_status dw_generate(dw_ctx *ctx, dw_engine *e, int64_t T, int32_t *tokens, int64_t np, int64_t n,
                      const dw_sample_opts *o, dw_rng *rng);

/* Picks a token from logits (V) with temperature and top-k; work (V) is scratch. */
int32_t dw_sample_logits(const float *logits, int64_t V, const dw_sample_opts *o, dw_rng *rng,
                         double *work);

/* Tokenizers. bytes: each byte of text is a token; decoding writes bytes (ids > 255 as "<id>").
 * ids: space-separated decimal token ids both ways. */
typedef enum { DW_TOK_BYTES = 0, DW_TOK_IDS } dw_tokenizer;
const char *dw_tokenizer_name(dw_tokenizer t); /* "bytes", "ids" */
bool dw_tokenizer_parse(const char *name, dw_tokenizer *out);
/* Encodes text into a malloc'd array; ids: errors (DW_ERR_INVALID) name the bad word or an id
 * outside [0, vocab). */
dw_status dw_tokenize(dw_ctx *ctx, dw_tokenizer t, const char *text, int64_t vocab, int32_t **ids_out,
                      int64_t *n_out);
char *dw_detokenize(dw_tokenizer t, const int32_t *ids, int64_t n); /* malloc'd, NUL-terminated */

#endif /* DW_TRAIN_SAMPLE_H */
