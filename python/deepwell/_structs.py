"""_structs.py — ctypes mirrors of include/deepwell.h's option and result structs, field for field.

Private. Options structs are filled by their dw_<x>_opts_init(&o, sizeof o); result structs get
`size` set by new() before the library writes them. Every mirror is complete (every C field, in C
order): tests/python/test_api_abi.py reads each struct's fields from the header and compiles a C
file printing sizeof/offsetof of each, and fails on any difference.
"""
import ctypes

i32, i64, u64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64
dbl, flag, size_t, cint = ctypes.c_double, ctypes.c_bool, ctypes.c_size_t, ctypes.c_int
cstr, ptr = ctypes.c_char_p, ctypes.c_void_p


class Sized(ctypes.Structure):
    """A struct whose first field is `size_t size`."""

    @classmethod
    def new(cls):
        s = cls()
        s.size = ctypes.sizeof(cls)
        return s

    def as_dict(self):
        out = {}
        for name, _ in self._fields_:
            if name == "size":
                continue
            v = getattr(self, name)
            out[name] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        return out


class CtxOpts(ctypes.Structure):
    _fields_ = [("device", cint), ("device_index", cint)]


class HwInfo(Sized):
    _fields_ = [("size", size_t), ("source", ctypes.c_char * 16), ("preset", ctypes.c_char * 32),
                ("label", ctypes.c_char * 160), ("nodes", cint), ("gpus", cint), ("host_cpus", cint),
                ("host_ram_bytes", i64), ("nvlink_gbps", dbl), ("nvlink_domain", cint),
                ("internode_gbps", dbl), ("notice", ctypes.c_char * 256)]


class GpuInfo(Sized):
    _fields_ = [("size", size_t), ("index", cint), ("name", ctypes.c_char * 256), ("cc_major", cint),
                ("cc_minor", cint), ("sms", cint), ("hbm_bytes", u64), ("hbm_free_bytes", i64),
                ("sm_clock_mhz", cint), ("mem_clock_mhz", cint), ("mem_bus_bits", cint), ("l2_bytes", u64),
                ("smem_optin_bytes", u64), ("pci_bus_id", ctypes.c_char * 32), ("wgmma", flag), ("fp8", flag),
                ("tcgen05", flag), ("tmem", flag), ("mx_block_scaling", flag), ("fp4", flag),
                ("nvlink_links", cint), ("nvlink_active", cint), ("peak_bf16_tflops", dbl),
                ("peak_fp8_tflops", dbl), ("peak_fp4_tflops", dbl), ("hbm_gbps", dbl)]


class PeerLink(Sized):
    _fields_ = [("size", size_t), ("access", flag), ("perf_rank", cint), ("native_atomics", flag)]


class QuantizeOpts(Sized):
    _fields_ = [("size", size_t), ("recipe", i32), ("rounding", i32), ("pow2", flag)]


class QuantizeSummary(Sized):
    _fields_ = [("size", size_t), ("quantized", cint), ("copied", cint), ("in_bytes", u64), ("out_bytes", u64)]


class CaptureOpts(Sized):
    _fields_ = [("size", size_t), ("batch", i64), ("seq", i64), ("vocab", i64), ("moe_drop", cint)]


class CompileOpts(Sized):
    _fields_ = [("size", size_t), ("device", cint), ("sm", cint), ("fuse", flag), ("recompute", cint),
                ("recompute_blocks", cint), ("fused_head", flag), ("head_chunk", i64), ("moe_remat", flag),
                ("grad_arena", flag), ("bf16_arena", flag), ("wcache_arena", flag)]


class EngineOpts(Sized):
    _fields_ = [("size", size_t), ("record", flag), ("quant_reuse", flag), ("zero", cint)]


class AdamwOpts(Sized):
    _fields_ = [("size", size_t), ("lr", dbl), ("beta1", dbl), ("beta2", dbl), ("eps", dbl),
                ("weight_decay", dbl), ("clip", dbl)]


class ModelInfo(Sized):
    _fields_ = [("size", size_t), ("model_type", ctypes.c_char * 32), ("vocab_size", i64), ("d_model", i64),
                ("n_layers", i64), ("n_heads", i64), ("n_kv_heads", i64), ("head_dim", i64), ("d_ff", i64),
                ("max_seq", i64), ("n_experts", i64), ("top_k", i64), ("params", i64), ("planning_only", flag)]


class PlanJob(Sized):
    _fields_ = [("size", size_t), ("seq", i64), ("global_batch", i64), ("recipe", i32), ("moe_experts", i64),
                ("moe_top_k", i64), ("moe_capacity", dbl), ("mem_headroom", dbl), ("gemm_rates", cstr),
                ("top_k", cint)]


class PlanLayout(Sized):
    _fields_ = [("size", size_t), ("dp", cint), ("tp", cint), ("pp", cint), ("cp", cint), ("ep", cint),
                ("vpp", cint), ("zero", cint), ("recompute", cint), ("offload", flag), ("micro_batch", i64),
                ("seq", i64), ("global_batch", i64), ("recipe", i32), ("etp", cint), ("a2a_overlap", flag),
                ("grad_accum", i64)]


class PlanInfo(Sized):
    _fields_ = [("size", size_t), ("model", cstr), ("model_type", cstr), ("params", dbl),
                ("model_flops_per_token", dbl), ("experts", i64), ("top_k", i64), ("moe_capacity", dbl),
                ("gpu", cstr), ("hw_source", cstr), ("nodes", cint), ("gpus_per_node", cint),
                ("nvlink_domain", cint), ("gpus", i64), ("seq", i64), ("global_batch", i64), ("recipe", i32),
                ("mem_headroom", dbl), ("peak_flops", dbl), ("engine", flag)]


