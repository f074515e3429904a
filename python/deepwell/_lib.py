"""_lib.py — finds and loads libdeepwell.so and declares the C prototypes of include/deepwell.h.

Private: the rest of the package calls `lib().dw_...`. Nothing here is compiled: ctypes only.
Search order: $DEEPWELL_LIB (the .so or its folder), beside this package, the build folders
recorded when the package was installed from a source tree (_paths.py), the source tree's own
build*/ folders when imported from python/, then the system's library path.
"""
import ctypes
import ctypes.util
import glob
import os
import re
import threading

from . import _structs as S

LIBNAME = "libdeepwell.so"

c_int, c_int32, c_int64, c_uint64 = ctypes.c_int, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64
c_double, c_float, c_bool, c_size_t = ctypes.c_double, ctypes.c_float, ctypes.c_bool, ctypes.c_size_t
c_char_p, c_void_p = ctypes.c_char_p, ctypes.c_void_p
P = ctypes.POINTER
PP = lambda t: P(P(t))  # noqa: E731
status = c_int  # dw_status

# Opaque handles are void pointers; the Python objects own them.
H = c_void_p

# name: (restype, argtypes). Every published function the Python layer uses; the ABI test checks
# each name against include/deepwell.h.
PROTOTYPES = {
    # core
    "dw_status_name": (c_char_p, [c_int]),
    "dw_log_get_level": (c_int, []),
    "dw_log_set_level": (None, [c_int]),
    "dw_log_parse_level": (c_bool, [c_char_p, P(c_int)]),
    "dw_ctx_create": (status, [P(S.CtxOpts), P(H)]),
    "dw_ctx_free": (None, [H]),
    "dw_ctx_device": (c_int, [H]),
    "dw_ctx_device_index": (c_int, [H]),
    "dw_errmsg": (c_char_p, [H]),
    "dw_ctx_mem_info": (status, [H, P(c_int64), P(c_int64)]),
    "dw_built_with_cuda": (c_bool, []),
    "dw_version_string": (c_char_p, []),
    "dw_free_string": (None, [c_void_p]),
    # probe
    "dw_probe": (status, [H, P(H)]),
    "dw_hw_preset": (status, [H, c_char_p, c_int, P(H)]),
    "dw_hw_load": (status, [H, c_char_p, P(H)]),
    "dw_hw_free": (None, [H]),
    "dw_hw_preset_count": (c_int, []),
    "dw_hw_preset_name": (c_char_p, [c_int]),
    "dw_hw_preset_description": (c_char_p, [c_int]),
    "dw_hw_gpu_count": (c_int, [H]),
    "dw_hw_notice": (c_char_p, [H]),
    "dw_hw_to_json": (status, [H, H, c_bool, P(c_void_p)]),
    "dw_hw_get_info": (status, [H, P(S.HwInfo)]),
    "dw_hw_get_gpu": (status, [H, c_int, P(S.GpuInfo)]),
    "dw_hw_get_peer": (status, [H, c_int, c_int, P(S.PeerLink)]),
    "dw_hw_set_nodes": (status, [H, H, c_int]),
    "dw_hw_keep_gpus": (status, [H, H, c_int]),
    # formats and safetensors
    "dw_recipe_name": (c_char_p, [c_int]),
    "dw_recipe_parse": (c_bool, [c_char_p, P(c_int)]),
    "dw_quantize_opts_init": (None, [P(S.QuantizeOpts), c_size_t]),
    "dw_quantize_file": (status, [H, c_char_p, c_char_p, P(S.QuantizeOpts), c_void_p, c_void_p,
                                  P(S.QuantizeSummary)]),
    # graph and capture
    "dw_capture_opts_init": (None, [P(S.CaptureOpts), c_size_t]),
    "dw_capture": (status, [H, c_char_p, P(S.CaptureOpts), P(H)]),
    "dw_graph_free": (None, [H]),
    "dw_graph_to_json": (status, [H, H, c_bool, P(c_void_p)]),
    "dw_graph_from_json": (status, [H, c_char_p, c_size_t, c_char_p, P(H)]),
    "dw_graph_print": (status, [H, H, P(c_void_p)]),
    "dw_graph_params": (c_int64, [H]),
    "dw_graph_flops_per_token": (c_double, [H]),
    "dw_graph_model_flops_per_token": (c_double, [H]),
    "dw_graph_node_count": (c_int, [H]),
    "dw_graph_seq": (c_int64, [H]),
    "dw_graph_batch": (c_int64, [H]),
    "dw_graph_vocab": (c_int64, [H]),
    "dw_graph_model_type": (c_char_p, [H]),
    "dw_graph_config_json": (c_char_p, [H]),
    "dw_graph_input_width": (c_int64, [H]),
    "dw_graph_output_width": (c_int64, [H]),
    # precision
    "dw_policy_load": (status, [H, c_char_p, P(H)]),
    "dw_policy_from_precision": (status, [H, c_char_p, c_bool, P(H)]),
    "dw_policy_set_fallback": (status, [H, H, c_char_p]),
    "dw_policy_to_json": (status, [H, H, P(c_void_p)]),
    "dw_policy_free": (None, [H]),
    # compile
    "dw_compile_opts_init": (None, [P(S.CompileOpts), c_size_t]),
    "dw_compile": (status, [H, H, H, H, P(S.CompileOpts), P(H)]),
    "dw_compiled_free": (None, [H]),
    "dw_compiled_pool_bytes": (c_int64, [H, c_int]),
    "dw_compiled_head_chunk": (c_int64, [H]),
    "dw_compiled_report": (status, [H, H, P(c_void_p)]),
    # engine
    "dw_engine_opts_init": (None, [P(S.EngineOpts), c_size_t]),
    "dw_engine_create": (status, [H, H, P(S.EngineOpts), P(H)]),
    "dw_engine_free": (None, [H]),
    "dw_engine_backend": (c_char_p, [H]),
    "dw_engine_init_weights": (status, [H, c_uint64]),
    "dw_engine_load_weights": (status, [H, c_char_p]),
    "dw_engine_save_weights": (status, [H, c_char_p]),
    "dw_engine_save_weights_layout": (status, [H, c_char_p, c_int]),
    "dw_engine_save_optimizer": (status, [H, c_char_p]),
    "dw_engine_load_optimizer": (status, [H, c_char_p]),
    "dw_engine_forward": (status, [H, P(c_int32), P(c_int32), c_int64, c_int64, P(c_float), P(c_double)]),
    "dw_engine_forward_backward": (status, [H, P(c_int32), P(c_int32), c_int64, c_int64, c_double,
                                            P(c_double)]),
    "dw_engine_forward_float": (status, [H, P(c_float), c_int64, c_int64, P(c_float)]),
    "dw_engine_zero_grad": (status, [H]),
    "dw_adamw_opts_init": (None, [P(S.AdamwOpts), c_size_t]),
    "dw_engine_step": (status, [H, P(S.AdamwOpts), c_int64, P(c_double)]),
    "dw_engine_param_count": (c_int, [H]),
    "dw_engine_param_name": (c_char_p, [H, c_int]),
    "dw_engine_param_shape": (c_int, [H, c_int, P(c_int64)]),
    "dw_engine_param_read": (status, [H, c_int, P(c_float)]),
    "dw_engine_param_write": (status, [H, c_int, P(c_float)]),
    "dw_engine_grad_read": (status, [H, c_int, P(c_float)]),
    "dw_engine_generate": (status, [H, P(c_int32), c_int64, c_int64, c_double, c_int, P(c_uint64)]),
    # plan
    "dw_model_preset_count": (c_int, []),
    "dw_model_preset_name": (c_char_p, [c_int]),
    "dw_model_info_load": (status, [H, c_char_p, P(S.ModelInfo)]),
    "dw_plan_job_init": (None, [P(S.PlanJob), c_size_t]),
    "dw_autoplan": (status, [H, c_char_p, H, P(S.PlanJob), P(H)]),
    "dw_plan_single": (status, [H, c_int64, c_int64, P(H)]),
    "dw_plan_from_json": (status, [H, c_char_p, c_size_t, c_char_p, c_char_p, H, P(S.PlanJob), P(H)]),
    "dw_plan_load": (status, [H, c_char_p, c_char_p, H, P(S.PlanJob), P(H)]),
    "dw_plan_to_json": (status, [H, H, c_bool, P(c_void_p)]),
    "dw_plan_free": (None, [H]),
    "dw_plan_get_layout": (status, [H, P(S.PlanLayout)]),
    "dw_plan_world_size": (c_int, [H]),
    "dw_plan_summary": (c_char_p, [H]),
    "dw_plan_get_info": (status, [H, P(S.PlanInfo)]),
    "dw_plan_get_memory": (status, [H, P(S.PlanMem)]),
    "dw_plan_get_cost": (status, [H, P(S.PlanCost)]),
    "dw_plan_get_checks": (status, [H, P(S.PlanChecks)]),
    "dw_plan_runs_on_engine": (c_bool, [H, P(c_char_p)]),
    "dw_plan_engine_policy": (status, [H, H, P(H)]),
    "dw_plan_get_engine_memory": (status, [H, H, P(S.PlanEngineMem)]),
    "dw_plan_get_engine_cost": (status, [H, H, P(S.PlanEngineCost)]),
    # training and data
    "dw_train_opts_init": (None, [P(S.TrainOpts), c_size_t]),
    "dw_train": (status, [H, P(S.TrainOpts)]),
    "dw_train_request_stop": (None, []),
    "dw_train_stop_requested": (c_bool, []),
    "dw_data_open_pattern": (status, [H, c_char_p, c_int64, c_int64, P(H)]),
    "dw_data_windows": (c_int64, [H]),
    "dw_data_next": (None, [H, c_int64, P(c_int32), P(c_int32)]),
    "dw_data_free": (None, [H]),
    "dw_tokenize": (status, [H, c_char_p, c_char_p, c_int64, P(P(c_int32)), P(c_int64)]),
    "dw_detokenize": (c_void_p, [c_char_p, P(c_int32), c_int64]),
    "dw_run_set_tokenizer": (status, [H, c_char_p, c_char_p]),
}

