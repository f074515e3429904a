/* capture.h — private: a model config -> the training graph (forward + loss) with Hugging Face
 * names. Used by dw_capture_hf and by the engines, which execute the graph. */
#ifndef DW_CAPTURE_CAPTURE_H
#define DW_CAPTURE_CAPTURE_H

#include "capture/model_config.h"
#include "ir/ir.h"

/* Builds and verifies the graph of cfg for batch x seq tokens. Refuses planning-only shapes. */
dw_status dw_capture_config(dw_ctx *ctx, const dw_model_config *cfg, int64_t batch, int64_t seq,
                            dw_graph **out);

#endif /* DW_CAPTURE_CAPTURE_H */
