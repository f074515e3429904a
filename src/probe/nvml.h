/* nvml.h — private: fills NVLink fields of a probed dw_hw through a dlopen'd NVML. */
#ifndef DW_PROBE_NVML_H
#define DW_PROBE_NVML_H

#include "probe/hw.h"

/* Sets nvlink_links / nvlink_active per GPU; leaves them -1 when NVML is missing. */
void dw_nvml_fill(dw_hw *hw);

#endif /* DW_PROBE_NVML_H */
