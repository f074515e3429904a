/* ckpt.h — private: checkpoint directories. A run directory holds ckpt-<step>/ directories and a
 * `latest` file naming the newest. A checkpoint holds config.json, model.safetensors,
 * optimizer.safetensors (written by a callback; by several ranks: a shard per rank and an index,
 * train/ckpt_shard.h) and state.json (the training state plus the size and CRC-32 of every other
 * file). Written atomically: a temporary directory, every file and the directory fsynced, one
 * rename, then `latest` replaced atomically; the oldest beyond `keep` are removed. Opening
 * validates everything before anything is loaded. Not the tensor I/O itself. */
#ifndef DW_TRAIN_CKPT_H
#define DW_TRAIN_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "deepwell.h"
#include "train/optim.h"

/* 3: written by several ranks: optimizer.safetensors' place taken by one shard per rank and their
 * index (train/ckpt_shard.h), every file listed in state.json's "files"; 2 (what one rank still
 * writes): state.json carries "state_crc32", the CRC-32 of its own bytes with those 8 hex digits
 * read as zeros; 1 (still read, with a note): without it. */
#define DW_CKPT_FORMAT_VERSION 3
#define DW_CKPT_FORMAT_ONE_RANK 2
#define DW_CKPT_SELF_CRC "state_crc32"
#define DW_CKPT_NFILES 3
/* The files a one-rank checkpoint holds besides state.json, in the order they are checked. A
 * sharded one holds the first two, the index and the shards. */
extern const char *const dw_ckpt_files[DW_CKPT_NFILES];
/* The tokenizer a run's text goes through (dw_run_set_tokenizer): a run directory's copy goes into
 * every checkpoint written there, listed in state.json's "files" like the others (optional). */
#define DW_CKPT_TOKENIZER "tokenizer.json"

typedef struct {
    int64_t step;          /* optimizer steps done */
    int64_t total_steps;   /* --steps of the run */
    int64_t tokens_seen;
    uint64_t data_position; /* windows consumed (data.h) */
    uint64_t seed;
    uint64_t rng_state;    /* the trainer's sampling RNG */
    dw_schedule schedule;  /* .total: the horizon the run began with; a resume that extends
                              --steps keeps it (the steps beyond run at min_lr) */
    double beta1, beta2, eps, weight_decay, clip;
    int64_t batch, seq, global_batch;
    char data[1024];       /* the --data pattern */
    char tokenizer[16];    /* "bytes" (builtin, raw text) or "ids" (token shards) */
    char precision[32];    /* "fp32" (no policy), or the program policy's default recipe
                              ("bf16", "fp8_block", ...; "policy" when it has rules) */
    /* The run's own settings, state.json's "run" (absent from checkpoints written before it:
     * has_run false and these fields zero; a resume then takes them from its options). */
    bool has_run;
    char val[1024];        /* the validation pattern in effect ("builtin", a glob), "" none */
    int64_t eval_every, eval_batches, ckpt_every, keep;
    char device[8];        /* "cpu" or "cuda": where the run trained */
    /* Written only (not read back): JSON texts stored as state.json's "policy" (the policy
     * document, dw_policy_to_json) and "recipes" ({node name: recipe}); NULL writes null. */
    const char *policy_json, *recipes_json;
    /* Written only, each under its own key when not NULL, read back by its owner (train/guard.h
     * dw_guard_state_key): "spike" (train/spike.h), "fp8_amax_history" (precision/amax_history.h). */
    const char *spike_json, *amax_json;
    /* Written only: state.json's "moe_bias" (train/moe_bias.h; NULL: none), read back by the trainer. */
    const char *moe_bias_json;
    int shards;            /* read (dw_ckpt_open): 0, the moments in optimizer.safetensors; N, in N
                              shard files with an index (format_version 3); ignored by dw_ckpt_save */
    bool has_tokenizer;    /* read: the checkpoint holds DW_CKPT_TOKENIZER (validated as its other
                              files); dw_ckpt_save copies run_dir's when there is one */
} dw_ckpt_state;

/* Writes the checkpoint's other files into `dir` (a temporary directory). */
typedef dw_status (*dw_ckpt_write_fn)(dw_ctx *ctx, const char *dir, void *user);

/* Writes run_dir/ckpt-<state->step>/ atomically and points run_dir/latest at it; keeps the newest
 * `keep` checkpoints (0: all). *path_out (may be NULL) receives the checkpoint's path (free()). */
dw_status dw_ckpt_save(dw_ctx *ctx, const char *run_dir, const dw_ckpt_state *state,
                       dw_ckpt_write_fn write, void *user, int keep, char **path_out);
/* The same, called by every rank of `host` (a host communicator; NULL or a world of one is
 * dw_ckpt_save). Rank 0 makes the temporary directory; `write` runs on every rank and writes its
 * files there: rank r its shard (dw_ckpt_shard_name), rank 0 also config.json, model.safetensors
 * and the index. Each rank fsyncs its shard and the ranks exchange (written, size, CRC-32); only
 * when every rank has written does rank 0 write state.json, rename and replace `latest`. A rank
 * that fails or dies leaves the previous checkpoint as `latest`; every rank returns the outcome,
 * *path_out is set on rank 0 only. */
dw_status dw_ckpt_save_ranks(dw_ctx *ctx, dw_comm *host, const char *run_dir, const dw_ckpt_state *state,
                             dw_ckpt_write_fn write, void *user, int keep, char **path_out);

/* Resolves `dir` (a checkpoint, or a run directory through its `latest` file) and validates it:
 * state.json parses and has every field, each file exists with the recorded size and CRC-32.
 * Errors name the file. *ckpt_dir_out (free()) is the checkpoint directory. */
dw_status dw_ckpt_open(dw_ctx *ctx, const char *dir, char **ckpt_dir_out, dw_ckpt_state *out);

/* CRC-32 (the zlib/IEEE polynomial, as Python's zlib.crc32) of n bytes. */
uint32_t dw_crc32(const void *data, size_t n);
/* CRC-32 (the zlib/IEEE polynomial, as Python's zlib.crc32) and size of a file. */
dw_status dw_file_crc32(dw_ctx *ctx, const char *path, uint32_t *crc_out, int64_t *size_out);
/* Removes a directory tree (no-op if absent). */
dw_status dw_rmtree(dw_ctx *ctx, const char *path);
/* malloc'd "a/b". */
char *dw_path_join(const char *a, const char *b);
/* n bytes from a file, fit to echo in a message: printable ASCII as is, \" \\ and \xNN for the
 * rest, cut with "..." to fit cap (at least 16). */
void dw_escape_bytes(const char *s, size_t n, char *out, size_t cap);
/* malloc'd: a data pattern made absolute against the working directory ("builtin" and absolute
 * patterns as given), so that a run resumed from elsewhere reads the same files. NULL: no memory. */
char *dw_abs_pattern(const char *pattern);

#endif /* DW_TRAIN_CKPT_H */
