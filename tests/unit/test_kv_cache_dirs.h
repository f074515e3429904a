/* test_kv_cache_dirs.h — model directories of the families whose attention differs, for the
 * cached-decoding tests (test_kv_cache.c on the CPU, tests/gpu/test_kv_cache_cuda.c): Gemma 2
 * (sliding window on alternate layers, soft-capped scores and logits, query_pre_attn_scalar),
 * Mistral (a window on every layer, one KV head) and Phi-3 (packed q|k|v, partial rotary, longrope
 * whose long factors start at position 9, mid-decoding). Windows are shorter than the tests' T. */
#ifndef DW_TEST_KV_CACHE_DIRS_H
#define DW_TEST_KV_CACHE_DIRS_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "testutil.h"

static const char *const DW_KV_DIR_CONFIGS[] = {
    "{\"model_type\": \"gemma2\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 48, "
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 8, "
    "\"max_position_embeddings\": 32, \"sliding_window\": 5, \"query_pre_attn_scalar\": 12, "
    "\"attn_logit_softcapping\": 2.0, \"final_logit_softcapping\": 3.0}",
    "{\"model_type\": \"mistral\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 48, "
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 1, "
    "\"max_position_embeddings\": 32, \"sliding_window\": 4}",
    "{\"model_type\": \"phi3\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 48, "
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
    "\"max_position_embeddings\": 32, \"original_max_position_embeddings\": 9, \"partial_rotary_factor\": 0.5, "
    "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1.0, 1.5], \"long_factor\": [2.0, 4.5]}}",
};
#define DW_KV_DIRS (sizeof DW_KV_DIR_CONFIGS / sizeof *DW_KV_DIR_CONFIGS)

/* Calls check(model directory) for each config, written under a fresh temporary directory. */
static void dw_kv_for_each_dir(void (*check)(const char *dir)) {
    char *tmp = dw_test_tmpdir();
    if (!tmp) abort();
    for (size_t i = 0; i < DW_KV_DIRS; i++) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/m%zu", tmp, i);
        char *dir = mkdir(sub, 0755) == 0 ? dw_test_model_dir(sub, DW_KV_DIR_CONFIGS[i]) : NULL;
        if (!dir) {
            fprintf(stderr, "cannot write the model directory %s\n", sub);
            abort();
        }
        check(dir);
        free(dir);
    }
    dw_test_rmtree(tmp);
    free(tmp);
}

#endif /* DW_TEST_KV_CACHE_DIRS_H */
