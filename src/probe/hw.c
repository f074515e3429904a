/* hw.c — dw_hw allocation, feature and peak-rate derivation, and the public accessors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/sized.h"
#include "probe/hw.h"

dw_hw *dw_hw_alloc(int n_gpus) {
    dw_hw *hw = calloc(1, sizeof *hw);
    if (!hw) return NULL;
    hw->nodes = 1;
    hw->host_cpus = -1;
    hw->host_ram_bytes = -1;
    hw->nvlink_domain = 1;
    hw->n_gpus = n_gpus;
    if (n_gpus > 0) {
        hw->gpus = calloc((size_t)n_gpus, sizeof *hw->gpus);
        hw->peers = calloc((size_t)n_gpus * (size_t)n_gpus, sizeof *hw->peers);
        if (!hw->gpus || !hw->peers) {
            dw_hw_free(hw);
            return NULL;
        }
        for (int i = 0; i < n_gpus; i++) {
            hw->gpus[i].index = i;
            hw->gpus[i].hbm_free_bytes = -1;
            hw->gpus[i].nvlink_links = -1;
            hw->gpus[i].nvlink_active = -1;
        }
    }
    return hw;
}

void dw_hw_free(dw_hw *hw) {
    if (!hw) return;
    free(hw->gpus);
    free(hw->peers);
    free(hw);
}

dw_hw *dw_hw_dup(const dw_hw *hw) {
    dw_hw *k = dw_hw_alloc(hw->n_gpus);
    if (!k) return NULL;
    dw_gpu_info *gpus = k->gpus;
    dw_peer_link *peers = k->peers;
    *k = *hw;
    k->gpus = gpus, k->peers = peers;
    if (hw->n_gpus > 0) {
        memcpy(gpus, hw->gpus, (size_t)hw->n_gpus * sizeof *gpus);
        memcpy(peers, hw->peers, (size_t)hw->n_gpus * (size_t)hw->n_gpus * sizeof *peers);
    }
    return k;
}

void dw_gpu_derive_features(dw_gpu_info *g) {
    int cc = g->cc_major * 10 + g->cc_minor;
    g->wgmma = (cc == 90);
    g->fp8 = (cc >= 89);
    g->tcgen05 = (g->cc_major == 10);
    g->tmem = (g->cc_major == 10);
    g->mx_block_scaling = (cc >= 100);
    g->fp4 = (cc >= 100);
}

void dw_gpu_derive_peaks(dw_gpu_info *g) {
    /* Dense tensor-core FLOP per SM per clock: Hopper 4096 (BF16) / 8192 (FP8) — 989 TFLOP/s
     * = 132 SMs x 1.83 GHz x 4096 on the H100 SXM datasheet; Blackwell doubles both and adds
     * FP4 at 4x BF16. Other architectures: left unknown rather than guessed. */
    double per_clk_bf16 = 0;
    if (g->cc_major == 9) per_clk_bf16 = 4096;
    else if (g->cc_major == 10) per_clk_bf16 = 8192;
    double hz = g->sm_clock_mhz * 1e6;
    /* rounded to 0.1 TFLOP/s and 1 GB/s: derived estimates, not measurements */
    g->peak_bf16_tflops = round(g->sms * hz * per_clk_bf16 / 1e11) / 10;
    g->peak_fp8_tflops = g->fp8 ? 2 * g->peak_bf16_tflops : 0;
    g->peak_fp4_tflops = g->fp4 ? 4 * g->peak_bf16_tflops : 0;
    /* HBM: memory clock x 2 (double data rate) x bus width. */
    if (g->mem_bus_bits > 0) g->hbm_gbps = round(g->mem_clock_mhz * 1e6 * 2.0 * g->mem_bus_bits / 8 / 1e9);
}

int dw_hw_gpu_count(const dw_hw *hw) { return hw ? hw->n_gpus : 0; }

const char *dw_hw_notice(const dw_hw *hw) { return (hw && hw->notice[0]) ? hw->notice : NULL; }

