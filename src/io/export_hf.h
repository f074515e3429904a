/* export_hf.h — private: the pieces of dw_export_hf (deepwell.h): the tensors of a Hugging Face
 * export converted and sharded (export_hf_tensors.c), and its config.json and copied files
 * (export_hf_files.c). export_hf.c ties them together in a temporary directory. */
#ifndef DW_IO_EXPORT_HF_H
#define DW_IO_EXPORT_HF_H

#include <stdbool.h>
#include <stdint.h>

#include "deepwell.h"
#include "io/safetensors.h"

#define DW_EXPORT_BLOCK 128 /* FP8 weight block: 128 x 128 */

/* Whether a stored Hugging Face tensor is a linear projection weight that hf-fp8 quantises:
 * "<module>.weight" [R, C] of a q/k/v/o, gate/up/down or w1/w2/w3 projection, or a fused expert
 * tensor "...experts.gate_up_proj" / "...experts.down_proj" [E, R, C]. */
bool dw_export_fp8_quantised(const dw_st_tensor *t);

/* Writes every tensor of `raw` (FP32, the model's Hugging Face names and layout) into dir as
 * model.safetensors, or as model-0000k-of-0000n.safetensors + model.safetensors.index.json when
 * the tensor bytes pass max_shard_bytes. Values in `dtype`; with fp8, the tensors
 * dw_export_fp8_quantised picks become E4M3 codes plus an F32 NAME_scale_inv of 128 x 128 blocks
 * (transformers' Fp8Quantize arithmetic: scale = 448 / amax, codes = E4M3(x * scale), scale_inv =
 * 1 / scale; an all-zero block gets scale 1). Non-finite values are refused naming the tensor.
 * *n_files (may be NULL) gets the number of weight files. */
dw_status dw_export_write_tensors(dw_ctx *ctx, const dw_st_file *raw, const char *dir, dw_export_dtype dtype,
                                  bool fp8, int64_t max_shard_bytes, int *n_files);

/* config.json in dir: the Hugging Face config `hf_config` (may be NULL: none) with every key of the
 * checkpoint's own config text `own` over it, torch_dtype set, and for fp8 the
 * quantization_config naming the unquantised linear modules of `raw`; no stale
 * quantization_config otherwise. A model_type other than own's in hf_config is refused. */
dw_status dw_export_write_config(dw_ctx *ctx, const char *own, const char *hf_config, const dw_st_file *raw,
                                 const char *dir, dw_export_dtype dtype, bool fp8);

/* Copies generation_config.json and the tokenizer files hf_dir has into dir; *n_copied (may be
 * NULL) counts them. */
dw_status dw_export_copy_extras(dw_ctx *ctx, const char *hf_dir, const char *dir, int *n_copied);

#endif /* DW_IO_EXPORT_HF_H */
