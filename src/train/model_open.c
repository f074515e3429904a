/* model_open.c — engine choice per device and opening models for inference (see model_open.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "formats/formats.h"
#include "precision/policy.h"
#include "train/ckpt.h"
#include "train/model_open.h"

dw_status dw_train_engine_create_policy(dw_ctx *ctx, const dw_model_config *cfg, int64_t B, int64_t T,
                                        const dw_policy *policy, dw_engine **out) {
    *out = NULL;
    if (dw_ctx_device(ctx) == DW_DEVICE_CPU) {
        if (policy)
            return dw_set_error(ctx, DW_ERR_INVALID,
                                "a precision policy needs the CUDA engine (the CPU engine is FP32 only); "
                                "use --device cuda or drop --precision/--policy");
        return dw_engine_create_cpu(ctx, cfg, B, T, out);
    }
    if (policy) return dw_engine_create_cuda(ctx, cfg, B, T, policy, out);
    dw_policy *bf16 = NULL;
    DW_TRY(dw_policy_from_precision(ctx, "bf16", false, &bf16));
    dw_status st = dw_engine_create_cuda(ctx, cfg, B, T, bf16, out);
    dw_policy_free(bf16);
    return st;
}

dw_status dw_train_engine_create(dw_ctx *ctx, const dw_model_config *cfg, int64_t B, int64_t T,
                           dw_engine **out) {
    return dw_train_engine_create_policy(ctx, cfg, B, T, NULL, out);
}

dw_status dw_train_ctx_create(const char *device, dw_ctx **out) {
    *out = NULL;
    dw_ctx_opts o = {.device = DW_DEVICE_AUTO};
    if (!strcmp(device, "cpu")) o.device = DW_DEVICE_CPU;
    else if (!strcmp(device, "cuda")) o.device = DW_DEVICE_CUDA;
    else if (strcmp(device, "auto"))
        return dw_set_error(NULL, DW_ERR_INVALID, "--device must be cpu, cuda or auto, got '%s'", device);
    if (o.device == DW_DEVICE_CUDA) {
        if (!dw_built_with_cuda())
            return dw_set_error(NULL, DW_ERR_UNSUPPORTED,
                                "--device cuda: this build has no CUDA (configure with -DDW_CUDA=ON); use --device cpu");
        if (dw_ctx_create(&o, out) != DW_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", dw_errmsg(NULL));
            return dw_set_error(NULL, DW_ERR_UNSUPPORTED, "--device cuda: no usable GPU (%s); use --device cpu", why);
        }
        return DW_OK;
    }
    return dw_ctx_create(&o, out); /* auto: CUDA device 0 when a GPU is usable, else the CPU */
}

const char *dw_train_precision_name(dw_ctx *ctx, const dw_policy *policy) {
    if (dw_ctx_device(ctx) == DW_DEVICE_CPU) return "fp32-cpu";
    if (!policy) return "bf16";
    if (policy->n_rules > 0) return "policy";
    return dw_recipe_name(policy->default_recipe);
}

static bool has_file(const char *dir, const char *name) {
    char *p = dw_path_join(dir, name);
    bool ok = p && access(p, F_OK) == 0;
    free(p);
    return ok;
}

dw_status dw_model_open(dw_ctx *ctx, const char *what, int64_t max_T, uint64_t seed,
                        dw_opened_model *out) {
    memset(out, 0, sizeof *out);
    struct stat sb;
    bool is_dir = stat(what, &sb) == 0 && S_ISDIR(sb.st_mode);
    bool is_ckpt = is_dir && (has_file(what, "state.json") || has_file(what, "latest"));
    char *cdir = NULL;
    dw_ckpt_state state;
    dw_model_config cfg;
    if (is_ckpt) DW_TRY(dw_ckpt_open(ctx, what, &cdir, &state));
    const char *dir = is_ckpt ? cdir : what;
    dw_status st = dw_model_config_load(ctx, dir, &cfg);
    int64_t T = cfg.max_seq < max_T || max_T <= 0 ? cfg.max_seq : max_T;
    if (st == DW_OK) st = dw_train_engine_create(ctx, &cfg, 1, T, &out->engine);
    if (st == DW_OK && is_dir) {
        char *w = dw_path_join(dir, "model.safetensors");
        st = w ? dw_engine_load_weights(out->engine, w) : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        if (st == DW_OK) out->trained = true;
        free(w);
    } else if (st == DW_OK) {
        st = dw_engine_init_weights(out->engine, seed);
    }
    if (st == DW_OK) {
        out->T = T;
        out->tokenizer = cfg.vocab_size == 256 ? DW_TOK_BYTES : DW_TOK_IDS;
        if (is_ckpt && !dw_tokenizer_parse(state.tokenizer, &out->tokenizer))
            st = dw_set_error(ctx, DW_ERR_FORMAT, "%s/state.json: unknown tokenizer '%s'", cdir, state.tokenizer);
    }
    if (st != DW_OK) {
        dw_engine_free(out->engine);
        memset(out, 0, sizeof *out);
    }
    free(cdir);
    return st;
}
