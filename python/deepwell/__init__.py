"""deepwell — Python over libdeepwell.so (ctypes; nothing compiled at install).

    import deepwell as dw
    hw = dw.probe()
    ir = dw.capture("llama-tiny", seq_len=64, batch=8)
    plan = dw.autoplan(ir, hw=dw.hardware("h100-sxm", gpus=1), seq_len=64, global_batch=8)
    engine = dw.compile(ir, precision="bf16", fallback="safe")
    print(dw.dryrun(engine))
    trainer = dw.Trainer.from_engine(engine, lr=3e-3, dataloader=dw.data("builtin"), steps=100, out="runs/x")
    trainer.fit()
    dw.export(trainer, "out/hf", format="hf")
    fast = dw.optimize(nn.Sequential(nn.Linear(768, 3072), nn.GELU(), nn.Linear(3072, 768)),
                       precision="fp8_block", batch_size=32)   # the origin README's quick start
    y = fast(torch.randn(32, 768))

Every call goes through include/deepwell.h, as the `deepwell` command does; C errors raise
DeepwellError subclasses carrying the library's message. docs/python.md describes it all.
"""
from ._core import (Context, CudaError, DeepwellError, FormatError, InvalidError, IOFailure, NoMemoryError,
                    NumericError, UnsupportedError, default_context)
from ._lib import library_path, lib
from .data import Data, Reader, data, read_shard, write_shard
from .dryrun import Report, dryrun
from .engine import Engine, Policy, detokenize, make_policy, tokenize
from .entry import capture, compile, optimize
from .graph import Graph, graph_from_json, model_info, model_presets
from .hardware import Hardware, hardware, presets, probe
from .plan import Plan, autoplan, load_plan, single_plan
from .tokenizer import Tokenizer
from .trainer import Trainer, export, schedule_lr

__all__ = ["Context", "CudaError", "DeepwellError", "FormatError", "InvalidError", "IOFailure", "NoMemoryError",
           "NumericError", "UnsupportedError", "default_context", "library_path", "Data", "Reader", "data",
           "read_shard", "write_shard", "Report", "dryrun", "Engine", "Policy", "compile", "detokenize",
           "make_policy", "optimize", "tokenize", "Graph", "capture", "graph_from_json", "model_info", "model_presets",
           "Hardware", "hardware", "presets", "probe", "Plan", "Tokenizer", "autoplan", "load_plan", "single_plan", "Trainer",
           "export", "schedule_lr", "version", "built_with_cuda"]


def version():
    """The library's version string ("0.1.0 (cpu-only build)")."""
    return lib().dw_version_string().decode()


def built_with_cuda():
    return bool(lib().dw_built_with_cuda())
