/* probe.c — dw_probe: GPUs through the CUDA runtime, peers, NVLink (NVML), host CPUs and RAM.
 * No GPU or no driver is a normal outcome: zero GPUs and a notice, not an error. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "probe/hw.h"
#include "probe/nvml.h"

#if DW_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static void probe_host(dw_hw *hw) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    hw->host_cpus = cpus > 0 ? (int)cpus : -1;
    hw->host_ram_bytes = (pages > 0 && page > 0) ? (int64_t)pages * page : -1;
}

#if DW_HAVE_CUDA
static int attr(enum cudaDeviceAttr a, int dev) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, a, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return v;
}

static dw_status probe_gpu(dw_ctx *ctx, int dev, dw_gpu_info *g) {
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, dev);
    if (e != cudaSuccess)
        return dw_set_error(ctx, DW_ERR_CUDA, "cudaGetDeviceProperties(%d): %s", dev,
                            cudaGetErrorString(e));
    snprintf(g->name, sizeof g->name, "%s", p.name);
    g->cc_major = p.major;
    g->cc_minor = p.minor;
    g->sms = p.multiProcessorCount;
    g->hbm_bytes = p.totalGlobalMem;
    g->l2_bytes = (uint64_t)p.l2CacheSize;
    g->smem_optin_bytes = p.sharedMemPerBlockOptin;
    g->sm_clock_mhz = attr(cudaDevAttrClockRate, dev) / 1000;
    g->mem_clock_mhz = attr(cudaDevAttrMemoryClockRate, dev) / 1000;
    g->mem_bus_bits = attr(cudaDevAttrGlobalMemoryBusWidth, dev);
    if (cudaDeviceGetPCIBusId(g->pci_bus_id, (int)sizeof g->pci_bus_id, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        g->pci_bus_id[0] = '\0';
    }
    /* Free memory needs a context on the device; cudaMemGetInfo creates the primary one. */
    size_t free_b = 0, total_b = 0;
    if (cudaSetDevice(dev) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        g->hbm_free_bytes = (int64_t)free_b;
    else
        (void)cudaGetLastError();
    dw_gpu_derive_features(g);
    dw_gpu_derive_peaks(g);
    return DW_OK;
}
#endif

dw_status dw_probe(dw_ctx *ctx, dw_hw **out) {
    *out = NULL;
    int n = 0;
    const char *notice = NULL;
#if DW_HAVE_CUDA
    char notice_buf[200];
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
        snprintf(notice_buf, sizeof notice_buf, "no usable CUDA driver or GPU (cudaGetDeviceCount: %s)",
                 cudaGetErrorString(e));
        notice = notice_buf;
    } else if (n == 0) {
        notice = "no CUDA GPU found";
    }
#else
    notice = "this build has no CUDA (cpu-only build): no GPUs probed";
#endif
    dw_hw *hw = dw_hw_alloc(n);
    if (!hw) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory in probe");
    snprintf(hw->source, sizeof hw->source, "probe");
    probe_host(hw);
    if (notice) snprintf(hw->notice, sizeof hw->notice, "%s", notice);
#if DW_HAVE_CUDA
    int cur = 0;
    bool restore = n > 0 && cudaGetDevice(&cur) == cudaSuccess;
    for (int i = 0; i < n; i++) {
        dw_status s = probe_gpu(ctx, i, &hw->gpus[i]);
        if (s != DW_OK) {
            dw_hw_free(hw);
            return s;
        }
        hw->gpus[i].index = i;
    }
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < n; j++) {
            if (i == j) continue;
            dw_peer_link *l = &hw->peers[i * n + j];
            int v = 0;
            if (cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrAccessSupported, i, j) == cudaSuccess)
                l->access = v != 0;
            if (cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrPerformanceRank, i, j) == cudaSuccess)
                l->perf_rank = v;
            if (cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrNativeAtomicSupported, i, j) ==
                cudaSuccess)
                l->native_atomics = v != 0;
            (void)cudaGetLastError();
        }
    }
    if (restore) (void)cudaSetDevice(cur);
    if (n > 0) dw_nvml_fill(hw);
    /* NVLink domain: this node's GPUs when they have active links, else none. */
    int with_links = 0;
    for (int i = 0; i < n; i++) with_links += hw->gpus[i].nvlink_active > 0;
    hw->nvlink_domain = (with_links == n && n > 1) ? n : 1;
#endif
    DW_LOGD("probe: %d GPU(s)%s%s", n, notice ? ": " : "", notice ? notice : "");
    *out = hw;
    return DW_OK;
}
