/* hw.h — private: the hardware description (dw_hw) shared by probe, presets, JSON and planner.
 * One dw_hw describes one node's GPUs; `nodes` identical nodes make the machine. Fields that
 * are unknown are negative (counts) or zero (rates), and serialise as JSON null. */
#ifndef DW_PROBE_HW_H
#define DW_PROBE_HW_H

#include <stdint.h>

#include "deepwell.h"

typedef struct {
    bool wgmma;            /* sm_90 warpgroup MMA */
    bool fp8;              /* FP8 E4M3/E5M2 tensor cores (sm_89+) */
    bool tcgen05;          /* sm_100 5th-generation tensor core instructions */
    bool tmem;             /* sm_100 tensor memory */
    bool mx_block_scaling; /* hardware MX block-scaled MMA (sm_100+) */
    bool fp4;              /* FP4 E2M1 tensor cores (sm_100+) */
} dw_gpu_features;

typedef struct {
    int index;
    char name[256];
    int cc_major, cc_minor;
    int sms;
    uint64_t hbm_bytes;
    int64_t hbm_free_bytes;    /* -1: unknown (presets) */
    int sm_clock_mhz;          /* peak */
    int mem_clock_mhz;         /* peak */
    int mem_bus_bits;          /* 0: unknown */
    uint64_t l2_bytes;
    uint64_t smem_optin_bytes; /* opt-in shared memory per block */
    char pci_bus_id[32];       /* "" for presets */
    dw_gpu_features features;
    int nvlink_links;          /* links NVML reports; -1: NVML unavailable (JSON null) */
    int nvlink_active;         /* of those, active; -1: unknown */
    /* Peak dense rates: datasheet for presets, derived from SMs x clock for probed GPUs. */
    double peak_bf16_tflops, peak_fp8_tflops, peak_fp4_tflops; /* 0: not supported/unknown */
    double hbm_gbps;                                          /* GB/s, 0: unknown */
} dw_gpu_info;

typedef struct {
    bool access;      /* cudaDevP2PAttrAccessSupported */
    int perf_rank;    /* cudaDevP2PAttrPerformanceRank (lower is better) */
    bool native_atomics;
} dw_peer_link;

struct dw_hw {
    char source[16];   /* "probe", "preset" or "file" */
    char preset[32];   /* preset name, "" otherwise */
    char label[160];   /* e.g. "datasheet figures, not measured" */
    int nodes;         /* identical nodes */
    int host_cpus;     /* -1: unknown */
    int64_t host_ram_bytes;
    int n_gpus;        /* GPUs per node */
    dw_gpu_info *gpus; /* [n_gpus] */
    dw_peer_link *peers; /* [n_gpus * n_gpus], row-major; diagonal unused */
    /* Fabric (per GPU, one direction, GB/s); 0: unknown. */
    double nvlink_gbps;
    int nvlink_domain;   /* GPUs reachable over NVLink (8 for HGX, 72 for NVL72); 1 if none */
    double internode_gbps;
    char notice[256];    /* why there are no GPUs, "" otherwise */
};

/* Allocates a dw_hw for n GPUs (zeroed, unknowns set). */
dw_hw *dw_hw_alloc(int n_gpus);
/* Fills features from the compute capability. */
void dw_gpu_derive_features(dw_gpu_info *g);
/* Derived dense peak rates for a probed GPU from SMs, clock and architecture. */
void dw_gpu_derive_peaks(dw_gpu_info *g);

#endif /* DW_PROBE_HW_H */
