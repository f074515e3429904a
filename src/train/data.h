/* data.h — private: training data as windows of T+1 tokens (inputs and next-token targets):
 * llm.c token shards (a glob of many .bin files), raw text files read as bytes (byte-level,
 * vocab 256), or the built-in synthetic arithmetic set (no file needed). Shuffling is
 * deterministic from a seed; the read position is one integer that checkpoints save.
 * Not a tokenizer: shards hold token ids already; text is bytes. */
#ifndef DW_TRAIN_DATA_H
#define DW_TRAIN_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"

/* llm.c shard header: 256 int32 little-endian; [0] magic, [1] version, [2] token count. */
#define DW_SHARD_HEADER_INTS 256
#define DW_SHARD_MAGIC_U16 20240520 /* version 1, uint16 tokens (GPT-2) */
#define DW_SHARD_MAGIC_U32 20240801 /* version 7, uint32 tokens (llama-3) */
#define DW_SHARD_VERSION_U16 1
#define DW_SHARD_VERSION_U32 7

typedef enum { DW_DATA_SHARDS = 0, DW_DATA_TEXT, DW_DATA_BUILTIN } dw_data_kind;

typedef struct dw_data dw_data;

typedef struct {
    const char *pattern; /* glob(3) pattern, or "builtin" */
    bool val_split;      /* builtin only: the validation stream instead of the training stream */
    int64_t T;           /* sequence length; a window is T+1 consecutive tokens */
    int64_t vocab_size;  /* every token must be < vocab_size */
    bool shuffle;        /* false: windows in file order (validation) */
    uint64_t seed;       /* shuffling seed */
} dw_data_opts;

/* Opens every file matching the pattern (sorted), validates all of them (header, size, every
 * token < vocab) and counts windows. Files ending in ".bin" are token shards, other files raw
 * text; a mix is an error. Errors name the file and byte offset. dw_data_open_pattern (public,
 * deepwell.h) is this in file order; dw_data_windows, dw_data_next and dw_data_free are public. */
dw_status dw_data_open(dw_ctx *ctx, const dw_data_opts *opts, dw_data **out);

dw_data_kind dw_data_get_kind(const dw_data *d);
int dw_data_file_count(const dw_data *d);
int64_t dw_data_tokens(const dw_data *d); /* tokens in all files */
/* dw_data_next (deepwell.h) advances the position by B and wraps into the next epoch (a new
 * shuffle) at the end. */
uint64_t dw_data_position(const dw_data *d); /* windows consumed since the start */
/* Data parallelism: rank's part of a micro-batch of world x B windows. Rank r reads the windows
 * at positions [pos + r B, pos + (r + 1) B), and every rank's position moves to pos + world B, so
 * the ranks together read exactly what one process reading world x B at a time reads, in the same
 * order (a world of one is dw_data_next). */
void dw_data_next_rank(dw_data *d, int64_t B, int rank, int world, int32_t *tokens, int32_t *targets);
void dw_data_seek(dw_data *d, uint64_t position);

/* The built-in data set as text: every "a+b=c\n" fact (0 <= a, b < DW_SYNTH_MAX) once per round,
 * in shuffled rounds: about 256 KiB for training; val_split: a shorter stream in other orders.
 * Deterministic (fixed seeds); malloc'd. */
#define DW_SYNTH_MAX 5
char *dw_synth_text(bool val_split, int64_t *len_out);

#endif /* DW_TRAIN_DATA_H */