class PlanMem(Sized):
    _fields_ = [("size", size_t), ("weights", dbl), ("grads", dbl), ("optimizer", dbl), ("activations", dbl),
                ("workspace", dbl), ("scales", dbl), ("total", dbl), ("hbm", dbl), ("limit", dbl),
                ("worst_stage", cint), ("inflight", dbl), ("ep_buffers", dbl)]


class PlanCost(Sized):
    _fields_ = [("size", size_t), ("step", dbl), ("pipeline", dbl), ("compute", dbl), ("bubble_frac", dbl),
                ("tp_comm", dbl), ("cp_comm", dbl), ("ep_comm", dbl), ("pp_comm", dbl), ("dp_comm", dbl),
                ("dp_exposed", dbl), ("optimizer", dbl), ("tokens_per_s", dbl), ("mfu", dbl), ("hfu", dbl),
                ("model_flops", dbl)]


class PlanChecks(Sized):
    _fields_ = [("size", size_t), ("violations", cint), ("why", cstr), ("constraints_ok", flag),
                ("memory_ok", flag), ("overlap", dbl), ("overlap_ok", flag), ("bubble_ok", flag)]


class PlanEngineMem(Sized):
    _fields_ = [("size", size_t), ("pool", i64 * 5), ("cublaslt", i64), ("attention", i64), ("context", i64),
                ("total", i64)]


class PlanEngineCost(Sized):
    _fields_ = [("size", size_t), ("fwd", dbl), ("bwd", dbl), ("gemm", dbl), ("attn", dbl), ("mem", dbl),
                ("overhead", dbl), ("launches", dbl), ("optimizer", dbl), ("flops", dbl)]


class TrainProgress(ctypes.Structure):
    _fields_ = [("step", i64), ("total", i64), ("loss", dbl), ("val_loss", dbl), ("lr", dbl), ("grad_norm", dbl),
                ("tokens_per_s", dbl), ("elapsed_s", dbl), ("eta_s", dbl), ("sample", cstr), ("checkpoint", cstr),
                ("moe_aux_loss", dbl), ("moe_z_loss", dbl), ("expert_load", dbl), ("moe_dropped", dbl),
                ("moe_dropped_frac", dbl), ("skipped", cstr), ("precision_change", cstr), ("ranks", cint),
                ("comm_s", ctypes.POINTER(dbl)), ("exposed_comm_s", ctypes.POINTER(dbl)), ("moe_bias_max", dbl),
                ("quant_overflow", i64), ("quant_underflow", i64)]


PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(TrainProgress), ptr)
# int next_batch(void *user, int64_t index, int32_t *tokens, int32_t *targets, int64_t b, int64_t t)
BATCH_FN = ctypes.CFUNCTYPE(ctypes.c_int, ptr, i64, ctypes.POINTER(i32), ctypes.POINTER(i32), i64, i64)


class TrainOpts(Sized):
    _fields_ = [("size", size_t), ("data", cstr), ("val", cstr), ("out_dir", cstr), ("resume", cstr),
                ("steps", i64), ("batch", i64), ("seq", i64), ("global_batch", i64), ("lr", dbl), ("min_lr", dbl),
                ("warmup", i64), ("schedule", cint), ("weight_decay", dbl), ("clip", dbl), ("beta1", dbl),
                ("beta2", dbl), ("eps", dbl), ("eval_every", i64), ("eval_batches", i64), ("sample_every", i64),
                ("sample_tokens", i64), ("sample_temperature", dbl), ("sample_prompt", cstr), ("ckpt_every", i64),
                ("keep", cint), ("seed", u64), ("deterministic", flag), ("profile", flag),
                ("progress", PROGRESS_FN), ("progress_user", ptr), ("ckpt_minutes", dbl), ("zero", cint),
                ("max_skips", i64), ("quant_check_every", i64), ("quant_fallback_after", i64), ("ep", cint),
                ("next_batch", BATCH_FN), ("val_batch", BATCH_FN), ("batch_user", ptr), ("spike_zscore", dbl),
                ("spike_window", i64), ("max_rollbacks", i64), ("fp8_amax_history", i64), ("no_overlap", flag),
                ("moe_bias_update", dbl), ("quant_overflow_max", dbl), ("quant_underflow_max", dbl),
                ("quant_counts_after", i64), ("quant_check_elements", i64)]


# Every mirrored struct with its C name (the ABI test walks this).
C_NAMES = {
    CtxOpts: "dw_ctx_opts", HwInfo: "dw_hw_info", GpuInfo: "dw_gpu_info", PeerLink: "dw_peer_link",
    QuantizeOpts: "dw_quantize_opts", QuantizeSummary: "dw_quantize_summary", CaptureOpts: "dw_capture_opts",
    CompileOpts: "dw_compile_opts", EngineOpts: "dw_engine_opts", AdamwOpts: "dw_adamw_opts",
    ModelInfo: "dw_model_info", PlanJob: "dw_plan_job", PlanLayout: "dw_plan_layout", PlanInfo: "dw_plan_info",
    PlanMem: "dw_plan_mem", PlanCost: "dw_plan_cost", PlanChecks: "dw_plan_checks",
    PlanEngineMem: "dw_plan_engine_mem", PlanEngineCost: "dw_plan_engine_cost",
    TrainProgress: "dw_train_progress", TrainOpts: "dw_train_opts",
}
