/* nvml.c — NVLink link count and state through NVML, loaded at run time with dlopen so that
 * libnvidia-ml is never a link-time dependency. Missing NVML leaves the fields unknown (-1). */
#include <dlfcn.h>
#include <string.h>

#include "core/log.h"
#include "probe/nvml.h"

/* The few NVML types we use, declared from NVML's documented ABI (nvml.h is not in the toolkit). */
typedef int nvml_return;  /* nvmlReturn_t: 0 = NVML_SUCCESS */
typedef void *nvml_device; /* nvmlDevice_t */
enum { NVML_MAX_NVLINKS = 18 /* NVML_NVLINK_MAX_LINKS */ };

typedef nvml_return (*nvml_init_fn)(void);
typedef nvml_return (*nvml_shutdown_fn)(void);
typedef nvml_return (*nvml_by_bus_fn)(const char *bus_id, nvml_device *dev);
typedef nvml_return (*nvml_link_state_fn)(nvml_device dev, unsigned link, int *is_active);

void dw_nvml_fill(dw_hw *hw) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        DW_LOGD("NVML not available (%s): NVLink fields left null", dlerror());
        return;
    }
    nvml_init_fn init = NULL;
    *(void **)&init = dlsym(lib, "nvmlInit_v2"); /* POSIX idiom for function symbols */
    nvml_shutdown_fn shutdown = NULL;
    *(void **)&shutdown = dlsym(lib, "nvmlShutdown"); /* POSIX idiom for function symbols */
    nvml_by_bus_fn by_bus = NULL;
    *(void **)&by_bus = dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"); /* POSIX idiom for function symbols */
    nvml_link_state_fn link_state = NULL;
    *(void **)&link_state = dlsym(lib, "nvmlDeviceGetNvLinkState"); /* POSIX idiom for function symbols */
    if (!init || !shutdown || !by_bus || !link_state || init() != 0) {
        DW_LOGD("NVML present but unusable: NVLink fields left null");
        dlclose(lib);
        return;
    }
    for (int i = 0; i < hw->n_gpus; i++) {
        dw_gpu_info *g = &hw->gpus[i];
        nvml_device dev = NULL;
        if (!g->pci_bus_id[0] || by_bus(g->pci_bus_id, &dev) != 0) continue;
        int links = 0, active = 0;
        for (unsigned l = 0; l < NVML_MAX_NVLINKS; l++) {
            int is_active = 0;
            if (link_state(dev, l, &is_active) != 0) continue; /* link does not exist */
            links++;
            if (is_active) active++;
        }
        g->nvlink_links = links;
        g->nvlink_active = active;
    }
    shutdown();
    dlclose(lib);
}
