/* safetensors.h — private: reader (mmap, zero-copy, validated against hostile files) and atomic
 * writer (temporary name, fsync, rename) for the safetensors format.
 * CONTRACT HEADER: used by capture (weights), trainer (checkpoints) and the quantize commands. */
#ifndef DW_IO_SAFETENSORS_H
#define DW_IO_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "deepwell.h"

typedef enum {
    DW_DT_F64 = 0, DW_DT_F32, DW_DT_F16, DW_DT_BF16, DW_DT_F8_E4M3, DW_DT_F8_E5M2,
    DW_DT_I64, DW_DT_I32, DW_DT_I16, DW_DT_I8, DW_DT_U64, DW_DT_U32, DW_DT_U16, DW_DT_U8,
    DW_DT_BOOL, DW_DT_COUNT
} dw_dtype;

const char *dw_dtype_name(dw_dtype t); /* safetensors spelling: "BF16", "F8_E4M3", ... */
size_t dw_dtype_size(dw_dtype t);      /* bytes per element */
bool dw_dtype_parse(const char *name, dw_dtype *out);

#define DW_ST_MAX_DIMS 8

typedef struct {
    const char *name;       /* owned by the file handle */
    dw_dtype dtype;
    int ndim;
    int64_t shape[DW_ST_MAX_DIMS];
    const void *data;       /* points into the mapping; valid while the file is open */
    size_t nbytes;
} dw_st_tensor;

typedef struct dw_st_file dw_st_file;

/* Maps and validates `path`. Every error names the file and, where it applies, the tensor. */
dw_status dw_st_open(dw_ctx *ctx, const char *path, dw_st_file **out);
void dw_st_close(dw_st_file *f);
int dw_st_count(const dw_st_file *f);
const dw_st_tensor *dw_st_get(const dw_st_file *f, int i);          /* in file (offset) order */
const dw_st_tensor *dw_st_find(const dw_st_file *f, const char *name); /* NULL if absent */
/* The __metadata__ string map (NULL when absent); value for key or NULL. */
const char *dw_st_metadata(const dw_st_file *f, const char *key);
int dw_st_metadata_count(const dw_st_file *f);
void dw_st_metadata_at(const dw_st_file *f, int i, const char **key, const char **value);

/* Writer: add tensors (data is copied lazily: pointers must stay valid until commit), then
 * commit writes header + data to a temporary file, fsyncs and renames. */
typedef struct dw_st_writer dw_st_writer;
dw_status dw_st_writer_create(dw_ctx *ctx, dw_st_writer **out);
dw_status dw_st_writer_add(dw_ctx *ctx, dw_st_writer *w, const char *name, dw_dtype dtype, int ndim,
                           const int64_t *shape, const void *data, size_t nbytes);
dw_status dw_st_writer_set_metadata(dw_ctx *ctx, dw_st_writer *w, const char *key, const char *value);
dw_status dw_st_writer_commit(dw_ctx *ctx, dw_st_writer *w, const char *path);
void dw_st_writer_free(dw_st_writer *w);

/* ---- extensions (added with the implementation; see docs/safetensors.md) ------------------ */

/* Limits the reader enforces on hostile files. */
#define DW_ST_MAX_HEADER ((uint64_t)100 << 20) /* bytes of JSON header */

/* Like dw_st_open over bytes already in memory. `buf` is borrowed: it must stay valid and
 * unchanged while the handle lives. `name` stands for the file in error messages. */
dw_status dw_st_open_memory(dw_ctx *ctx, const void *buf, size_t len, const char *name,
                            dw_st_file **out);
/* The path (or name) the file was opened with; valid while f is open. */
const char *dw_st_path(const dw_st_file *f);

bool dw_dtype_is_float(dw_dtype t); /* F64, F32, F16, BF16, F8_E4M3, F8_E5M2 */
int64_t dw_st_numel(const dw_st_tensor *t); /* product of the shape (1 for a scalar) */

/* Alignment: t->data is only as aligned as the file makes it (the header length and the
 * data_offsets are arbitrary in files from other writers), so never dereference it as a wider
 * type. Files from dw_st_writer keep every tensor aligned to its element size (see the writer).
 * dw_st_is_aligned says whether a direct cast is safe; otherwise memcpy, or use: */
bool dw_st_is_aligned(const dw_st_tensor *t);
/* Converts a floating-point tensor (F32, F16, BF16 exactly; F64 rounded to nearest) to FP32 in
 * `out` (dw_st_numel(t) floats), reading with memcpy so any alignment is fine. Other dtypes:
 * DW_ERR_UNSUPPORTED naming the file and the tensor. */
dw_status dw_st_read_f32(dw_ctx *ctx, const dw_st_file *f, const dw_st_tensor *t, float *out);

/* Fine-grained FP8 weights (safetensors_blockfp8.c): E4M3 codes [..., R, C] with NAME_scale_inv
 * [..., ceil(R/128), ceil(C/128)] (F32/BF16/F16) in file sf. The companion's name (malloc'd);
 * the check of dtypes and shapes (DW_ERR_FORMAT / DW_ERR_UNSUPPORTED naming the file and tensor;
 * scale may be NULL: missing); and the values code x scale_inv into out (numel(codes) floats). */
char *dw_st_scale_inv_name(const char *name);
dw_status dw_st_check_block_fp8(dw_ctx *ctx, const dw_st_file *f, const dw_st_tensor *codes, const dw_st_file *sf,
                                const dw_st_tensor *scale);
dw_status dw_st_read_block_fp8(dw_ctx *ctx, const dw_st_file *f, const dw_st_tensor *codes, const dw_st_file *sf,
                               const dw_st_tensor *scale, float *out);

/* Serialises the writer's content to one malloc'd buffer (the exact bytes commit writes). */
dw_status dw_st_writer_serialize(dw_ctx *ctx, dw_st_writer *w, void **buf_out, size_t *len_out);

#endif /* DW_IO_SAFETENSORS_H */