dw_status dw_hw_get_info(const dw_hw *hw, dw_hw_info *out) {
    if (!hw || !out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_hw_get_info: NULL argument");
    dw_hw_info i = {.size = sizeof i, .nodes = hw->nodes, .gpus = hw->n_gpus, .host_cpus = hw->host_cpus,
                    .host_ram_bytes = hw->host_ram_bytes, .nvlink_gbps = hw->nvlink_gbps,
                    .nvlink_domain = hw->nvlink_domain, .internode_gbps = hw->internode_gbps};
    snprintf(i.source, sizeof i.source, "%s", hw->source);
    snprintf(i.preset, sizeof i.preset, "%s", hw->preset);
    snprintf(i.label, sizeof i.label, "%s", hw->label);
    snprintf(i.notice, sizeof i.notice, "%s", hw->notice);
    if (!dw_sized_write(out, &i, sizeof i))
        return dw_set_error(NULL, DW_ERR_INVALID, "dw_hw_get_info: out->size is 0 (set it to sizeof the struct)");
    return DW_OK;
}

dw_status dw_hw_get_gpu(const dw_hw *hw, int i, dw_gpu_info *out) {
    if (!hw || !out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_hw_get_gpu: NULL argument");
    dw_sized_clear(out);
    if (i < 0 || i >= hw->n_gpus)
        return dw_set_error(NULL, DW_ERR_INVALID, "dw_hw_get_gpu: GPU %d of %d", i, hw->n_gpus);
    dw_gpu_info g = hw->gpus[i];
    g.size = sizeof g;
    if (!dw_sized_write(out, &g, sizeof g))
        return dw_set_error(NULL, DW_ERR_INVALID, "dw_hw_get_gpu: out->size is 0 (set it to sizeof the struct)");
    return DW_OK;
}

dw_status dw_hw_get_peer(const dw_hw *hw, int i, int j, dw_peer_link *out) {
    if (!hw || !out) return dw_set_error(NULL, DW_ERR_INVALID, "dw_hw_get_peer: NULL argument");
    dw_sized_clear(out);
    if (i < 0 || j < 0 || i >= hw->n_gpus || j >= hw->n_gpus || i == j)
        return dw_set_error(NULL, DW_ERR_INVALID, "dw_hw_get_peer: no link %d -> %d among %d GPUs", i, j,
                            hw->n_gpus);
    dw_peer_link l = hw->peers[i * hw->n_gpus + j];
    l.size = sizeof l;
    if (!dw_sized_write(out, &l, sizeof l))
        return dw_set_error(NULL, DW_ERR_INVALID, "dw_hw_get_peer: out->size is 0 (set it to sizeof the struct)");
    return DW_OK;
}

dw_status dw_hw_set_nodes(dw_ctx *ctx, dw_hw *hw, int nodes) {
    if (!hw) return dw_set_error(ctx, DW_ERR_INVALID, "dw_hw_set_nodes: NULL hardware");
    if (nodes < 1 || nodes > 1000000)
        return dw_set_error(ctx, DW_ERR_INVALID, "nodes must be between 1 and 1000000, got %d", nodes);
    hw->nodes = nodes;
    return DW_OK;
}

dw_status dw_hw_keep_gpus(dw_ctx *ctx, dw_hw *hw, int n) {
    if (!hw) return dw_set_error(ctx, DW_ERR_INVALID, "dw_hw_keep_gpus: NULL hardware");
    if (n < 1 || n > hw->n_gpus)
        return dw_set_error(ctx, DW_ERR_INVALID, "cannot keep %d GPUs: the hardware description has %d GPUs per node",
                            n, hw->n_gpus);
    if (n == hw->n_gpus) return DW_OK;
    dw_gpu_info *gpus = malloc((size_t)n * sizeof *gpus);
    dw_peer_link *peers = malloc((size_t)n * (size_t)n * sizeof *peers);
    if (!gpus || !peers) {
        free(gpus);
        free(peers);
        return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        gpus[i] = hw->gpus[i];
        for (int j = 0; j < n; j++) peers[i * n + j] = hw->peers[i * hw->n_gpus + j];
    }
    free(hw->gpus);
    free(hw->peers);
    hw->gpus = gpus, hw->peers = peers, hw->n_gpus = n;
    if (hw->nodes <= 1 && hw->nvlink_domain > n) hw->nvlink_domain = n;
    return DW_OK;
}
