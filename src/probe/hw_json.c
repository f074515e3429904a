/* hw_json.c — dw_hw to and from the `deepwell probe --json` schema:
 *   {"source","preset"?,"label"?,"nodes","host":{"cpus","ram_bytes"},
 *    "gpus":[{"index","name","cc","sms","hbm_bytes","hbm_free_bytes","sm_clock_mhz",
 *             "mem_clock_mhz","l2_bytes","smem_optin_bytes","features":{...},
 *             "nvlink":{"links","active"},"peak":{"bf16_tflops","fp8_tflops","fp4_tflops",
 *             "hbm_gbps"}}],
 *    "links":[[null | {"access","perf_rank","native_atomics"}, ...], ...],
 *    "fabric":{"nvlink_gbps","nvlink_domain","internode_gbps"}}
 * Unknown values are null. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "probe/hw.h"

static json_t *int_or_null(long long v) { return v < 0 ? json_null() : json_integer(v); }
static json_t *num_or_null(double v) { return v <= 0 ? json_null() : json_real(v); }

static json_t *gpu_to_json(const dw_gpu_info *g) {
    char cc[16];
    snprintf(cc, sizeof cc, "%d.%d", g->cc_major, g->cc_minor);
    json_t *f = json_pack("{s:b,s:b,s:b,s:b,s:b,s:b}", "wgmma", g->wgmma, "fp8",
                          g->fp8, "tcgen05", g->tcgen05, "tmem",
                          g->tmem, "mx_block_scaling", g->mx_block_scaling,
                          "fp4", g->fp4);
    json_t *nv = json_pack("{s:o,s:o}", "links", int_or_null(g->nvlink_links), "active",
                           int_or_null(g->nvlink_active));
    json_t *peak = json_pack("{s:o,s:o,s:o,s:o}", "bf16_tflops", num_or_null(g->peak_bf16_tflops),
                             "fp8_tflops", num_or_null(g->peak_fp8_tflops), "fp4_tflops",
                             num_or_null(g->peak_fp4_tflops), "hbm_gbps",
                             num_or_null(g->hbm_gbps));
    return json_pack("{s:i,s:s,s:s,s:i,s:I,s:o,s:o,s:o,s:I,s:I,s:o,s:o,s:o}", "index", g->index,
                     "name", g->name, "cc", cc, "sms", g->sms, "hbm_bytes",
                     (json_int_t)g->hbm_bytes, "hbm_free_bytes", int_or_null(g->hbm_free_bytes),
                     "sm_clock_mhz", int_or_null(g->sm_clock_mhz ? g->sm_clock_mhz : -1),
                     "mem_clock_mhz", int_or_null(g->mem_clock_mhz ? g->mem_clock_mhz : -1),
                     "l2_bytes", (json_int_t)g->l2_bytes, "smem_optin_bytes",
                     (json_int_t)g->smem_optin_bytes, "features", f, "nvlink", nv, "peak", peak);
}

dw_status dw_hw_to_json(dw_ctx *ctx, const dw_hw *hw, bool pretty, char **out) {
    *out = NULL;
    json_t *root = json_object();
    json_object_set_new(root, "source", json_string(hw->source));
    if (hw->preset[0]) json_object_set_new(root, "preset", json_string(hw->preset));
    if (hw->label[0]) json_object_set_new(root, "label", json_string(hw->label));
    json_object_set_new(root, "nodes", json_integer(hw->nodes));
    json_object_set_new(root, "host",
                        json_pack("{s:o,s:o}", "cpus", int_or_null(hw->host_cpus), "ram_bytes",
                                  int_or_null(hw->host_ram_bytes)));
    json_t *gpus = json_array();
    for (int i = 0; i < hw->n_gpus; i++) json_array_append_new(gpus, gpu_to_json(&hw->gpus[i]));
    json_object_set_new(root, "gpus", gpus);
    json_t *links = json_array();
    for (int i = 0; i < hw->n_gpus; i++) {
        json_t *row = json_array();
        for (int j = 0; j < hw->n_gpus; j++) {
            const dw_peer_link *l = &hw->peers[i * hw->n_gpus + j];
            json_array_append_new(row, i == j ? json_null()
                                              : json_pack("{s:b,s:i,s:b}", "access", l->access,
                                                          "perf_rank", l->perf_rank,
                                                          "native_atomics", l->native_atomics));
        }
        json_array_append_new(links, row);
    }
    json_object_set_new(root, "links", links);
    json_object_set_new(root, "fabric",
                        json_pack("{s:o,s:i,s:o}", "nvlink_gbps", num_or_null(hw->nvlink_gbps),
                                  "nvlink_domain", hw->nvlink_domain, "internode_gbps",
                                  num_or_null(hw->internode_gbps)));
    if (hw->notice[0]) json_object_set_new(root, "notice", json_string(hw->notice));
    char *s = dw_json_dump(root, pretty);
    json_decref(root);
    if (!s) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory serialising hardware JSON");
    *out = s;
    return DW_OK;
}

/* ---- loading ---- */

