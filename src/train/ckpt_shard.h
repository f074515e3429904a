/* ckpt_shard.h — private: the range bookkeeping of sharded checkpoints. Rank r of a job holds the
 * range [lo[r], hi[r]) of the flat parameter pools (train/dp.h: the ranks' ranges tile the pool),
 * or several ranges (dw_ckpt_pieces_of: any list of ranges, each with its rank, that tiles it);
 * a tensor stored at [off, off + numel) of the pool splits into pieces, one per range that meets
 * it, each a range [begin, end) of the tensor's row-major elements. Reading back, any wanted
 * range of a tensor is assembled from the pieces that hold it, whatever world size wrote them
 * (resharding). Also the shard files' names. Pure functions: no I/O (ckpt_shard_io.c). */
#ifndef DW_TRAIN_CKPT_SHARD_H
#define DW_TRAIN_CKPT_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The index of a sharded checkpoint's optimizer state (written by rank 0). */
#define DW_CKPT_INDEX "optimizer.safetensors.index.json"

typedef struct {
    int rank;           /* whose shard file holds it */
    int64_t begin, end; /* elements [begin, end) of the tensor */
    int nth;            /* its rank's pieces of this tensor before it: 0, stored under the moment's
                           name; later ones under dw_ckpt_piece_name's */
} dw_ckpt_piece;

/* The pieces of the tensor at [off, off + numel) of the pool, given the world's ranges
 * lo[world], hi[world]: at most `world` into out, in rank order, empty ones left out. Returns the
 * count. */
int dw_ckpt_pieces(int64_t off, int64_t numel, int world, const int64_t *lo, const int64_t *hi, dw_ckpt_piece *out);
/* The same for n ranges [lo[i], hi[i]) held by rank[i] (several a rank, any order): at most n into
 * out, in range order, empty ones left out, nth counted per rank. */
int dw_ckpt_pieces_of(int64_t off, int64_t numel, int n, const int *rank, const int64_t *lo, const int64_t *hi,
                      dw_ckpt_piece *out);
/* The name a piece is stored under in its shard file: `moment` for its rank's first piece of the
 * tensor, "moment@begin" for a later one ("w.exp_avg@4096"). Caller frees; NULL: out of memory. */
char *dw_ckpt_piece_name(const char *moment, const dw_ckpt_piece *p);

/* Whether n pieces (any order) cover a tensor of numel elements exactly once. If not, why (cap
 * bytes) says where: "elements [4, 9) are in two pieces", "elements [0, 3) are in no piece",
 * "a piece [5, 2) is empty or reversed", "a piece [90, 120) lies outside the 100 elements". */
bool dw_ckpt_pieces_check(const dw_ckpt_piece *p, int n, int64_t numel, char *why, size_t cap);

typedef struct {
    int piece;      /* index into the pieces */
    int64_t src;    /* first element inside the piece */
    int64_t dst;    /* first element inside the wanted range */
    int64_t count;
} dw_ckpt_copy;

/* The copies that fill elements [a, b) of a tensor from pieces that passed dw_ckpt_pieces_check:
 * at most n into out, in order of dst. Returns the count. */
int dw_ckpt_copies(const dw_ckpt_piece *p, int n, int64_t a, int64_t b, dw_ckpt_copy *out);

/* "optimizer-00001-of-00004.safetensors": rank 1's shard of 4. */
void dw_ckpt_shard_name(int rank, int world, char *buf, size_t cap);
/* The rank and world of a shard's file name; false for any other name. */
bool dw_ckpt_shard_parse(const char *name, int *rank, int *world);

#endif /* DW_TRAIN_CKPT_SHARD_H */
