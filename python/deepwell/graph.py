"""graph.py — a Graph (dw_graph) and the library's capture of a preset name or model directory
at batch x seq (_capture_path); dw.capture() of any model is entry.py's, above this.

A Graph remembers where it came from (`source`: what the planner reads, a preset name or a
directory with config.json) and which weights belong to it (`weights`: a directory or
.safetensors file, or None), so that dw.compile can give the engine those weights. Dicts and
modules are written to a temporary directory the Graph owns (config.json, model.safetensors).
"""
import ctypes
import json
import os
import shutil
import weakref
import zlib

from . import _structs as S
from ._core import Handle, JsonDoc, ctx_of
from ._lib import cstr, lib, text


class Graph(JsonDoc, Handle):
    """A captured model (dw_graph): ops whose nodes carry the Hugging Face module names."""

    _free, _to_json = "dw_graph_free", "dw_graph_to_json"

    def __init__(self, h, ctx, source=None, weights=None, tmpdir=None):
        super().__init__(h, ctx)
        self.source = source
        self.weights = weights
        # a temporary directory holding source/weights: removed with the graph (or at exit)
        self._tmp_done = weakref.finalize(self, shutil.rmtree, tmpdir, True) if tmpdir else None

    params = property(lambda self: lib().dw_graph_params(self._handle()), doc="trainable parameters")
    flops_per_token = property(lambda self: lib().dw_graph_flops_per_token(self._handle()))
    model_flops_per_token = property(lambda self: lib().dw_graph_model_flops_per_token(self._handle()))
    node_count = property(lambda self: lib().dw_graph_node_count(self._handle()))
    seq = property(lambda self: lib().dw_graph_seq(self._handle()))
    batch = property(lambda self: lib().dw_graph_batch(self._handle()))
    vocab = property(lambda self: lib().dw_graph_vocab(self._handle()))
    model_type = property(lambda self: text(lib().dw_graph_model_type(self._handle())))
    input_width = property(lambda self: lib().dw_graph_input_width(self._handle()),
                           doc="a feed-forward graph's input features (0: the graph takes tokens)")
    output_width = property(lambda self: lib().dw_graph_output_width(self._handle()),
                            doc="a feed-forward graph's output features (0: the graph gives logits)")

    @property
    def tokenizer(self):
        """The tokenizer.json the model came with: its model directory's, or its checkpoint's (a run
        trained with one keeps a copy in each checkpoint, checked against state.json's size and
        CRC-32 here: a changed or missing copy raises); None when it has none."""
        return recorded_tokenizer(self.source)

    @property
    def config(self):
        """The model's config.json as captured (a dict), or None."""
        c = text(lib().dw_graph_config_json(self._handle()))
        return json.loads(c) if c else None

    def listing(self):
        """One line per node (name, op, inputs, output shape), then totals."""
        return self._string("dw_graph_print")

    def __repr__(self):
        if self.closed:
            return "Graph(closed)"
        return (f"Graph(model_type={self.model_type!r}, params={self.params}, batch={self.batch}, seq={self.seq}, "
                f"nodes={self.node_count})")

    def close(self):
        super().close()
        if getattr(self, "_tmp_done", None) is not None:
            self._tmp_done()


def graph_from_json(text_, ctx=None, what=None, weights=None, tmpdir=None):
    """A Graph from dw_graph_to_json's document (verified on load); weights and tmpdir as Graph's."""
    ctx = ctx_of(ctx)
    b = text_.encode() if isinstance(text_, str) else text_
    h = ctypes.c_void_p()
    ctx.check(lib().dw_graph_from_json(ctx._h, b, len(b), cstr(what), ctypes.byref(h)))
    return Graph(h.value, ctx, weights=weights, tmpdir=tmpdir)


def _has_weights(d):
    return any(os.path.exists(os.path.join(d, f)) for f in ("model.safetensors", "model.safetensors.index.json"))


def _resolve_run(path):
    """A training run directory (with `latest`, no config.json) -> its newest checkpoint."""
    latest = os.path.join(path, "latest")
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "config.json")) and os.path.isfile(latest):
        with open(latest) as f:
            return os.path.join(path, f.read().strip())
    return path


def recorded_tokenizer(source):
    """source's tokenizer.json: a model directory's, or a checkpoint's when its state.json lists one
    (FileNotFoundError / ValueError when that copy is missing or differs from the record); None
    for anything else."""
    if not source or not os.path.isdir(source):
        return None
    path, state = os.path.join(source, "tokenizer.json"), os.path.join(source, "state.json")
    if not os.path.isfile(state):
        return path if os.path.isfile(path) else None
    with open(state) as f:
        rec = json.load(f).get("files", {}).get("tokenizer.json")
    if rec is None:
        return None  # a checkpoint of a run without one
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: missing: the checkpoint's state.json records the tokenizer its run was "
                                f"trained with ({rec['size']} bytes)")
    with open(path, "rb") as f:
        b = f.read()
    if len(b) != rec["size"] or "%08x" % zlib.crc32(b) != rec["crc32"]:
        raise ValueError(f"{path}: {len(b)} bytes, CRC-32 {zlib.crc32(b):08x}, but state.json records "
                         f"{rec['size']} bytes, {rec['crc32']}: not the tokenizer the run was trained with")
    return path


def _capture_path(ctx, what, batch, seq, vocab):
    o = S.CaptureOpts.new()
    lib().dw_capture_opts_init(ctypes.byref(o), ctypes.sizeof(o))
    o.batch, o.seq, o.vocab = int(batch), int(seq or 0), int(vocab or 0)
    h = ctypes.c_void_p()
    ctx.check(lib().dw_capture(ctx._h, cstr(what), ctypes.byref(o), ctypes.byref(h)))
    return h.value


def model_presets():
    """The model presets' names (`deepwell capture --list-presets`)."""
    L = lib()
    return [text(L.dw_model_preset_name(i)) for i in range(L.dw_model_preset_count())]


def model_info(model, ctx=None):
    """The architecture of a preset name, model directory or config.json path, as the planner
    sees it (dw_model_info): model_type, sizes, experts, params, planning_only."""
    ctx = ctx_of(ctx)
    o = S.ModelInfo.new()
    ctx.check(lib().dw_model_info_load(ctx._h, cstr(os.fspath(model)), ctypes.byref(o)))
    return o.as_dict()