static dw_status load_gpu(dw_ctx *ctx, const json_t *j, const char *what, dw_gpu_info *g) {
    if (!json_is_object(j)) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: expected an object", what);
    long long v = 0;
    const char *s = NULL;
    DW_TRY(dw_json_get_str(ctx, j, "name", what, &s));
    snprintf(g->name, sizeof g->name, "%s", s);
    DW_TRY(dw_json_get_str(ctx, j, "cc", what, &s));
    if (sscanf(s, "%d.%d", &g->cc_major, &g->cc_minor) != 2 || g->cc_major < 1)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'cc': expected \"major.minor\", got \"%s\"",
                            what, s);
    DW_TRY(dw_json_get_int(ctx, j, "sms", what, &v));
    if (v < 1) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'sms' must be positive", what);
    g->sms = (int)v;
    DW_TRY(dw_json_get_int(ctx, j, "hbm_bytes", what, &v));
    if (v < 1) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'hbm_bytes' must be positive", what);
    g->hbm_bytes = (uint64_t)v;
    v = -1;
    DW_TRY(dw_json_get_int_opt(ctx, j, "hbm_free_bytes", what, &v));
    g->hbm_free_bytes = v;
    v = 0;
    DW_TRY(dw_json_get_int_opt(ctx, j, "sm_clock_mhz", what, &v));
    g->sm_clock_mhz = (int)v;
    v = 0;
    DW_TRY(dw_json_get_int_opt(ctx, j, "mem_clock_mhz", what, &v));
    g->mem_clock_mhz = (int)v;
    v = 0;
    DW_TRY(dw_json_get_int_opt(ctx, j, "l2_bytes", what, &v));
    g->l2_bytes = (uint64_t)v;
    v = 0;
    DW_TRY(dw_json_get_int_opt(ctx, j, "smem_optin_bytes", what, &v));
    g->smem_optin_bytes = (uint64_t)v;
    dw_gpu_derive_features(g);
    json_t *nv = json_object_get(j, "nvlink");
    if (json_is_object(nv)) {
        v = -1;
        DW_TRY(dw_json_get_int_opt(ctx, nv, "links", what, &v));
        g->nvlink_links = (int)v;
        v = -1;
        DW_TRY(dw_json_get_int_opt(ctx, nv, "active", what, &v));
        g->nvlink_active = (int)v;
    }
    json_t *peak = json_object_get(j, "peak");
    if (json_is_object(peak)) {
        DW_TRY(dw_json_get_num_opt(ctx, peak, "bf16_tflops", what, &g->peak_bf16_tflops));
        DW_TRY(dw_json_get_num_opt(ctx, peak, "fp8_tflops", what, &g->peak_fp8_tflops));
        DW_TRY(dw_json_get_num_opt(ctx, peak, "fp4_tflops", what, &g->peak_fp4_tflops));
        DW_TRY(dw_json_get_num_opt(ctx, peak, "hbm_gbps", what, &g->hbm_gbps));
    } else if (g->sm_clock_mhz > 0) {
        dw_gpu_derive_peaks(g);
    }
    return DW_OK;
}

