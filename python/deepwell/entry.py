"""entry.py — the calls that take any model: dw.capture() (a preset name, Hugging Face directory
or config.json, config dict, transformers model or recognised torch module -> a Graph at batch x
seq), dw.compile() (a Graph or anything dw.capture takes -> an Engine) and dw.optimize().

They sit above graph.py, engine.py and torch_capture.py: a plain torch module's capture is
checked by compiling it (fx_capture -> engine.compile_graph), so capture of a module is the top
of the walk, not part of graph.py.
"""
import json
import os
import shutil
import tempfile

from ._core import ctx_of
from .engine import compile_graph
from .graph import Graph, _capture_path, _has_weights, _resolve_run

def capture(model, seq_len=None, batch=1, vocab=None, ctx=None):
    """The training graph of `model` for `batch` sequences of `seq_len` tokens (None: the
    model's positions, at most 2048). model: a preset name ("gpt2-tiny", "llama-1b", ...), a
    directory with config.json (its model.safetensors become the engine's weights; a training
    run's directory stands for its newest checkpoint), a
    config.json path, a config dict, a transformers PreTrainedModel, or a torch.nn.Module of an
    architecture dw.torch_capture recognises (others are refused, naming what is supported). A
    feed-forward torch module (no nn.Embedding: ffn_capture.py) gives a feed-forward graph for
    batch x seq_len rows (seq_len None: 1) with the module's weights. vocab: pad the embedding to
    this many rows."""
    ctx = ctx_of(ctx)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"capture: batch must be a positive int, got {batch!r}")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
        raise ValueError(f"capture: seq_len must be a positive int or None, got {seq_len!r}")
    tmp, weights = None, None
    try:
        if isinstance(model, (str, os.PathLike)):
            source = _resolve_run(os.fspath(model))
            if os.path.isdir(source) and _has_weights(source):
                weights = source
        elif isinstance(model, dict):
            tmp = tempfile.mkdtemp(prefix="deepwell-config-")
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(model, f)
            source = tmp
        elif _feedforward(model):
            return _capture_feedforward(model, batch * (seq_len or 1), ctx)
        else:
            from . import torch_capture  # imports torch only when a module is given

            tmp = tempfile.mkdtemp(prefix="deepwell-module-")
            torch_capture.write_model_dir(model, tmp, seq_len)
            source = weights = tmp
        h = _capture_path(ctx, source, batch, seq_len, vocab)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, True)
        raise
    return Graph(h, ctx, source=source, weights=weights, tmpdir=tmp)


def compile(ir, plan=None, precision=None, fallback=None, policy=None, weights="auto", seed=1337, device=None,
            target=None, sm=0, fuse=None, cuda_graphs=None, fused_head=None, head_chunk=None, recompute=None,
            ctx=None):
    """An Engine for `ir` (a Graph, or anything dw.capture takes); the options are
    engine.compile_graph's (plan, precision/fallback or policy, weights, seed, device, target/sm,
    fuse, cuda_graphs, fused_head/head_chunk, recompute)."""
    if not isinstance(ir, Graph):
        ir = capture(ir, ctx=ctx or device)
    return compile_graph(ir, plan=plan, precision=precision, fallback=fallback, policy=policy, weights=weights,
                         seed=seed, device=device, target=target, sm=sm, fuse=fuse, cuda_graphs=cuda_graphs,
                         fused_head=fused_head, head_chunk=head_chunk, recompute=recompute, ctx=ctx)


def _feedforward(model):
    """Whether model is a plain torch module without nn.Embedding (ffn_capture.is_feedforward); imports
    torch only for a torch module."""
    if not hasattr(model, "named_modules") or getattr(model, "config", None) is not None:
        return False
    from . import ffn_capture

    return ffn_capture.is_feedforward(model)


def _capture_feedforward(model, rows, ctx):
    from . import feedforward, ffn_capture

    try:
        return feedforward.capture(model, rows, ctx)
    except ffn_capture.CaptureError as e:
        raise TypeError(f"dw.capture: cannot capture {type(model).__module__}.{type(model).__name__} as a "
                        f"feed-forward network: {e} (docs/python.md)") from None


def optimize(model, precision=None, batch_size=1, seq_len=None, fallback=None, device=None):
    """The origin README's quick start: dw.capture(model, seq_len, batch_size) then dw.compile with
    `precision` (None: FP32 on the CPU, BF16 on CUDA; "fp8_block", "mxfp8", ... for the linears) and
    `fallback` — an Engine called like the model. A feed-forward torch module (nn.Sequential of
    linears, GELU/SiLU/ReLU, norms, residual adds; no nn.Embedding) is captured for batch_size x
    seq_len rows (seq_len None: 1): engine(x [..., C_in] NumPy or torch float) -> [..., C_out] of x's
    type; an unmapped node is refused by name (TypeError). A decoder LM (anything else dw.capture
    takes): engine(tokens) -> logits."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"optimize: batch_size must be a positive int, got {batch_size!r}")
    return compile(capture(model, seq_len=seq_len, batch=batch_size, ctx=device), precision=precision,
                   fallback=fallback)
