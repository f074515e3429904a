/* presets.c — datasheet hardware presets for machines we do not have. Every figure here is a
 * vendor datasheet number (dense, no sparsity), not a measurement; the JSON says so. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "probe/hw.h"

typedef struct {
    const char *name, *description, *gpu_name;
    int gpus_per_node, cc_major, cc_minor, sms;
    double hbm_gb;                 /* GB (1e9 bytes) */
    double bf16_tf, fp8_tf, fp4_tf; /* dense TFLOP/s */
    double hbm_gbps;               /* GB/s */
    double nvlink_gbps;            /* per GPU, one direction, GB/s */
    int nvlink_domain;
    double internode_gbps;         /* per GPU, one direction, GB/s (NIC line rate / 8) */
    int sm_clock_mhz;
    double l2_mb;
} preset;

static const preset presets[] = {
    {"h100-sxm", "HGX H100 SXM5: 8 GPUs, 80 GB HBM3, NVLink 4 (900 GB/s), 400 Gb/s NIC per GPU",
     "NVIDIA H100 80GB HBM3", 8, 9, 0, 132, 80, 989, 1979, 0, 3350, 450, 8, 50, 1980, 50},
    {"h200", "HGX H200: 8 GPUs, 141 GB HBM3e, NVLink 4 (900 GB/s), 400 Gb/s NIC per GPU",
     "NVIDIA H200", 8, 9, 0, 132, 141, 989, 1979, 0, 4800, 450, 8, 50, 1980, 50},
    {"b200", "HGX B200: 8 GPUs, 180 GB HBM3e, NVLink 5 (1.8 TB/s), 400 Gb/s NIC per GPU",
     "NVIDIA B200", 8, 10, 0, 148, 180, 2250, 4500, 9000, 8000, 900, 8, 50, 1965, 126},
    {"b100", "HGX B100: 8 GPUs, 180 GB HBM3e, NVLink 5 (1.8 TB/s), 400 Gb/s NIC per GPU",
     "NVIDIA B100", 8, 10, 0, 148, 180, 1750, 3500, 7000, 8000, 900, 8, 50, 1665, 126},
    {"gb200-nvl72",
     "GB200 NVL72: 72 Blackwell GPUs in one NVLink domain (18 trays of 4), 186 GB HBM3e each, "
     "400 Gb/s NIC per GPU; --nodes counts trays",
     "NVIDIA GB200", 4, 10, 0, 148, 186, 2500, 5000, 10000, 8000, 900, 72, 50, 2062, 126},
};
enum { N_PRESETS = sizeof presets / sizeof presets[0] };

int dw_hw_preset_count(void) { return N_PRESETS; }
const char *dw_hw_preset_name(int i) { return (i >= 0 && i < N_PRESETS) ? presets[i].name : NULL; }
const char *dw_hw_preset_description(int i) {
    return (i >= 0 && i < N_PRESETS) ? presets[i].description : NULL;
}

dw_status dw_hw_preset(dw_ctx *ctx, const char *name, int nodes, dw_hw **out) {
    *out = NULL;
    const preset *p = NULL;
    for (int i = 0; i < N_PRESETS; i++)
        if (name && strcmp(presets[i].name, name) == 0) p = &presets[i];
    if (!p) {
        char list[256] = "";
        for (int i = 0; i < N_PRESETS; i++) {
            strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
            strncat(list, presets[i].name, sizeof list - strlen(list) - 1);
        }
        return dw_set_error(ctx, DW_ERR_INVALID, "unknown hardware preset '%s' (known: %s)",
                            name ? name : "(null)", list);
    }
    if (nodes < 1 || nodes > 1000000)
        return dw_set_error(ctx, DW_ERR_INVALID, "--nodes must be between 1 and 1000000, got %d",
                            nodes);
    dw_hw *hw = dw_hw_alloc(p->gpus_per_node);
    if (!hw) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    snprintf(hw->source, sizeof hw->source, "preset");
    snprintf(hw->preset, sizeof hw->preset, "%s", p->name);
    snprintf(hw->label, sizeof hw->label, "datasheet figures (dense), not measured: %s",
             p->description);
    hw->nodes = nodes;
    hw->nvlink_gbps = p->nvlink_gbps;
    hw->nvlink_domain = p->nvlink_domain;
    hw->internode_gbps = p->internode_gbps;
    for (int i = 0; i < p->gpus_per_node; i++) {
        dw_gpu_info *g = &hw->gpus[i];
        snprintf(g->name, sizeof g->name, "%s", p->gpu_name);
        g->cc_major = p->cc_major;
        g->cc_minor = p->cc_minor;
        g->sms = p->sms;
        g->hbm_bytes = (uint64_t)(p->hbm_gb * 1e9);
        g->sm_clock_mhz = p->sm_clock_mhz;
        g->l2_bytes = (uint64_t)(p->l2_mb * 1e6);
        g->smem_optin_bytes = 232448; /* 227 KiB on sm_90 and sm_100 */
        dw_gpu_derive_features(g);
        g->peak_bf16_tflops = p->bf16_tf;
        g->peak_fp8_tflops = p->fp8_tf;
        g->peak_fp4_tflops = p->fp4_tf;
        g->hbm_gbps = p->hbm_gbps;
        g->nvlink_links = 18; /* NVLink 4 and 5 SXM parts both have 18 links */
        g->nvlink_active = g->nvlink_links;
        for (int j = 0; j < p->gpus_per_node; j++) {
            if (j == i) continue;
            hw->peers[i * p->gpus_per_node + j] =
                (dw_peer_link){.access = true, .perf_rank = 0, .native_atomics = true};
        }
    }
    *out = hw;
    return DW_OK;
}