static dw_status load_root(dw_ctx *ctx, const json_t *root, const char *path, dw_hw **out) {
    char what[512];
    if (!json_is_object(root))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: expected a JSON object at the top level", path);
    json_t *gpus = json_object_get(root, "gpus");
    if (!json_is_array(gpus))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: missing array field 'gpus'", path);
    int n = (int)json_array_size(gpus);
    dw_hw *hw = dw_hw_alloc(n);
    if (!hw) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    dw_status s = DW_OK;
    const char *src = "file";
    long long nodes = 1, cpus = -1, ram = -1, domain = 1;
    s = dw_json_get_str_opt(ctx, root, "source", path, &src);
    if (s == DW_OK) s = dw_json_get_int_opt(ctx, root, "nodes", path, &nodes);
    if (s == DW_OK && nodes < 1)
        s = dw_set_error(ctx, DW_ERR_FORMAT, "%s: field 'nodes' must be at least 1", path);
    json_t *host = json_object_get(root, "host");
    if (s == DW_OK && host) s = dw_json_get_int_opt(ctx, host, "cpus", path, &cpus);
    if (s == DW_OK && host) s = dw_json_get_int_opt(ctx, host, "ram_bytes", path, &ram);
    json_t *fabric = json_object_get(root, "fabric");
    if (s == DW_OK && fabric) s = dw_json_get_num_opt(ctx, fabric, "nvlink_gbps", path, &hw->nvlink_gbps);
    if (s == DW_OK && fabric) s = dw_json_get_int_opt(ctx, fabric, "nvlink_domain", path, &domain);
    if (s == DW_OK && fabric)
        s = dw_json_get_num_opt(ctx, fabric, "internode_gbps", path, &hw->internode_gbps);
    for (int i = 0; s == DW_OK && i < n; i++) {
        snprintf(what, sizeof what, "%s: gpus[%d]", path, i);
        s = load_gpu(ctx, json_array_get(gpus, (size_t)i), what, &hw->gpus[i]);
        hw->gpus[i].index = i;
    }
    json_t *links = json_object_get(root, "links");
    for (int i = 0; s == DW_OK && json_is_array(links) && i < n && i < (int)json_array_size(links); i++) {
        json_t *row = json_array_get(links, (size_t)i);
        for (int j = 0; json_is_array(row) && j < n && j < (int)json_array_size(row); j++) {
            json_t *l = json_array_get(row, (size_t)j);
            if (!json_is_object(l) || i == j) continue;
            dw_peer_link *pl = &hw->peers[i * n + j];
            pl->access = json_is_true(json_object_get(l, "access"));
            pl->native_atomics = json_is_true(json_object_get(l, "native_atomics"));
            json_t *r = json_object_get(l, "perf_rank");
            pl->perf_rank = json_is_integer(r) ? (int)json_integer_value(r) : 0;
        }
    }
    if (s != DW_OK) {
        dw_hw_free(hw);
        return s;
    }
    snprintf(hw->source, sizeof hw->source, "%s", src);
    const char *preset = NULL, *label = NULL, *notice = NULL;
    (void)dw_json_get_str_opt(ctx, root, "preset", path, &preset);
    (void)dw_json_get_str_opt(ctx, root, "label", path, &label);
    (void)dw_json_get_str_opt(ctx, root, "notice", path, &notice);
    if (preset) snprintf(hw->preset, sizeof hw->preset, "%s", preset);
    if (label) snprintf(hw->label, sizeof hw->label, "%s", label);
    if (notice) snprintf(hw->notice, sizeof hw->notice, "%s", notice);
    hw->nodes = (int)nodes;
    hw->host_cpus = (int)cpus;
    hw->host_ram_bytes = ram;
    hw->nvlink_domain = domain < 1 ? 1 : (int)domain;
    *out = hw;
    return DW_OK;
}

dw_status dw_hw_load(dw_ctx *ctx, const char *path, dw_hw **out) {
    *out = NULL;
    json_t *root = NULL;
    DW_TRY(dw_json_load_file(ctx, path, &root));
    dw_status s = load_root(ctx, root, path, out);
    json_decref(root);
    return s;
}
