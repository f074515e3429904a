/* hw.c — dw_hw allocation, feature and peak-rate derivation, and the public accessors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

void dw_gpu_derive_features(dw_gpu_info *g) {
    int cc = g->cc_major * 10 + g->cc_minor;
    g->features.wgmma = (cc == 90);
    g->features.fp8 = (cc >= 89);
    g->features.tcgen05 = (g->cc_major == 10);
    g->features.tmem = (g->cc_major == 10);
    g->features.mx_block_scaling = (cc >= 100);
    g->features.fp4 = (cc >= 100);
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
    g->peak_fp8_tflops = g->features.fp8 ? 2 * g->peak_bf16_tflops : 0;
    g->peak_fp4_tflops = g->features.fp4 ? 4 * g->peak_bf16_tflops : 0;
    /* HBM: memory clock x 2 (double data rate) x bus width. */
    if (g->mem_bus_bits > 0) g->hbm_gbps = round(g->mem_clock_mhz * 1e6 * 2.0 * g->mem_bus_bits / 8 / 1e9);
}

int dw_hw_gpu_count(const dw_hw *hw) { return hw ? hw->n_gpus : 0; }

const char *dw_hw_notice(const dw_hw *hw) { return (hw && hw->notice[0]) ? hw->notice : NULL; }
