/* log.h — private: levelled logging to stderr, filtered by DW_LOG (see deepwell.h). */
#ifndef DW_CORE_LOG_H
#define DW_CORE_LOG_H

#include "core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

void dw_log(dw_log_level level, const char *fmt, ...) DW_PRINTF(2, 3);
/* Tags every later line with " rank R/N" when world > 1 (set by comm/ for a job of several
 * processes; process-wide, set before other threads log). */
void dw_log_set_rank(int rank, int world);

#define DW_LOGD(...) dw_log(DW_LOG_DEBUG, __VA_ARGS__)
#define DW_LOGI(...) dw_log(DW_LOG_INFO, __VA_ARGS__)
#define DW_LOGW(...) dw_log(DW_LOG_WARN, __VA_ARGS__)
#define DW_LOGE(...) dw_log(DW_LOG_ERROR, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif /* DW_CORE_LOG_H */
