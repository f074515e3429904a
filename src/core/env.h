/* env.h — private: the one reader of Deepwell's environment variables. Each is a documented
 * override of an option that callers set through the API (deepwell.h); the library reads the
 * environment only here, when an options struct takes its defaults or a process-wide setting is
 * first used:
 *   DW_LOG=debug|info|warn|error|off   log level (core/log.c)
 *   DW_CUDA_GRAPH=0                    dw_engine_opts.record defaults to false
 *   DW_QUANT_REUSE=0                   dw_engine_opts.quant_reuse defaults to false
 *   DW_FUSE=0                          dw_compile_opts.fuse defaults to false
 *   DW_FUSED_HEAD=1                    dw_compile_opts.fused_head defaults to true
 *   DW_HEAD_CHUNK=R                    dw_compile_opts.head_chunk defaults to R rows
 *   DW_GRAD_ARENA, DW_BF16_ARENA=0|1   dw_compile_opts.grad_arena, bf16_arena defaults (and training's)
 *   DW_WCACHE_ARENA=0                  dw_compile_opts.wcache_arena defaults to false
 *   DW_GEMM_AUTOTUNE=1                 the GEMM autotune cache starts on (dw_gemm_set_autotune)
 *   DW_ATTN=auto|cudnn|mma|nosplit|ref the CUDA attention path (kernels/cuda/attn_mma.cu)
 *   DW_ATTN_TILES=F,Q,K                tile shapes of the tensor-core attention (an experiment)
 *   DW_ATTN_CUDNN_DQ=...               cuDNN attention's dQ variant (an experiment)
 *   DW_MOE_GEMM=auto|wgmma|mma|simt    the CUDA grouped expert GEMM bound (compile/bind_grouped.c)
 *   DW_MOE_FP8=0                       withdraws the fp8_block grouped kernel (gemm/grouped_fp8.c)
 *   DW_SWIGLU_QUANT=0                  the SwiGLU leaves its down projection's quantisation to it, and its
 *                                      backward the gate and up layers' dy to them (runtime/cuda/act_quant_cuda.c)
 *   DW_SWIGLU_QUANT_BWD=0              the backward's alone
 *   DW_MOE_WGRAD=256|tma|old           the wgmma wgrad's TMA reduce-add epilogue with 256-column tiles (default) or 128, or the register one (kernels/cuda/moe_gemm_sm90.cu)
 *   DW_DP_BUCKET_FLOATS=N              data parallelism's gradient bucket (train/dp_buckets.c)
 *   DW_NCCL_HIGH_PRIORITY=1            the NCCL collectives' stream at the highest priority (comm/comm_nccl.c)
 *   DW_EP_CAPACITY=F                   expert parallelism's rows per rank, F x its own (the group size; train/ep_buffers.c)
 *   DW_QCHECK_DEVICE=0                 the quantisation guard's check measured on the host, not the device (train/guard_quant.c, runtime/cuda/guard_check_cuda.c)
 *   DW_Z3_PREFETCH=0                   ZeRO-3's gathers not prefetched (train/dp_zero3_gather.c)
 *   DW_COMM_TIMEOUT=S                  seconds a rank waits on a TCP peer (comm/comm_world.c)
 *   DW_KV_CACHE=0                      sampling's K/V cache off (train/sample.c; on by default)
 * docs/environment.md is the same list for users. */
#ifndef DW_CORE_ENV_H
#define DW_CORE_ENV_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The variable's value, or NULL when unset or empty. */
const char *dw_env(const char *name);
/* A switch: "0" is false, "1" is true, anything else (or unset) is dflt. */
bool dw_env_flag(const char *name, bool dflt);

#ifdef __cplusplus
}
#endif

#endif /* DW_CORE_ENV_H */
