/* hw.h — private: the hardware description (dw_hw) shared by probe, presets, JSON and planner.
 * One dw_hw describes one node's GPUs; `nodes` identical nodes make the machine. Fields that
 * are unknown are negative (counts) or zero (rates), and serialise as JSON null. */
#ifndef DW_PROBE_HW_H
#define DW_PROBE_HW_H

#include <stdint.h>

#include "deepwell.h"

/* dw_gpu_info and dw_peer_link are public (deepwell.h, [section: probe]). */

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
/* A deep copy (NULL when out of memory). */
dw_hw *dw_hw_dup(const dw_hw *hw);
/* Fills features from the compute capability. */
void dw_gpu_derive_features(dw_gpu_info *g);
/* Derived dense peak rates for a probed GPU from SMs, clock and architecture. */
void dw_gpu_derive_peaks(dw_gpu_info *g);

#endif /* DW_PROBE_HW_H */