_lock = threading.Lock()
_lib = None
_path = None


def _candidates():
    env = os.environ.get("DEEPWELL_LIB")
    if env:  # explicit: only this one, so a wrong value is an error rather than a silent fallback
        return [os.path.join(env, LIBNAME) if os.path.isdir(env) else env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(here, LIBNAME)]
    try:
        from . import _paths  # written by setup.py when installed from a source tree
        out += [os.path.join(d, LIBNAME) for d in _paths.BUILD_DIRS]
    except ImportError:
        pass
    tree = os.path.dirname(os.path.dirname(here))  # python/deepwell -> the repository
    out.append(os.path.join(tree, "build", LIBNAME))
    # other plain builds of the tree; never a sanitizer build (its runtime must load first)
    out += [p for p in sorted(glob.glob(os.path.join(tree, "build*", LIBNAME)))
            if not re.search(r"asan|san|fuzz", os.path.basename(os.path.dirname(p)))]
    found = ctypes.util.find_library("deepwell")
    if found:
        out.append(found)
    return out


def library_path():
    """The path of the loaded libdeepwell.so (loading it if needed)."""
    lib()
    return _path


def lib():
    """The loaded library with every prototype declared (loaded once per process)."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for c in _candidates():
            if not (os.path.exists(c) or os.path.basename(c) == c):
                tried.append(c + " (absent)")
                continue
            try:
                handle = ctypes.CDLL(c)
            except OSError as e:
                tried.append(f"{c} ({e})")
                continue
            missing = [n for n in PROTOTYPES if not hasattr(handle, n)]
            if missing:  # an older build: try the next one
                tried.append(f"{c} (an older build: lacks {', '.join(missing[:3])})")
                continue
            for name, (res, args) in PROTOTYPES.items():
                f = getattr(handle, name)
                f.restype, f.argtypes = res, args
            _lib, _path = handle, c
            return _lib
        raise ImportError("deepwell: libdeepwell.so not found; build it (scripts/build.sh) and set DEEPWELL_LIB "
                          "to the .so or its folder. Tried: " + "; ".join(tried))


_libc = ctypes.CDLL(None)
_libc.free.argtypes = [c_void_p]
_libc.free.restype = None


def c_free(ptr):
    """free() of the C library the process uses (for buffers the API says to free())."""
    _libc.free(ptr)


def take_string(ptr):
    """A caller-owned `char *` from the library as str, freed with dw_free_string."""
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        lib().dw_free_string(ptr)


def cstr(s):
    """str (or os.PathLike) -> bytes for a `const char *` argument; None stays NULL."""
    if s is None:
        return None
    return os.fsencode(s) if not isinstance(s, bytes) else s


def text(b):
    """A library-owned `const char *` result as str (None for NULL)."""
    return None if b is None else b.decode("utf-8", "replace")
